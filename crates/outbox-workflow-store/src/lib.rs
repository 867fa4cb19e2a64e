//! The workflow tables and their writers. Everything here works on a
//! caller's connection and never runs a workflow: this crate depends on
//! neither the runner, nor the code sandbox, nor the bridge, so whatever
//! only saves workflows or asks for runs (an application's producers, the
//! CLI) cannot run one in place; it publishes an event that the
//! `outbox.workflow` subscriber handles. Definitions and their validation
//! are `outbox-workflow-model`'s.
//!
//! The store: row types, and the functions that
//! save definitions, read versions, match event triggers and create
//! executions; the reads operators need (the workflows, a workflow by id
//! or name, its versions and a version's definition as saved, listing and
//! counting executions, block runs in order, stuck executions); and [`cancel_execution`], a person stopping a run.
//!
//! - [`producers`] write the `workflow.*` outbox events in the caller's
//!   transaction (row mutations with their application events, manual and
//!   API run requests, continuations of waiting runs).
//! - [`admin`] is what a person does with workflows without writing Rust
//!   (read a definition file, save, publish, list versions, start a run,
//!   answer a waiting one), one function per action, shared by the
//!   `outbox workflow` commands and any later console or HTTP API.
//! - [`sweep`] finds runs whose holder died and publishes their resume.
//!
//! Every function takes `&mut AsyncPgConnection`, so the caller chooses the
//! transaction: create an execution in the same transaction as the business
//! write that triggers it, or save a workflow together with other changes.
//! Functions that write several rows ([`save_workflow`]) open a transaction
//! of their own, which nests as a savepoint inside the caller's.
//!
//! Versioning: saving a `live` workflow, or saving a draft whose current
//! version an execution already uses, appends version n+1; saving a draft
//! that stays a draft overwrites its current version in place while no
//! execution uses it (a draft being edited does not pile up versions). An
//! execution records the version it started on, so no save ever changes a
//! run in flight. See `docs/workflows/running.md`, "Data model".

pub mod admin;
mod cancel;
mod db;
mod error;
mod inspect;
pub mod producers;
mod row;
pub mod sweep;
mod workflows;

pub use cancel::{
    CancelError, CancelledExecution, HOOK_EXECUTED, HOOK_FAILED, cancel_execution, cancelled_by,
};
pub use db::{
    ExecutionFilter, ExecutionPosition, LiveWorkflow, NewExecution, SavedWorkflow,
    count_executions, count_executions_up_to, create_execution, event_executions, get_execution,
    list_executions, live_event_workflows, load_version, publish, save_workflow, set_status,
};
pub use error::StoreError;
pub use inspect::{
    StuckExecutions, block_executions, block_types, get_workflow, list_workflows, stuck_executions,
    version_definition, workflow_names,
};
pub use row::{
    ApplicationEvent, BlockExecutionStatus, EntityRow, ExecutionStatus, TriggerKind, UnknownValue,
    Workflow, WorkflowBlockExecution, WorkflowExecution, WorkflowStatus, WorkflowVersion,
};
pub use workflows::{VersionSummary, WorkflowRef, find_workflow, workflow_versions};
