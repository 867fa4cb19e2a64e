//! The sweep: finds runs left `running` (or taken and never started, or
//! created by a bridge that died before taking them) with nobody holding
//! them and asks for them to be resumed.
//!
//! A run is `running` while a job advances it under its lease (see
//! `outbox-workflow-runner`). When that job's process dies, the lease expires
//! the runner's lease (`Runner::lease`, [`DEFAULT_LEASE`] by default) after
//! its last write, and
//! the job itself comes back only if the queue redelivers it (and, if it
//! comes back while the lease is still live, it leaves the run alone). The
//! sweep closes that gap: every run `running` whose lease has expired (or,
//! for a run never leased, whose last change is older than the lease) is
//! orphaned, as is a `queued` run taken by a holder whose lease expired,
//! and a `queued` `stream` run never taken and unchanged for longer than
//! the lease ([`NEVER_TAKEN_KINDS`]); [`resume_orphans`]
//! publishes a
//! `workflow.execution.requested` event for it, which the `outbox.workflow`
//! subscriber runs like any other: the run resumes at its first unfinished
//! block.
//!
//! Publishing is idempotent per dead holder: the dispatch key
//! `wf-resume:<execution>:<lease owner>:<lease expiry>` ([`resume_key`])
//! means that sweeps of several workers, or repeated sweeps while the
//! event waits in a backlog, publish one event for one expired lease. A
//! resume that takes the run writes a new owner and expiry, so if it dies
//! too, the next sweep publishes again.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::Double;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::workflow_execution;
use outbox_publish::{NewOutboxEvent, OutboxTx, publish_outbox_event};
use outbox_workflow_model::events::{EXECUTION_REQUESTED, ExecutionRequestedPayload};
use uuid::Uuid;

use crate::producers::ProducerError;

/// How long a holder keeps a run without writing, by default (the
/// runner's `Runner::with_lease`; `WORKFLOW_RUN_LEASE_MS`): each block's
/// transaction moves the expiry on by this much, and a block claimed before
/// its call holds the run for the call's own limit plus this much. When
/// the holder dies, the run is free again this long after its last write.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How often a worker sweeps, by default (`WORKFLOW_SWEEP_INTERVAL_MS`).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// `WORKFLOW_RUN_LEASE_MS`: the lease runs are held with
/// ([`DEFAULT_LEASE`]).
pub const WORKFLOW_RUN_LEASE_MS: outbox_env::Whole = outbox_env::Whole {
    name: "WORKFLOW_RUN_LEASE_MS",
    default: outbox_env::millis(DEFAULT_LEASE),
    min: 100,
    max: 86_400_000,
    meaning: "how long a workflow run stays held after its holder's last write (an HTTP call holds it for its timeout plus this), so how soon a run whose worker died is resumed, in ms",
};

/// `WORKFLOW_SWEEP_INTERVAL_MS`: how often a worker sweeps
/// ([`DEFAULT_SWEEP_INTERVAL`]).
pub const WORKFLOW_SWEEP_INTERVAL_MS: outbox_env::Whole = outbox_env::Whole {
    name: "WORKFLOW_SWEEP_INTERVAL_MS",
    default: outbox_env::millis(DEFAULT_SWEEP_INTERVAL),
    min: 100,
    max: outbox_env::MAX_MILLIS,
    meaning: "how often worker-general looks for workflow runs left running with an expired lease and requests their resume, in ms",
};

/// The trigger kinds whose runs the sweep also resumes when they are still
/// `queued` and were never taken, once unchanged for longer than the
/// lease. A `stream` run is created by the bridge, which then runs it: if
/// the bridge dies in between, nothing else asks for the run. A `manual`
/// or `api` run is created with its request event in one transaction, and
/// an `event` run by the handler of its trigger event, which runs the runs
/// it created one after another and, redelivered, runs them again: those
/// events ask for them, however long they wait (behind a backlog, or
/// behind a slow run of the same trigger).
pub const NEVER_TAKEN_KINDS: [&str; 1] = ["stream"];

/// The most orphaned runs one sweep resumes (the rest wait for the next).
pub const SWEEP_BATCH: i64 = 500;

/// The dispatch key of the sweep's resume of `run`: its execution, the
/// holder that died (`none` for a run never leased) and the instant its
/// lease expired (its last change, for a run never leased). A holder whose
/// lease lapsed while it was still alive, renewed it and died later leaves
/// another expiry, so its run gets another resume.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use outbox_workflow_store::sweep::{OrphanedRun, resume_key};
/// use uuid::Uuid;
///
/// let expired = Utc.timestamp_opt(1_765_000_000, 0).unwrap();
/// let run = OrphanedRun {
///     id: Uuid::nil(),
///     tenant_id: "acme".into(),
///     workflow_id: Uuid::nil(),
///     lease_owner: Some(Uuid::max()),
///     lease_until: Some(expired),
///     updated_at: expired,
/// };
/// assert_eq!(
///     resume_key(&run),
///     "wf-resume:00000000-0000-0000-0000-000000000000:\
///      ffffffff-ffff-ffff-ffff-ffffffffffff:1765000000000000"
/// );
/// ```
#[must_use]
pub fn resume_key(run: &OrphanedRun) -> String {
    let owner = run
        .lease_owner
        .map_or_else(|| "none".to_owned(), |owner| owner.to_string());
    let since = run.lease_until.unwrap_or(run.updated_at).timestamp_micros();
    format!("wf-resume:{}:{owner}:{since}", run.id)
}

/// A run left `running` with nobody holding it.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable)]
#[diesel(table_name = workflow_execution)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct OrphanedRun {
    /// The execution.
    pub id: Uuid,
    /// Its tenant.
    pub tenant_id: String,
    /// Its workflow.
    pub workflow_id: Uuid,
    /// The holder that died (`None`: never leased).
    pub lease_owner: Option<Uuid>,
    /// When its lease expired (`None`: never leased).
    pub lease_until: Option<DateTime<Utc>>,
    /// Its last change of status or block.
    pub updated_at: DateTime<Utc>,
}

/// The SQL filter of [`orphaned`].
type OrphanFilter = diesel::expression::SqlLiteral<
    diesel::sql_types::Bool,
    diesel::expression::UncheckedBind<
        diesel::expression::SqlLiteral<
            diesel::sql_types::Bool,
            diesel::expression::UncheckedBind<
                diesel::expression::SqlLiteral<diesel::sql_types::Bool>,
                <f64 as diesel::expression::AsExpression<Double>>::Expression,
            >,
        >,
        <f64 as diesel::expression::AsExpression<Double>>::Expression,
    >,
>;

/// The filter of runs orphaned for longer than `expired_for`: `running`
/// with the lease expired (a run never leased: unchanged for longer than
/// `lease`), or `queued` with the lease expired (taken, never started), or
/// `queued`, never taken and unchanged for longer than `lease` when nothing
/// else will ask for it (see [`NEVER_TAKEN_KINDS`]), by the database's
/// clock.
fn orphaned(lease: Duration, expired_for: Duration) -> OrphanFilter {
    let kinds = NEVER_TAKEN_KINDS.map(|kind| format!("'{kind}'")).join(", ");
    diesel::dsl::sql::<diesel::sql_types::Bool>(&format!(
        "status IN ('queued', 'running') AND coalesce(lease_until, \
         CASE WHEN status = 'running' OR trigger_kind IN ({kinds}) \
         THEN updated_at + make_interval(secs => "
    ))
    .bind::<Double, _>(lease.as_secs_f64())
    .sql(") END) < now() - make_interval(secs => ")
    .bind::<Double, _>(expired_for.as_secs_f64())
    .sql(")")
}

/// Up to `limit` orphaned runs (see the module docs), the longest orphaned
/// first.
///
/// # Errors
///
/// The database's.
pub async fn orphaned_runs(
    conn: &mut AsyncPgConnection,
    lease: Duration,
    limit: i64,
) -> Result<Vec<OrphanedRun>, diesel::result::Error> {
    workflow_execution::table
        .filter(orphaned(lease, Duration::ZERO))
        .order(workflow_execution::updated_at)
        .limit(limit)
        .select(OrphanedRun::as_select())
        .load(conn)
        .await
}

/// How many runs have been orphaned for longer than `expired_for` (for
/// `outbox health`: runs the sweep should have resumed by then).
///
/// # Errors
///
/// The database's.
pub async fn count_orphaned_runs(
    conn: &mut AsyncPgConnection,
    lease: Duration,
    expired_for: Duration,
) -> Result<i64, diesel::result::Error> {
    workflow_execution::table
        .filter(orphaned(lease, expired_for))
        .select(diesel::dsl::count_star())
        .get_result(conn)
        .await
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepPass {
    /// Orphaned runs found.
    pub orphaned: usize,
    /// Resume events published now (the others were published by an
    /// earlier sweep for the same holder and wait to be handled).
    pub published: usize,
}

/// Publishes a resume (`workflow.execution.requested`) for each run
/// orphaned under runners holding runs for `lease`, up to
/// [`SWEEP_BATCH`].
///
/// # Errors
///
/// [`ProducerError`] when the database fails; the runs handled before
/// stay handled.
pub async fn resume_orphans(
    conn: &mut AsyncPgConnection,
    lease: Duration,
) -> Result<SweepPass, ProducerError> {
    let runs = orphaned_runs(conn, lease, SWEEP_BATCH).await?;
    let mut pass = SweepPass {
        orphaned: runs.len(),
        published: 0,
    };
    for run in runs {
        let outcome = conn
            .transaction::<_, ProducerError, _>(async |conn| {
                let tx = OutboxTx::new(conn)?;
                let payload = ExecutionRequestedPayload {
                    execution_id: run.id,
                    tenant_id: run.tenant_id.clone(),
                    workflow_id: run.workflow_id,
                };
                let event = NewOutboxEvent::new(
                    &run.tenant_id,
                    EXECUTION_REQUESTED,
                    serde_json::to_value(&payload)?,
                )
                .dispatch_key(resume_key(&run));
                Ok(publish_outbox_event(&tx, event).await?)
            })
            .await?;
        if !outcome.is_duplicate() {
            pass.published += 1;
            tracing::warn!(
                execution = %run.id,
                tenant = %run.tenant_id,
                dead_holder = ?run.lease_owner,
                lease_until = ?run.lease_until,
                "workflow run left running with nobody holding it: resume requested"
            );
        }
    }
    Ok(pass)
}
