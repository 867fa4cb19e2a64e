//! `RedisIdempotencyStore` passes the store conformance suite on the real
//! Redis.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use outbox_idempotency::conformance;
use outbox_test_support::TestRedis;

#[tokio::test]
async fn redis_store_passes_the_conformance_suite() {
    outbox_test_support::init_tracing();
    let redis = TestRedis::new().await;
    let conn = redis.conn().await;
    let prefix = redis.key("idempotency:");
    conformance::run_all(async || {
        outbox_idempotency::RedisIdempotencyStore::new(conn.clone()).with_prefix(prefix.clone())
    })
    .await;
    let keys = redis.keys().await;
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with(&prefix)), "{keys:?}");
}

/// The checks use their own keys, so they can share one store and run at
/// the same time (as a parallel test run of a real implementation does).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_checks_pass_concurrently_on_one_store() {
    let h = common::Harness::new().await;
    let s = &h.store;
    tokio::join!(
        conformance::first_claim_acquires(s),
        conformance::claim_while_leased_is_in_progress(s),
        conformance::completed_claim_returns_the_exact_result(s),
        conformance::complete_with_a_wrong_token_does_nothing(s),
        conformance::release_lets_the_next_claim_acquire(s),
        conformance::release_with_a_wrong_token_does_nothing(s),
        conformance::expired_lease_can_be_reclaimed_and_fences_the_old_token(s),
        conformance::completed_entries_expire_after_their_ttl(s),
        conformance::keys_are_independent(s),
        conformance::zero_durations_are_refused(s),
    );
}
