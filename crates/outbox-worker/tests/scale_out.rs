//! Several `worker-general` processes on one database, as an operator
//! scales out: their dispatchers share `OUTBOX_DISPATCH_LOOPS_TOTAL`, each
//! showing its share on /metrics, and when one is killed the others take
//! its share back and hand off what comes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, Stack};

/// Events published after the kill.
const EVENTS: i64 = 2_000;

// Break checked: `worker-general` running its share task once only (no
// recount) fails with "timed out after 60s waiting for metric line
// \"outbox_dispatch_loops_running 2\"" (the first one started alone runs 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_six_dispatch_loops_and_two_left_after_a_kill_take_three_each() {
    let stack = Stack::new().await;
    let shared = [("OUTBOX_DISPATCH_LOOPS_TOTAL", "6")];
    let first = stack.start(GENERAL, &shared).await;
    let second = stack.start(GENERAL, &shared).await;
    let mut third = stack.start(GENERAL, &shared).await;
    for worker in [&first, &second, &third] {
        stack
            .wait_metric_line(worker, "outbox_dispatch_loops_running 2")
            .await;
    }

    third.signal("KILL");
    third.wait_exit(Duration::from_secs(30)).await;
    for worker in [&first, &second] {
        stack
            .wait_metric_line(worker, "outbox_dispatch_loops_running 3")
            .await;
    }

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
