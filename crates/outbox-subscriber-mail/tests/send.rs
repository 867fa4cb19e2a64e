//! The `toolctrl.email` handler called directly, on real Redis and an SMTP
//! sink: a mail job that comes back after it was sent (under another task
//! id, so the queue cannot recognise it) sends nothing more.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use outbox_idempotency::RedisIdempotencyStore;
use outbox_queue::queues;
use outbox_subscriber::{JobHandler, JobMeta};
use outbox_subscriber_mail::{SmtpHandler, SmtpSettings, Templates, email_task_id, render_request};
use outbox_test_support::{SmtpSink, TestRedis};
use serde_json::json;
use uuid::Uuid;

fn meta(task_id: &str) -> JobMeta {
    JobMeta {
        queue: queues::TOOLCTRL_EMAIL.to_owned(),
        task_id: task_id.to_owned(),
        attempt: 1,
    }
}

#[tokio::test]
async fn a_sent_mail_is_not_sent_again_when_its_job_comes_back() {
    outbox_test_support::init_tracing();
    let redis = TestRedis::new().await;
    let smtp = SmtpSink::start().await;
    let store = RedisIdempotencyStore::new(redis.conn().await).with_prefix(redis.prefix());
    let handler = SmtpHandler::new(
        SmtpSettings {
            timeout: Duration::from_secs(5),
            ..SmtpSettings::new(smtp.url())
        },
        store,
    )
    .unwrap();
    let mail = render_request(
        &Templates::standard(),
        Uuid::now_v7(),
        "acme",
        &json!({ "to": "ada@example.com", "subject": "Hi", "text": "Hello" }),
    )
    .unwrap();

    handler
        .handle(mail.clone(), &meta(&email_task_id(&mail.delivery_id())))
        .await
        .unwrap();
    assert_eq!(smtp.messages().len(), 1);
    handler
        .handle(mail, &meta("email-redelivery-1"))
        .await
        .unwrap();
    assert_eq!(smtp.messages().len(), 1, "the mail went out once");
}
