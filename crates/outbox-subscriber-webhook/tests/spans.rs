//! The `outbox.http.request` span of a delivery to a real HTTP sink,
//! exported through `tracing-opentelemetry` to an in-memory exporter: its
//! OpenTelemetry status is an error exactly when the delivery failed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use opentelemetry::trace::{Status, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use outbox_subscriber_webhook::{AddressPolicy, Deliverer, Delivery, DeliverySettings};
use outbox_test_support::HttpSink;
use serde_json::json;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;

/// Delivers once to an HTTP sink that answers `code`, with an OpenTelemetry
/// layer over an in-memory exporter, and returns the verdict and the status
/// of the one `outbox.http.request` span exported.
async fn deliver_to_a_peer_answering(code: u16) -> (Delivery, Status) {
    let sink = HttpSink::start().await;
    sink.set_default("/hook", code);
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let deliverer = Deliverer::new(DeliverySettings {
        address_policy: AddressPolicy::AllowInternal,
        ..DeliverySettings::default()
    })
    .unwrap();

    let verdict = deliverer
        .deliver(
            &sink.url_for("/hook"),
            "s",
            "msg_span",
            &json!({ "type": "test" }),
        )
        .with_subscriber(subscriber)
        .await;
    provider.force_flush().unwrap();

    assert_eq!(
        sink.requests_to("/hook").len(),
        1,
        "the sink got the request"
    );
    let spans: Vec<_> = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|span| span.name == "outbox.http.request")
        .collect();
    assert_eq!(spans.len(), 1, "one outbox.http.request span for {code}");
    (verdict, spans[0].status.clone())
}

// Break checked: deleting the `!` in `if !matches!(verdict, Delivery::Delivered { .. })`
// fails with "the span of a delivery answered 200 is not an error, got Error { description: "" }".
#[tokio::test]
async fn a_failed_delivery_marks_its_http_span_as_an_error_and_a_delivered_one_does_not() {
    let (verdict, status) = deliver_to_a_peer_answering(200).await;
    assert_eq!(verdict, Delivery::Delivered { status: 200 });
    assert!(
        !matches!(status, Status::Error { .. }),
        "the span of a delivery answered 200 is not an error, got {status:?}"
    );

    let (verdict, status) = deliver_to_a_peer_answering(503).await;
    assert!(matches!(verdict, Delivery::Retry(_)), "{verdict:?}");
    assert!(
        matches!(status, Status::Error { .. }),
        "the span of a delivery answered 503 is an error, got {status:?}"
    );

    let (verdict, status) = deliver_to_a_peer_answering(410).await;
    assert!(matches!(verdict, Delivery::Permanent(_)), "{verdict:?}");
    assert!(
        matches!(status, Status::Error { .. }),
        "the span of a delivery answered 410 is an error, got {status:?}"
    );
}
