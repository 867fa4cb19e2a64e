//! Both worker binaries as real processes against real Postgres, Redis, an
//! SMTP sink and an HTTP sink: what a user of the system sees.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{GENERAL, MAIL, SHUTDOWN_GRACE, Stack, Worker};
use outbox_model::OutboxStatus;
use outbox_publish::NewOutboxEvent;
use outbox_queue::{OutboxJob, RedisSettings, apalis_config, push_jobs, push_raw, queues};
use outbox_subscriber_mail::{Templates, email_task_id, render_request};
use outbox_subscriber_webhook::verify;
use outbox_test_support::eventually;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
/// How long past its grace period a stopping worker may take to exit.
const EXIT_MARGIN: Duration = Duration::from_secs(2);

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
    // Whatever the redelivery pushed downstream has run by now.
    stack
        .wait_idle(&[queues::MAIL, queues::TOOLCTRL_EMAIL])
        .await;
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

// Break checked: a notification insert without its conflict target, on a
// table without the unique key, writes a second row for the redelivered
// notification job and fails with "timed out ... notification = 2".
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

    // Redelivering the audit job and a notification job writes nothing
    // more, and neither does the job of a replay (generation 1), which
    // runs the handler again under a new task id.
    stack.wait_done(queues::NOTIFICATION, 2).await;
    for (event_type, queue, generation, done) in [
        ("audit.user.login", queues::AUDIT, 0, 2),
        ("notification.user.mentioned", queues::NOTIFICATION, 0, 3),
        ("audit.user.login", queues::AUDIT, 1, 3),
        ("notification.user.mentioned", queues::NOTIFICATION, 1, 4),
    ] {
        let job = {
            use diesel::prelude::*;
            use diesel_async::RunQueryDsl;
            use outbox_model::{OutboxEvent, schema::outbox_event};
            let mut conn = stack.db.conn().await;
            let event: OutboxEvent = outbox_event::table
                .filter(outbox_event::event_type.eq(event_type))
                .select(OutboxEvent::as_select())
                .first(&mut conn)
                .await
                .unwrap();
            OutboxJob {
                generation,
                ..OutboxJob::from_event(&event)
            }
        };
        push_raw(
            &mut redis,
            &stack.namespace,
            queue,
            &[(
                format!("redelivered-{event_type}-g{generation}"),
                serde_json::to_vec(&job).unwrap(),
            )],
        )
        .await
        .unwrap();
        stack.wait_done(queue, done).await;
    }
    stack.wait_count("SELECT count(*) FROM audit_log", 1).await;
    stack
        .wait_count("SELECT count(*) FROM notification", 2)
        .await;
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

/// Waits for a worker sent SIGTERM at `sent` to exit, and asserts that it
/// exited 0 within its grace period (plus [`EXIT_MARGIN`]).
async fn assert_exits_within_grace(worker: &mut Worker, sent: Instant) {
    let limit = SHUTDOWN_GRACE + EXIT_MARGIN;
    let status = worker.wait_exit(limit.saturating_sub(sent.elapsed())).await;
    assert!(status.success(), "{status}");
    assert!(
        sent.elapsed() <= limit,
        "exited {:?} after SIGTERM",
        sent.elapsed()
    );
}

/// Sends SIGTERM, then as [`assert_exits_within_grace`].
async fn stop_within_grace(worker: &mut Worker) {
    let sent = Instant::now();
    worker.signal("TERM");
    assert_exits_within_grace(worker, sent).await;
}

/// The stored webhook endpoint of tenant `acme` on the sink's `path`.
async fn webhook_endpoint(stack: &Stack, path: &str) {
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret) VALUES ('acme', '{}', 's')",
            stack.http.url_for(path)
        ))
        .await;
}

async fn publish_webhook(stack: &Stack) -> uuid::Uuid {
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "webhook.order.created",
            json!({ "n": 1 }),
        ))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_in_flight_webhook_finish_and_records_it_done() {
    let stack = Stack::new().await;
    // Answered a second after it arrives: SIGTERM comes in between.
    stack.http.respond_after("/slow", Duration::from_secs(1));
    webhook_endpoint(&stack, "/slow").await;
    let mut general = stack.start(GENERAL, &[]).await;
    let mut mail = stack.start(MAIL, &[]).await;
    publish_webhook(&stack).await;
    stack.http.wait_for_requests("/slow", 1, WAIT).await;

    stop_within_grace(&mut mail).await;
    let stats = stack.stats(queues::WEBHOOK).await;
    assert_eq!(
        (stats.done, stats.running, stats.backlog, stats.dead),
        (1, 0, 0, 0),
        "the job is recorded done, nothing is left to redeliver: {stats:?}"
    );
    assert_eq!(stack.http.requests_to("/slow").len(), 1);
    mail.wait_output("webhook delivered").await;
    stop_within_grace(&mut general).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_at_the_end_of_the_grace_period_even_with_a_delivery_still_hanging() {
    let stack = Stack::new().await;
    // Answered long after the grace period, and within the client's timeout.
    stack.http.respond_after("/stuck", Duration::from_secs(30));
    webhook_endpoint(&stack, "/stuck").await;
    let _general = stack.start(GENERAL, &[]).await;
    let mut mail = stack.start(MAIL, &[("WEBHOOK_TIMEOUT_MS", "60000")]).await;
    publish_webhook(&stack).await;
    stack.http.wait_for_requests("/stuck", 1, WAIT).await;

    stop_within_grace(&mut mail).await;
    mail.wait_output("grace period over").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_a_webhook_waiting_between_quick_retries_back_to_the_queue() {
    let stack = Stack::new().await;
    stack.http.set_default("/down", 503);
    webhook_endpoint(&stack, "/down").await;
    let _general = stack.start(GENERAL, &[]).await;
    let mut mail = stack.start(MAIL, &[("WORKER_RETRIES", "100")]).await;
    let id = publish_webhook(&stack).await;
    // In-process tries back off 0.2, 0.4, 0.8, 1.6 and 3.2 s; after the
    // sixth the worker waits 6.4 s, and SIGTERM comes in that wait.
    stack.http.wait_for_requests("/down", 6, WAIT).await;

    stop_within_grace(&mut mail).await;
    assert_eq!(
        stack.http.requests_to("/down").len(),
        6,
        "no try after SIGTERM"
    );
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let scheduled: Vec<String> = redis::cmd("ZRANGE")
        .arg(apalis_config(&stack.namespace, queues::WEBHOOK).scheduled_jobs_set())
        .arg(0)
        .arg(-1)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        scheduled,
        [format!("outbox:{id}~retry1")],
        "the job waits on the queue for its next round"
    );
    let stats = stack.stats(queues::WEBHOOK).await;
    assert_eq!((stats.running, stats.dead), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_rows_the_dispatcher_claimed_but_has_not_handed_off() {
    let stack = Stack::new().await;
    // A Redis of its own, whose writes this test holds up.
    let redis = outbox_test_support::RedisProcess::start().await;
    let url = redis.url();
    let mut general = stack
        .start(
            GENERAL,
            &[("REDIS_URL", &url), ("OUTBOX_DISPATCH_CONCURRENCY", "1")],
        )
        .await;
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Writes and scripts wait (at most 4 s, below the workers' 5 s Redis
    // timeout): the dispatcher's first push hangs.
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(4000)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .unwrap();
    // One claim of three rows for three queues, pushed one queue at a time
    // (outbox.audit first).
    stack
        .sql(
            "INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES
               ('acme', 'audit.user.login', '{}'),
               ('acme', 'mail.user.welcome', '{}'),
               ('acme', 'notification.user.mentioned', '{}')",
        )
        .await;
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PROCESSING'",
            3,
        )
        .await;

    let sent = Instant::now();
    general.signal("TERM");
    general.wait_output("stopping: no new work").await;
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_exits_within_grace(&mut general, sent).await;

    // The push in flight finished; the rest of the claim is PENDING again,
    // due and unleased, for the next dispatcher: not FAILED, not held.
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName, Debug, PartialEq)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        event_type: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: String,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        untouched: bool,
    }
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT event_type, status,
                retries = 0 AND last_error IS NULL AND locked_until IS NULL AND scheduled_at <= now()
                  AS untouched
         FROM outbox_event ORDER BY event_type",
    )
    .load(&mut stack.db.conn().await)
    .await
    .unwrap();
    let row = |event_type: &str, status: &str| Row {
        event_type: event_type.to_owned(),
        status: status.to_owned(),
        untouched: true,
    };
    assert_eq!(
        rows,
        [
            row("audit.user.login", "DONE"),
            row("mail.user.welcome", "PENDING"),
            row("notification.user.mentioned", "PENDING"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_without_the_private_address_switch_refuse_webhooks_and_plugin_calls_to_loopback() {
    let stack = Stack::new().await;
    webhook_endpoint(&stack, "/hook").await;
    stack
        .sql(&format!(
            "INSERT INTO plugin_hook_subscription (tenant_id, plugin, hook, endpoint, secret)
             VALUES ('acme', 'slack', 'workflow.executed', '{}', 'k1')",
            stack.http.url_for("/slack")
        ))
        .await;
    // As deployed: WEBHOOK_ALLOW_PRIVATE_ADDRESSES left at its default.
    let unset = ["WEBHOOK_ALLOW_PRIVATE_ADDRESSES"];
    let _general = stack.start_without(GENERAL, &unset, &[]).await;
    let _mail = stack.start_without(MAIL, &unset, &[]).await;
    publish_webhook(&stack).await;
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "plugin.hook.workflow.executed",
            json!({ "workflowId": "w1" }),
        ))
        .await;

    stack.wait_dead(queues::WEBHOOK, 1).await;
    stack.wait_dead(queues::TOOLCTRL_PLUGIN_INVOKE, 1).await;
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    for queue in [queues::WEBHOOK, queues::TOOLCTRL_PLUGIN_INVOKE] {
        let dead = outbox_queue::dead_jobs(&mut redis, &stack.namespace, queue, 10)
            .await
            .unwrap();
        let reason = dead[0].reason.clone().unwrap_or_default();
        assert!(
            reason.contains("127.0.0.1 is an internal address; refused"),
            "{queue}: {reason}"
        );
        assert_eq!(
            dead[0].attempts.as_deref(),
            Some("1"),
            "{queue}: a refusal is not retried"
        );
    }
    assert!(
        stack.http.requests().is_empty(),
        "the sink got {:?}",
        stack.http.requests()
    );
}

/// `GET` of `path` on the worker: status and body.
async fn get(worker: &Worker, path: &str) -> (u16, String) {
    let response = reqwest::get(format!("http://{}{path}", worker.addr))
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_answers_health_and_readiness_and_exports_queue_and_outbox_gauges() {
    let stack = Stack::new().await;
    // Two due rows no dispatcher takes, three jobs waiting on a queue this
    // worker measures but does not consume.
    let insert_row = "INSERT INTO outbox_event (tenant_id, event_type, payload)
                      VALUES ('acme', 'audit.user.login', '{}')";
    stack.sql(insert_row).await;
    stack.sql(insert_row).await;
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let push = async |redis: &mut outbox_queue::RedisConnection, task: &str| {
        push_raw(
            redis,
            &stack.namespace,
            queues::MAIL,
            &[(task.to_owned(), b"{}".to_vec())],
        )
        .await
        .unwrap();
    };
    for task in ["m1", "m2", "m3"] {
        push(&mut redis, task).await;
    }
    let general = stack
        .start(GENERAL, &[("OUTBOX_DISPATCHER_ENABLED", "false")])
        .await;

    assert_eq!(
        get(&general, "/healthz").await,
        (
            200,
            "ok
"
            .to_owned()
        )
    );
    let (status, body) = get(&general, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        json!({ "postgres": "ok", "redis": "ok" })
    );
    stack
        .wait_metric_line(&general, r#"outbox_queue_backlog{queue="outbox.mail"} 3"#)
        .await;
    stack
        .wait_metric_line(&general, "outbox_pending_due 2")
        .await;
    // The gauges follow what changes (every WORKER_GAUGE_INTERVAL_MS).
    stack.sql(insert_row).await;
    push(&mut redis, "m4").await;
    stack
        .wait_metric_line(&general, r#"outbox_queue_backlog{queue="outbox.mail"} 4"#)
        .await;
    stack
        .wait_metric_line(&general, "outbox_pending_due 3")
        .await;
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

#[tokio::test]
async fn an_outbox_table_partitioned_by_hand_stops_the_general_worker_naming_the_convert_command() {
    let stack = Stack::new().await;
    stack
        .sql(
            "ALTER TABLE outbox_event RENAME TO outbox_event_before_by_hand;
             CREATE TABLE outbox_event (LIKE outbox_event_before_by_hand)
                 PARTITION BY RANGE (created_at)",
        )
        .await;
    let output = std::process::Command::new(GENERAL)
        .envs(stack.env())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("outbox_event is partitioned, but not by `outbox partition convert`"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_turns_readyz_red_and_the_worker_recovers_when_redis_is_back() {
    let stack = Stack::new().await;
    let mut redis = outbox_test_support::RedisProcess::start().await;
    let redis_url = redis.url();
    // No hand-off retries: an event the outage stops fails at once, as it
    // would after its last retry.
    let general = stack
        .start(
            GENERAL,
            &[("REDIS_URL", &redis_url), ("OUTBOX_MAX_RETRIES", "0")],
        )
        .await;
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
    // An event published during the outage stays in Postgres, FAILED with
    // the reason.
    let during = stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "actor": "during-outage" }),
        ))
        .await;
    stack
        .wait_count(
            &format!(
                "SELECT count(*) FROM outbox_event WHERE id = '{during}' AND status = 'FAILED'
                   AND last_error LIKE 'hand-off to outbox.audit failed: %'"
            ),
            1,
        )
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
    stack
        .wait_count(
            "SELECT count(*) FROM audit_log WHERE actor = 'after-outage'",
            1,
        )
        .await;
    // The operator requeues what failed (`outbox requeue <id>`), and it is delivered.
    requeue(&stack, during, "Redis is back").await;
    stack
        .wait_count(
            "SELECT count(*) FROM audit_log WHERE actor = 'during-outage'",
            1,
        )
        .await;
}

/// Requeues one row as `outbox requeue <id> --reason <reason>` does: the
/// policy and transaction of the CLI's library (its binary is not built for
/// this crate's tests).
async fn requeue(stack: &Stack, id: uuid::Uuid, reason: &str) {
    use diesel::prelude::*;
    use diesel_async::RunQueryDsl;
    use outbox_cli::requeue::{Candidate, execute, plan};
    use outbox_model::schema::outbox_event;
    let mut conn = stack.db.conn().await;
    let rows: Vec<Candidate> = outbox_event::table
        .find(id)
        .select(Candidate::as_select())
        .load(&mut conn)
        .await
        .unwrap();
    let plan = plan(rows, false);
    assert!(plan.refused.is_empty(), "{:?}", plan.refused);
    let executed = execute(&mut conn, &plan, reason, Some("e2e"), false)
        .await
        .unwrap();
    assert_eq!(executed.requeued, [id]);
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
    stack
        .wait_idle(&[queues::MARKETING, queues::TOOLCTRL_EMAIL])
        .await;
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
