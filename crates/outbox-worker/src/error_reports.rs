//! Error reports to Sentry, where teams already look.
//!
//! With `SENTRY_DSN` set, every error-level log line of a process becomes a
//! Sentry event: an event no rule routes, a row FAILED after its last
//! hand-off retry, a job moved to the dead set (with its reason), a worker
//! that failed; panics are reported too. Each event carries as tags the
//! outbox event id, tenant, queue, task id and attempt of the row or job it
//! concerns (from the log line's fields and the job's span), and a
//! `trace_id` tag where the job's span has one. Every text that reaches
//! Sentry (message, tags, fields, exception values) first goes through
//! [`outbox_queue::redact_urls_in`], so passwords in connection URLs and the
//! paths and queries of endpoint URLs never leave the process. Without
//! `SENTRY_DSN` nothing is installed and nothing changes.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use outbox_queue::redact_urls_in;
use sentry::protocol::{Event, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::ConfigError;

/// The variable that turns error reports on: a Sentry DSN.
pub const SENTRY_DSN_VARIABLE: &str = "SENTRY_DSN";

/// `SENTRY_DSN` ([`SENTRY_DSN_VARIABLE`]), read by [`start_error_reports`].
pub const SENTRY_DSN: outbox_env::Text = outbox_env::Text {
    name: SENTRY_DSN_VARIABLE,
    default: "unset (no error reports)",
    form: "a Sentry DSN",
    meaning: "where error-level log lines and panics are reported, with ids as tags and secrets redacted",
};

/// Log fields that become Sentry tags, and the tag each becomes.
const TAGS: &[(&str, &str)] = &[
    ("event_id", "outbox.event_id"),
    ("tenant_id", "tenant"),
    ("queue", "queue"),
    ("task_id", "task_id"),
    ("attempt", "attempt"),
    ("trace_id", "trace_id"),
];

/// Keeps error reports on while it lives; dropping it sends what is
/// pending (up to the client's shutdown timeout).
#[must_use = "error reports stop when the guard is dropped"]
pub struct ErrorReports {
    client: Option<sentry::ClientInitGuard>,
}

impl ErrorReports {
    /// Whether reports go anywhere.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.client.is_some()
    }
}

/// Starts error reports when `SENTRY_DSN` (read through `get`) is set and
/// not empty; `binary` becomes the release's name.
///
/// # Errors
///
/// A [`ConfigError`] naming `SENTRY_DSN` when it is not a DSN.
pub fn start_error_reports(
    get: &dyn Fn(&str) -> Option<String>,
    binary: &'static str,
) -> Result<ErrorReports, ConfigError> {
    let Some(value) = SENTRY_DSN.read(get) else {
        return Ok(ErrorReports { client: None });
    };
    let dsn: sentry::types::Dsn = value.trim().parse().map_err(|e| {
        SENTRY_DSN.refuse(
            outbox_queue::redact_url(&value),
            format!("not a Sentry DSN ({e})"),
        )
    })?;
    let mut options = sentry::ClientOptions::new();
    options.dsn = Some(dsn);
    options.release = Some(format!("{binary}@{}", env!("CARGO_PKG_VERSION")).into());
    options.before_send = Some(Arc::new(|mut event| {
        redact_event(&mut event);
        Some(event)
    }));
    let client = sentry::init(options);
    Ok(ErrorReports {
        client: Some(client),
    })
}

/// The tracing layer that turns error-level events into Sentry events, when
/// a Sentry client is bound (see [`start_error_reports`]).
#[must_use]
pub fn error_report_layer() -> Option<ErrorReportLayer> {
    sentry::Hub::main()
        .client()
        .is_some()
        .then_some(ErrorReportLayer)
}

/// See [`error_report_layer`].
#[derive(Debug, Clone, Copy)]
pub struct ErrorReportLayer;

/// Field values by name, as text.
#[derive(Debug, Default)]
struct Fields(BTreeMap<&'static str, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
}

impl<S> Layer<S> for ErrorReportLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if *event.metadata().level() != Level::ERROR {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        // The job's or row's identity: the line's own fields first, then
        // those of its spans, innermost first.
        let mut found = BTreeMap::new();
        for (field, _) in TAGS {
            if let Some(value) = fields.0.get(field) {
                found.insert(*field, value.clone());
            }
        }
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(span_fields) = span.extensions().get::<Fields>() {
                    for (field, _) in TAGS {
                        if let Some(value) = span_fields.0.get(field) {
                            found.entry(*field).or_insert_with(|| value.clone());
                        }
                    }
                }
            }
        }
        let message = fields.0.remove("message");
        let tags = TAGS
            .iter()
            .filter_map(|(field, tag)| Some(((*tag).to_owned(), found.remove(field)?)))
            .collect();
        let extra = fields
            .0
            .into_iter()
            .filter(|(name, _)| !TAGS.iter().any(|(field, _)| field == name))
            .map(|(name, value)| (name.to_owned(), Value::String(value)))
            .collect();
        sentry::capture_event(Event {
            level: sentry::Level::Error,
            logger: Some(event.metadata().target().to_owned()),
            message,
            tags,
            extra,
            ..Event::default()
        });
    }
}

/// Redacts every text of `event` that may hold a URL.
fn redact_event(event: &mut Event<'static>) {
    if let Some(message) = &mut event.message {
        *message = redact_urls_in(message);
    }
    for value in event.tags.values_mut() {
        *value = redact_urls_in(value);
    }
    for value in event.extra.values_mut() {
        if let Value::String(text) = value {
            *text = redact_urls_in(text);
        }
    }
    for exception in event.exception.values.iter_mut() {
        if let Some(value) = &mut exception.value {
            *value = redact_urls_in(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_or_empty_dsn_reports_nothing_and_a_bad_one_is_refused() {
        let none = start_error_reports(&|_| None, "worker-general").unwrap();
        assert!(!none.enabled());
        let empty = start_error_reports(&|_| Some(" ".into()), "worker-general").unwrap();
        assert!(!empty.enabled());
        let bad = start_error_reports(&|_| Some("not a dsn".into()), "worker-general")
            .err()
            .unwrap();
        assert_eq!(bad.variable, SENTRY_DSN_VARIABLE);
    }

    #[test]
    fn urls_lose_their_secrets_in_every_text_of_an_event() {
        let mut event = Event {
            message: Some("cannot reach postgres://app:hunter2@db/x".into()),
            ..Event::default()
        };
        event.tags.insert(
            "queue".into(),
            "https://hooks.example/t/secret-token".into(),
        );
        event.extra.insert(
            "error".into(),
            Value::String("redis://:hunter2@cache:6379".into()),
        );
        redact_event(&mut event);
        let text = format!("{:?} {:?} {:?}", event.message, event.tags, event.extra);
        assert!(
            !text.contains("hunter2") && !text.contains("secret-token"),
            "{text}"
        );
        assert!(text.contains("postgres://app:***@db/x"), "{text}");
    }
}
