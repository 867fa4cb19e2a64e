//! [`BlockParams`]: the typed parameters of every block, one variant per
//! block of the registry.
//!
//! Each block's parameters are a struct that serde reads from the block's
//! `params` object (camelCase keys, unknown keys refused), then a `check`
//! for the rules serde cannot express (non-empty lists, ranges, one of two
//! fields). Both kinds of failure become `DefinitionError::BadParams`
//! naming the field.

mod bridge;
mod effect;
mod flow;
mod trigger;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{BlockKind, Condition, JsonType, OutputShape, VarPath, labels};

pub use bridge::{AiAgentParams, CodeLanguage, CodeParams, MAX_CODE_SOURCE_BYTES};
pub use effect::{
    DEFAULT_HTTP_TIMEOUT_MS, EmailParams, HttpMethod, HttpRequestParams, MAX_HTTP_TIMEOUT_MS,
    RowCreateParams, RowDeleteParams, RowGetParams, RowUpdateParams,
};
pub use flow::{
    IfParams, LogLevel, LogParams, MAX_WAIT_TIMEOUT_MS, SwitchCase, SwitchParams, VariableParams,
    WaitForInputParams,
};
pub use trigger::{
    ApiTriggerParams, EventTriggerParams, InvalidTriggerEvent, ManualTriggerParams, TriggerEvent,
};

/// A rule of a block's parameters that is broken: the field (a path such as
/// `cases[1].label`, `None` for the `params` object itself) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParamError {
    pub(crate) field: Option<String>,
    pub(crate) message: String,
}

impl ParamError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.into()),
            message: message.into(),
        }
    }
}

/// What every parameter struct offers the definition.
pub(crate) trait Params {
    /// The rules serde does not check.
    fn check(&self) -> Result<(), ParamError> {
        Ok(())
    }

    /// Every path the block reads (conditions, operands, text placeholders).
    fn paths<'a>(&'a self, _out: &mut Vec<&'a VarPath>) {}
}

/// The parameters of a block; the variant is the block's type.
///
/// Serialized as the parameter struct alone (the `params` object of a
/// block); the type travels beside it as the block's `type`.
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): a new block breaks
/// every `match` that must handle it, the runner's included.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum BlockParams {
    /// `manualTrigger`.
    ManualTrigger(ManualTriggerParams),
    /// `apiTrigger`.
    ApiTrigger(ApiTriggerParams),
    /// `eventTrigger`.
    EventTrigger(EventTriggerParams),
    /// `if`.
    If(IfParams),
    /// `switch`.
    Switch(SwitchParams),
    /// `email`.
    Email(EmailParams),
    /// `httpRequest`.
    HttpRequest(HttpRequestParams),
    /// `rowGet`.
    RowGet(RowGetParams),
    /// `rowCreate`.
    RowCreate(RowCreateParams),
    /// `rowUpdate`.
    RowUpdate(RowUpdateParams),
    /// `rowDelete`.
    RowDelete(RowDeleteParams),
    /// `waitForInput`.
    WaitForInput(WaitForInputParams),
    /// `log`.
    Log(LogParams),
    /// `variable`.
    Variable(VariableParams),
    /// `code` (bridge only).
    Code(CodeParams),
    /// `aiAgent` (bridge only).
    AiAgent(AiAgentParams),
}

/// Calls `$body` with the parameter struct of any variant bound to `$p`.
macro_rules! each_params {
    ($self:expr, $p:ident => $body:expr) => {
        match $self {
            BlockParams::ManualTrigger($p) => $body,
            BlockParams::ApiTrigger($p) => $body,
            BlockParams::EventTrigger($p) => $body,
            BlockParams::If($p) => $body,
            BlockParams::Switch($p) => $body,
            BlockParams::Email($p) => $body,
            BlockParams::HttpRequest($p) => $body,
            BlockParams::RowGet($p) => $body,
            BlockParams::RowCreate($p) => $body,
            BlockParams::RowUpdate($p) => $body,
            BlockParams::RowDelete($p) => $body,
            BlockParams::WaitForInput($p) => $body,
            BlockParams::Log($p) => $body,
            BlockParams::Variable($p) => $body,
            BlockParams::Code($p) => $body,
            BlockParams::AiAgent($p) => $body,
        }
    };
}

impl BlockParams {
    /// Reads the `params` object of a block of type `kind`. Serde's checks
    /// only: [`BlockParams::check`] runs the other rules.
    pub(crate) fn from_json(kind: BlockKind, params: Value) -> Result<Self, ParamError> {
        use BlockKind as K;
        // serde would also read a struct from an array of its fields in order.
        if !params.is_object() {
            return Err(ParamError {
                field: None,
                message: format!("`params` is an object, not {}", JsonType::of(&params)),
            });
        }
        Ok(match kind {
            K::ManualTrigger => Self::ManualTrigger(parse(params)?),
            K::ApiTrigger => Self::ApiTrigger(parse(params)?),
            K::EventTrigger => Self::EventTrigger(parse(params)?),
            K::If => Self::If(parse(params)?),
            K::Switch => Self::Switch(parse(params)?),
            K::Email => Self::Email(parse(params)?),
            K::HttpRequest => Self::HttpRequest(parse(params)?),
            K::RowGet => Self::RowGet(parse(params)?),
            K::RowCreate => Self::RowCreate(parse(params)?),
            K::RowUpdate => Self::RowUpdate(parse(params)?),
            K::RowDelete => Self::RowDelete(parse(params)?),
            K::WaitForInput => Self::WaitForInput(parse(params)?),
            K::Log => Self::Log(parse(params)?),
            K::Variable => Self::Variable(parse(params)?),
            K::Code => Self::Code(parse(params)?),
            K::AiAgent => Self::AiAgent(parse(params)?),
        })
    }

    /// The block type these parameters belong to.
    #[must_use]
    pub const fn kind(&self) -> BlockKind {
        match self {
            Self::ManualTrigger(_) => BlockKind::ManualTrigger,
            Self::ApiTrigger(_) => BlockKind::ApiTrigger,
            Self::EventTrigger(_) => BlockKind::EventTrigger,
            Self::If(_) => BlockKind::If,
            Self::Switch(_) => BlockKind::Switch,
            Self::Email(_) => BlockKind::Email,
            Self::HttpRequest(_) => BlockKind::HttpRequest,
            Self::RowGet(_) => BlockKind::RowGet,
            Self::RowCreate(_) => BlockKind::RowCreate,
            Self::RowUpdate(_) => BlockKind::RowUpdate,
            Self::RowDelete(_) => BlockKind::RowDelete,
            Self::WaitForInput(_) => BlockKind::WaitForInput,
            Self::Log(_) => BlockKind::Log,
            Self::Variable(_) => BlockKind::Variable,
            Self::Code(_) => BlockKind::Code,
            Self::AiAgent(_) => BlockKind::AiAgent,
        }
    }

    /// The rules of the parameters that serde does not check.
    pub(crate) fn check(&self) -> Result<(), ParamError> {
        each_params!(self, p => p.check())
    }

    /// Every path the block reads.
    #[must_use]
    pub fn paths(&self) -> Vec<&VarPath> {
        let mut out = Vec::new();
        each_params!(self, p => p.paths(&mut out));
        out
    }

    /// The conditions of an `if` or a `switch` (in case order), none for
    /// other blocks.
    #[must_use]
    pub fn conditions(&self) -> Vec<&Condition> {
        match self {
            Self::If(p) => vec![&p.condition],
            Self::Switch(p) => p.cases.iter().map(|case| &case.condition).collect(),
            _ => Vec::new(),
        }
    }

    /// The output labels an edge out of this block may carry, in a fixed
    /// order (see [`OutputShape`]).
    #[must_use]
    pub fn outputs(&self) -> Vec<&str> {
        match (self.kind().spec().outputs, self) {
            (OutputShape::TrueFalse, _) => vec![labels::TRUE, labels::FALSE],
            (OutputShape::SwitchCases, Self::Switch(p)) => p
                .cases
                .iter()
                .map(|case| case.label.as_str())
                .chain([labels::DEFAULT])
                .collect(),
            (OutputShape::InputOrTimeout, Self::WaitForInput(p)) if p.timeout_ms.is_some() => {
                vec![labels::INPUT, labels::TIMEOUT]
            }
            (OutputShape::InputOrTimeout, _) => vec![labels::INPUT],
            _ => vec![labels::NEXT],
        }
    }

    /// The credential id the block names, if any (`httpRequest`, `aiAgent`).
    #[must_use]
    pub fn credential_id(&self) -> Option<&str> {
        match self {
            Self::HttpRequest(p) => p.credential_id.as_deref(),
            Self::AiAgent(p) => Some(&p.credential_id),
            _ => None,
        }
    }
}

/// Deserializes `params` with the path of the failing field.
fn parse<T: DeserializeOwned>(params: Value) -> Result<T, ParamError> {
    serde_path_to_error::deserialize(params).map_err(|err| {
        let path = err.path().to_string();
        let message = err.inner().to_string();
        // serde reports a missing field at the object holding it: name it.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next());
        let field = match (path.as_str(), missing) {
            (".", None) => None,
            (".", Some(name)) => Some(name.to_owned()),
            (path, Some(name)) => Some(format!("{path}.{name}")),
            (path, None) => Some(path.to_owned()),
        };
        ParamError { field, message }
    })
}

/// Fails with `field` and `message` unless `ok`.
pub(crate) fn ensure(ok: bool, field: &str, message: impl Into<String>) -> Result<(), ParamError> {
    if ok {
        Ok(())
    } else {
        Err(ParamError::new(field, message))
    }
}
