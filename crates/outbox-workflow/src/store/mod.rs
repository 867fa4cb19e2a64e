//! The workflow tables and their store: row types, and the functions that
//! save definitions, read versions, match event triggers and create
//! executions; the reads operators need (a workflow by id or name, its
//! versions, listing and counting executions, block runs in order, stuck
//! executions); and [`cancel_execution`], a person stopping a run.
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
//! run in flight. See `docs/workflows.md`, "Data model".

mod cancel;
mod db;
mod error;
mod inspect;
mod row;
mod workflows;

pub use cancel::{CancelError, CancelledExecution, cancel_execution, cancelled_by};
pub use db::{
    ExecutionFilter, LiveWorkflow, NewExecution, SavedWorkflow, count_executions, create_execution,
    event_executions, get_execution, list_executions, live_event_workflows, load_version, publish,
    save_workflow, set_status,
};
pub use error::StoreError;
pub use inspect::{
    StuckExecutions, block_executions, block_types, stuck_executions, workflow_names,
};
pub use row::{
    ApplicationEvent, BlockExecutionStatus, EntityRow, ExecutionStatus, TriggerKind, UnknownValue,
    Workflow, WorkflowBlockExecution, WorkflowExecution, WorkflowStatus, WorkflowVersion,
};
pub use workflows::{VersionSummary, WorkflowRef, find_workflow, workflow_versions};
