//! [`eventually`]: waiting on a condition with a deadline, the one way tests
//! here wait for something asynchronous to happen; [`consistently`], its
//! counterpart for something that must not happen.

use std::time::Duration;

/// How often [`eventually`] re-checks its condition.
pub const POLL: Duration = Duration::from_millis(50);

/// Re-checks `check` every 50 ms until it returns true.
///
/// # Panics
///
/// When `limit` passes first, naming `what`: a test that waits for an
/// effect fails with what it was waiting for, never hangs.
pub async fn eventually(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Re-checks `check` every 50 ms for `window`, failing at the first check
/// that returns false.
///
/// For an effect that must not happen (a loop that must not claim, say),
/// which no condition can wait for: the window is how long the test gives
/// the effect to show, and a break shows at once rather than at its end.
///
/// # Panics
///
/// When `check` returns false within `window`, naming `what`.
pub async fn consistently(what: &str, window: Duration, mut check: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + window;
    loop {
        assert!(check().await, "no longer true: {what}");
        if tokio::time::Instant::now() >= end {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until `count` reaches `target`, failing as soon as it stops
/// growing for `stall`, or when `limit` passes.
///
/// For a large drain: its whole time on a slow machine can be minutes, but
/// a jammed queue shows in seconds as a count that does not move, so the
/// test fails then instead of at the end of the long limit.
///
/// # Panics
///
/// When the count stays put for `stall` or `limit` passes first, naming
/// `what`, the count reached and the target.
pub async fn eventually_reaching(
    what: &str,
    target: usize,
    stall: Duration,
    limit: Duration,
    mut count: impl AsyncFnMut() -> usize,
) {
    let start = tokio::time::Instant::now();
    let (mut best, mut moved) = (count().await, start);
    while best < target {
        let now = tokio::time::Instant::now();
        assert!(
            now.duration_since(moved) < stall,
            "{what}: stuck at {best} of {target} for {stall:?}"
        );
        assert!(
            now.duration_since(start) < limit,
            "timed out after {limit:?} waiting for {what}: {best} of {target}"
        );
        tokio::time::sleep(POLL).await;
        let seen = count().await;
        if seen > best {
            (best, moved) = (seen, tokio::time::Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const STALL: Duration = Duration::from_millis(200);

    #[tokio::test]
    async fn a_count_that_keeps_growing_is_waited_for_past_the_stall_time() {
        let (n, start) = (AtomicUsize::new(0), tokio::time::Instant::now());
        eventually_reaching("growth", 30, STALL, Duration::from_secs(60), async || {
            n.fetch_add(1, Ordering::Relaxed)
        })
        .await;
        assert!(
            start.elapsed() >= Duration::from_secs(1),
            "30 polls of 50 ms: {:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn a_condition_that_holds_is_checked_for_the_whole_window() {
        let n = AtomicUsize::new(0);
        consistently("always", Duration::from_millis(300), async || {
            n.fetch_add(1, Ordering::Relaxed);
            true
        })
        .await;
        assert!(n.load(Ordering::Relaxed) >= 6, "{n:?} checks in 300 ms");
    }

    #[tokio::test]
    #[should_panic(expected = "no longer true: a quiet loop")]
    async fn a_condition_that_breaks_within_the_window_fails() {
        let n = AtomicUsize::new(0);
        consistently("a quiet loop", Duration::from_secs(60), async || {
            n.fetch_add(1, Ordering::Relaxed) < 3
        })
        .await;
    }

    #[tokio::test]
    #[should_panic(expected = "a jam: stuck at 3 of 10")]
    async fn a_count_that_stops_fails_after_the_stall_time() {
        let n = AtomicUsize::new(0);
        eventually_reaching("a jam", 10, STALL, Duration::from_secs(60), async || {
            n.fetch_add(1, Ordering::Relaxed).min(3)
        })
        .await;
    }

    #[tokio::test]
    #[should_panic(expected = "timed out after 500ms waiting for slow growth")]
    async fn a_count_that_grows_too_slowly_fails_at_the_limit() {
        let n = AtomicUsize::new(0);
        eventually_reaching(
            "slow growth",
            usize::MAX,
            STALL,
            Duration::from_millis(500),
            async || n.fetch_add(1, Ordering::Relaxed),
        )
        .await;
    }
}
