//! The dispatchers of one database share `OUTBOX_DISPATCH_LOOPS_TOTAL`,
//! packed into the first of them: each counts the dispatchers listening on
//! the database before it and runs what they left of the total; the rest
//! of its loops claim nothing, and one left with none stands by (one claim
//! per poll interval). Every push here waits on a paused
//! Redis (up to the connection's 5 s response timeout), so a loop that
//! claimed holds its rows meanwhile, and the rows of one claim share their
//! `locked_until`: the distinct values among the rows in flight are the
//! claims in flight.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{Harness, PausableRedis, quick_config};
use outbox_dispatch::{DispatchError, Dispatcher, DispatcherConfig};
use outbox_model::OutboxStatus;
use outbox_publish::NewOutboxEvent;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A dispatcher running, with what stops it.
type Running = (
    Arc<Dispatcher>,
    CancellationToken,
    JoinHandle<Result<(), DispatchError>>,
);

/// Two dispatchers of four loops (batches of 10, wake-ups on) sharing
/// `loops_total`, on a Redis of their own whose writes are paused.
struct Pair {
    redis: PausableRedis,
    dispatchers: Vec<Running>,
}

impl Pair {
    async fn start(h: &Harness, loops_total: usize) -> Self {
        let mut redis = PausableRedis::start().await;
        redis.pause_writes().await;
        let config = DispatcherConfig {
            batch_size: 10,
            loops: 4,
            loops_total,
            listen: true,
            backoff: vec![Duration::from_millis(100)],
            ..quick_config()
        };
        let dispatchers = (0..2)
            .map(|_| {
                let dispatcher = h.dispatcher_on(&redis.process.url(), config.clone());
                let shutdown = CancellationToken::new();
                let run = dispatcher.clone().spawn(shutdown.clone());
                (dispatcher, shutdown, run)
            })
            .collect();
        Self { redis, dispatchers }
    }

    fn loops_running(&self) -> Vec<usize> {
        self.dispatchers
            .iter()
            .map(|(dispatcher, _, _)| dispatcher.loops_running())
            .collect()
    }

    /// Waits until the dispatchers' shares, largest first, are `wanted`.
    async fn wait_for_shares(&self, h: &Harness, wanted: &[usize]) {
        h.wait_for(
            &format!("the dispatchers to run {wanted:?} loops"),
            Duration::from_secs(30),
            async || {
                let mut shares = self.loops_running();
                shares.sort_unstable_by(|a, b| b.cmp(a));
                shares == wanted
            },
        )
        .await;
    }

    /// Lets the pushes through, waits until every row is handed off and
    /// stops both dispatchers.
    async fn finish(mut self, h: &Harness) {
        self.redis.unpause().await;
        h.wait_all_done("every row to be handed off", Duration::from_secs(60))
            .await;
        for (_, shutdown, run) in self.dispatchers {
            shutdown.cancel();
            run.await.unwrap().unwrap();
        }
    }
}

/// The claims holding rows now.
async fn claims_in_flight(h: &Harness) -> usize {
    let held: BTreeSet<_> = h
        .rows()
        .await
        .iter()
        .filter(|row| row.status == OutboxStatus::Processing)
        .filter_map(|row| row.locked_until)
        .collect();
    held.len()
}

async fn publish_backlog(h: &Harness) {
    h.publish(
        (0..200)
            .map(|n| NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": n })))
            .collect(),
    )
    .await;
}

// Break checked: with `run_loop` ignoring its share (no parking) this
// fails with "no longer true: no more than three claims in flight".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_sharing_two_loops_run_both_in_one_and_hold_at_most_three_claims() {
    let h = Harness::with_pool_size(8).await;
    let pair = Pair::start(&h, 2).await;
    pair.wait_for_shares(&h, &[2, 0]).await;
    publish_backlog(&h).await;
    h.wait_for(
        "three claims in flight",
        Duration::from_secs(30),
        async || claims_in_flight(&h).await >= 3,
    )
    .await;
    outbox_test_support::consistently(
        "no more than three claims in flight",
        Duration::from_secs(2),
        async || claims_in_flight(&h).await <= 3,
    )
    .await;
    pair.finish(&h).await;
}

// The same measure sees all eight loops claim when nothing is shared, so
// the test above would see them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_total_two_dispatchers_of_four_loops_hold_eight_claims_under_a_backlog() {
    let h = Harness::with_pool_size(8).await;
    let pair = Pair::start(&h, 0).await;
    publish_backlog(&h).await;
    h.wait_for(
        "eight claims in flight",
        Duration::from_secs(30),
        async || claims_in_flight(&h).await == 8,
    )
    .await;
    assert_eq!(pair.loops_running(), [4, 4]);
    pair.finish(&h).await;
}

// Break checked: a share counted once at start and never again fails with
// "the dispatcher left alone to run all four loops".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_left_alone_takes_the_loops_the_stopped_dispatcher_ran() {
    let h = Harness::with_pool_size(8).await;
    let mut pair = Pair::start(&h, 4).await;
    pair.wait_for_shares(&h, &[4, 0]).await;
    let running = pair
        .dispatchers
        .iter()
        .position(|(dispatcher, _, _)| dispatcher.loops_running() == 4)
        .unwrap();
    let (_, shutdown, run) = pair.dispatchers.remove(running);
    shutdown.cancel();
    run.await.unwrap().unwrap();
    h.wait_for(
        "the dispatcher left alone to run all four loops",
        Duration::from_secs(30),
        async || pair.loops_running() == [4],
    )
    .await;
    publish_backlog(&h).await;
    h.wait_for(
        "four claims in flight",
        Duration::from_secs(30),
        async || claims_in_flight(&h).await == 4,
    )
    .await;
    pair.finish(&h).await;
}

/// Two connections named as dispatcher listeners, opened before any
/// dispatcher of the test so that they rank first: dispatchers whose host
/// died without closing their connections, still counted until Postgres
/// drops them.
async fn silent_listeners(h: &Harness) -> Vec<diesel_async::AsyncPgConnection> {
    let mut silent = Vec::new();
    for _ in 0..2 {
        let mut conn = h.conn().await;
        diesel_async::SimpleAsyncConnection::batch_execute(
            &mut conn,
            &format!(
                "SET application_name = '{}'",
                outbox_dispatch::LISTENER_APPLICATION_NAME
            ),
        )
        .await
        .unwrap();
        silent.push(conn);
    }
    silent
}

/// The backend process ids of the connections named as dispatcher
/// listeners on the test's database.
async fn listener_pids(h: &Harness) -> BTreeSet<i32> {
    #[derive(diesel::QueryableByName)]
    struct Pid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
    }
    let mut conn = h.conn().await;
    let pids: Vec<Pid> = diesel_async::RunQueryDsl::load(
        diesel::sql_query(
            "SELECT pid FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1",
        )
        .bind::<diesel::sql_types::Text, _>(outbox_dispatch::LISTENER_APPLICATION_NAME),
        &mut conn,
    )
    .await
    .unwrap();
    pids.into_iter().map(|p| p.pid).collect()
}

/// The two silent listeners, then [`standby`] behind them. Dispatchers
/// rank by their listener's backend pid; a pid wrap between the silent
/// connections and the standby's listener (Linux's `pid_max` is often
/// 32768) would rank the standby first, so the setup is made again then.
async fn standby_behind_silent_listeners(
    h: &Harness,
    interval: Duration,
) -> (Vec<diesel_async::AsyncPgConnection>, Running) {
    for _ in 0..3 {
        let silent = silent_listeners(h).await;
        let before = listener_pids(h).await;
        let running = standby(h, interval).await;
        let mut after = BTreeSet::new();
        h.wait_for(
            "the standby's listener",
            Duration::from_secs(30),
            async || {
                after = listener_pids(h).await;
                after.len() > before.len()
            },
        )
        .await;
        let own = after.difference(&before).max().copied().unwrap();
        if before.iter().all(|pid| *pid < own) {
            return (silent, running);
        }
        let (_, shutdown, run) = running;
        shutdown.cancel();
        run.await.unwrap().unwrap();
    }
    panic!("the standby's listener never got a backend pid above the silent listeners'");
}

/// A dispatcher of four loops (batches of 10, wake-ups on, polling every
/// `interval`) behind the two silent listeners, which take the whole total
/// of eight: it stands by.
async fn standby(h: &Harness, interval: Duration) -> Running {
    let config = DispatcherConfig {
        batch_size: 10,
        loops: 4,
        loops_total: 8,
        listen: true,
        interval,
        ..quick_config()
    };
    started(
        h,
        config,
        0,
        "the dispatcher to stand by behind the two silent ones",
    )
    .await
}

/// A dispatcher with `config`, once it runs `loops` loops (`what` names
/// that wait).
async fn started(h: &Harness, config: DispatcherConfig, loops: usize, what: &str) -> Running {
    let dispatcher = h.dispatcher(config);
    let shutdown = CancellationToken::new();
    let run = dispatcher.clone().spawn(shutdown.clone());
    h.wait_for(what, Duration::from_secs(30), async || {
        dispatcher.loops_running() == loops
    })
    .await;
    (dispatcher, shutdown, run)
}

/// A dispatcher of four loops sharing a total of eight, alone on `h`'s
/// database, once it runs its four.
async fn four_of_eight(h: &Harness) -> Running {
    let config = DispatcherConfig {
        loops: 4,
        loops_total: 8,
        listen: true,
        ..quick_config()
    };
    started(h, config, 4, "the dispatcher to run its four loops").await
}

async fn done(h: &Harness) -> usize {
    h.rows()
        .await
        .iter()
        .filter(|row| row.status == OutboxStatus::Done)
        .count()
}

// Break checked: with a standby's first loop parked like the others it
// fails with "timed out ... every row to be handed off".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_hands_off_a_backlog_while_the_dispatchers_before_it_claim_nothing() {
    let h = Harness::with_pool_size(8).await;
    let (silent, (dispatcher, shutdown, run)) =
        standby_behind_silent_listeners(&h, Duration::from_millis(100)).await;
    publish_backlog(&h).await;
    h.wait_all_done("every row to be handed off", Duration::from_secs(60))
        .await;
    assert_eq!(dispatcher.loops_running(), 0, "still standing by");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    drop(silent);
}

// Break checked: with the standby ticking again at once after a full claim
// it fails with "no longer true: only the first batch handed off".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_claims_one_batch_per_poll_interval() {
    let h = Harness::with_pool_size(8).await;
    let (silent, (_, shutdown, run)) =
        standby_behind_silent_listeners(&h, Duration::from_secs(5)).await;
    // No wake-up: the next poll, up to 5 s away, claims one batch of 10,
    // and the next one is 5 s after it.
    publish_backlog(&h).await;
    h.wait_for(
        "the first batch handed off",
        Duration::from_secs(30),
        async || done(&h).await >= 10,
    )
    .await;
    outbox_test_support::consistently(
        "only the first batch handed off",
        Duration::from_secs(2),
        async || done(&h).await == 10,
    )
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    drop(silent);
}

/// The share is logged when it changes (from standing by to its loops at
/// the first count), not again at each count that finds it the same.
// Break checked: with the change test inverted (`==` for `!=` in
// `share::run`, a miss of the pinned mutation shard 4) the line is
// written at every count but the first and this fails with "no longer
// true: one line".
#[tokio::test]
async fn a_dispatcher_logs_its_share_of_the_loops_when_it_changes_not_at_each_count() {
    let logs = outbox_test_support::LogCapture::start();
    let h = Harness::with_pool_size(8).await;
    let (_dispatcher, shutdown, run) = four_of_eight(&h).await;
    let lines = || logs.count("dispatch loops shared with the other dispatchers of this database");
    h.wait_for(
        "the line of the first count",
        Duration::from_secs(30),
        async || lines() >= 1,
    )
    .await;
    // A count every second: three more find the same share.
    outbox_test_support::consistently("one line", Duration::from_secs(3), async || lines() == 1)
        .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

// Break checked: with the warning written at every failed count it fails
// with "no longer true: one warning"; with none written, with "timed out
// ... the first warning".
#[tokio::test]
async fn a_dispatcher_that_cannot_count_the_dispatchers_warns_once_and_keeps_its_loops() {
    let logs = outbox_test_support::LogCapture::start();
    let h = Harness::with_pool_size(8).await;
    let (dispatcher, shutdown, run) = four_of_eight(&h).await;
    // Every new connection to the database now finds a table named
    // `pg_stat_activity` without the count's columns before the catalog's
    // view, so every count fails at once; the connections open so far
    // are closed, so that the pool opens new ones. The setting is
    // committed before they are closed: a connection the pool opened
    // again while it was not would count without failing.
    let mut conn = h.conn().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "CREATE SCHEMA count_trap; \
         CREATE TABLE count_trap.pg_stat_activity (nothing int); \
         DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET search_path = count_trap, pg_catalog, public', \
             current_database()); END $$;",
    )
    .await
    .unwrap();
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "SELECT pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid();",
    )
    .await
    .unwrap();
    let warnings = || logs.count("cannot count the dispatchers of this database");
    h.wait_for("the first warning", Duration::from_secs(30), async || {
        warnings() >= 1
    })
    .await;
    // A count every second; three more failures say nothing, and the
    // loops stay as they were.
    outbox_test_support::consistently("one warning", Duration::from_secs(3), async || {
        warnings() == 1 && dispatcher.loops_running() == 4
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

// Loops are shared among the dispatchers that listen: one with wake-ups
// off (`OUTBOX_WAKEUPS=false`) is not counted by the others, and counts
// none of them either. Behind two listeners that take the whole total, it
// still runs its own four loops.
// Break checked: the share task also started without a listener (`&&` as
// `||` in `Dispatcher::run`, a miss of shard 6 on fbea9ef) ranks it after
// the two and parks its loops: "no longer true: it runs its own four loops".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_without_wake_ups_runs_its_own_loops_whatever_the_listeners_share() {
    let h = Harness::with_pool_size(8).await;
    let silent = silent_listeners(&h).await;
    let config = DispatcherConfig {
        loops: 4,
        loops_total: 8,
        listen: false,
        ..quick_config()
    };
    let (dispatcher, shutdown, run) =
        started(&h, config, 4, "the dispatcher to run its four loops").await;
    // Past its first count and a recount, had it counted.
    outbox_test_support::consistently(
        "it runs its own four loops",
        outbox_dispatch::SHARE_RECOUNT * 2,
        async || dispatcher.loops_running() == 4,
    )
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    drop(silent);
}
