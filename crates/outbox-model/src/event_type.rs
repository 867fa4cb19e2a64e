//! [`EventType`]: the validated name of an outbox event.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest event type accepted, in bytes (all valid characters are ASCII).
pub const MAX_EVENT_TYPE_LEN: usize = 255;

/// The fewest dot-separated segments an event type has: `<domain>.<entity>.<verb>`.
pub const MIN_EVENT_TYPE_SEGMENTS: usize = 3;

/// A validated event type: `<domain>.<entity>.<verb>[.<more>]`.
///
/// Three or more dot-separated segments; each segment is lowercase ASCII
/// letters, digits and `-`, and starts with a letter; 255 characters at most.
/// The same rule is a CHECK constraint on `outbox_event.event_type`, so a row
/// written by plain SQL obeys it too.
///
/// # Example
///
/// ```
/// use outbox_model::{EventType, EventTypeError};
///
/// let ty: EventType = "billing.subscription.updated".parse().unwrap();
/// assert_eq!(ty.as_str(), "billing.subscription.updated");
/// assert_eq!(ty.segments().next(), Some("billing"));
///
/// assert_eq!(
///     "billing.updated".parse::<EventType>(),
///     Err(EventTypeError::TooFewSegments { found: 2 })
/// );
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventType(String);

/// Why a string is not a valid [`EventType`]. Positions are byte offsets into
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

impl EventType {
    /// Validates `raw` and wraps it.
    ///
    /// # Errors
    ///
    /// Returns the first rule `raw` breaks, as an [`EventTypeError`].
    pub fn parse(raw: impl Into<String>) -> Result<Self, EventTypeError> {
        let raw = raw.into();
        validate(&raw)?;
        Ok(Self(raw))
    }

    /// The event type as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The dot-separated segments, domain first.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('.')
    }

    /// Unwraps the text.
    #[must_use]
    pub fn into_string(self) -> String {
        self.0
    }
}

fn validate(raw: &str) -> Result<(), EventTypeError> {
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

impl FromStr for EventType {
    type Err = EventTypeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for EventType {
    type Error = EventTypeError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl TryFrom<&str> for EventType {
    type Error = EventTypeError;

    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl AsRef<str> for EventType {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventType({:?})", self.0)
    }
}

impl Serialize for EventType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_names() {
        for ok in [
            "mail.user.welcome",
            "billing.subscription.updated",
            "plugin.hook.workflow.executed",
            "plugin.capability-use.ai.call",
            "a1.b-2.c3",
        ] {
            assert_eq!(
                EventType::parse(ok).map(EventType::into_string),
                Ok(ok.to_owned())
            );
        }
        let max = format!("a.b.{}", "c".repeat(MAX_EVENT_TYPE_LEN - 4));
        assert!(EventType::parse(max).is_ok());
    }

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
            assert_eq!(EventType::parse(raw), Err(expected), "input {raw:?}");
        }
    }

    #[test]
    fn serde_validates() {
        let ok: EventType = serde_json::from_str("\"audit.user.login\"").unwrap();
        assert_eq!(ok.as_str(), "audit.user.login");
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"audit.user.login\"");
        let err = serde_json::from_str::<EventType>("\"audit.login\"").unwrap_err();
        assert!(err.to_string().contains("at least 3"), "{err}");
    }
}
