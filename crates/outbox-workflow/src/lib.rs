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
//! - [`store`] holds the workflow tables' row types and the functions that
//!   save versioned definitions, match event triggers and create
//!   executions, each on a caller's `&mut AsyncPgConnection`; and the reads
//!   the operator CLI uses (executions listed and counted, block runs in
//!   order, executions stuck in `queued` or `running`).
//! - [`producers`] write the `workflow.*` outbox events in the caller's
//!   transaction (row mutations with their application events, manual and
//!   API run requests, continuations of waiting runs); [`events`] holds
//!   their type names and payloads, which the subscriber parses.
//!
//! - [`admin`] is what a person does with workflows without writing Rust
//!   (read a definition file, save, publish, list versions, start a run,
//!   answer a waiting one), one function per action, shared by the
//!   `outbox workflow` commands and any later console or HTTP API;
//!   [`store::cancel_execution`] cancels a run.
//!
//! - [`runner`] runs an execution natively, block by block, each block's
//!   effect and record in one transaction, and ends it with its plugin
//!   hook.
//! - [`code`] runs a `code` block's JavaScript in a sandbox (embedded
//!   QuickJS with memory, stack and time limits, no IO); only a runner made
//!   [`with_bridge_blocks`](runner::Runner::with_bridge_blocks), the bridge
//!   process's, uses it.
//!
//! - [`executor`] chooses where a run goes (`native`, `hybrid`, `http`);
//!   [`bridge`] is the signed HTTP service that runs what the native runner
//!   cannot, and the only place that creates and runs an execution in one
//!   step (a stream run).
//!
//! The subscriber (the `outbox.workflow` queue) calls the executor. The user
//! documentation of blocks, conditions, rules, producers and the runner is
//! `docs/workflows.md`.
//!
//! ```
//! use outbox_workflow::{ValidatedWorkflow, labels};
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

pub mod admin;
pub mod bridge;
pub mod code;
mod condition;
mod definition;
mod error;
pub mod events;
pub mod executor;
mod names;
mod operand;
mod params;
mod path;
pub mod producers;
mod registry;
pub mod runner;
pub mod store;
pub mod sweep;
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
