//! Requeue by filters: how many rows a requeue changes, the `--yes` guard,
//! a preview of the first rows, and the run in batches.
//!
//! Nothing here holds one transaction for the whole selection: each batch is
//! its own [`execute`], so row locks last one batch and a requeue of a
//! million rows commits as it goes.

use anyhow::Result;
use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use outbox_store::StoreError;
use serde::Serialize;
use uuid::Uuid;

use super::{Candidate, Plan, execute, plan, refusal, requeueable};
use crate::filters::Filters;
use crate::render::thousands;

/// Default of `--confirm-above`: a requeue that changes more rows needs `--yes`.
pub use outbox_operator::confirm::DEFAULT_CONFIRM_ABOVE;
/// Default of `--batch-size`: rows requeued per transaction.
pub const DEFAULT_BATCH_SIZE: u64 = 1_000;
/// Largest `--batch-size`: one batch's ids travel as one array parameter.
pub const MAX_BATCH_SIZE: u64 = 10_000;
/// Rows a requeue lists (to requeue, and refused) before it only counts them.
pub const SHOWN_ROWS: u64 = 100;

/// How many rows the filters select, and how many of them a requeue changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Selection {
    /// Rows matching the filters, whatever their status.
    pub matching: u64,
    /// Matching rows a requeue may change (FAILED, CANCELLED; DONE with `--replay`).
    pub requeueable: u64,
    /// The rows this requeue changes: every requeueable row, or `--limit` of them.
    pub to_requeue: u64,
}

impl Selection {
    /// Matching rows that the policy refuses (PENDING, PROCESSING, DONE without `--replay`).
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.matching.saturating_sub(self.requeueable)
    }
}

/// Counts the rows matching `filters` (one count query with the same
/// filters, whatever the status) and those a requeue may change.
///
/// # Errors
///
/// When Postgres fails.
pub async fn select(
    conn: &mut AsyncPgConnection,
    filters: &Filters,
    replay: bool,
    limit: Option<u64>,
) -> Result<Selection, StoreError> {
    let matching = filters.count(conn).await?;
    let requeueable = match filters.only(&requeueable(replay)) {
        Some(eligible) => eligible.count(conn).await?,
        None => 0,
    };
    Ok(Selection {
        matching,
        requeueable,
        to_requeue: limit.map_or(requeueable, |limit| limit.min(requeueable)),
    })
}

/// A requeue of more rows than `--confirm-above` without `--yes`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to requeue {} rows without --yes ({} matching; more than --confirm-above {}): \
     look at them with --dry-run, then run again with --yes, or narrow the filters or pass --limit",
    thousands(self.rows),
    thousands(self.matching),
    thousands(self.threshold)
)]
pub struct NeedsConfirmation {
    /// The rows the requeue would change.
    pub rows: u64,
    /// The rows matching the filters.
    pub matching: u64,
    /// `--confirm-above`.
    pub threshold: u64,
}

/// The `--yes` guard: a requeue may change more than `confirm_above` rows
/// only with `yes`. It counts what the requeue would change (every matching
/// requeueable row, or `--limit` of them), not what a preview shows.
///
/// # Errors
///
/// [`NeedsConfirmation`], naming the counts.
pub fn confirm(
    selection: &Selection,
    confirm_above: u64,
    yes: bool,
) -> Result<(), NeedsConfirmation> {
    if outbox_operator::confirm::needs_confirmation(selection.to_requeue, confirm_above) && !yes {
        return Err(NeedsConfirmation {
            rows: selection.to_requeue,
            matching: selection.matching,
            threshold: confirm_above,
        });
    }
    Ok(())
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
    filters: &Filters,
    replay: bool,
    selection: &Selection,
    shown: u64,
) -> Result<Plan, StoreError> {
    let mut rows: Vec<Candidate> = Vec::new();
    let to_show = shown.min(selection.to_requeue);
    if to_show > 0
        && let Some(eligible) = filters.only(&requeueable(replay))
    {
        rows.extend(eligible.candidates(conn, sql_limit(to_show)).await?);
    }
    let refused: Vec<OutboxStatus> = OutboxStatus::ALL
        .into_iter()
        .filter(|status| refusal(*status, replay).is_some())
        .collect();
    if shown > 0
        && selection.refused() > 0
        && let Some(refused) = filters.only(&refused)
    {
        rows.extend(refused.candidates(conn, sql_limit(shown)).await?);
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

/// Requeues up to `request.total` rows matching `filters`, oldest first, in
/// transactions of at most `request.batch_size` rows, each with its history
/// rows and its NOTIFY (see [`execute`]). Requeued rows are PENDING and drop
/// out of the selection, so each batch takes the next ones. The count bounds
/// the run: it never changes more rows than were counted and confirmed, even
/// when rows go FAILED meanwhile (some matching rows may then be left for
/// the next requeue). It stops early when a batch finds nothing left to
/// change (another session changed the rows meanwhile).
///
/// # Errors
///
/// When Postgres or Redis fails; the batches committed before stay
/// committed (each is whole), and the error says how many rows they held.
pub async fn run(
    conn: &mut AsyncPgConnection,
    filters: &Filters,
    request: &Request<'_>,
) -> Result<Requeued> {
    let mut done = Requeued::default();
    let Some(eligible) = filters.only(&requeueable(request.replay)) else {
        return Ok(done);
    };
    let batch_size = request.batch_size.max(1);
    loop {
        let so_far = u64::try_from(done.ids.len()).unwrap_or(u64::MAX);
        let want = batch_size.min(request.total.saturating_sub(so_far));
        if want == 0 {
            break;
        }
        let rows: Vec<Candidate> = eligible.candidates(conn, sql_limit(want)).await?;
        if rows.is_empty() {
            break;
        }
        let batch = plan(rows, request.replay);
        let executed = execute(
            conn,
            &batch,
            request.reason,
            request.requested_by,
            request.replay,
        )
        .await
        .map_err(|e| {
            anyhow::Error::from(e).context(format!(
                "batch {} failed; {} row(s) requeued before it stay requeued",
                done.batches + 1,
                thousands(so_far)
            ))
        })?;
        done.batches += 1;
        done.replayed += batch
            .requeue
            .iter()
            .filter(|row| row.replay && executed.requeued.contains(&row.id))
            .count();
        if executed.requeued.is_empty() {
            break;
        }
        done.ids.extend(executed.requeued);
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selection(matching: u64, requeueable: u64, limit: Option<u64>) -> Selection {
        Selection {
            matching,
            requeueable,
            to_requeue: limit.map_or(requeueable, |l| l.min(requeueable)),
        }
    }

    #[test]
    fn the_guard_counts_what_the_requeue_would_change() {
        assert_eq!(confirm(&selection(100, 100, None), 100, false), Ok(()));
        let refused = confirm(&selection(1234, 250, None), 100, false).unwrap_err();
        assert_eq!((refused.rows, refused.matching), (250, 1234));
        assert!(
            refused
                .to_string()
                .contains("requeue 250 rows without --yes (1,234 matching")
        );
        assert_eq!(confirm(&selection(1234, 250, None), 100, true), Ok(()));
        assert_eq!(
            confirm(&selection(250, 250, Some(10)), 100, false),
            Ok(()),
            "--limit 10 changes 10 rows"
        );
        assert_eq!(selection(260, 250, None).refused(), 10);
    }
}
