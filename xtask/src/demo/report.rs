//! The demo's summary on stdout: events by status and queue, the queues,
//! the sinks, workflow executions, latencies and the verdict. Writing stops
//! quietly when stdout is closed (`cargo xtask demo | head`).

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_queue::RedisConnection;
use outbox_queue::{QueueNamespace, queue_stats};

use crate::demo::verdict::{Observed, Verdict};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes one line to stdout; after a write fails (a closed pipe) writes
/// nothing more, without an error.
pub fn say_line(args: std::fmt::Arguments<'_>) {
    if AtomicBool::load(&STDOUT_CLOSED, Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{args}").and_then(|()| out.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// `println!` that ends quietly on a closed stdout.
macro_rules! say {
    () => { $crate::demo::report::say_line(format_args!("")) };
    ($($arg:tt)*) => { $crate::demo::report::say_line(format_args!($($arg)*)) };
}
pub(crate) use say;

#[derive(diesel::QueryableByName)]
struct WorkflowStatusRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Events by status and queue, and workflow executions by status.
pub async fn rows(conn: &mut AsyncPgConnection) -> Result<()> {
    let rows = outbox_store::status_queue_counts(conn).await?;
    let total: i64 = rows.iter().map(|r| r.n).sum();
    say!("\nevents by status and queue ({total} rows)");
    say!("  {:<10} {:<32} {:>7}", "status", "queue", "events");
    for row in &rows {
        say!("  {:<10} {:<32} {:>7}", row.status, row.queue, row.n);
    }
    let runs: Vec<WorkflowStatusRow> = diesel::sql_query(
        "SELECT w.name, e.status, count(*) AS n
         FROM workflow_execution e JOIN workflow w ON w.id = e.workflow_id
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .load(conn)
    .await?;
    say!("\nworkflow executions");
    say!("  {:<20} {:<10} {:>5}", "workflow", "status", "runs");
    for run in &runs {
        say!("  {:<20} {:<10} {:>5}", run.name, run.status, run.n);
    }
    Ok(())
}

/// The queues' figures in Redis.
pub async fn queues(redis: &mut RedisConnection, namespace: &QueueNamespace) -> Result<()> {
    say!("\nqueues (Redis, prefix {:?})", namespace.prefix());
    say!(
        "  {:<32} {:>7} {:>7} {:>5}",
        "queue",
        "waiting",
        "done",
        "dead"
    );
    for queue in outbox_catalog::Catalog::built_in().queues() {
        let s = queue_stats(redis, namespace, queue, Duration::from_secs(60)).await?;
        if s.backlog + s.done + s.dead > 0 {
            say!("  {queue:<32} {:>7} {:>7} {:>5}", s.backlog, s.done, s.dead);
        }
    }
    Ok(())
}

/// Mails and calls at the sinks.
pub fn sinks(seen: &Observed) {
    let mails: usize = seen.mails.values().sum::<usize>() + seen.foreign_mails;
    say!("\nsinks");
    say!(
        "  SMTP  {mails} mail(s), {} distinct Message-ID(s)",
        seen.mails.len()
    );
    let mut by_path: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for ((path, _), n) in &seen.calls {
        let entry = by_path.entry(path.as_str()).or_default();
        entry.0 += n;
        entry.1 += 1;
    }
    for (path, (calls, ids)) in &by_path {
        let bad = seen
            .bad_signatures
            .iter()
            .filter(|b| b.contains(&format!(" {path} ")))
            .count();
        say!(
            "  HTTP  {path:<18} {calls:>5} call(s), {ids:>5} distinct webhook-id(s), signatures {}",
            if bad == 0 {
                "all valid".to_owned()
            } else {
                format!("{bad} INVALID")
            }
        );
    }
    let crm: usize = seen.crm_calls.values().sum();
    say!(
        "  HTTP  {:<18} {crm:>5} call(s) from the workflow's httpRequest block, {} order(s)",
        crate::demo::verdict::CRM_PATH,
        seen.crm_calls.len()
    );
}

/// Latencies in milliseconds.
pub fn latencies([handoff, effect]: [(f64, f64, usize); 2]) {
    say!("\nlatency (ms)          p50       p99   samples");
    say!(
        "  hand-off       {:>9.1} {:>9.1} {:>9}   publish → row DONE (job in Redis)",
        handoff.0,
        handoff.1,
        handoff.2
    );
    say!(
        "  end to end     {:>9.1} {:>9.1} {:>9}   publish → audit/notification row, or mail/call at a sink (seen by 250 ms polling)",
        effect.0,
        effect.1,
        effect.2
    );
}

/// Most problems listed one by one.
const PROBLEMS_SHOWN: usize = 25;

/// The verdict, with what was checked and what is wrong.
pub fn verdict(verdict: &Verdict) {
    let checked = verdict
        .checked
        .iter()
        .map(|(kind, n)| format!("{n} {kind}"))
        .collect::<Vec<_>>()
        .join(", ");
    if verdict.passed() {
        say!(
            "\nverdict: PASS: every event delivered where it should be, once \
             (the unroutable one FAILED, the rolled-back one absent)"
        );
    } else {
        say!(
            "\nverdict: FAIL: {} problem(s): missing, doubled or stuck",
            verdict.problems.len()
        );
        for problem in verdict.problems.iter().take(PROBLEMS_SHOWN) {
            say!("  - {problem}");
        }
        if verdict.problems.len() > PROBLEMS_SHOWN {
            say!("  … and {} more", verdict.problems.len() - PROBLEMS_SHOWN);
        }
    }
    say!("  checked: {checked}");
    for window in &verdict.windows {
        say!("  at least once: {window}");
    }
}
