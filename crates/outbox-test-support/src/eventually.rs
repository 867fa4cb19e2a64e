//! [`eventually`]: waiting on a condition with a deadline, the one way tests
//! here wait for something asynchronous to happen.

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
