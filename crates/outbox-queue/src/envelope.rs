//! The job body every dispatched event becomes.

use chrono::{DateTime, Utc};
use outbox_model::{OutboxEvent, Priority, RawJson};
use outbox_trace::TraceContext;
use serde::{Deserialize, Deserializer, Serialize};
use uuid::Uuid;

/// The JSON body of the apalis job for one outbox event (the contract's
/// envelope). Field names are part of the contract; unknown fields are
/// ignored so that producers can add fields before consumers know them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxJob {
    /// The outbox row's id; also the receivers' idempotency key.
    pub outbox_event_id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The event type.
    pub event_type: String,
    /// The payload, a JSON object, as the exact text the row holds: numbers
    /// keep their digits and nesting its depth (see [`RawJson`]).
    pub payload: RawJson,
    /// The producer's dispatch key, if any.
    pub dispatch_key: Option<String>,
    /// When the event was recorded.
    pub created_at: DateTime<Utc>,
    /// The delivery generation: 0 for the first delivery (then the field is
    /// left out of the body, which is the contract's envelope), n after the
    /// n-th operator replay.
    #[serde(default, skip_serializing_if = "is_first_generation")]
    pub generation: u32,
    /// The W3C trace context the job's span continues: the dispatcher's
    /// hand-off span, whose parent is the producer's span (the row's
    /// `traceparent`). Left out of the body when there is none; a missing,
    /// malformed or invalid one reads as `None`, never as an undecodable job.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "outbox_trace::deserialize_lenient"
    )]
    pub trace_context: Option<TraceContext>,
    /// The event's ordering key (`outbox_publish::NewOutboxEvent::ordering_key`):
    /// the worker runs the handler of an ordered job only after every
    /// earlier event of the key, and records its completion. Left out of
    /// the body of an unordered event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// The event's position within its ordering key (1, 2, 3, …); left out
    /// with the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_position: Option<i64>,
    /// The event's priority: the job waits in its level's list, which the
    /// workers of the queue read before (positive) or after (negative) the
    /// normal jobs. Left out of the body when normal; a missing or invalid
    /// one reads as normal, never as an undecodable job.
    #[serde(
        default,
        skip_serializing_if = "is_normal",
        deserialize_with = "deserialize_priority_lenient"
    )]
    pub priority: Priority,
}

fn is_normal(priority: &Priority) -> bool {
    priority.is_normal()
}

/// Reads a job's `priority` field leniently: a value that is not one of the
/// five levels reads as [`Priority::NORMAL`], so that a scheduling hint can
/// never make a job undecodable (for `#[serde(deserialize_with = ...)]`).
///
/// # Errors
///
/// Only when the input is not JSON at all.
pub fn deserialize_priority_lenient<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Priority, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(value
        .as_i64()
        .and_then(|v| i16::try_from(v).ok())
        .and_then(|v| Priority::try_from(v).ok())
        .unwrap_or_default())
}

fn is_first_generation(generation: &u32) -> bool {
    *generation == 0
}

impl OutboxJob {
    /// The envelope of a stored event.
    #[must_use]
    pub fn from_event(event: &OutboxEvent) -> Self {
        Self {
            outbox_event_id: event.id,
            tenant_id: event.tenant_id.clone(),
            event_type: event.event_type.clone(),
            payload: event.payload.clone(),
            dispatch_key: event.dispatch_key.clone(),
            created_at: event.created_at,
            generation: u32::try_from(event.generation).unwrap_or(0),
            trace_context: stored_trace_context(event),
            priority: event.priority,
            ordering_key: event.ordering_key.clone(),
            ordering_position: event.ordering_position,
        }
    }

    /// The deterministic task id of this job, see [`generation_task_id`].
    #[must_use]
    pub fn task_id(&self) -> String {
        generation_task_id(self.outbox_event_id, self.generation)
    }

    /// The id receivers derive their idempotency keys from, see [`delivery_id`].
    #[must_use]
    pub fn delivery_id(&self) -> String {
        delivery_id(self.outbox_event_id, self.generation)
    }
}

/// Where an ordered event's job stands in its ordering key: the
/// envelope's `ordering_key`, `ordering_position` and `generation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOrdering {
    /// The ordering key.
    pub key: String,
    /// The event's position within the key, from 1.
    pub position: i64,
    /// The delivery generation (above 0 for an operator's replay).
    pub generation: u32,
}

/// The ordering fields of an envelope; read apart so that nothing else of
/// the body can hide them.
#[derive(Deserialize)]
struct OrderingFields {
    #[serde(default)]
    ordering_key: Option<String>,
    #[serde(default)]
    ordering_position: Option<i64>,
    #[serde(default)]
    generation: u32,
}

impl JobOrdering {
    /// The ordering of a job body, when it is an ordered event's envelope
    /// (a JSON object with both `ordering_key` and `ordering_position`);
    /// `None` for any other body. What the worker's ordering step and
    /// the operator's put-back of dead jobs read.
    ///
    /// ```
    /// use outbox_queue::JobOrdering;
    ///
    /// let body = br#"{"ordering_key":"order-7","ordering_position":3,"generation":1}"#;
    /// assert_eq!(
    ///     JobOrdering::of_body(body),
    ///     Some(JobOrdering { key: "order-7".into(), position: 3, generation: 1 })
    /// );
    /// assert_eq!(JobOrdering::of_body(b"{}"), None);
    /// assert_eq!(JobOrdering::of_body(br#"["order-7", 3]"#), None);
    /// ```
    #[must_use]
    pub fn of_body(raw: &[u8]) -> Option<Self> {
        // Serde also reads a struct from a JSON array, by position: only
        // an object has named fields.
        if raw
            .iter()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            != Some(&b'{')
        {
            return None;
        }
        let fields = serde_json::from_slice::<OrderingFields>(raw).ok()?;
        Some(Self {
            key: fields.ordering_key?,
            position: fields.ordering_position?,
            generation: fields.generation,
        })
    }
}

/// The trace context stored with an event (by the publisher, or by a
/// plain-SQL producer), if it is a valid one.
#[must_use]
pub fn stored_trace_context(event: &OutboxEvent) -> Option<TraceContext> {
    TraceContext::parse(event.traceparent.as_deref()?, event.tracestate.as_deref())
}

/// The id of one delivery generation of an event: the event id for
/// generation 0, `<event id>:g<n>` for the n-th replay. Receivers build
/// their idempotency keys (`email:<delivery id>`, `webhook:<delivery
/// id>:<endpoint>`, …) and message ids from it, so a replay runs each side
/// effect once more and a redelivery within a generation does not.
///
/// ```
/// let id = uuid::Uuid::nil();
/// assert_eq!(outbox_queue::delivery_id(id, 0), "00000000-0000-0000-0000-000000000000");
/// assert_eq!(outbox_queue::delivery_id(id, 2), "00000000-0000-0000-0000-000000000000:g2");
/// ```
#[must_use]
pub fn delivery_id(event_id: Uuid, generation: u32) -> String {
    if generation == 0 {
        event_id.to_string()
    } else {
        format!("{event_id}:g{generation}")
    }
}

/// The task id of generation `generation` of an event's job:
/// `outbox:<delivery id>` ([`task_id`] for generation 0).
///
/// ```
/// let id = uuid::Uuid::nil();
/// assert_eq!(outbox_queue::generation_task_id(id, 0), outbox_queue::task_id(id));
/// assert_eq!(
///     outbox_queue::generation_task_id(id, 1),
///     "outbox:00000000-0000-0000-0000-000000000000:g1"
/// );
/// ```
#[must_use]
pub fn generation_task_id(event_id: Uuid, generation: u32) -> String {
    format!("{OUTBOX_TASK_PREFIX}{}", delivery_id(event_id, generation))
}

/// `outbox:<event id>`: the apalis task id of an event's job. Pushing the
/// same id twice never makes a second job (the push script uses `HSETNX` on
/// the queue's data hash), which is what makes a re-claim after a crash safe.
///
/// ```
/// let id = uuid::Uuid::nil();
/// assert_eq!(outbox_queue::task_id(id), "outbox:00000000-0000-0000-0000-000000000000");
/// ```
#[must_use]
pub fn task_id(event_id: Uuid) -> String {
    format!("{OUTBOX_TASK_PREFIX}{event_id}")
}

/// How the task id of an event's own job begins (`outbox:<delivery id>`);
/// [`crate::event_of_task`] reads ids back by it.
pub(crate) const OUTBOX_TASK_PREFIX: &str = "outbox:";

#[cfg(test)]
mod tests {
    use super::*;

    fn stored_event(traceparent: Option<&str>, tracestate: Option<&str>) -> OutboxEvent {
        let at = DateTime::from_timestamp(0, 0).unwrap();
        OutboxEvent {
            id: Uuid::nil(),
            tenant_id: "acme".into(),
            event_type: "audit.user.login".into(),
            payload: RawJson::from_text("{}").unwrap(),
            dispatch_key: None,
            status: outbox_model::OutboxStatus::Processing,
            retries: 0,
            scheduled_at: at,
            locked_until: None,
            processed_at: None,
            last_error: None,
            target_queue: None,
            created_at: at,
            failed_at: None,
            generation: 0,
            traceparent: traceparent.map(str::to_owned),
            tracestate: tracestate.map(str::to_owned),
            unrouted_since: None,
            dedupe_for: None,
            dedupe_while_pending: false,
            released_dispatch_key: None,
            priority: outbox_model::Priority::NORMAL,
            ordering_key: None,
            ordering_position: None,
            ordering_blocked: false,
        }
    }

    // Break checked: `stored_trace_context` returning `None` fails here (the
    // job would start a new trace instead of continuing the producer's).
    #[test]
    fn a_job_carries_the_trace_context_its_producer_stored_and_drops_a_malformed_one() {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let job = OutboxJob::from_event(&stored_event(Some(traceparent), Some("vendor=1")));
        let context = job.trace_context.expect("the stored trace context");
        assert_eq!(context.traceparent(), traceparent);
        assert_eq!(context.tracestate(), Some("vendor=1"));
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        for stored in [None, Some("not a traceparent")] {
            assert_eq!(
                OutboxJob::from_event(&stored_event(stored, None)).trace_context,
                None,
                "{stored:?}"
            );
        }
    }

    #[test]
    fn envelope_has_the_contract_fields() {
        let job = OutboxJob {
            outbox_event_id: Uuid::nil(),
            tenant_id: "t".into(),
            event_type: "mail.user.welcome".into(),
            payload: RawJson::from_text(r#"{"to":"a@b.c","n":123456789012345678901234567}"#)
                .unwrap(),
            dispatch_key: None,
            created_at: DateTime::from_timestamp(0, 0).unwrap(),
            generation: 0,
            trace_context: None,
            priority: Priority::NORMAL,
            ordering_key: None,
            ordering_position: None,
        };
        let value = serde_json::to_value(&job).unwrap();
        let mut keys: Vec<_> = value.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "created_at",
                "dispatch_key",
                "event_type",
                "outbox_event_id",
                "payload",
                "tenant_id"
            ]
        );
        let text = serde_json::to_string(&job).unwrap();
        assert!(
            text.contains(r#""payload":{"to":"a@b.c","n":123456789012345678901234567}"#),
            "the payload is carried as its exact text: {text}"
        );
        assert_eq!(serde_json::from_str::<OutboxJob>(&text).unwrap(), job);
        let replayed = OutboxJob {
            generation: 3,
            ..job.clone()
        };
        let text = serde_json::to_string(&replayed).unwrap();
        assert!(text.contains(r#""generation":3"#), "{text}");
        assert_eq!(serde_json::from_str::<OutboxJob>(&text).unwrap(), replayed);
        assert_eq!(
            replayed.task_id(),
            "outbox:00000000-0000-0000-0000-000000000000:g3"
        );
        // What receivers build their idempotency keys and message ids from.
        assert_eq!(
            replayed.delivery_id(),
            "00000000-0000-0000-0000-000000000000:g3"
        );
        assert_eq!(job.delivery_id(), "00000000-0000-0000-0000-000000000000");
        assert!(serde_json::from_str::<OutboxJob>("{\"outbox_event_id\": 1}").is_err());

        let traced = OutboxJob {
            trace_context: TraceContext::parse(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                None,
            ),
            ..job.clone()
        };
        let text = serde_json::to_string(&traced).unwrap();
        assert!(
            text.contains(r#""trace_context":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<OutboxJob>(&text).unwrap(), traced);
        // A context nobody can continue does not cost the job.
        let text = text.replace("00f067aa0ba902b7", "not-a-span-id");
        assert_eq!(serde_json::from_str::<OutboxJob>(&text).unwrap(), job);

        let urgent = OutboxJob {
            priority: Priority::HIGHEST,
            ..job.clone()
        };
        let text = serde_json::to_string(&urgent).unwrap();
        assert!(text.ends_with(r#","priority":2}"#), "{text}");
        assert_eq!(serde_json::from_str::<OutboxJob>(&text).unwrap(), urgent);
        // A level out of range costs the job nothing: it runs as normal.
        let text = text.replace(r#""priority":2"#, r#""priority":9"#);
        assert_eq!(serde_json::from_str::<OutboxJob>(&text).unwrap(), job);
    }
}
