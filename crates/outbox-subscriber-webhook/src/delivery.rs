//! Signed HTTP delivery with timeouts, an address guard and a verdict per
//! response: success, retry, or permanent failure.

use std::time::Duration;

use outbox_http_guard::{AddressPolicy, GuardError, GuardedClient};
use outbox_trace::TraceContext;
use serde::Serialize;
use tracing::Instrument;

use crate::sign;

/// How deliveries are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliverySettings {
    /// Whole-request timeout.
    pub timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Which internal addresses ([`outbox_http_guard::is_internal`]:
    /// loopback, private, link-local…) deliveries may reach.
    /// [`AddressPolicy::PublicOnly`] by default: anything else lets a
    /// tenant aim webhooks at what it allows.
    /// [`AddressPolicy::AllowListed`] allows the hosts and ranges of an
    /// [`AllowList`](outbox_http_guard::AllowList);
    /// [`AddressPolicy::AllowInternal`] allows every internal address
    /// (tests, the demo).
    pub address_policy: AddressPolicy,
}

impl DeliverySettings {
    /// Default of `timeout` (`WEBHOOK_TIMEOUT_MS`).
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
}

/// `WEBHOOK_TIMEOUT_MS`: [`DeliverySettings::timeout`].
pub const WEBHOOK_TIMEOUT_MS: outbox_env::Whole = outbox_env::Whole {
    name: "WEBHOOK_TIMEOUT_MS",
    default: outbox_env::millis(DeliverySettings::DEFAULT_TIMEOUT),
    min: 100,
    max: outbox_env::MAX_MILLIS,
    meaning: "per-delivery HTTP timeout of webhooks and plugin calls, in ms",
};

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            timeout: Self::DEFAULT_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
            address_policy: AddressPolicy::PublicOnly,
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

/// Sends signed JSON to peers.
#[derive(Clone)]
pub struct Deliverer {
    client: GuardedClient,
    settings: DeliverySettings,
}

impl Deliverer {
    /// A deliverer with its own connection pool.
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built (TLS initialisation).
    pub fn new(settings: DeliverySettings) -> Result<Self, reqwest::Error> {
        let client = GuardedClient::with_builder(settings.address_policy.clone(), |builder| {
            builder
                .timeout(settings.timeout)
                .connect_timeout(settings.connect_timeout)
                .user_agent(concat!("outbox-webhooks/", env!("CARGO_PKG_VERSION")))
        })?;
        Ok(Self { client, settings })
    }

    /// POSTs `body` as JSON to `url`, signed with `secret` under message id
    /// `id` (Standard Webhooks headers), and classifies the outcome. The
    /// reasons of the verdict never contain `url`.
    ///
    /// The request runs in an `outbox.http.request` span (a child of the
    /// job's span) and carries the W3C `traceparent` (and `tracestate`) of
    /// that span, or of the context passed on when the process has no
    /// OpenTelemetry layer, so the receiver can continue the trace.
    pub async fn deliver(
        &self,
        url: &str,
        secret: &str,
        id: &str,
        body: &impl Serialize,
    ) -> Delivery {
        let span = tracing::info_span!(
            "outbox.http.request",
            otel.kind = "client",
            http.request.method = "POST",
            server.origin = %outbox_queue::endpoint_origin(url),
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let verdict = self
            .send(url, secret, id, body)
            .instrument(span.clone())
            .await;
        if !matches!(verdict, Delivery::Delivered { .. }) {
            span.record("otel.status_code", "ERROR");
        }
        verdict
    }

    async fn send(&self, url: &str, secret: &str, id: &str, body: &impl Serialize) -> Delivery {
        let parsed = match url::Url::parse(url) {
            Ok(parsed) => parsed,
            Err(e) => return Delivery::Permanent(format!("invalid URL: {e}")),
        };
        // The scheme and an IP-literal host are checked here; a host name
        // when it is resolved, on the address connected to.
        let request = match self.client.request(reqwest::Method::POST, parsed) {
            Ok(request) => request,
            Err(refused) => return Delivery::Permanent(refused.to_string()),
        };
        let payload = match serde_json::to_vec(body) {
            Ok(payload) => payload,
            Err(e) => return Delivery::Permanent(format!("cannot encode body: {e}")),
        };
        let timestamp = chrono::Utc::now().timestamp();
        let signature = match sign(secret, id, timestamp, &payload) {
            Ok(signature) => signature,
            Err(e) => return Delivery::Permanent(e.to_string()),
        };
        let request = request
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(payload);
        let request = match TraceContext::current() {
            Some(trace) => trace.headers().fold(request, |request, (name, value)| {
                request.header(name, value)
            }),
            None => request,
        };
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                tracing::Span::current().record("http.response.status_code", status);
                classify(status)
            }
            Err(e) if e.is_timeout() => {
                Delivery::Retry(format!("timed out after {:?}", self.settings.timeout))
            }
            Err(e) => {
                // reqwest names the full URL in its message; leave it out.
                let refused = GuardError::find(&e).is_some();
                let text = outbox_queue::redact_urls_in(&error_chain(&e.without_url()));
                if refused {
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

    // The reason operators read says why a redirect failed for good.
    #[test]
    fn a_redirect_fails_for_good_saying_redirects_are_not_followed() {
        for status in [301, 302, 307, 308] {
            assert_eq!(
                classify(status),
                Delivery::Permanent(format!(
                    "peer answered {status}; redirects are not followed"
                ))
            );
        }
        assert_eq!(
            classify(404),
            Delivery::Permanent("peer answered 404".to_owned())
        );
    }

    // The settings show; the HTTP client does not.
    #[test]
    fn a_deliverer_debugs_as_its_settings() {
        let deliverer = Deliverer::new(DeliverySettings::default()).unwrap();
        assert_eq!(
            format!("{deliverer:?}"),
            format!(
                "Deliverer {{ settings: {:?}, .. }}",
                DeliverySettings::default()
            )
        );
    }

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

    /// A peer that takes the request and never answers: the attempt ends
    /// at the timeout, is retried, and says so in the reason operators
    /// read (`last_error`, the logs).
    // Break checked: the `is_timeout()` guard made `false` gives reqwest's
    // own error chain instead of "timed out after 200ms" and fails here.
    #[tokio::test]
    async fn a_peer_that_never_answers_is_retried_with_the_timeout_as_the_reason() {
        let deliverer = Deliverer::new(DeliverySettings {
            address_policy: AddressPolicy::AllowInternal,
            timeout: Duration::from_millis(200),
            ..DeliverySettings::default()
        })
        .unwrap();
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", silent.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut connections = Vec::new();
            while let Ok((stream, _)) = silent.accept().await {
                connections.push(stream);
            }
        });
        let verdict = deliverer
            .deliver(&url, "whsec_c2VjcmV0", "msg_1", &serde_json::json!({}))
            .await;
        held.abort();
        assert_eq!(verdict, Delivery::Retry("timed out after 200ms".to_owned()));
    }

    #[tokio::test]
    async fn reasons_never_contain_the_endpoint_url() {
        let deliverer = Deliverer::new(DeliverySettings {
            address_policy: AddressPolicy::AllowInternal,
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

    /// The verdict on a delivery to the sink's `/hook`, addressed by
    /// `host` (`localhost`, `[::ffff:127.0.0.1]`…).
    async fn deliver_to_sink(
        deliverer: &Deliverer,
        sink: &outbox_test_support::HttpSink,
        host: &str,
    ) -> Delivery {
        let url = format!("http://{host}:{}/hook", sink.port());
        deliverer
            .deliver(&url, "secret", "id", &serde_json::json!({}))
            .await
    }

    #[tokio::test]
    async fn internal_targets_get_no_request_unless_private_addresses_are_allowed() {
        let sink = outbox_test_support::HttpSink::start().await;
        let guarded = Deliverer::new(DeliverySettings::default()).unwrap();
        for (host, reason) in [
            // A name: refused on the resolution the connection would use.
            (
                "localhost",
                "localhost resolves only to internal addresses; refused \
                 (list the name in OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS to allow it)",
            ),
            (
                "127.0.0.1",
                "127.0.0.1 is an internal address; refused \
                 (list it or its range in OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS to allow it)",
            ),
            (
                "[::ffff:127.0.0.1]",
                "::ffff:127.0.0.1 is an internal address; refused \
                 (list it or its range in OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS to allow it)",
            ),
        ] {
            let verdict = deliver_to_sink(&guarded, &sink, host).await;
            let Delivery::Permanent(text) = &verdict else {
                panic!("{host}: {verdict:?}");
            };
            assert!(text.ends_with(reason), "{host}: {text}");
        }
        assert!(sink.requests().is_empty());

        let open = Deliverer::new(DeliverySettings {
            address_policy: AddressPolicy::AllowInternal,
            ..DeliverySettings::default()
        })
        .unwrap();
        for host in ["localhost", "127.0.0.1"] {
            let verdict = deliver_to_sink(&open, &sink, host).await;
            assert_eq!(verdict, Delivery::Delivered { status: 200 }, "{host}");
        }
        let received = sink.requests_to("/hook");
        assert_eq!(received.len(), 2);
        assert_eq!(received[0].header("webhook-id"), Some("id"));
    }
}
