//! [`EventType`]: the validated name of an outbox event. The rule itself
//! and its errors are `outbox-event-type`'s, re-exported here.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use outbox_event_type::{EventTypeError, MAX_EVENT_TYPE_LEN, MIN_EVENT_TYPE_SEGMENTS};

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

impl EventType {
    /// Validates `raw` and wraps it.
    ///
    /// # Errors
    ///
    /// Returns the first rule `raw` breaks, as an [`EventTypeError`].
    pub fn parse(raw: impl Into<String>) -> Result<Self, EventTypeError> {
        let raw = raw.into();
        outbox_event_type::check(&raw)?;
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
    fn serde_validates() {
        let ok: EventType = serde_json::from_str("\"audit.user.login\"").unwrap();
        assert_eq!(ok.as_str(), "audit.user.login");
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"audit.user.login\"");
        let err = serde_json::from_str::<EventType>("\"audit.login\"").unwrap_err();
        assert!(err.to_string().contains("at least 3"), "{err}");
    }
}
