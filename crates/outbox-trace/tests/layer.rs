//! With a `tracing-opentelemetry` layer: a continued span is a child of the
//! carried context, the context captured inside it is its own, and a span
//! without a carried context starts a new trace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use outbox_trace::{TraceContext, continue_trace};
use tracing_subscriber::layer::SubscriberExt;

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn a_continued_span_is_a_child_of_the_carried_context() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let parent = TraceContext::parse(PARENT, Some("vendor=x")).unwrap();

    let (continued, inside, fresh) = tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("continued");
        let continued = continue_trace(&span, Some(&parent)).unwrap();
        let inside = span.in_scope(TraceContext::current).unwrap();
        drop(span);
        let fresh = continue_trace(&tracing::info_span!("fresh"), None).unwrap();
        (continued, inside, fresh)
    });

    assert_eq!(continued.trace_id(), parent.trace_id());
    assert_ne!(
        continued.traceparent(),
        parent.traceparent(),
        "its own span id"
    );
    assert_eq!(continued.tracestate(), Some("vendor=x"));
    assert_eq!(inside, continued);
    assert_ne!(fresh.trace_id(), parent.trace_id());

    let spans = exporter.get_finished_spans().unwrap();
    let span = spans.iter().find(|s| s.name == "continued").unwrap();
    assert_eq!(span.parent_span_id, parent.span_context().span_id());
    assert!(span.parent_span_is_remote);
    let span = spans.iter().find(|s| s.name == "fresh").unwrap();
    assert_eq!(span.parent_span_id, SpanId::INVALID);
}
