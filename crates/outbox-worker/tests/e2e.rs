//! Both worker binaries as real processes against real Postgres, Redis, an
//! SMTP sink and an HTTP sink: what a user of the system sees.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use outbox_model::OutboxStatus;
use outbox_publish::NewOutboxEvent;
use outbox_queue::{OutboxJob, RedisSettings, push_jobs, push_raw, queues};
use outbox_subscriber_mail::{Templates, email_task_id, render_request};
use outbox_subscriber_webhook::verify;
use outbox_test_support::eventually;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

async fn row_status(stack: &Stack, id: uuid::Uuid) -> OutboxStatus {
    use diesel::prelude::*;
    use diesel_async::RunQueryDsl;
    use outbox_model::schema::outbox_event;
    let mut conn = stack.db.conn().await;
    outbox_event::table
        .find(id)
        .select(outbox_event::status)
        .first(&mut conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_event_is_sent_once_even_when_its_job_is_pushed_again() {
    let stack = Stack::new().await;
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[]).await;

    let id = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "mail.user.welcome",
            json!({ "to": "ada@example.com", "template": "welcome", "vars": { "name": "Ada" } }),
        ))
        .await;

    let mails = stack.smtp.wait_for_messages(1, WAIT).await;
    assert_eq!(mails[0].to, vec!["ada@example.com"]);
    assert_eq!(mails[0].from, "outbox@example.test");
    // <event id>.<generation>@<domain of MAIL_FROM>
    let message_id = format!("<{id}.0@example.test>");
    assert_eq!(
        mails[0].header("message-id").as_deref(),
        Some(message_id.as_str())
    );
    assert_eq!(mails[0].header("subject").as_deref(), Some("Welcome, Ada!"));
    assert!(
        mails[0].data.contains("welcome aboard"),
        "{}",
        mails[0].data
    );
    stack.wait_done(queues::TOOLCTRL_EMAIL, 1).await;
    assert_eq!(row_status(&stack, id).await, OutboxStatus::Done);

    // The same job again: same task id (deduplicated by the queue), and the
    // same envelope under another id (a redelivery the queue cannot see).
    let event = {
        use diesel::prelude::*;
        use diesel_async::RunQueryDsl;
        use outbox_model::{OutboxEvent, schema::outbox_event};
        let mut conn = stack.db.conn().await;
        outbox_event::table
            .find(id)
            .select(OutboxEvent::as_select())
            .first(&mut conn)
            .await
            .unwrap()
    };
    let job = OutboxJob::from_event(&event);
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let again = push_jobs(
        &mut redis,
        &stack.namespace,
        queues::MAIL,
        std::slice::from_ref(&job),
    )
    .await
    .unwrap();
    assert_eq!(again.duplicates, 1);
    push_raw(
        &mut redis,
        &stack.namespace,
        queues::MAIL,
        &[("redelivery-1".into(), serde_json::to_vec(&job).unwrap())],
    )
    .await
    .unwrap();
    stack.wait_done(queues::MAIL, 2).await;
    // The rendered mail's job id is deterministic, so no second send job exists.
    assert_eq!(stack.stats(queues::TOOLCTRL_EMAIL).await.done, 1);
    assert_eq!(stack.smtp.messages().len(), 1, "the mail went out once");

    // The at-least-once window: a worker that sent the mail and died before
    // recording it leaves no idempotency record, and the send job comes back.
    // The mail goes out again, recognisably the same message.
    let sent_record = format!(
        "{}{}",
        outbox_queue::idempotency_prefix(&stack.namespace),
        email_task_id(&id.to_string())
    );
    let removed: u32 = redis::cmd("DEL")
        .arg(&sent_record)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(removed, 1, "the send was recorded under {sent_record}");
    let rendered = render_request(
        &Templates::standard(),
        id,
        "acme",
        &event.payload.value().unwrap(),
    )
    .unwrap();
    push_raw(
        &mut redis,
        &stack.namespace,
        queues::TOOLCTRL_EMAIL,
        &[(
            "email-redelivery-1".into(),
            serde_json::to_vec(&rendered).unwrap(),
        )],
    )
    .await
    .unwrap();
    let mails = stack.smtp.wait_for_messages(2, WAIT).await;
    assert_eq!(
        mails[1].header("message-id").as_deref(),
        Some(message_id.as_str()),
        "a duplicate send carries the same Message-ID"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_reach_each_matching_endpoint_once_signed() {
    let stack = Stack::new().await;
    let url = |path: &str| stack.http.url_for(path);
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret, event_types) VALUES
               ('acme', '{}', 'whsec_c2VjcmV0LWE=', '{{}}'),
               ('acme', '{}', 'secret-b', '{{webhook.order.*}}'),
               ('acme', '{}', 'secret-c', '{{webhook.user.}}'),
               ('globex', '{}', 'secret-d', '{{}}')",
            url("/a"),
            url("/b"),
            url("/c"),
            url("/d"),
        ))
        .await;
    let _general = stack.start(GENERAL, &[]).await;
    // A proxy in the environment must not be used: it would resolve targets
    // itself and sidestep the internal-address guard.
    let proxy = outbox_test_support::HttpSink::start().await;
    let proxy_url = proxy.url();
    let _mail = stack
        .start(
            MAIL,
            &[
                ("HTTP_PROXY", proxy_url.as_str()),
                ("http_proxy", proxy_url.as_str()),
                ("ALL_PROXY", proxy_url.as_str()),
            ],
        )
        .await;

    let id = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "webhook.order.created",
            json!({ "orderId": 7 }),
        ))
        .await;
    stack.wait_done(queues::WEBHOOK, 1).await;

    for (path, secret) in [("/a", "whsec_c2VjcmV0LWE="), ("/b", "secret-b")] {
        let requests = stack.http.requests_to(path);
        assert_eq!(requests.len(), 1, "{path}: {requests:?}");
        let request = &requests[0];
        assert_eq!(request.header("webhook-id"), Some(id.to_string().as_str()));
        let timestamp: i64 = request
            .header("webhook-timestamp")
            .unwrap()
            .parse()
            .unwrap();
        let signature = request.header("webhook-signature").unwrap();
        assert!(
            verify(secret, &id.to_string(), timestamp, &request.body, signature).unwrap(),
            "{path}: bad signature"
        );
        let body = request.json();
        assert_eq!(body["type"], "webhook.order.created");
        assert_eq!(body["data"], json!({ "orderId": 7 }));
        assert_eq!(body["tenant_id"], "acme");
    }
    assert!(
        stack.http.requests_to("/c").is_empty(),
        "filter excludes /c"
    );
    assert!(
        stack.http.requests_to("/d").is_empty(),
        "another tenant's endpoint"
    );
    assert!(
        proxy.requests().is_empty(),
        "the proxy from the environment was used"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_answering_500_then_200_is_retried_and_a_410_is_not() {
    let stack = Stack::new().await;
    stack.http.respond("/flaky", vec![500]);
    stack.http.set_default("/gone", 410);
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret) VALUES ('acme', '{}', 's1'), ('globex', '{}', 's2')",
            stack.http.url_for("/flaky"),
            stack.http.url_for("/gone"),
        ))
        .await;
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[]).await;

    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "webhook.invoice.paid",
            json!({ "n": 1 }),
        ))
        .await;
    stack
        .publish(NewOutboxEvent::new(
            "globex",
            "webhook.invoice.paid",
            json!({ "n": 2 }),
        ))
        .await;

    stack.wait_done(queues::WEBHOOK, 1).await;
    stack.wait_dead(queues::WEBHOOK, 1).await;
    let flaky = stack.http.requests_to("/flaky");
    assert_eq!(flaky.len(), 2, "one failure, one success");
    assert_eq!(
        flaky[0].header("webhook-id"),
        flaky[1].header("webhook-id"),
        "same message, retried"
    );
    assert_eq!(
        stack.http.requests_to("/gone").len(),
        1,
        "410 is not retried"
    );
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let dead = outbox_queue::dead_jobs(&mut redis, &stack.namespace, queues::WEBHOOK, 10)
        .await
        .unwrap();
    assert!(
        dead[0]
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("410"),
        "{dead:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_and_notification_rows_appear_once_and_a_corrupt_job_is_dead_lettered() {
    let stack = Stack::new().await;
    let _general = stack.start(GENERAL, &[]).await;

    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    push_raw(
        &mut redis,
        &stack.namespace,
        queues::AUDIT,
        &[("garbage".into(), b"{not json".to_vec())],
    )
    .await
    .unwrap();
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "actor": "ada" }),
        ))
        .await;
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "billing.subscription.updated",
            json!({ "userId": "u1", "plan": "pro" }),
        ))
        .await;
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "notification.user.mentioned",
            json!({ "title": "You were mentioned" }),
        ))
        .await;

    stack
        .wait_count("SELECT count(*) FROM audit_log WHERE actor = 'ada'", 1)
        .await;
    stack
        .wait_count("SELECT count(*) FROM notification", 2)
        .await;
    stack.wait_dead(queues::AUDIT, 1).await;
    stack.wait_count("SELECT count(*) FROM notification WHERE title = 'Billing: subscription updated' AND user_id = 'u1'", 1).await;
    stack
        .wait_count(
            "SELECT count(*) FROM notification WHERE title = 'You were mentioned'",
            1,
        )
        .await;
    let dead = outbox_queue::dead_jobs(&mut redis, &stack.namespace, queues::AUDIT, 10)
        .await
        .unwrap();
    assert_eq!(dead[0].task_id, "garbage");
    assert!(
        dead[0]
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("corrupt job body"),
        "{dead:?}"
    );

    // Redelivering the audit job writes nothing more.
    let audit_job = {
        use diesel::prelude::*;
        use diesel_async::RunQueryDsl;
        use outbox_model::{OutboxEvent, schema::outbox_event};
        let mut conn = stack.db.conn().await;
        let event: OutboxEvent = outbox_event::table
            .filter(outbox_event::event_type.eq("audit.user.login"))
            .select(OutboxEvent::as_select())
            .first(&mut conn)
            .await
            .unwrap();
        OutboxJob::from_event(&event)
    };
    push_raw(
        &mut redis,
        &stack.namespace,
        queues::AUDIT,
        &[(
            "redelivered".into(),
            serde_json::to_vec(&audit_job).unwrap(),
        )],
    )
    .await
    .unwrap();
    stack.wait_done(queues::AUDIT, 2).await;
    stack.wait_count("SELECT count(*) FROM audit_log", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_hook_reaches_each_subscribed_plugin_once() {
    let stack = Stack::new().await;
    stack
        .sql(&format!(
            "INSERT INTO plugin_hook_subscription (tenant_id, plugin, hook, endpoint, secret) VALUES
               ('acme', 'slack', 'workflow.executed', '{}', 'k1'),
               ('acme', 'jira', 'workflow.executed', '{}', 'k2'),
               ('acme', 'pager', 'workflow.failed', '{}', 'k3')",
            stack.http.url_for("/slack"),
            stack.http.url_for("/jira"),
            stack.http.url_for("/pager"),
        ))
        .await;
    let _general = stack.start(GENERAL, &[]).await;

    let id = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "plugin.hook.workflow.executed",
            json!({ "workflowId": "w1" }),
        ))
        .await;
    stack.wait_done(queues::TOOLCTRL_PLUGIN_INVOKE, 2).await;
    for (path, secret, plugin) in [("/slack", "k1", "slack"), ("/jira", "k2", "jira")] {
        let requests = stack.http.requests_to(path);
        assert_eq!(requests.len(), 1, "{path}");
        let r = &requests[0];
        let timestamp: i64 = r.header("webhook-timestamp").unwrap().parse().unwrap();
        assert!(
            verify(
                secret,
                &id.to_string(),
                timestamp,
                &r.body,
                r.header("webhook-signature").unwrap()
            )
            .unwrap()
        );
        assert_eq!(r.json()["plugin"], plugin);
        assert_eq!(r.json()["hook"], "workflow.executed");
    }
    assert!(stack.http.requests_to("/pager").is_empty());
    stack.wait_done(queues::PLUGIN_HOOK, 1).await; // its acknowledgement may land after the invocations ran
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_killed_mid_delivery_is_rerun_on_redelivery() {
    let stack = Stack::new().await;
    stack.http.respond_after("/slow", Duration::from_secs(30));
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret) VALUES ('acme', '{}', 's')",
            stack.http.url_for("/slow")
        ))
        .await;
    let _general = stack.start(GENERAL, &[]).await;
    let mut mail = stack.start(MAIL, &[("WEBHOOK_TIMEOUT_MS", "60000")]).await;
    let id = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "webhook.order.created",
            json!({ "n": 1 }),
        ))
        .await;

    stack.http.wait_for_requests("/slow", 1, WAIT).await;
    mail.signal("KILL");
    mail.wait_exit(WAIT).await;
    stack.http.respond_after("/slow", Duration::ZERO);
    let _mail = stack.start(MAIL, &[]).await;

    stack.wait_done(queues::WEBHOOK, 1).await;
    let requests = stack.http.requests_to("/slow");
    assert_eq!(
        requests.len(),
        2,
        "the killed delivery ran again after the restart"
    );
    // Standard Webhooks: the redelivery is the same message to the receiver.
    for request in &requests {
        assert_eq!(request.header("webhook-id"), Some(id.to_string().as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_within_the_grace_period() {
    let stack = Stack::new().await;
    let mut general = stack.start(GENERAL, &[]).await;
    let mut mail = stack.start(MAIL, &[]).await;
    general.signal("TERM");
    mail.signal("TERM");
    assert!(general.wait_exit(Duration::from_secs(20)).await.success());
    assert!(mail.wait_exit(Duration::from_secs(20)).await.success());
}

#[tokio::test]
async fn a_bad_batch_size_stops_start_up_with_a_clear_message() {
    let stack = Stack::new().await;
    for value in ["lots", "0"] {
        let output = std::process::Command::new(GENERAL)
            .envs(stack.env())
            .env("OUTBOX_DISPATCH_BATCH_SIZE", value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("OUTBOX_DISPATCH_BATCH_SIZE"), "{stderr}");
        assert!(stderr.contains(value), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_turns_readyz_red_and_the_worker_recovers_when_redis_is_back() {
    let stack = Stack::new().await;
    let mut redis = outbox_test_support::RedisProcess::start().await;
    let redis_url = redis.url();
    let general = stack.start(GENERAL, &[("REDIS_URL", &redis_url)]).await;
    let readyz = async || {
        let response = reqwest::get(format!("http://{}/readyz", general.addr))
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    };
    assert_eq!(readyz().await.0, 200);

    redis.stop();
    let mut body = String::new();
    eventually("readyz to answer 503", WAIT, async || {
        let (status, text) = readyz().await;
        body = text;
        status == 503
    })
    .await;
    assert!(body.contains("\"postgres\":\"ok\""), "{body}");
    assert!(!body.contains("\"redis\":\"ok\""), "{body}");
    // Events published during the outage wait in Postgres.
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "actor": "during-outage" }),
        ))
        .await;

    redis.restart().await;
    eventually("readyz to recover", WAIT, async || readyz().await.0 == 200).await;
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "actor": "after-outage" }),
        ))
        .await;
    // The dispatcher retries the first hand-off after its backoff; make it due now.
    stack
        .sql("UPDATE outbox_event SET scheduled_at = now() WHERE status = 'PENDING'")
        .await;
    stack.wait_count("SELECT count(*) FROM audit_log", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_keys_stops_start_up_unless_explicitly_allowed() {
    let stack = Stack::new().await;
    let redis =
        outbox_test_support::RedisProcess::start_with(&["--maxmemory-policy", "allkeys-lru"]).await;
    let url = redis.url();
    for binary in [GENERAL, MAIL] {
        let mut worker = stack.spawn(binary, &[("REDIS_URL", &url)]);
        let status = worker.wait_exit(WAIT).await;
        assert_eq!(status.code(), Some(2), "{binary}: {status}");
        let output = worker.wait_output("to start anyway").await;
        for why in [
            "maxmemory-policy is \"allkeys-lru\"",
            "silently drop queued jobs and idempotency keys",
            "maxmemory-policy noeviction",
            "OUTBOX_ALLOW_REDIS_EVICTION=true",
        ] {
            assert!(output.contains(why), "{binary}: {why:?} in {output}");
        }
    }

    // The override is validated like every variable.
    let mut malformed = stack.spawn(
        GENERAL,
        &[
            ("REDIS_URL", &url),
            ("OUTBOX_ALLOW_REDIS_EVICTION", "perhaps"),
        ],
    );
    assert_eq!(malformed.wait_exit(WAIT).await.code(), Some(2));
    malformed
        .wait_output("OUTBOX_ALLOW_REDIS_EVICTION=\"perhaps\": must be true or false")
        .await;

    // With it, the worker starts and says what it risks.
    let allowed = stack
        .start(
            GENERAL,
            &[("REDIS_URL", &url), ("OUTBOX_ALLOW_REDIS_EVICTION", "true")],
        )
        .await;
    allowed
        .wait_output("starting anyway because OUTBOX_ALLOW_REDIS_EVICTION=true")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refuses_config_get_is_used_with_a_warning() {
    let stack = Stack::new().await;
    // As on managed services: every command but CONFIG.
    let redis = outbox_test_support::RedisProcess::start_with(&[
        "--user", "default", "on", "nopass", "~*", "&*", "+@all", "-config",
    ])
    .await;
    let general = stack.start(GENERAL, &[("REDIS_URL", &redis.url())]).await;
    let output = general
        .wait_output("maxmemory-policy could not be checked")
        .await;
    assert!(output.contains("no permissions"), "{output}");
    // It works normally on that Redis.
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "actor": "ada" }),
        ))
        .await;
    stack.wait_count("SELECT count(*) FROM audit_log", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starting_while_redis_is_down_skips_the_check_and_serves_when_redis_comes() {
    let stack = Stack::new().await;
    let mut redis = outbox_test_support::RedisProcess::start().await;
    redis.stop();
    let mut general = stack.spawn(GENERAL, &[("REDIS_URL", &redis.url())]);
    general
        .wait_output("maxmemory-policy could not be checked (Redis does not answer at start)")
        .await;
    redis.restart().await;
    general.wait_ready().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marketing_lead_is_mailed_to_the_sales_inbox_and_a_tenant_without_one_is_dead_lettered() {
    let stack = Stack::new().await;
    stack.sql("INSERT INTO tenant_mail_settings (tenant_id, sales_inbox) VALUES ('acme', 'sales@acme.test')").await;
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[]).await;

    let lead = json!({ "name": "Linus", "email": "linus@example.com", "company": "Initech", "message": "Call me" });
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "marketing.lead.created",
            lead.clone(),
        ))
        .await;
    stack
        .publish(NewOutboxEvent::new(
            "globex",
            "marketing.lead.created",
            lead,
        ))
        .await;

    let mails = stack.smtp.wait_for_messages(1, WAIT).await;
    assert_eq!(mails[0].to, vec!["sales@acme.test"]);
    assert_eq!(
        mails[0].header("subject").as_deref(),
        Some("New lead: Linus")
    );
    assert_eq!(
        mails[0].header("reply-to").as_deref(),
        Some("linus@example.com")
    );
    assert!(
        mails[0].body().contains("Company: Initech"),
        "{}",
        mails[0].data
    );
    stack.wait_dead(queues::MARKETING, 1).await;
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let dead = outbox_queue::dead_jobs(&mut redis, &stack.namespace, queues::MARKETING, 10)
        .await
        .unwrap();
    assert!(
        dead[0]
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("no sales inbox"),
        "{dead:?}"
    );
    assert_eq!(stack.smtp.messages().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_server_refusing_the_recipient_dead_letters_the_mail_with_its_reason() {
    let stack = Stack::new().await;
    let refusing = outbox_test_support::SmtpSink::start_failing(550).await;
    let _general = stack.start(GENERAL, &[]).await;
    let _mail = stack.start(MAIL, &[("SMTP_URL", &refusing.url())]).await;

    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "mail.user.welcome",
            json!({ "to": "nobody@example.com", "subject": "Hi", "text": "Hello" }),
        ))
        .await;
    stack.wait_dead(queues::TOOLCTRL_EMAIL, 1).await;
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let dead = outbox_queue::dead_jobs(&mut redis, &stack.namespace, queues::TOOLCTRL_EMAIL, 10)
        .await
        .unwrap();
    let reason = dead[0].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("refused") && reason.contains("550"),
        "{reason}"
    );
    assert_eq!(
        dead[0].attempts.as_deref(),
        Some("1"),
        "a permanent refusal is not retried"
    );
    assert!(refusing.messages().is_empty());
}
