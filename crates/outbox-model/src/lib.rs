//! The base of the transactional outbox: the diesel schema of
//! `outbox_event`, its row types, the validated [`EventType`], the
//! [`OutboxStatus`] life cycle, the [`TypedEvent`] trait of payload types,
//! and the embedded migrations with [`run_migrations`], in sets
//! ([`MigrationSet`]: the core, and one per built-in subscriber, each
//! behind a feature of this crate of the same name, all on by default).
//!
//! Every other crate of the workspace builds on this one, and every
//! application compiles it through `outbox-publish`; it depends on nothing
//! of theirs and holds no logic beyond validation. It does not open
//! connections: the migration functions take one, and URLs, TLS and the
//! pool are `outbox-pg`. Publishing lives in `outbox-publish`,
//! claiming and routing in `outbox-dispatch`.

mod event_type;
mod json;
mod migrations;
mod prepared;
mod priority;
mod row;
mod status;
mod typed;

/// The diesel schema, generated from the migrations by `cargo xtask schema`
/// (`cargo xtask test` fails when it drifts).
#[allow(missing_docs)]
pub mod schema;

pub use event_type::{EventType, EventTypeError, MAX_EVENT_TYPE_LEN, MIN_EVENT_TYPE_SEGMENTS};
pub use json::RawJson;
pub use migrations::{
    MIGRATIONS_FINGERPRINT, MigrationError, MigrationSet, MigrationState, UnknownMigrationSet,
    migration_set_status, migration_status, run_migration_sets, run_migrations, schema_fingerprint,
};
pub use prepared::{Prepared, prepared};
pub use priority::{Priority, PriorityOutOfRange};
pub use row::{NewOutboxEventRow, OutboxEvent};
pub use status::{OutboxStatus, UnknownStatus};
pub use typed::TypedEvent;

/// The largest accepted payload: 1 MiB of serialized JSON.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The longest ordering key, in characters (the `outbox_event` CHECK
/// constraint `outbox_event_ordering_key_check` repeats it).
pub const MAX_ORDERING_KEY_CHARS: usize = 255;

/// The Postgres channel the `outbox_event` insert trigger notifies.
pub const NOTIFY_CHANNEL: &str = "outbox_event";

/// The advisory lock (the two-key form, `pg_advisory_lock(int, int)`) that
/// says a dispatcher waits for new rows: the wake gate.
///
/// A dispatcher with nothing to claim queues for it (session level,
/// exclusive) on a connection of its own; the `outbox_event` insert trigger
/// sends `NOTIFY` only when it cannot take the same lock shared, that is
/// while a dispatcher holds it or queues for it. Otherwise the inserting
/// transaction keeps the shared lock until it ends, so the dispatcher's
/// request is granted only once that transaction has committed, and the
/// dispatcher claims once more when it is. `NOTIFY` makes every committing
/// transaction take one database-wide lock; this keeps that cost to the
/// times somebody waits. The trigger function (migration
/// `notify_only_waiting_dispatchers`) repeats these numbers.
pub const WAKE_GATE_LOCK: (i32, i32) = (1_868_722_040, 1);
