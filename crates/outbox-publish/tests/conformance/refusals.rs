//! Every refusal an event can get, with the error it gets: the same for
//! every driver.

use outbox_model::{EventTypeError, MAX_PAYLOAD_BYTES};
use std::time::Duration;

use outbox_publish::{Dedupe, MAX_DEDUPE_WINDOW, MAX_PAYLOAD_DEPTH, NewOutboxEvent, PublishError};
use serde_json::{Value, json};

/// An object nested `levels` deep, the outermost being level 1. Built by
/// hand: `json!` would copy the inner value through serde, recursively.
pub fn nested(levels: usize) -> Value {
    let mut value = Value::Object(serde_json::Map::new());
    for _ in 1..levels {
        let mut outer = serde_json::Map::new();
        outer.insert("a".to_owned(), value);
        value = Value::Object(outer);
    }
    value
}

/// One refusal of the publisher: an event it must refuse, and the error.
pub struct Refusal {
    pub rule: &'static str,
    pub event: NewOutboxEvent,
    pub expected: fn(&PublishError) -> bool,
}

/// Every refusal an event can get. (`NotInTransaction`, a refusal of the
/// diesel handle rather than of an event, is tests/publish.rs'
/// `publishing_outside_a_transaction_is_refused`; an `sqlx::Transaction`
/// is open by construction.)
pub fn refusals() -> Vec<Refusal> {
    let event = |tenant: &str, event_type: &str, payload: Value| {
        NewOutboxEvent::new(tenant, event_type, payload)
    };
    let ty = "audit.file.uploaded";
    // Just over the limit once serialized: {"blob":"xxx…"} is 11 bytes + the string.
    let oversized = json!({ "blob": "x".repeat(MAX_PAYLOAD_BYTES - 10) });
    vec![
        Refusal {
            rule: "empty tenant",
            event: event("", ty, json!({})),
            expected: |e| matches!(e, PublishError::EmptyTenantId),
        },
        Refusal {
            rule: "NUL in the tenant",
            event: event("acme\0", ty, json!({})),
            expected: |e| matches!(e, PublishError::TenantIdContainsNul { position: 4 }),
        },
        Refusal {
            rule: "event type breaks the naming rule",
            event: event("acme", "Audit.file.uploaded", json!({})),
            expected: |e| {
                matches!(
                    e,
                    PublishError::InvalidEventType(EventTypeError::Uppercase { .. })
                )
            },
        },
        Refusal {
            rule: "NUL in the event type",
            event: event("acme", "audit.file\0.uploaded", json!({})),
            expected: |e| {
                matches!(
                    e,
                    PublishError::InvalidEventType(EventTypeError::InvalidCharacter {
                        ch: '\0',
                        position: 10
                    })
                )
            },
        },
        Refusal {
            rule: "NUL in the dispatch key",
            event: event("acme", ty, json!({})).dispatch_key("upload-\0-7"),
            expected: |e| matches!(e, PublishError::DispatchKeyContainsNul { position: 7 }),
        },
        Refusal {
            rule: "empty ordering key",
            event: event("acme", ty, json!({})).ordering_key(""),
            expected: |e| matches!(e, PublishError::EmptyOrderingKey),
        },
        Refusal {
            rule: "NUL in the ordering key",
            event: event("acme", ty, json!({})).ordering_key("order-\0-7"),
            expected: |e| matches!(e, PublishError::OrderingKeyContainsNul { position: 6 }),
        },
        Refusal {
            rule: "ordering key over 255 characters",
            event: event("acme", ty, json!({})).ordering_key("é".repeat(256)),
            expected: |e| {
                matches!(
                    e,
                    PublishError::OrderingKeyTooLong {
                        chars: 256,
                        max: 255
                    }
                )
            },
        },
        Refusal {
            rule: "a dedupe window without a dispatch key",
            event: event("acme", ty, json!({})).dedupe(Dedupe::WhilePending),
            expected: |e| {
                matches!(
                    e,
                    PublishError::DedupeWithoutDispatchKey {
                        setting: "a dedupe window"
                    }
                )
            },
        },
        Refusal {
            rule: "replace mode without a dispatch key",
            event: event("acme", ty, json!({})).replace_pending(),
            expected: |e| {
                matches!(
                    e,
                    PublishError::DedupeWithoutDispatchKey {
                        setting: "replace_pending"
                    }
                )
            },
        },
        Refusal {
            rule: "an empty dedupe window",
            event: event("acme", ty, json!({}))
                .dispatch_key("k")
                .dedupe(Dedupe::For(Duration::ZERO)),
            expected: |e| {
                matches!(
                    e,
                    PublishError::DedupeWindowOutOfRange {
                        window: Dedupe::For(Duration::ZERO),
                        max: MAX_DEDUPE_WINDOW
                    }
                )
            },
        },
        Refusal {
            rule: "a dedupe window over the maximum",
            event: event("acme", ty, json!({}))
                .dispatch_key("k")
                .dedupe(Dedupe::For(MAX_DEDUPE_WINDOW * 2)),
            expected: |e| matches!(e, PublishError::DedupeWindowOutOfRange { .. }),
        },
        Refusal {
            rule: "payload is an array",
            event: event("acme", ty, json!([1, 2])),
            expected: |e| matches!(e, PublishError::PayloadNotObject { found: "an array" }),
        },
        Refusal {
            rule: "payload is a string",
            event: event("acme", ty, json!("text")),
            expected: |e| matches!(e, PublishError::PayloadNotObject { found: "a string" }),
        },
        Refusal {
            rule: "payload is a number",
            event: event("acme", ty, json!(3)),
            expected: |e| matches!(e, PublishError::PayloadNotObject { found: "a number" }),
        },
        Refusal {
            rule: "payload is null",
            event: event("acme", ty, json!(null)),
            expected: |e| matches!(e, PublishError::PayloadNotObject { found: "null" }),
        },
        Refusal {
            rule: "payload is a boolean",
            event: event("acme", ty, json!(true)),
            expected: |e| matches!(e, PublishError::PayloadNotObject { found: "a boolean" }),
        },
        Refusal {
            rule: "NUL in a string of the payload",
            event: event("acme", ty, json!({ "name": "report\0.pdf" })),
            expected: |e| matches!(e, PublishError::PayloadStringContainsNul { path } if path == "/name"),
        },
        Refusal {
            rule: "NUL in a string nested in arrays and objects",
            event: event(
                "acme",
                ty,
                json!({ "files": [{ "name": "a" }, { "name": "b", "tags/labels": ["ok", "\0"] }] }),
            ),
            expected: |e| matches!(e, PublishError::PayloadStringContainsNul { path } if path == "/files/1/tags~1labels/1"),
        },
        Refusal {
            rule: "NUL in a key of the payload",
            event: event("acme", ty, json!({ "na\0me": "report.pdf" })),
            expected: |e| matches!(e, PublishError::PayloadKeyContainsNul { path } if path == "/na\0me"),
        },
        Refusal {
            rule: "NUL in a nested key",
            event: event("acme", ty, json!({ "meta": { "tags": [{ "\0": 1 }] } })),
            expected: |e| matches!(e, PublishError::PayloadKeyContainsNul { path } if path == "/meta/tags/0/\0"),
        },
        Refusal {
            rule: "payload nested one level too deep",
            event: event("acme", ty, nested(MAX_PAYLOAD_DEPTH + 1)),
            expected: |e| matches!(e, PublishError::PayloadTooDeep { max } if *max == MAX_PAYLOAD_DEPTH),
        },
        Refusal {
            // Deep enough that a recursive walk (or drop) would overflow the stack.
            rule: "payload nested 200,000 levels deep",
            event: event("acme", ty, nested(200_000)),
            expected: |e| matches!(e, PublishError::PayloadTooDeep { .. }),
        },
        Refusal {
            rule: "payload over 1 MiB serialized",
            event: event("acme", ty, oversized),
            expected: |e| {
                matches!(e, PublishError::PayloadTooLarge { size, max }
                    if (*size, *max) == (MAX_PAYLOAD_BYTES + 1, MAX_PAYLOAD_BYTES))
            },
        },
    ]
}
