//! Cancel by filters: how many rows a cancel changes, a preview of the
//! first rows, and the run in batches. `outbox cancel` with filters and the
//! console's cancel of the events a filter selects both run these, each
//! with its own guard (`--yes`, a ticked box) from [`crate::confirm`].
//!
//! As for a requeue by filters ([`crate::requeue::bulk`]), each batch is
//! one statement ([`super::execute`]) that locks, records and changes its
//! rows, so row locks last one batch and a cancel of a million rows
//! commits as it goes.

use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use outbox_store::{Candidate, EventFilter, StoreError};
use serde::Serialize;
use uuid::Uuid;

use super::refusal;
use crate::batches::Act;

/// Default rows cancelled per statement.
pub const DEFAULT_BATCH_SIZE: u64 = 1_000;

/// How many rows the filter selects, and how many of them a cancel changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Selection {
    /// Rows matching the filter, whatever their status.
    pub matching: u64,
    /// Matching rows a cancel may change (PENDING, FAILED).
    pub cancellable: u64,
    /// The rows this cancel changes: every cancellable row, or the limit of them.
    pub to_cancel: u64,
}

impl Selection {
    /// Matching rows that the policy refuses (PROCESSING, DONE, CANCELLED).
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.matching.saturating_sub(self.cancellable)
    }
}

pub(crate) fn sql_limit(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Counts the rows matching `filter` and those a cancel may change (at
/// most `limit` of them when given).
///
/// # Errors
///
/// When Postgres fails.
pub async fn select(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    limit: Option<u64>,
) -> Result<Selection, StoreError> {
    let matching = outbox_store::count_events(conn, filter).await?;
    let cancellable = match filter.only(&OutboxStatus::CANCELLABLE) {
        Some(eligible) => outbox_store::count_events(conn, &eligible).await?,
        None => 0,
    };
    Ok(Selection {
        matching,
        cancellable,
        to_cancel: limit.map_or(cancellable, |limit| limit.min(cancellable)),
    })
}

/// One row of a preview: the row, and why it is left alone when it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewRow {
    /// The row as it is.
    pub row: Candidate,
    /// Why a cancel leaves it alone ([`refusal`]), `None` when it is cancelled.
    pub refused: Option<&'static str>,
}

/// The first `shown` rows (oldest first) that the cancel changes, then
/// the first `shown` it refuses.
///
/// # Errors
///
/// When Postgres fails.
pub async fn preview(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    selection: &Selection,
    shown: u64,
) -> Result<Vec<PreviewRow>, StoreError> {
    let mut rows = Vec::new();
    let to_show = shown.min(selection.to_cancel);
    if to_show > 0
        && let Some(eligible) = filter.only(&OutboxStatus::CANCELLABLE)
    {
        rows.extend(outbox_store::list_candidates(conn, &eligible, sql_limit(to_show)).await?);
    }
    let refused: Vec<OutboxStatus> = OutboxStatus::ALL
        .into_iter()
        .filter(|status| refusal(*status).is_some())
        .collect();
    if shown > 0
        && selection.refused() > 0
        && let Some(refused) = filter.only(&refused)
    {
        rows.extend(outbox_store::list_candidates(conn, &refused, sql_limit(shown)).await?);
    }
    Ok(rows
        .into_iter()
        .map(|row| PreviewRow {
            refused: refusal(row.status),
            row,
        })
        .collect())
}

/// What [`run`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cancelled {
    /// Every row cancelled, in the order of the batches.
    pub ids: Vec<Uuid>,
    /// Statements committed.
    pub batches: usize,
}

/// The text and metadata of a cancel by filters.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Why (kept in each history row).
    pub reason: &'a str,
    /// Who (kept in each history row).
    pub requested_by: Option<&'a str>,
    /// At most this many rows (what was counted and confirmed).
    pub total: u64,
    /// Rows per statement.
    pub batch_size: u64,
}

/// A batch of [`run`] failed; the batches before it stay committed.
#[derive(Debug, thiserror::Error)]
#[error(
    "batch {batch} failed; {cancelled_before} row(s) cancelled before it stay cancelled: {source}"
)]
pub struct BatchFailed {
    /// The batch that failed, from 1.
    pub batch: usize,
    /// The rows the committed batches cancelled.
    pub cancelled_before: usize,
    /// Postgres' error.
    pub source: StoreError,
}

/// Cancels up to `request.total` rows matching `filter`, oldest first, in
/// statements of at most `request.batch_size` rows, each with its history
/// rows. Cancelled rows drop out of the selection, so each batch takes the
/// next ones; the count bounds the run, so it never changes more rows than
/// were counted and confirmed, and rows created after the run started are
/// left alone (one published meanwhile never takes the place of one
/// handed off meanwhile). It stops early when a batch finds nothing
/// left to change (another session changed the rows meanwhile).
///
/// # Example
///
/// ```no_run
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_operator::cancel::bulk::{self, DEFAULT_BATCH_SIZE, Request};
/// use outbox_store::EventFilter;
///
/// let filter = EventFilter {
///     type_prefix: Some("webhook.order.".to_owned()),
///     ..EventFilter::default()
/// };
/// let selection = bulk::select(conn, &filter, None).await?;
/// let done = bulk::run(
///     conn,
///     &filter,
///     &Request {
///         reason: "the partner's endpoint is retired",
///         requested_by: Some("ana"),
///         total: selection.to_cancel,
///         batch_size: DEFAULT_BATCH_SIZE,
///     },
/// )
/// .await?;
/// println!("cancelled {} in {} batch(es)", done.ids.len(), done.batches);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`BatchFailed`] when Postgres fails; the batches committed before stay
/// committed (each is whole), and the error says how many rows they held.
pub async fn run(
    conn: &mut AsyncPgConnection,
    filter: &EventFilter,
    request: &Request<'_>,
) -> Result<Cancelled, BatchFailed> {
    let Some(eligible) = filter.only(&OutboxStatus::CANCELLABLE) else {
        return Ok(Cancelled::default());
    };
    let act = Act::Cancel {
        reason: request.reason,
        requested_by: request.requested_by,
    };
    match crate::batches::run(conn, &eligible, request.total, request.batch_size, act).await {
        Ok(done) => Ok(Cancelled {
            ids: done.ids,
            batches: done.batches,
        }),
        Err((done, source)) => Err(BatchFailed {
            batch: done.batches + 1,
            cancelled_before: done.ids.len(),
            source,
        }),
    }
}
