//! Requeue by filters in the CLI: the `--yes` guard; the counts, the
//! preview and the run in batches are `outbox_operator::requeue::bulk`'s
//! (shared with the console), on the store filter the flags stand for.

use outbox_store::StoreError;

pub use outbox_operator::requeue::bulk::{
    BatchFailed, DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE, Request, Requeued, SHOWN_ROWS, Selection,
};

use super::Plan;
use crate::filters::Filters;
use crate::render::thousands;

/// Default of `--confirm-above`: a requeue that changes more rows needs `--yes`.
pub use outbox_operator::confirm::DEFAULT_CONFIRM_ABOVE;

/// Counts the rows matching `filters` and those a requeue may change.
///
/// # Errors
///
/// When Postgres fails.
pub async fn select(
    conn: &mut diesel_async::AsyncPgConnection,
    filters: &Filters,
    replay: bool,
    limit: Option<u64>,
) -> Result<Selection, StoreError> {
    outbox_operator::requeue::bulk::select(conn, &filters.selection(), replay, limit).await
}

/// The first `shown` rows the requeue changes and the first `shown` it refuses.
///
/// # Errors
///
/// When Postgres fails.
pub async fn preview(
    conn: &mut diesel_async::AsyncPgConnection,
    filters: &Filters,
    replay: bool,
    selection: &Selection,
    shown: u64,
) -> Result<Plan, StoreError> {
    outbox_operator::requeue::bulk::preview(conn, &filters.selection(), replay, selection, shown)
        .await
}

/// Requeues the rows of `filters` in batches (see
/// `outbox_operator::requeue::bulk::run`).
///
/// # Errors
///
/// [`BatchFailed`]: the batches committed before stay committed.
pub async fn run(
    conn: &mut diesel_async::AsyncPgConnection,
    filters: &Filters,
    request: &Request<'_>,
) -> Result<Requeued, BatchFailed> {
    outbox_operator::requeue::bulk::run(conn, &filters.selection(), request).await
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
