//! Cancel: PENDING or FAILED rows to CANCELLED, each with its history
//! entry (action `cancel`), so that the history tells who cancelled what
//! and why, and a requeue can bring the row back. PROCESSING (a dispatcher
//! holds it) and DONE (already handed off) rows are refused. `outbox
//! cancel` and the console's cancel pages both decide and act with these:
//! one row or a list of ids ([`execute`]), or every row a filter selects, in
//! batches ([`bulk`]).

pub mod bulk;

use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use outbox_store::{Change, StoreError};
use uuid::Uuid;

/// Why a row with `status` is not cancelled, or `None` when it is
/// (exactly the statuses of [`OutboxStatus::CANCELLABLE`], the rule that
/// code's cancel follows too; a test holds the two together).
#[must_use]
pub fn refusal(status: OutboxStatus) -> Option<&'static str> {
    match status {
        OutboxStatus::Pending | OutboxStatus::Failed => None,
        OutboxStatus::Processing => Some("PROCESSING: a dispatcher holds it right now"),
        OutboxStatus::Done => Some("DONE: it was handed off already"),
        OutboxStatus::Cancelled => Some("already CANCELLED"),
    }
}

/// Cancels the cancellable rows of `ids` with one statement, each with its
/// history entry; rows whose status changed since they were read are left
/// alone. Returns the ids cancelled.
///
/// # Errors
///
/// When Postgres fails (nothing changes then).
pub async fn execute(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
    reason: &str,
    requested_by: Option<&str>,
) -> Result<Vec<Uuid>, StoreError> {
    outbox_store::cancel(
        conn,
        Change {
            ids,
            allowed: &OutboxStatus::CANCELLABLE,
            reason,
            requested_by,
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_left_alone_are_those_the_shared_rule_refuses() {
        let cancelled: Vec<OutboxStatus> = OutboxStatus::ALL
            .into_iter()
            .filter(|status| refusal(*status).is_none())
            .collect();
        assert_eq!(cancelled, OutboxStatus::CANCELLABLE);
    }
}
