//! The run's lease: one writer per run.
//!
//! A job that advances a run first takes the lease ([`take`]): it writes a
//! fresh owner id and an expiry by the database's clock, and only when the
//! lease is free (never taken, released, or expired). Each of its later
//! transactions locks the execution and checks the owner ([`fence`]) before
//! it writes, and moves the expiry on ([`renew`]); a job whose lease was
//! taken over writes nothing more. A block whose work happens before its
//! transaction (an HTTP call, a bridge's `code`) is claimed first
//! ([`claim_block`]): a `running` row, committed with a lease long enough
//! to cover the call, so the call is made only under a live lease and a
//! second job cannot take the run while the first one's call may still be
//! in flight.

use std::time::Duration;

use diesel::dsl::{now, sql};
use diesel::expression::{AsExpression, SqlLiteral, UncheckedBind};
use diesel::prelude::*;
use diesel::sql_types::{Double, Nullable, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{workflow_block_execution, workflow_execution};
use outbox_workflow_store::{BlockExecutionStatus, ExecutionStatus, WorkflowExecution};
use uuid::Uuid;

use crate::RunError;

/// The SQL expression `now() + <a number of seconds>`.
type Expiry = SqlLiteral<
    Nullable<Timestamptz>,
    UncheckedBind<SqlLiteral<Nullable<Timestamptz>>, <f64 as AsExpression<Double>>::Expression>,
>;

/// `clock_timestamp() + <lease>` by the database's clock, so that every
/// holder and the sweep compare expiries with one clock. Not `now()`, the
/// transaction's start: a transaction that waited on a lock would write a
/// lease already partly spent.
fn expiry(lease: Duration) -> Expiry {
    sql::<Nullable<Timestamptz>>("clock_timestamp() + make_interval(secs => ")
        .bind::<Double, _>(lease.as_secs_f64())
        .sql(")")
}

/// Takes the lease of execution `id` for `owner` when the run is `queued`
/// or `running` and nobody holds it: the execution as taken, or `None`
/// (another job holds it, or the run is not there to advance).
pub(super) async fn take(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    owner: Uuid,
    lease: Duration,
) -> Result<Option<WorkflowExecution>, RunError> {
    Ok(diesel::update(
        workflow_execution::table
            .find(id)
            .filter(workflow_execution::status.eq_any([
                ExecutionStatus::Queued.as_str(),
                ExecutionStatus::Running.as_str(),
            ]))
            .filter(
                workflow_execution::lease_until
                    .is_null()
                    .or(workflow_execution::lease_until.le(now)),
            ),
    )
    .set((
        workflow_execution::lease_owner.eq(owner),
        workflow_execution::lease_until.eq(expiry(lease)),
    ))
    .returning(WorkflowExecution::as_returning())
    .get_result(conn)
    .await
    .optional()?)
}

/// Locks execution `id` for the rest of the transaction: the execution when
/// `owner` still holds it and it is `running`, else `None` (taken over,
/// cancelled, ended).
pub(super) async fn fence(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    owner: Uuid,
) -> Result<Option<WorkflowExecution>, RunError> {
    let execution = crate::db::lock_execution(conn, id).await?;
    Ok(execution.filter(|e| e.status == ExecutionStatus::Running && e.lease_owner == Some(owner)))
}

/// Moves the lease's expiry to `lease` from now (inside a fenced
/// transaction).
pub(super) async fn renew(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    lease: Duration,
) -> Result<(), RunError> {
    diesel::update(workflow_execution::table.find(id))
        .set(workflow_execution::lease_until.eq(expiry(lease)))
        .execute(conn)
        .await?;
    Ok(())
}

/// Gives the lease up (it expires now) if `owner` still holds it: the next
/// job, or the sweep, may take the run at once.
pub(super) async fn release(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    owner: Uuid,
) -> Result<(), RunError> {
    diesel::update(
        workflow_execution::table
            .find(id)
            .filter(workflow_execution::lease_owner.eq(owner)),
    )
    .set(workflow_execution::lease_until.eq(now))
    .execute(conn)
    .await?;
    Ok(())
}

/// Claims `block` of execution `id` for `owner` before its call: a
/// `running` block row (a new one, or the attempt count of the one a dead
/// holder left raised by one) and a lease of `hold`, in one committed
/// transaction. The attempt number, or `None` when `owner` no longer
/// holds the run.
pub(super) async fn claim_block(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    owner: Uuid,
    block: &str,
    hold: Duration,
) -> Result<Option<i32>, RunError> {
    use diesel_async::AsyncConnection;
    conn.transaction::<_, RunError, _>(async |conn| {
        if fence(conn, id, owner).await?.is_none() {
            return Ok(None);
        }
        let running = BlockExecutionStatus::Running.as_str();
        let raised: Option<i32> = diesel::update(
            workflow_block_execution::table
                .filter(workflow_block_execution::execution_id.eq(id))
                .filter(workflow_block_execution::block_id.eq(block))
                .filter(workflow_block_execution::status.eq(running)),
        )
        .set((
            workflow_block_execution::attempt.eq(workflow_block_execution::attempt + 1),
            workflow_block_execution::started_at.eq(now),
        ))
        .returning(workflow_block_execution::attempt)
        .get_result(conn)
        .await
        .optional()?;
        let attempt = match raised {
            Some(attempt) => attempt,
            None => {
                crate::db::insert_block(conn, id, block, BlockExecutionStatus::Running, None, None)
                    .await?;
                1
            }
        };
        renew(conn, id, hold).await?;
        Ok(Some(attempt))
    })
    .await
}
