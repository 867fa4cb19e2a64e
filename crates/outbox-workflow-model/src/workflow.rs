//! [`ValidatedWorkflow`]: a definition that passed every rule, with the
//! graph a runner walks.

use std::collections::HashMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Block, DefinitionError, Edge, PreflightError, WorkflowDefinition};

/// A connected output of a block.
#[derive(Debug, Clone)]
pub(crate) struct OutEdge {
    /// The output, resolved (`next` for an unlabelled edge).
    pub(crate) label: String,
    /// The position of the block it leads to.
    pub(crate) target: usize,
    /// The edge's position in `edges`.
    pub(crate) edge: usize,
}

/// The graph of a validated definition, by block position.
#[derive(Debug, Clone)]
pub(crate) struct Graph {
    /// Block id → position.
    pub(crate) index: HashMap<String, usize>,
    /// The trigger's position.
    pub(crate) trigger: usize,
    /// Per block, its connected outputs in edge order.
    pub(crate) outgoing: Vec<Vec<OutEdge>>,
    /// Every block, each after all blocks with an edge into it.
    pub(crate) order: Vec<usize>,
}

/// A workflow definition that passed [`WorkflowDefinition::validate`]: one
/// trigger, every block reachable from it, no cycle, every edge leaving an
/// output its source has, each output leading to at most one block.
///
/// A run starts at [`ValidatedWorkflow::trigger_block`]; after a block takes an
/// output, [`ValidatedWorkflow::next`] gives the block to run, and `None`
/// ends the run. Several edges may lead into one block (branches joining);
/// no block has two successors on one output, so a run is a single path.
///
/// Serialized as its definition; deserializing validates.
#[derive(Debug, Clone)]
pub struct ValidatedWorkflow {
    definition: WorkflowDefinition,
    graph: Graph,
}

impl ValidatedWorkflow {
    pub(crate) fn new(definition: WorkflowDefinition, graph: Graph) -> Self {
        Self { definition, graph }
    }

    /// Parses and validates JSON text in one step.
    ///
    /// # Errors
    ///
    /// The first rule broken, parsing included (see [`DefinitionError`]).
    pub fn from_json(json: &str) -> Result<Self, DefinitionError> {
        WorkflowDefinition::from_json(json)?.validate()
    }

    /// The definition.
    #[must_use]
    pub fn definition(&self) -> &WorkflowDefinition {
        &self.definition
    }

    /// Gives the definition back.
    #[must_use]
    pub fn into_definition(self) -> WorkflowDefinition {
        self.definition
    }

    /// The blocks, in definition order.
    #[must_use]
    pub fn blocks(&self) -> &[Block] {
        &self.definition.blocks
    }

    /// The edges, in definition order.
    #[must_use]
    pub fn edges(&self) -> &[Edge] {
        &self.definition.edges
    }

    /// The trigger block, where every run starts.
    #[must_use]
    pub fn trigger_block(&self) -> &Block {
        &self.definition.blocks[self.graph.trigger]
    }

    /// The block with id `id`.
    #[must_use]
    pub fn block(&self, id: &str) -> Option<&Block> {
        self.graph
            .index
            .get(id)
            .map(|&i| &self.definition.blocks[i])
    }

    /// The block that runs after block `block_id` takes output `label`
    /// (`next`, `true`, a switch case label, …); `None` when that output is
    /// not connected (the run ends there) or `block_id` does not exist.
    #[must_use]
    pub fn next(&self, block_id: &str, label: &str) -> Option<&Block> {
        let &source = self.graph.index.get(block_id)?;
        self.graph.outgoing[source]
            .iter()
            .find(|out| out.label == label)
            .map(|out| &self.definition.blocks[out.target])
    }

    /// The connected outputs of block `block_id`: `(label, block it leads
    /// to)`, in edge order.
    pub fn successors(&self, block_id: &str) -> impl Iterator<Item = (&str, &Block)> {
        let outgoing = match self.graph.index.get(block_id) {
            Some(&i) => self.graph.outgoing[i].as_slice(),
            None => &[],
        };
        outgoing
            .iter()
            .map(|out| (out.label.as_str(), &self.definition.blocks[out.target]))
    }

    /// Every block in a topological order: the trigger first, and each block
    /// after every block with an edge into it; ties go to the block that
    /// comes first in the definition.
    pub fn topological_order(&self) -> impl Iterator<Item = &Block> {
        self.graph.order.iter().map(|&i| &self.definition.blocks[i])
    }

    /// Checks, before any block runs, that every block can run on the
    /// executor chosen: with `native`, that each runs natively; and that
    /// each credential a block names is available (`credentials_available`
    /// gets the credential id). Blocks are checked in
    /// [`topological order`](Self::topological_order), each for
    /// nativeness first, and the first problem is reported.
    ///
    /// Every block is checked, not only those one run would visit, so the
    /// answer does not depend on the input: an executor can be chosen (native
    /// or bridge) once per workflow.
    ///
    /// # Errors
    ///
    /// [`PreflightError::NotNative`] or [`PreflightError::MissingCredential`]
    /// for the first block that cannot run.
    pub fn preflight(
        &self,
        native: bool,
        credentials_available: &dyn Fn(&str) -> bool,
    ) -> Result<(), PreflightError> {
        for block in self.topological_order() {
            check_block(block, native, credentials_available)?;
        }
        Ok(())
    }

    /// [`preflight`](Self::preflight) for a continuation of a run waiting in
    /// `waiting_block`: only the blocks the run can still reach from there
    /// are checked (the waiting block itself, the boundary the run already
    /// crossed, is not), in topological order. So a run whose finished part
    /// needed the bridge can continue natively when what is left runs
    /// natively.
    ///
    /// # Errors
    ///
    /// As [`preflight`](Self::preflight), for the first reachable block
    /// that cannot run.
    pub fn preflight_continuation(
        &self,
        waiting_block: &str,
        native: bool,
        credentials_available: &dyn Fn(&str) -> bool,
    ) -> Result<(), PreflightError> {
        let mut reachable = std::collections::HashSet::new();
        let mut todo = vec![waiting_block];
        while let Some(id) = todo.pop() {
            for (_, block) in self.successors(id) {
                if reachable.insert(block.id.as_str()) {
                    todo.push(block.id.as_str());
                }
            }
        }
        for block in self.topological_order() {
            if block.id != waiting_block && reachable.contains(block.id.as_str()) {
                check_block(block, native, credentials_available)?;
            }
        }
        Ok(())
    }
}

/// One block of a preflight: runs natively when `native`, and has its
/// credential.
fn check_block(
    block: &Block,
    native: bool,
    credentials_available: &dyn Fn(&str) -> bool,
) -> Result<(), PreflightError> {
    let kind = block.kind();
    if native && !kind.runs_natively() {
        return Err(PreflightError::NotNative {
            block: block.id.clone(),
            kind,
        });
    }
    if let Some(credential) = block.params.credential_id()
        && !credentials_available(credential)
    {
        return Err(PreflightError::MissingCredential {
            block: block.id.clone(),
            kind,
            credential: credential.to_owned(),
        });
    }
    Ok(())
}

impl Serialize for ValidatedWorkflow {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.definition.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ValidatedWorkflow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        WorkflowDefinition::deserialize(deserializer)?
            .validate()
            .map_err(D::Error::custom)
    }
}
