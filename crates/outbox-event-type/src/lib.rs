//! The naming rule of outbox event types, `<domain>.<entity>.<verb>[.<more>]`:
//! three or more dot-separated segments, each of lowercase ASCII letters,
//! digits and `-` and starting with a letter, [`MAX_EVENT_TYPE_LEN`]
//! characters at most. [`check`] applies it and names the first rule broken
//! with one precise [`EventTypeError`] per rule.
//!
//! It is its own crate so that the rule exists once and runs in two places:
//! at run time behind `outbox_model::EventType` (which re-exports these
//! items), and at compile time in the `OutboxEvent` derive (a proc-macro
//! crate cannot share code with a library any other way). It is not the
//! validated type itself; that is `outbox_model::EventType`.

/// The longest event type accepted, in bytes (all valid characters are ASCII).
pub const MAX_EVENT_TYPE_LEN: usize = 255;

/// The fewest dot-separated segments an event type has: `<domain>.<entity>.<verb>`.
pub const MIN_EVENT_TYPE_SEGMENTS: usize = 3;

/// Why a string is not a valid `EventType`. Positions are byte offsets into
/// the rejected string; segments are numbered from 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventTypeError {
    /// The string is empty.
    #[error("event type is empty; expected `<domain>.<entity>.<verb>`")]
    Empty,
    /// The string is longer than [`MAX_EVENT_TYPE_LEN`].
    #[error("event type is {len} bytes long; at most {MAX_EVENT_TYPE_LEN} are allowed")]
    TooLong {
        /// The length of the rejected string in bytes.
        len: usize,
    },
    /// Fewer than [`MIN_EVENT_TYPE_SEGMENTS`] segments.
    #[error(
        "event type has {found} segment(s); expected at least {MIN_EVENT_TYPE_SEGMENTS} as in `<domain>.<entity>.<verb>`"
    )]
    TooFewSegments {
        /// How many segments the string has.
        found: usize,
    },
    /// Two dots in a row, or a leading or trailing dot.
    #[error(
        "event type has an empty segment at position {segment} (leading, trailing or doubled dot)"
    )]
    EmptySegment {
        /// The index of the empty segment.
        segment: usize,
    },
    /// An uppercase ASCII letter: event types are lowercase.
    #[error("event type must be lowercase: {ch:?} at byte {position}")]
    Uppercase {
        /// The offending character.
        ch: char,
        /// Its byte offset.
        position: usize,
    },
    /// A character outside `[a-z0-9-]` and the dot separator.
    #[error(
        "event type contains {ch:?} at byte {position}; only a-z, 0-9, '-' and '.' are allowed"
    )]
    InvalidCharacter {
        /// The offending character.
        ch: char,
        /// Its byte offset.
        position: usize,
    },
    /// A segment that starts with a digit or `-`.
    #[error("event type segment {segment} ({text:?}) must start with a letter")]
    SegmentStartsWithNonLetter {
        /// The index of the segment.
        segment: usize,
        /// The segment's text.
        text: String,
    },
}

/// Checks `raw` against the naming rule, each rule in turn.
///
/// # Errors
///
/// The first rule `raw` breaks, as an [`EventTypeError`]: its length, then
/// each character, then each segment, then the number of segments.
///
/// # Example
///
/// ```
/// use outbox_event_type::{EventTypeError, check};
///
/// assert_eq!(check("orders.order.created"), Ok(()));
/// assert_eq!(
///     check("orders.Order.created"),
///     Err(EventTypeError::Uppercase { ch: 'O', position: 7 })
/// );
/// ```
pub fn check(raw: &str) -> Result<(), EventTypeError> {
    if raw.is_empty() {
        return Err(EventTypeError::Empty);
    }
    if raw.len() > MAX_EVENT_TYPE_LEN {
        return Err(EventTypeError::TooLong { len: raw.len() });
    }
    for (position, ch) in raw.char_indices() {
        match ch {
            'a'..='z' | '0'..='9' | '-' | '.' => {}
            'A'..='Z' => return Err(EventTypeError::Uppercase { ch, position }),
            _ => return Err(EventTypeError::InvalidCharacter { ch, position }),
        }
    }
    let mut found = 0;
    for (segment, text) in raw.split('.').enumerate() {
        found += 1;
        match text.as_bytes().first() {
            None => return Err(EventTypeError::EmptySegment { segment }),
            Some(b'a'..=b'z') => {}
            Some(_) => {
                return Err(EventTypeError::SegmentStartsWithNonLetter {
                    segment,
                    text: text.to_owned(),
                });
            }
        }
    }
    if found < MIN_EVENT_TYPE_SEGMENTS {
        return Err(EventTypeError::TooFewSegments { found });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_with_precise_errors() {
        let too_long = format!("a.b.{}", "c".repeat(MAX_EVENT_TYPE_LEN));
        let cases: Vec<(&str, EventTypeError)> = vec![
            ("", EventTypeError::Empty),
            (
                "Mail.user.welcome",
                EventTypeError::Uppercase {
                    ch: 'M',
                    position: 0,
                },
            ),
            (
                "mail.User.welcome",
                EventTypeError::Uppercase {
                    ch: 'U',
                    position: 5,
                },
            ),
            ("mail.welcome", EventTypeError::TooFewSegments { found: 2 }),
            ("mail", EventTypeError::TooFewSegments { found: 1 }),
            ("mail..welcome", EventTypeError::EmptySegment { segment: 1 }),
            (
                ".mail.user.welcome",
                EventTypeError::EmptySegment { segment: 0 },
            ),
            (
                "mail.user.welcome.",
                EventTypeError::EmptySegment { segment: 3 },
            ),
            (
                "mail.user_x.welcome",
                EventTypeError::InvalidCharacter {
                    ch: '_',
                    position: 9,
                },
            ),
            (
                "mail.user.wel come",
                EventTypeError::InvalidCharacter {
                    ch: ' ',
                    position: 13,
                },
            ),
            (
                "mail.usér.welcome",
                EventTypeError::InvalidCharacter {
                    ch: 'é',
                    position: 7,
                },
            ),
            (
                "mail.1user.welcome",
                EventTypeError::SegmentStartsWithNonLetter {
                    segment: 1,
                    text: "1user".into(),
                },
            ),
            (
                "mail.user.-welcome",
                EventTypeError::SegmentStartsWithNonLetter {
                    segment: 2,
                    text: "-welcome".into(),
                },
            ),
            (
                too_long.as_str(),
                EventTypeError::TooLong {
                    len: MAX_EVENT_TYPE_LEN + 4,
                },
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(check(raw), Err(expected), "input {raw:?}");
        }
    }
}
