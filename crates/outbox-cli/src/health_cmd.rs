//! `outbox health`: queues, workers, dead jobs and stuck workflow executions (when the workflow migration set is applied) against thresholds; exit 1 on an alert.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use outbox_cli::health;
use outbox_model::MigrationSet;
use outbox_queue::{QueueNamespace, redact_url};
use serde_json::json;

use crate::known::Known;
use crate::unrouted::{self, Unrouted};
use crate::{
    Cli, ExitStatus, Outcome, connect, filters, print_json, redis, redis_status, workflow,
};

#[derive(Args)]
pub(crate) struct HealthArgs {
    /// Alert when a queue's backlog exceeds this.
    #[arg(long, default_value_t = health::DEFAULT_MAX_BACKLOG)]
    pub(crate) max_backlog: u64,
    /// Alert when a queue has more dead jobs than this.
    #[arg(long, default_value_t = 0)]
    pub(crate) max_dead: u64,
    /// A worker whose heartbeat is older than this many seconds is stalled (workers that stop cleanly deregister; only dead ones stay).
    #[arg(long, default_value_t = health::DEFAULT_STALL_AFTER_SECS)]
    pub(crate) stall_after_secs: u64,
    /// Alert when a workflow execution has been queued or running, unchanged, for longer than this (30s, 15m, 2h, 1d).
    #[arg(long, default_value = workflow::DEFAULT_STUCK_AFTER, value_parser = filters::parse_duration)]
    pub(crate) stuck_after: Duration,
    /// The lease worker-general holds workflow runs with (its `WORKFLOW_RUN_LEASE_MS`, in ms): a run never leased counts as orphaned once unchanged for longer than this plus two minutes.
    #[arg(long, env = "WORKFLOW_RUN_LEASE_MS", value_name = "MS", default_value = "30000", value_parser = run_lease)]
    pub(crate) workflow_run_lease_ms: Duration,
}

/// Reads `--workflow-run-lease-ms` as worker-general reads
/// `WORKFLOW_RUN_LEASE_MS`, with its range and its message.
fn run_lease(raw: &str) -> Result<Duration, String> {
    outbox_workflow_store::sweep::WORKFLOW_RUN_LEASE_MS
        .read_millis(&|_| Some(raw.to_owned()))
        .map_err(|e| e.to_string())
}

pub(crate) async fn health(cli: &Cli, args: &HealthArgs) -> Outcome {
    let mut redis = redis(cli)?;
    let namespace = QueueNamespace::for_redis(
        cli.queue_prefix.clone(),
        cli.redis_url.as_deref().unwrap_or_default(),
    );
    // Redis is read first, as without a database: an unreachable Redis is
    // named before a missing DATABASE_URL.
    let known = Known::read_if_possible(cli).await?;
    let names = known.queues();
    let thresholds = health::Thresholds {
        max_backlog: args.max_backlog,
        max_dead: args.max_dead,
        stall_after: Duration::from_secs(args.stall_after_secs),
    };
    let report = health::queue_health(&mut redis, &namespace, &names, &thresholds)
        .await
        .with_context(|| {
            format!(
                "reading the queues from Redis at {}",
                redact_url(cli.redis_url.as_deref().unwrap_or_default())
            )
        })?;
    let mut conn = connect(cli).await?;
    // A database without the workflow migration set (a bare application's)
    // has no executions to read.
    let workflows = if workflow_set_applied(&mut conn).await? {
        Some(
            workflow::health(&mut conn, args.stuck_after, args.workflow_run_lease_ms)
                .await
                .context("cannot read the workflow executions")?,
        )
    } else {
        None
    };
    let redis_status = redis_status::read(&mut conn, &mut redis, &namespace)
        .await
        .context("cannot read Redis' persistence and loss marker")?;
    let unrouted = Unrouted::from_types(
        outbox_store::unrouted_types(&mut conn)
            .await
            .context("cannot read the events no route matches")?,
    );
    let ordering = outbox_store::held_figures(&mut conn)
        .await
        .context("cannot read the held ordering keys")?;
    let ordering_warning = ordering_warning(&ordering);
    let alert = report.iter().any(|q| !q.alerts.is_empty())
        || workflows.as_ref().is_some_and(|w| !w.alerts.is_empty())
        || !redis_status.alerts.is_empty()
        || !unrouted.alerts.is_empty();
    if cli.json {
        print_json(&json!({
            "alert": alert,
            "queues": report,
            "redis": redis_status,
            "unrouted": unrouted,
            "workflows": workflows,
            "ordering": {
                "held_keys": ordering.held,
                "oldest_held_since": ordering.oldest_since,
                "warning": ordering_warning,
            },
        }))?;
    } else {
        println!(
            "{:<32} {:>8} {:>6} {:>8} {:>7} {:>6} {:>8} {:>8}  ALERTS",
            "QUEUE", "BACKLOG", "DUE", "RUNNING", "DONE", "DEAD", "WORKERS", "STALLED"
        );
        for q in &report {
            let s = q.stats;
            println!(
                "{:<32} {:>8} {:>6} {:>8} {:>7} {:>6} {:>8} {:>8}  {}",
                q.queue,
                s.backlog,
                s.due,
                s.running,
                s.done,
                s.dead,
                s.workers,
                s.stalled_workers,
                if q.alerts.is_empty() {
                    "-".to_owned()
                } else {
                    q.alerts.join(", ")
                }
            );
        }
        println!();
        redis_status::print(&redis_status);
        println!();
        unrouted::print(&unrouted);
        println!();
        match &ordering_warning {
            Some(warning) => println!("ORDERING: WARNING: {warning}"),
            None => println!("ORDERING: no ordering key is held"),
        }
        println!();
        match &workflows {
            Some(workflows) => workflow::print_health(workflows),
            None => println!("WORKFLOW: the workflow migration set is not applied"),
        }
    }
    Ok(ExitStatus::alert_if(alert))
}

/// The warning held ordering keys raise (a warning, not an alert: the keys'
/// other events wait, nothing is lost), `None` when no key is held.
fn ordering_warning(figures: &outbox_store::HeldFigures) -> Option<String> {
    let since = figures.oldest_since?;
    let age = (chrono::Utc::now() - since).num_seconds().max(0);
    Some(format!(
        "{} ordering key(s) held on an event that failed for good, the oldest for {age} s \
         (outbox ordering list; outbox ordering release KEY [--skip-event])",
        figures.held
    ))
}

/// Whether the database has the workflow migration set (its first
/// migration creates the tables the workflow section reads).
async fn workflow_set_applied(conn: &mut diesel_async::AsyncPgConnection) -> anyhow::Result<bool> {
    let states = outbox_model::migration_set_status(conn, &[MigrationSet::Workflow])
        .await
        .context("cannot read the applied migrations")?;
    Ok(states.iter().any(|m| m.applied))
}
