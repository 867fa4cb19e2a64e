//! Property tests of the job envelope [`OutboxJob`]: decoding arbitrary
//! bytes never panics, and an envelope survives serialize → deserialize
//! exactly, its payload text byte for byte (numbers past 64 bits, long
//! decimals, deep nesting, any Unicode), with generation 0 left out of the
//! body and unknown fields ignored.

use std::collections::BTreeMap;

use chrono::DateTime;
use outbox_model::RawJson;
use outbox_queue::{OutboxJob, delivery_id, generation_task_id, task_id};
use proptest::prelude::*;
use serde_json::value::RawValue;
use uuid::Uuid;

// ----------------------------------------------------------------------------
// JSON text (the payload as the row holds it)
// ----------------------------------------------------------------------------

/// Optional JSON whitespace, mostly none.
fn ws() -> impl Strategy<Value = String> {
    prop_oneof![3 => Just(String::new()), 1 => "[ \\t\\n\\r]{1,3}"]
}

/// JSON numbers, many of which `serde_json::Value` cannot hold exactly:
/// integers past 64 bits (27 digits among them), long decimals, exponents
/// out of `f64` range.
fn json_number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        "-?[1-9][0-9]{18,30}",
        "-?[1-9][0-9]{26}",
        "-?(0|[1-9][0-9]{0,3})\\.[0-9]{15,40}",
        "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,5})?[eE][+-]?[0-9]{1,4}",
    ]
}

/// JSON string literals: raw Unicode (no control characters), every short
/// escape, `\u` escapes including lone surrogates.
fn json_string() -> impl Strategy<Value = String> {
    "\"([^\"\\\\\\x00-\\x1f]|\\\\[\"\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4}){0,12}\""
}

/// `[a, b, …]` with whitespace around the items.
fn array_of(items: Vec<(String, String, String)>, pad: String) -> String {
    let items: Vec<String> = items.into_iter().map(|(a, v, b)| a + &v + &b).collect();
    format!("[{pad}{}]", items.join(","))
}

/// `{"k": v, …}` with whitespace around the tokens.
fn object_of(
    members: Vec<(String, String, String, String, String, String)>,
    pad: String,
) -> String {
    let members: Vec<String> = members
        .into_iter()
        .map(|(a, k, b, c, v, d)| format!("{a}{k}{b}:{c}{v}{d}"))
        .collect();
    format!("{{{pad}{}}}", members.join(","))
}

/// Valid JSON text of any kind.
fn json_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop_oneof![Just("null"), Just("true"), Just("false")].prop_map(str::to_owned),
        json_number(),
        json_string(),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            (
                prop::collection::vec((ws(), inner.clone(), ws()), 0..5),
                ws()
            )
                .prop_map(|(items, pad)| array_of(items, pad)),
            (
                prop::collection::vec((ws(), json_string(), ws(), ws(), inner, ws()), 0..5),
                ws()
            )
                .prop_map(|(members, pad)| object_of(members, pad)),
        ]
    })
}

/// Arrays nested `depth` levels, built as text without recursion.
fn nested_arrays(depth: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A payload: a JSON object, sometimes holding arrays nested far deeper
/// than the 128 levels `serde_json::Value` accepts.
fn payload_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (prop::collection::vec((ws(), json_string(), ws(), ws(), json_value(), ws()), 0..6), ws())
            .prop_map(|(members, pad)| object_of(members, pad)),
        1 => (1usize..2_000, json_number())
            .prop_map(|(depth, n)| format!("{{\"deep\":{}}}", nested_arrays(depth, &n))),
    ]
}

// ----------------------------------------------------------------------------
// Envelopes
// ----------------------------------------------------------------------------

/// Text fields as producers may fill them: anything at all (quotes,
/// backslashes, control characters, NUL, any Unicode).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "\\PC{0,40}",
        "[\"\\\\/\\x00-\\x1f\\x7f a-z]{0,12}",
        Just(String::new()),
    ]
}

/// The fields of an envelope, before the payload text is wrapped.
#[derive(Debug, Clone)]
struct Parts {
    id: u128,
    tenant_id: String,
    event_type: String,
    payload: String,
    dispatch_key: Option<String>,
    /// Seconds and nanoseconds since the epoch, years 1 to 9999.
    created_at: (i64, u32),
    generation: u32,
}

fn parts() -> impl Strategy<Value = Parts> {
    (
        any::<u128>(),
        text(),
        prop_oneof![text(), "[a-z]{1,8}\\.[a-z]{1,8}\\.[a-z]{1,8}"],
        payload_text(),
        prop::option::of(text()),
        (-62_135_596_800i64..=253_402_300_799, 0u32..1_000_000_000),
        prop_oneof![Just(0u32), 1u32..=3, any::<u32>()],
    )
        .prop_map(
            |(id, tenant_id, event_type, payload, dispatch_key, created_at, generation)| Parts {
                id,
                tenant_id,
                event_type,
                payload,
                dispatch_key,
                created_at,
                generation,
            },
        )
}

fn job(parts: &Parts) -> Result<OutboxJob, TestCaseError> {
    let payload = RawJson::from_text(parts.payload.as_str())
        .map_err(|e| TestCaseError::fail(format!("generated payload {:?}: {e}", parts.payload)))?;
    let (secs, nanos) = parts.created_at;
    let created_at = DateTime::from_timestamp(secs, nanos)
        .ok_or_else(|| TestCaseError::fail(format!("no instant {secs}.{nanos}")))?;
    Ok(OutboxJob {
        outbox_event_id: Uuid::from_u128(parts.id),
        tenant_id: parts.tenant_id.clone(),
        event_type: parts.event_type.clone(),
        payload,
        dispatch_key: parts.dispatch_key.clone(),
        created_at,
        generation: parts.generation,
        trace_context: None,
        priority: outbox_model::Priority::NORMAL,
        ordering_key: None,
        ordering_position: None,
    })
}

/// The body's top-level members, each value as its text.
fn members(body: &[u8]) -> Result<BTreeMap<String, Box<RawValue>>, TestCaseError> {
    serde_json::from_slice(body).map_err(|e| TestCaseError::fail(format!("body: {e}")))
}

// ----------------------------------------------------------------------------
// Arbitrary bytes
// ----------------------------------------------------------------------------

/// Bytes that are often almost an envelope: a real body cut short, with one
/// byte changed or inserted, with a field of the wrong type, plus random
/// bytes and deep nesting.
fn body_like() -> impl Strategy<Value = Vec<u8>> {
    let body = || {
        parts().prop_filter_map("envelope", |parts| {
            job(&parts)
                .ok()
                .and_then(|job| serde_json::to_vec(&job).ok())
        })
    };
    prop_oneof![
        2 => (body(), any::<prop::sample::Index>(), any::<u8>(), 0u8..3).prop_map(
            |(mut body, at, byte, edit)| {
                let i = at.index(body.len() + 1);
                match edit {
                    0 => body.truncate(i),
                    1 => body.insert(i, byte),
                    _ => {
                        if let Some(b) = body.get_mut(i) {
                            *b = byte;
                        }
                    }
                }
                body
            }
        ),
        1 => (body(), prop::sample::select(vec![
            ("\"outbox_event_id\":\"", "\"outbox_event_id\":1,\"x\":\""),
            ("\"generation\":", "\"generation\":-"),
            ("\"generation\":", "\"generation\":1e"),
            ("\"payload\":", "\"payload\":\"\\u0000\",\"p\":"),
            ("\"created_at\":\"", "\"created_at\":\"+"),
            ("\"tenant_id\":", "\"tenant_id\":null,\"t\":"),
            ("\"dispatch_key\":", "\"dispatch_key\":[],\"d\":"),
            ("{", "{\"tenant_id\":\"twice\","),
        ])).prop_map(|(body, (from, to))| {
            String::from_utf8_lossy(&body).replacen(from, to, 1).into_bytes()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..256),
        1 => (1usize..3_000).prop_map(|depth| {
            format!("{{\"payload\":{}}}", nested_arrays(depth, "")).into_bytes()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// An envelope comes back equal after serialize → deserialize; its
    /// payload is in the body as the very same text; generation 0 is left
    /// out of the body (the contract's envelope) and reads back as 0.
    #[test]
    fn envelopes_round_trip_exactly(parts in parts()) {
        let job = job(&parts)?;
        let body = serde_json::to_vec(&job)?;
        let back: OutboxJob = serde_json::from_slice(&body)?;
        prop_assert_eq!(&back, &job);
        prop_assert_eq!(back.payload.get(), parts.payload.as_str());

        let members = members(&body)?;
        let payload = members.get("payload").map(|raw| raw.get());
        prop_assert_eq!(payload, Some(parts.payload.as_str()));
        let needle = format!("\"payload\":{}", parts.payload);
        prop_assert!(
            body.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "payload text not found verbatim in the body"
        );

        let generation = members.get("generation").map(|raw| raw.get().to_owned());
        if parts.generation == 0 {
            prop_assert_eq!(generation, None);
            prop_assert_eq!(back.generation, 0);
        } else {
            prop_assert_eq!(generation, Some(parts.generation.to_string()));
        }
        let mut keys: Vec<&str> = members.keys().map(String::as_str).collect();
        keys.retain(|k| *k != "generation");
        prop_assert_eq!(
            keys,
            ["created_at", "dispatch_key", "event_type", "outbox_event_id", "payload", "tenant_id"]
        );
    }

    /// Members a consumer does not know, anywhere in the body, are skipped
    /// whatever they hold (deep nesting included), and the body of an older
    /// producer without `generation` reads as the first delivery.
    #[test]
    fn unknown_fields_are_ignored(
        parts in parts(),
        extra in prop::collection::vec(("x-[a-z]{0,6}", json_value()), 1..4),
        deep in 1usize..1_000,
    ) {
        let job = job(&parts)?;
        let body = String::from_utf8(serde_json::to_vec(&job)?)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut fields = String::new();
        for (key, value) in &extra {
            fields.push_str(&format!("\"{key}\":{value},"));
        }
        fields.push_str(&format!("\"x-deep\":{},", nested_arrays(deep, "")));
        let extended = body.replacen('{', &format!("{{{fields}"), 1);
        let back: OutboxJob = serde_json::from_str(&extended)?;
        prop_assert_eq!(&back, &job);

        // `generation` is the last member when present.
        let older = if parts.generation == 0 {
            body.clone()
        } else {
            let rest = body
                .strip_suffix(&format!(",\"generation\":{}}}", parts.generation))
                .ok_or_else(|| TestCaseError::fail(format!("generation not last: {body}")))?;
            format!("{rest}}}")
        };
        let first = OutboxJob { generation: 0, ..job };
        prop_assert_eq!(serde_json::from_str::<OutboxJob>(&older)?, first);
    }

    /// Any bytes: decoding returns (never panics); what decodes re-encodes
    /// to a body that decodes to the same envelope, with a payload that is
    /// one JSON value.
    #[test]
    fn decoding_any_bytes_never_panics(bytes in body_like()) {
        if let Ok(job) = serde_json::from_slice::<OutboxJob>(&bytes) {
            prop_assert!(RawJson::from_text(job.payload.get()).is_ok());
            let again = serde_json::to_vec(&job)?;
            prop_assert_eq!(serde_json::from_slice::<OutboxJob>(&again)?, job);
        }
    }

    /// Delivery ids, and so task ids and receivers' idempotency keys, are
    /// one-to-one with (event id, generation): the pair reads back from the
    /// id, and generation 0 is the bare event id.
    #[test]
    fn delivery_ids_identify_event_and_generation(id in any::<u128>(), generation in any::<u32>()) {
        let event_id = Uuid::from_u128(id);
        let delivery = delivery_id(event_id, generation);
        let (uuid, suffix) = match delivery.split_once(":g") {
            Some((uuid, n)) => (uuid, Some(n)),
            None => (delivery.as_str(), None),
        };
        prop_assert_eq!(Uuid::parse_str(uuid).ok(), Some(event_id));
        match suffix {
            None => prop_assert_eq!(generation, 0),
            Some(n) => {
                prop_assert_ne!(generation, 0);
                prop_assert_eq!(n.parse::<u32>().ok(), Some(generation));
                prop_assert_eq!(n, generation.to_string(), "no leading zeros");
            }
        }
        prop_assert_eq!(generation_task_id(event_id, generation), format!("outbox:{delivery}"));
        if generation == 0 {
            prop_assert_eq!(generation_task_id(event_id, 0), task_id(event_id));
        }
    }
}
