//! Deduplication outlives the queue's own memory: a row pushed again after
//! its finished job was trimmed from Redis makes a new job, and the
//! receivers still recognise the delivery; a configuration that would let
//! the receivers forget first does not start.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use outbox_publish::NewOutboxEvent;
use outbox_queue::{RedisSettings, queues, trim_finished};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_claimed_again_after_its_job_was_trimmed_sends_no_second_mail() {
    let stack = Stack::new().await;
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[]).await;
    let id = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "mail.user.welcome",
            json!({ "to": "ada@example.com", "subject": "Hi", "text": "Hello" }),
        ))
        .await;
    stack.smtp.wait_for_messages(1, WAIT).await;
    stack.wait_done(queues::MAIL, 1).await;
    stack.wait_done(queues::TOOLCTRL_EMAIL, 1).await;

    // The retention run trims every finished job (as it would after
    // QUEUE_DONE_RETENTION_HOURS): the queue no longer knows the task ids.
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    for queue in [queues::MAIL, queues::TOOLCTRL_EMAIL] {
        let trimmed = trim_finished(
            &mut redis,
            &stack.namespace,
            queue,
            Duration::ZERO,
            Duration::ZERO,
            100,
        )
        .await
        .unwrap();
        assert_eq!(trimmed, 1, "{queue}");
    }
    // Then the row is claimed again (a dispatcher lost its lease before
    // recording DONE, or an operator requeued it without --replay).
    stack
        .sql(&format!(
            "UPDATE outbox_event SET status = 'PROCESSING', locked_until = now() - interval '1 second'
             WHERE id = '{id}'"
        ))
        .await;
    // A new outbox.mail job and a new toolctrl.email job run...
    stack.wait_done(queues::MAIL, 1).await;
    stack.wait_done(queues::TOOLCTRL_EMAIL, 1).await;
    stack
        .wait_count(
            &format!("SELECT count(*) FROM outbox_event WHERE id = '{id}' AND status = 'DONE'"),
            1,
        )
        .await;
    // ...and the receiver's record of the sent mail stops the second send.
    assert_eq!(stack.smtp.messages().len(), 1, "the mail went out once");
}

#[tokio::test]
async fn receivers_that_would_forget_before_the_queue_stop_start_up() {
    let stack = Stack::new().await;
    let mut worker = stack.spawn(
        MAIL,
        &[
            ("QUEUE_DONE_RETENTION_HOURS", "72"),
            ("DELIVERY_RECORD_TTL_HOURS", "24"),
        ],
    );
    let status = worker.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(2));
    // The process may exit before its last line is read from the pipe.
    let output = worker.wait_output("DELIVERY_RECORD_TTL_HOURS").await;
    assert!(
        output.contains("DELIVERY_RECORD_TTL_HOURS")
            && output.contains("QUEUE_DONE_RETENTION_HOURS"),
        "{output}"
    );
}
