//! [`NewOutboxEvent`] and its validation into a row.

use chrono::{DateTime, Utc};
use outbox_model::{
    EventType, MAX_ORDERING_KEY_CHARS, MAX_PAYLOAD_BYTES, NewOutboxEventRow, Priority,
};
use serde_json::Value;
use uuid::Uuid;

use diesel::pg::data_types::PgInterval;

use crate::dedupe::MAX_DEDUPE_WINDOW;
use crate::{Dedupe, PublishError};

/// The deepest nesting of arrays and objects a payload may have, the payload
/// object itself being level 1.
///
/// Every reader of an event parses it with `serde_json`, which stops at 128
/// levels: the dispatcher reading the row, the workers reading the job
/// envelope (the payload one level down), webhook receivers reading
/// `{"data": <payload>}`. 100 leaves room for such envelopes; real events
/// stay far below it. The limit also keeps the publisher's own walk over the
/// payload, and serializing it, off deep recursion.
pub const MAX_PAYLOAD_DEPTH: usize = 100;

/// An event to publish. Only `tenant_id`, `event_type` and `payload` are
/// required; see [`NewOutboxEvent::new`].
#[derive(Debug, Clone, PartialEq)]
pub struct NewOutboxEvent {
    /// The tenant the event belongs to; must not be empty or contain NUL.
    pub tenant_id: String,
    /// `<domain>.<entity>.<verb>[.<more>]`, validated by [`EventType`].
    pub event_type: String,
    /// A JSON object of at most 1 MiB serialized, nested at most
    /// [`MAX_PAYLOAD_DEPTH`] levels, with no NUL character (`\u0000`) in
    /// any string or key.
    pub payload: Value,
    /// Producer idempotency key: a second event with the same key is not
    /// written; the first one's id is returned instead. Must not contain NUL.
    pub dispatch_key: Option<String>,
    /// Not dispatched before this instant; `None` means now.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// How long the dispatch key deduplicates; needs a dispatch key unless
    /// it is the default [`Dedupe::UntilDeleted`].
    pub dedupe: Dedupe,
    /// Replace mode: when a PENDING event of the same tenant and event
    /// type holds the dispatch key, its payload (and `scheduled_at`, when
    /// this event has one) is updated instead of this event being skipped
    /// ([`PublishOutcome::Replaced`](crate::PublishOutcome::Replaced)).
    /// Needs a dispatch key.
    pub replace_pending: bool,
    /// Claim and fetch order among due events; [`Priority::NORMAL`] unless set.
    pub priority: Priority,
    /// Ordering key: events with the same key reach their handler one at
    /// a time, in the order their transactions committed (see
    /// [`NewOutboxEvent::ordering_key`]). Not empty, no NUL, at most
    /// [`MAX_ORDERING_KEY_CHARS`] characters.
    pub ordering_key: Option<String>,
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
            dedupe: Dedupe::UntilDeleted,
            replace_pending: false,
            priority: Priority::NORMAL,
            ordering_key: None,
        }
    }

    /// Sets the producer idempotency key.
    #[must_use]
    pub fn dispatch_key(mut self, key: impl Into<String>) -> Self {
        self.dispatch_key = Some(key.into());
        self
    }

    /// Orders the event within `key`: events with the same key reach their
    /// handler one at a time, in the order their transactions committed,
    /// across dispatchers, worker crashes, retries and replays; events of
    /// other keys (and unordered ones) never wait for them.
    ///
    /// A second transaction that writes an event of the same key waits for
    /// the first one's commit or rollback (the key's row lock), so keep
    /// keys fine-grained (an order, an account), not one key for
    /// everything.
    ///
    /// ```
    /// use outbox_publish::{NewOutboxEvent, PublishError};
    /// use serde_json::json;
    ///
    /// let event = NewOutboxEvent::new("t1", "shop.order.paid", json!({"order": 7}))
    ///     .ordering_key("order-7");
    /// assert!(event.validate().is_ok());
    /// assert!(matches!(
    ///     NewOutboxEvent::new("t1", "shop.order.paid", json!({})).ordering_key("").validate(),
    ///     Err(PublishError::EmptyOrderingKey)
    /// ));
    /// ```
    #[must_use]
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Delays dispatch until `at`.
    #[must_use]
    pub fn scheduled_at(mut self, at: DateTime<Utc>) -> Self {
        self.scheduled_at = Some(at);
        self
    }

    /// Sets how long the dispatch key deduplicates (see [`Dedupe`]).
    #[must_use]
    pub fn dedupe(mut self, window: Dedupe) -> Self {
        self.dedupe = window;
        self
    }

    /// Replace mode: while the event holding the dispatch key is still
    /// PENDING (not claimed yet) and of the same tenant and event type, it
    /// takes this event's payload, and this event's `scheduled_at` when it
    /// has one, and publishing returns
    /// [`PublishOutcome::Replaced`](crate::PublishOutcome::Replaced) with
    /// its id. A holder that is PROCESSING, DONE, FAILED or CANCELLED (or
    /// of another tenant or type) is left as it is:
    /// [`PublishOutcome::Duplicate`](crate::PublishOutcome::Duplicate). The
    /// holder keeps its id, trace context and dedupe window. Without a
    /// holder the event is written as usual.
    ///
    /// A replaced holder stays locked until the transaction ends (a
    /// dispatcher's claim skips it until then, so keep the transaction
    /// short); a holder left alone is not locked.
    ///
    /// ```
    /// use outbox_publish::NewOutboxEvent;
    ///
    /// // The latest search-index state wins while the update waits.
    /// let update = NewOutboxEvent::new("t1", "search.product.updated", serde_json::json!({"name": "v2"}))
    ///     .dispatch_key("product-7-index")
    ///     .replace_pending();
    /// assert!(update.validate().is_ok());
    /// ```
    #[must_use]
    pub fn replace_pending(mut self) -> Self {
        self.replace_pending = true;
        self
    }

    /// Sets the priority: once due, the event is claimed before due events
    /// of lower priority, and its job is fetched before theirs by the
    /// workers of its queue. A value from elsewhere (a request, a
    /// setting) becomes a [`Priority`] with `Priority::try_from`, which
    /// refuses anything outside -2 to 2.
    ///
    /// # Example
    ///
    /// ```
    /// use outbox_publish::{NewOutboxEvent, Priority, PublishError};
    /// use serde_json::json;
    ///
    /// let reset = NewOutboxEvent::new("t1", "mail.user.password-reset", json!({"to": "a@b.c"}))
    ///     .priority(Priority::HIGHEST);
    /// assert_eq!(reset.priority, Priority::HIGHEST);
    ///
    /// fn from_request(level: i16) -> Result<NewOutboxEvent, PublishError> {
    ///     Ok(NewOutboxEvent::new("t1", "mail.user.newsletter", json!({}))
    ///         .priority(Priority::try_from(level)?))
    /// }
    /// assert!(matches!(
    ///     from_request(5),
    ///     Err(PublishError::PriorityOutOfRange(e)) if e.value == 5
    /// ));
    /// ```
    #[must_use]
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Checks the event against every rule of the publisher, in the order
    /// of the crate documentation's table, without touching a database:
    /// tenant id, event type, dispatch key, ordering key, then the payload (an object; no
    /// NUL in any string or key; at most [`MAX_PAYLOAD_DEPTH`] levels; at
    /// most [`outbox_model::MAX_PAYLOAD_BYTES`] serialized). The publishing
    /// functions run exactly this before any SQL; call it to refuse an event
    /// early, e.g. in a request handler.
    ///
    /// The payload is walked without recursion, so any nesting is refused
    /// rather than overflowing the stack (dropping such a value recursively
    /// is another matter: the publisher drops refused payloads one container
    /// at a time).
    ///
    /// # Errors
    ///
    /// The first rule broken, as a validation variant of [`PublishError`].
    ///
    /// # Example
    ///
    /// ```
    /// use outbox_publish::{NewOutboxEvent, PublishError};
    /// use serde_json::json;
    ///
    /// assert!(NewOutboxEvent::new("t1", "mail.user.welcome", json!({"to": "a@b.c"})).validate().is_ok());
    /// assert!(matches!(
    ///     NewOutboxEvent::new("t1", "mail.user.welcome", json!({"name": "a\0b"})).validate(),
    ///     Err(PublishError::PayloadStringContainsNul { path }) if path == "/name"
    /// ));
    /// ```
    pub fn validate(&self) -> Result<(), PublishError> {
        validate(
            &self.tenant_id,
            &self.event_type,
            &self.payload,
            self.dispatch_key.as_deref(),
            self.ordering_key.as_deref(),
        )?;
        self.check_dedupe().map(|_| ())
    }

    /// The dedupe columns, or why the window or replace mode is refused.
    fn check_dedupe(&self) -> Result<(Option<PgInterval>, bool), PublishError> {
        let needs_key = if self.replace_pending {
            Some("replace_pending")
        } else if self.dedupe != Dedupe::UntilDeleted {
            Some("a dedupe window")
        } else {
            None
        };
        if let Some(setting) = needs_key
            && self.dispatch_key.is_none()
        {
            return Err(PublishError::DedupeWithoutDispatchKey { setting });
        }
        self.dedupe
            .columns()
            .ok_or(PublishError::DedupeWindowOutOfRange {
                window: self.dedupe,
                max: MAX_DEDUPE_WINDOW,
            })
    }

    /// Validates the event and gives it a fresh UUIDv7.
    ///
    /// A refused event's payload is dropped without recursion, so a payload
    /// nested too deep to drop recursively cannot overflow the stack here.
    pub(crate) fn into_row(self) -> Result<NewOutboxEventRow, PublishError> {
        if let Err(e) = self.validate() {
            drop_without_recursion(self.payload);
            return Err(e);
        }
        let (dedupe_for, dedupe_while_pending) = self.check_dedupe()?;
        let Self {
            tenant_id,
            event_type,
            payload,
            dispatch_key,
            scheduled_at,
            dedupe: _,
            replace_pending,
            priority,
            ordering_key,
        } = self;
        Ok(NewOutboxEventRow {
            id: Uuid::now_v7(),
            tenant_id,
            event_type,
            payload,
            dispatch_key,
            scheduled_at,
            traceparent: None,
            tracestate: None,
            dedupe_for,
            dedupe_while_pending,
            replace_pending,
            priority,
            ordering_key,
        })
    }
}

/// Every rule of the publisher, in the order they are checked. No SQL runs
/// before all of them pass.
fn validate(
    tenant_id: &str,
    event_type: &str,
    payload: &Value,
    dispatch_key: Option<&str>,
    ordering_key: Option<&str>,
) -> Result<(), PublishError> {
    if tenant_id.is_empty() {
        return Err(PublishError::EmptyTenantId);
    }
    if let Some(position) = tenant_id.find('\0') {
        return Err(PublishError::TenantIdContainsNul { position });
    }
    // The event type's character rule already refuses NUL.
    EventType::parse(event_type)?;
    if let Some(position) = dispatch_key.and_then(|key| key.find('\0')) {
        return Err(PublishError::DispatchKeyContainsNul { position });
    }
    check_ordering_key(ordering_key)?;
    if !payload.is_object() {
        return Err(PublishError::PayloadNotObject {
            found: json_kind(payload),
        });
    }
    // Before the size: serializing to count the bytes recurses, so the depth
    // must be known to be bounded first.
    check_payload_contents(payload)?;
    let size = serialized_len(payload);
    if size > MAX_PAYLOAD_BYTES {
        return Err(PublishError::PayloadTooLarge {
            size,
            max: MAX_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// The ordering key's rules (the table's CHECK constraint repeats them).
fn check_ordering_key(key: Option<&str>) -> Result<(), PublishError> {
    let Some(key) = key else {
        return Ok(());
    };
    if key.is_empty() {
        return Err(PublishError::EmptyOrderingKey);
    }
    if let Some(position) = key.find('\0') {
        return Err(PublishError::OrderingKeyContainsNul { position });
    }
    let chars = key.chars().count();
    if chars > MAX_ORDERING_KEY_CHARS {
        return Err(PublishError::OrderingKeyTooLong {
            chars,
            max: MAX_ORDERING_KEY_CHARS,
        });
    }
    Ok(())
}

/// How a value was reached from its parent: an array index or an object key.
#[derive(Clone, Copy)]
enum Step<'a> {
    Index(usize),
    Key(&'a str),
}

/// The members of one array or object still to visit.
enum Members<'a> {
    Array(std::iter::Enumerate<std::slice::Iter<'a, Value>>),
    Object(serde_json::map::Iter<'a>),
}

impl<'a> Members<'a> {
    fn of(value: &'a Value) -> Option<Self> {
        match value {
            Value::Array(items) => Some(Self::Array(items.iter().enumerate())),
            Value::Object(map) => Some(Self::Object(map.iter())),
            _ => None,
        }
    }

    fn next(&mut self) -> Option<(Step<'a>, &'a Value)> {
        match self {
            Self::Array(items) => items.next().map(|(i, v)| (Step::Index(i), v)),
            Self::Object(members) => members.next().map(|(k, v)| (Step::Key(k.as_str()), v)),
        }
    }
}

/// Walks the payload without recursion: refuses a NUL in any string or key
/// (Postgres `jsonb` cannot store `\u0000`) and nesting deeper than
/// [`MAX_PAYLOAD_DEPTH`]. Allocates nothing unless it refuses.
fn check_payload_contents(payload: &Value) -> Result<(), PublishError> {
    if let Value::String(text) = payload
        && text.contains('\0')
    {
        return Err(PublishError::PayloadStringContainsNul {
            path: String::new(),
        });
    }
    let Some(root) = Members::of(payload) else {
        return Ok(());
    };
    // One entry per open container: the step that led into it (none for the
    // root) and its members still to visit. Its length is the depth.
    let mut open: Vec<(Option<Step<'_>>, Members<'_>)> = vec![(None, root)];
    while let Some((_, members)) = open.last_mut() {
        let Some((step, value)) = members.next() else {
            open.pop();
            continue;
        };
        if let Step::Key(key) = step
            && key.contains('\0')
        {
            return Err(PublishError::PayloadKeyContainsNul {
                path: pointer(&open, step),
            });
        }
        match value {
            Value::String(text) if text.contains('\0') => {
                return Err(PublishError::PayloadStringContainsNul {
                    path: pointer(&open, step),
                });
            }
            Value::Array(_) | Value::Object(_) => {
                if open.len() >= MAX_PAYLOAD_DEPTH {
                    return Err(PublishError::PayloadTooDeep {
                        max: MAX_PAYLOAD_DEPTH,
                    });
                }
                if let Some(members) = Members::of(value) {
                    open.push((Some(step), members));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The JSON Pointer (RFC 6901) of the value reached by `last` from the
/// innermost open container.
fn pointer(open: &[(Option<Step<'_>>, Members<'_>)], last: Step<'_>) -> String {
    let mut path = String::new();
    for step in open.iter().filter_map(|(step, _)| *step).chain([last]) {
        path.push('/');
        match step {
            Step::Index(i) => path.push_str(&i.to_string()),
            Step::Key(key) => path.push_str(&key.replace('~', "~0").replace('/', "~1")),
        }
    }
    path
}

/// Drops `value` one container at a time: the default drop recurses once
/// per level and would overflow the stack on a deep enough value.
pub(crate) fn drop_without_recursion(value: Value) {
    let mut pending = vec![value];
    while let Some(mut value) = pending.pop() {
        match &mut value {
            Value::Array(items) => pending.append(items),
            Value::Object(map) => {
                pending.extend(std::mem::take(map).into_iter().map(|(_, v)| v));
            }
            _ => {}
        }
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

    /// An object nested `levels` deep, the outermost object being level 1.
    fn nested(levels: usize) -> Value {
        // Built by hand: `json!` would copy `value` through serde, recursively.
        let mut value = Value::Object(serde_json::Map::new());
        for _ in 1..levels {
            let mut outer = serde_json::Map::new();
            outer.insert("a".to_owned(), value);
            value = Value::Object(outer);
        }
        value
    }

    #[test]
    fn nul_paths_are_json_pointers() {
        let nul_at = |payload: Value| match check_payload_contents(&payload) {
            Err(PublishError::PayloadStringContainsNul { path }) => ("string", path),
            Err(PublishError::PayloadKeyContainsNul { path }) => ("key", path),
            other => panic!("expected a NUL refusal, got {other:?}"),
        };
        assert_eq!(nul_at(json!({ "a": "x\0" })), ("string", "/a".into()));
        assert_eq!(
            nul_at(json!({ "a/b": [1, { "c~d": ["ok", "\0"] }] })),
            ("string", "/a~1b/1/c~0d/1".into())
        );
        assert_eq!(
            nul_at(json!({ "ok": {}, "list": [{ "k\0": 1 }] })),
            ("key", "/list/0/k\u{0}".into())
        );
        assert_eq!(nul_at(json!("\0")), ("string", String::new()));
        check_payload_contents(&json!({ "fine": ["\\u0000 as text", { "x": null }] })).unwrap();
    }

    #[test]
    fn depth_counts_the_payload_object_as_level_one() {
        check_payload_contents(&nested(MAX_PAYLOAD_DEPTH)).unwrap();
        assert!(matches!(
            check_payload_contents(&nested(MAX_PAYLOAD_DEPTH + 1)),
            Err(PublishError::PayloadTooDeep {
                max: MAX_PAYLOAD_DEPTH
            })
        ));
        // Arrays are levels too: {"a": [ <object nested n deep> ]} is n + 2 deep.
        check_payload_contents(&json!({ "a": [nested(MAX_PAYLOAD_DEPTH - 2)] })).unwrap();
        assert!(matches!(
            check_payload_contents(&json!({ "a": [nested(MAX_PAYLOAD_DEPTH - 1)] })),
            Err(PublishError::PayloadTooDeep { .. })
        ));
    }

    #[test]
    fn an_ordering_key_of_exactly_the_limit_is_accepted_and_one_more_is_refused() {
        let at_limit = "é".repeat(MAX_ORDERING_KEY_CHARS);
        assert!(check_ordering_key(Some(&at_limit)).is_ok());
        let over = "é".repeat(MAX_ORDERING_KEY_CHARS + 1);
        assert!(matches!(
            check_ordering_key(Some(&over)),
            Err(PublishError::OrderingKeyTooLong { chars, max })
                if chars == MAX_ORDERING_KEY_CHARS + 1 && max == MAX_ORDERING_KEY_CHARS
        ));
    }

    #[test]
    fn arrays_nested_too_deep_to_drop_recursively_are_dropped_one_at_a_time() {
        // Deep enough that the default, recursive drop overflows the stack.
        let mut value = Value::Array(Vec::new());
        for _ in 1..500_000 {
            value = Value::Array(vec![value]);
        }
        drop_without_recursion(value);
    }

    #[test]
    fn a_payload_too_deep_to_drop_recursively_is_refused_and_dropped() {
        // Deep enough that a recursive walk or drop would overflow the stack.
        let event = NewOutboxEvent::new("t", "mail.user.welcome", nested(500_000));
        assert!(matches!(
            event.into_row(),
            Err(PublishError::PayloadTooDeep { .. })
        ));
    }
}
