//! [`with_outbox_idempotency`]: run a subscriber handler at most once per
//! outbox event, whatever the number of deliveries.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;
use uuid::Uuid;

use crate::store::{Claim, ClaimToken, IdempotencyStore, StoreError};

/// How long claims and results last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyOptions {
    /// How long a delivery owns the event while its handler runs. Pick it
    /// well above the handler's longest run: if the lease runs out first,
    /// a redelivery may run the handler a second time. It is also the
    /// longest a crashed handler delays the redelivery. Default 5 minutes.
    pub lease: Duration,
    /// How long a completed event's result is kept, i.e. the window within
    /// which a redelivery is recognised as a duplicate. Default 24 hours.
    pub ttl: Duration,
}

impl IdempotencyOptions {
    /// The default lease: 5 minutes.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(5 * 60);
    /// The default TTL of a completed result: 24 hours.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
}

impl Default for IdempotencyOptions {
    fn default() -> Self {
        Self {
            lease: Self::DEFAULT_LEASE,
            ttl: Self::DEFAULT_TTL,
        }
    }
}

/// What [`with_outbox_idempotency`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome<T> {
    /// The handler ran in this delivery and returned this value.
    Ran(T),
    /// The event was handled by an earlier delivery; this is the result it
    /// recorded, and the handler did not run.
    Cached(T),
}

impl<T> Outcome<T> {
    /// The handler's result, whichever delivery produced it.
    pub fn into_inner(self) -> T {
        match self {
            Self::Ran(value) | Self::Cached(value) => value,
        }
    }

    /// A reference to the handler's result.
    #[must_use]
    pub fn value(&self) -> &T {
        match self {
            Self::Ran(value) | Self::Cached(value) => value,
        }
    }

    /// Whether an earlier delivery ran the handler.
    #[must_use]
    pub fn is_cached(&self) -> bool {
        matches!(self, Self::Cached(_))
    }
}

/// Why [`with_outbox_idempotency`] returned no result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdempotencyError<E> {
    /// The handler ran and failed. Its claim was released, so a retry runs
    /// it again.
    #[error("the handler failed: {0}")]
    Handler(E),

    /// Another delivery of the same event holds an unexpired lease: it is
    /// running the handler now, or crashed less than a lease ago. Nothing
    /// ran; let the job framework retry later.
    #[error("event {event_id} is being handled by another delivery; retry later")]
    InProgress {
        /// The event.
        event_id: Uuid,
    },

    /// The idempotency store failed before the handler ran (so it did not
    /// run), or it holds a corrupt record for the event.
    #[error("idempotency store failed for event {event_id}")]
    Store {
        /// The event.
        event_id: Uuid,
        /// What failed.
        #[source]
        source: StoreError,
    },

    /// The event was handled before, but its recorded result does not
    /// deserialize into the handler's result type (typically: the type
    /// changed in a deployment). The handler did not run, and retrying will
    /// not help until the record expires or an operator deletes it.
    #[error("the recorded result of event {event_id} does not match the handler's result type")]
    CachedResult {
        /// The event.
        event_id: Uuid,
        /// Why it did not deserialize.
        #[source]
        source: serde_json::Error,
    },
}

/// Runs `handler` for outbox event `event_id` unless an earlier delivery of
/// the same event already did, making an at-least-once subscriber
/// effectively exactly-once.
///
/// The idempotency key is the event id in its hyphenated form
/// (`0190…-…`), so with [`RedisIdempotencyStore`](crate::RedisIdempotencyStore)'s
/// default prefix the record lives at `outbox:idempotency:<event id>`. When
/// several handlers process the same event, give each its own store prefix
/// so they do not suppress one another.
///
/// 1. Claim the event for `options.lease`.
/// 2. Claimed: run `handler`. On `Ok(value)` record `value` (as JSON) for
///    `options.ttl` and return [`Outcome::Ran`]; on `Err(e)` release the
///    claim, so a retry runs the handler again, and return
///    [`IdempotencyError::Handler`].
/// 3. Handled before: return the recorded result as [`Outcome::Cached`]
///    without running the handler.
/// 4. Someone else holds the lease: return [`IdempotencyError::InProgress`].
///
/// Once the handler has succeeded its side effects are done, so the call
/// returns `Ok(Outcome::Ran)` even if the result cannot be recorded (store
/// down, lease already expired, result not serializable): an error would make
/// the job framework redeliver and run the handler twice. Such a failure is
/// logged at error level and the claim is left to expire. Likewise a failed
/// release after a handler error is logged, and the lease expires by itself.
/// If the returned future is dropped while the handler runs (cancellation,
/// shutdown), the claim also stays until its lease ends, as after a crash.
///
/// # Errors
///
/// See [`IdempotencyError`]: the handler's own error, a delivery in
/// progress elsewhere, a store failure before the handler ran, or a
/// recorded result of the wrong type.
///
/// # Example
///
/// ```no_run
/// use outbox_idempotency::{
///     with_outbox_idempotency, IdempotencyError, IdempotencyOptions, Outcome,
///     RedisIdempotencyStore,
/// };
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Sent {
///     message_id: String,
/// }
///
/// async fn send_mail(to: &str) -> Result<Sent, std::io::Error> {
///     // … talk to the SMTP server …
///     Ok(Sent { message_id: format!("<1@{to}>") })
/// }
///
/// async fn handle(
///     store: &RedisIdempotencyStore,
///     event_id: uuid::Uuid,
/// ) -> Result<(), IdempotencyError<std::io::Error>> {
///     let outcome = with_outbox_idempotency(
///         store,
///         event_id,
///         IdempotencyOptions::default(),
///         async || send_mail("ops@example.com").await,
///     )
///     .await?;
///     match outcome {
///         Outcome::Ran(sent) => tracing::info!(message_id = %sent.message_id, "sent"),
///         Outcome::Cached(sent) => tracing::info!(message_id = %sent.message_id, "already sent"),
///     }
///     Ok(())
/// }
///
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let store = RedisIdempotencyStore::new(redis::aio::ConnectionManager::new(client).await?);
/// handle(&store, uuid::Uuid::now_v7()).await?;
/// # Ok(())
/// # }
/// ```
pub async fn with_outbox_idempotency<S, T, E>(
    store: &S,
    event_id: Uuid,
    options: IdempotencyOptions,
    handler: impl AsyncFnOnce() -> Result<T, E>,
) -> Result<Outcome<T>, IdempotencyError<E>>
where
    S: IdempotencyStore,
    T: Serialize + DeserializeOwned,
{
    let span = tracing::info_span!(
        "outbox_idempotency",
        event_id = %event_id,
        outcome = tracing::field::Empty,
    );
    run(store, event_id, options, handler)
        .instrument(span)
        .await
}

async fn run<S, T, E>(
    store: &S,
    event_id: Uuid,
    options: IdempotencyOptions,
    handler: impl AsyncFnOnce() -> Result<T, E>,
) -> Result<Outcome<T>, IdempotencyError<E>>
where
    S: IdempotencyStore,
    T: Serialize + DeserializeOwned,
{
    let key = event_id.to_string();
    let span = tracing::Span::current();
    let store_error = |source| IdempotencyError::Store { event_id, source };

    let token = match store
        .claim(&key, options.lease)
        .await
        .map_err(store_error)?
    {
        Claim::Acquired(token) => token,
        Claim::InProgress => {
            span.record("outcome", "in_progress");
            tracing::debug!("another delivery holds the lease");
            return Err(IdempotencyError::InProgress { event_id });
        }
        Claim::Completed(recorded) => {
            let value = serde_json::from_value(recorded).map_err(|source| {
                span.record("outcome", "cached_result_mismatch");
                IdempotencyError::CachedResult { event_id, source }
            })?;
            span.record("outcome", "cached");
            tracing::debug!("handled before; returning the recorded result");
            return Ok(Outcome::Cached(value));
        }
    };

    match handler().await {
        Ok(value) => {
            span.record("outcome", "ran");
            record_result(store, &key, &token, &value, options.ttl).await;
            Ok(Outcome::Ran(value))
        }
        Err(error) => {
            span.record("outcome", "handler_failed");
            match store.release(&key, &token).await {
                Ok(true) => tracing::debug!("handler failed; claim released"),
                Ok(false) => tracing::warn!(
                    "handler failed after its lease expired; another delivery may be running it"
                ),
                Err(e) => tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "handler failed and its claim could not be released; a retry waits for the lease to expire"
                ),
            }
            Err(IdempotencyError::Handler(error))
        }
    }
}

/// Records a successful handler's result; failures are logged, never
/// returned (see [`with_outbox_idempotency`]).
async fn record_result<S, T>(store: &S, key: &str, token: &ClaimToken, value: &T, ttl: Duration)
where
    S: IdempotencyStore,
    T: Serialize,
{
    let json = match serde_json::to_value(value) {
        Ok(json) => json,
        Err(e) => {
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "handler succeeded but its result does not serialize to JSON; \
                 a redelivery after the lease expires will run it again"
            );
            return;
        }
    };
    match store.complete(key, token, &json, ttl).await {
        Ok(true) => tracing::debug!("handler succeeded; result recorded"),
        Ok(false) => tracing::error!(
            "handler succeeded after its lease expired; the result was not recorded \
             and another delivery may have run it too (raise the lease)"
        ),
        Err(e) => tracing::error!(
            error = &e as &dyn std::error::Error,
            "handler succeeded but its result could not be recorded; \
             a redelivery after the lease expires will run it again"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_five_minutes_and_a_day() {
        let options = IdempotencyOptions::default();
        assert_eq!(options.lease, Duration::from_secs(300));
        assert_eq!(options.ttl, Duration::from_secs(86_400));
    }

    /// Handler errors need only `Debug + Display` (so `anyhow::Error`
    /// works), and the result is still a `std::error::Error`.
    #[test]
    fn errors_wrap_any_displayable_handler_error() {
        #[derive(Debug)]
        struct NotAnError;
        impl std::fmt::Display for NotAnError {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("smtp down")
            }
        }
        fn is_error<T: std::error::Error + Send + Sync + 'static>(_: &T) {}
        let error = IdempotencyError::Handler(NotAnError);
        is_error(&error);
        assert_eq!(error.to_string(), "the handler failed: smtp down");
    }

    #[test]
    fn outcome_accessors() {
        let ran = Outcome::Ran(1);
        assert!(!ran.is_cached());
        assert_eq!(*ran.value(), 1);
        let cached = Outcome::Cached(2);
        assert!(cached.is_cached());
        assert_eq!(cached.into_inner(), 2);
    }
}
