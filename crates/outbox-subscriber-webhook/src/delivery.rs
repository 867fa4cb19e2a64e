//! Signed HTTP delivery with timeouts, an address guard and a verdict per
//! response: success, retry, or permanent failure.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde::Serialize;

use crate::sign;

/// How deliveries are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliverySettings {
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Allow loopback, private, link-local and other internal addresses.
    /// Off in production (it would let a tenant aim webhooks at internal
    /// services); tests and the demo turn it on.
    pub allow_private_addresses: bool,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            allow_private_addresses: false,
        }
    }
}

/// The verdict on one delivery attempt. The reasons end up in logs and in
/// the dead set, so they never contain the endpoint URL (its path or query
/// may hold a token); callers name the endpoint with
/// [`outbox_queue::endpoint_origin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The peer answered 2xx.
    Delivered {
        /// The status.
        status: u16,
    },
    /// Worth retrying: 408, 429, 5xx, a timeout or a connection failure.
    Retry(String),
    /// Will not succeed: another 4xx, a redirect, a refused address, a bad URL or secret.
    Permanent(String),
}

/// True for addresses a public webhook must not reach: loopback, private,
/// link-local, shared (CGNAT), benchmarking, documentation, reserved,
/// multicast and unspecified ranges, and IPv6 addresses that embed an IPv4
/// address (mapped, compatible, NAT64, 6to4) whose IPv4 part is internal.
#[must_use]
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || a >= 240 // reserved
                || (a == 100 && (64..=127).contains(&b)) // shared address space (CGNAT)
                || (a == 198 && (b == 18 || b == 19)) // benchmarking
                || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_ipv4(v6) {
                return is_internal(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local
                || (first & 0xffc0) == 0xfe80 // link local
                || (first & 0xffc0) == 0xfec0 // site local (deprecated)
                || first == 0x2001 && v6.segments()[1] == 0x0db8 // documentation
        }
    }
}

/// The IPv4 address an IPv6 address carries, for the forms that route to it:
/// IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64
/// (`64:ff9b::/96`, `64:ff9b:1::/48`) and 6to4 (`2002::/16`).
fn embedded_ipv4(v6: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    let s = v6.segments();
    let from = |hi: u16, lo: u16| {
        std::net::Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1) {
        return Some(from(s[6], s[7])); // IPv4-compatible (not :: or ::1)
    }
    if s[0] == 0x0064 && s[1] == 0xff9b {
        return Some(from(s[6], s[7])); // NAT64
    }
    if s[0] == 0x2002 {
        return Some(from(s[1], s[2])); // 6to4
    }
    None
}

/// A resolver that drops internal addresses, so a hostname cannot smuggle a
/// request to an internal service (the check happens on the addresses
/// actually connected to, which also defeats DNS rebinding).
struct GuardedResolver;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> =
                addrs.into_iter().filter(|a| !is_internal(a.ip())).collect();
            if public.is_empty() {
                return Err(format!("{host} resolves only to internal addresses; refused").into());
            }
            Ok(Box::new(public.into_iter()) as Addrs)
        })
    }
}

/// Sends signed JSON to peers.
#[derive(Clone)]
pub struct Deliverer {
    client: reqwest::Client,
    settings: DeliverySettings,
}

impl Deliverer {
    /// A deliverer with its own connection pool.
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built (TLS initialisation).
    pub fn new(settings: DeliverySettings) -> Result<Self, reqwest::Error> {
        let mut builder = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            // A proxy from the environment would resolve targets itself and
            // bypass the address guard below.
            .no_proxy()
            .user_agent(concat!("outbox-webhooks/", env!("CARGO_PKG_VERSION")));
        if !settings.allow_private_addresses {
            builder = builder.dns_resolver(Arc::new(GuardedResolver));
        }
        Ok(Self {
            client: builder.build()?,
            settings,
        })
    }

    /// POSTs `body` as JSON to `url`, signed with `secret` under message id
    /// `id` (Standard Webhooks headers), and classifies the outcome. The
    /// reasons of the verdict never contain `url`.
    pub async fn deliver(
        &self,
        url: &str,
        secret: &str,
        id: &str,
        body: &impl Serialize,
    ) -> Delivery {
        let parsed = match url::Url::parse(url) {
            Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => parsed,
            Ok(parsed) => {
                return Delivery::Permanent(format!(
                    "unsupported URL scheme {:?}",
                    parsed.scheme()
                ));
            }
            Err(e) => return Delivery::Permanent(format!("invalid URL: {e}")),
        };
        if !self.settings.allow_private_addresses
            && let Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) = parsed.host()
        {
            let ip = match parsed.host() {
                Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
                Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
                _ => return Delivery::Permanent("unreachable".into()),
            };
            if is_internal(ip) {
                return Delivery::Permanent(format!("{ip} is an internal address; refused"));
            }
        }
        let payload = match serde_json::to_vec(body) {
            Ok(payload) => payload,
            Err(e) => return Delivery::Permanent(format!("cannot encode body: {e}")),
        };
        let timestamp = chrono::Utc::now().timestamp();
        let signature = match sign(secret, id, timestamp, &payload) {
            Ok(signature) => signature,
            Err(e) => return Delivery::Permanent(e.to_string()),
        };
        let request = self
            .client
            .post(parsed)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(payload);
        match request.send().await {
            Ok(response) => classify(response.status().as_u16()),
            Err(e) if e.is_timeout() => {
                Delivery::Retry(format!("timed out after {:?}", self.settings.timeout))
            }
            Err(e) => {
                // reqwest names the full URL in its message; leave it out.
                let text = outbox_queue::redact_urls_in(&error_chain(&e.without_url()));
                if text.contains("internal addresses; refused") {
                    Delivery::Permanent(text)
                } else {
                    Delivery::Retry(text)
                }
            }
        }
    }
}

/// The verdict for an HTTP status.
#[must_use]
pub fn classify(status: u16) -> Delivery {
    match status {
        200..=299 => Delivery::Delivered { status },
        408 | 425 | 429 | 500..=599 => Delivery::Retry(format!("peer answered {status}")),
        300..=399 => Delivery::Permanent(format!(
            "peer answered {status}; redirects are not followed"
        )),
        _ => Delivery::Permanent(format!("peer answered {status}")),
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        assert_eq!(classify(204), Delivery::Delivered { status: 204 });
        for retry in [408, 429, 500, 502, 503] {
            assert!(matches!(classify(retry), Delivery::Retry(_)), "{retry}");
        }
        for permanent in [301, 400, 401, 404, 410, 422] {
            assert!(
                matches!(classify(permanent), Delivery::Permanent(_)),
                "{permanent}"
            );
        }
    }

    #[test]
    fn internal_addresses_are_recognised() {
        for internal in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fc00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_internal(internal.parse().unwrap()), "{internal}");
        }
        for public in [
            "93.184.216.34",
            "2606:4700::1111",
            "8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(!is_internal(public.parse().unwrap()), "{public}");
        }
    }

    #[tokio::test]
    async fn reasons_never_contain_the_endpoint_url() {
        let deliverer = Deliverer::new(DeliverySettings {
            allow_private_addresses: true,
            connect_timeout: Duration::from_secs(2),
            ..DeliverySettings::default()
        })
        .unwrap();
        // A port nobody listens on: the connection is refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        for url in [
            format!("http://{closed}/hook/tok-9f8e7d?token=tok-9f8e7d"),
            "http://hooks example.com/tok-9f8e7d".to_owned(),
            "ftp://u:tok-9f8e7d@example.com/tok-9f8e7d".to_owned(),
        ] {
            let verdict = deliverer
                .deliver(&url, "secret", "id", &serde_json::json!({}))
                .await;
            let (Delivery::Retry(reason) | Delivery::Permanent(reason)) = &verdict else {
                panic!("{url}: {verdict:?}");
            };
            assert!(!reason.contains("tok-9f8e7d"), "{reason}");
        }
    }

    #[tokio::test]
    async fn internal_targets_are_refused_without_a_request() {
        let deliverer = Deliverer::new(DeliverySettings::default()).unwrap();
        let verdict = deliverer
            .deliver(
                "http://127.0.0.1:9/hook",
                "secret",
                "id",
                &serde_json::json!({}),
            )
            .await;
        assert!(
            matches!(&verdict, Delivery::Permanent(reason) if reason.contains("internal")),
            "{verdict:?}"
        );
        let verdict = deliverer
            .deliver(
                "http://localhost:9/hook",
                "secret",
                "id",
                &serde_json::json!({}),
            )
            .await;
        assert!(
            matches!(&verdict, Delivery::Permanent(reason) if reason.contains("internal")),
            "{verdict:?}"
        );
        let verdict = deliverer
            .deliver(
                "ftp://example.com/x",
                "secret",
                "id",
                &serde_json::json!({}),
            )
            .await;
        assert!(matches!(verdict, Delivery::Permanent(_)));
    }
}
