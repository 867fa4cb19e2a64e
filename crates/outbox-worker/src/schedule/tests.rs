//! Schedules: ticks in their zone, what a start does about the past, the
//! refusals, the routes file's tables; and the runner on a real Postgres
//! with a clock the test moves (no waiting for the wall clock).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use outbox_publish::{NewOutboxEvent, PublishError};
use outbox_test_support::{TestDatabase, eventually};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::runner::{Clock, Outcome, publish_tick, run_schedule};
use super::*;

const WAIT: Duration = Duration::from_secs(30);

fn utc(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

fn event() -> NewOutboxEvent {
    NewOutboxEvent::new("acme", "reports.nightly.due", json!({ "kind": "daily" }))
}

fn every_five_minutes(missed: Missed) -> Schedule {
    Schedule::new("five", "0 */5 * * * *", "UTC", event())
        .unwrap()
        .missed(missed)
}

#[test]
fn a_nightly_schedule_ticks_at_three_local_time_across_daylight_saving() {
    let nightly = Schedule::new("nightly", "0 0 3 * * *", "Europe/Berlin", event()).unwrap();
    // Winter: UTC+1; summer: UTC+2.
    assert_eq!(
        nightly.next_after(utc("2026-12-05T10:00:00Z")),
        Some(utc("2026-12-06T02:00:00Z"))
    );
    assert_eq!(
        nightly.next_after(utc("2026-07-01T00:00:00Z")),
        Some(utc("2026-07-01T01:00:00Z"))
    );
    assert_eq!(
        nightly.latest_at_or_before(utc("2026-12-06T02:00:00Z")),
        Some(utc("2026-12-06T02:00:00Z"))
    );
    assert_eq!(
        nightly.latest_at_or_before(utc("2026-12-06T01:59:59.999Z")),
        Some(utc("2026-12-05T02:00:00Z"))
    );
}

/// The ticks after `from`, one `next_after` at a time, up to `to`.
fn ticks_between(schedule: &Schedule, from: &str, to: &str) -> Vec<DateTime<Utc>> {
    let (mut cursor, to) = (utc(from), utc(to));
    let mut ticks = Vec::new();
    while let Some(tick) = schedule.next_after(cursor).filter(|tick| *tick <= to) {
        ticks.push(tick);
        cursor = tick;
    }
    ticks
}

// Europe/Berlin leaves summer time on 2026-10-25 at 01:00 UTC (03:00
// local becomes 02:00 again) and enters it on 2026-03-29 at 01:00 UTC
// (02:00 local becomes 03:00).

#[test]
fn a_local_time_the_clock_repeats_in_autumn_ticks_in_both_passes() {
    let half_past_two = Schedule::new("n", "0 30 2 * * *", "Europe/Berlin", event()).unwrap();
    assert_eq!(
        ticks_between(
            &half_past_two,
            "2026-10-24T12:00:00Z",
            "2026-10-26T12:00:00Z"
        ),
        [
            utc("2026-10-25T00:30:00Z"),
            utc("2026-10-25T01:30:00Z"),
            utc("2026-10-26T01:30:00Z")
        ]
    );
    // A worker starting between the two passes waits for the second one,
    // not for the next day, and is not handed the first one again.
    assert_eq!(
        half_past_two.next_after(utc("2026-10-25T01:00:00Z")),
        Some(utc("2026-10-25T01:30:00Z"))
    );
    assert_eq!(
        half_past_two.latest_at_or_before(utc("2026-10-25T01:29:59Z")),
        Some(utc("2026-10-25T00:30:00Z"))
    );
    assert_eq!(
        half_past_two.latest_at_or_before(utc("2026-10-25T01:30:00Z")),
        Some(utc("2026-10-25T01:30:00Z"))
    );
    assert_eq!(
        half_past_two.latest_at_or_before(utc("2026-10-26T01:29:59Z")),
        Some(utc("2026-10-25T01:30:00Z"))
    );
    // A zone whose clock goes back half an hour (Lord Howe Island, from
    // UTC+11 to UTC+10:30 on 2026-04-05 at 02:00 local).
    let lord_howe = Schedule::new("n", "0 45 1 * * *", "Australia/Lord_Howe", event()).unwrap();
    assert_eq!(
        ticks_between(&lord_howe, "2026-04-04T00:00:00Z", "2026-04-06T00:00:00Z"),
        [
            utc("2026-04-04T14:45:00Z"),
            utc("2026-04-04T15:15:00Z"),
            utc("2026-04-05T15:15:00Z")
        ]
    );
    // Both passes count as missed for a worker that starts after them.
    let plan = half_past_two.plan_start(
        Some(utc("2026-10-24T00:30:00Z")),
        utc("2026-10-26T00:00:00Z"),
    );
    assert_eq!(plan.skipped, 2);
}

#[test]
fn a_schedule_every_fifteen_minutes_keeps_its_pace_through_the_autumn_hour() {
    let quarter = Schedule::new("q", "0 */15 * * * *", "Europe/Berlin", event()).unwrap();
    let ticks = ticks_between(&quarter, "2026-10-24T23:50:00Z", "2026-10-25T02:10:00Z");
    let expected: Vec<_> = (0..9)
        .map(|n| utc("2026-10-25T00:00:00Z") + TimeDelta::minutes(15 * n))
        .collect();
    assert_eq!(ticks, expected);
    assert_eq!(
        quarter.latest_at_or_before(utc("2026-10-25T01:10:00Z")),
        Some(utc("2026-10-25T01:00:00Z"))
    );
}

#[test]
fn a_local_time_of_the_spring_hour_does_not_tick() {
    let half_past_two = Schedule::new("n", "0 30 2 * * *", "Europe/Berlin", event()).unwrap();
    assert_eq!(
        ticks_between(
            &half_past_two,
            "2026-03-27T12:00:00Z",
            "2026-03-30T12:00:00Z"
        ),
        [utc("2026-03-28T01:30:00Z"), utc("2026-03-30T00:30:00Z")]
    );
    assert_eq!(
        half_past_two.latest_at_or_before(utc("2026-03-29T12:00:00Z")),
        Some(utc("2026-03-28T01:30:00Z"))
    );
    let quarter = Schedule::new("q", "0 */15 * * * *", "Europe/Berlin", event()).unwrap();
    assert_eq!(
        ticks_between(&quarter, "2026-03-29T00:40:00Z", "2026-03-29T01:20:00Z"),
        [
            utc("2026-03-29T00:45:00Z"),
            utc("2026-03-29T01:00:00Z"),
            utc("2026-03-29T01:15:00Z")
        ]
    );
}

#[test]
fn next_after_is_strictly_later_and_latest_at_or_before_includes_the_instant() {
    let every_second = Schedule::new("s", "* * * * * *", "UTC", event()).unwrap();
    let t = utc("2026-12-05T10:00:05Z");
    assert_eq!(
        every_second.next_after(t),
        Some(utc("2026-12-05T10:00:06Z"))
    );
    assert_eq!(
        every_second.next_after(utc("2026-12-05T10:00:05.500Z")),
        Some(utc("2026-12-05T10:00:06Z"))
    );
    assert_eq!(every_second.latest_at_or_before(t), Some(t));
    assert_eq!(
        every_second.latest_at_or_before(utc("2026-12-05T10:00:05.999999Z")),
        Some(t)
    );
}

#[test]
fn a_tick_s_event_carries_the_dispatch_key_of_name_and_utc_tick() {
    let schedule = every_five_minutes(Missed::Skip);
    let tick = utc("2026-12-05T10:05:00Z");
    let event = schedule.event_at(tick);
    assert_eq!(
        event.dispatch_key.as_deref(),
        Some("schedule:five:2026-12-05T10:05:00Z")
    );
    assert_eq!(event.scheduled_at, Some(tick));
    assert_eq!(event.payload, json!({ "kind": "daily" }));
}

#[test]
fn a_start_settles_the_past_as_missed_says() {
    let now = utc("2026-12-05T10:32:30Z");
    let last = Some(utc("2026-12-05T10:10:00Z"));
    // (policy, last tick, expected plan): ticks missed are 10:15 … 10:30.
    let cases = [
        (Missed::Skip, None, (true, None, 0)),
        (Missed::PublishLast, None, (true, None, 0)),
        (Missed::Skip, last, (false, None, 4)),
        (
            Missed::PublishLast,
            last,
            (false, Some(utc("2026-12-05T10:30:00Z")), 3),
        ),
        (
            Missed::PublishLast,
            Some(utc("2026-12-05T10:30:00Z")),
            (false, None, 0),
        ),
        (
            Missed::Skip,
            Some(utc("2026-12-05T10:30:00Z")),
            (false, None, 0),
        ),
    ];
    for (missed, last, (anchor, publish, skipped)) in cases {
        let plan = every_five_minutes(missed).plan_start(last, now);
        assert_eq!(
            plan,
            StartPlan {
                anchor,
                publish,
                skipped
            },
            "{missed:?} after {last:?}"
        );
    }
}

#[test]
fn bad_schedules_are_refused_naming_the_schedule_and_what_was_wrong() {
    let new = |name: &str, cron: &str, zone: &str, event: NewOutboxEvent| {
        Schedule::new(name, cron, zone, event).unwrap_err()
    };
    let cron = new("nightly", "0 0 3 * *", "UTC", event());
    assert!(
        matches!(&cron, ScheduleError::Cron { name, cron, .. } if name == "nightly" && cron == "0 0 3 * *"),
        "{cron}"
    );
    assert!(
        cron.to_string()
            .starts_with("schedule nightly: cron \"0 0 3 * *\" is invalid: ")
    );
    let cron = new("nightly", "0 0 25 * * *", "UTC", event());
    assert!(matches!(cron, ScheduleError::Cron { .. }), "{cron}");

    let zone = new("nightly", "0 0 3 * * *", "Europe/Berlinn", event());
    assert_eq!(
        zone.to_string(),
        "schedule nightly: unknown time zone \"Europe/Berlinn\" (an IANA name such as Europe/Berlin, or UTC)"
    );

    let past = new("once", "0 0 0 1 1 * 2001", "UTC", event());
    assert!(matches!(past, ScheduleError::NoTicks { .. }), "{past}");

    let unnamed = new("", "* * * * * *", "UTC", event());
    assert_eq!(unnamed.to_string(), "schedule name \"\" is empty");
    let spaced = new("nightly report", "* * * * * *", "UTC", event());
    assert!(matches!(spaced, ScheduleError::Name { .. }), "{spaced}");

    let bad_type = new(
        "nightly",
        "* * * * * *",
        "UTC",
        NewOutboxEvent::new("acme", "Reports", json!({})),
    );
    assert!(
        matches!(&bad_type, ScheduleError::Event { source, .. } if matches!(**source, PublishError::InvalidEventType(_))),
        "{bad_type}"
    );

    // A tick's dispatch key is the schedule's to set and keep: a dedupe
    // window or replace mode on the event is refused as such, not as a
    // key the caller forgot.
    for event in [
        event().dedupe(outbox_publish::Dedupe::WhilePending),
        event().replace_pending(),
    ] {
        let keyed = new("nightly", "* * * * * *", "UTC", event);
        assert!(
            matches!(&keyed, ScheduleError::KeySettings { name } if name == "nightly"),
            "{keyed}"
        );
        assert!(keyed.to_string().ends_with("leave both unset"), "{keyed}");
    }
}

#[test]
fn the_routes_file_declares_schedules_and_its_mistakes_are_named() {
    let schedules = schedules_from_file(
        r#"
[[route]]
prefix = "reports."
queue = "app.reports"

[[schedule]]
name = "nightly-report"
cron = "0 0 3 * * *"
zone = "Europe/Berlin"
tenant = "acme"
event_type = "reports.nightly.due"
payload = { kind = "daily", copies = 2 }
missed = "publish-last"

[[schedule]]
name = "heartbeat"
cron = "*/10 * * * * *"
zone = "UTC"
tenant = "ops"
event_type = "ops.heartbeat.due"
"#,
    )
    .unwrap();
    assert_eq!(schedules.len(), 2);
    let nightly = &schedules[0];
    assert_eq!(
        (
            nightly.name(),
            nightly.cron(),
            nightly.zone(),
            nightly.missed_ticks()
        ),
        (
            "nightly-report",
            "0 0 3 * * *",
            "Europe/Berlin",
            Missed::PublishLast
        )
    );
    assert_eq!(
        nightly.event().payload,
        json!({ "kind": "daily", "copies": 2 })
    );
    assert_eq!(nightly.event().tenant_id, "acme");
    assert_eq!(schedules[1].missed_ticks(), Missed::Skip);
    assert_eq!(schedules[1].event().payload, json!({}));
    assert!(schedules_from_file("").unwrap().is_empty());

    let table = |extra: &str| {
        format!(
            "[[schedule]]\nname = \"n\"\ncron = \"* * * * * *\"\nzone = \"UTC\"\ntenant = \"t\"\nevent_type = \"a.b.c\"\n{extra}"
        )
    };
    let unknown = schedules_from_file(&table("every = 5\n")).unwrap_err();
    assert!(
        matches!(&unknown, ScheduleError::File { index: 1, problem } if problem.contains("every")),
        "{unknown}"
    );
    let missing = schedules_from_file("[[schedule]]\nname = \"n\"\n").unwrap_err();
    assert!(
        matches!(&missing, ScheduleError::File { index: 1, problem } if problem.contains("cron")),
        "{missing}"
    );
    let missed = schedules_from_file(&table("missed = \"catch-up\"\n")).unwrap_err();
    assert_eq!(
        missed.to_string(),
        "schedule n: missed = \"catch-up\" is neither \"skip\" nor \"publish-last\""
    );
    let zone = schedules_from_file(&table("").replace("UTC", "Mars/Olympus")).unwrap_err();
    assert!(matches!(zone, ScheduleError::Zone { .. }), "{zone}");
    let twice = schedules_from_file(&format!("{}\n{}", table(""), table(""))).unwrap_err();
    assert!(
        matches!(&twice, ScheduleError::Duplicate { name } if name == "n"),
        "{twice}"
    );
    assert!(matches!(
        schedules_from_file("not toml ["),
        Err(ScheduleError::Parse(_))
    ));
}

#[test]
fn a_name_used_in_code_and_in_the_file_is_refused() {
    let code = [every_five_minutes(Missed::Skip)];
    let file = [every_five_minutes(Missed::PublishLast)];
    let twice = merge(&code, &file).unwrap_err();
    assert_eq!(twice.to_string(), "two schedules are named five");
    assert_eq!(merge(&code, &[]).unwrap().len(), 1);
}

/// A clock the test sets; sleepers wake when it reaches their time.
struct ManualClock(watch::Sender<DateTime<Utc>>);

impl ManualClock {
    fn at(t: DateTime<Utc>) -> Arc<Self> {
        Arc::new(Self(watch::Sender::new(t)))
    }

    fn set(&self, t: DateTime<Utc>) {
        self.0.send_replace(t);
    }

    /// Waits until `runners` runners sleep until a tick: each has settled
    /// the past at the time it read.
    async fn wait_sleeping(&self, runners: usize) {
        eventually(
            &format!("{runners} runner(s) waiting for a tick"),
            WAIT,
            async || self.0.receiver_count() == runners,
        )
        .await;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.borrow()
    }

    fn sleep_until(&self, at: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let mut now = self.0.subscribe();
        Box::pin(async move {
            let _ = now.wait_for(|now| *now >= at).await;
        })
    }
}

/// A runner of `schedule` on `db` with `clock`, stopped by dropping the
/// returned guard's token.
fn start(
    db: &TestDatabase,
    schedule: &Schedule,
    clock: &Arc<ManualClock>,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let token = CancellationToken::new();
    let clock: Arc<dyn Clock> = clock.clone();
    let task = tokio::spawn(run_schedule(
        db.pool().clone(),
        schedule.clone(),
        clock,
        token.clone(),
    ));
    (token, task)
}

async fn stop((token, task): (CancellationToken, tokio::task::JoinHandle<()>)) {
    token.cancel();
    task.await.unwrap();
}

/// The dispatch keys of the published events, sorted.
async fn keys(db: &TestDatabase) -> Vec<String> {
    let mut conn = db.conn().await;
    let mut keys: Vec<String> = outbox_testkit::published_events(&mut conn)
        .await
        .into_iter()
        .filter_map(|e| e.dispatch_key)
        .collect();
    keys.sort();
    keys
}

async fn last_tick(db: &TestDatabase, name: &str) -> Option<DateTime<Utc>> {
    let mut conn = db.conn().await;
    outbox_store::schedule_row(&mut conn, name)
        .await
        .unwrap()
        .map(|row| row.last_tick)
}

/// Starts a runner at `t0` (the schedule's first start), stops it, and
/// returns the database.
async fn first_start(schedule: &Schedule, t0: DateTime<Utc>) -> TestDatabase {
    outbox_test_support::init_tracing();
    let db = TestDatabase::new().await;
    let clock = ManualClock::at(t0);
    let runner = start(&db, schedule, &clock);
    eventually("the first start's anchor", WAIT, async || {
        last_tick(&db, schedule.name()).await.is_some()
    })
    .await;
    stop(runner).await;
    assert_eq!(last_tick(&db, schedule.name()).await, Some(t0));
    db
}

/// A runner of `schedule` started at `restart` after the schedule's first
/// start at 10:02:30 (and no worker in between).
async fn restarted_at(
    schedule: Schedule,
    restart: &str,
) -> (
    TestDatabase,
    Arc<ManualClock>,
    (CancellationToken, tokio::task::JoinHandle<()>),
) {
    let db = first_start(&schedule, utc("2026-12-05T10:02:30Z")).await;
    let clock = ManualClock::at(utc(restart));
    let runner = start(&db, &schedule, &clock);
    (db, clock, runner)
}

/// A runner started at 10:32:30 after every worker was down since the
/// schedule's first start at 10:02:30 (six ticks missed).
async fn after_an_outage(
    schedule: Schedule,
) -> (
    TestDatabase,
    Arc<ManualClock>,
    (CancellationToken, tokio::task::JoinHandle<()>),
) {
    restarted_at(schedule, "2026-12-05T10:32:30Z").await
}

/// The dispatch keys of schedule `five` at the times `hh_mm` of 2026-12-05.
fn five_at(hh_mm: &[&str]) -> Vec<String> {
    hh_mm
        .iter()
        .map(|t| format!("schedule:five:2026-12-05T{t}:00Z"))
        .collect()
}

#[tokio::test]
async fn a_first_start_publishes_nothing_for_the_past_then_each_tick_once() {
    let (db, clock, runner) = restarted_at(
        every_five_minutes(Missed::PublishLast),
        "2026-12-05T10:02:30Z",
    )
    .await;
    assert!(keys(&db).await.is_empty());
    clock.wait_sleeping(1).await;
    clock.set(utc("2026-12-05T10:05:00Z"));
    eventually("the 10:05 tick", WAIT, async || keys(&db).await.len() == 1).await;
    // Behind by two ticks (a pause of the process): both follow, in order.
    clock.set(utc("2026-12-05T10:15:00Z"));
    eventually("the 10:10 and 10:15 ticks", WAIT, async || {
        keys(&db).await.len() == 3
    })
    .await;
    stop(runner).await;
    assert_eq!(keys(&db).await, five_at(&["10:05", "10:10", "10:15"]));
}

#[tokio::test]
async fn after_every_worker_was_down_skip_publishes_no_missed_tick_but_the_next_one() {
    let (db, clock, runner) = after_an_outage(every_five_minutes(Missed::Skip)).await;
    clock.wait_sleeping(1).await;
    clock.set(utc("2026-12-05T10:35:00Z"));
    eventually("the 10:35 tick", WAIT, async || !keys(&db).await.is_empty()).await;
    stop(runner).await;
    assert_eq!(keys(&db).await, ["schedule:five:2026-12-05T10:35:00Z"]);
}

#[tokio::test]
async fn after_every_worker_was_down_publish_last_publishes_the_latest_missed_tick_once() {
    let schedule = every_five_minutes(Missed::PublishLast);
    // Two workers start after the outage, one after the other.
    let (db, clock, first) = after_an_outage(schedule.clone()).await;
    eventually("the latest missed tick", WAIT, async || {
        !keys(&db).await.is_empty()
    })
    .await;
    let second = start(&db, &schedule, &clock);
    clock.wait_sleeping(2).await;
    stop(second).await;
    stop(first).await;
    assert_eq!(keys(&db).await, ["schedule:five:2026-12-05T10:30:00Z"]);
}

#[tokio::test]
async fn a_tick_is_not_published_again_after_retention_deleted_its_event() {
    outbox_test_support::init_tracing();
    let db = TestDatabase::new().await;
    let schedule = every_five_minutes(Missed::Skip);
    let tick = utc("2026-12-05T10:05:00Z");
    let pool = db.pool().clone();
    assert_eq!(
        publish_tick(&pool, &schedule, tick).await.unwrap(),
        Outcome::Published
    );

    // The event is handed off and purged by retention.
    let mut conn = db.conn().await;
    let claimed = outbox_store::claim(&mut conn, 10, 300_000).await.unwrap();
    let done: Vec<_> = claimed
        .iter()
        .filter_map(|e| outbox_store::Lease::of(e).map(|lease| (lease, "outbox.audit".to_owned())))
        .collect();
    assert_eq!(done.len(), 1);
    outbox_store::mark_done(&mut conn, &done).await.unwrap();
    outbox_store::purge_done_batch(&mut conn, -60.0, 10, None)
        .await
        .unwrap();
    assert!(keys(&db).await.is_empty());

    assert_eq!(
        publish_tick(&pool, &schedule, tick).await.unwrap(),
        Outcome::Taken
    );
    assert!(keys(&db).await.is_empty());
    let next = tick + TimeDelta::minutes(5);
    assert_eq!(
        publish_tick(&pool, &schedule, next).await.unwrap(),
        Outcome::Published
    );
    assert_eq!(keys(&db).await, ["schedule:five:2026-12-05T10:10:00Z"]);
}

/// Transactions of the test's database that rolled back so far.
async fn rollbacks(db: &TestDatabase) -> i64 {
    use diesel_async::RunQueryDsl;
    let mut conn = db.conn().await;
    diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    .get_result(&mut conn)
    .await
    .unwrap()
}

async fn sql(db: &TestDatabase, sql: &str) {
    use diesel_async::SimpleAsyncConnection;
    db.conn().await.batch_execute(sql).await.unwrap();
}

#[tokio::test]
async fn ticks_whose_publication_failed_are_published_in_order_once_postgres_answers_again() {
    let (db, clock, runner) =
        restarted_at(every_five_minutes(Missed::Skip), "2026-12-05T10:02:30Z").await;
    clock.wait_sleeping(1).await;

    // The schedules' table is away: the 10:05 tick's transaction fails.
    let before = rollbacks(&db).await;
    sql(
        &db,
        "ALTER TABLE outbox_schedule RENAME TO outbox_schedule_away",
    )
    .await;
    clock.set(utc("2026-12-05T10:10:00Z"));
    eventually("a failed attempt", WAIT, async || {
        rollbacks(&db).await > before
    })
    .await;
    assert!(keys(&db).await.is_empty());

    sql(
        &db,
        "ALTER TABLE outbox_schedule_away RENAME TO outbox_schedule",
    )
    .await;
    eventually("the 10:05 and 10:10 ticks", WAIT, async || {
        keys(&db).await.len() == 2
    })
    .await;
    stop(runner).await;
    assert_eq!(keys(&db).await, five_at(&["10:05", "10:10"]));
}
