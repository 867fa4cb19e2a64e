//! The conformance suite every [`IdempotencyStore`] runs (cargo feature
//! `conformance`).
//!
//! Each check is a public function taking a store, so an implementation's
//! tests can call [`run_all`] or single checks. Checks panic with the check's
//! name on the first deviation, like `assert!`. They use fresh random keys,
//! so they may share a store and run in parallel with each other. Expiry is
//! exercised with a [`SHORT`] lease or TTL and awaited by polling against a
//! deadline, never by a fixed long sleep. Needs a Tokio runtime with the
//! timer enabled.
//!
//! ```no_run
//! # async fn example(conn: redis::aio::ConnectionManager) {
//! use outbox_idempotency::{conformance, RedisIdempotencyStore};
//!
//! conformance::run_all(async || {
//!     RedisIdempotencyStore::new(conn.clone()).with_prefix("test:1234:")
//! })
//! .await;
//! # }
//! ```

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::store::{Claim, ClaimToken, IdempotencyStore, StoreError};

/// The lease or TTL the expiry checks use.
pub const SHORT: Duration = Duration::from_millis(300);
/// A lease no check outlives.
pub const LONG: Duration = Duration::from_secs(60);
/// How long past [`SHORT`] an expiry may take before a check fails.
pub const EXPIRY_DEADLINE: Duration = Duration::from_secs(5);
/// How much earlier than [`SHORT`] an expiry may be observed (clock
/// granularity between the test and the store).
pub const EXPIRY_SLACK: Duration = Duration::from_millis(50);
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Runs every check, each on a store from `make`.
///
/// # Panics
///
/// On the first check that fails, naming it.
pub async fn run_all<S: IdempotencyStore>(mut make: impl AsyncFnMut() -> S) {
    first_claim_acquires(&make().await).await;
    claim_while_leased_is_in_progress(&make().await).await;
    completed_claim_returns_the_exact_result(&make().await).await;
    complete_with_a_wrong_token_does_nothing(&make().await).await;
    release_lets_the_next_claim_acquire(&make().await).await;
    release_with_a_wrong_token_does_nothing(&make().await).await;
    expired_lease_can_be_reclaimed_and_fences_the_old_token(&make().await).await;
    completed_entries_expire_after_their_ttl(&make().await).await;
    keys_are_independent(&make().await).await;
    zero_durations_are_refused(&make().await).await;
}

/// A fresh key no other check or run uses.
fn fresh_key() -> String {
    format!("conformance-{}", uuid::Uuid::new_v4())
}

/// `result`, or a panic naming `check` and `what`.
fn ok<T>(check: &str, what: &str, result: Result<T, StoreError>) -> T {
    result.unwrap_or_else(|e| panic!("{check}: {what} failed: {e:?}"))
}

fn assert_same<T: PartialEq + Debug>(check: &str, what: &str, got: T, want: T) {
    assert!(
        got == want,
        "{check}: {what}: got {got:?}, expected {want:?}"
    );
}

async fn acquire<S: IdempotencyStore>(
    check: &str,
    store: &S,
    key: &str,
    lease: Duration,
) -> ClaimToken {
    match ok(check, "claim", store.claim(key, lease).await) {
        Claim::Acquired(token) => token,
        other => panic!("{check}: claim of a free key returned {other:?}, expected Acquired"),
    }
}

async fn claim<S: IdempotencyStore>(check: &str, store: &S, key: &str) -> Claim {
    ok(check, "claim", store.claim(key, LONG).await)
}

/// Polls `probe` until it returns `Some`, failing `check` after `deadline`.
async fn eventually<T, F>(check: &str, what: &str, deadline: Duration, mut probe: F) -> T
where
    F: AsyncFnMut() -> Option<T>,
{
    let give_up = Instant::now() + deadline;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            Instant::now() < give_up,
            "{check}: {what} did not happen within {deadline:?}"
        );
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Claiming a free key acquires it with a token.
pub async fn first_claim_acquires<S: IdempotencyStore>(store: &S) {
    let check = "first_claim_acquires";
    let key = fresh_key();
    acquire(check, store, &key, LONG).await;
}

/// While a lease runs, every other claim sees `InProgress`.
pub async fn claim_while_leased_is_in_progress<S: IdempotencyStore>(store: &S) {
    let check = "claim_while_leased_is_in_progress";
    let key = fresh_key();
    acquire(check, store, &key, LONG).await;
    for attempt in 1..=3 {
        let got = claim(check, store, &key).await;
        assert_same(check, &format!("claim #{attempt}"), got, Claim::InProgress);
    }
}

/// After `complete`, claims return `Completed` with exactly the stored JSON
/// (big integers, floats, unicode, empty containers, `null`, scalars).
pub async fn completed_claim_returns_the_exact_result<S: IdempotencyStore>(store: &S) {
    let check = "completed_claim_returns_the_exact_result";
    let results = [
        json!({
            "messageId": "<a@b>",
            "max": u64::MAX,
            "min": i64::MIN,
            "ratio": 0.1,
            "text": "h\u{e9}llo \u{2709} \u{1f600} \"quoted\" \\ ]] \u{0}",
            "empty_array": [],
            "empty_object": {},
            "nothing": null,
            "nested": [[1, [2, {"deep": true}]]],
        }),
        Value::Null,
        json!("just a string"),
        json!([]),
        json!(42),
    ];
    for result in results {
        let key = fresh_key();
        let token = acquire(check, store, &key, LONG).await;
        let stored = ok(
            check,
            "complete",
            store.complete(&key, &token, &result, LONG).await,
        );
        assert_same(check, "complete by the owner", stored, true);
        for attempt in 1..=2 {
            let got = claim(check, store, &key).await;
            assert_same(
                check,
                &format!("claim #{attempt} after complete"),
                got,
                Claim::Completed(result.clone()),
            );
        }
    }
}

/// `complete` with a token that does not own the claim stores nothing, and
/// neither does a second `complete` by the owner.
pub async fn complete_with_a_wrong_token_does_nothing<S: IdempotencyStore>(store: &S) {
    let check = "complete_with_a_wrong_token_does_nothing";
    let key = fresh_key();
    let token = acquire(check, store, &key, LONG).await;
    let stranger = ClaimToken::generate();
    let stored = ok(
        check,
        "complete by a stranger",
        store
            .complete(&key, &stranger, &json!("stranger"), LONG)
            .await,
    );
    assert_same(check, "complete by a stranger", stored, false);
    let got = claim(check, store, &key).await;
    assert_same(
        check,
        "claim after a stranger's complete",
        got,
        Claim::InProgress,
    );

    let stored = ok(
        check,
        "complete by the owner",
        store.complete(&key, &token, &json!("owner"), LONG).await,
    );
    assert_same(check, "complete by the owner", stored, true);
    let again = ok(
        check,
        "second complete",
        store.complete(&key, &token, &json!("again"), LONG).await,
    );
    assert_same(check, "second complete by the owner", again, false);
    let stranger_late = ok(
        check,
        "late complete by a stranger",
        store.complete(&key, &stranger, &json!("late"), LONG).await,
    );
    assert_same(check, "late complete by a stranger", stranger_late, false);
    let got = claim(check, store, &key).await;
    assert_same(check, "claim", got, Claim::Completed(json!("owner")));
}

/// After `release` by the owner the next claim acquires (with a new token),
/// and the old token is spent. A completed key is never released.
pub async fn release_lets_the_next_claim_acquire<S: IdempotencyStore>(store: &S) {
    let check = "release_lets_the_next_claim_acquire";
    let key = fresh_key();
    let first = acquire(check, store, &key, LONG).await;
    let released = ok(check, "release", store.release(&key, &first).await);
    assert_same(check, "release by the owner", released, true);
    let second = acquire(check, store, &key, LONG).await;
    assert!(second != first, "{check}: a new claim reused the old token");

    let stale = ok(check, "stale release", store.release(&key, &first).await);
    assert_same(check, "release with the released token", stale, false);
    let stale = ok(
        check,
        "stale complete",
        store.complete(&key, &first, &json!("stale"), LONG).await,
    );
    assert_same(check, "complete with the released token", stale, false);

    let stored = ok(
        check,
        "complete",
        store.complete(&key, &second, &json!({"n": 2}), LONG).await,
    );
    assert_same(check, "complete by the new owner", stored, true);
    let released = ok(check, "release", store.release(&key, &second).await);
    assert_same(check, "release of a completed key", released, false);
    let got = claim(check, store, &key).await;
    assert_same(check, "claim", got, Claim::Completed(json!({"n": 2})));
}

/// `release` with a token that does not own the claim leaves it in place.
pub async fn release_with_a_wrong_token_does_nothing<S: IdempotencyStore>(store: &S) {
    let check = "release_with_a_wrong_token_does_nothing";
    let key = fresh_key();
    acquire(check, store, &key, LONG).await;
    let released = ok(
        check,
        "release",
        store.release(&key, &ClaimToken::generate()).await,
    );
    assert_same(check, "release by a stranger", released, false);
    let got = claim(check, store, &key).await;
    assert_same(check, "claim", got, Claim::InProgress);

    let free = fresh_key();
    let released = ok(
        check,
        "release",
        store.release(&free, &ClaimToken::generate()).await,
    );
    assert_same(check, "release of a free key", released, false);
}

/// A claim whose lease ran out (a crashed handler) can be claimed again, not
/// before the lease ends; the old token can then neither complete nor
/// release, while the new owner can.
pub async fn expired_lease_can_be_reclaimed_and_fences_the_old_token<S: IdempotencyStore>(
    store: &S,
) {
    let check = "expired_lease_can_be_reclaimed_and_fences_the_old_token";
    let key = fresh_key();
    let started = Instant::now();
    let old = acquire(check, store, &key, SHORT).await;
    let got = claim(check, store, &key).await;
    assert!(
        got == Claim::InProgress,
        "{check}: claim {:?} after a {SHORT:?} lease returned {got:?}, expected InProgress",
        started.elapsed()
    );

    let new = eventually(
        check,
        "re-acquiring",
        SHORT + EXPIRY_DEADLINE,
        async || match ok(check, "claim", store.claim(&key, LONG).await) {
            Claim::Acquired(token) => Some(token),
            Claim::InProgress => None,
            other => panic!("{check}: claim during the lease returned {other:?}"),
        },
    )
    .await;
    let waited = started.elapsed();
    assert!(
        waited + EXPIRY_SLACK >= SHORT,
        "{check}: the {SHORT:?} lease expired after {waited:?}"
    );
    assert!(new != old, "{check}: the new claim reused the old token");

    let stale = ok(
        check,
        "stale complete",
        store.complete(&key, &old, &json!("old"), LONG).await,
    );
    assert_same(check, "complete with the expired token", stale, false);
    let stale = ok(check, "stale release", store.release(&key, &old).await);
    assert_same(check, "release with the expired token", stale, false);
    let got = claim(check, store, &key).await;
    assert_same(check, "claim after stale calls", got, Claim::InProgress);

    let stored = ok(
        check,
        "complete",
        store.complete(&key, &new, &json!("new"), LONG).await,
    );
    assert_same(check, "complete by the new owner", stored, true);
    let got = claim(check, store, &key).await;
    assert_same(check, "claim", got, Claim::Completed(json!("new")));
}

/// A completed entry is kept for its TTL and no longer: then the key is free.
pub async fn completed_entries_expire_after_their_ttl<S: IdempotencyStore>(store: &S) {
    let check = "completed_entries_expire_after_their_ttl";
    let key = fresh_key();
    let token = acquire(check, store, &key, LONG).await;
    let started = Instant::now();
    let stored = ok(
        check,
        "complete",
        store.complete(&key, &token, &json!("done"), SHORT).await,
    );
    assert_same(check, "complete", stored, true);
    let got = claim(check, store, &key).await;
    assert!(
        got == Claim::Completed(json!("done")),
        "{check}: claim {:?} after completing with a {SHORT:?} TTL returned {got:?}",
        started.elapsed()
    );

    eventually(check, "expiry", SHORT + EXPIRY_DEADLINE, async || match ok(
        check,
        "claim",
        store.claim(&key, LONG).await,
    ) {
        Claim::Acquired(_) => Some(()),
        Claim::Completed(_) => None,
        Claim::InProgress => panic!("{check}: a completed key turned InProgress"),
    })
    .await;
    let waited = started.elapsed();
    assert!(
        waited + EXPIRY_SLACK >= SHORT,
        "{check}: the {SHORT:?} TTL expired after {waited:?}"
    );
}

/// Operations on one key never affect another.
pub async fn keys_are_independent<S: IdempotencyStore>(store: &S) {
    let check = "keys_are_independent";
    let (a, b, c) = (fresh_key(), fresh_key(), fresh_key());
    let token_a = acquire(check, store, &a, LONG).await;
    let token_b = acquire(check, store, &b, LONG).await;

    let stored = ok(
        check,
        "complete a",
        store.complete(&a, &token_a, &json!("a"), LONG).await,
    );
    assert_same(check, "complete a", stored, true);
    let crossed = ok(
        check,
        "complete b with a's token",
        store.complete(&b, &token_a, &json!("x"), LONG).await,
    );
    assert_same(check, "complete b with a's token", crossed, false);
    let got = claim(check, store, &b).await;
    assert_same(check, "claim b after a completed", got, Claim::InProgress);

    let released = ok(check, "release b", store.release(&b, &token_b).await);
    assert_same(check, "release b", released, true);
    let got = claim(check, store, &a).await;
    assert_same(
        check,
        "claim a after b released",
        got,
        Claim::Completed(json!("a")),
    );
    acquire(check, store, &b, LONG).await;
    acquire(check, store, &c, LONG).await;
}

/// A zero lease or TTL is refused with [`StoreError::InvalidDuration`] and
/// changes nothing.
pub async fn zero_durations_are_refused<S: IdempotencyStore>(store: &S) {
    let check = "zero_durations_are_refused";
    let key = fresh_key();
    expect_invalid_duration(check, "claim", store.claim(&key, Duration::ZERO)).await;
    let token = acquire(check, store, &key, LONG).await;
    expect_invalid_duration(
        check,
        "complete",
        store.complete(&key, &token, &json!(1), Duration::ZERO),
    )
    .await;
    let got = claim(check, store, &key).await;
    assert_same(check, "claim", got, Claim::InProgress);
}

async fn expect_invalid_duration<T: Debug>(
    check: &str,
    what: &str,
    call: impl Future<Output = Result<T, StoreError>>,
) {
    match call.await {
        Err(StoreError::InvalidDuration { .. }) => {}
        other => panic!("{check}: {what} with a zero duration returned {other:?}"),
    }
}
