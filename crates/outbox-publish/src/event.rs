//! [`NewOutboxEvent`] and its validation into a row.

use chrono::{DateTime, Utc};
use outbox_model::{EventType, MAX_PAYLOAD_BYTES, NewOutboxEventRow};
use serde_json::Value;
use uuid::Uuid;

use crate::PublishError;

/// An event to publish. Only `tenant_id`, `event_type` and `payload` are
/// required; see [`NewOutboxEvent::new`].
#[derive(Debug, Clone, PartialEq)]
pub struct NewOutboxEvent {
    /// The tenant the event belongs to; must not be empty.
    pub tenant_id: String,
    /// `<domain>.<entity>.<verb>[.<more>]`, validated by [`EventType`].
    pub event_type: String,
    /// A JSON object of at most 1 MiB serialized.
    pub payload: Value,
    /// Producer idempotency key: a second event with the same key is not
    /// written; the first one's id is returned instead.
    pub dispatch_key: Option<String>,
    /// Not dispatched before this instant; `None` means now.
    pub scheduled_at: Option<DateTime<Utc>>,
}

impl NewOutboxEvent {
    /// An event due now, without a dispatch key.
    pub fn new(
        tenant_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: Value,
    ) -> Self {
        Self {
            tenant_id: tenant_id.into(),
            event_type: event_type.into(),
            payload,
            dispatch_key: None,
            scheduled_at: None,
        }
    }

    /// Sets the producer idempotency key.
    #[must_use]
    pub fn dispatch_key(mut self, key: impl Into<String>) -> Self {
        self.dispatch_key = Some(key.into());
        self
    }

    /// Delays dispatch until `at`.
    #[must_use]
    pub fn scheduled_at(mut self, at: DateTime<Utc>) -> Self {
        self.scheduled_at = Some(at);
        self
    }

    /// Validates the event and gives it a fresh UUIDv7.
    pub(crate) fn into_row(self) -> Result<NewOutboxEventRow, PublishError> {
        if self.tenant_id.is_empty() {
            return Err(PublishError::EmptyTenantId);
        }
        let event_type = EventType::parse(self.event_type)?;
        if !self.payload.is_object() {
            return Err(PublishError::PayloadNotObject {
                found: json_kind(&self.payload),
            });
        }
        let size = serialized_len(&self.payload);
        if size > MAX_PAYLOAD_BYTES {
            return Err(PublishError::PayloadTooLarge {
                size,
                max: MAX_PAYLOAD_BYTES,
            });
        }
        Ok(NewOutboxEventRow {
            id: Uuid::now_v7(),
            tenant_id: self.tenant_id,
            event_type: event_type.into_string(),
            payload: self.payload,
            dispatch_key: self.dispatch_key,
            scheduled_at: self.scheduled_at,
        })
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The serialized size of `value`, counted without allocating the text.
fn serialized_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a `Value` into an infallible writer cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_serialized_bytes() {
        let value = json!({"a": [1, 2, "x"]});
        assert_eq!(
            serialized_len(&value),
            serde_json::to_vec(&value).unwrap().len()
        );
    }

    #[test]
    fn rejects_before_sql() {
        let empty_tenant = NewOutboxEvent::new("", "mail.user.welcome", json!({}));
        assert!(matches!(
            empty_tenant.into_row(),
            Err(PublishError::EmptyTenantId)
        ));
        let array = NewOutboxEvent::new("t", "mail.user.welcome", json!([1]));
        assert!(matches!(
            array.into_row(),
            Err(PublishError::PayloadNotObject { found: "an array" })
        ));
    }
}
