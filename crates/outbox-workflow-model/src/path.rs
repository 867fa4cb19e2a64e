//! [`VarPath`]: a dotted path into the execution context, the one way blocks
//! read data (`{"var": "input.order.total"}` in a condition or a value,
//! `{{ vars.name }}` in a text).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// The execution context a path reads, as the runner builds it:
///
/// ```json
/// {
///   "input":  { "…": "the trigger's input (event payload, API body, form)" },
///   "vars":   { "<name>": "set by variable blocks" },
///   "blocks": { "<block id>": { "output": "what the block produced" } }
/// }
/// ```
pub mod roots {
    /// The trigger's input.
    pub const INPUT: &str = "input";
    /// Workflow variables, set by `variable` blocks.
    pub const VARS: &str = "vars";
    /// What earlier blocks produced: `blocks.<block id>.output…`.
    pub const BLOCKS: &str = "blocks";
}

/// A validated path into the execution context: dot-separated segments, the
/// first of which is `input`, `vars` or `blocks`; a `blocks` path names a
/// block id next (`blocks.check.output.status`).
///
/// Looking a path up ([`VarPath::lookup`]) walks objects by key and arrays by
/// a decimal index (`input.items.0.sku`). A segment cannot contain a dot, so
/// keys with dots cannot be reached.
///
/// ```
/// use outbox_workflow_model::VarPath;
/// use serde_json::json;
///
/// let path = VarPath::parse("input.items.1.sku").unwrap();
/// let ctx = json!({ "input": { "items": [{ "sku": "a" }, { "sku": "b" }] } });
/// assert_eq!(path.lookup(&ctx), Some(&json!("b")));
/// assert_eq!(VarPath::parse("blocks.fetch.output").unwrap().block(), Some("fetch"));
/// assert!(VarPath::parse("env.SECRET").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarPath(String);

/// Why a string is not a [`VarPath`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The path is empty.
    #[error("empty path; expected e.g. `input.order.total`")]
    Empty,
    /// Two dots in a row, or a leading or trailing dot.
    #[error("path {path:?} has an empty segment at position {segment}")]
    EmptySegment {
        /// The path.
        path: String,
        /// The index of the empty segment.
        segment: usize,
    },
    /// The first segment is not `input`, `vars` or `blocks`.
    #[error("path {path:?} starts with {root:?}; a path starts with `input`, `vars` or `blocks`")]
    UnknownRoot {
        /// The path.
        path: String,
        /// Its first segment.
        root: String,
    },
    /// `blocks` alone: the block id is missing.
    #[error("path {path:?} names no block; expected `blocks.<block id>.output…`")]
    MissingBlockId {
        /// The path.
        path: String,
    },
}

impl VarPath {
    /// Validates `raw` as a path.
    ///
    /// # Errors
    ///
    /// The first rule `raw` breaks, as a [`PathError`].
    pub fn parse(raw: impl Into<String>) -> Result<Self, PathError> {
        let raw = raw.into();
        if raw.is_empty() {
            return Err(PathError::Empty);
        }
        if let Some(segment) = raw.split('.').position(str::is_empty) {
            return Err(PathError::EmptySegment { path: raw, segment });
        }
        let mut segments = raw.split('.');
        let root = segments.next().unwrap_or_default();
        match root {
            roots::INPUT | roots::VARS => {}
            roots::BLOCKS if segments.next().is_some() => {}
            roots::BLOCKS => return Err(PathError::MissingBlockId { path: raw }),
            _ => {
                let root = root.to_owned();
                return Err(PathError::UnknownRoot { path: raw, root });
            }
        }
        Ok(Self(raw))
    }

    /// The path as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The segments, root first.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('.')
    }

    /// The root segment: `input`, `vars` or `blocks` (see [`roots`]).
    #[must_use]
    pub fn root(&self) -> &str {
        self.segments().next().unwrap_or_default()
    }

    /// The block id a `blocks.<id>…` path reads, `None` for other roots.
    #[must_use]
    pub fn block(&self) -> Option<&str> {
        let mut segments = self.segments();
        (segments.next() == Some(roots::BLOCKS))
            .then(|| segments.next())
            .flatten()
    }

    /// The value at this path in `ctx`, `None` when any segment is missing
    /// (or indexes past an array's end, or walks into a scalar).
    #[must_use]
    pub fn lookup<'v>(&self, ctx: &'v Value) -> Option<&'v Value> {
        self.segments().try_fold(ctx, |value, segment| match value {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        })
    }
}

impl fmt::Display for VarPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for VarPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VarPath({:?})", self.0)
    }
}

impl Serialize for VarPath {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for VarPath {
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
    fn parses_and_refuses() {
        assert!(VarPath::parse("input").is_ok());
        assert!(VarPath::parse("vars.x").is_ok());
        assert_eq!(VarPath::parse(""), Err(PathError::Empty));
        assert_eq!(
            VarPath::parse("input..a"),
            Err(PathError::EmptySegment {
                path: "input..a".into(),
                segment: 1
            })
        );
        assert_eq!(
            VarPath::parse("env.HOME"),
            Err(PathError::UnknownRoot {
                path: "env.HOME".into(),
                root: "env".into()
            })
        );
        assert_eq!(
            VarPath::parse("blocks"),
            Err(PathError::MissingBlockId {
                path: "blocks".into()
            })
        );
    }

    #[test]
    fn looks_up_objects_and_arrays() {
        let ctx = json!({
            "input": { "order": { "total": 120, "lines": [{ "sku": "a" }] } },
            "vars": { "x": null },
            "blocks": { "fetch": { "output": { "status": 200 } } }
        });
        let at = |p: &str| VarPath::parse(p).unwrap().lookup(&ctx).cloned();
        assert_eq!(at("input.order.total"), Some(json!(120)));
        assert_eq!(at("input.order.lines.0.sku"), Some(json!("a")));
        assert_eq!(at("input.order.lines.1.sku"), None);
        assert_eq!(at("input.order.lines.x"), None);
        assert_eq!(at("input.order.total.cents"), None);
        assert_eq!(at("vars.x"), Some(Value::Null));
        assert_eq!(at("blocks.fetch.output.status"), Some(json!(200)));
        assert_eq!(VarPath::parse("vars.x").unwrap().block(), None);
    }
}
