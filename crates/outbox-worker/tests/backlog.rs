//! The incident that used to jam a queue for good, with the real binaries:
//! `worker-mail` is down while `worker-general` hands thousands of mail
//! events to `outbox.mail` (more than a Lua script can unpack at once); when
//! `worker-mail` starts, every mail goes out, once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use outbox_queue::queues;

/// Past the ~8,000 values Lua's `unpack` takes.
const MAILS: usize = 10_000;

/// Generous for a debug build on a shared machine; only a jammed queue
/// comes near it.
const LIMIT: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_worker_down_while_a_large_backlog_builds_sends_every_mail_once_when_it_starts() {
    let stack = Stack::new().await;
    let _general = stack.start(GENERAL, &[]).await;

    // A plain-SQL producer writes the events; worker-mail is not running.
    stack
        .sql(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload)
             SELECT 'acme', 'mail.user.welcome',
                    jsonb_build_object('to', 'user' || g || '@example.com',
                                       'template', 'welcome',
                                       'vars', jsonb_build_object('name', 'User ' || g))
             FROM generate_series(1, {MAILS}) AS g"
        ))
        .await;
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'DONE'",
            MAILS as i64,
        )
        .await;
    let waiting = stack.stats(queues::MAIL).await;
    assert_eq!(
        (waiting.backlog, waiting.due),
        (MAILS as u64, MAILS as u64),
        "the whole backlog waits, due, on outbox.mail: {waiting:?}"
    );

    let _mail = stack.start(MAIL, &[("WORKER_CONCURRENCY", "20")]).await;
    let mails = stack.smtp.wait_for_messages(MAILS, LIMIT).await;
    let recipients: HashSet<&str> = mails.iter().map(|m| m.to[0].as_str()).collect();
    assert_eq!(recipients.len(), MAILS, "each recipient got a mail");

    // Once every send job is acknowledged, nothing more goes out.
    outbox_test_support::eventually("every send job acknowledged", LIMIT, async || {
        stack.stats(queues::TOOLCTRL_EMAIL).await.done >= MAILS as u64
    })
    .await;
    assert_eq!(stack.smtp.messages().len(), MAILS, "no mail went out twice");
    let drained = stack.stats(queues::MAIL).await;
    assert_eq!(
        (drained.backlog, drained.running, drained.dead),
        (0, 0, 0),
        "{drained:?}"
    );
}

/// Old rows left for retention while the dispatcher drains a backlog.
const OLD_ROWS: usize = 100;

/// The retention run that starts with `worker-general` while its
/// dispatcher drains a backlog yields to it: the run pauses between its
/// batches (its log line says for how long) and still deletes every old row.
// Break checked: the worker not giving its dispatcher's `draining()` to the
// retention task (`None` in `outbox_worker::run`) logs
// `paused_for_dispatch_ms=0` and fails "the run paused for the dispatcher".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_yields_to_the_backlog_its_dispatcher_drains() {
    let stack = Stack::new().await;
    stack
        .sql(&format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
             SELECT 'acme', 'audit.user.login', '{{}}', 'DONE',
                    now() - interval '31 days' - g * interval '1 ms'
             FROM generate_series(1, {OLD_ROWS}) AS g"
        ))
        .await;
    // Mail no worker-mail sends here, one row a claim: thousands of full
    // ticks back to back.
    stack
        .sql(
            "INSERT INTO outbox_event (tenant_id, event_type, payload)
             SELECT 'acme', 'mail.user.welcome',
                    jsonb_build_object('to', 'user' || g || '@example.com', 'template', 'welcome')
             FROM generate_series(1, 5000) AS g",
        )
        .await;

    let general = stack
        .start(
            GENERAL,
            &[
                ("OUTBOX_DISPATCH_BATCH_SIZE", "1"),
                ("OUTBOX_DONE_RETENTION_BATCH_SIZE", "1"),
                ("LOG_FORMAT", "json"),
            ],
        )
        .await;

    let output = general.wait_output("retention run finished").await;
    let run = output
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|line| line["fields"].clone())
        .find(|fields| fields["message"] == "retention run finished")
        .unwrap();
    assert_eq!(run["deleted"], OLD_ROWS, "{run}");
    let paused = run["paused_for_dispatch_ms"].as_u64().unwrap();
    assert!(paused > 0, "the run paused for the dispatcher: {run}");
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'DONE' AND processed_at < now() - interval '30 days'",
            0,
        )
        .await;
}
