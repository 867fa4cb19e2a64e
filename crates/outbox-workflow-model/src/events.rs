//! The `workflow.*` outbox events: their type names and payloads, in one
//! place, so the workflow subscriber parses exactly what the
//! producers (`outbox_workflow_store::producers`) write.
//!
//! Every payload is a JSON object with camelCase keys. All three types
//! start with `workflow.`, so the standard routing table sends them to the
//! `outbox.workflow` queue.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// An application event (a row created, updated or deleted) that may start
/// `eventTrigger` workflows. Payload: [`TriggerEventPayload`].
pub const TRIGGER_EVENT: &str = "workflow.trigger.event";

/// A manual or API run was requested: the execution exists, `queued`.
/// Payload: [`ExecutionRequestedPayload`].
pub const EXECUTION_REQUESTED: &str = "workflow.execution.requested";

/// The dispatch key of the [`EXECUTION_REQUESTED`] event of execution
/// `execution_id`: `wf-run:<execution>`. It finds the outbox row that asked
/// for a manual or API run, while retention has not deleted it.
#[must_use]
pub fn execution_requested_key(execution_id: Uuid) -> String {
    format!("wf-run:{execution_id}")
}

/// A `waiting` execution should resume: its answer arrived, or its timeout
/// passed. Payload: [`ContinueRequestedPayload`].
pub const CONTINUE_REQUESTED: &str = "workflow.execution.continue.requested";

/// The workflow block whose row mutation produced an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct WorkflowOrigin {
    /// The execution that ran the block.
    pub execution_id: Uuid,
    /// The row block's id in that execution's definition.
    pub block_id: String,
}

impl WorkflowOrigin {
    /// The origin `block_id` of `execution_id`.
    #[must_use]
    pub fn new(execution_id: Uuid, block_id: impl Into<String>) -> Self {
        Self {
            execution_id,
            block_id: block_id.into(),
        }
    }
}

/// The payload of [`TRIGGER_EVENT`].
///
/// Built by the producers of `outbox-workflow-store`, so not
/// `#[non_exhaustive]`: a new field changes the event's format, which both
/// sides change together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TriggerEventPayload {
    /// The tenant.
    pub tenant_id: String,
    /// The entity (`order`).
    pub entity: String,
    /// `row.created`, `row.updated` or `row.deleted`.
    pub event: String,
    /// The `entity_row` concerned.
    pub row_id: Option<Uuid>,
    /// The row's fields (for `row.deleted`, as they were when deleted).
    pub row: Value,
    /// The `application_event` row; its `data` is the input of the runs.
    pub application_event_id: Uuid,
    /// Whether runs started by this event may make external callouts
    /// (webhooks). False for events caused by a workflow's own row blocks.
    pub allow_external_callouts: bool,
    /// Who made the request, when the application said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// The workflow block that caused the event, for workflow mutations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<WorkflowOrigin>,
}

/// The payload of [`EXECUTION_REQUESTED`].
///
/// Built by the producers of `outbox-workflow-store`, so not
/// `#[non_exhaustive]`: a new field changes the event's format, which both
/// sides change together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionRequestedPayload {
    /// The `queued` execution to run.
    pub execution_id: Uuid,
    /// Its tenant.
    pub tenant_id: String,
    /// Its workflow.
    pub workflow_id: Uuid,
}

/// Why a waiting execution resumes: which output of its `waitForInput`
/// block it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum ContinueKind {
    /// The answer arrived: output `input`.
    Input,
    /// The timeout passed: output `timeout`.
    Timeout,
}

impl ContinueKind {
    /// `input` or `timeout`, as in the payload and the block's outputs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::Timeout => "timeout",
        }
    }
}

/// The payload of [`CONTINUE_REQUESTED`].
///
/// Built by the producers of `outbox-workflow-store`, so not
/// `#[non_exhaustive]`: a new field changes the event's format, which both
/// sides change together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContinueRequestedPayload {
    /// The waiting execution.
    pub execution_id: Uuid,
    /// Its tenant.
    pub tenant_id: String,
    /// The `waitForInput` block it waits in.
    pub waiting_block: String,
    /// The answer (the block's output); `null` for a timeout.
    pub input: Value,
    /// Input or timeout.
    pub kind: ContinueKind,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn round_trip<T>(value: &T, expected: &Value)
    where
        T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
    {
        let json = serde_json::to_value(value).unwrap();
        assert_eq!(&json, expected);
        let back: T = serde_json::from_value(json).unwrap();
        assert_eq!(&back, value);
    }

    #[test]
    fn trigger_event_round_trips() {
        let id = Uuid::now_v7();
        let event_id = Uuid::now_v7();
        let execution = Uuid::now_v7();
        let payload = TriggerEventPayload {
            tenant_id: "t1".into(),
            entity: "order".into(),
            event: "row.updated".into(),
            row_id: Some(id),
            row: json!({ "total": 120 }),
            application_event_id: event_id,
            allow_external_callouts: false,
            actor: None,
            origin: Some(WorkflowOrigin::new(execution, "mark")),
        };
        round_trip(
            &payload,
            &json!({
                "tenantId": "t1", "entity": "order", "event": "row.updated",
                "rowId": id, "row": { "total": 120 }, "applicationEventId": event_id,
                "allowExternalCallouts": false,
                "origin": { "executionId": execution, "blockId": "mark" }
            }),
        );
        let request = TriggerEventPayload {
            actor: Some("user-7".into()),
            origin: None,
            allow_external_callouts: true,
            ..payload
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(json["actor"], "user-7");
        assert!(json.get("origin").is_none());
        assert_eq!(
            serde_json::from_value::<TriggerEventPayload>(json).unwrap(),
            request
        );
    }

    #[test]
    fn execution_requested_round_trips() {
        let execution = Uuid::now_v7();
        let workflow = Uuid::now_v7();
        round_trip(
            &ExecutionRequestedPayload {
                execution_id: execution,
                tenant_id: "t1".into(),
                workflow_id: workflow,
            },
            &json!({ "executionId": execution, "tenantId": "t1", "workflowId": workflow }),
        );
    }

    #[test]
    fn continue_requested_round_trips() {
        let execution = Uuid::now_v7();
        for (kind, text) in [
            (ContinueKind::Input, "input"),
            (ContinueKind::Timeout, "timeout"),
        ] {
            assert_eq!(kind.as_str(), text);
            round_trip(
                &ContinueRequestedPayload {
                    execution_id: execution,
                    tenant_id: "t1".into(),
                    waiting_block: "ask".into(),
                    input: json!({ "approved": true }),
                    kind,
                },
                &json!({ "executionId": execution, "tenantId": "t1", "waitingBlock": "ask",
                         "input": { "approved": true }, "kind": text }),
            );
        }
    }

    #[test]
    fn event_types_are_workflow_events() {
        for event_type in [TRIGGER_EVENT, EXECUTION_REQUESTED, CONTINUE_REQUESTED] {
            assert!(event_type.starts_with("workflow."));
            assert!(
                outbox_model::EventType::parse(event_type).is_ok(),
                "{event_type}"
            );
        }
    }
}
