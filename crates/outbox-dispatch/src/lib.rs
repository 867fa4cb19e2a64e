//! The heart of the outbox: the routing table ([`Router`]), the
//! [`Dispatcher`] that moves committed `outbox_event` rows onto their apalis
//! queues, and the `outbox-done-retention` job ([`purge_done`]).
//!
//! A tick claims due rows in one statement (`FOR UPDATE SKIP LOCKED`, lease
//! in `locked_until`), routes each by the longest matching prefix of its
//! event type, pushes each queue's jobs in units of at most 500 (one script
//! call per priority level, and a wake-up `PUBLISH` when a job was new)
//! with the deterministic task id `outbox:<delivery id>` (`outbox:<event
//! id>`, `…:g<n>` after the n-th replay), and records the outcomes with
//! fenced UPDATEs grouped by lease and values: DONE, retry with backoff,
//! back to PENDING while no route matches, FAILED (retries exhausted, no
//! route past the grace, or an oversized payload), or released (graceful
//! stop).
//!
//! Crash safety follows from three facts: a row is only DONE after its job is
//! in Redis; a row whose dispatcher died is re-claimed when its lease ends;
//! and a re-pushed job with the same task id is a no-op. So every committed
//! event becomes exactly one job, whichever process dies when.
//!
//! DONE means "handed to Redis", and a Redis that restarts without
//! persistence or is flushed forgets jobs. The [`RedisGuard`] (switched on
//! with [`Dispatcher::with_redis_guard`]) keeps a marker in Redis, notices
//! such a loss and reconciles: the [`Reconciler`], shared with `outbox
//! reconcile`, checks each DONE row of the window against its queue and its
//! receiver's records and pushes the lost jobs again under their own task
//! ids (see `docs/reliability.md`).
//!
//! This crate holds no subscriber logic and reads no environment: binaries
//! build a [`DispatcherConfig`] and hand it in. Nor does it write SQL on
//! the outbox tables: the claim ([`outbox_store::CLAIM_SQL`]), the outcome
//! updates and every other statement on them are `outbox-store`'s; this
//! crate decides ([`after_failed_push`]) and the store records.
//!
//! # Transactions and locks
//!
//! The claim and each outcome update are single autocommit statements; no
//! transaction spans the Redis push. Row locks are held only for the
//! duration of a statement; the lease is what keeps other dispatchers away
//! in between. Retention deletes rows in batches with `SKIP LOCKED`, so on
//! one table it never waits for a dispatcher; on a partitioned table,
//! dropping a finished partition or creating the ones ahead takes an
//! `ACCESS EXCLUSIVE` lock on `outbox_event` for a moment (waiting at most
//! a second for it), and writers wait behind it meanwhile.
//!
//! # Metrics
//!
//! Counters `outbox_dispatch_claimed_total`, `outbox_dispatch_dispatched_total{queue}`,
//! `outbox_dispatch_duplicates_total`, `outbox_dispatch_retried_total`,
//! `outbox_dispatch_failed_total{reason}`, `outbox_dispatch_unrouted_total`,
//! `outbox_dispatch_waiting_for_route_total`, `outbox_dispatch_unrouted_revived_total`,
//! `outbox_dispatch_released_total`, `outbox_dispatch_lost_leases_total`,
//! `outbox_dispatch_listener_reconnects_total`, `outbox_dispatch_vacuums_total`,
//! `outbox_retention_deleted_total`, `outbox_retention_partitions_dropped_total`;
//! histogram `outbox_dispatch_handoff_latency_seconds{queue}` (from when
//! the row became due: the later of `created_at` and `scheduled_at`);
//! gauges `outbox_pending_due`, `outbox_unrouted_waiting`,
//! `outbox_unrouted_failed` and `outbox_dispatch_loops_running` (this
//! dispatcher's share of `OUTBOX_DISPATCH_LOOPS_TOTAL`); from the Redis guard and reconciliation,
//! `outbox_redis_loss_detected_total{reason}`,
//! `outbox_reconcile_checked_total{queue}`, `outbox_reconcile_missing_total{queue}`
//! and `outbox_reconcile_repushed_total{queue}`. They go to whatever `metrics` recorder the
//! binary installs.

mod config;
mod db;
mod dispatcher;
mod draining;
mod error;
mod gate;
mod listener;
mod reconcile;
mod redis_guard;
mod retention;
mod router;
mod routes_file;
mod share;
pub mod stats;
mod vacuum;

pub use config::{
    ConfigError, DEFAULT_BACKOFF, DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, DEFAULT_INTERVAL,
    DEFAULT_LOCK_TIMEOUT, DEFAULT_LOOPS, DEFAULT_LOOPS_TOTAL, DEFAULT_MAX_RETRIES,
    DEFAULT_UNROUTED_GRACE, DEFAULT_VACUUM_EVERY, DispatcherConfig, MAX_BATCH_SIZE, MAX_LOOPS,
    MAX_LOOPS_TOTAL, MAX_UNROUTED_GRACE, MIN_LOCK_TIMEOUT, OUTBOX_DISPATCH_BATCH_SIZE,
    OUTBOX_DISPATCH_CONCURRENCY, OUTBOX_DISPATCH_INTERVAL_MS, OUTBOX_DISPATCH_LOOPS,
    OUTBOX_DISPATCH_LOOPS_TOTAL, OUTBOX_DISPATCH_VACUUM_EVERY, OUTBOX_DONE_RETENTION_BATCH_SIZE,
    OUTBOX_DONE_RETENTION_HOURS, OUTBOX_LOCK_TIMEOUT_MS, OUTBOX_MAX_RETRIES,
    OUTBOX_UNROUTED_GRACE_SECONDS, RetentionConfig, UNROUTED_RECHECK,
};
pub use db::RowTable;
pub use dispatcher::{
    AfterFailedPush, Dispatcher, ForWantOfARoute, TickReport, WAKE_LOOPS, after_failed_push,
    for_want_of_a_route, revive_routable,
};
pub use draining::Draining;
pub use error::DispatchError;
pub use gate::GATE_APPLICATION_NAME;
pub use listener::LISTENER_APPLICATION_NAME;
pub use outbox_store::VACUUM_SQL;
pub use reconcile::{
    BatchOutcome, DEFAULT_RECONCILE_BATCH, DerivedJob, MissingJob, QueueCounts, RETENTION_MARGIN,
    Receiver, Receivers, ReconcileOptions, ReconcileReport, Reconciler, Standing, retention_floor,
};
pub use redis_guard::{
    Assessment, CheckReport, DEFAULT_UNFINISHED_LIMIT, GuardStatus, LossReason,
    OUTBOX_REDIS_CHECK_INTERVAL_MS, RedisGuard, RedisGuardSettings, SAFE_POINT_LAG, SafePointPass,
    assess, guard_status, guard_turn_key, next_safe_point, window_start,
};
pub use retention::{
    PAUSE_WHILE_DRAINING, RETENTION_JOB_NAME, purge_done, purge_done_until, run_retention,
};
pub use router::{RouteError, Router};
pub use routes_file::{OUTBOX_ROUTES_FILE, RoutesFileError};
pub use share::{RECOUNT as SHARE_RECOUNT, loops_to_run};
pub use vacuum::FIRST_VACUUM_ROUND;
