//! [`Condition`]: the small, safe expression language of `if` and `switch`.
//! It compares values and combines comparisons; it cannot call anything.

use std::cmp::Ordering;
use std::fmt;

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Number, Value};

use crate::Operand;

/// The deepest a condition may nest: a comparison is depth 1, and each
/// `all`, `any` or `not` around it adds one. Checked by validation
/// (`DefinitionError::ConditionTooDeep`) and again by
/// [`Condition::evaluate`].
pub const MAX_CONDITION_DEPTH: usize = 10;

/// A comparison operator. Serialized as `eq`, `ne`, `gt`, `gte`, `lt`,
/// `lte`, `contains`, `startsWith`, `exists`, `in`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CompareOp {
    /// Equal: numbers by value (`1 == 1.0`), everything else structurally.
    Eq,
    /// Not [`CompareOp::Eq`].
    Ne,
    /// Greater than; numbers only.
    Gt,
    /// Greater than or equal; numbers only.
    Gte,
    /// Less than; numbers only.
    Lt,
    /// Less than or equal; numbers only.
    Lte,
    /// A string contains a substring, an array contains an element (by
    /// [`CompareOp::Eq`]), or an object contains a key.
    Contains,
    /// A string starts with a string.
    StartsWith,
    /// `left` is present and not `null`; takes no `right`.
    Exists,
    /// `left` equals an element of the array `right`.
    In,
}

impl CompareOp {
    /// The operator as written in JSON.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Eq => "eq",
            Self::Ne => "ne",
            Self::Gt => "gt",
            Self::Gte => "gte",
            Self::Lt => "lt",
            Self::Lte => "lte",
            Self::Contains => "contains",
            Self::StartsWith => "startsWith",
            Self::Exists => "exists",
            Self::In => "in",
        }
    }
}

impl fmt::Display for CompareOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The type of a JSON value, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JsonType {
    /// `null`, or a missing path.
    Null,
    /// `true` or `false`.
    Bool,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl JsonType {
    /// The type of `value`.
    #[must_use]
    pub fn of(value: &Value) -> Self {
        match value {
            Value::Null => Self::Null,
            Value::Bool(_) => Self::Bool,
            Value::Number(_) => Self::Number,
            Value::String(_) => Self::String,
            Value::Array(_) => Self::Array,
            Value::Object(_) => Self::Object,
        }
    }
}

impl fmt::Display for JsonType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Null => "null",
            Self::Bool => "boolean",
            Self::Number => "number",
            Self::String => "string",
            Self::Array => "array",
            Self::Object => "object",
        })
    }
}

/// Why a condition could not be evaluated. The same condition on the same
/// context fails the same way: a runner treats these as failures of the
/// block, not as `false`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConditionError {
    /// `gt`, `gte`, `lt` or `lte` on something other than two numbers (a
    /// missing path is `null`).
    #[error("`{op}` compares numbers; got {left} and {right}")]
    NotNumbers {
        /// The operator.
        op: CompareOp,
        /// The left operand's type.
        left: JsonType,
        /// The right operand's type.
        right: JsonType,
    },
    /// `contains`, `startsWith` or `in` on operands it does not apply to.
    #[error("`{op}` does not apply to {left} and {right}")]
    InvalidOperands {
        /// The operator.
        op: CompareOp,
        /// The left operand's type.
        left: JsonType,
        /// The right operand's type.
        right: JsonType,
    },
    /// A comparison other than `exists` without a `right` operand (only a
    /// condition built in code can lack it; parsing refuses it).
    #[error("`{op}` needs a `right` operand")]
    MissingRight {
        /// The operator.
        op: CompareOp,
    },
    /// Nested deeper than [`MAX_CONDITION_DEPTH`].
    #[error("condition nests {depth} levels deep; at most {MAX_CONDITION_DEPTH} are allowed")]
    TooDeep {
        /// The condition's depth.
        depth: usize,
    },
}

/// A condition of `if` and `switch`.
///
/// In JSON, a comparison `{"left": <operand>, "op": "gt", "right": <operand>}`
/// (`exists` takes no `right`), or a combination `{"all": [...]}`,
/// `{"any": [...]}`, `{"not": <condition>}`. Operands are literals or paths
/// (see [`Operand`]).
///
/// ```
/// use outbox_workflow_model::Condition;
/// use serde_json::json;
///
/// let big: Condition = serde_json::from_value(json!({
///     "all": [
///         { "left": { "var": "input.order.total" }, "op": "gt", "right": 100 },
///         { "not": { "left": { "var": "input.order.country" }, "op": "in", "right": ["XX"] } }
///     ]
/// })).unwrap();
/// let ctx = json!({ "input": { "order": { "total": 120, "country": "FR" } } });
/// assert_eq!(big.evaluate(&ctx), Ok(true));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// A comparison of two operands.
    Compare {
        /// The left operand.
        left: Operand,
        /// The operator.
        op: CompareOp,
        /// The right operand; `None` only for `exists`.
        right: Option<Operand>,
    },
    /// Every condition holds (true when empty).
    All(Vec<Condition>),
    /// At least one condition holds (false when empty).
    Any(Vec<Condition>),
    /// The condition does not hold.
    Not(Box<Condition>),
}

impl Condition {
    /// How deep the condition nests: 1 for a comparison (or an empty
    /// `all`/`any`), plus one per `all`, `any` or `not` around it. Computed
    /// without recursion, so any condition built in code can be measured.
    #[must_use]
    pub fn depth(&self) -> usize {
        let mut deepest = 0;
        let mut stack = vec![(self, 1)];
        while let Some((condition, depth)) = stack.pop() {
            deepest = deepest.max(depth);
            match condition {
                Self::Compare { .. } => {}
                Self::All(items) | Self::Any(items) => {
                    stack.extend(items.iter().map(|item| (item, depth + 1)));
                }
                Self::Not(inner) => stack.push((inner, depth + 1)),
            }
        }
        deepest
    }

    /// The operands of every comparison, in no particular order.
    #[must_use]
    pub fn operands(&self) -> Vec<&Operand> {
        let mut found = Vec::new();
        let mut stack = vec![self];
        while let Some(condition) = stack.pop() {
            match condition {
                Self::Compare { left, right, .. } => {
                    found.push(left);
                    found.extend(right);
                }
                Self::All(items) | Self::Any(items) => stack.extend(items),
                Self::Not(inner) => stack.push(inner),
            }
        }
        found
    }

    /// Evaluates the condition against the execution context `ctx`.
    ///
    /// Semantics: paths that are missing read as `null`; `all` and `any`
    /// evaluate left to right and stop at the first `false` (`all`) or
    /// `true` (`any`), so an error after that point is not reported; `eq`
    /// compares numbers by value and everything else structurally; ordering
    /// operators take two numbers (integers exactly, otherwise as `f64`);
    /// see [`CompareOp`] for the others.
    ///
    /// # Errors
    ///
    /// [`ConditionError::TooDeep`] before anything is evaluated; otherwise
    /// the first comparison whose operands the operator does not apply to.
    pub fn evaluate(&self, ctx: &Value) -> Result<bool, ConditionError> {
        let depth = self.depth();
        if depth > MAX_CONDITION_DEPTH {
            return Err(ConditionError::TooDeep { depth });
        }
        self.eval(ctx)
    }

    fn eval(&self, ctx: &Value) -> Result<bool, ConditionError> {
        match self {
            Self::Compare { left, op, right } => {
                let left = left.resolve(ctx);
                let right = match right {
                    Some(right) => right.resolve(ctx),
                    None if *op == CompareOp::Exists => &Value::Null,
                    None => return Err(ConditionError::MissingRight { op: *op }),
                };
                compare(left, *op, right)
            }
            Self::All(items) => {
                for item in items {
                    if !item.eval(ctx)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Self::Any(items) => {
                for item in items {
                    if item.eval(ctx)? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            Self::Not(inner) => inner.eval(ctx).map(|holds| !holds),
        }
    }
}

fn compare(left: &Value, op: CompareOp, right: &Value) -> Result<bool, ConditionError> {
    let invalid = || ConditionError::InvalidOperands {
        op,
        left: JsonType::of(left),
        right: JsonType::of(right),
    };
    match op {
        CompareOp::Eq => Ok(equal(left, right)),
        CompareOp::Ne => Ok(!equal(left, right)),
        CompareOp::Gt | CompareOp::Gte | CompareOp::Lt | CompareOp::Lte => {
            let (Value::Number(l), Value::Number(r)) = (left, right) else {
                return Err(ConditionError::NotNumbers {
                    op,
                    left: JsonType::of(left),
                    right: JsonType::of(right),
                });
            };
            let ordering = compare_numbers(l, r);
            Ok(match op {
                CompareOp::Gt => ordering == Ordering::Greater,
                CompareOp::Gte => ordering != Ordering::Less,
                CompareOp::Lt => ordering == Ordering::Less,
                _ => ordering != Ordering::Greater,
            })
        }
        CompareOp::Contains => match (left, right) {
            (Value::String(haystack), Value::String(needle)) => Ok(haystack.contains(needle)),
            (Value::Array(items), _) => Ok(items.iter().any(|item| equal(item, right))),
            (Value::Object(map), Value::String(key)) => Ok(map.contains_key(key)),
            _ => Err(invalid()),
        },
        CompareOp::StartsWith => match (left, right) {
            (Value::String(text), Value::String(prefix)) => Ok(text.starts_with(prefix)),
            _ => Err(invalid()),
        },
        CompareOp::Exists => Ok(!left.is_null()),
        CompareOp::In => match right {
            Value::Array(items) => Ok(items.iter().any(|item| equal(left, item))),
            _ => Err(invalid()),
        },
    }
}

fn equal(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(l), Value::Number(r)) => compare_numbers(l, r) == Ordering::Equal,
        _ => left == right,
    }
}

/// Integers compare exactly (including `i64` against `u64`); anything with
/// a fraction compares as `f64`. JSON has no NaN, so the order is total.
fn compare_numbers(left: &Number, right: &Number) -> Ordering {
    if let (Some(l), Some(r)) = (left.as_i64(), right.as_i64()) {
        return l.cmp(&r);
    }
    if let (Some(l), Some(r)) = (left.as_u64(), right.as_u64()) {
        return l.cmp(&r);
    }
    match (left.as_i64(), right.as_u64(), left.as_u64(), right.as_i64()) {
        // A negative i64 against a u64 above i64::MAX, and the reverse.
        (Some(_), Some(_), None, None) => Ordering::Less,
        (None, None, Some(_), Some(_)) => Ordering::Greater,
        _ => {
            let (l, r) = (left.as_f64().unwrap_or(0.0), right.as_f64().unwrap_or(0.0));
            l.partial_cmp(&r).unwrap_or(Ordering::Equal)
        }
    }
}

/// The JSON form, every key optional so that the shape can be checked with
/// precise messages. `left` and `right` keep an explicit `null`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    #[serde(default, deserialize_with = "present")]
    left: Option<Operand>,
    op: Option<CompareOp>,
    #[serde(default, deserialize_with = "present")]
    right: Option<Operand>,
    all: Option<Vec<Condition>>,
    any: Option<Vec<Condition>>,
    not: Option<Box<Condition>>,
}

fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Operand>, D::Error> {
    Operand::deserialize(deserializer).map(Some)
}

const SHAPES: &str = "a condition is `{\"left\", \"op\", \"right\"}`, `{\"all\": [...]}`, \
                      `{\"any\": [...]}` or `{\"not\": {...}}`";

impl TryFrom<Wire> for Condition {
    type Error = String;

    fn try_from(wire: Wire) -> Result<Self, String> {
        let compare = wire.left.is_some() || wire.op.is_some() || wire.right.is_some();
        let forms = [
            ("left/op/right", compare),
            ("all", wire.all.is_some()),
            ("any", wire.any.is_some()),
            ("not", wire.not.is_some()),
        ];
        let given: Vec<&str> = forms.iter().filter(|f| f.1).map(|f| f.0).collect();
        if given.len() != 1 {
            return Err(if given.is_empty() {
                format!("empty condition; {SHAPES}")
            } else {
                format!("mixes {}; {SHAPES}", given.join(" and "))
            });
        }
        if let Some(items) = wire.all {
            return Ok(Self::All(items));
        }
        if let Some(items) = wire.any {
            return Ok(Self::Any(items));
        }
        if let Some(inner) = wire.not {
            return Ok(Self::Not(inner));
        }
        let op = wire.op.ok_or("comparison without `op`")?;
        let left = wire.left.ok_or_else(|| format!("`{op}` without `left`"))?;
        match (op, wire.right) {
            (CompareOp::Exists, Some(_)) => Err("`exists` takes no `right`".to_owned()),
            (CompareOp::Exists, None) => Ok(Self::Compare {
                left,
                op,
                right: None,
            }),
            (_, None) => Err(format!("`{op}` without `right`")),
            (_, right) => Ok(Self::Compare { left, op, right }),
        }
    }
}

impl<'de> Deserialize<'de> for Condition {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Wire::deserialize(deserializer)?
            .try_into()
            .map_err(D::Error::custom)
    }
}

impl Serialize for Condition {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        match self {
            Self::Compare { left, op, right } => {
                map.serialize_entry("left", left)?;
                map.serialize_entry("op", op)?;
                if let Some(right) = right {
                    map.serialize_entry("right", right)?;
                }
            }
            Self::All(items) => map.serialize_entry("all", items)?,
            Self::Any(items) => map.serialize_entry("any", items)?,
            Self::Not(inner) => map.serialize_entry("not", inner)?,
        }
        map.end()
    }
}
