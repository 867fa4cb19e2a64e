//! Property tests of how the framework reads job bodies from raw bytes:
//! [`JobBody::ids`] (for log lines) and the decode in [`DynHandler::call`]
//! never panic on any bytes; a body that decodes reaches the handler
//! unchanged, one that does not is a permanent failure; the ids read are
//! the fields' exact values.

use std::sync::Mutex;

use chrono::DateTime;
use outbox_queue::OutboxJob;
use outbox_subscriber::{DynHandler, JobBody, JobError, JobHandler, JobMeta};
use proptest::prelude::*;
use serde::de::IgnoredAny;
use uuid::Uuid;

// ----------------------------------------------------------------------------
// Generators
// ----------------------------------------------------------------------------

/// JSON numbers, among them integers past 64 bits and long decimals.
fn json_number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        "-?[1-9][0-9]{26}",
        "-?(0|[1-9][0-9]{0,3})\\.[0-9]{15,40}",
        "-?[1-9](\\.[0-9]{1,5})?[eE][+-]?[0-9]{1,4}",
    ]
}

/// A JSON string literal spelling `text`, each character written either as
/// itself or as a `\u` escape (surrogate pairs past the BMP), so that the
/// same text comes in many spellings.
fn spelled(text: String) -> impl Strategy<Value = (String, String)> {
    let n = text.chars().count();
    prop::collection::vec(any::<bool>(), n).prop_map(move |escape| {
        let mut literal = String::from("\"");
        for (c, escape) in text.chars().zip(escape) {
            let must = c == '"' || c == '\\' || c < ' ';
            if escape || must {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    literal.push_str(&format!("\\u{unit:04x}"));
                }
            } else {
                literal.push(c);
            }
        }
        literal.push('"');
        (text.clone(), literal)
    })
}

/// Arbitrary text, NUL, quotes and control characters included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[\"\\\\\\x00-\\x1f a-z]{0,10}",
        "\\PC{0,20}"
    ]
}

/// Valid JSON text of any kind, strings spelled in many ways.
fn json_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop_oneof![Just("null"), Just("true"), Just("false")].prop_map(str::to_owned),
        json_number(),
        text()
            .prop_flat_map(spelled)
            .prop_map(|(_, literal)| literal),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4)
                .prop_map(|items| format!("[{}]", items.join(", "))),
            prop::collection::vec(("\"[a-z]{0,4}\"", inner), 0..4).prop_map(|members| {
                let members: Vec<String> = members
                    .into_iter()
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect();
                format!("{{ {} }}", members.join(", "))
            }),
        ]
    })
}

/// Arrays nested `depth` levels, built as text without recursion.
fn nested_arrays(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A payload object, sometimes nested past serde_json's 128 levels.
fn payload_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(("\"[a-z]{0,4}\"", json_value()), 0..5).prop_map(|members| {
            let members: Vec<String> =
                members.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
            format!("{{{}}}", members.join(","))
        }),
        1 => (1usize..1_500).prop_map(|depth| format!("{{\"deep\":{}}}", nested_arrays(depth))),
    ]
}

/// An envelope as the dispatcher writes it.
fn envelope() -> impl Strategy<Value = OutboxJob> {
    (
        any::<u128>(),
        text(),
        text(),
        payload_text(),
        prop::option::of(text()),
        (0i64..4_102_444_800, 0u32..1_000_000_000),
        prop_oneof![Just(0u32), any::<u32>()],
    )
        .prop_filter_map(
            "payload and instant are valid",
            |(id, tenant_id, event_type, payload, dispatch_key, (secs, nanos), generation)| {
                Some(OutboxJob {
                    outbox_event_id: Uuid::from_u128(id),
                    tenant_id,
                    event_type,
                    payload: serde_json::from_str(&payload).ok()?,
                    dispatch_key,
                    created_at: DateTime::from_timestamp(secs, nanos)?,
                    generation,
                    trace_context: None,
                    priority: outbox_model::Priority::NORMAL,
                    ordering_key: None,
                    ordering_position: None,
                })
            },
        )
}

/// Bytes that are often almost a job body: an envelope's body cut short or
/// with one byte changed or inserted, bodies that are JSON but not an
/// envelope, deep nesting, and random bytes.
fn body_like() -> impl Strategy<Value = Vec<u8>> {
    let body = || envelope().prop_filter_map("serializes", |job| serde_json::to_vec(&job).ok());
    prop_oneof![
        3 => (body(), any::<prop::sample::Index>(), any::<u8>(), 0u8..4).prop_map(
            |(mut body, at, byte, edit)| {
                let i = at.index(body.len() + 1);
                match edit {
                    0 => body.truncate(i),
                    1 => body.insert(i, byte),
                    2 => {
                        if let Some(b) = body.get_mut(i) {
                            *b = byte;
                        }
                    }
                    _ => {}
                }
                body
            }
        ),
        1 => json_value().prop_map(String::into_bytes),
        1 => (1usize..3_000).prop_map(|depth| nested_arrays(depth).into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..200),
    ]
}

// ----------------------------------------------------------------------------
// The handler
// ----------------------------------------------------------------------------

const QUEUE: &str = "outbox.props";

/// Keeps the last job it was given.
#[derive(Default)]
struct Keeper {
    last: Mutex<Option<OutboxJob>>,
}

impl JobHandler for Keeper {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        QUEUE
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let mut last = self
            .last
            .lock()
            .map_err(|_| JobError::permanent("poisoned"))?;
        *last = Some(job);
        Ok(())
    }
}

/// Runs `bytes` through the framework's decode and the handler; returns the
/// outcome and the job the handler got, if any.
fn call(bytes: &[u8]) -> Result<(Result<(), JobError>, Option<OutboxJob>), TestCaseError> {
    let keeper = Keeper::default();
    let meta = JobMeta {
        queue: QUEUE.to_owned(),
        task_id: "outbox:props".to_owned(),
        attempt: 1,
    };
    let outcome = futures::executor::block_on(DynHandler::call(
        &keeper,
        JobBody::from_bytes(bytes.to_vec()),
        &meta,
    ));
    let last = keeper
        .last
        .into_inner()
        .map_err(|_| TestCaseError::fail("handler panicked"))?;
    Ok((outcome, last))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any bytes: `ids` and the decode return; the handler runs exactly
    /// when the bytes decode as an envelope, and then gets that envelope;
    /// otherwise the job fails permanently, as corrupt. Valid JSON of the
    /// wrong shape is never called "not JSON".
    #[test]
    fn any_bytes_decode_or_fail_permanently(bytes in body_like()) {
        let _ = JobBody::from_bytes(bytes.clone()).ids();
        let decoded = serde_json::from_slice::<OutboxJob>(&bytes);
        let (outcome, got) = call(&bytes)?;
        match decoded {
            Ok(job) => {
                prop_assert_eq!(outcome, Ok(()));
                prop_assert_eq!(got, Some(job));
            }
            Err(_) => {
                prop_assert_eq!(got, None);
                let reason = match outcome {
                    Err(JobError::Permanent(reason)) => reason,
                    other => return Err(TestCaseError::fail(format!("{other:?}"))),
                };
                prop_assert!(reason.starts_with("corrupt job body"), "{}", reason);
                // (`from_slice` skips unknown strings without checking their
                // UTF-8, so valid JSON is checked as text.)
                let is_json = std::str::from_utf8(&bytes)
                    .is_ok_and(|text| serde_json::from_str::<IgnoredAny>(text).is_ok());
                if is_json {
                    prop_assert!(
                        reason.contains(&format!("not a {QUEUE} job")),
                        "valid JSON called {:?}",
                        reason
                    );
                }
            }
        }
    }

    /// A dispatched envelope reaches the handler exactly as sent, its
    /// payload text byte for byte, and its ids are read for the log line.
    #[test]
    fn envelopes_reach_the_handler_unchanged(job in envelope()) {
        let bytes = serde_json::to_vec(&job)?;
        let (outcome, got) = call(&bytes)?;
        prop_assert_eq!(outcome, Ok(()));
        let got = got.ok_or_else(|| TestCaseError::fail("handler not called"))?;
        prop_assert_eq!(got.payload.get(), job.payload.get());
        prop_assert_eq!(&got, &job);
        prop_assert_eq!(
            JobBody::from_bytes(bytes).ids(),
            (Some(job.outbox_event_id.to_string()), Some(job.tenant_id.clone()))
        );
    }

    /// `ids` reads the two fields of any JSON object: a string as its text
    /// (however it is spelled), any other value as its JSON text, `None`
    /// when absent or `null`; other members are skipped whatever they hold.
    #[test]
    fn ids_are_the_fields_values(
        event_id in prop::option::of(prop_oneof![
            text().prop_flat_map(spelled).prop_map(|(text, literal)| (Some(text), literal)),
            json_value()
                .prop_filter("not a string", |v| !v.starts_with('"'))
                .prop_map(|value| (None, value)),
        ]),
        tenant_id in prop::option::of(prop_oneof![
            text().prop_flat_map(spelled).prop_map(|(text, literal)| (Some(text), literal)),
            json_value()
                .prop_filter("not a string", |v| !v.starts_with('"'))
                .prop_map(|value| (None, value)),
        ]),
        others in prop::collection::vec(("\"x-[a-z]{0,4}\"", json_value()), 0..3),
        deep in 1usize..1_000,
        order in any::<bool>(),
    ) {
        let mut members: Vec<String> = others.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        members.push(format!("\"x-deep\": {}", nested_arrays(deep)));
        let mut fields = Vec::new();
        if let Some((_, literal)) = &event_id {
            fields.push(format!("\"outbox_event_id\": {literal}"));
        }
        if let Some((_, literal)) = &tenant_id {
            fields.push(format!("\"tenant_id\": {literal}"));
        }
        if order {
            fields.reverse();
        }
        members.splice(0..0, fields);
        let body = format!("{{ {} }}", members.join(", "));

        // A string's text; any other value's JSON text; `null` as absent.
        let expected = |field: &Option<(Option<String>, String)>| match field {
            Some((Some(text), _)) => Some(text.clone()),
            Some((None, literal)) if literal != "null" => Some(literal.clone()),
            _ => None,
        };
        prop_assert_eq!(
            JobBody::from_bytes(body.into_bytes()).ids(),
            (expected(&event_id), expected(&tenant_id))
        );
    }

    /// Bodies that are not a JSON object have no ids.
    #[test]
    fn non_objects_have_no_ids(
        bytes in prop_oneof![
            json_value().prop_filter("not an object", |v| !v.starts_with('{')).prop_map(String::into_bytes),
            prop::collection::vec(text().prop_flat_map(spelled).prop_map(|(_, l)| l), 0..3)
                .prop_map(|items| format!("[{}]", items.join(",")).into_bytes()),
            prop::collection::vec(any::<u8>(), 0..64),
        ],
    ) {
        prop_assume!(!bytes.trim_ascii_start().starts_with(b"{"));
        prop_assert_eq!(JobBody::from_bytes(bytes).ids(), (None, None));
    }
}
