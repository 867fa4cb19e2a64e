//! `outbox reconcile` and the Redis part of `outbox health`, through the
//! real binary: a dry run lists exactly the jobs Redis lost and changes
//! nothing (exit 1), the real run pushes them again, a run with nothing
//! missing pushes nothing (exit 0), bad flags exit 2, and `health` shows
//! the persistence and alerts on a lost marker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::Env;
use diesel_async::AsyncConnection;
use outbox_dispatch::{Dispatcher, DispatcherConfig, RedisGuardSettings};
use outbox_publish::{NewOutboxEvent, OutboxTx, PublishError, publish_outbox_events};
use outbox_queue::{RedisSettings, apalis_config, queues, task_id};
use serde_json::{Value, json};
use uuid::Uuid;

const TENANT: &str = "acme";

fn dispatcher(env: &Env) -> Dispatcher {
    let redis = outbox_queue::connect(&RedisSettings::new(env.redis.url())).unwrap();
    Dispatcher::new(
        env.db.pool().clone(),
        env.db.url(),
        redis,
        env.namespace.clone(),
        outbox_catalog::standard_router().unwrap(),
        DispatcherConfig {
            listen: false,
            ..DispatcherConfig::default()
        },
    )
    .unwrap()
    .with_redis_guard(
        RedisGuardSettings::default(),
        outbox_catalog::Catalog::built_in().receivers(),
    )
}

/// Publishes `events` and hands them off; returns their ids in order.
async fn hand_off(env: &Env, events: Vec<NewOutboxEvent>) -> Vec<Uuid> {
    let mut conn = env.db.conn().await;
    let ids: Vec<Uuid> = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            publish_outbox_events(&tx, events).await
        })
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id())
        .collect();
    let report = dispatcher(env).tick().await.unwrap();
    assert_eq!(report.dispatched, ids.len(), "{report:?}");
    ids
}

fn events() -> Vec<NewOutboxEvent> {
    let mut events = Vec::new();
    for n in 0..3 {
        events.push(NewOutboxEvent::new(
            TENANT,
            "mail.user.welcome",
            json!({ "to": format!("u{n}@example.com"), "subject": "Hi", "text": "Hello" }),
        ));
        events.push(NewOutboxEvent::new(
            TENANT,
            "webhook.order.created",
            json!({ "order": n }),
        ));
        events.push(NewOutboxEvent::new(
            TENANT,
            "audit.user.login",
            json!({ "actor": "ada", "n": n }),
        ));
    }
    events
}

/// Forgets jobs the way a Redis that lost them does: body, meta and place
/// in the queue.
async fn lose(env: &Env, queue: &str, task_id: &str) {
    let config = apalis_config(&env.namespace, queue);
    let mut redis = env.redis.conn().await;
    let () = redis::pipe()
        .hdel(config.job_data_hash(), task_id)
        .del(format!("{}:{task_id}", config.job_meta_hash()))
        .zrem(config.scheduled_jobs_set(), task_id)
        .ignore()
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// Every key of the test's namespace with its type and size: what a change
/// to Redis would alter.
async fn redis_fingerprint(env: &Env) -> BTreeSet<(String, String, i64)> {
    let mut redis = env.redis.conn().await;
    let mut fingerprint = BTreeSet::new();
    for key in env.redis.keys().await {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .unwrap();
        let size_command = match kind.as_str() {
            "hash" => "HLEN",
            "zset" => "ZCARD",
            "set" => "SCARD",
            "list" => "LLEN",
            _ => "STRLEN",
        };
        let size: i64 = redis::cmd(size_command)
            .arg(&key)
            .query_async(&mut redis)
            .await
            .unwrap();
        fingerprint.insert((key, kind, size));
    }
    fingerprint
}

fn missing_ids(report: &Value) -> BTreeSet<(String, String)> {
    report["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["queue"].as_str().unwrap().to_owned(),
                m["task_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn counts(report: &Value, queue: &str) -> Value {
    report["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == queue)
        .unwrap_or_else(|| panic!("no {queue} in {report}"))["counts"]
        .clone()
}

#[tokio::test]
async fn a_dry_run_lists_exactly_the_lost_jobs_and_changes_nothing_then_a_run_pushes_them_again() {
    let env = Env::new().await;
    let ids = hand_off(&env, events()).await;
    // ids: mail, webhook, audit, mail, webhook, audit, ...
    let lost = [
        (queues::MAIL, task_id(ids[0])),
        (queues::MAIL, task_id(ids[6])),
        (queues::WEBHOOK, task_id(ids[4])),
    ];
    for (queue, task) in &lost {
        lose(&env, queue, task).await;
    }
    let expected: BTreeSet<(String, String)> = lost
        .iter()
        .map(|(q, t)| ((*q).to_owned(), t.clone()))
        .collect();

    let before = redis_fingerprint(&env).await;
    let dry = env.outbox(&["reconcile", "--since", "1h", "--dry-run", "--json"]);
    assert_eq!(
        dry.code, 1,
        "something is missing:\n{}{}",
        dry.stdout, dry.stderr
    );
    let report = dry.json();
    assert_eq!(missing_ids(&report), expected, "{report}");
    assert_eq!(report["missing_total"], 3);
    assert_eq!(report["repushed_total"], 0);
    assert_eq!(report["dry_run"], true);
    assert_eq!(
        counts(&report, queues::MAIL),
        json!({ "checked": 3, "found": 1, "missing": 2, "repushed": 0 })
    );
    assert_eq!(
        counts(&report, queues::AUDIT),
        json!({ "checked": 3, "found": 3, "missing": 0, "repushed": 0 })
    );
    assert_eq!(
        redis_fingerprint(&env).await,
        before,
        "a dry run changes nothing"
    );

    // The table form names the same jobs.
    let text = env.outbox(&["reconcile", "--since", "1h", "--dry-run"]);
    assert_eq!(text.code, 1);
    for (_, task) in &lost {
        assert!(
            text.stdout.contains(task.as_str()),
            "{task} in\n{}",
            text.stdout
        );
    }
    assert!(
        text.stdout
            .contains("dry run: 3 handed-off job(s) missing; nothing was changed"),
        "{}",
        text.stdout
    );

    let run = env.outbox(&[
        "reconcile",
        "--since",
        "1h",
        "--queue",
        "outbox.mail",
        "--json",
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let report = run.json();
    assert_eq!(report["missing_total"], 2, "only outbox.mail: {report}");
    assert_eq!(report["repushed_total"], 2);
    let run = env.outbox(&["reconcile", "--since", "1h"]);
    assert_eq!(
        run.code, 1,
        "the webhook was still missing:\n{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("1 handed-off job(s) missing, 1 pushed again or run again"),
        "{}",
        run.stdout
    );

    let again = env.outbox(&["reconcile", "--since", "1h", "--json"]);
    assert_eq!(again.code, 0, "nothing missing any more:\n{}", again.stdout);
    assert_eq!(again.json()["missing_total"], 0);
    assert_eq!(again.json()["repushed_total"], 0);
}

#[tokio::test]
async fn nothing_is_pushed_when_nothing_was_lost() {
    let env = Env::new().await;
    hand_off(&env, events()).await;
    let before = redis_fingerprint(&env).await;
    let run = env.outbox(&["reconcile", "--since", "2h"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("0 handed-off job(s) missing, 0 pushed again or run again"),
        "{}",
        run.stdout
    );
    assert_eq!(redis_fingerprint(&env).await, before);
}

#[tokio::test]
async fn bad_flags_exit_2_naming_the_problem() {
    let env = Env::new().await;
    let derived = env.outbox(&["reconcile", "--queue", "toolctrl.email"]);
    assert_eq!(derived.code, 2, "{}", derived.stderr);
    assert!(derived.stderr.contains("outbox.mail"), "{}", derived.stderr);
    let unknown = env.outbox(&["reconcile", "--queue", "outbox.nope"]);
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    let far = env.outbox(&["reconcile", "--since", "30h"]);
    assert_eq!(far.code, 2, "{}", far.stderr);
    assert!(
        far.stderr.contains("QUEUE_DONE_RETENTION_HOURS"),
        "{}",
        far.stderr
    );
    // The reach the refusal suggests is the furthest one allowed, and it is allowed.
    let suggested = far
        .stderr
        .split("use --since ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no suggested --since: {}", far.stderr));
    assert_eq!(suggested, "1430m", "24 h less the 10 minutes of margin");
    let furthest = env.outbox(&["reconcile", "--since", suggested, "--dry-run"]);
    assert_eq!(furthest.code, 0, "{}{}", furthest.stdout, furthest.stderr);
    let allowed = env.outbox(&["reconcile", "--since", "30h", "--retention-hours", "48"]);
    assert_eq!(allowed.code, 0, "{}{}", allowed.stdout, allowed.stderr);
    let unreadable = env.outbox(&["reconcile", "--since", "soon"]);
    assert_eq!(unreadable.code, 2, "{}", unreadable.stderr);
}

#[tokio::test]
async fn health_shows_the_persistence_and_alerts_on_a_lost_marker() {
    let env = Env::new().await;
    let health = env.outbox(&["health", "--json"]);
    let status = &health.json()["redis"];
    assert!(
        outbox_queue::Persistence::MODES.contains(&status["persistence"].as_str().unwrap()),
        "{status}"
    );
    assert!(status["alerts"].as_array().unwrap().is_empty(), "{status}");
    let text = env.outbox(&["health"]);
    assert!(
        text.stdout.contains("redis persistence: "),
        "{}",
        text.stdout
    );

    // A dispatcher's guard writes the marker; then Redis loses it.
    let guarded = dispatcher(&env);
    guarded.redis_guard().unwrap().check().await.unwrap();
    let health = env.outbox(&["health", "--json"]);
    let status = &health.json()["redis"];
    assert!(status["marker_epoch"].is_string(), "{status}");
    // (A new marker leaves a reconciliation due, which alerts on its own.)
    assert!(
        !status["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a.as_str().unwrap().contains("marker")),
        "the marker holds the epoch the dispatchers remember: no marker alert: {status}"
    );
    // Its time is written as every time in the CLI's text: UTC, `…Z`.
    // Break checked: the former `%H:%M:%S UTC` fails here.
    let text = env.outbox(&["health"]);
    let marker = text
        .stdout
        .lines()
        .find(|l| l.starts_with("redis loss marker: epoch"))
        .unwrap_or_else(|| panic!("no marker line in {}", text.stdout));
    assert!(
        marker.contains(", last found intact 20") && marker.ends_with('Z'),
        "{marker}"
    );
    let mut redis = env.redis.conn().await;
    let () = redis::cmd("DEL")
        .arg(outbox_queue::marker_key(&env.namespace))
        .query_async(&mut redis)
        .await
        .unwrap();
    let alerts = |needle: &str| {
        let health = env.outbox(&["health"]);
        assert_eq!(health.code, 1, "{}", health.stdout);
        assert!(health.stdout.contains(needle), "{}", health.stdout);
    };
    alerts("ALERT: the Redis loss marker is gone");

    // A marker of another epoch: a loss some dispatcher noticed and no
    // dispatcher of this database has handled yet.
    let other = Uuid::now_v7();
    let () = redis::cmd("HSET")
        .arg(outbox_queue::marker_key(&env.namespace))
        .arg("epoch")
        .arg(other.to_string())
        .arg("run_id")
        .arg("elsewhere")
        .query_async(&mut redis)
        .await
        .unwrap();
    alerts(&format!(
        "ALERT: the Redis loss marker holds epoch {other}, the dispatchers remember"
    ));
}
