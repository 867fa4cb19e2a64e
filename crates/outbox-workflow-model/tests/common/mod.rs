//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use outbox_workflow_model::{DefinitionError, ValidatedWorkflow, WorkflowDefinition};
use serde_json::{Value, json};

/// eventTrigger(order row.created) → if(total > 100) → true: email →
/// httpRequest → rowUpdate; false: log.
pub fn realistic() -> Value {
    json!({
        "blocks": [
            { "id": "created", "type": "eventTrigger", "name": "Order created",
              "params": { "entity": "order", "event": "row.created" } },
            { "id": "big", "type": "if", "name": "Over 100?",
              "params": { "condition": { "left": { "var": "input.order.total" }, "op": "gt", "right": 100 } } },
            { "id": "thank", "type": "email",
              "params": { "to": ["{{ input.order.customerEmail }}"],
                          "subject": "Thank you for order {{ input.order.id }}",
                          "text": "We received your order of {{ input.order.total }} EUR." } },
            { "id": "notify", "type": "httpRequest",
              "params": { "method": "POST", "url": "https://crm.example.test/hooks/orders",
                          "headers": { "X-Source": "workflow" },
                          "body": { "var": "input.order" }, "timeoutMs": 5000,
                          "credentialId": "crm-token" } },
            { "id": "mark", "type": "rowUpdate",
              "params": { "entity": "order", "id": { "var": "input.order.id" },
                          "patch": { "vip": true, "crmStatus": { "var": "blocks.notify.output.status" } } } },
            { "id": "small", "type": "log",
              "params": { "message": "small order {{ input.order.id }}", "level": "debug" } }
        ],
        "edges": [
            { "from": "created", "to": "big" },
            { "from": "big", "to": "thank", "label": "true" },
            { "from": "big", "to": "small", "label": "false" },
            { "from": "thank", "to": "notify" },
            { "from": "notify", "to": "mark", "label": "next" }
        ]
    })
}

pub fn check(value: Value) -> Result<ValidatedWorkflow, DefinitionError> {
    WorkflowDefinition::from_value(value)?.validate()
}

pub fn error(value: Value) -> DefinitionError {
    match check(value) {
        Ok(_) => panic!("the definition should be refused"),
        Err(err) => err,
    }
}

pub fn ids<'a>(blocks: impl Iterator<Item = &'a outbox_workflow_model::Block>) -> Vec<&'a str> {
    blocks.map(|b| b.id.as_str()).collect()
}

/// A two-block workflow: a manual trigger and `block`.
pub fn with(block: Value, edge: Value) -> Value {
    json!({
        "blocks": [{ "id": "start", "type": "manualTrigger" }, block],
        "edges": [edge]
    })
}
