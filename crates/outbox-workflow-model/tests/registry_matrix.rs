//! The capability matrix, stated a second time on purpose: a block added to
//! the registry without a row here, or a row here without a block, or a
//! capability that changes, fails this test. Update `docs/workflows.md`
//! with it.

use outbox_workflow_model::{
    BlockKind, CredentialUse, DefinitionError, OutputShape, WorkflowDefinition,
};
use serde_json::json;

use CredentialUse::{None as NoCreds, Optional, Required};
use OutputShape::{InputOrTimeout, Next, SwitchCases, TrueFalse};

/// id, trigger, native, credentials, outputs.
const MATRIX: &[(&str, bool, bool, CredentialUse, OutputShape)] = &[
    ("manualTrigger", true, true, NoCreds, Next),
    ("apiTrigger", true, true, NoCreds, Next),
    ("eventTrigger", true, true, NoCreds, Next),
    ("if", false, true, NoCreds, TrueFalse),
    ("switch", false, true, NoCreds, SwitchCases),
    ("email", false, true, NoCreds, Next),
    ("httpRequest", false, true, Optional, Next),
    ("rowGet", false, true, NoCreds, Next),
    ("rowCreate", false, true, NoCreds, Next),
    ("rowUpdate", false, true, NoCreds, Next),
    ("rowDelete", false, true, NoCreds, Next),
    ("waitForInput", false, true, NoCreds, InputOrTimeout),
    ("log", false, true, NoCreds, Next),
    ("variable", false, true, NoCreds, Next),
    ("code", false, false, NoCreds, Next),
    ("aiAgent", false, false, Required, Next),
];

/// Block ids that must not exist: their jobs are done by `email`,
/// `httpRequest` and `waitForInput`, or by other parts of the outbox.
const ABSENT: &[&str] = &[
    "mail",
    "webhook",
    "notification",
    "audit",
    "delay",
    "schedule",
];

#[test]
fn every_registered_block_has_its_row() {
    for kind in BlockKind::ALL {
        let row = MATRIX.iter().find(|row| row.0 == kind.id());
        let Some(&(id, trigger, native, credentials, outputs)) = row else {
            panic!("block {kind} is in the registry but not in MATRIX (and docs/workflows.md)");
        };
        let spec = kind.spec();
        assert_eq!(spec.is_trigger, trigger, "{id}: trigger");
        assert_eq!(spec.runs_natively, native, "{id}: native");
        assert_eq!(spec.credentials, credentials, "{id}: credentials");
        assert_eq!(spec.needs_credentials(), credentials == Required, "{id}");
        assert_eq!(spec.outputs, outputs, "{id}: outputs");
    }
}

#[test]
fn every_row_is_a_registered_block() {
    for (id, ..) in MATRIX {
        assert!(
            BlockKind::ALL.iter().any(|kind| kind.id() == *id),
            "MATRIX lists {id}, which the registry does not have"
        );
    }
    assert_eq!(MATRIX.len(), BlockKind::ALL.len());
}

#[test]
fn only_code_and_ai_agent_need_the_bridge() {
    let bridge: Vec<&str> = BlockKind::ALL
        .iter()
        .filter(|kind| !kind.runs_natively())
        .map(|kind| kind.id())
        .collect();
    assert_eq!(bridge, ["code", "aiAgent"]);
}

#[test]
fn absent_block_ids_are_unknown_blocks() {
    for name in ABSENT {
        assert!(name.parse::<BlockKind>().is_err(), "{name} parses");
        let definition = json!({
            "blocks": [
                { "id": "start", "type": "manualTrigger" },
                { "id": "it", "type": name, "params": { "to": ["a@b.test"] } }
            ],
            "edges": [{ "from": "start", "to": "it" }]
        });
        assert_eq!(
            WorkflowDefinition::from_value(definition),
            Err(DefinitionError::UnknownBlock {
                block: "it".into(),
                block_type: (*name).into()
            }),
            "{name}"
        );
    }
}
