//! The dispatchers of one database share `OUTBOX_DISPATCH_LOOPS_TOTAL`:
//! each counts the dispatchers listening on the database and runs its share
//! of the loops; the rest claim nothing. Every push here waits on a paused
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

    /// Waits until both dispatchers run `loops` loops.
    async fn wait_for_share(&self, h: &Harness, loops: usize) {
        h.wait_for(
            &format!("each dispatcher to run {loops} loops"),
            Duration::from_secs(30),
            async || self.loops_running() == [loops, loops],
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
// fails with "no longer true: no more than two claims in flight".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_sharing_two_loops_hold_no_more_than_two_claims_under_a_backlog() {
    let h = Harness::with_pool_size(8).await;
    let pair = Pair::start(&h, 2).await;
    pair.wait_for_share(&h, 1).await;
    publish_backlog(&h).await;
    h.wait_for(
        "two claims in flight",
        Duration::from_secs(30),
        async || claims_in_flight(&h).await >= 2,
    )
    .await;
    outbox_test_support::consistently(
        "no more than two claims in flight",
        Duration::from_secs(2),
        async || claims_in_flight(&h).await <= 2,
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
async fn a_dispatcher_left_alone_takes_back_the_loops_the_stopped_one_ran() {
    let h = Harness::with_pool_size(8).await;
    let mut pair = Pair::start(&h, 4).await;
    pair.wait_for_share(&h, 2).await;
    let (_, shutdown, run) = pair.dispatchers.pop().unwrap();
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
