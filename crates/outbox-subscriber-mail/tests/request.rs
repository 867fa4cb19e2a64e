//! The `outbox.mail` and `outbox.marketing` handlers called directly, on
//! real Postgres and Redis: what they leave on `toolctrl.email`, under which
//! task id, for which delivery generation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use diesel_async::SimpleAsyncConnection;
use outbox_idempotency::RedisIdempotencyStore;
use outbox_queue::{OutboxJob, QueueNamespace, queues};
use outbox_subscriber::{JobHandler, JobMeta};
use outbox_subscriber_mail::{
    EmailJob, MailRequestHandler, MarketingLeadHandler, SmtpHandler, SmtpSettings, Templates,
};
use outbox_test_support::{SmtpSink, TestDatabase, TestRedis};
use serde_json::{Value, json};
use uuid::Uuid;

struct Env {
    db: TestDatabase,
    redis: TestRedis,
    namespace: QueueNamespace,
}

impl Env {
    async fn new() -> Self {
        outbox_test_support::init_tracing();
        let redis = TestRedis::new().await;
        let namespace = QueueNamespace::prefixed(redis.prefix().to_owned());
        Self {
            db: TestDatabase::new().await,
            redis,
            namespace,
        }
    }

    /// The send jobs on `toolctrl.email`: task id and body, by task id.
    async fn email_jobs(&self) -> Vec<(String, EmailJob)> {
        let mut conn = self.redis.conn().await;
        let mut jobs: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
            .arg(format!(
                "{}:data",
                self.namespace.queue(queues::TOOLCTRL_EMAIL)
            ))
            .query_async(&mut conn)
            .await
            .unwrap();
        jobs.sort();
        jobs.into_iter()
            .map(|(task, body)| (task, serde_json::from_slice(&body).unwrap()))
            .collect()
    }
}

fn job(event_type: &str, payload: Value, generation: u32) -> (Uuid, OutboxJob) {
    let id = Uuid::now_v7();
    let job = serde_json::from_value(json!({
        "outbox_event_id": id,
        "tenant_id": "acme",
        "event_type": event_type,
        "payload": payload,
        "dispatch_key": null,
        "created_at": "2026-11-30T12:00:00Z",
        "generation": generation,
    }))
    .unwrap();
    (id, job)
}

fn meta(queue: &str) -> JobMeta {
    JobMeta {
        queue: queue.to_owned(),
        task_id: "outbox:test".to_owned(),
        attempt: 1,
    }
}

#[tokio::test]
async fn a_mail_event_leaves_one_send_job_under_its_delivery_id_and_a_replay_another() {
    let env = Env::new().await;
    let handler = MailRequestHandler::new(
        Templates::standard(),
        env.redis.conn().await,
        env.namespace.clone(),
    );
    assert_eq!(handler.queue(), queues::MAIL);
    let payload = json!({ "to": "ada@example.com", "subject": "Hi", "text": "Hello" });
    let (id, first) = job("mail.user.welcome", payload, 0);
    handler
        .handle(first.clone(), &meta(queues::MAIL))
        .await
        .unwrap();
    // The same job again (a redelivery) adds nothing.
    handler
        .handle(first.clone(), &meta(queues::MAIL))
        .await
        .unwrap();
    let jobs = env.email_jobs().await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].0, format!("email:{id}"));
    assert_eq!(jobs[0].1.to, ["ada@example.com"]);
    assert_eq!(jobs[0].1.subject, "Hi");

    // A replay (generation 1) is a new delivery with its own send job.
    let replay = OutboxJob {
        generation: 1,
        ..first
    };
    handler.handle(replay, &meta(queues::MAIL)).await.unwrap();
    let tasks: Vec<String> = env.email_jobs().await.into_iter().map(|(t, _)| t).collect();
    assert_eq!(tasks, [format!("email:{id}"), format!("email:{id}:g1")]);
}

#[tokio::test]
async fn a_marketing_lead_becomes_one_mail_to_the_tenants_sales_inbox() {
    let env = Env::new().await;
    env.db
        .conn()
        .await
        .batch_execute(
            "INSERT INTO tenant_mail_settings (tenant_id, sales_inbox, from_address) \
             VALUES ('acme', 'sales@acme.example', 'noreply@acme.example')",
        )
        .await
        .unwrap();
    let handler = MarketingLeadHandler::new(
        env.db.pool().clone(),
        Templates::standard(),
        env.redis.conn().await,
        env.namespace.clone(),
    );
    assert_eq!(handler.queue(), queues::MARKETING);
    let lead = json!({
        "name": "Grace Hopper",
        "email": "grace@navy.example",
        "company": "Navy",
        "message": "COBOL, anyone?",
    });
    let (id, job) = job("marketing.lead.created", lead, 0);
    handler.handle(job, &meta(queues::MARKETING)).await.unwrap();

    let jobs = env.email_jobs().await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let (task, mail) = &jobs[0];
    assert_eq!(task, &format!("email:{id}"));
    assert_eq!(mail.to, ["sales@acme.example"]);
    assert_eq!(mail.delivery_id(), id.to_string());
    let text = serde_json::to_string(mail).unwrap();
    assert!(
        text.contains("Grace Hopper") && text.contains("grace@navy.example"),
        "{text}"
    );
}

// Break checked (a mutation run's shard 6 of the subscriber crates): the
// SMTP handler consuming another queue (`queue()` answering "") fails
// here; so would the request or lead handler.
#[tokio::test]
async fn the_handlers_consume_the_queues_the_description_names() {
    let env = Env::new().await;
    let smtp = SmtpSink::start().await;
    let store = RedisIdempotencyStore::new(env.redis.conn().await).with_prefix(env.redis.prefix());
    let requests = MailRequestHandler::new(
        Templates::standard(),
        env.redis.conn().await,
        env.namespace.clone(),
    );
    let leads = MarketingLeadHandler::new(
        env.db.pool().clone(),
        Templates::standard(),
        env.redis.conn().await,
        env.namespace.clone(),
    );
    let sender = SmtpHandler::new(SmtpSettings::new(smtp.url()), store).unwrap();
    let mut consumed = vec![requests.queue(), leads.queue(), sender.queue()];
    consumed.sort_unstable();
    let mut described = outbox_catalog::built_in::MAIL.queues();
    described.extend(outbox_catalog::built_in::MARKETING.queues());
    described.sort_unstable();
    assert_eq!(consumed, described);
    assert_eq!(sender.queue(), queues::TOOLCTRL_EMAIL);
}
