//! At most one successful delivery per key, through the idempotency store.

use std::time::Duration;

use outbox_idempotency::{Claim, IdempotencyStore};
use outbox_subscriber::JobError;

use crate::Delivery;

/// Leases and retention of delivery keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnceSettings {
    /// How long a delivery in progress holds its key (longer than the HTTP timeout).
    pub lease: Duration,
    /// How long a completed delivery is remembered.
    pub ttl: Duration,
}

impl OnceSettings {
    /// Default of `lease` (`DELIVERY_LEASE_MS`).
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
}

/// `DELIVERY_LEASE_MS`: [`OnceSettings::lease`].
pub const DELIVERY_LEASE_MS: outbox_env::Whole = outbox_env::Whole {
    name: "DELIVERY_LEASE_MS",
    default: outbox_env::millis(OnceSettings::DEFAULT_LEASE),
    min: 100,
    max: outbox_env::MAX_MILLIS,
    meaning: "how long a delivery in progress holds its idempotency key, in ms; keep above the timeouts",
};

impl Default for OnceSettings {
    fn default() -> Self {
        Self {
            lease: Self::DEFAULT_LEASE,
            ttl: Duration::from_secs(24 * 3600),
        }
    }
}

/// What happened to one keyed delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Once {
    /// Delivered now.
    Delivered,
    /// Delivered by an earlier attempt; nothing was sent.
    AlreadyDelivered,
    /// Not delivered: the verdict says whether to retry.
    Failed(Delivery),
}

/// Runs `deliver` unless `key` was delivered before. A failed delivery
/// releases the key so that the retry sends again; a delivery in progress
/// elsewhere is a retryable error.
///
/// # Errors
///
/// [`JobError::Retry`] when the store fails or another worker holds the key.
pub async fn deliver_once<S: IdempotencyStore>(
    store: &S,
    key: &str,
    settings: OnceSettings,
    deliver: impl AsyncFnOnce() -> Delivery,
) -> Result<Once, JobError> {
    let claim = store
        .claim(key, settings.lease)
        .await
        .map_err(|e| JobError::retry(format!("idempotency store: {e}")))?;
    let token = match claim {
        Claim::Completed(_) => return Ok(Once::AlreadyDelivered),
        Claim::InProgress => {
            return Err(JobError::retry(format!(
                "delivery {key} is in progress elsewhere"
            )));
        }
        Claim::Acquired(token) => token,
    };
    let verdict = deliver().await;
    match verdict {
        Delivery::Delivered { status } => {
            let recorded = serde_json::json!({ "status": status });
            // Delivered but not remembered: a redelivery may send again,
            // which receivers must tolerate (at-least-once).
            match store.complete(key, &token, &recorded, settings.ttl).await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(
                    key,
                    "delivered but could not record it: the claim's lease ran out during the call (DELIVERY_LEASE_MS)"
                ),
                Err(e) => tracing::warn!(key, error = %e, "delivered but could not record it"),
            }
            Ok(Once::Delivered)
        }
        failed => {
            if let Err(e) = store.release(key, &token).await {
                tracing::warn!(key, error = %e, "could not release the delivery claim; it expires with its lease");
            }
            Ok(Once::Failed(failed))
        }
    }
}
