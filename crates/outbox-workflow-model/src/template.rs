//! [`TextTemplate`]: text with `{{ path }}` placeholders, for the string
//! parameters of blocks (a mail's subject, a URL, a log message).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::{PathError, VarPath};

/// A text parameter: literal text with `{{ path }}` placeholders (spaces
/// inside the braces are optional), each path a [`VarPath`].
///
/// [`TextTemplate::render`] replaces a placeholder by the string at its path
/// as it is, by nothing when the path is missing or `null`, and by the
/// compact JSON text of any other value (`42`, `true`, `{"a":1}`). Nothing
/// is escaped, and the result is not parsed again. There is no way to
/// write a literal `{{`.
///
/// ```
/// use outbox_workflow_model::TextTemplate;
/// use serde_json::json;
///
/// let subject = TextTemplate::parse("Order {{ input.order.id }}: {{input.order.total}} EUR").unwrap();
/// let ctx = json!({ "input": { "order": { "id": "A-7", "total": 120 } } });
/// assert_eq!(subject.render(&ctx), "Order A-7: 120 EUR");
/// assert!(TextTemplate::parse("Hello {{ input.name").is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct TextTemplate {
    raw: String,
    parts: Vec<Part>,
}

#[derive(Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Var(VarPath),
}

/// Why a string is not a [`TextTemplate`]. Offsets are bytes into the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// A `{{` without its `}}`.
    #[error("`{{{{` at byte {offset} is not closed by `}}}}`")]
    Unclosed {
        /// Where the placeholder starts.
        offset: usize,
    },
    /// The text between the braces is not a path.
    #[error("placeholder at byte {offset}: {source}")]
    BadPath {
        /// Where the placeholder starts.
        offset: usize,
        /// Why the path is refused.
        source: PathError,
    },
}

impl TextTemplate {
    /// Parses `raw`.
    ///
    /// # Errors
    ///
    /// The first placeholder that is unclosed or holds no valid path.
    pub fn parse(raw: impl Into<String>) -> Result<Self, TemplateError> {
        let raw = raw.into();
        let mut parts = Vec::new();
        let mut rest = raw.as_str();
        let mut offset = 0;
        while let Some(start) = rest.find("{{") {
            if start > 0 {
                parts.push(Part::Text(rest[..start].to_owned()));
            }
            let placeholder = offset + start;
            let after = &rest[start + 2..];
            let end = after.find("}}").ok_or(TemplateError::Unclosed {
                offset: placeholder,
            })?;
            let path =
                VarPath::parse(after[..end].trim()).map_err(|source| TemplateError::BadPath {
                    offset: placeholder,
                    source,
                })?;
            parts.push(Part::Var(path));
            let consumed = start + 2 + end + 2;
            offset += consumed;
            rest = &rest[consumed..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Self { raw, parts })
    }

    /// The text as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The paths of the placeholders, in order.
    pub fn placeholders(&self) -> impl Iterator<Item = &VarPath> {
        self.parts.iter().filter_map(|part| match part {
            Part::Var(path) => Some(path),
            Part::Text(_) => None,
        })
    }

    /// True when the text has no placeholder.
    #[must_use]
    pub fn is_literal(&self) -> bool {
        self.placeholders().next().is_none()
    }

    /// The text with every placeholder replaced from `ctx` (see the type's
    /// documentation).
    #[must_use]
    pub fn render(&self, ctx: &Value) -> String {
        let mut out = String::with_capacity(self.raw.len());
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Var(path) => match path.lookup(ctx) {
                    None | Some(Value::Null) => {}
                    Some(Value::String(text)) => out.push_str(text),
                    Some(other) => out.push_str(&other.to_string()),
                },
            }
        }
        out
    }
}

impl fmt::Debug for TextTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TextTemplate({:?})", self.raw)
    }
}

impl fmt::Display for TextTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl Serialize for TextTemplate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.raw)
    }
}

impl<'de> Deserialize<'de> for TextTemplate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_each_kind_of_value() {
        let ctx = json!({ "input": { "s": "x", "n": 4, "b": false, "o": { "a": 1 }, "z": null } });
        let t = TextTemplate::parse(
            "[{{input.s}}|{{ input.n }}|{{input.b}}|{{input.o}}|{{input.z}}|{{input.none}}]",
        )
        .unwrap();
        assert_eq!(t.render(&ctx), "[x|4|false|{\"a\":1}||]");
        assert_eq!(t.placeholders().count(), 6);
        assert!(!t.is_literal());
        assert!(TextTemplate::parse("no braces } {").unwrap().is_literal());
    }

    #[test]
    fn refuses_bad_placeholders() {
        assert_eq!(
            TextTemplate::parse("ab {{input.x").unwrap_err(),
            TemplateError::Unclosed { offset: 3 }
        );
        assert!(matches!(
            TextTemplate::parse("{{input.a}} {{ secrets.key }}").unwrap_err(),
            TemplateError::BadPath { offset: 12, .. }
        ));
    }
}
