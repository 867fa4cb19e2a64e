//! `docs/workflows.md` shows only what the crate accepts: every JSON example
//! in it is a valid definition or condition, and its block table lists
//! exactly the registry's blocks with their capabilities.

use outbox_workflow_model::{BlockKind, Condition, CredentialUse, ValidatedWorkflow};
use serde_json::Value;

const DOC: &str = include_str!("../../../docs/workflows.md");

fn json_examples() -> Vec<&'static str> {
    DOC.split("```json\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect()
}

#[test]
fn json_examples_are_valid() {
    let examples = json_examples();
    assert!(examples.len() >= 2);
    for text in examples {
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        if value.get("blocks").is_some() {
            ValidatedWorkflow::from_json(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        } else {
            serde_json::from_value::<Condition>(value).unwrap_or_else(|e| panic!("{e}: {text}"));
        }
    }
}

#[test]
fn the_block_table_matches_the_registry() {
    let rows: Vec<Vec<&str>> = DOC
        .split("## The blocks")
        .nth(1)
        .and_then(|section| section.split("\n\n").nth(1))
        .unwrap()
        .lines()
        .skip(2)
        .map(|line| line.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), BlockKind::ALL.len(), "{rows:?}");
    for (row, kind) in rows.iter().zip(BlockKind::ALL) {
        let spec = kind.spec();
        assert_eq!(row[0], format!("`{}`", kind.id()));
        assert_eq!(row[1] == "trigger", spec.is_trigger, "{kind}");
        assert_eq!(row[3] == "native", spec.runs_natively, "{kind}");
        let credentials = match spec.credentials {
            CredentialUse::None => "none",
            CredentialUse::Optional => "optional",
            CredentialUse::Required => "**required**",
        };
        assert!(row[4].starts_with(credentials), "{kind}: {}", row[4]);
    }
}
