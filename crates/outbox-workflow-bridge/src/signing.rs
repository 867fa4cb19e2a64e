//! Request signatures between the workers and the bridge: HMAC-SHA256 over
//! the request id, the timestamp and the body, checked in constant time,
//! within a five-minute window.
//!
//! The signed text is `<request id>.<unix seconds>.<body>`; the signature
//! header carries `v1=<base64 of the MAC>`. The bridge accepts the current
//! secret and, during a rotation, the previous one.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Header with the request's unique id (a UUID): a replay is refused.
pub const REQUEST_ID_HEADER: &str = "x-outbox-bridge-request-id";
/// Header with the signing time, in Unix seconds.
pub const TIMESTAMP_HEADER: &str = "x-outbox-bridge-timestamp";
/// Header with the signature, `v1=<base64>`.
pub const SIGNATURE_HEADER: &str = "x-outbox-bridge-signature";
/// How far a request's timestamp may be from the bridge's clock.
pub const SIGNATURE_WINDOW: Duration = Duration::from_secs(300);
/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;

/// A shared secret that is too short to sign with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the bridge secret has {len} bytes; at least {MIN_SECRET_BYTES} are required")]
pub struct WeakSecret {
    /// Its length in bytes.
    pub len: usize,
}

/// `WORKFLOW_BRIDGE_SECRET`: the [`BridgeSecret`] workers sign with and the
/// bridge verifies with ([`BridgeSecret::from_lookup`]).
pub const WORKFLOW_BRIDGE_SECRET: outbox_env::Text = outbox_env::Text {
    name: "WORKFLOW_BRIDGE_SECRET",
    default: "unset (required by hybrid and http)",
    form: "at least 32 bytes",
    meaning: "the key requests to the bridge are signed with; never printed",
};

/// `WORKFLOW_BRIDGE_PREVIOUS_SECRET`: a second [`BridgeSecret`] the bridge
/// accepts during a key rotation.
pub const WORKFLOW_BRIDGE_PREVIOUS_SECRET: outbox_env::Text = outbox_env::Text {
    name: "WORKFLOW_BRIDGE_PREVIOUS_SECRET",
    default: "unset (only WORKFLOW_BRIDGE_SECRET is accepted)",
    form: "at least 32 bytes",
    meaning: "a second key the bridge also accepts, during a key rotation; never printed",
};

/// A shared secret of the bridge (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct BridgeSecret(Vec<u8>);

impl BridgeSecret {
    /// The secret `text` (its UTF-8 bytes).
    ///
    /// # Errors
    ///
    /// [`WeakSecret`] when it has fewer than [`MIN_SECRET_BYTES`] bytes.
    pub fn new(text: &str) -> Result<Self, WeakSecret> {
        if text.len() < MIN_SECRET_BYTES {
            return Err(WeakSecret { len: text.len() });
        }
        Ok(Self(text.as_bytes().to_vec()))
    }

    /// The secret of the variable `spec` (such as [`WORKFLOW_BRIDGE_SECRET`])
    /// read through `get`, `None` when unset.
    ///
    /// # Errors
    ///
    /// A [`outbox_env::VariableError`] naming the variable, its value shown
    /// as `<redacted>`, when the secret is too short.
    pub fn from_lookup(
        spec: &outbox_env::Text,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, outbox_env::VariableError> {
        spec.read(get)
            .map(|value| Self::new(&value).map_err(|e| spec.refuse("<redacted>", e.to_string())))
            .transpose()
    }

    fn mac(&self, request_id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length.
        #[allow(clippy::expect_used)]
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(request_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// The signature header value for a request.
    #[must_use]
    pub fn sign(&self, request_id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self
            .mac(request_id, timestamp, body)
            .finalize()
            .into_bytes();
        format!("v1={}", STANDARD.encode(tag))
    }

    /// Whether `signature` (a header value) signs the request with this
    /// secret; the comparison takes constant time.
    #[must_use]
    pub fn verifies(&self, request_id: &str, timestamp: i64, body: &[u8], signature: &str) -> bool {
        let Some(encoded) = signature.strip_prefix("v1=") else {
            return false;
        };
        let Ok(tag) = STANDARD.decode(encoded) else {
            return false;
        };
        self.mac(request_id, timestamp, body)
            .verify_slice(&tag)
            .is_ok()
    }
}

impl std::fmt::Debug for BridgeSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BridgeSecret(<redacted>)")
    }
}

/// Why a request's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// A signature header is missing or not text.
    #[error("missing or unreadable header {0}")]
    MissingHeader(&'static str),
    /// The request id is not a UUID.
    #[error("the request id is not a UUID")]
    BadRequestId,
    /// The timestamp is not a number of seconds.
    #[error("the timestamp is not a number of seconds")]
    BadTimestamp,
    /// The timestamp is outside the window.
    #[error("the request was signed {skew_secs} s away from now; at most {} s are accepted", SIGNATURE_WINDOW.as_secs())]
    Expired {
        /// How far from now, in seconds.
        skew_secs: u64,
    },
    /// No secret verifies the signature.
    #[error("the signature does not verify")]
    Mismatch,
}

/// The signed parts of a request, as received.
#[derive(Debug, Clone, Copy)]
pub struct SignedRequest<'a> {
    /// [`REQUEST_ID_HEADER`].
    pub request_id: Option<&'a str>,
    /// [`TIMESTAMP_HEADER`].
    pub timestamp: Option<&'a str>,
    /// [`SIGNATURE_HEADER`].
    pub signature: Option<&'a str>,
    /// The raw body.
    pub body: &'a [u8],
}

/// Checks a request against `secrets` at `now` (Unix seconds); its request
/// id when one secret verifies it within the window.
///
/// # Errors
///
/// [`SignatureError`] naming what is wrong.
pub fn verify_request(
    secrets: &[BridgeSecret],
    request: SignedRequest<'_>,
    now: i64,
) -> Result<uuid::Uuid, SignatureError> {
    let request_id = request
        .request_id
        .ok_or(SignatureError::MissingHeader(REQUEST_ID_HEADER))?;
    let timestamp = request
        .timestamp
        .ok_or(SignatureError::MissingHeader(TIMESTAMP_HEADER))?;
    let signature = request
        .signature
        .ok_or(SignatureError::MissingHeader(SIGNATURE_HEADER))?;
    let id = uuid::Uuid::parse_str(request_id).map_err(|_| SignatureError::BadRequestId)?;
    let timestamp: i64 = timestamp
        .parse()
        .map_err(|_| SignatureError::BadTimestamp)?;
    let skew_secs = now.abs_diff(timestamp);
    if skew_secs > SIGNATURE_WINDOW.as_secs() {
        return Err(SignatureError::Expired { skew_secs });
    }
    if secrets
        .iter()
        .any(|secret| secret.verifies(request_id, timestamp, request.body, signature))
    {
        Ok(id)
    } else {
        Err(SignatureError::Mismatch)
    }
}
