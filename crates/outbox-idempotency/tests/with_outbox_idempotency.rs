//! `with_outbox_idempotency` on the real Redis: what a subscriber sees
//! across redeliveries, failures, crashes, concurrency and outages.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::Harness;
use outbox_idempotency::{
    Claim, IdempotencyError, IdempotencyOptions, IdempotencyStore, Outcome, RedisIdempotencyStore,
    with_outbox_idempotency,
};
use outbox_test_support::RedisProcess;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use uuid::Uuid;

/// What the test handler returns: e.g. the id the mail server assigned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    message_id: String,
    run: usize,
}

#[derive(Debug, PartialEq)]
struct SmtpDown;

impl std::fmt::Display for SmtpDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SMTP server unavailable")
    }
}

const SHORT_LEASE: Duration = Duration::from_millis(300);
const DEADLINE: Duration = Duration::from_secs(5);
const SLACK: Duration = Duration::from_millis(50);

/// One delivery of `event_id` whose handler counts its runs and returns a
/// receipt numbered by the run.
async fn deliver(
    store: &RedisIdempotencyStore<outbox_queue::RedisConnection>,
    event_id: Uuid,
    options: IdempotencyOptions,
    runs: &AtomicUsize,
) -> Result<Outcome<Receipt>, IdempotencyError<SmtpDown>> {
    with_outbox_idempotency(store, event_id, options, async || {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Receipt {
            message_id: format!("<{event_id}@mail>"),
            run,
        })
    })
    .await
}

/// Redelivers until the handler runs, accepting only `InProgress` meanwhile.
async fn redeliver_until_it_runs(
    store: &RedisIdempotencyStore<outbox_queue::RedisConnection>,
    event_id: Uuid,
    runs: &AtomicUsize,
) -> Receipt {
    let give_up = Instant::now() + DEADLINE;
    loop {
        match deliver(store, event_id, IdempotencyOptions::default(), runs).await {
            Ok(Outcome::Ran(receipt)) => return receipt,
            Err(IdempotencyError::InProgress { event_id: id }) => assert_eq!(id, event_id),
            other => panic!("redelivery returned {other:?}"),
        }
        assert!(
            Instant::now() < give_up,
            "redelivery still suppressed after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn handler_runs_once_across_two_deliveries() {
    let h = Harness::new().await;
    let runs = AtomicUsize::new(0);
    let event_id = Uuid::now_v7();
    let options = IdempotencyOptions::default();

    let first = deliver(&h.store, event_id, options, &runs).await.unwrap();
    let Outcome::Ran(receipt) = first else {
        panic!("first delivery: {first:?}");
    };
    let second = deliver(&h.store, event_id, options, &runs).await.unwrap();
    assert_eq!(second, Outcome::Cached(receipt.clone()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(receipt.run, 1);

    // The idempotency key is the event id: another event runs.
    let other = deliver(&h.store, Uuid::now_v7(), options, &runs)
        .await
        .unwrap();
    assert!(
        matches!(other, Outcome::Ran(Receipt { run: 2, .. })),
        "{other:?}"
    );
}

#[tokio::test]
async fn failing_handler_releases_so_the_retry_runs_it() {
    let h = Harness::new().await;
    let runs = AtomicUsize::new(0);
    let event_id = Uuid::now_v7();
    let options = IdempotencyOptions::default();

    let failed = with_outbox_idempotency(&h.store, event_id, options, async || {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<Receipt, _>(SmtpDown)
    })
    .await;
    match failed {
        Err(IdempotencyError::Handler(e)) => assert_eq!(e, SmtpDown),
        other => panic!("failing handler: {other:?}"),
    }
    assert_eq!(h.redis.keys().await, Vec::<String>::new(), "claim released");

    let retry = deliver(&h.store, event_id, options, &runs).await.unwrap();
    assert!(
        matches!(retry, Outcome::Ran(Receipt { run: 2, .. })),
        "{retry:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let again = deliver(&h.store, event_id, options, &runs).await.unwrap();
    assert!(again.is_cached());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn crashed_handler_does_not_suppress_redelivery_after_its_lease() {
    let h = Harness::new().await;
    let runs = AtomicUsize::new(0);
    let event_id = Uuid::now_v7();

    // A worker claims with a short lease, then dies: no complete, no release.
    let started = Instant::now();
    let claim = h
        .store
        .claim(&event_id.to_string(), SHORT_LEASE)
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Acquired(_)), "{claim:?}");
    drop(claim);

    // While the dead worker's lease runs, the redelivery waits.
    let early = deliver(&h.store, event_id, IdempotencyOptions::default(), &runs).await;
    assert!(
        matches!(early, Err(IdempotencyError::InProgress { .. })),
        "{early:?} after {:?}",
        started.elapsed()
    );

    // Then it runs: the crash costs one lease, not the 24 h TTL.
    let receipt = redeliver_until_it_runs(&h.store, event_id, &runs).await;
    assert!(started.elapsed() + SLACK >= SHORT_LEASE);
    assert!(started.elapsed() < SHORT_LEASE + DEADLINE);
    assert_eq!(receipt.run, 1);
    let after = deliver(&h.store, event_id, IdempotencyOptions::default(), &runs).await;
    assert_eq!(after.unwrap(), Outcome::Cached(receipt));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn panicking_handler_does_not_suppress_redelivery_after_its_lease() {
    let h = Harness::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let event_id = Uuid::now_v7();
    let options = IdempotencyOptions {
        lease: SHORT_LEASE,
        ..IdempotencyOptions::default()
    };

    let store = h.store.clone();
    let started = Instant::now();
    let crashed = tokio::spawn(async move {
        with_outbox_idempotency(
            &store,
            event_id,
            options,
            async || -> Result<Receipt, SmtpDown> { panic!("handler crashed") },
        )
        .await
    })
    .await;
    assert!(crashed.unwrap_err().is_panic());

    let receipt = redeliver_until_it_runs(&h.store, event_id, &runs).await;
    assert!(started.elapsed() + SLACK >= SHORT_LEASE);
    assert_eq!(receipt.run, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_deliveries_run_the_handler_exactly_once() {
    let h = Harness::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let event_id = Uuid::now_v7();
    let deliveries = 10;
    let start = Arc::new(tokio::sync::Barrier::new(deliveries));
    // Deliveries turned away while the handler runs; the handler waits for
    // the first one, so the deliveries overlap whatever the scheduling.
    let turned_away = Arc::new(AtomicUsize::new(0));

    let tasks: Vec<_> = (0..deliveries)
        .map(|_| {
            let store = h.store.clone();
            let (runs, start, turned_away) = (runs.clone(), start.clone(), turned_away.clone());
            tokio::spawn(async move {
                start.wait().await;
                let result = with_outbox_idempotency(
                    &store,
                    event_id,
                    IdempotencyOptions::default(),
                    async || {
                        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        let give_up = Instant::now() + DEADLINE;
                        while turned_away.load(Ordering::SeqCst) == 0 && Instant::now() < give_up {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        Ok::<_, SmtpDown>(Receipt {
                            message_id: "<once@mail>".into(),
                            run,
                        })
                    },
                )
                .await;
                if matches!(result, Err(IdempotencyError::InProgress { .. })) {
                    turned_away.fetch_add(1, Ordering::SeqCst);
                }
                result
            })
        })
        .collect();

    let mut ran = Vec::new();
    let (mut cached, mut in_progress) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(Outcome::Ran(receipt)) => ran.push(receipt),
            Ok(Outcome::Cached(receipt)) => {
                assert_eq!(receipt.run, 1);
                cached += 1;
            }
            Err(IdempotencyError::InProgress { .. }) => in_progress += 1,
            other => panic!("delivery returned {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(ran.len(), 1, "ran {ran:?}");
    assert_eq!(ran.len() + cached + in_progress, deliveries);
    assert!(in_progress > 0, "the deliveries did not overlap");

    // The ones told "in progress" are retried by the job framework: cached.
    let retry = deliver(&h.store, event_id, IdempotencyOptions::default(), &runs).await;
    assert_eq!(retry.unwrap(), Outcome::Cached(ran.remove(0)));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn handler_outliving_its_lease_returns_but_is_not_recorded() {
    let h = Harness::new().await;
    let runs = AtomicUsize::new(0);
    let event_id = Uuid::now_v7();
    let options = IdempotencyOptions {
        lease: Duration::from_millis(100),
        ..IdempotencyOptions::default()
    };

    let slow = with_outbox_idempotency(&h.store, event_id, options, async || {
        runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(400)).await;
        Ok::<_, SmtpDown>(1_u32)
    })
    .await;
    // The side effect happened, so the delivery succeeds (no redelivery)…
    assert_eq!(slow.unwrap(), Outcome::Ran(1));
    // …but the fence kept the late result out: the lease must exceed the
    // handler's run time, as documented.
    assert_eq!(h.redis.keys().await, Vec::<String>::new());
    let next = deliver(&h.store, event_id, IdempotencyOptions::default(), &runs).await;
    assert!(
        matches!(next, Ok(Outcome::Ran(Receipt { run: 2, .. }))),
        "{next:?}"
    );
}

#[tokio::test]
async fn cached_result_of_another_type_is_a_typed_error() {
    let h = Harness::new().await;
    let runs = AtomicUsize::new(0);
    let event_id = Uuid::now_v7();
    let first = deliver(&h.store, event_id, IdempotencyOptions::default(), &runs).await;
    assert!(matches!(first, Ok(Outcome::Ran(_))), "{first:?}");

    let mut ran = false;
    let result = with_outbox_idempotency(
        &h.store,
        event_id,
        IdempotencyOptions::default(),
        async || {
            ran = true;
            Ok::<u64, SmtpDown>(7)
        },
    )
    .await;
    match result {
        Err(IdempotencyError::CachedResult { event_id: id, .. }) => assert_eq!(id, event_id),
        other => panic!("{other:?}"),
    }
    assert!(!ran);
}

#[tokio::test]
async fn store_outage_fails_the_delivery_before_the_handler_runs() {
    let mut redis = RedisProcess::start().await;
    let client = redis::Client::open(redis.url()).unwrap();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_secs(1)));
    let conn = redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .unwrap();
    let store = RedisIdempotencyStore::new(outbox_queue::RedisConnection::from(conn));
    let runs = AtomicUsize::new(0);
    let event_id = Uuid::now_v7();

    redis.stop();
    let down = deliver(&store, event_id, IdempotencyOptions::default(), &runs).await;
    match down {
        Err(IdempotencyError::Store { event_id: id, .. }) => assert_eq!(id, event_id),
        other => panic!("delivery with Redis down returned {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    redis.restart().await;
    let give_up = Instant::now() + DEADLINE;
    let receipt = loop {
        match deliver(&store, event_id, IdempotencyOptions::default(), &runs).await {
            Ok(Outcome::Ran(receipt)) => break receipt,
            Err(IdempotencyError::Store { .. }) if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("delivery after the restart returned {other:?}"),
        }
    };
    assert_eq!(receipt.run, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
