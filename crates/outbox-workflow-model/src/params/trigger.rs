//! Parameters of the trigger blocks.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{ParamError, Params, ensure};
use crate::names::is_identifier;

/// `manualTrigger`: no parameters. The run's input is what the person
/// submitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManualTriggerParams {}

/// `apiTrigger`: no parameters. The run's input is the API request's body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiTriggerParams {}

/// `eventTrigger`: the entity and the event the workflow listens to. The
/// run's input is the event's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventTriggerParams {
    /// The entity whose events start the workflow (`order`): an identifier.
    pub entity: String,
    /// The event: a row event or a custom application event.
    pub event: TriggerEvent,
}

impl EventTriggerParams {
    /// True when an event `event` on `entity` starts this workflow (exact,
    /// case-sensitive match of both).
    #[must_use]
    pub fn matches(&self, entity: &str, event: &str) -> bool {
        self.entity == entity && self.event.as_str() == event
    }
}

impl Params for EventTriggerParams {
    fn check(&self) -> Result<(), ParamError> {
        ensure(
            is_identifier(&self.entity),
            "entity",
            format!(
                "{:?} is not an entity name (a letter or `_`, then letters, digits or `_`, 64 at most)",
                self.entity
            ),
        )
    }
}

impl Params for ManualTriggerParams {}
impl Params for ApiTriggerParams {}

/// The longest custom event name.
const MAX_EVENT_LEN: usize = 255;

/// The event an `eventTrigger` listens to. Serialized as its name:
/// `row.created`, `row.updated`, `row.deleted`, or a custom application
/// event name (1 to 255 ASCII letters, digits, `.`, `_`, `-` or `:`,
/// starting with a letter). Names under `row.` are reserved for the three
/// row events.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TriggerEvent {
    /// `row.created`.
    RowCreated,
    /// `row.updated`.
    RowUpdated,
    /// `row.deleted`.
    RowDeleted,
    /// An application event, by name (`invoice.paid`).
    Custom(String),
}

/// A string that is not a [`TriggerEvent`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{event:?} is not a trigger event: {reason}")]
pub struct InvalidTriggerEvent {
    /// The name as written.
    pub event: String,
    /// The rule it breaks.
    pub reason: &'static str,
}

impl TriggerEvent {
    /// The event's name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            Self::RowCreated => "row.created",
            Self::RowUpdated => "row.updated",
            Self::RowDeleted => "row.deleted",
            Self::Custom(name) => name,
        }
    }
}

impl FromStr for TriggerEvent {
    type Err = InvalidTriggerEvent;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let refuse = |reason| {
            Err(InvalidTriggerEvent {
                event: s.to_owned(),
                reason,
            })
        };
        match s {
            "row.created" => return Ok(Self::RowCreated),
            "row.updated" => return Ok(Self::RowUpdated),
            "row.deleted" => return Ok(Self::RowDeleted),
            _ => {}
        }
        if s.starts_with("row.") {
            return refuse("the row events are row.created, row.updated and row.deleted");
        }
        if s.is_empty() || s.len() > MAX_EVENT_LEN {
            return refuse("an event name has 1 to 255 characters");
        }
        if !s.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return refuse("an event name starts with a letter");
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
        {
            return refuse("an event name has only ASCII letters, digits, '.', '_', '-' and ':'");
        }
        Ok(Self::Custom(s.to_owned()))
    }
}

impl fmt::Display for TriggerEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TriggerEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TriggerEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_events() {
        assert_eq!("row.created".parse(), Ok(TriggerEvent::RowCreated));
        assert_eq!("row.deleted".parse(), Ok(TriggerEvent::RowDeleted));
        assert_eq!(
            "invoice.paid".parse(),
            Ok(TriggerEvent::Custom("invoice.paid".into()))
        );
        for bad in ["row.archived", "", "1st", "a b", &"a".repeat(256)] {
            assert!(bad.parse::<TriggerEvent>().is_err(), "{bad:?}");
        }
        let params = EventTriggerParams {
            entity: "order".into(),
            event: TriggerEvent::RowCreated,
        };
        assert!(params.matches("order", "row.created"));
        assert!(!params.matches("order", "row.updated"));
        assert!(!params.matches("invoice", "row.created"));
    }
}
