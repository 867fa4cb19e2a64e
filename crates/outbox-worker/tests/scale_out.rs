//! Several `worker-general` processes on one database, as an operator
//! scales out: their dispatchers share `OUTBOX_DISPATCH_LOOPS_TOTAL`,
//! packed into the first ones, each showing its share on /metrics (0 for
//! one standing by), and when one that runs loops is killed the others
//! take its share and hand off what comes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, Stack, Worker};

/// Events published after the kill.
const EVENTS: i64 = 2_000;

/// The value of `outbox_dispatch_loops_running` on the worker's /metrics
/// (`None` before the gauge is set).
async fn loops_running(worker: &Worker) -> Option<usize> {
    let body = reqwest::get(format!("http://{}/metrics", worker.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .find_map(|line| line.strip_prefix("outbox_dispatch_loops_running "))
        .map(|value| value.trim().parse::<f64>().unwrap() as usize)
}

/// Waits until the workers' shares, sorted, are `wanted`.
async fn wait_for_shares(workers: &[&Worker], wanted: &[usize]) {
    let mut seen = Vec::new();
    outbox_test_support::eventually(
        &format!("the shares of the loops to be {wanted:?}"),
        Duration::from_secs(60),
        async || {
            seen.clear();
            for worker in workers {
                seen.push(loops_running(worker).await.unwrap_or(0));
            }
            seen.sort_unstable_by(|a, b| b.cmp(a));
            seen == wanted
        },
    )
    .await;
}

// Break checked: shares split evenly instead of packed fail with "timed
// out after 60s waiting for the shares of the loops to be [4, 3, 0]"; so
// did `worker-general` counting once only and never again (after the kill,
// the standby kept 0), on the test's form before the packing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_pack_seven_dispatch_loops_and_the_standby_takes_over_after_a_kill() {
    let stack = Stack::new().await;
    let shared = [("OUTBOX_DISPATCH_LOOPS_TOTAL", "7")];
    let mut workers = vec![
        stack.start(GENERAL, &shared).await,
        stack.start(GENERAL, &shared).await,
        stack.start(GENERAL, &shared).await,
    ];
    // Seven packed into the first two by their listener's backend process
    // id: four and three; the third stands by.
    wait_for_shares(&workers.iter().collect::<Vec<_>>(), &[4, 3, 0]).await;

    // Kill the one running four loops.
    let mut four = Vec::new();
    for (n, worker) in workers.iter().enumerate() {
        if loops_running(worker).await == Some(4) {
            four.push(n);
        }
    }
    assert_eq!(four.len(), 1, "one worker runs four loops: {four:?}");
    let mut killed = workers.remove(four[0]);
    killed.signal("KILL");
    killed.wait_exit(Duration::from_secs(30)).await;
    // Seven between the two left, each at most its own four loops.
    wait_for_shares(&workers.iter().collect::<Vec<_>>(), &[4, 3]).await;

    stack
        .sql(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload)
             SELECT 'acme', 'audit.user.login', jsonb_build_object('n', g)
             FROM generate_series(1, {EVENTS}) AS g"
        ))
        .await;
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'DONE'",
            EVENTS,
        )
        .await;
    stack
        .wait_count("SELECT count(*) FROM audit_log", EVENTS)
        .await;
}
