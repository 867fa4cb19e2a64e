//! The W3C trace context (`traceparent`, `tracestate`) of an outbox event,
//! from the publishing transaction to every side effect.
//!
//! The publisher stores the context of the span it runs in with the row
//! ([`TraceContext::current`]); a plain-SQL producer may write the
//! `traceparent` column itself. The dispatcher reads it back
//! ([`TraceContext::parse`]), makes its own span a child of it
//! ([`continue_trace`]) and puts that span's context into the job envelope;
//! each subscriber does the same for the job's span, and outgoing HTTP
//! requests carry it as headers ([`TraceContext::headers`]). One trace then
//! shows commit, hand-off, job and side effect.
//!
//! Spans are `tracing` spans. Whether they become OpenTelemetry spans (and
//! have ids to propagate) is the process's choice: with a
//! `tracing-opentelemetry` layer (of the version this crate uses) they do;
//! without one, the context a process received is passed on unchanged (see
//! [`continue_trace`]), so a worker that exports nothing does not break the
//! chain between the processes around it.
//!
//! The format is W3C Trace Context level 1 whatever propagator a process has
//! installed: the column and header names say so. This crate holds no
//! exporter and no SDK; the worker binaries install those.

mod context;
mod lenient;

pub use context::{TRACEPARENT_HEADER, TRACESTATE_HEADER, TraceContext, continue_trace, within};
pub use lenient::deserialize_lenient;
