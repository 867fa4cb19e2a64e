//! Both worker binaries on a Redis Cluster (three primaries with a replica
//! each, started by the test from the system's `redis-server`), with the
//! cluster form of `REDIS_URL`: audit rows, mails and webhooks of committed
//! events arrive, each once, through queues that live on different
//! primaries; and when the primary holding the audit queue is killed
//! under flow and its replica takes over, every committed event's
//! effect is there afterwards (the guard notices the failover and pushes
//! again what the replica had not received).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack};
use outbox_publish::NewOutboxEvent;
use outbox_queue::{QueueNamespace, RedisSettings, apalis_config, queues};
use outbox_test_support::RedisCluster;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const EVENTS: usize = 20;

async fn publish_audit(stack: &Stack, actor: &str) {
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({ "actor": actor }),
        ))
        .await;
}

async fn publish_mail(stack: &Stack, to: &str) {
    stack
        .publish(NewOutboxEvent::new(
            "acme",
            "mail.user.welcome",
            json!({ "to": to, "template": "welcome", "vars": { "name": "Ada" } }),
        ))
        .await;
}

/// Waits until mails have reached `n` distinct recipients (a repeat, which
/// a redelivery may cause, counts once).
async fn wait_for_recipients(stack: &Stack, n: usize) {
    outbox_test_support::eventually(&format!("mails to {n} recipients"), WAIT, async || {
        let recipients: std::collections::BTreeSet<_> = stack
            .smtp
            .messages()
            .iter()
            .flat_map(|mail| mail.to.clone())
            .collect();
        recipients.len() == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_audit_mail_and_webhook_event_takes_effect_once() {
    let cluster = RedisCluster::start(3, 1).await;
    let url = cluster.url();
    let stack = Stack::new().await;
    let env = [("REDIS_URL", url.as_str())];
    let _general = stack.start(GENERAL, &env).await;
    let _mail = stack.start(MAIL, &env).await;
    stack
        .sql(&format!(
            "INSERT INTO webhook_endpoint (tenant_id, url, secret, event_types) \
             VALUES ('acme', '{}', 'secret', '{{webhook.order.*}}')",
            stack.http.url_for("/hook")
        ))
        .await;

    for n in 0..EVENTS {
        publish_audit(&stack, &format!("actor-{n}")).await;
        publish_mail(&stack, &format!("user{n}@example.com")).await;
        stack
            .publish(NewOutboxEvent::new(
                "acme",
                "webhook.order.paid",
                json!({ "order": n }),
            ))
            .await;
    }

    stack
        .wait_count("SELECT count(DISTINCT actor) FROM audit_log", EVENTS as i64)
        .await;
    stack
        .wait_count("SELECT count(*) FROM audit_log", EVENTS as i64)
        .await;
    let mails = stack.smtp.wait_for_messages(EVENTS, WAIT).await;
    let hooks = stack.http.wait_for_requests("/hook", EVENTS, WAIT).await;
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'DONE'",
            (3 * EVENTS) as i64,
        )
        .await;
    assert_eq!(mails.len(), EVENTS);
    assert_eq!(hooks.len(), EVENTS);
    // Nothing more arrives: each effect happened once.
    outbox_test_support::consistently(
        "one mail and one webhook per event",
        Duration::from_secs(1),
        async || {
            stack.smtp.messages().len() == EVENTS && stack.http.requests_to("/hook").len() == EVENTS
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_one_evicting_primary_stops_start_up_naming_that_primary() {
    let cluster = RedisCluster::start(3, 0).await;
    let url = cluster.url();
    // The last primary in address order: the check must ask every primary,
    // not only the first node of REDIS_URL.
    let port = *cluster.primary_ports().await.iter().max().unwrap();
    let node = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut conn = node.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut conn)
        .await
        .unwrap();
    let stack = Stack::new().await;
    for binary in [GENERAL, MAIL] {
        let mut worker = stack.spawn(binary, &[("REDIS_URL", &url)]);
        let status = worker.wait_exit(WAIT).await;
        assert_eq!(status.code(), Some(2), "{binary}: {status}");
        let output = worker.wait_output("to start anyway").await;
        let named = format!("\"allkeys-lru\" on the cluster primary 127.0.0.1:{port}");
        assert!(output.contains(&named), "{binary}: {named:?} in {output}");
    }
}

/// The port of the primary that holds `queue`'s keys now.
async fn primary_of_queue(cluster: &RedisCluster, namespace: &QueueNamespace, queue: &str) -> u16 {
    let mut conn = outbox_queue::connect(&RedisSettings::new(cluster.url())).unwrap();
    let key = apalis_config(namespace, queue).active_jobs_list();
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let shards: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await
        .unwrap();
    for shard in shards {
        let first: u16 = redis::from_redis_value(shard[0].clone()).unwrap();
        let last: u16 = redis::from_redis_value(shard[1].clone()).unwrap();
        if (first..=last).contains(&slot) {
            let primary: Vec<redis::Value> = redis::from_redis_value(shard[2].clone()).unwrap();
            return redis::from_redis_value(primary[1].clone()).unwrap();
        }
    }
    panic!("no primary serves slot {slot}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_primary_killed_under_flow_leaves_every_committed_events_effect() {
    const AUDITS: usize = 300;
    const MAILS: usize = 60;
    let mut cluster = RedisCluster::start(3, 1).await;
    let url = cluster.url();
    let stack = Stack::new().await;
    let namespace = QueueNamespace::for_redis(stack.namespace.prefix(), &url);
    let victim = primary_of_queue(&cluster, &namespace, queues::AUDIT).await;
    let env = [
        ("REDIS_URL", url.as_str()),
        ("OUTBOX_REDIS_CHECK_INTERVAL_MS", "500"),
    ];
    let general = stack.start(GENERAL, &env).await;
    let _mail = stack.start(MAIL, &env).await;

    let publishing = async {
        for n in 0..AUDITS {
            publish_audit(&stack, &format!("actor-{n}")).await;
            if n % 5 == 0 {
                publish_mail(&stack, &format!("user{}@example.com", n / 5)).await;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let killing = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        cluster.kill(victim);
    };
    tokio::join!(publishing, killing);

    let failover = general.wait_output("Redis lost data").await;
    assert!(
        failover.contains("Redis lost data"),
        "the guard names the failover:\n{failover}"
    );
    stack
        .wait_count("SELECT count(DISTINCT actor) FROM audit_log", AUDITS as i64)
        .await;
    stack
        .wait_count("SELECT count(*) FROM audit_log", AUDITS as i64)
        .await;
    wait_for_recipients(&stack, MAILS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_workers_killed_by_sigkill_in_rounds_lose_no_audit_row_and_double_none() {
    const ROUNDS: usize = 4;
    const PER_ROUND: usize = 40;
    let cluster = RedisCluster::start(3, 1).await;
    let url = cluster.url();
    let stack = Stack::new().await;
    // A killed dispatcher's claimed rows are claimed again when their lease
    // ends: a short one, so that the test does not wait for the default.
    let env = [
        ("REDIS_URL", url.as_str()),
        ("OUTBOX_LOCK_TIMEOUT_MS", "3000"),
    ];
    let mut general = stack.start(GENERAL, &env).await;
    let mut mail = stack.start(MAIL, &env).await;

    for round in 0..ROUNDS {
        for n in 0..PER_ROUND {
            let k = round * PER_ROUND + n;
            publish_audit(&stack, &format!("actor-{k}")).await;
            if n % 4 == 0 {
                publish_mail(&stack, &format!("user{k}@example.com")).await;
            }
        }
        // Mid-flow: kill -9 both workers and start new ones.
        for (worker, binary) in [(&mut general, GENERAL), (&mut mail, MAIL)] {
            worker.signal("KILL");
            let status = worker.wait_exit(WAIT).await;
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(9),
                "{binary} died of SIGKILL"
            );
            *worker = stack.start(binary, &env).await;
        }
    }

    let events = (ROUNDS * PER_ROUND) as i64;
    stack
        .wait_count("SELECT count(DISTINCT actor) FROM audit_log", events)
        .await;
    stack
        .wait_count(
            "SELECT count(*) FROM outbox_event WHERE event_type = 'audit.user.login' AND status = 'DONE'",
            events,
        )
        .await;
    let mails = ROUNDS * PER_ROUND / 4;
    wait_for_recipients(&stack, mails).await;
    // Audit rows are written exactly once, kills or not.
    stack
        .wait_count("SELECT count(*) FROM audit_log", events)
        .await;
}
