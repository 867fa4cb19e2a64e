//! A Redis without persistence crashes with a backlog in it, against the
//! real binaries.
//!
//! `worker-general` (the dispatcher, with its Redis guard) runs against a
//! private `redis-server` with `appendonly no` and no snapshots. First a
//! batch of mails and webhooks goes all the way through with `worker-mail`
//! up, and the guard's safe point moves past it. Then `worker-mail` stops,
//! a backlog of mails and webhooks is handed off (every row `DONE`, the jobs
//! waiting in Redis), Redis is killed with SIGKILL and started again empty,
//! and `worker-mail` starts. Every mail and webhook of the backlog must
//! arrive, each once; the first batch, delivered before the safe point,
//! must not arrive again although its idempotency records went with Redis.
//! The same with a `FLUSHALL` instead of the crash. The figures are printed
//! on stderr as lines starting with `redis-loss:`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{GENERAL, MAIL, Stack};
use diesel_async::RunQueryDsl;
use outbox_test_support::{RedisProcess, eventually};

const TENANT: &str = "acme";
const HOOK_PATH: &str = "/hook";
const WAIT: Duration = Duration::from_secs(120);

/// `n` mail and `n` webhook events for round `round`, by plain SQL.
fn events(round: &str, n: usize) -> String {
    format!(
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         SELECT '{TENANT}', 'mail.user.notice',
                jsonb_build_object('to', '{round}-' || g || '@example.com',
                                   'subject', 'Notice {round} ' || g, 'text', 'Hello')
         FROM generate_series(1, {n}) AS g;
         INSERT INTO outbox_event (tenant_id, event_type, payload)
         SELECT '{TENANT}', 'webhook.order.created', jsonb_build_object('round', '{round}', 'n', g)
         FROM generate_series(1, {n}) AS g;"
    )
}

/// How often each mail (by Message-ID) and each webhook (by `webhook-id`)
/// arrived.
fn arrivals(stack: &Stack) -> (HashMap<String, usize>, HashMap<String, usize>) {
    let mut mails = HashMap::new();
    for mail in stack.smtp.messages() {
        let id = mail.header("Message-ID").unwrap_or_default();
        *mails.entry(id).or_default() += 1;
    }
    let mut hooks = HashMap::new();
    for request in stack.http.requests_to(HOOK_PATH) {
        let id = request.header("webhook-id").unwrap_or_default().to_owned();
        *hooks.entry(id).or_default() += 1;
    }
    (mails, hooks)
}

async fn at(stack: &Stack, sql: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    stack.timestamp(sql).await
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

async fn count(stack: &Stack, sql: &str) -> i64 {
    let mut conn = stack.db.conn().await;
    diesel::sql_query(sql)
        .get_result::<Count>(&mut conn)
        .await
        .unwrap()
        .n
}

/// A queue's figures on the private Redis.
async fn stats(redis_url: &str, stack: &Stack, queue: &str) -> outbox_queue::QueueStats {
    let mut conn = outbox_queue::connect(&outbox_queue::RedisSettings::new(redis_url)).unwrap();
    outbox_queue::queue_stats(
        &mut conn,
        &stack.namespace,
        queue,
        Duration::from_secs(3600),
    )
    .await
    .unwrap()
}

/// How Redis loses its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// SIGKILL, then a new empty server on the same port.
    Crash,
    /// `FLUSHALL` on the running server.
    Flushall,
}

#[tokio::test]
async fn a_backlog_survives_a_crash_of_a_redis_without_persistence() {
    survives(Loss::Crash, 20, 150).await;
}

#[tokio::test]
async fn a_flushall_is_detected_and_the_backlog_pushed_again() {
    survives(Loss::Flushall, 10, 60).await;
}

/// `before` mails and webhooks go through; then `backlog` of each are
/// handed off with worker-mail down; then Redis loses everything (`loss`);
/// then worker-mail starts. Every one must arrive, once.
async fn survives(loss: Loss, before: usize, backlog: usize) {
    let started = Instant::now();
    let stack = Stack::new().await;
    let mut redis = RedisProcess::start().await;
    let redis_url = redis.url();
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret) VALUES ('{TENANT}', '{}', 'whsec-loss')",
            stack.http.url_for(HOOK_PATH)
        ))
        .await;
    let env = [
        ("REDIS_URL", redis_url.as_str()),
        ("OUTBOX_REDIS_CHECK_INTERVAL_MS", "200"),
    ];
    let general = stack.start(GENERAL, &env).await;
    general
        .wait_output("Redis persistence: no append-only file")
        .await;
    let gauges = stack
        .wait_metric(&general, "outbox_redis_persistence{mode=\"none\"} 1")
        .await;
    assert!(
        gauges.contains("outbox_redis_persistence{mode=\"aof-always\"} 0"),
        "the other modes read 0:\n{gauges}"
    );

    // 1. A first batch goes all the way through.
    let mut mail = stack.start(MAIL, &env).await;
    stack.sql(&events("before", before)).await;
    eventually("the first batch to arrive", WAIT, async || {
        let (mails, hooks) = arrivals(&stack);
        mails.len() == before && hooks.len() == before
    })
    .await;
    let last_hand_off = at(
        &stack,
        "SELECT max(processed_at) AS at FROM outbox_event WHERE status = 'DONE'",
    )
    .await
    .unwrap();
    eventually(
        "the safe points to pass the first batch",
        WAIT,
        async || {
            let passed = count(
                &stack,
                &format!(
                    "SELECT count(*) AS n FROM outbox_redis_safe_point
                 WHERE queue IN ('outbox.mail', 'outbox.webhook')
                   AND drained_before > '{}'",
                    last_hand_off.to_rfc3339()
                ),
            )
            .await;
            passed == 2
        },
    )
    .await;
    mail.signal("TERM");
    assert!(mail.wait_exit(WAIT).await.success());

    // 2. A backlog is handed off while worker-mail is down.
    stack.sql(&events("backlog", backlog)).await;
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'DONE'",
            (2 * (before + backlog)) as i64,
        )
        .await;
    let waiting = stats(&redis_url, &stack, outbox_queue::queues::MAIL).await;
    assert!(waiting.backlog >= backlog as u64, "{waiting:?}");

    // 3. Redis loses everything.
    let crashed = Instant::now();
    match loss {
        Loss::Crash => redis.restart().await,
        Loss::Flushall => {
            let mut conn =
                outbox_queue::connect(&outbox_queue::RedisSettings::new(&redis_url)).unwrap();
            let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        }
    }
    let lost = general.wait_output("Redis lost data").await;
    let detected = crashed.elapsed();
    assert!(
        lost.contains("Redis lost data: the marker is gone"),
        "the log names the cause:\n{lost}"
    );

    // 4. worker-mail comes back; everything of the backlog arrives.
    let mail = stack.start(MAIL, &env).await;
    eventually("every mail and webhook of the backlog", WAIT, async || {
        let (mails, hooks) = arrivals(&stack);
        mails.len() == before + backlog && hooks.len() == before + backlog
    })
    .await;
    let delivered = crashed.elapsed();
    // Nothing more comes: the reconciliation is finished and the queues
    // are drained.
    eventually("the reconciliation to finish", WAIT, async || {
        count(
            &stack,
            "SELECT count(*) AS n FROM outbox_redis_safe_point WHERE pending_since IS NOT NULL",
        )
        .await
            == 0
    })
    .await;
    for queue in [
        outbox_queue::queues::MAIL,
        outbox_queue::queues::WEBHOOK,
        outbox_queue::queues::TOOLCTRL_EMAIL,
    ] {
        eventually(&format!("{queue} to drain"), WAIT, async || {
            let stats = stats(&redis_url, &stack, queue).await;
            stats.backlog == 0 && stats.running == 0
        })
        .await;
    }
    let metrics = stack
        .wait_metric(
            &general,
            "outbox_redis_loss_detected_total{reason=\"marker_missing\"} 1",
        )
        .await;
    let repushed = |queue: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "outbox_reconcile_repushed_total{{queue=\"{queue}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };

    let (mails, hooks) = arrivals(&stack);
    let twice = |counts: &HashMap<String, usize>| counts.values().filter(|&&n| n > 1).count();
    let what = match loss {
        Loss::Crash => "Redis killed (appendonly no) and restarted empty",
        Loss::Flushall => "FLUSHALL",
    };
    eprintln!(
        "redis-loss: {backlog} mails and {backlog} webhooks handed off while worker-mail was down; {what}"
    );
    eprintln!(
        "redis-loss: loss detected {:.1} s after it; re-pushed outbox.mail {}, outbox.webhook {}",
        detected.as_secs_f64(),
        repushed("outbox.mail"),
        repushed("outbox.webhook")
    );
    eprintln!(
        "redis-loss: arrived {} of {} mails and {} of {} webhooks ({} and {} delivered before it); duplicates: {} mails, {} webhooks; all delivered {:.1} s after it, test {:.1} s",
        mails.len(),
        before + backlog,
        hooks.len(),
        before + backlog,
        before,
        before,
        twice(&mails),
        twice(&hooks),
        delivered.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(repushed("outbox.mail"), backlog as u64, "{metrics}");
    assert_eq!(repushed("outbox.webhook"), backlog as u64);
    assert_eq!(
        twice(&mails),
        0,
        "no mail twice: the first batch finished before the safe point"
    );
    assert_eq!(twice(&hooks), 0, "no webhook twice");
    drop(mail);
}
