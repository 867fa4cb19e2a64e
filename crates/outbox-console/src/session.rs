//! Sessions of the login form, and the CSRF tokens of every identity.
//!
//! A session is a random id in an `HttpOnly`, `SameSite=Strict` cookie,
//! kept in memory (a restart logs everyone out). The CSRF token of a
//! request is an HMAC, under a key made at start, of what identifies its
//! session: the session id, or the identity an application's hook named.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::Identity;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "outbox_console";

/// How long a session lasts after its login.
pub(crate) const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// 32 random bytes, as 64 hex digits (two v4 UUIDs: the OS's random source).
fn random_hex() -> String {
    let mut out = String::with_capacity(64);
    for _ in 0..2 {
        out.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sessions opened by the login form, and the CSRF key.
#[derive(Clone)]
pub(crate) struct Sessions {
    key: Arc<String>,
    open: Arc<Mutex<HashMap<String, (Identity, Instant)>>>,
}

impl Sessions {
    pub(crate) fn new() -> Self {
        Self {
            key: Arc::new(random_hex()),
            open: Arc::default(),
        }
    }

    /// Opens a session for `identity`; returns its id (the cookie's value).
    pub(crate) fn open(&self, identity: Identity) -> String {
        let id = random_hex();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|_, (_, since)| since.elapsed() < SESSION_LIFETIME);
        open.insert(id.clone(), (identity, Instant::now()));
        id
    }

    /// Who the session `id` belongs to, while it lasts.
    pub(crate) fn identity(&self, id: &str) -> Option<Identity> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(id)
            .filter(|(_, since)| since.elapsed() < SESSION_LIFETIME)
            .map(|(who, _)| who.clone())
    }

    /// Ends the session `id`.
    pub(crate) fn close(&self, id: &str) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// The CSRF token of the session (or hook identity) `subject`.
    pub(crate) fn csrf(&self, subject: &str) -> String {
        // HMAC takes a key of any length: this cannot fail.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(self.key.as_bytes()) else {
            return String::new();
        };
        mac.update(subject.as_bytes());
        hex(&mac.finalize().into_bytes())
    }
}

/// Whether two tokens are equal, in a time that does not depend on where
/// they differ (their digests are compared).
pub(crate) fn same_token(a: &str, b: &str) -> bool {
    Sha256::digest(a.as_bytes()) == Sha256::digest(b.as_bytes())
}

/// The value of the cookie `name` in a `Cookie` header.
pub(crate) fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The `Set-Cookie` value of a session under `path`; `Secure` when the
/// browser reached the console over HTTPS (`secure`: through a TLS proxy
/// that says so), so that the cookie never travels in clear text after.
pub(crate) fn set_cookie(id: &str, path: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_LIFETIME.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// Whether the request came over HTTPS: a TLS proxy in front says so
/// with `X-Forwarded-Proto: https` (the console itself speaks plain HTTP).
pub(crate) fn over_https(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}

/// The `Set-Cookie` value that removes the session cookie.
pub(crate) fn clear_cookie(path: &str) -> String {
    format!("{COOKIE}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Role;

    #[test]
    fn a_session_names_its_identity_until_closed() {
        let sessions = Sessions::new();
        let id = sessions.open(Identity::new("ana", Role::Operator));
        assert_eq!(
            sessions.identity(&id),
            Some(Identity::new("ana", Role::Operator))
        );
        assert_eq!(sessions.identity("forged"), None);
        sessions.close(&id);
        assert_eq!(sessions.identity(&id), None);
    }

    #[test]
    fn csrf_tokens_differ_per_session_and_per_console() {
        let (one, other) = (Sessions::new(), Sessions::new());
        assert_eq!(one.csrf("a"), one.csrf("a"));
        assert_ne!(one.csrf("a"), one.csrf("b"));
        assert_ne!(one.csrf("a"), other.csrf("a"));
        assert_eq!(one.csrf("a").len(), 64);
    }

    #[test]
    fn the_session_cookie_is_secure_behind_a_tls_proxy() {
        let mut headers = axum::http::HeaderMap::new();
        assert!(!over_https(&headers));
        assert!(!set_cookie("id", "/", false).contains("Secure"));
        headers.insert("x-forwarded-proto", "HTTPS".parse().unwrap());
        assert!(over_https(&headers));
        let cookie = set_cookie("id", "/ops", true);
        assert!(cookie.ends_with("; Secure") && cookie.contains("HttpOnly; SameSite=Strict"));
    }

    #[test]
    fn cookies_are_found_by_name() {
        let header = "theme=dark; outbox_console=abc; other=1";
        assert_eq!(cookie(header, COOKIE), Some("abc"));
        assert_eq!(cookie("outbox_console_x=1", COOKIE), None);
    }
}
