//! The transactional publisher: what an application depends on to record a
//! side effect (a mail, a webhook, an audit entry, a workflow trigger) in the
//! same Postgres transaction as the business write that causes it.
//!
//! [`publish_outbox_event`] and [`publish_outbox_events`] (and [`publish`],
//! for a typed event: a struct deriving [`OutboxEvent`]) only accept an
//! [`OutboxTx`], a handle that proves a transaction is open; a plain
//! connection or a pool does not compile. If the transaction rolls back, the
//! event is gone with the business row; if it commits, the dispatcher
//! (`outbox-dispatch`) will hand the event to its queue, however the process
//! dies afterwards.
//!
//! This crate only writes rows. It does not route, enqueue or deliver.
//!
//! A dispatch key deduplicates for a window chosen per event ([`Dedupe`]:
//! until the row is deleted, the default; while the event is pending; or
//! for a duration), and [`NewOutboxEvent::replace_pending`] makes a second
//! event with the key update the payload of a still pending first one
//! ([`PublishOutcome::Replaced`]). [`cancel`] and [`reschedule`] change a
//! published event from code, in the caller's transaction, by id or by
//! dispatch key ([`EventRef`]), with the operator's rules (`outbox
//! cancel`), an entry with the reason in the event's history each, and
//! typed refusals ([`ChangeError`]).
//!
//! Applications on sqlx turn on the `sqlx` feature and publish with the
//! same functions from the `sqlx` module (`outbox_publish::sqlx::publish`,
//! `publish_outbox_event`, `publish_outbox_events`, `publish_routed_event`),
//! which take the open `sqlx::Transaction<'_, Postgres>` instead of an
//! [`OutboxTx`]: the same refusals, columns, trace context and dispatch-key
//! behaviour, with statements equal to the diesel path's (the texts
//! `outbox_store` exports).
//!
//! # What the publisher refuses, before any SQL
//!
//! Every event is checked before a statement is sent, so a refused event
//! leaves the caller's transaction untouched and usable: handle the error
//! and go on, or roll back, as the business logic decides. Postgres would
//! refuse most of these itself, but a refusal by Postgres aborts the whole
//! transaction. [`NewOutboxEvent::validate`] is that check, callable on its
//! own. In the order checked ([`publish_routed_event`] checks the route
//! first, then these):
//!
//! | refusal | rule |
//! |---|---|
//! | [`PublishError::PayloadNotSerializable`] | only for a typed event ([`publish`], [`NewOutboxEvent::from_typed`]): serde cannot turn it into JSON |
//! | [`PublishError::EmptyTenantId`] | `tenant_id` is empty |
//! | [`PublishError::TenantIdContainsNul`] | `tenant_id` contains NUL (U+0000); Postgres `text` cannot store it |
//! | [`PublishError::InvalidEventType`] | the event type breaks the naming rule ([`outbox_model::EventType`]; NUL is an invalid character) |
//! | [`PublishError::DispatchKeyContainsNul`] | `dispatch_key` contains NUL |
//! | [`PublishError::EmptyOrderingKey`] | `ordering_key` is set and empty |
//! | [`PublishError::OrderingKeyContainsNul`] | `ordering_key` contains NUL |
//! | [`PublishError::OrderingKeyTooLong`] | `ordering_key` is over [`outbox_model::MAX_ORDERING_KEY_CHARS`] characters |
//! | [`PublishError::PayloadNotObject`] | the payload is not a JSON object |
//! | [`PublishError::PayloadKeyContainsNul`] | an object key anywhere in the payload contains NUL: Postgres `jsonb` refuses `\u0000` ("unsupported Unicode escape sequence") |
//! | [`PublishError::PayloadStringContainsNul`] | a string anywhere in the payload contains NUL, for the same reason |
//! | [`PublishError::PayloadTooDeep`] | arrays and objects nest deeper than [`MAX_PAYLOAD_DEPTH`] |
//! | [`PublishError::PayloadTooLarge`] | the payload is over [`outbox_model::MAX_PAYLOAD_BYTES`] serialized |
//! | [`PublishError::DedupeWithoutDispatchKey`] | a dedupe window ([`Dedupe`]) or replace mode without a dispatch key |
//! | [`PublishError::DedupeWindowOutOfRange`] | a [`Dedupe::For`] window of zero or over [`MAX_DEDUPE_WINDOW`] |
//! | [`PublishError::InvalidBatchItem`] | one event of a batch breaks one of the rules above; nothing of the batch is written |
//! | [`PublishError::Unrouted`] | only with [`publish_routed_event`] (or [`NewOutboxEvent::check_route`]): the given routing table sends the event type to no queue |
//! | [`PublishError::NotInTransaction`] | [`OutboxTx::new`] got a connection without an open transaction |
//!
//! The NUL errors name the place with a JSON Pointer (RFC 6901), e.g.
//! `/items/2/name`. The payload is walked without recursion, and a refused
//! payload (an unrouted one included) is dropped without recursion, so a
//! payload built in code and nested far too deep is refused rather than
//! overflowing the stack. Only [`PublishError::Database`] (and, with the
//! `sqlx` feature, `PublishError::Sqlx`) means the transaction is aborted.
//!
//! # Publishing beside the business write, in one round trip
//!
//! The publishers take the [`OutboxTx`] shared (`&tx`), so the event's
//! statement can be sent together with a business statement that does not
//! need its answer: poll both futures at once (`try_join!`) and the
//! connection sends them without waiting for the first answer (diesel-async
//! pipelines statements on a shared connection). The transaction pays one
//! round trip to the server for both instead of two; `cargo xtask bench
//! --only publish_overhead` measures it (`with_event_pipelined`, see
//! docs/performance.md). Both still commit or roll back together, as long
//! as an error from the joined futures is returned from the transaction's
//! closure (which rolls back): `try_join!` drops the other future on the
//! first error, and a statement it had sent has run all the same, so a
//! transaction that went on to commit after such an error could commit the
//! event without its outcome ever being seen.
//!
//! ```no_run
//! use diesel::prelude::*;
//! use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
//! use outbox_publish::{publish_outbox_event, NewOutboxEvent, OutboxTx, PublishError};
//!
//! diesel::table! {
//!     orders (id) {
//!         id -> BigInt,
//!         total_cents -> BigInt,
//!     }
//! }
//!
//! # async fn demo(conn: &mut AsyncPgConnection, order_id: i64) -> Result<(), PublishError> {
//! conn.transaction::<_, PublishError, _>(async |conn| {
//!     let tx = OutboxTx::new(conn)?;
//!     let event = publish_outbox_event(
//!         &tx,
//!         NewOutboxEvent::new("tenant-1", "orders.order.placed", serde_json::json!({ "orderId": order_id })),
//!     );
//!     // `&mut &*tx`: the statement runs on the shared connection.
//!     let order = diesel::insert_into(orders::table)
//!         .values((orders::id.eq(order_id), orders::total_cents.eq(4200)))
//!         .execute(&mut &*tx);
//!     // The event first: `try_join!` polls in order, so a refused event
//!     // returns before the business statement is sent.
//!     let (_outcome, _rows) = futures::try_join!(event, async {
//!         order.await.map_err(PublishError::from)
//!     })?;
//!     Ok(())
//! })
//! .await
//! # }
//! ```
//!
//! - Put the event first in `try_join!`, as above: its checks run when it
//!   is first polled, so a refused event is returned before the business
//!   statement is sent, and the transaction stays usable. The statements
//!   run in the order the futures are polled.
//! - Only statements the connection keeps prepared go out together, after
//!   their first run on the connection: diesel's one-row inserts, selects
//!   and deletes are kept. diesel prepares some statements again on every
//!   run, a round trip of its own before each is sent: `diesel::sql_query`
//!   and `diesel::dsl::sql`, updates, inserts of many rows at once and
//!   `ON CONFLICT … DO UPDATE`.
//! - One event without replace mode is one statement. A dispatch key that
//!   another row holds adds a second one, after the joined statements, to
//!   read the holder's id; replace mode and [`publish_outbox_events`] are
//!   statements that are prepared again on every run.
//!
//! # Trace context
//!
//! Each event records the W3C trace context (`traceparent`, `tracestate`)
//! of the `outbox.publish` span it is written in (`outbox.publish_batch`
//! for [`publish_outbox_events`]), when the process traces
//! with OpenTelemetry (a `tracing-opentelemetry` layer, or a current
//! OpenTelemetry context): the dispatcher, the job and every side effect
//! continue that trace. Otherwise both columns stay NULL and the dispatcher
//! starts a new trace. See `outbox_trace`.
//!
//! # Transactions and locks
//!
//! Publishing is one `INSERT … ON CONFLICT DO NOTHING` (in replace mode an
//! `UPDATE` of a PENDING holder of the key with the same tenant and event
//! type, else that insert, run a second time when another transaction
//! wrote the key's first row meanwhile), so a duplicate dispatch key never
//! raises an error that would abort the caller's transaction. Before a keyed row is inserted, the table's trigger frees
//! the key of a holder whose dedupe window has passed (locking that row
//! until the transaction ends). Two concurrent transactions that publish the same dispatch
//! key serialize on the unique index: the second waits for the first to
//! commit or roll back, then reports [`PublishOutcome::Duplicate`] (or
//! inserts, if the first rolled back). While a dispatcher waits for new
//! rows, the insert trigger sends a `NOTIFY outbox_event` that Postgres
//! delivers at commit, waking it; nothing is sent for a rolled-back
//! transaction. While none waits, the trigger sends nothing (a `NOTIFY`
//! makes the commit wait on a database-wide lock) and the transaction holds
//! the wake gate's advisory lock shared until it ends
//! ([`outbox_model::WAKE_GATE_LOCK`]): a dispatcher that starts to wait
//! meanwhile claims the event once the transaction has committed.

mod change;
mod dedupe;
mod error;
mod event;
mod publish;
mod routes;
#[cfg(feature = "sqlx")]
pub mod sqlx;
mod tx;
mod typed;

pub use change::{ChangeError, EventRef, cancel, reschedule};
pub use dedupe::{Dedupe, MAX_DEDUPE_WINDOW};
pub use error::PublishError;
pub use event::{MAX_PAYLOAD_DEPTH, NewOutboxEvent};
pub use publish::{PublishOutcome, publish_outbox_event, publish_outbox_events};
pub use routes::{EventRoutes, publish_routed_event};
pub use tx::{NotInTransaction, OutboxTx};
pub use typed::publish;

pub use outbox_model::TypedEvent;
pub use outbox_model::{Priority, PriorityOutOfRange};

/// Derives [`TypedEvent`] for a payload struct from its
/// `#[outbox(event_type = "…")]` attribute; the event type is checked
/// against the naming rule ([`outbox_model::EventType`]) while the
/// application compiles, and a broken rule is reported at the attribute
/// with the rule's own message. Only structs with named fields are
/// accepted: a payload is a JSON object.
///
/// ```
/// use outbox_publish::{OutboxEvent, TypedEvent};
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(event_type = "orders.order.created")]
/// struct OrderCreated {
///     order_id: u64,
/// }
///
/// assert_eq!(OrderCreated::EVENT_TYPE, "orders.order.created");
/// ```
///
/// `#[outbox(event_type = "orders.Order.created")]` does not compile:
/// "event type must be lowercase: 'O' at byte 7", at the string.
pub use outbox_macros::OutboxEvent;
