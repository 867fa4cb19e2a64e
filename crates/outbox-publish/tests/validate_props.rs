//! Property tests of the publisher's checks, [`NewOutboxEvent::validate`]:
//! on any payload (and tenant id, event type, dispatch key) it returns,
//! never panics, and refuses exactly when a documented rule is broken: a
//! NUL in any string or key, nesting deeper than [`MAX_PAYLOAD_DEPTH`], a
//! payload that is not an object, or one larger than
//! [`MAX_PAYLOAD_BYTES`] serialized. The reference predicates below are
//! written from those rules, walk values with an explicit stack (so deep
//! values are fine) and count the serialized size from JSON's escaping
//! rules rather than by serializing.

use outbox_model::{EventType, MAX_PAYLOAD_BYTES};
use outbox_publish::{MAX_PAYLOAD_DEPTH, NewOutboxEvent, PublishError};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

// ----------------------------------------------------------------------------
// Reference predicates
// ----------------------------------------------------------------------------

/// Does any string or key anywhere in `value` contain NUL?
fn has_nul(value: &Value) -> bool {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value {
            Value::String(s) if s.contains('\0') => return true,
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => {
                if map.keys().any(|k| k.contains('\0')) {
                    return true;
                }
                pending.extend(map.values());
            }
            _ => {}
        }
    }
    false
}

/// Nesting depth: an array or object is one level more than its deepest
/// member; a scalar is 0 (so the payload object alone is level 1).
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(value, 1)];
    while let Some((value, level)) = pending.pop() {
        match value {
            Value::Array(items) => {
                deepest = deepest.max(level);
                pending.extend(items.iter().map(|v| (v, level + 1)));
            }
            Value::Object(map) => {
                deepest = deepest.max(level);
                pending.extend(map.values().map(|v| (v, level + 1)));
            }
            _ => {}
        }
    }
    deepest
}

/// The length of a string literal as compact JSON writes it: quotes, two
/// bytes for `"`, `\` and the five short escapes, six for other control
/// characters (`\u001f`), the UTF-8 bytes of everything else.
fn string_len(s: &str) -> usize {
    2 + s
        .chars()
        .map(|c| match c {
            '"' | '\\' | '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 2,
            c if c < ' ' => 6,
            c => c.len_utf8(),
        })
        .sum::<usize>()
}

/// The length of `value` as compact JSON (no whitespace).
fn json_len(value: &Value) -> usize {
    let mut total = 0;
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        total += match value {
            Value::Null | Value::Bool(true) => 4,
            Value::Bool(false) => 5,
            Value::Number(n) => n.to_string().len(),
            Value::String(s) => string_len(s),
            Value::Array(items) => {
                pending.extend(items);
                2 + items.len().saturating_sub(1)
            }
            Value::Object(map) => {
                pending.extend(map.values());
                2 + map.len().saturating_sub(1)
                    + map.keys().map(|k| string_len(k) + 1).sum::<usize>()
            }
        };
    }
    total
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Splits a JSON Pointer into its unescaped tokens.
fn pointer_tokens(path: &str) -> Option<Vec<String>> {
    let rest = path.strip_prefix('/')?;
    Some(
        rest.split('/')
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect(),
    )
}

/// Checks the refusal of `payload` (with a valid tenant, type and key)
/// against the reference predicates.
fn check_payload_answer(
    payload: &Value,
    answer: &Result<(), PublishError>,
) -> Result<(), TestCaseError> {
    if !payload.is_object() {
        prop_assert!(
            matches!(answer, Err(PublishError::PayloadNotObject { found }) if *found == kind(payload)),
            "{:?}",
            answer
        );
        return Ok(());
    }
    let nul = has_nul(payload);
    let too_deep = depth(payload) > MAX_PAYLOAD_DEPTH;
    // NUL and depth are found in one walk, before the size is counted;
    // which of the two comes first depends on where they are.
    match answer {
        Ok(()) => {
            prop_assert!(
                !nul && !too_deep,
                "accepted: nul {}, too deep {}",
                nul,
                too_deep
            );
            prop_assert!(
                json_len(payload) <= MAX_PAYLOAD_BYTES,
                "accepted {} bytes",
                json_len(payload)
            );
        }
        Err(PublishError::PayloadStringContainsNul { path }) => {
            let found = payload.pointer(path);
            prop_assert!(
                matches!(found, Some(Value::String(s)) if s.contains('\0')),
                "{:?} leads to {:?}",
                path,
                found
            );
        }
        Err(PublishError::PayloadKeyContainsNul { path }) => {
            let tokens = pointer_tokens(path)
                .ok_or_else(|| TestCaseError::fail(format!("not a pointer: {path:?}")))?;
            let (key, parent) = tokens
                .split_last()
                .ok_or_else(|| TestCaseError::fail("empty pointer"))?;
            let parent_path: String = parent
                .iter()
                .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
                .collect();
            let holder = payload.pointer(&parent_path);
            prop_assert!(key.contains('\0'), "{:?}", path);
            prop_assert!(
                matches!(holder, Some(Value::Object(map)) if map.contains_key(key.as_str())),
                "{:?}: no such key",
                path
            );
        }
        Err(PublishError::PayloadTooDeep { max }) => {
            prop_assert_eq!(*max, MAX_PAYLOAD_DEPTH);
            prop_assert!(too_deep, "refused as too deep at depth {}", depth(payload));
        }
        Err(PublishError::PayloadTooLarge { size, max }) => {
            prop_assert!(
                !nul && !too_deep,
                "size checked first: nul {}, too deep {}",
                nul,
                too_deep
            );
            prop_assert_eq!(*size, json_len(payload));
            prop_assert_eq!(*max, MAX_PAYLOAD_BYTES);
            prop_assert!(*size > MAX_PAYLOAD_BYTES);
        }
        Err(other) => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
    }
    Ok(())
}

/// Drops `value` one container at a time (a deep value would overflow the
/// stack of the default, recursive drop).
fn drop_flat(value: Value) {
    let mut pending = vec![value];
    while let Some(mut value) = pending.pop() {
        match &mut value {
            Value::Array(items) => pending.append(items),
            Value::Object(map) => pending.extend(std::mem::take(map).into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

// ----------------------------------------------------------------------------
// Generators
// ----------------------------------------------------------------------------

/// Text, sometimes with NUL, JSON's escaped characters or pointer
/// metacharacters (`/`, `~`).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z]{0,6}",
        2 => "[a-z/~\"\\\\\\x01\\n]{0,6}",
        1 => "[a-z\\x00]{1,4}",
        1 => any::<String>(),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        text().prop_map(Value::String),
    ]
}

/// Any value, nested up to 6 levels.
fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((text(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Text without NUL, pointer metacharacters included.
fn clean_text() -> impl Strategy<Value = String> {
    "[a-z/~]{0,4}"
}

/// A random value wrapped in enough containers to make its depth 98 to
/// 103 (around the limit of 100), each an array (the value among sibling
/// scalars) or an object (under a random key, with sibling members). The
/// wrappers hold no NUL, so the depth decides unless the value has one.
fn deep_value() -> impl Strategy<Value = Value> {
    let sibling = prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::from),
        clean_text().prop_map(Value::String),
    ];
    (
        value(),
        98usize..=103,
        prop::collection::vec(
            (
                any::<bool>(),
                clean_text(),
                prop::collection::vec(sibling, 0..2),
            ),
            103,
        ),
    )
        .prop_map(|(mut value, target, wrappers)| {
            let levels = target.saturating_sub(depth(&value));
            for (array, key, siblings) in wrappers.into_iter().take(levels) {
                value = if array {
                    let mut items = siblings;
                    items.push(value);
                    Value::Array(items)
                } else {
                    let mut map: Map<String, Value> = siblings
                        .into_iter()
                        .enumerate()
                        .map(|(i, v)| (format!("s{i}"), v))
                        .collect();
                    map.insert(key, value);
                    Value::Object(map)
                };
            }
            value
        })
}

/// Objects whose serialized size is within a few bytes of the limit: one
/// long string of a character that JSON writes in 1, 2, 4 or 6 bytes,
/// possibly with a NUL.
fn large_object() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!['a', '"', '\n', '\u{1}', 'é', '€', '😀', '\0']),
        -3i64..=3,
        any::<bool>(),
    )
        .prop_map(|(c, delta, extra)| {
            let each = string_len(&c.to_string()) - 2;
            // `{"a":""}` is 8 bytes, `,"b":1` 6 more.
            let overhead = 8 + if extra { 6 } else { 0 };
            let n = (MAX_PAYLOAD_BYTES - overhead) / each;
            let n = usize::try_from(i64::try_from(n).unwrap_or(0) + delta).unwrap_or(0);
            let mut map = Map::new();
            map.insert(
                "a".to_owned(),
                Value::String(std::iter::repeat_n(c, n).collect()),
            );
            if extra {
                map.insert("b".to_owned(), Value::from(1));
            }
            Value::Object(map)
        })
}

/// Payloads of every kind: any value, objects, deep ones, large ones.
fn payload() -> impl Strategy<Value = Value> {
    prop_oneof![
        2 => value(),
        4 => prop::collection::vec((text(), value()), 0..6)
            .prop_map(|members| Value::Object(members.into_iter().collect())),
        2 => deep_value(),
        1 => large_object(),
    ]
}

// ----------------------------------------------------------------------------
// Properties
// ----------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The payload rules, with a valid tenant, type and key.
    #[test]
    fn payload_is_refused_exactly_when_a_rule_is_broken(payload in payload()) {
        let event = NewOutboxEvent::new("tenant-1", "mail.user.welcome", payload)
            .dispatch_key("key-1");
        let answer = event.validate();
        check_payload_answer(&event.payload, &answer)?;
        // Refusals are invalid events, never database errors.
        if let Err(e) = &answer {
            prop_assert!(e.is_invalid_event());
        }
    }

    /// The size reference agrees with serde_json on values it can
    /// serialize (nothing deep here), so `PayloadTooLarge` sizes are exact.
    #[test]
    fn size_reference_matches_serde_json(value in value()) {
        prop_assert_eq!(json_len(&value), serde_json::to_vec(&value)?.len());
    }

    /// All rules together, in the documented order: tenant id (empty, NUL),
    /// event type, dispatch key (NUL), then the payload.
    #[test]
    fn rules_are_checked_in_the_documented_order(
        tenant_id in prop_oneof![Just(String::new()), text(), "[a-z0-9-]{1,12}"],
        event_type in prop_oneof![
            "[a-z]{1,6}\\.[a-z]{1,6}\\.[a-z]{1,6}",
            text(),
            "[a-z]{1,3}\\.[a-z\\x00]{1,3}\\.[a-z]{1,3}",
        ],
        dispatch_key in prop::option::of(text()),
        payload in payload(),
    ) {
        let mut event = NewOutboxEvent::new(tenant_id.clone(), event_type.clone(), payload);
        event.dispatch_key = dispatch_key.clone();
        let answer = event.validate();
        let nul_at = |s: &str| s.bytes().position(|b| b == 0);
        if tenant_id.is_empty() {
            prop_assert!(matches!(answer, Err(PublishError::EmptyTenantId)), "{:?}", answer);
        } else if let Some(at) = nul_at(&tenant_id) {
            prop_assert!(
                matches!(answer, Err(PublishError::TenantIdContainsNul { position }) if position == at),
                "{:?}", answer
            );
        } else if let Err(expected) = EventType::parse(event_type.as_str()) {
            prop_assert!(
                matches!(&answer, Err(PublishError::InvalidEventType(e)) if *e == expected),
                "{:?}", answer
            );
        } else if let Some(at) = dispatch_key.as_deref().and_then(nul_at) {
            prop_assert!(
                matches!(answer, Err(PublishError::DispatchKeyContainsNul { position }) if position == at),
                "{:?}", answer
            );
        } else {
            check_payload_answer(&event.payload, &answer)?;
        }
    }
}

/// Hand-made deep payloads, built and dropped without recursion: the limit
/// itself is accepted, one level more is refused, and far deeper than any
/// recursive walk could go is refused too.
#[test]
fn deep_payloads_built_by_hand() {
    for (levels, as_arrays) in [
        (MAX_PAYLOAD_DEPTH, false),
        (MAX_PAYLOAD_DEPTH, true),
        (MAX_PAYLOAD_DEPTH + 1, false),
        (MAX_PAYLOAD_DEPTH + 1, true),
        (300_000, false),
        (300_000, true),
    ] {
        // The outer object, then `levels - 1` nested containers.
        let mut inner = if as_arrays {
            Value::Array(Vec::new())
        } else {
            Value::Object(Map::new())
        };
        for _ in 2..levels {
            inner = if as_arrays {
                Value::Array(vec![Value::from(1), inner])
            } else {
                Value::Object(Map::from_iter([("k/~".to_owned(), inner)]))
            };
        }
        let payload = Value::Object(Map::from_iter([("root".to_owned(), inner)]));
        assert_eq!(depth(&payload), levels);
        let event = NewOutboxEvent::new("t", "mail.user.welcome", payload);
        let answer = event.validate();
        if levels <= MAX_PAYLOAD_DEPTH {
            assert!(answer.is_ok(), "{levels} levels: {answer:?}");
        } else {
            assert!(
                matches!(
                    answer,
                    Err(PublishError::PayloadTooDeep {
                        max: MAX_PAYLOAD_DEPTH
                    })
                ),
                "{levels} levels: {answer:?}"
            );
        }
        drop_flat(event.payload);
    }

    // A NUL at the bottom of the deepest accepted nesting is found, and its
    // path leads there.
    let mut bottom = Value::String("x\0".to_owned());
    for _ in 0..MAX_PAYLOAD_DEPTH {
        bottom = Value::Object(Map::from_iter([("a/b~c".to_owned(), bottom)]));
    }
    let event = NewOutboxEvent::new("t", "mail.user.welcome", bottom);
    match event.validate() {
        Err(PublishError::PayloadStringContainsNul { path }) => {
            assert_eq!(path, "/a~1b~0c".repeat(MAX_PAYLOAD_DEPTH));
            assert_eq!(event.payload.pointer(&path), Some(&Value::from("x\0")));
        }
        other => panic!("expected a NUL refusal, got {other:?}"),
    }
}
