//! [`WorkflowDefinition`]: blocks and the edges between them, as stored and
//! exchanged (JSON), before validation.

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::params::ParamError;
use crate::{BlockKind, BlockParams, DefinitionError, ValidatedWorkflow};

/// A workflow as written: its blocks and the edges between them.
///
/// ```json
/// {
///   "blocks": [
///     { "id": "start", "type": "eventTrigger", "params": { "entity": "order", "event": "row.created" } },
///     { "id": "note", "type": "log", "name": "Say so", "params": { "message": "order {{ input.id }}" } }
///   ],
///   "edges": [{ "from": "start", "to": "note" }]
/// }
/// ```
///
/// Read it with [`WorkflowDefinition::from_json`] (typed errors) or serde
/// (the same errors as text), check it with [`WorkflowDefinition::validate`].
/// Unknown keys are refused at every level.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowDefinition {
    /// The blocks, in the order the author gave them (errors and the
    /// topological order break ties by it).
    pub blocks: Vec<Block>,
    /// The edges; `edges` may be absent in JSON (a lone trigger).
    pub edges: Vec<Edge>,
}

/// One block: its id, its optional display name, and its typed parameters
/// (which carry its type).
///
/// In JSON: `{ "id": "...", "type": "<block id of the registry>", "name":
/// "...", "params": { ... } }`; `name` and `params` may be absent (absent
/// `params` reads as `{}`).
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// The block's id, unique in the workflow: 1 to 64 ASCII letters,
    /// digits, `_` or `-`. Paths read its output as `blocks.<id>.output`.
    pub id: String,
    /// A display name.
    pub name: Option<String>,
    /// The parameters; [`BlockParams::kind`] is the block's type.
    pub params: BlockParams,
}

impl Block {
    /// A block without a display name.
    pub fn new(id: impl Into<String>, params: BlockParams) -> Self {
        Self {
            id: id.into(),
            name: None,
            params,
        }
    }

    /// The same block with a display name.
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The block's type.
    #[must_use]
    pub const fn kind(&self) -> BlockKind {
        self.params.kind()
    }
}

/// An edge: after `from` takes the output `label`, `to` runs.
///
/// Without a label, an edge means `next`, the output of every block with a
/// single output; out of `if`, `switch` and `waitForInput` a label is
/// required.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Edge {
    /// The source block's id.
    pub from: String,
    /// The target block's id.
    pub to: String,
    /// The output of `from` this edge leaves (`true`, a switch case label,
    /// …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

impl Edge {
    /// An edge leaving `from`'s single output.
    pub fn new(from: impl Into<String>, to: impl Into<String>) -> Self {
        Self {
            from: from.into(),
            to: to.into(),
            label: None,
        }
    }

    /// An edge leaving `from`'s output `label`.
    pub fn labelled(
        from: impl Into<String>,
        to: impl Into<String>,
        label: impl Into<String>,
    ) -> Self {
        Self {
            from: from.into(),
            to: to.into(),
            label: Some(label.into()),
        }
    }
}

/// The JSON form, with each block's type and parameters still untyped so
/// that an unknown type or bad parameters name their block.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawDefinition {
    blocks: Vec<RawBlock>,
    #[serde(default)]
    edges: Vec<Edge>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawBlock {
    id: String,
    #[serde(rename = "type")]
    block_type: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    params: Option<Value>,
}

impl RawBlock {
    fn into_block(self) -> Result<Block, DefinitionError> {
        let Ok(kind) = self.block_type.parse::<BlockKind>() else {
            return Err(DefinitionError::UnknownBlock {
                block: self.id,
                block_type: self.block_type,
            });
        };
        let params = self
            .params
            .unwrap_or_else(|| Value::Object(Default::default()));
        match BlockParams::from_json(kind, params) {
            Ok(params) => Ok(Block {
                id: self.id,
                name: self.name,
                params,
            }),
            Err(ParamError { field, message }) => Err(DefinitionError::BadParams {
                block: self.id,
                kind,
                field,
                message,
            }),
        }
    }
}

impl RawDefinition {
    fn into_definition(self) -> Result<WorkflowDefinition, DefinitionError> {
        let blocks = self
            .blocks
            .into_iter()
            .map(RawBlock::into_block)
            .collect::<Result<_, _>>()?;
        Ok(WorkflowDefinition {
            blocks,
            edges: self.edges,
        })
    }
}

fn malformed(err: serde_path_to_error::Error<serde_json::Error>) -> DefinitionError {
    DefinitionError::Malformed {
        path: err.path().to_string(),
        message: err.into_inner().to_string(),
    }
}

impl WorkflowDefinition {
    /// Parses a definition from JSON text. Checks the shape and each
    /// block's type and parameters as serde reads them; the other rules
    /// are [`WorkflowDefinition::validate`]'s.
    ///
    /// # Errors
    ///
    /// [`DefinitionError::Malformed`], [`DefinitionError::UnknownBlock`] or
    /// [`DefinitionError::BadParams`], for the first problem in document
    /// order.
    pub fn from_json(json: &str) -> Result<Self, DefinitionError> {
        let mut de = serde_json::Deserializer::from_str(json);
        let raw: RawDefinition = serde_path_to_error::deserialize(&mut de).map_err(malformed)?;
        de.end().map_err(|err| DefinitionError::Malformed {
            path: ".".to_owned(),
            message: err.to_string(),
        })?;
        raw.into_definition()
    }

    /// Parses a definition from a JSON value, as [`WorkflowDefinition::from_json`].
    ///
    /// # Errors
    ///
    /// As [`WorkflowDefinition::from_json`].
    pub fn from_value(value: Value) -> Result<Self, DefinitionError> {
        let raw: RawDefinition = serde_path_to_error::deserialize(value).map_err(malformed)?;
        raw.into_definition()
    }

    /// Checks every rule (see [`DefinitionError`]) and returns the form a
    /// runner uses.
    ///
    /// # Errors
    ///
    /// The first rule broken.
    pub fn validate(&self) -> Result<ValidatedWorkflow, DefinitionError> {
        crate::validate::validate(self.clone())
    }

    /// The block with id `id` (the first, if ids repeat).
    #[must_use]
    pub fn block(&self, id: &str) -> Option<&Block> {
        self.blocks.iter().find(|block| block.id == id)
    }
}

impl<'de> Deserialize<'de> for WorkflowDefinition {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RawDefinition::deserialize(deserializer)?
            .into_definition()
            .map_err(D::Error::custom)
    }
}

impl Serialize for Block {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("type", &self.kind())?;
        if let Some(name) = &self.name {
            map.serialize_entry("name", name)?;
        }
        map.serialize_entry("params", &self.params)?;
        map.end()
    }
}

impl<'de> Deserialize<'de> for Block {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RawBlock::deserialize(deserializer)?
            .into_block()
            .map_err(D::Error::custom)
    }
}
