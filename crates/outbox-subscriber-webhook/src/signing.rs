//! Standard Webhooks signatures.
//!
//! The signed content is `<webhook-id>.<webhook-timestamp>.<body>`; the
//! signature is HMAC-SHA256 keyed with the endpoint secret, sent as
//! `webhook-signature: v1,<base64>`. A secret of the form `whsec_<base64>`
//! is base64-decoded to get the key; any other secret is used as raw bytes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// A secret that cannot be used to sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid webhook secret: {0}")]
pub struct SecretError(String);

/// The HMAC key of `secret`.
///
/// # Errors
///
/// [`SecretError`] when a `whsec_` secret is not valid base64, or the key is empty.
pub fn secret_key(secret: &str) -> Result<Vec<u8>, SecretError> {
    let key = match secret.strip_prefix("whsec_") {
        Some(encoded) => STANDARD
            .decode(encoded)
            .map_err(|e| SecretError(format!("whsec_ secret is not base64: {e}")))?,
        None => secret.as_bytes().to_vec(),
    };
    if key.is_empty() {
        return Err(SecretError("empty key".into()));
    }
    Ok(key)
}

/// The `webhook-signature` header value for a message.
///
/// # Errors
///
/// [`SecretError`] for an unusable secret.
///
/// ```
/// let sig = outbox_subscriber_webhook::sign("whsec_c2VjcmV0", "msg_1", 1_700_000_000, b"{}").unwrap();
/// assert!(sig.starts_with("v1,"));
/// assert!(outbox_subscriber_webhook::verify("whsec_c2VjcmV0", "msg_1", 1_700_000_000, b"{}", &sig).unwrap());
/// ```
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Result<String, SecretError> {
    let key = secret_key(secret)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).map_err(|e| SecretError(e.to_string()))?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// Checks a `webhook-signature` header (space-separated `v1,<sig>` entries)
/// in constant time per entry, as a receiver would.
///
/// # Errors
///
/// [`SecretError`] for an unusable secret.
pub fn verify(
    secret: &str,
    id: &str,
    timestamp: i64,
    body: &[u8],
    header: &str,
) -> Result<bool, SecretError> {
    let key = secret_key(secret)?;
    for entry in header.split(' ') {
        let Some(encoded) = entry.strip_prefix("v1,") else {
            continue;
        };
        let Ok(signature) = STANDARD.decode(encoded) else {
            continue;
        };
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&key).map_err(|e| SecretError(e.to_string()))?;
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        if mac.verify_slice(&signature).is_ok() {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // Computed independently: HMAC-SHA256(key=b"secret", "msg_1.1700000000.{}") in base64.
        let header = sign("secret", "msg_1", 1_700_000_000, b"{}").unwrap();
        assert_eq!(header, "v1,A5oIrJxXPB/PkULSoVu0e4khvPiqpF9vljmhkSKg0FI=");
        assert!(verify("secret", "msg_1", 1_700_000_000, b"{}", &header).unwrap());
        assert!(!verify("secret", "msg_1", 1_700_000_001, b"{}", &header).unwrap());
        assert!(!verify("other", "msg_1", 1_700_000_000, b"{}", &header).unwrap());
        assert!(!verify("secret", "msg_1", 1_700_000_000, b"{ }", &header).unwrap());
        // whsec_ secrets are base64: "c2VjcmV0" is "secret".
        assert_eq!(
            header,
            sign("whsec_c2VjcmV0", "msg_1", 1_700_000_000, b"{}").unwrap()
        );
    }

    #[test]
    fn bad_secrets_are_refused() {
        assert!(secret_key("whsec_***").is_err());
        assert!(secret_key("").is_err());
    }
}
