//! Definitions: a realistic workflow end to end, and one test per
//! validation rule, each asserting the precise error.

mod common;

use common::{check, error, ids, realistic, with};
use outbox_workflow_model::{
    BlockKind, BlockParams, DefinitionError, MAX_CONDITION_DEPTH, PreflightError,
    ValidatedWorkflow, WorkflowDefinition, labels,
};
use serde_json::{Value, json};

#[test]
fn the_realistic_workflow_is_valid_and_walkable() {
    let wf = check(realistic()).unwrap();
    assert_eq!(wf.trigger_block().id, "created");
    let BlockParams::EventTrigger(trigger) = &wf.trigger_block().params else {
        panic!()
    };
    assert!(trigger.matches("order", "row.created"));
    let next = |id, label| wf.next(id, label).map(|b| b.id.as_str());
    assert_eq!(next("created", labels::NEXT), Some("big"));
    assert_eq!(next("big", labels::TRUE), Some("thank"));
    assert_eq!(next("big", labels::FALSE), Some("small"));
    assert_eq!(next("thank", labels::NEXT), Some("notify"));
    assert_eq!(next("notify", labels::NEXT), Some("mark"));
    assert_eq!(next("mark", labels::NEXT), None);
    assert_eq!(next("small", labels::NEXT), None);
    assert_eq!(next("nope", labels::NEXT), None);
    assert_eq!(
        ids(wf.topological_order()),
        ["created", "big", "thank", "notify", "mark", "small"]
    );
    let successors: Vec<_> = wf
        .successors("big")
        .map(|(l, b)| (l, b.id.as_str()))
        .collect();
    assert_eq!(successors, [("true", "thank"), ("false", "small")]);

    // The branch is the condition's: run it on two inputs.
    let BlockParams::If(big) = &wf.block("big").unwrap().params else {
        panic!()
    };
    let ctx = |total| json!({ "input": { "order": { "total": total } } });
    assert_eq!(big.condition.evaluate(&ctx(120)), Ok(true));
    assert_eq!(big.condition.evaluate(&ctx(80)), Ok(false));

    // Everything runs natively; the CRM credential decides the rest.
    assert_eq!(wf.preflight(true, &|id| id == "crm-token"), Ok(()));
    assert_eq!(
        wf.preflight(true, &|_| false),
        Err(PreflightError::MissingCredential {
            block: "notify".into(),
            kind: BlockKind::HttpRequest,
            credential: "crm-token".into(),
        })
    );
}

#[test]
fn definitions_round_trip_through_json() {
    let wf = check(realistic()).unwrap();
    let text = serde_json::to_string(&wf).unwrap();
    let again = ValidatedWorkflow::from_json(&text).unwrap();
    assert_eq!(again.definition(), wf.definition());
    let via_serde: ValidatedWorkflow = serde_json::from_str(&text).unwrap();
    assert_eq!(via_serde.definition(), wf.definition());
    let mut bad = realistic();
    bad["blocks"][1]["type"] = json!("mail");
    let err = serde_json::from_value::<WorkflowDefinition>(bad).unwrap_err();
    assert!(err.to_string().contains("unknown type \"mail\""), "{err}");
}

#[test]
fn preflight_names_the_first_bridge_block_in_order() {
    let mut def = realistic();
    let blocks = def["blocks"].as_array_mut().unwrap();
    blocks.push(json!({ "id": "ask-ai", "type": "aiAgent",
        "params": { "credentialId": "openai", "model": "m", "prompt": "{{ input.order.id }}" } }));
    blocks.push(json!({ "id": "script", "type": "code",
        "params": { "language": "javascript", "source": "return 1" } }));
    let edges = def["edges"].as_array_mut().unwrap();
    edges.push(json!({ "from": "small", "to": "script" }));
    edges.push(json!({ "from": "mark", "to": "ask-ai" }));
    let wf = check(def).unwrap();
    // mark comes before small in topological order, so ask-ai before script
    assert_eq!(
        wf.preflight(true, &|_| true),
        Err(PreflightError::NotNative {
            block: "ask-ai".into(),
            kind: BlockKind::AiAgent
        })
    );
    assert_eq!(
        wf.preflight(false, &|id| id != "openai"),
        Err(PreflightError::MissingCredential {
            block: "ask-ai".into(),
            kind: BlockKind::AiAgent,
            credential: "openai".into()
        })
    );
    assert_eq!(wf.preflight(false, &|_| true), Ok(()));
}

#[test]
fn malformed_documents() {
    let err =
        WorkflowDefinition::from_json("{ \"blocks\": [ { \"type\": \"log\" } ] }").unwrap_err();
    let DefinitionError::Malformed { path, message } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(path, "blocks[0]");
    assert!(message.contains("missing field `id`"), "{message}");
    let err = WorkflowDefinition::from_json("{ \"blocks\": [], \"nodes\": [] }").unwrap_err();
    assert!(
        matches!(&err, DefinitionError::Malformed { message, .. } if message.contains("unknown field `nodes`")),
        "{err:?}"
    );
    let err = WorkflowDefinition::from_json("{ \"blocks\": [] } x").unwrap_err();
    assert!(matches!(err, DefinitionError::Malformed { .. }), "{err:?}");
}

#[test]
fn unknown_block() {
    let mut def = realistic();
    def["blocks"][2]["type"] = json!("webhook");
    assert_eq!(
        error(def),
        DefinitionError::UnknownBlock {
            block: "thank".into(),
            block_type: "webhook".into()
        }
    );
}

#[test]
fn invalid_and_duplicate_block_ids() {
    let err = error(with(
        json!({ "id": "a.b", "type": "log", "params": { "message": "m" } }),
        json!({ "from": "start", "to": "a.b" }),
    ));
    assert_eq!(
        err,
        DefinitionError::InvalidBlockId {
            index: 1,
            block: "a.b".into()
        }
    );
    let mut def = realistic();
    def["blocks"][5]["id"] = json!("thank");
    assert_eq!(
        error(def),
        DefinitionError::DuplicateBlockId {
            block: "thank".into(),
            first: 2,
            second: 5
        }
    );
}

#[test]
fn condition_too_deep() {
    let mut condition = json!({ "left": 1, "op": "exists" });
    for _ in 0..MAX_CONDITION_DEPTH {
        condition = json!({ "not": condition });
    }
    let mut def = realistic();
    def["blocks"][1]["params"]["condition"] = condition;
    assert_eq!(
        error(def),
        DefinitionError::ConditionTooDeep {
            block: "big".into(),
            depth: MAX_CONDITION_DEPTH + 1,
            max: MAX_CONDITION_DEPTH
        }
    );
}

#[test]
fn unknown_block_reference() {
    let mut def = realistic();
    def["blocks"][4]["params"]["patch"]["crmStatus"] =
        json!({ "var": "blocks.notfy.output.status" });
    assert_eq!(
        error(def),
        DefinitionError::UnknownBlockReference {
            block: "mark".into(),
            path: "blocks.notfy.output.status".into(),
            referenced: "notfy".into()
        }
    );
}

#[test]
fn exactly_one_trigger() {
    let def = json!({ "blocks": [{ "id": "note", "type": "log", "params": { "message": "m" } }] });
    assert_eq!(error(def), DefinitionError::NoTrigger);
    let mut def = realistic();
    def["blocks"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "id": "api", "type": "apiTrigger" }));
    assert_eq!(
        error(def),
        DefinitionError::MultipleTriggers {
            first: "created".into(),
            second: "api".into()
        }
    );
}

#[test]
fn dangling_edges() {
    let mut def = realistic();
    def["edges"][3]["to"] = json!("notfy");
    assert_eq!(
        error(def),
        DefinitionError::DanglingEdge {
            edge: 3,
            from: "thank".into(),
            to: "notfy".into(),
            missing: "notfy".into()
        }
    );
    let mut def = realistic();
    def["edges"][0]["from"] = json!("ghost");
    assert_eq!(
        error(def),
        DefinitionError::DanglingEdge {
            edge: 0,
            from: "ghost".into(),
            to: "big".into(),
            missing: "ghost".into()
        }
    );
}

#[test]
fn edge_labels() {
    let mut def = realistic();
    def["edges"][1]["label"] = json!("maybe");
    assert_eq!(
        error(def),
        DefinitionError::UnknownLabel {
            edge: 1,
            from: "big".into(),
            to: "thank".into(),
            kind: BlockKind::If,
            label: "maybe".into(),
            outputs: vec!["true".into(), "false".into()]
        }
    );
    let mut def = realistic();
    def["edges"][2].as_object_mut().unwrap().remove("label");
    assert_eq!(
        error(def),
        DefinitionError::MissingLabel {
            edge: 2,
            from: "big".into(),
            to: "small".into(),
            kind: BlockKind::If,
            outputs: vec!["true".into(), "false".into()]
        }
    );
    // waitForInput has `timeout` only with a timeout
    let wait = |params: Value| json!({ "id": "ask", "type": "waitForInput", "params": params });
    let edge = json!({ "from": "start", "to": "ask" });
    let mut def = with(wait(json!({ "prompt": "ok?" })), edge.clone());
    def["blocks"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "id": "late", "type": "log", "params": { "message": "late" } }));
    def["edges"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "from": "ask", "to": "late", "label": "timeout" }));
    assert!(
        matches!(error(def.clone()), DefinitionError::UnknownLabel { label, outputs, .. }
        if label == "timeout" && outputs == ["input"])
    );
    def["blocks"][1]["params"]["timeoutMs"] = json!(60_000);
    let wf = check(def).unwrap();
    assert_eq!(
        wf.next("ask", labels::TIMEOUT).map(|b| b.id.as_str()),
        Some("late")
    );
    assert_eq!(wf.next("ask", labels::INPUT), None);
}

#[test]
fn edge_into_trigger() {
    let mut def = realistic();
    def["edges"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "from": "small", "to": "created" }));
    assert_eq!(
        error(def),
        DefinitionError::EdgeIntoTrigger {
            edge: 5,
            from: "small".into(),
            to: "created".into()
        }
    );
}

#[test]
fn duplicate_output() {
    let mut def = realistic();
    def["edges"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "from": "big", "to": "notify", "label": "true" }));
    assert_eq!(
        error(def),
        DefinitionError::DuplicateOutput {
            edge: 5,
            from: "big".into(),
            to: "notify".into(),
            label: "true".into(),
            first_edge: 1
        }
    );
    // an unlabelled edge and a `next` edge are the same output
    let mut def = realistic();
    def["edges"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "from": "notify", "to": "small" }));
    assert!(
        matches!(error(def), DefinitionError::DuplicateOutput { label, first_edge: 4, .. } if label == "next")
    );
}

#[test]
fn cycles() {
    let mut def = realistic();
    def["edges"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "from": "mark", "to": "thank" }));
    assert_eq!(
        error(def),
        DefinitionError::Cycle {
            block: "thank".into()
        }
    );
    let mut def = realistic();
    def["edges"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "from": "small", "to": "small" }));
    assert_eq!(
        error(def),
        DefinitionError::Cycle {
            block: "small".into()
        }
    );
}

#[test]
fn unreachable_blocks() {
    let mut def = realistic();
    def["edges"].as_array_mut().unwrap().remove(3); // thank -> notify
    assert_eq!(
        error(def),
        DefinitionError::Unreachable {
            block: "notify".into()
        }
    );
}

#[test]
fn branches_may_join() {
    let mut def = realistic();
    def["edges"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "from": "small", "to": "mark" }));
    let wf = check(def).unwrap();
    assert_eq!(
        ids(wf.topological_order()),
        ["created", "big", "thank", "notify", "small", "mark"]
    );
}

#[test]
fn a_long_chain_does_not_overflow() {
    let n = 20_000;
    let mut blocks = vec![json!({ "id": "start", "type": "manualTrigger" })];
    let mut edges = Vec::new();
    for i in 0..n {
        blocks.push(json!({ "id": format!("b{i}"), "type": "log", "params": { "message": "m" } }));
        let from = if i == 0 {
            "start".to_owned()
        } else {
            format!("b{}", i - 1)
        };
        edges.push(json!({ "from": from, "to": format!("b{i}") }));
    }
    let wf = check(json!({ "blocks": blocks, "edges": edges })).unwrap();
    assert_eq!(wf.topological_order().count(), n + 1);
}
