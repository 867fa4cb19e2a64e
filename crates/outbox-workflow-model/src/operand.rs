//! [`Operand`]: a literal JSON value or a path into the execution context.

use std::fmt;

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::VarPath;

/// The key that makes an object a path: `{"var": "input.order.total"}`.
pub const VAR_KEY: &str = "var";

static NULL: Value = Value::Null;

/// A value a block reads: a literal, or a path into the execution context.
///
/// In JSON, an object with the single key `var` and a string value is a path
/// (`{"var": "vars.total"}`); anything else is a literal (`100`, `"paid"`,
/// `[1, 2]`, `{"a": 1}`). An object whose only key is `var` cannot be written
/// as a literal, and `{"var": 5}` is refused.
///
/// ```
/// use outbox_workflow_model::Operand;
/// use serde_json::json;
///
/// let total: Operand = serde_json::from_value(json!({ "var": "input.total" })).unwrap();
/// let ctx = json!({ "input": { "total": 120 } });
/// assert_eq!(total.resolve(&ctx), &json!(120));
/// let missing: Operand = serde_json::from_value(json!({ "var": "input.none" })).unwrap();
/// assert_eq!(missing.resolve(&ctx), &json!(null));
/// ```
#[derive(Clone, PartialEq)]
pub enum Operand {
    /// A path, resolved when the block runs; a missing path reads as `null`.
    Var(VarPath),
    /// A literal value.
    Literal(Value),
}

impl Operand {
    /// The value in `ctx`: the literal itself, or what the path points to
    /// (`null` when it is missing).
    #[must_use]
    pub fn resolve<'a>(&'a self, ctx: &'a Value) -> &'a Value {
        match self {
            Self::Literal(value) => value,
            Self::Var(path) => path.lookup(ctx).unwrap_or(&NULL),
        }
    }

    /// The path, if this operand is one.
    #[must_use]
    pub fn path(&self) -> Option<&VarPath> {
        match self {
            Self::Var(path) => Some(path),
            Self::Literal(_) => None,
        }
    }
}

impl fmt::Debug for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Var(path) => write!(f, "Var({path})"),
            Self::Literal(value) => write!(f, "Literal({value})"),
        }
    }
}

impl From<VarPath> for Operand {
    fn from(path: VarPath) -> Self {
        Self::Var(path)
    }
}

impl From<Value> for Operand {
    fn from(value: Value) -> Self {
        Self::Literal(value)
    }
}

impl Serialize for Operand {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Literal(value) => value.serialize(serializer),
            Self::Var(path) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry(VAR_KEY, path)?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Operand {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        match value {
            Value::Object(map) if map.len() == 1 && map.contains_key(VAR_KEY) => {
                match map.into_iter().next() {
                    Some((_, Value::String(path))) => VarPath::parse(path)
                        .map(Self::Var)
                        .map_err(D::Error::custom),
                    _ => Err(D::Error::custom(
                        "`var` takes a path string such as \"input.order.total\"",
                    )),
                }
            }
            literal => Ok(Self::Literal(literal)),
        }
    }
}
