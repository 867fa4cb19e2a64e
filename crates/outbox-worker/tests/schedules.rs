//! Periodic events on real Postgres and Redis: several workers run one
//! schedule and each tick is published once, with no tick missing while a
//! worker runs, also when worker processes are killed and restarted; a bad
//! schedule stops a worker with exit code 2 naming the file and the
//! schedule.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use common::{GENERAL, Stack, free_addr};
use diesel::sql_types::{BigInt, Timestamptz};
use diesel_async::RunQueryDsl;
use outbox_publish::NewOutboxEvent;
use outbox_test_support::eventually;
use outbox_worker::{Group, Schedule, ScheduleError, WorkerBuilder, WorkerConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);
/// A queue no built-in subscriber consumes: the events wait there.
const EVENT_TYPE: &str = "search.index.schedule-tick";

/// The routes file of a schedule `name` ticking every second.
fn routes_file(dir: &std::path::Path, name: &str, zone: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[[schedule]]\nname = \"{name}\"\ncron = \"* * * * * *\"\nzone = \"{zone}\"\n\
             tenant = \"acme\"\nevent_type = \"{EVENT_TYPE}\"\npayload = {{ source = \"file\" }}\n"
        ),
    )
    .unwrap();
    path
}

fn config(stack: &Stack, extra: &[(&str, &str)]) -> WorkerConfig {
    let mut env: HashMap<String, String> = stack.env().into_iter().collect();
    env.insert("WORKER_HTTP_ADDR".into(), free_addr());
    for (k, v) in extra {
        env.insert((*k).into(), (*v).into());
    }
    WorkerConfig::from_lookup(Group::General, &|name| env.get(name).cloned()).unwrap()
}

#[derive(diesel::QueryableByName, Debug)]
struct Tick {
    #[diesel(sql_type = Timestamptz)]
    tick: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    events: i64,
    /// Events of the tick whose dispatch key does not name it.
    #[diesel(sql_type = BigInt)]
    strays: i64,
}

/// Each published tick (its event's `scheduled_at`) with its number of
/// events, in order, after checking that each event's dispatch key names
/// its tick (every event of the database is a tick's).
async fn ticks(stack: &Stack, name: &str) -> Vec<(DateTime<Utc>, i64)> {
    let mut conn = stack.db.conn().await;
    let ticks: Vec<Tick> = diesel::sql_query(
        "SELECT scheduled_at AS tick, count(*) AS events, \
                count(*) FILTER (WHERE dispatch_key IS DISTINCT FROM 'schedule:' || $1 || ':' \
                  || to_char(scheduled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')) \
                  AS strays \
         FROM outbox_event GROUP BY 1 ORDER BY 1",
    )
    .bind::<diesel::sql_types::Text, _>(name)
    .load(&mut conn)
    .await
    .unwrap();
    assert!(
        ticks.iter().all(|t| t.strays == 0),
        "an event whose dispatch key does not name its tick: {ticks:?}"
    );
    ticks.into_iter().map(|t| (t.tick, t.events)).collect()
}

/// Asserts one event per tick and every second from the first tick to the
/// last; returns the number of ticks.
fn assert_each_tick_once_and_none_missing(ticks: &[(DateTime<Utc>, i64)]) -> usize {
    assert!(
        ticks.iter().all(|(_, events)| *events == 1),
        "a tick with several events: {ticks:?}"
    );
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1].0 - pair[0].0,
            TimeDelta::seconds(1),
            "a tick missing between {} and {}",
            pair[0].0,
            pair[1].0
        );
    }
    ticks.len()
}

async fn wait_ticks(stack: &Stack, name: &str, at_least: usize) {
    eventually(&format!("{at_least} ticks of {name}"), WAIT, async || {
        ticks(stack, name).await.len() >= at_least
    })
    .await;
}

/// The sum of `outbox_schedule_ticks_total` of `schedule` and `outcome` in
/// this process's recorder, read from the worker's `/metrics` route.
async fn ticks_counted(schedule: &str, outcome: &str) -> u64 {
    let routes = WorkerBuilder::bare().http_routes().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, routes).await });
    let body = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    server.abort();
    body.lines()
        .filter(|line| {
            line.starts_with("outbox_schedule_ticks_total{")
                && line.contains(&format!("schedule=\"{schedule}\""))
                && line.contains(&format!("outcome=\"{outcome}\""))
        })
        .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_running_one_schedule_publish_each_tick_exactly_once_and_miss_none() {
    let stack = Stack::new().await;
    let name = "in-process-every-second";
    let schedule = Schedule::new(
        name,
        "* * * * * *",
        "Europe/Berlin",
        NewOutboxEvent::new("acme", EVENT_TYPE, json!({ "source": "code" })),
    )
    .unwrap();
    let stop = CancellationToken::new();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(
                WorkerBuilder::bare()
                    .schedule(schedule.clone())
                    .run_until(config(&stack, &[]), stop.clone().cancelled_owned()),
            )
        })
        .collect();

    wait_ticks(&stack, name, 6).await;
    stop.cancel();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }

    let ticks = ticks(&stack, name).await;
    let seen = assert_each_tick_once_and_none_missing(&ticks);
    // Exactly one worker's transaction advanced the schedule per tick.
    assert_eq!(ticks_counted(name, "published").await, seen as u64);
    let mut conn = stack.db.conn().await;
    let row = outbox_store::schedule_row(&mut conn, name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.last_tick, ticks.last().unwrap().0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_killed_and_restarted_publish_each_tick_once_and_miss_none() {
    let name = "processes-every-second";
    let (stack, file) = with_routes_file(name, "UTC").await;
    let file = file.to_str().unwrap();
    let env = [("OUTBOX_ROUTES_FILE", file)];
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(stack.start(GENERAL, &env).await);
    }
    wait_ticks(&stack, name, 3).await;

    // Each worker in turn is killed (SIGKILL, mid-tick or not) and
    // restarted while the other two run on.
    for worker in &mut workers {
        worker.signal("KILL");
        worker.wait_exit(WAIT).await;
        let before = ticks(&stack, name).await.len();
        wait_ticks(&stack, name, before + 2).await;
        *worker = stack.start(GENERAL, &env).await;
        let before = ticks(&stack, name).await.len();
        wait_ticks(&stack, name, before + 1).await;
    }
    for worker in &workers {
        worker.signal("TERM");
    }
    for worker in &mut workers {
        assert!(worker.wait_exit(WAIT).await.success());
    }

    let ticks = ticks(&stack, name).await;
    let seen = assert_each_tick_once_and_none_missing(&ticks);
    assert!(seen >= 12, "{ticks:?}");
    let logs: String = workers.iter().map(common::Worker::output).collect();
    assert!(
        logs.lines()
            .any(|line| line.contains("schedule tick published") && line.contains(name)),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_schedule_in_the_routes_file_stops_the_worker_with_exit_code_2_naming_it() {
    let (stack, file) = with_routes_file("nightly", "Europe/Berlinn").await;
    let mut worker = stack.spawn(GENERAL, &[("OUTBOX_ROUTES_FILE", file.to_str().unwrap())]);
    let status = worker.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(2), "{}", worker.output());
    let output = worker.output();
    assert!(
        output.contains("OUTBOX_ROUTES_FILE")
            && output.contains("schedule nightly: unknown time zone \"Europe/Berlinn\""),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_named_in_code_and_in_the_routes_file_stops_the_run() {
    let (stack, file) = with_routes_file("twice", "UTC").await;
    let config = config(&stack, &[("OUTBOX_ROUTES_FILE", file.to_str().unwrap())]);
    assert_eq!(config.schedules.len(), 1);
    let schedule = Schedule::new(
        "twice",
        "0 0 3 * * *",
        "UTC",
        NewOutboxEvent::new("acme", EVENT_TYPE, json!({})),
    )
    .unwrap();
    let error = WorkerBuilder::bare()
        .schedule(schedule)
        .run_until(config, std::future::pending())
        .await
        .unwrap_err();
    assert!(
        matches!(error.downcast_ref::<ScheduleError>(), Some(ScheduleError::Duplicate { name }) if name == "twice"),
        "{error:#}"
    );
}

/// A stack, and a routes file of its own (in a directory named after the
/// test's database) with the schedule `name` ticking every second in `zone`.
async fn with_routes_file(name: &str, zone: &str) -> (Stack, std::path::PathBuf) {
    let stack = Stack::new().await;
    let dir = std::env::temp_dir().join(format!("outbox-schedules-{}", stack.db.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = routes_file(&dir, name, zone);
    (stack, file)
}
