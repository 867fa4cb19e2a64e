//! Requeue by filters: how many rows a requeue changes, a preview of the
//! first rows, and the run in batches. `outbox requeue` with filters and
//! the console's requeue of the events a filter selects both run these,
//! each with its own guard (`--yes`, a ticked box) from [`crate::confirm`].
//!
//! Nothing here holds one transaction for the whole selection: each batch is
//! its own [`super::execute`], so row locks last one batch and a requeue of a
//! million rows commits as it goes.

use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use outbox_store::{EventFilter, StoreError};
use serde::Serialize;
use uuid::Uuid;

use super::{Candidate, Plan, plan, refusal, requeueable};
use crate::batches::Act;

/// Default rows requeued per transaction.
pub const DEFAULT_BATCH_SIZE: u64 = 1_000;
/// Largest batch: one batch's ids travel as one array parameter.
pub const MAX_BATCH_SIZE: u64 = 10_000;
/// Rows a requeue lists (to requeue, and refused) before it only counts them.
pub const SHOWN_ROWS: u64 = 100;

/// How many rows the filter selects, and how many of them a requeue changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Selection {
    /// Rows matching the filter, whatever their status.
    pub matching: u64,
    /// Matching rows a requeue may change (FAILED, CANCELLED; DONE with replay).
    pub requeueable: u64,
    /// The rows this requeue changes: every requeueable row, or the limit of them.
    pub to_requeue: u64,
}

impl Selection {
    /// Matching rows that the policy refuses (PENDING, PROCESSING, DONE without replay).
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.matching.saturating_sub(self.requeueable)
    }
}

/// Counts the rows matching `filter` (one count query with the same
/// filter, whatever the status) and those a requeue may change.
///
/// # Errors
///
/// When Postgres fails.
pub async fn select(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    replay: bool,
    limit: Option<u64>,
) -> Result<Selection, StoreError> {
    let matching = outbox_store::count_events(conn, filter).await?;
    let requeueable = match filter.only(&requeueable(replay)) {
        Some(eligible) => outbox_store::count_events(conn, &eligible).await?,
        None => 0,
    };
    Ok(Selection {
        matching,
        requeueable,
        to_requeue: limit.map_or(requeueable, |limit| limit.min(requeueable)),
    })
}

fn sql_limit(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The first `shown` rows (oldest first) that the requeue changes and the
/// first `shown` it refuses, classified by [`plan`].
///
/// # Errors
///
/// When Postgres fails.
pub async fn preview(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    replay: bool,
    selection: &Selection,
    shown: u64,
) -> Result<Plan, StoreError> {
    let mut rows: Vec<Candidate> = Vec::new();
    let to_show = shown.min(selection.to_requeue);
    if to_show > 0
        && let Some(eligible) = filter.only(&requeueable(replay))
    {
        rows.extend(outbox_store::list_candidates(conn, &eligible, sql_limit(to_show)).await?);
    }
    let refused: Vec<OutboxStatus> = OutboxStatus::ALL
        .into_iter()
        .filter(|status| refusal(*status, replay).is_some())
        .collect();
    if shown > 0
        && selection.refused() > 0
        && let Some(refused) = filter.only(&refused)
    {
        rows.extend(outbox_store::list_candidates(conn, &refused, sql_limit(shown)).await?);
    }
    Ok(plan(rows, replay))
}

/// What [`run`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requeued {
    /// Every row requeued, in the order of the batches.
    pub ids: Vec<Uuid>,
    /// Of those, DONE rows replayed (each started a new delivery generation).
    pub replayed: usize,
    /// Transactions committed.
    pub batches: usize,
}

/// The text and metadata of a bulk requeue.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Why (kept in each history row).
    pub reason: &'a str,
    /// Who (kept in each history row).
    pub requested_by: Option<&'a str>,
    /// Whether DONE rows are requeued (replayed).
    pub replay: bool,
    /// At most this many rows (what was counted and confirmed).
    pub total: u64,
    /// Rows per transaction.
    pub batch_size: u64,
}

/// A batch of [`run`] failed; the batches before it stay committed.
#[derive(Debug, thiserror::Error)]
#[error(
    "batch {batch} failed; {requeued_before} row(s) requeued before it stay requeued: {source}"
)]
pub struct BatchFailed {
    /// The batch that failed, from 1.
    pub batch: usize,
    /// The rows the committed batches requeued.
    pub requeued_before: usize,
    /// Postgres' error.
    pub source: StoreError,
}

/// Requeues up to `request.total` rows matching `filter`, oldest first, in
/// transactions of at most `request.batch_size` rows, each with its history
/// rows and its NOTIFY (see [`super::execute`]). Requeued rows are PENDING and drop
/// out of the selection, so each batch takes the next ones; rows created
/// after the run started are left alone. The count bounds
/// the run: it never changes more rows than were counted and confirmed, even
/// when rows go FAILED meanwhile (some matching rows may then be left for
/// the next requeue). It stops early when a batch finds nothing left to
/// change (another session changed the rows meanwhile).
///
/// # Errors
///
/// [`BatchFailed`] when Postgres fails; the batches committed before stay
/// committed (each is whole), and the error says how many rows they held.
pub async fn run(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    request: &Request<'_>,
) -> Result<Requeued, BatchFailed> {
    let Some(eligible) = filter.only(&requeueable(request.replay)) else {
        return Ok(Requeued::default());
    };
    let act = Act::Requeue {
        reason: request.reason,
        requested_by: request.requested_by,
        replay: request.replay,
    };
    match crate::batches::run(conn, &eligible, request.total, request.batch_size, act).await {
        Ok(done) => Ok(Requeued {
            ids: done.ids,
            replayed: done.replayed,
            batches: done.batches,
        }),
        Err((done, source)) => Err(BatchFailed {
            batch: done.batches + 1,
            requeued_before: done.ids.len(),
            source,
        }),
    }
}
