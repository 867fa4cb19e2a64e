//! What the idempotency guard decided while a handler ran.
//!
//! `outbox_idempotency::with_outbox_idempotency` runs in a span named
//! `outbox_idempotency` and records its verdict in the span's `outcome`
//! field (`ran`, `cached`, `in_progress`, …). [`Verdicts`] is a tracing
//! layer that collects those verdicts for the run it watches, so the kit
//! reports a delivery the guard skipped without a hook of its own in the
//! guard. The kit's tests pin the span and field names.

use std::sync::{Arc, Mutex, PoisonError};

use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Id, Record};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The span the guard runs in.
const GUARD_SPAN: &str = "outbox_idempotency";
/// Its field holding the verdict.
const OUTCOME_FIELD: &str = "outcome";
/// The verdict of a delivery the guard recognised as handled before.
pub(crate) const CACHED: &str = "cached";

/// The verdicts the guard recorded, in order.
#[derive(Clone, Default)]
pub(crate) struct Verdicts(Arc<Mutex<Vec<String>>>);

impl Verdicts {
    /// The verdicts recorded so far.
    pub fn recorded(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<S> Layer<S> for Verdicts
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if ctx.span(id).is_some_and(|span| span.name() == GUARD_SPAN) {
            values.record(&mut Outcome(&self.0));
        }
    }
}

/// Reads the `outcome` field of a record.
struct Outcome<'a>(&'a Mutex<Vec<String>>);

impl Visit for Outcome<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == OUTCOME_FIELD {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(value.to_owned());
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}
