//! Workflow definitions for the outbox's workflow path (`workflow.*`
//! events on the `outbox.workflow` queue): the block registry with its
//! capability matrix, the condition language of `if` and `switch`, and the
//! parsing and validation of definitions.
//!
//! - [`BlockKind`] lists every block type; [`BlockKind::spec`] is the
//!   capability matrix (trigger or not, native or bridge-only, credentials,
//!   outputs), and [`BlockParams`] holds each block's typed parameters.
//! - [`Condition`] compares [`Operand`]s (literals, or [`VarPath`]s into the
//!   execution context) and combines comparisons with `all`, `any`, `not`;
//!   [`Condition::evaluate`] is pure. [`TextTemplate`] fills `{{ path }}`
//!   placeholders of text parameters.
//! - [`WorkflowDefinition`] is the stored JSON form;
//!   [`WorkflowDefinition::validate`] checks every rule, each broken rule a
//!   precise [`DefinitionError`], and yields a [`ValidatedWorkflow`] with
//!   what a runner needs: the trigger, [`ValidatedWorkflow::next`], a
//!   topological order, and [`ValidatedWorkflow::preflight`] to choose
//!   between the native runner and the signed HTTP bridge.
//!
//! - [`events`] holds the type names and payloads of the `workflow.*`
//!   outbox events.
//!
//! This crate is pure: no database, no runtime, no network, so that what
//! only validates or describes workflows (the producers, the CLI's
//! `validate`) compiles none of them. It is not where workflows are stored
//! (`outbox-workflow-store`), run (`outbox-workflow-runner`), sandboxed
//! (`outbox-workflow-sandbox`) or sent to the bridge
//! (`outbox-workflow-bridge`). The user documentation of blocks,
//! conditions and rules is `docs/workflows.md`; producers and the runner
//! are in `docs/workflows/running.md`.
//!
//! ```
//! use outbox_workflow_model::{ValidatedWorkflow, labels};
//!
//! let workflow = ValidatedWorkflow::from_json(r#"{
//!   "blocks": [
//!     { "id": "start", "type": "manualTrigger" },
//!     { "id": "check", "type": "if", "params": { "condition":
//!         { "left": { "var": "input.amount" }, "op": "gte", "right": 10 } } },
//!     { "id": "note", "type": "log", "params": { "message": "amount {{ input.amount }}" } }
//!   ],
//!   "edges": [
//!     { "from": "start", "to": "check" },
//!     { "from": "check", "to": "note", "label": "true" }
//!   ]
//! }"#).unwrap();
//! assert_eq!(workflow.trigger_block().id, "start");
//! assert_eq!(workflow.next("check", labels::TRUE).map(|b| b.id.as_str()), Some("note"));
//! assert!(workflow.next("check", labels::FALSE).is_none()); // the run ends
//! assert!(workflow.preflight(true, &|_| false).is_ok());
//! ```

mod condition;
mod definition;
mod error;
pub mod events;
mod names;
mod operand;
mod params;
mod path;
mod registry;
mod template;
mod validate;
mod workflow;

pub use condition::{CompareOp, Condition, ConditionError, JsonType, MAX_CONDITION_DEPTH};
pub use definition::{Block, Edge, WorkflowDefinition};
pub use error::{DefinitionError, PreflightError};
pub use names::{MAX_NAME_LEN, is_block_id, is_identifier};
pub use operand::{Operand, VAR_KEY};
pub use params::{
    AiAgentParams, ApiTriggerParams, BlockParams, CodeLanguage, CodeParams,
    DEFAULT_HTTP_TIMEOUT_MS, EmailParams, EventTriggerParams, HttpMethod, HttpRequestParams,
    IfParams, InvalidTriggerEvent, LogLevel, LogParams, MAX_CODE_SOURCE_BYTES, MAX_HTTP_TIMEOUT_MS,
    MAX_WAIT_TIMEOUT_MS, ManualTriggerParams, RowCreateParams, RowDeleteParams, RowGetParams,
    RowUpdateParams, SwitchCase, SwitchParams, TriggerEvent, VariableParams, WaitForInputParams,
};
pub use path::{PathError, VarPath, roots};
pub use registry::{BlockKind, BlockSpec, CredentialUse, OutputShape, UnknownBlockType, labels};
pub use template::{TemplateError, TextTemplate};
pub use workflow::ValidatedWorkflow;
