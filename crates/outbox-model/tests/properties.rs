//! Property tests of the input-facing parsers of `outbox-model`:
//! [`EventType`] and [`RawJson::from_text`]. Arbitrary input yields `Ok` or
//! `Err`, never a panic, and each answer is checked against a reference
//! written here from the documented rules, not from the parser's code.

use outbox_model::{
    EventType, EventTypeError, MAX_EVENT_TYPE_LEN, MIN_EVENT_TYPE_SEGMENTS, RawJson,
};
use proptest::prelude::*;
use serde::de::IgnoredAny;

// ----------------------------------------------------------------------------
// EventType
// ----------------------------------------------------------------------------

/// The documented rule as a yes/no answer, in the shape of the SQL CHECK on
/// `outbox_event.event_type`: at most 255 bytes and
/// `^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*){2,}$`.
fn is_valid_event_type(raw: &str) -> bool {
    let segment_ok = |segment: &str| {
        let mut bytes = segment.bytes();
        bytes.next().is_some_and(|b| b.is_ascii_lowercase())
            && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    raw.len() <= MAX_EVENT_TYPE_LEN
        && raw.split('.').count() >= MIN_EVENT_TYPE_SEGMENTS
        && raw.split('.').all(segment_ok)
}

/// The error [`EventType::parse`] documents for `raw`: the first rule broken,
/// the rules taken in this order (each a property of the whole string before
/// the next is looked at):
///
/// 1. not empty;
/// 2. at most [`MAX_EVENT_TYPE_LEN`] bytes;
/// 3. only `a-z`, `0-9`, `-` and `.` (the leftmost other character is
///    reported, as `Uppercase` when it is `A-Z`);
/// 4. no empty segment and every segment starting with a letter (the
///    leftmost offending segment is reported);
/// 5. at least [`MIN_EVENT_TYPE_SEGMENTS`] segments.
fn expected_error(raw: &str) -> Option<EventTypeError> {
    if raw.is_empty() {
        return Some(EventTypeError::Empty);
    }
    if raw.len() > MAX_EVENT_TYPE_LEN {
        return Some(EventTypeError::TooLong { len: raw.len() });
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if let Some((position, ch)) = raw.char_indices().find(|&(_, c)| !allowed(c)) {
        return Some(if ch.is_ascii_uppercase() {
            EventTypeError::Uppercase { ch, position }
        } else {
            EventTypeError::InvalidCharacter { ch, position }
        });
    }
    let segments: Vec<&str> = raw.split('.').collect();
    for (segment, text) in segments.iter().enumerate() {
        if text.is_empty() {
            return Some(EventTypeError::EmptySegment { segment });
        }
        if !text.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Some(EventTypeError::SegmentStartsWithNonLetter {
                segment,
                text: (*text).to_owned(),
            });
        }
    }
    if segments.len() < MIN_EVENT_TYPE_SEGMENTS {
        return Some(EventTypeError::TooFewSegments {
            found: segments.len(),
        });
    }
    None
}

/// One valid segment of at most `1 + max_tail` characters.
fn segment(max_tail: usize) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("[a-z][a-z0-9-]{{0,{max_tail}}}"))
        .unwrap_or_else(|e| panic!("segment regex: {e}"))
}

/// Valid event types: 3 to 8 short segments, or three segments whose last
/// one is long, up to exactly [`MAX_EVENT_TYPE_LEN`] bytes.
fn valid_event_type() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(segment(12), 3..=8).prop_map(|segments| segments.join(".")),
        (segment(5), segment(5), segment(240))
            .prop_map(|(domain, entity, verb)| format!("{domain}.{entity}.{verb}")),
        // Exactly at the limit.
        (segment(5), segment(5)).prop_map(|(domain, entity)| {
            let used = domain.len() + entity.len() + 2;
            format!(
                "{domain}.{entity}.{}",
                "v".repeat(MAX_EVENT_TYPE_LEN - used)
            )
        }),
    ]
}

/// Strings weighted towards what the parser could trip on: anything at all
/// (NUL, control characters, any Unicode), near-valid names over an alphabet
/// of valid and a few invalid characters, names around the length limit and
/// very long strings.
fn nasty_event_type() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "\\PC{0,300}",
        prop::collection::vec("[a-z0-9A-Z_. \\x00é-]{0,8}", 0..8)
            .prop_map(|segments| segments.join(".")),
        prop::collection::vec("[a-z0-9-]{0,4}", 0..7).prop_map(|segments| segments.join(".")),
        prop::collection::vec(segment(6), 1..=4).prop_map(|segments| segments.join(".")),
        valid_event_type(),
        (valid_event_type(), "[a-z0-9.-]{0,260}").prop_map(|(valid, tail)| valid + &tail),
        (any::<char>(), 250usize..20_000).prop_map(|(c, n)| std::iter::repeat_n(c, n).collect()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any string: `parse` returns (never panics), accepts exactly the
    /// documented rule and reports the first rule broken.
    #[test]
    fn event_type_parse_matches_the_documented_rules(raw in nasty_event_type()) {
        let expected = expected_error(&raw);
        // The two references agree with each other.
        prop_assert_eq!(expected.is_none(), is_valid_event_type(&raw), "{:?}", raw);
        let parsed = EventType::parse(raw.as_str());
        prop_assert_eq!(parsed.as_ref().err(), expected.as_ref(), "{:?}", raw);
        // Every entry point agrees.
        prop_assert_eq!(&raw.parse::<EventType>(), &parsed);
        prop_assert_eq!(&EventType::try_from(raw.as_str()), &parsed);
        prop_assert_eq!(&EventType::try_from(raw.clone()), &parsed);
        let json = serde_json::to_string(&raw)?;
        prop_assert_eq!(serde_json::from_str::<EventType>(&json).is_ok(), parsed.is_ok());
        // An error's message renders.
        if let Err(e) = &parsed {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    /// Valid event types parse and come back unchanged through every view.
    #[test]
    fn valid_event_types_round_trip(raw in valid_event_type()) {
        prop_assert!(is_valid_event_type(&raw), "generator made {:?}", raw);
        let ty = EventType::parse(raw.clone())
            .map_err(|e| TestCaseError::fail(format!("{raw:?}: {e}")))?;
        prop_assert_eq!(ty.as_str(), raw.as_str());
        prop_assert_eq!(ty.to_string(), raw.clone());
        prop_assert_eq!(AsRef::<str>::as_ref(&ty), raw.as_str());
        prop_assert_eq!(ty.segments().collect::<Vec<_>>().join("."), raw.clone());
        prop_assert!(ty.segments().count() >= MIN_EVENT_TYPE_SEGMENTS);
        prop_assert_eq!(&ty.to_string().parse::<EventType>(), &Ok(ty.clone()));
        let json = serde_json::to_string(&ty)?;
        prop_assert_eq!(&json, &serde_json::to_string(&raw)?);
        prop_assert_eq!(serde_json::from_str::<EventType>(&json)?, ty.clone());
        prop_assert_eq!(ty.into_string(), raw);
    }

    /// A valid name with one character replaced by an uppercase letter: the
    /// only offending character, reported where it is.
    #[test]
    fn one_uppercase_letter_is_reported_where_it_is(
        raw in valid_event_type(),
        at in any::<prop::sample::Index>(),
        ch in proptest::char::range('A', 'Z'),
    ) {
        let position = at.index(raw.len());
        let mut bad = raw;
        bad.replace_range(position..=position, ch.encode_utf8(&mut [0; 4]));
        prop_assert_eq!(
            EventType::parse(bad),
            Err(EventTypeError::Uppercase { ch, position })
        );
    }

    /// A valid name with one character replaced by a character outside the
    /// alphabet: `InvalidCharacter` there, or `TooLong` when its UTF-8
    /// encoding pushes the name past the limit.
    #[test]
    fn one_foreign_character_is_reported_where_it_is(
        raw in valid_event_type(),
        at in any::<prop::sample::Index>(),
        ch in any::<char>().prop_filter("outside the alphabet", |c| {
            !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        }),
    ) {
        let position = at.index(raw.len());
        let mut bad = raw;
        bad.replace_range(position..=position, ch.encode_utf8(&mut [0; 4]));
        let expected = if bad.len() > MAX_EVENT_TYPE_LEN {
            EventTypeError::TooLong { len: bad.len() }
        } else {
            EventTypeError::InvalidCharacter { ch, position }
        };
        prop_assert_eq!(EventType::parse(bad), Err(expected));
    }

    /// Segment `k` made empty (a doubled, leading or trailing dot) or made to
    /// start with a digit or `-`: reported with that segment's index.
    #[test]
    fn a_broken_segment_is_reported_by_index(
        segments in prop::collection::vec(segment(10), 3..=8),
        at in any::<prop::sample::Index>(),
        lead in "[0-9-]",
        empty in any::<bool>(),
    ) {
        let k = at.index(segments.len() + 1);
        let (bad, expected) = if empty {
            // An empty segment inserted before segment k (k == len: trailing).
            let mut with_empty = segments.clone();
            with_empty.insert(k, String::new());
            (with_empty.join("."), EventTypeError::EmptySegment { segment: k })
        } else {
            let k = k.min(segments.len() - 1);
            let mut broken = segments.clone();
            broken[k].insert_str(0, &lead);
            let text = broken[k].clone();
            (broken.join("."), EventTypeError::SegmentStartsWithNonLetter { segment: k, text })
        };
        prop_assert_eq!(EventType::parse(bad), Err(expected));
    }

    /// One or two valid segments: too few, whatever they hold.
    #[test]
    fn fewer_than_three_segments_are_counted(
        segments in prop::collection::vec(segment(20), 1..MIN_EVENT_TYPE_SEGMENTS),
    ) {
        let found = segments.len();
        prop_assert_eq!(
            EventType::parse(segments.join(".")),
            Err(EventTypeError::TooFewSegments { found })
        );
    }

    /// Valid characters past the limit: `TooLong` with the length in bytes.
    #[test]
    fn a_valid_name_made_longer_than_the_limit_is_too_long(
        raw in valid_event_type(),
        tail in "[a-z0-9-]{1,300}",
    ) {
        let long = format!("{raw}{}", tail.repeat(MAX_EVENT_TYPE_LEN / tail.len() + 1));
        prop_assert!(long.len() > MAX_EVENT_TYPE_LEN);
        let len = long.len();
        prop_assert_eq!(EventType::parse(long), Err(EventTypeError::TooLong { len }));
    }
}

// ----------------------------------------------------------------------------
// RawJson
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
        any::<u64>().prop_map(|n| n.to_string()),
        "-?[1-9][0-9]{18,30}",
        "-?(0|[1-9][0-9]{0,3})\\.[0-9]{15,40}",
        "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,5})?[eE][+-]?[0-9]{1,4}",
        Just("-0".to_owned()),
    ]
}

/// JSON string literals: raw Unicode (no control characters), every short
/// escape, `\u` escapes including lone surrogates.
fn json_string() -> impl Strategy<Value = String> {
    "\"([^\"\\\\\\x00-\\x1f]|\\\\[\"\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4}){0,12}\""
}

/// Valid JSON text of any kind, with whitespace between tokens.
fn json_text() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop_oneof![Just("null"), Just("true"), Just("false")].prop_map(str::to_owned),
        json_number(),
        json_string(),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            (
                prop::collection::vec((ws(), inner.clone(), ws()), 0..6),
                ws()
            )
                .prop_map(|(items, pad)| {
                    let items: Vec<String> =
                        items.into_iter().map(|(a, v, b)| a + &v + &b).collect();
                    format!("[{pad}{}]", items.join(","))
                }),
            (
                prop::collection::vec((ws(), json_string(), ws(), ws(), inner, ws()), 0..6),
                ws()
            )
                .prop_map(|(members, pad)| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(a, k, b, c, v, d)| format!("{a}{k}{b}:{c}{v}{d}"))
                        .collect();
                    format!("{{{pad}{}}}", members.join(","))
                }),
        ]
    })
}

/// Arrays or objects up to 5,000 levels deep, built as text (no recursion),
/// with whether every bracket is closed (when not, the text is not JSON).
fn deep_json() -> impl Strategy<Value = (String, bool)> {
    (
        1usize..5_000,
        prop_oneof![3 => Just(0usize), 1 => 1usize..3],
        any::<bool>(),
    )
        .prop_map(|(depth, missing, arrays)| {
            let (open, inner, close) = if arrays {
                ("[", "", "]")
            } else {
                ("{\"a\":", "1", "}")
            };
            let mut text = open.repeat(depth);
            text.push_str(inner);
            text.push_str(&close.repeat(depth.saturating_sub(missing)));
            (text, missing == 0)
        })
}

/// Text that is often almost JSON: valid text mutated by one edit (cut,
/// inserted character, removed character), surrounding whitespace, deep
/// nesting, and arbitrary strings.
fn json_like() -> impl Strategy<Value = String> {
    let edited = (
        json_text(),
        any::<prop::sample::Index>(),
        any::<char>(),
        0u8..4,
    )
        .prop_map(|(text, at, ch, edit)| {
            let boundaries: Vec<usize> = text
                .char_indices()
                .map(|(i, _)| i)
                .chain([text.len()])
                .collect();
            let i = boundaries[at.index(boundaries.len())];
            let mut text = text;
            match edit {
                0 => text.truncate(i),
                1 => text.insert(i, ch),
                2 if i < text.len() => {
                    text.remove(i);
                }
                _ => {}
            }
            text
        });
    prop_oneof![
        3 => edited,
        2 => json_text(),
        1 => (ws(), json_text(), ws()).prop_map(|(a, v, b)| a + &v + &b),
        1 => deep_json().prop_map(|(text, _)| text),
        1 => any::<String>(),
        1 => "[ \\t\\n\\r0-9eE.+-]{0,12}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `RawJson::from_text` accepts exactly what `serde_json` accepts as one
    /// JSON value, keeps its text byte for byte (without the surrounding
    /// whitespace) and serializes as that text.
    #[test]
    fn raw_json_accepts_exactly_json(text in json_like()) {
        let reference = serde_json::from_str::<IgnoredAny>(&text);
        let raw = RawJson::from_text(text.as_str());
        prop_assert_eq!(raw.is_ok(), reference.is_ok(), "{:?}: {:?}", text, reference);
        if let Ok(raw) = raw {
            let trimmed = text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
            prop_assert_eq!(raw.get(), trimmed);
            prop_assert_eq!(raw.to_string(), trimmed);
            prop_assert_eq!(serde_json::to_string(&raw)?, trimmed);
            let back: RawJson = serde_json::from_str(&text)?;
            prop_assert_eq!(back, raw);
        }
    }

    /// Generated JSON text is accepted and kept byte for byte, including
    /// numbers no `f64` holds.
    #[test]
    fn raw_json_keeps_valid_text(text in json_text()) {
        let raw = RawJson::from_text(text.as_str())
            .map_err(|e| TestCaseError::fail(format!("{text:?} refused: {e}")))?;
        prop_assert_eq!(raw.get(), text.as_str());
    }

    /// Nesting deeper than serde_json's 128-level limit for `Value`: a
    /// closed text is kept byte for byte, an unclosed one is refused.
    #[test]
    fn raw_json_keeps_deep_text((text, complete) in deep_json()) {
        match RawJson::from_text(text.as_str()) {
            Ok(raw) => prop_assert!(complete && raw.get() == text, "{} bytes", text.len()),
            Err(e) => prop_assert!(!complete, "refused: {}", e),
        }
    }
}
