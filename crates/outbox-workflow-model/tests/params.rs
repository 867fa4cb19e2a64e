//! Block parameters: every block's example parses, validates and round
//! trips; each broken rule names its block and field.

mod common;

use common::{check, error, realistic, with};
use outbox_workflow_model::{Block, BlockKind, DefinitionError, WorkflowDefinition};
use serde_json::{Value, json};

/// A valid `params` for every block, and the outputs it gives the block.
fn examples() -> Vec<(&'static str, Value, &'static [&'static str])> {
    let cond = json!({ "left": { "var": "input.total" }, "op": "gt", "right": 100 });
    vec![
        ("manualTrigger", json!({}), &["next"]),
        ("apiTrigger", json!({}), &["next"]),
        (
            "eventTrigger",
            json!({ "entity": "invoice", "event": "invoice.paid" }),
            &["next"],
        ),
        ("if", json!({ "condition": cond }), &["true", "false"]),
        (
            "switch",
            json!({ "cases": [{ "label": "big", "condition": cond }] }),
            &["big", "default"],
        ),
        (
            "email",
            json!({ "to": ["{{ input.email }}"], "cc": ["ops@example.test"],
            "template": "order-confirmation", "vars": { "orderId": { "var": "input.id" } } }),
            &["next"],
        ),
        (
            "httpRequest",
            json!({ "method": "GET", "url": "https://api.example.test/orders/{{ input.id }}",
            "headers": { "Accept": "application/json" } }),
            &["next"],
        ),
        (
            "rowGet",
            json!({ "entity": "customer", "id": { "var": "input.customerId" } }),
            &["next"],
        ),
        (
            "rowCreate",
            json!({ "entity": "task", "values": { "title": "Call", "orderId": { "var": "input.id" } } }),
            &["next"],
        ),
        (
            "rowUpdate",
            json!({ "entity": "order", "id": 7, "patch": { "status": "checked" } }),
            &["next"],
        ),
        (
            "rowDelete",
            json!({ "entity": "draft", "id": "d-1" }),
            &["next"],
        ),
        (
            "waitForInput",
            json!({ "prompt": "Approve order {{ input.id }}?", "timeoutMs": 86_400_000 }),
            &["input", "timeout"],
        ),
        (
            "log",
            json!({ "message": "total {{ input.total }}" }),
            &["next"],
        ),
        (
            "variable",
            json!({ "name": "total", "value": { "var": "input.total" } }),
            &["next"],
        ),
        (
            "code",
            json!({ "language": "javascript", "source": "return input.total * 2;" }),
            &["next"],
        ),
        (
            "aiAgent",
            json!({ "credentialId": "openai-main", "model": "gpt-x", "prompt": "Summarise {{ input }}",
            "system": "Be brief.", "maxTokens": 200 }),
            &["next"],
        ),
    ]
}

#[test]
fn every_block_has_a_valid_example() {
    let examples = examples();
    for kind in BlockKind::ALL {
        assert!(
            examples.iter().any(|e| e.0 == kind.id()),
            "no example for {kind}"
        );
    }
    assert_eq!(examples.len(), BlockKind::ALL.len());
    for (id, params, outputs) in examples {
        let block = json!({ "id": "it", "type": id, "params": params });
        let definition = if id.ends_with("Trigger") {
            json!({ "blocks": [block] })
        } else {
            with(block, json!({ "from": "start", "to": "it" }))
        };
        let wf = check(definition.clone()).unwrap_or_else(|err| panic!("{id}: {err}"));
        let it = wf.block("it").unwrap();
        assert_eq!(it.kind().id(), id);
        assert_eq!(it.params.outputs(), outputs, "{id}");
        // serialize, read back: the same block
        let text = serde_json::to_value(it).unwrap();
        assert_eq!(serde_json::from_value::<Block>(text).unwrap(), *it, "{id}");
        let again = WorkflowDefinition::from_value(serde_json::to_value(wf.definition()).unwrap());
        assert_eq!(again.as_ref(), Ok(wf.definition()), "{id}");
    }
}

#[test]
fn bad_params_name_the_field() {
    let cases: &[(&str, Value, Option<&str>, &str)] = &[
        (
            "thank",
            json!({ "to": ["a@b.test"], "text": "x" }),
            Some("subject"),
            "needs a subject",
        ),
        (
            "thank",
            json!({ "to": [], "subject": "s", "text": "x" }),
            Some("to"),
            "at least one recipient",
        ),
        (
            "thank",
            json!({ "to": ["a@b.test"], "subjet": "s" }),
            Some("subjet"),
            "unknown field `subjet`",
        ),
        (
            "thank",
            json!({ "to": ["a@b.test"], "template": "welcome", "text": "x" }),
            Some("text"),
            "from the template",
        ),
        (
            "thank",
            json!({ "to": ["nobody"], "template": "welcome" }),
            Some("to[0]"),
            "not a mail address",
        ),
        (
            "notify",
            json!({ "method": "POST" }),
            Some("url"),
            "missing field `url`",
        ),
        (
            "notify",
            json!({ "method": "FETCH", "url": "https://x.test" }),
            Some("method"),
            "unknown variant `FETCH`",
        ),
        (
            "notify",
            json!({ "method": "GET", "url": "ftp://x.test" }),
            Some("url"),
            "http:// or https://",
        ),
        (
            "notify",
            json!({ "method": "GET", "url": "https://x.test", "body": {} }),
            Some("body"),
            "no body",
        ),
        (
            "notify",
            json!({ "method": "GET", "url": "https://x.test", "timeoutMs": 0 }),
            Some("timeoutMs"),
            "outside",
        ),
        (
            "notify",
            json!({ "method": "GET", "url": "https://x.test", "headers": { "a b": "c" } }),
            Some("headers.a b"),
            "not a header name",
        ),
        (
            "notify",
            json!({ "method": "GET", "url": "https://{{ input.host" }),
            Some("url"),
            "not closed",
        ),
        (
            "mark",
            json!({ "entity": "order", "id": 1, "patch": {} }),
            Some("patch"),
            "at least one column",
        ),
        (
            "mark",
            json!({ "entity": "order", "id": true, "patch": { "a": 1 } }),
            Some("id"),
            "string or a number",
        ),
        (
            "mark",
            json!({ "entity": "or der", "id": 1, "patch": { "a": 1 } }),
            Some("entity"),
            "not an entity name",
        ),
        (
            "small",
            json!({ "message": "m", "level": "loud" }),
            Some("level"),
            "unknown variant `loud`",
        ),
        (
            "small",
            json!("just text"),
            None,
            "`params` is an object, not string",
        ),
        (
            "created",
            json!(["order", "row.created"]),
            None,
            "not array",
        ),
        (
            "big",
            json!({ "condition": { "left": 1, "op": "eq", "right": { "var": "secrets.x" } } }),
            Some("condition.right"),
            "starts with \"secrets\"",
        ),
        (
            "created",
            json!({ "entity": "order", "event": "row.archived" }),
            Some("event"),
            "row.created, row.updated and row.deleted",
        ),
    ];
    for (block, params, field, message) in cases {
        let mut def = realistic();
        let blocks = def["blocks"].as_array_mut().unwrap();
        let target = blocks.iter_mut().find(|b| b["id"] == *block).unwrap();
        target["params"] = params.clone();
        match error(def) {
            DefinitionError::BadParams {
                block: b,
                field: f,
                message: m,
                ..
            } => {
                assert_eq!(b, *block, "{params}");
                assert_eq!(f.as_deref(), *field, "{params}: {m}");
                assert!(m.contains(message), "{params}: {m}");
            }
            other => panic!("{params}: {other:?}"),
        }
    }
}

#[test]
fn code_runs_javascript_only() {
    let definition = with(
        json!({ "id": "js", "type": "code",
                "params": { "language": "typescript", "source": "return 1" } }),
        json!({ "from": "start", "to": "js" }),
    );
    match error(definition) {
        DefinitionError::BadParams {
            block,
            kind,
            field,
            message,
        } => {
            assert_eq!(block, "js");
            assert_eq!(kind, BlockKind::Code);
            assert_eq!(field.as_deref(), Some("language"));
            assert!(
                message.contains("unknown variant `typescript`, expected `javascript`"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn switch_labels_and_outputs() {
    let switch =
        |cases: Value| json!({ "id": "route", "type": "switch", "params": { "cases": cases } });
    let cond = json!({ "left": { "var": "input.kind" }, "op": "eq", "right": "a" });
    let bad = [
        (json!([]), "cases", "at least one case"),
        (
            json!([{ "label": "default", "condition": cond }]),
            "cases[0].label",
            "`default`",
        ),
        (
            json!([{ "label": "a", "condition": cond }, { "label": "a", "condition": cond }]),
            "cases[1].label",
            "already case 0's",
        ),
        (
            json!([{ "label": "a.b", "condition": cond }]),
            "cases[0].label",
            "not a label",
        ),
        (
            json!([{ "label": "a" }]),
            "cases[0].condition",
            "missing field `condition`",
        ),
    ];
    for (cases, field, message) in bad {
        match error(with(
            switch(cases.clone()),
            json!({ "from": "start", "to": "route" }),
        )) {
            DefinitionError::BadParams {
                field: Some(f),
                message: m,
                ..
            } => {
                assert_eq!(f, field, "{cases}");
                assert!(m.contains(message), "{cases}: {m}");
            }
            other => panic!("{cases}: {other:?}"),
        }
    }
    let cases = json!([{ "label": "a", "condition": cond }, { "label": "b-2", "condition": cond }]);
    let wf = check(with(
        switch(cases),
        json!({ "from": "start", "to": "route" }),
    ))
    .unwrap();
    assert_eq!(
        wf.block("route").unwrap().params.outputs(),
        ["a", "b-2", "default"]
    );
}
