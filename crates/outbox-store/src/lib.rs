//! The one owner of the outbox tables. Every statement that reads or
//! changes `outbox_event`, its history (`outbox_event_requeue`) and the
//! Redis guard's tables (`outbox_redis_epoch`, `outbox_redis_safe_point`)
//! and the periodic events' ticks (`outbox_schedule`: [`advance_schedule`],
//! [`anchor_schedule`], [`schedule_rows`]) lives here, as a named operation with typed parameters: the publisher's
//! inserts ([`insert_event`], [`insert_events`]), the claim and
//! the fenced outcome updates ([`claim`], [`mark_done`], [`mark_retry`],
//! [`mark_failed`], [`mark_waiting_for_route`], [`release`]), the events no
//! route matched ([`unrouted_types`], [`failed_unrouted_ids`]), retention ([`purge_done_batch`]), the
//! operator's (and the application's) requeue, cancel and reschedule with
//! history ([`requeue`], [`cancel`], [`cancel_event`], and
//! [`reschedule_event`] of a pending row),
//! listings and lookups ([`list_events`], the console's pages
//! [`list_events_newest`], [`event`],
//! [`history`], …),
//! figures ([`pending_figures`], [`group_counts`]), the upkeep of the
//! table ([`vacuum`]) and per-key ordering ([`advance`], [`hold`],
//! [`held_keys`], [`skip_held`], on `outbox_ordering_key`).
//!
//! The dispatcher (`outbox-dispatch`), the operator CLI and the developer
//! tasks call these operations; none of them writes SQL on `outbox_event`
//! (a test in xtask fails when one does). This crate decides nothing: what
//! happens to an event after a failed hand-off, which statuses an operator
//! may requeue or cancel, are pure functions of its callers, passed in as
//! values. It holds no connection pool, reads no environment and knows no
//! Redis. Applications compile it through `outbox-publish` (whose
//! validation and transaction guard stay there), so it depends on nothing
//! beyond diesel and the model.
//!
//! Every operation takes the caller's `AsyncPgConnection` (a pooled one or
//! one inside the caller's transaction), returns a [`StoreError`] whose
//! [`kind`](StoreError::kind) callers can match, and runs in a tracing span
//! named after it (`debug`, the partition conversion's `info`).
//!
//! The publisher's statements also exist for sqlx (feature `sqlx`, module
//! `sqlx`: the same inserts, cancel and reschedule on an
//! `sqlx::PgConnection`, for `outbox_publish::sqlx`). Their texts are this
//! crate's constants ([`INSERT_EVENT_SQL`], [`REPLACE_EVENT_SQL`],
//! [`INSERT_EVENTS_SQL`], [`DISPATCH_KEY_HOLDERS_SQL`], [`CANCEL_SQL`],
//! [`RESCHEDULE_SQL`], each with its parameters in order); a test writes the same rows through
//! the diesel statements and these texts and finds every column equal.
//!
//! # Transactions and locks
//!
//! The claim and each outcome update are single autocommit statements
//! fenced by the claim's lease (see [`claim`] and [`DONE_SQL`]); retention
//! deletes in batches with `SKIP LOCKED`; requeue is one transaction,
//! cancel and reschedule one statement each, that locks the rows they
//! change (`FOR UPDATE`).
//!
//! # Example
//!
//! ```no_run
//! # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), outbox_store::StoreError> {
//! use outbox_store::{Lease, claim, mark_done};
//! let claimed = claim(conn, 100, 300_000).await?;
//! let done: Vec<(Lease, String)> = claimed
//!     .iter()
//!     .filter_map(|event| Lease::of(event).map(|lease| (lease, "outbox.audit".to_owned())))
//!     .collect();
//! let updated = mark_done(conn, &done).await?;
//! # Ok(()) }
//! ```

mod claim;
mod done;
mod error;
mod history;
mod insert;
mod maintenance;
mod ordering;
mod page;
mod partition;
mod redis_guard;
mod retention;
mod schedule;
mod select;
#[cfg(feature = "sqlx")]
pub mod sqlx;
mod stats;
mod unrouted;

pub use claim::{
    CLAIM_DUE_IDS_SQL, CLAIM_SQL, DONE_SQL, FAILED_SQL, Failure, Lease, RELEASE_SQL, RETRY_SQL,
    Retry, WAIT_FOR_ROUTE_SQL, WaitForRoute, claim, due_pending_count, mark_done, mark_failed,
    mark_retry, mark_waiting_for_route, release,
};
pub use done::{done_rows_after, done_rows_between, first_handed_off};
pub use error::{ErrorKind, Result, StoreError};
pub use history::{
    CANCEL_SQL, CancelEvent, Change, DeadJobsPutBack, Found, REMOVED_STATUS, RESCHEDULE_SQL,
    Requeued, RescheduleEvent, cancel, cancel_event, record_dead_jobs_put_back, requeue,
    reschedule_event,
};
pub use insert::{
    DISPATCH_KEY_HOLDERS_SQL, INSERT_EVENT_SQL, INSERT_EVENTS_SQL, Inserted, REPLACE_EVENT_SQL,
    ROWS_PER_STATEMENT, dispatch_key_holders, insert_event, insert_events,
};
pub use maintenance::{VACUUM_SQL, may_vacuum, table_rows, vacuum, vacuum_analyze};
pub use ordering::{
    HeldFigures, HeldKey, Skipped, advance, are_finished, clear_hold, held_figures, held_keys,
    hold, is_finished, release_deleted_hold, skip_held,
};
pub use page::{
    BadPagePosition, EventPage, PageNext, PageOrder, PagePosition, Tally, count_events_newest,
    list_events_newest,
};
pub use partition::{
    CONVERT_LOCK, ConversionLeftovers, Converted, DEFAULT_PARTITION, DroppedPartition,
    LEFTOVER_PARTS, LEGACY_PARTITION, LOCK_TIMEOUT, PartitionError, PartitionInfo, PartitionUnit,
    Partitioning, UnknownPartitionUnit, conversion_leftovers, convert_to_partitioned,
    create_partitions_ahead, drop_finished_partition, partitioned_by_other_means, partitioning,
    partitions, remove_conversion_leftovers,
};
pub use redis_guard::{
    EpochRow, ReconcileLease, SafePointRow, advance_drained, advance_pending, db_now,
    ensure_safe_points, lock_namespace, mark_pending, oldest_open_transaction,
    release_reconcile_lease, remembered_epoch, renew_reconcile_lease, safe_points, save_epoch,
    take_reconcile_lease, try_lock_namespace,
};
pub use retention::{PurgedBatch, purge_done_batch, purge_done_batch_in, redis_guard_hold};
pub use schedule::{ScheduleRow, advance_schedule, anchor_schedule, schedule_row, schedule_rows};
pub use select::{
    Candidate, DeliveryState, EventFilter, EventKey, EventSummary, HistoryEntry, candidate,
    count_events, count_events_up_to, delivery_state, event, history, list_candidates, list_events,
    statuses, summary,
};
pub use stats::{
    GroupCount, MaybeEstimated, OVERDUE_AFTER_SECS, OverviewCounts, PENDING_ALERT_THRESHOLD,
    PendingFigures, StatusQueueCount, group_counts, overview_counts, pending_figures,
    status_queue_counts, unfinished_count,
};
pub use unrouted::{UnroutedType, failed_unrouted_ids, unrouted_types};
