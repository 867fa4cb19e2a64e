//! Every metric the processes export, with its kind and help text: the one
//! list `/metrics` describes (`# HELP`, `# TYPE`) and `docs/operations/observability.md`
//! ("Metrics reference") documents; a test keeps the three in step.

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

/// What kind of metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// A current value.
    Gauge,
    /// A distribution, with buckets.
    Histogram,
}

impl Kind {
    /// As Prometheus' `# TYPE` line and the docs name it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// (name, kind, help) of every metric.
pub const METRICS: &[(&str, Kind, &str)] = &[
    (
        "outbox_redis_persistence",
        Kind::Gauge,
        "1 for the persistence mode Redis reported at start (aof-always, aof-everysec, aof-no, rdb, none, unknown), 0 for the others",
    ),
    (
        "outbox_redis_loss_detected_total",
        Kind::Counter,
        "Losses of handed-off jobs the Redis guard noticed, by reason",
    ),
    (
        "outbox_reconcile_checked_total",
        Kind::Counter,
        "DONE rows checked against Redis after a loss, by queue",
    ),
    (
        "outbox_reconcile_missing_total",
        Kind::Counter,
        "Checked rows whose job (or derived job) was gone, by queue",
    ),
    (
        "outbox_reconcile_repushed_total",
        Kind::Counter,
        "Jobs pushed or run again by reconciliation, by queue",
    ),
    (
        "outbox_build_info",
        Kind::Gauge,
        "Always 1; labels: version and binary of the process",
    ),
    (
        "outbox_dispatch_claimed_total",
        Kind::Counter,
        "Rows claimed by the dispatcher",
    ),
    (
        "outbox_dispatch_dispatched_total",
        Kind::Counter,
        "Rows handed off to their queue (DONE), by queue",
    ),
    (
        "outbox_dispatch_duplicates_total",
        Kind::Counter,
        "Re-pushes deduplicated by task id (re-claims after a crash)",
    ),
    (
        "outbox_dispatch_retried_total",
        Kind::Counter,
        "Hand-offs put back with backoff",
    ),
    (
        "outbox_dispatch_failed_total",
        Kind::Counter,
        "Rows dead-lettered, by reason: unrouted, retries_exhausted, oversized",
    ),
    (
        "outbox_dispatch_unrouted_total",
        Kind::Counter,
        "Events with no routing rule",
    ),
    (
        "outbox_dispatch_released_total",
        Kind::Counter,
        "Claims given back on shutdown",
    ),
    (
        "outbox_dispatch_lost_leases_total",
        Kind::Counter,
        "Outcomes not recorded because the lease was lost",
    ),
    (
        "outbox_dispatch_listener_reconnects_total",
        Kind::Counter,
        "LISTEN connection re-established",
    ),
    (
        "outbox_dispatch_loops_running",
        Kind::Gauge,
        "Dispatch loops this process runs: its share of OUTBOX_DISPATCH_LOOPS_TOTAL (0: standing by)",
    ),
    (
        "outbox_dispatch_vacuums_total",
        Kind::Counter,
        "VACUUM rounds of outbox_event run by the dispatcher (OUTBOX_DISPATCH_VACUUM_EVERY)",
    ),
    (
        "outbox_dispatch_handoff_latency_seconds",
        Kind::Histogram,
        "From when a row became due (created or scheduled) to its hand-off, by queue",
    ),
    ("outbox_pending_due", Kind::Gauge, "PENDING rows due now"),
    (
        "outbox_ordering_held_keys",
        Kind::Gauge,
        "Ordering keys held on an event that failed for good (outbox ordering list)",
    ),
    (
        "outbox_ordering_oldest_held_seconds",
        Kind::Gauge,
        "How long the oldest held ordering key has been held",
    ),
    (
        "outbox_ordering_duplicates_skipped_total",
        Kind::Counter,
        "Deliveries of an ordered event its key was past, acknowledged without running the handler, by queue",
    ),
    (
        "outbox_unrouted_waiting",
        Kind::Gauge,
        "PENDING events no routing rule matches, waiting for a route within their grace period",
    ),
    (
        "outbox_unrouted_failed",
        Kind::Gauge,
        "FAILED (unrouted) events: their grace period ran out and no running dispatcher routes them",
    ),
    (
        "outbox_dispatch_waiting_for_route_total",
        Kind::Counter,
        "Claims of events no routing rule matches that were put back to wait for a route",
    ),
    (
        "outbox_dispatch_unrouted_revived_total",
        Kind::Counter,
        "FAILED (unrouted) events requeued by a dispatcher that now has a route for them",
    ),
    (
        "outbox_pending_overdue",
        Kind::Gauge,
        "PENDING rows due for more than 60 s",
    ),
    (
        "outbox_pending_oldest_due_age_seconds",
        Kind::Gauge,
        "Age of the oldest due PENDING row",
    ),
    (
        "outbox_processing",
        Kind::Gauge,
        "Rows claimed and not yet handed off",
    ),
    (
        "outbox_queue_backlog",
        Kind::Gauge,
        "Jobs waiting or scheduled, by queue",
    ),
    ("outbox_queue_due", Kind::Gauge, "Jobs due now, by queue"),
    (
        "outbox_queue_running",
        Kind::Gauge,
        "Jobs being handled, by queue",
    ),
    (
        "outbox_queue_done",
        Kind::Gauge,
        "Finished jobs still kept, by queue",
    ),
    (
        "outbox_queue_dead",
        Kind::Gauge,
        "Dead-lettered jobs, by queue",
    ),
    (
        "outbox_queue_workers",
        Kind::Gauge,
        "Queue workers with a fresh heartbeat, by queue",
    ),
    (
        "outbox_queue_stalled_workers",
        Kind::Gauge,
        "Queue workers whose heartbeat is stale, by queue",
    ),
    (
        "outbox_subscriber_jobs_total",
        Kind::Counter,
        "Jobs handled, by queue and outcome: done, retry, dead",
    ),
    (
        "outbox_subscriber_job_duration_seconds",
        Kind::Histogram,
        "Handler time, by queue",
    ),
    (
        "outbox_subscriber_commit_to_start_seconds",
        Kind::Histogram,
        "From the event's commit (its created_at) to the start of its handler, first deliveries only, by queue",
    ),
    (
        "workflow_executions_active",
        Kind::Gauge,
        "Workflow executions queued or running, by status",
    ),
    (
        "workflow_execution_oldest_unchanged_seconds",
        Kind::Gauge,
        "How long the oldest queued or running workflow execution has not changed, by status (0 when none)",
    ),
    (
        "outbox_subscriber_worker_restarts_total",
        Kind::Counter,
        "Queue workers restarted after a backend failure, by queue",
    ),
    (
        "outbox_retention_deleted_total",
        Kind::Counter,
        "DONE rows purged by retention",
    ),
    (
        "outbox_retention_partitions_dropped_total",
        Kind::Counter,
        "Partitions of finished rows retention detached and dropped (a partitioned outbox table)",
    ),
    (
        "outbox_schedule_ticks_total",
        Kind::Counter,
        "Ticks of periodic events, by schedule and outcome: published by this worker, taken (published by another), skipped (missed while no worker ran)",
    ),
    (
        "outbox_service_restarts_total",
        Kind::Counter,
        "Restarts of a service of the process (http, dispatcher, retention, workflow sweep, queue trim, gauges, schedules; the bridge's http and request-id pruner) after it failed, by service",
    ),
    (
        "outbox_queue_trimmed_total",
        Kind::Counter,
        "Finished jobs removed from Redis, by queue",
    ),
    (
        "outbox_queue_orphans_recovered_total",
        Kind::Counter,
        "In-flight jobs of workers presumed dead, put back on the queue",
    ),
    (
        "outbox_queue_stale_acks_total",
        Kind::Counter,
        "Finished jobs a worker no longer held; they run again elsewhere",
    ),
    (
        "outbox_queue_jobs_without_body_total",
        Kind::Counter,
        "Queued ids whose body was gone; dropped",
    ),
    (
        "outbox_workflow_runs_resumed_total",
        Kind::Counter,
        "Workflow runs left running with an expired lease whose resume the sweep published",
    ),
    (
        "workflow_bridge_requests_total",
        Kind::Counter,
        "Bridge requests that ran, by endpoint: run, continue, stream",
    ),
    (
        "workflow_bridge_refusals_total",
        Kind::Counter,
        "Bridge requests refused, by HTTP status",
    ),
];

/// Histogram buckets, in seconds: from a millisecond to five minutes.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A recorder builder whose `_seconds` histograms have [`SECONDS_BUCKETS`]
/// (so they aggregate across replicas).
///
/// # Errors
///
/// Never for these buckets; the exporter's error otherwise.
pub fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
}

/// Registers the help text of every metric, and `outbox_build_info` for
/// `binary`.
pub fn describe(binary: &'static str) {
    for (name, kind, help) in METRICS {
        let name = *name;
        let help = *help;
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
            Kind::Histogram => metrics::describe_histogram!(name, metrics::Unit::Seconds, help),
        }
    }
    metrics::gauge!(
        "outbox_build_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "binary" => binary
    )
    .set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The (name, kind) rows of the docs' metrics table.
    fn documented() -> Vec<(String, String)> {
        let docs = include_str!("../../../docs/operations/observability.md");
        let table = docs
            .split("## Metrics reference")
            .nth(1)
            .expect("the Metrics reference section");
        table
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let name = cells.get(1)?.strip_prefix('`')?;
                let name = name.split(['`', '{']).next()?;
                Some((name.to_owned(), (*cells.get(2)?).to_owned()))
            })
            .collect()
    }

    #[test]
    fn the_docs_list_every_metric_with_its_kind_and_nothing_else() {
        let mut code: Vec<(String, String)> = METRICS
            .iter()
            .map(|(name, kind, _)| ((*name).to_owned(), kind.as_str().to_owned()))
            .collect();
        let mut docs = documented();
        code.sort();
        docs.sort();
        assert_eq!(docs, code);
    }

    /// The metric names the workspace's library code emits: the string
    /// literal (a metric name's characters only) that opens a `counter!`,
    /// `gauge!` or `histogram!` call in `crates/*/src`.
    fn emitted() -> std::collections::BTreeSet<String> {
        fn walk(dir: &std::path::Path, files: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, files);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for krate in std::fs::read_dir(&crates).unwrap().flatten() {
            let src = krate.path().join("src");
            if src.is_dir() {
                walk(&src, &mut files);
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for call in ["counter!(", "gauge!(", "histogram!("] {
                for (at, _) in text.match_indices(call) {
                    let rest = text[at + call.len()..].trim_start();
                    if let Some(literal) = rest.strip_prefix('"')
                        && let Some((name, _)) = literal.split_once('"')
                        && !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    {
                        names.insert(name.to_owned());
                    }
                }
            }
        }
        names
    }

    // Break checked: without `outbox_retention_partitions_dropped_total`
    // in the catalog (as it was, emitted by retention on a partitioned
    // table and served without help text) it fails naming it.
    #[test]
    fn every_metric_the_code_emits_is_in_the_catalog() {
        let emitted = emitted();
        assert!(emitted.len() >= 40, "only {} names found", emitted.len());
        let missing: Vec<&String> = emitted
            .iter()
            .filter(|name| {
                !METRICS.iter().any(|(n, _, _)| n == name) && *name != "outbox_build_info"
            })
            .collect();
        assert!(
            missing.is_empty(),
            "emitted but not in the catalog: {missing:?}"
        );
    }

    #[test]
    fn every_name_is_unique_and_every_help_says_something() {
        let mut names: Vec<&str> = METRICS.iter().map(|(n, _, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), METRICS.len());
        assert!(METRICS.iter().all(|(_, _, help)| help.len() > 10));
    }
}
