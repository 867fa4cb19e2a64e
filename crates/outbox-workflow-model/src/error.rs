//! [`DefinitionError`] and [`PreflightError`]: why a definition is refused,
//! and why a valid one cannot run on a given executor.

use crate::BlockKind;

/// Why a workflow definition is refused: one variant per rule, each naming
/// the block (by id) and, for edges, the edge (by its index in `edges`, with
/// both ends).
///
/// Parsing ([`crate::WorkflowDefinition::from_json`]) reports the first of
/// `Malformed`, `UnknownBlock` and `BadParams` (serde's checks) in document
/// order; [`crate::WorkflowDefinition::validate`] then checks, in this
/// order, every block (`InvalidBlockId`, `DuplicateBlockId`, `BadParams`,
/// `ConditionTooDeep`), the paths they read (`UnknownBlockReference`), the
/// trigger (`NoTrigger`, `MultipleTriggers`), every edge (`DanglingEdge`,
/// `MissingLabel`, `UnknownLabel`, `EdgeIntoTrigger`, `DuplicateOutput`),
/// then the graph (`Cycle`, `Unreachable`), and reports the first rule
/// broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// The JSON is not a definition: a syntax error, a missing `blocks`, a
    /// block without `id` or `type`, an unknown key.
    #[error("not a workflow definition: {message} (at {path})")]
    Malformed {
        /// Where: `blocks[2].id`, `edges[0]`, or `.` for the whole document.
        path: String,
        /// serde's message.
        message: String,
    },
    /// A block type the registry does not know (`mail`, `webhook`, …).
    #[error("block {block:?} has unknown type {block_type:?}")]
    UnknownBlock {
        /// The block's id.
        block: String,
        /// The type as written.
        block_type: String,
    },
    /// The block's parameters break a rule of its type.
    #[error("block {block:?} ({kind}): bad parameter{}: {message}", field.as_ref().map(|f| format!(" `{f}`")).unwrap_or_default())]
    BadParams {
        /// The block's id.
        block: String,
        /// Its type.
        kind: BlockKind,
        /// The field, as a path in `params` (`cases[1].label`); `None` when
        /// `params` itself is wrong (not an object).
        field: Option<String>,
        /// Why.
        message: String,
    },
    /// A block id that is empty, too long, or has characters other than
    /// ASCII letters, digits, `_` and `-`.
    #[error("block {index} has invalid id {block:?}: 1 to 64 ASCII letters, digits, `_` or `-`")]
    InvalidBlockId {
        /// The block's position in `blocks`.
        index: usize,
        /// The id as written.
        block: String,
    },
    /// Two blocks with the same id.
    #[error("block id {block:?} is used by blocks {first} and {second}")]
    DuplicateBlockId {
        /// The id.
        block: String,
        /// The first block's position in `blocks`.
        first: usize,
        /// The second's.
        second: usize,
    },
    /// A condition of an `if` or `switch` nests too deep.
    #[error("block {block:?}: condition nests {depth} levels deep; at most {max} are allowed")]
    ConditionTooDeep {
        /// The block's id.
        block: String,
        /// The condition's depth.
        depth: usize,
        /// [`crate::MAX_CONDITION_DEPTH`].
        max: usize,
    },
    /// A path `blocks.<id>…` names a block the definition does not have.
    #[error("block {block:?} reads {path:?}, but there is no block {referenced:?}")]
    UnknownBlockReference {
        /// The block that reads it.
        block: String,
        /// The path.
        path: String,
        /// The missing block id.
        referenced: String,
    },
    /// No trigger block.
    #[error("the workflow has no trigger block (manualTrigger, apiTrigger or eventTrigger)")]
    NoTrigger,
    /// More than one trigger block: a workflow has exactly one.
    #[error("the workflow has more than one trigger: {first:?} and {second:?}")]
    MultipleTriggers {
        /// The first trigger's id.
        first: String,
        /// The second's.
        second: String,
    },
    /// An edge from or to a block that does not exist.
    #[error("edge {edge} ({from:?} -> {to:?}): no block {missing:?}")]
    DanglingEdge {
        /// The edge's position in `edges`.
        edge: usize,
        /// Its source.
        from: String,
        /// Its target.
        to: String,
        /// The end that does not exist (`from` or `to`).
        missing: String,
    },
    /// An edge without a label out of a block with more than one output.
    #[error(
        "edge {edge} ({from:?} -> {to:?}) needs a label: {from:?} ({kind}) has outputs {outputs:?}"
    )]
    MissingLabel {
        /// The edge's position in `edges`.
        edge: usize,
        /// Its source.
        from: String,
        /// Its target.
        to: String,
        /// The source's type.
        kind: BlockKind,
        /// The source's outputs.
        outputs: Vec<String>,
    },
    /// An edge label the source block does not have (`maybe` out of an
    /// `if`).
    #[error(
        "edge {edge} ({from:?} -> {to:?}): {from:?} ({kind}) has no output {label:?}; its outputs are {outputs:?}"
    )]
    UnknownLabel {
        /// The edge's position in `edges`.
        edge: usize,
        /// Its source.
        from: String,
        /// Its target.
        to: String,
        /// The source's type.
        kind: BlockKind,
        /// The label as written.
        label: String,
        /// The source's outputs.
        outputs: Vec<String>,
    },
    /// An edge into the trigger: nothing runs before the trigger.
    #[error("edge {edge} ({from:?} -> {to:?}) leads into the trigger {to:?}")]
    EdgeIntoTrigger {
        /// The edge's position in `edges`.
        edge: usize,
        /// Its source.
        from: String,
        /// The trigger.
        to: String,
    },
    /// Two edges leave the same output of a block: each output leads to at
    /// most one block.
    #[error(
        "edge {edge} ({from:?} -> {to:?}): output {label:?} of {from:?} is already taken by edge {first_edge}"
    )]
    DuplicateOutput {
        /// The second edge's position in `edges`.
        edge: usize,
        /// Its source.
        from: String,
        /// Its target.
        to: String,
        /// The output (`next` for an unlabelled edge).
        label: String,
        /// The first edge's position.
        first_edge: usize,
    },
    /// The edges form a cycle; `block` is on it.
    #[error("the workflow has a cycle through block {block:?}")]
    Cycle {
        /// A block on the cycle.
        block: String,
    },
    /// A block no path from the trigger reaches.
    #[error("block {block:?} cannot be reached from the trigger")]
    Unreachable {
        /// The block's id.
        block: String,
    },
}

/// Why a valid workflow cannot run on the executor asked for, found before
/// any block runs. Names the first such block in topological order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PreflightError {
    /// The native runner was asked for and the block runs only on the
    /// bridge.
    #[error("block {block:?} ({kind}) cannot run natively; it needs the workflow bridge")]
    NotNative {
        /// The block's id.
        block: String,
        /// Its type.
        kind: BlockKind,
    },
    /// The block names a credential the tenant does not have (or that the
    /// executor cannot use).
    #[error("block {block:?} ({kind}) needs credential {credential:?}, which is not available")]
    MissingCredential {
        /// The block's id.
        block: String,
        /// Its type.
        kind: BlockKind,
        /// The credential id.
        credential: String,
    },
}
