//! The trace context value: parsing, formatting, capture and continuation.

use std::str::FromStr;

use opentelemetry::Context;
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use serde::Serialize;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The HTTP header (and column, and envelope field) of the trace parent.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// The HTTP header (and column, and envelope field) of the vendor state.
pub const TRACESTATE_HEADER: &str = "tracestate";

/// The longest `tracestate` kept: what W3C asks every participant to pass
/// on at least. A longer one is dropped (the `traceparent` is kept).
const MAX_TRACESTATE_LEN: usize = 512;

/// A valid W3C trace context: a `traceparent` (version 00, lowercase, ids
/// not all zero) and an optional `tracestate`. Only [`TraceContext::parse`]
/// and the captures make one, so holding one means it is valid.
///
/// It serializes as `{"traceparent": "…", "tracestate": "…"}` (`tracestate`
/// left out when absent); read it back with [`crate::deserialize_lenient`],
/// which turns anything invalid into `None` instead of an error.
///
/// ```
/// use outbox_trace::TraceContext;
///
/// let cx = TraceContext::parse(
///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
///     Some("vendor=opaque"),
/// )
/// .unwrap();
/// assert_eq!(cx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(cx.tracestate(), Some("vendor=opaque"));
/// assert!(TraceContext::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None).is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct TraceContext {
    traceparent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
}

impl TraceContext {
    /// Reads a `traceparent` and `tracestate` as a producer wrote them
    /// (surrounding white space is ignored). `None` when `traceparent` is
    /// not valid: wrong shape, uppercase or non-hex digits, version `ff`,
    /// an all-zero trace or span id, or extra fields after version 00. A
    /// later version is read by its first four fields, as W3C asks, and
    /// passed on as version 00. Flags other than `sampled` are dropped. An
    /// invalid, empty or over-long `tracestate` is dropped alone.
    #[must_use]
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let (trace_id, span_id, flags) = parse_traceparent(traceparent.trim())?;
        let tracestate = tracestate
            .map(str::trim)
            .filter(|state| !state.is_empty() && state.len() <= MAX_TRACESTATE_LEN)
            .and_then(|state| TraceState::from_str(state).ok())
            .map(|state| state.header())
            .filter(|state| !state.is_empty());
        Some(Self {
            traceparent: format_traceparent(trace_id, span_id, flags),
            tracestate,
        })
    }

    /// The context of an OpenTelemetry span; `None` for an invalid one (no
    /// span, or a process without an OpenTelemetry layer).
    #[must_use]
    pub fn from_span_context(span_context: &SpanContext) -> Option<Self> {
        if !span_context.is_valid() {
            return None;
        }
        let state = span_context.trace_state().header();
        Some(Self {
            traceparent: format_traceparent(
                span_context.trace_id(),
                span_context.span_id(),
                span_context.trace_flags(),
            ),
            tracestate: (!state.is_empty()).then_some(state),
        })
    }

    /// The context of `span` as an OpenTelemetry span: `None` when the
    /// process has no `tracing-opentelemetry` layer, or the span is disabled.
    #[must_use]
    pub fn of_span(span: &tracing::Span) -> Option<Self> {
        let cx = span.context();
        Self::from_span_context(cx.span().span_context())
    }

    /// The context to record or send from here: the current `tracing`
    /// span's (see [`TraceContext::of_span`]), else the current
    /// OpenTelemetry context's (set by code that uses OpenTelemetry
    /// directly, or by [`continue_trace`]'s caller for a process that
    /// passes a context on without spans of its own); `None` without either.
    #[must_use]
    pub fn current() -> Option<Self> {
        Self::of_span(&tracing::Span::current()).or_else(|| {
            Context::map_current(|cx| Self::from_span_context(cx.span().span_context()))
        })
    }

    /// The `traceparent` value, e.g.
    /// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`.
    #[must_use]
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` value, if any.
    #[must_use]
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id: 32 lowercase hex digits, as trace viewers and log
    /// lines show it.
    #[must_use]
    pub fn trace_id(&self) -> &str {
        // `00-<32 hex>-…`: the canonical form `parse` and the captures write.
        &self.traceparent[3..35]
    }

    /// Whether the producer sampled (recorded) its span.
    #[must_use]
    pub fn is_sampled(&self) -> bool {
        self.traceparent.ends_with('1')
    }

    /// The span this context names, as a remote OpenTelemetry span context.
    #[must_use]
    pub fn span_context(&self) -> SpanContext {
        let (trace_id, span_id, flags) = parse_traceparent(&self.traceparent).unwrap_or((
            TraceId::INVALID,
            SpanId::INVALID,
            TraceFlags::default(),
        ));
        let state = self
            .tracestate
            .as_deref()
            .and_then(|state| TraceState::from_str(state).ok())
            .unwrap_or_default();
        SpanContext::new(trace_id, span_id, flags, true, state)
    }

    /// An OpenTelemetry context whose parent span is this one: what
    /// [`OpenTelemetrySpanExt::set_parent`] takes, and what a future is run
    /// in (`opentelemetry::context::FutureExt::with_context`) to pass this
    /// context on without spans of its own.
    #[must_use]
    pub fn otel_context(&self) -> Context {
        Context::new().with_remote_span_context(self.span_context())
    }

    /// Links `span` to the span this context names: for a span of another
    /// trace that this one caused or accompanied (an event's hand-off span,
    /// pushed in a batch, links to the batch's span).
    pub fn link_from(&self, span: &tracing::Span) {
        span.add_link(self.span_context());
    }

    /// The HTTP headers that carry this context: `traceparent`, and
    /// `tracestate` when there is one.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        std::iter::once((TRACEPARENT_HEADER, self.traceparent.as_str())).chain(
            self.tracestate
                .as_deref()
                .map(|state| (TRACESTATE_HEADER, state)),
        )
    }
}

/// Makes `span` (not entered yet) continue the trace of `parent`, and
/// returns the context to pass on from inside it.
///
/// With an OpenTelemetry layer, `span` becomes a child of `parent` (a new
/// root when `parent` is `None`), and the returned context is `span`'s own.
/// Without one, `span` has no OpenTelemetry identity and `parent` is
/// returned unchanged: run the span's work in `parent`'s
/// [`TraceContext::otel_context`] so that [`TraceContext::current`] finds
/// it there. The parent is set before anything enters the span; a span
/// already started keeps its parent.
pub fn continue_trace(span: &tracing::Span, parent: Option<&TraceContext>) -> Option<TraceContext> {
    if let Some(parent) = parent {
        // An error only says there is no layer, or the span is disabled:
        // then there is nothing to parent, and the context is passed on.
        let _ = span.set_parent(parent.otel_context());
    }
    TraceContext::of_span(span).or_else(|| parent.cloned())
}

/// Runs `future` with `context` as the current OpenTelemetry context (the
/// context current at the call when `None`): what a process without an
/// OpenTelemetry layer needs for [`TraceContext::current`] to find the
/// context it passes on (see [`continue_trace`]). With a layer, the spans
/// entered inside take precedence, as they should.
pub fn within<F: Future>(
    future: F,
    context: Option<&TraceContext>,
) -> impl Future<Output = F::Output> {
    let cx = context.map_or_else(Context::current, TraceContext::otel_context);
    future.with_context(cx)
}

/// `00-<trace id>-<span id>-<flags>` from its parts.
fn format_traceparent(trace_id: TraceId, span_id: SpanId, flags: TraceFlags) -> String {
    format!("00-{trace_id:032x}-{span_id:016x}-{:02x}", flags.to_u8())
}

/// Whether `text` is exactly `len` lowercase hex digits.
fn is_lower_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The ids and the sampled flag of a `traceparent`, by the W3C rules.
fn parse_traceparent(value: &str) -> Option<(TraceId, SpanId, TraceFlags)> {
    let mut fields = value.split('-');
    let (version, trace_id, span_id, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    if !is_lower_hex(version, 2) || version == "ff" {
        return None;
    }
    // Version 00 has exactly four fields; a later one may add fields after them.
    if version == "00" && fields.next().is_some() {
        return None;
    }
    if !is_lower_hex(trace_id, 32) || !is_lower_hex(span_id, 16) || !is_lower_hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((
        trace_id,
        span_id,
        TraceFlags::new(flags & TraceFlags::SAMPLED.to_u8()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn only_valid_traceparents_are_read() {
        let ok = [
            (PARENT, PARENT),
            (&format!("  {PARENT}\n"), PARENT),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            ),
            // Unknown flags are dropped, the sampled bit is kept.
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff",
                PARENT,
            ),
            // A later version: its first four fields, passed on as 00.
            (
                "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever",
                PARENT,
            ),
        ];
        for (given, read) in ok {
            let cx = TraceContext::parse(given, None).unwrap_or_else(|| panic!("{given:?}"));
            assert_eq!(cx.traceparent(), read, "{given:?}");
        }
        let refused = [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ];
        for given in refused {
            assert_eq!(TraceContext::parse(given, None), None, "{given:?}");
        }
    }

    #[test]
    fn a_bad_tracestate_is_dropped_alone() {
        let kept = TraceContext::parse(PARENT, Some(" a=1,b=2 ")).unwrap();
        assert_eq!(kept.tracestate(), Some("a=1,b=2"));
        for bad in [
            "",
            " ",
            "no equals sign",
            "A=1",
            &format!("a={}", "x".repeat(600)),
        ] {
            let cx = TraceContext::parse(PARENT, Some(bad)).unwrap();
            assert_eq!(cx.tracestate(), None, "{bad:?}");
            assert_eq!(cx.traceparent(), PARENT);
        }
    }

    #[test]
    fn the_parts_read_back_as_written() {
        let cx = TraceContext::parse(PARENT, Some("vendor=x")).unwrap();
        assert_eq!(cx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(cx.is_sampled());
        let span_context = cx.span_context();
        assert!(span_context.is_valid() && span_context.is_remote());
        assert_eq!(
            TraceContext::from_span_context(&span_context),
            Some(cx.clone())
        );
        assert_eq!(
            cx.headers().collect::<Vec<_>>(),
            [("traceparent", PARENT), ("tracestate", "vendor=x")]
        );
        let unsampled = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            None,
        )
        .unwrap();
        assert!(!unsampled.is_sampled());
        assert_eq!(unsampled.headers().count(), 1);
        assert_eq!(
            TraceContext::from_span_context(&SpanContext::empty_context()),
            None
        );
    }

    #[test]
    fn without_an_opentelemetry_layer_the_parent_is_passed_on() {
        let parent = TraceContext::parse(PARENT, None).unwrap();
        let span = tracing::info_span!("no layer");
        assert_eq!(continue_trace(&span, Some(&parent)), Some(parent.clone()));
        assert_eq!(continue_trace(&span, None), None);
        assert_eq!(TraceContext::current(), None);
        let _guard = parent.otel_context().attach();
        assert_eq!(TraceContext::current(), Some(parent));
    }
}
