//! Requeue: put FAILED / CANCELLED (and, on request, DONE) rows back to
//! PENDING, consistently and with history.
//!
//! This module holds the policy ([`refusal`], [`plan`]), one transaction
//! of requeues ([`execute`], by `outbox_store::requeue`) and the requeue by
//! filters in batches ([`bulk`]). `outbox requeue` (the CLI's
//! `requeue::command`, with its `--yes` guard) and the console's requeue
//! pages run them.

pub mod bulk;

use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
pub use outbox_store::Candidate;
use outbox_store::{Change, StoreError};
use serde::Serialize;
use uuid::Uuid;

/// What would happen (or happened) to one row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanRow {
    /// The row.
    pub id: Uuid,
    /// Its tenant.
    pub tenant_id: String,
    /// Its event type.
    pub event_type: String,
    /// Status before.
    pub status: OutboxStatus,
    /// Retries before.
    pub retries: i32,
    /// Last error before.
    pub last_error: Option<String>,
    /// Why it is refused, when it is.
    pub refused: Option<String>,
    /// True when requeueing runs a side effect again (a DONE row).
    pub replay: bool,
}

/// The plan for a selection.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Plan {
    /// Rows that will be requeued.
    pub requeue: Vec<PlanRow>,
    /// Rows left alone, with the reason.
    pub refused: Vec<PlanRow>,
}

/// Why a row with `status` is not requeued, or `None` when it is: PENDING
/// and PROCESSING are refused, DONE only without `replay`.
#[must_use]
pub fn refusal(status: OutboxStatus, replay: bool) -> Option<&'static str> {
    match status {
        OutboxStatus::Pending => Some("already PENDING: it will be dispatched as it is"),
        OutboxStatus::Processing => Some("PROCESSING: a dispatcher holds it right now"),
        OutboxStatus::Done if !replay => {
            Some("DONE: its side effect was handed off already; pass --replay to run it again")
        }
        _ => None,
    }
}

/// The statuses a requeue changes ([`refusal`] is `None`).
#[must_use]
pub fn requeueable(replay: bool) -> Vec<OutboxStatus> {
    OutboxStatus::ALL
        .into_iter()
        .filter(|status| refusal(*status, replay).is_none())
        .collect()
}

/// Classifies `rows` by [`refusal`].
#[must_use]
pub fn plan(rows: Vec<Candidate>, replay: bool) -> Plan {
    let mut plan = Plan::default();
    for row in rows {
        let refused = refusal(row.status, replay).map(str::to_owned);
        let entry = PlanRow {
            id: row.id,
            tenant_id: row.tenant_id,
            event_type: row.event_type,
            status: row.status,
            retries: row.retries,
            last_error: row.last_error,
            replay: row.status == OutboxStatus::Done,
            refused: refused.clone(),
        };
        if refused.is_some() {
            plan.refused.push(entry);
        } else {
            plan.requeue.push(entry);
        }
    }
    plan
}

/// What [`execute`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Executed {
    /// The rows requeued.
    pub requeued: Vec<Uuid>,
    /// Of those, the DONE rows that started a new delivery generation.
    pub replayed: usize,
}

/// Requeues the planned rows in one transaction: each row goes back to
/// PENDING with retries 0, due now, no lease, no processed_at, no
/// failed_at, no last_error, no target_queue; one `outbox_event_requeue` history row per
/// requeued row; and a NOTIFY that wakes the dispatchers. Rows whose status
/// changed since the plan are skipped.
///
/// A replayed (DONE) row starts a new delivery generation (`generation + 1`,
/// recorded in its history row): its job gets a new task id and the
/// receivers new idempotency keys, so the side effects run once more while
/// nothing of the earlier generations is removed from Redis. If the
/// transaction fails, nothing changed anywhere.
///
/// # Errors
///
/// When Postgres fails (nothing changes then).
pub async fn execute(
    conn: &mut AsyncPgConnection,
    plan: &Plan,
    reason: &str,
    requested_by: Option<&str>,
    replay: bool,
) -> Result<Executed, StoreError> {
    let ids: Vec<Uuid> = plan.requeue.iter().map(|r| r.id).collect();
    let allowed = requeueable(replay);
    let requeued = outbox_store::requeue(
        conn,
        Change {
            ids: &ids,
            allowed: &allowed,
            reason,
            requested_by,
        },
    )
    .await?;
    Ok(Executed {
        requeued: requeued.ids,
        replayed: requeued.replayed,
    })
}
