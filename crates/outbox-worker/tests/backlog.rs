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
