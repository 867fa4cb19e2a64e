//! The storage seam: [`IdempotencyStore`] and the types its operations
//! exchange.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde_json::Value;

/// Where "has this key been handled?" is recorded: a lease while a handler
/// runs, then the handler's result for a long TTL.
///
/// Every operation is atomic on its key. A key is in one of three states:
///
/// - **free**: never claimed, released, or expired;
/// - **in progress**: claimed under a lease, owned by one [`ClaimToken`];
///   when the lease runs out the key is free again, so a handler that
///   crashed after claiming delays a redelivery by the lease, not by the TTL;
/// - **completed**: holds the handler's JSON result until the TTL runs out.
///
/// [`complete`](Self::complete) and [`release`](Self::release) are *fenced*:
/// they act only while the given token still owns an unexpired claim, so a
/// handler whose lease ran out (and whose key someone else may have claimed
/// since) cannot overwrite or delete the newer state.
///
/// Durations are honoured to the millisecond; a zero lease or TTL is refused
/// with [`StoreError::InvalidDuration`]. Every implementation must pass
/// the suite in `conformance` (cargo feature `conformance`).
pub trait IdempotencyStore: Send + Sync {
    /// Claims `key` for `lease`, unless it is completed or someone else
    /// holds an unexpired lease on it.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store fails, holds a record it cannot read
    /// ([`StoreError::Corrupt`]) or `lease` is zero.
    fn claim(
        &self,
        key: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Records `result` as the outcome of `key`, kept for `ttl`, if `token`
    /// still owns the claim. Returns whether it did: `false` means the lease
    /// ran out (and maybe another claim took over), the claim was released,
    /// or the key was already completed.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store fails or `ttl` is zero.
    fn complete(
        &self,
        key: &str,
        token: &ClaimToken,
        result: &Value,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Frees `key` if `token` still owns its in-progress claim, so that the
    /// next claim runs the handler again. Returns whether it did; a
    /// completed key is never released.
    ///
    /// # Errors
    ///
    /// [`StoreError`] when the store fails.
    fn release(
        &self,
        key: &str,
        token: &ClaimToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// What [`IdempotencyStore::claim`] found.
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a claim must be acted on: run, wait or use the cached result"]
pub enum Claim {
    /// The key was free and is now leased to the caller, who should run the
    /// handler and then [`complete`](IdempotencyStore::complete) or
    /// [`release`](IdempotencyStore::release) with this token.
    Acquired(ClaimToken),
    /// Someone else holds an unexpired lease: try again later.
    InProgress,
    /// The key was handled before; this is the recorded result.
    Completed(Value),
}

/// Proof of owning a claim: a random value (a UUIDv4) that fences
/// [`complete`](IdempotencyStore::complete) and
/// [`release`](IdempotencyStore::release).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClaimToken(String);

impl ClaimToken {
    /// A fresh random token. Implementations of [`IdempotencyStore`] call
    /// this when a claim succeeds.
    #[must_use]
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// The token as stored.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ClaimToken").field(&self.0).finish()
    }
}

/// Why an [`IdempotencyStore`] operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A Redis command or script failed (connection, timeout, server error).
    #[error("Redis command failed")]
    Redis(#[from] redis::RedisError),

    /// The record under `key` is not one this crate writes (invalid JSON or
    /// an unknown state). Nothing was changed; an operator should inspect
    /// and delete the key.
    #[error("idempotency record under key {key:?} is corrupt")]
    Corrupt {
        /// The full store key.
        key: String,
        /// Why the record could not be read.
        #[source]
        source: serde_json::Error,
    },

    /// A lease or TTL that the store cannot represent: zero, or too long.
    #[error("{what} of {duration:?} is out of range: it must be at least 1 ms")]
    InvalidDuration {
        /// `"lease"` or `"ttl"`.
        what: &'static str,
        /// The duration given.
        duration: Duration,
    },

    /// Something that should not happen: the store answered outside its
    /// contract, or a record could not be encoded. A bug, not an outage.
    #[error("internal error in the idempotency store: {0}")]
    Internal(String),
}

/// `duration` in whole milliseconds, rounded up, for stores that expire keys
/// by the millisecond.
///
/// # Errors
///
/// [`StoreError::InvalidDuration`] for zero, or for more milliseconds than
/// an `i64` holds.
pub(crate) fn duration_millis(what: &'static str, duration: Duration) -> Result<i64, StoreError> {
    let millis = duration.as_nanos().div_ceil(1_000_000);
    match i64::try_from(millis) {
        Ok(ms) if ms > 0 => Ok(ms),
        _ => Err(StoreError::InvalidDuration { what, duration }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_whole_milliseconds() {
        let ms = |d| duration_millis("lease", d).ok();
        assert_eq!(ms(Duration::from_nanos(1)), Some(1));
        assert_eq!(ms(Duration::from_micros(1_500)), Some(2));
        assert_eq!(ms(Duration::from_secs(300)), Some(300_000));
        assert_eq!(ms(Duration::ZERO), None);
        assert_eq!(ms(Duration::MAX), None);
    }

    #[test]
    fn tokens_are_random() {
        assert_ne!(ClaimToken::generate(), ClaimToken::generate());
    }

    #[test]
    fn a_token_shows_in_logs_as_itself() {
        let token = ClaimToken::generate();
        assert_eq!(
            format!("{token:?}"),
            format!("ClaimToken({:?})", token.as_str())
        );
    }
}
