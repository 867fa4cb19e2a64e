//! The validation rules of a definition, in the order [`DefinitionError`]
//! lists them. Every walk of the graph is iterative, so no definition can
//! overflow the stack.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use crate::names::is_block_id;
use crate::params::ParamError;
use crate::workflow::{Graph, OutEdge};
use crate::{DefinitionError, MAX_CONDITION_DEPTH, ValidatedWorkflow, WorkflowDefinition, labels};

pub(crate) fn validate(
    definition: WorkflowDefinition,
) -> Result<ValidatedWorkflow, DefinitionError> {
    let index = check_blocks(&definition)?;
    let trigger = find_trigger(&definition)?;
    let outgoing = check_edges(&definition, &index, trigger)?;
    check_acyclic(&definition, &outgoing)?;
    check_reachable(&definition, &outgoing, trigger)?;
    let order = topological_order(&outgoing);
    Ok(ValidatedWorkflow::new(
        definition,
        Graph {
            index,
            trigger,
            outgoing,
            order,
        },
    ))
}

/// Ids, parameters, condition depth, then the block paths point to.
fn check_blocks(
    definition: &WorkflowDefinition,
) -> Result<HashMap<String, usize>, DefinitionError> {
    let mut index = HashMap::with_capacity(definition.blocks.len());
    for (i, block) in definition.blocks.iter().enumerate() {
        if !is_block_id(&block.id) {
            return Err(DefinitionError::InvalidBlockId {
                index: i,
                block: block.id.clone(),
            });
        }
        if let Some(&first) = index.get(&block.id) {
            return Err(DefinitionError::DuplicateBlockId {
                block: block.id.clone(),
                first,
                second: i,
            });
        }
        index.insert(block.id.clone(), i);
        if let Err(ParamError { field, message }) = block.params.check() {
            return Err(DefinitionError::BadParams {
                block: block.id.clone(),
                kind: block.kind(),
                field,
                message,
            });
        }
        let depth = block.params.conditions().iter().map(|c| c.depth()).max();
        if let Some(depth) = depth.filter(|&d| d > MAX_CONDITION_DEPTH) {
            return Err(DefinitionError::ConditionTooDeep {
                block: block.id.clone(),
                depth,
                max: MAX_CONDITION_DEPTH,
            });
        }
    }
    for block in &definition.blocks {
        for path in block.params.paths() {
            if let Some(referenced) = path.block().filter(|r| !index.contains_key(*r)) {
                return Err(DefinitionError::UnknownBlockReference {
                    block: block.id.clone(),
                    path: path.to_string(),
                    referenced: referenced.to_owned(),
                });
            }
        }
    }
    Ok(index)
}

fn find_trigger(definition: &WorkflowDefinition) -> Result<usize, DefinitionError> {
    let mut triggers = definition
        .blocks
        .iter()
        .enumerate()
        .filter(|(_, block)| block.kind().is_trigger());
    let Some((trigger, first)) = triggers.next() else {
        return Err(DefinitionError::NoTrigger);
    };
    if let Some((_, second)) = triggers.next() {
        return Err(DefinitionError::MultipleTriggers {
            first: first.id.clone(),
            second: second.id.clone(),
        });
    }
    Ok(trigger)
}

/// Checks every edge and returns, per block, its outputs that lead
/// somewhere.
fn check_edges(
    definition: &WorkflowDefinition,
    index: &HashMap<String, usize>,
    trigger: usize,
) -> Result<Vec<Vec<OutEdge>>, DefinitionError> {
    let mut outgoing: Vec<Vec<OutEdge>> = vec![Vec::new(); definition.blocks.len()];
    for (e, edge) in definition.edges.iter().enumerate() {
        let (from, to) = (edge.from.clone(), edge.to.clone());
        let dangling = |missing: &str| DefinitionError::DanglingEdge {
            edge: e,
            from: from.clone(),
            to: to.clone(),
            missing: missing.to_owned(),
        };
        let source = *index.get(&edge.from).ok_or_else(|| dangling(&edge.from))?;
        let target = *index.get(&edge.to).ok_or_else(|| dangling(&edge.to))?;
        let block = &definition.blocks[source];
        let outputs = block.params.outputs();
        let owned = || outputs.iter().map(|s| (*s).to_owned()).collect();
        let label = match &edge.label {
            Some(label) if outputs.contains(&label.as_str()) => label.clone(),
            Some(label) => {
                return Err(DefinitionError::UnknownLabel {
                    edge: e,
                    from,
                    to,
                    kind: block.kind(),
                    label: label.clone(),
                    outputs: owned(),
                });
            }
            None if outputs == [labels::NEXT] => labels::NEXT.to_owned(),
            None => {
                return Err(DefinitionError::MissingLabel {
                    edge: e,
                    from,
                    to,
                    kind: block.kind(),
                    outputs: owned(),
                });
            }
        };
        if target == trigger {
            return Err(DefinitionError::EdgeIntoTrigger { edge: e, from, to });
        }
        if let Some(first) = outgoing[source].iter().find(|out| out.label == label) {
            return Err(DefinitionError::DuplicateOutput {
                edge: e,
                from,
                to,
                label,
                first_edge: first.edge,
            });
        }
        outgoing[source].push(OutEdge {
            label,
            target,
            edge: e,
        });
    }
    Ok(outgoing)
}

/// Depth-first, iteratively, from every block in order; the first edge back
/// into the current path closes a cycle through its target.
fn check_acyclic(
    definition: &WorkflowDefinition,
    outgoing: &[Vec<OutEdge>],
) -> Result<(), DefinitionError> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        New,
        OnPath,
        Done,
    }
    let mut state = vec![State::New; outgoing.len()];
    for root in 0..outgoing.len() {
        if state[root] != State::New {
            continue;
        }
        state[root] = State::OnPath;
        // (block, next edge of it to look at)
        let mut stack = vec![(root, 0)];
        while let Some((block, next)) = stack.last_mut() {
            let block = *block;
            match outgoing[block].get(*next).map(|out| out.target) {
                Some(target) => {
                    *next += 1;
                    match state[target] {
                        State::OnPath => {
                            return Err(DefinitionError::Cycle {
                                block: definition.blocks[target].id.clone(),
                            });
                        }
                        State::New => {
                            state[target] = State::OnPath;
                            stack.push((target, 0));
                        }
                        State::Done => {}
                    }
                }
                None => {
                    state[block] = State::Done;
                    stack.pop();
                }
            }
        }
    }
    Ok(())
}

fn check_reachable(
    definition: &WorkflowDefinition,
    outgoing: &[Vec<OutEdge>],
    trigger: usize,
) -> Result<(), DefinitionError> {
    let mut reached = vec![false; outgoing.len()];
    reached[trigger] = true;
    let mut queue = VecDeque::from([trigger]);
    while let Some(block) = queue.pop_front() {
        for out in &outgoing[block] {
            if !reached[out.target] {
                reached[out.target] = true;
                queue.push_back(out.target);
            }
        }
    }
    match reached.iter().position(|r| !r) {
        Some(i) => Err(DefinitionError::Unreachable {
            block: definition.blocks[i].id.clone(),
        }),
        None => Ok(()),
    }
}

/// Kahn's algorithm, taking the ready block that comes first in `blocks`,
/// so the order is deterministic. The graph is acyclic and every block is
/// reached from the trigger (the only block with no incoming edge), so the
/// trigger comes first and every block is listed.
fn topological_order(outgoing: &[Vec<OutEdge>]) -> Vec<usize> {
    let mut incoming = vec![0usize; outgoing.len()];
    for out in outgoing.iter().flatten() {
        incoming[out.target] += 1;
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..outgoing.len())
        .filter(|&i| incoming[i] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(outgoing.len());
    while let Some(Reverse(block)) = ready.pop() {
        order.push(block);
        for out in &outgoing[block] {
            incoming[out.target] -= 1;
            if incoming[out.target] == 0 {
                ready.push(Reverse(out.target));
            }
        }
    }
    order
}

impl TryFrom<WorkflowDefinition> for ValidatedWorkflow {
    type Error = DefinitionError;

    /// [`WorkflowDefinition::validate`] without the copy.
    fn try_from(definition: WorkflowDefinition) -> Result<Self, DefinitionError> {
        validate(definition)
    }
}
