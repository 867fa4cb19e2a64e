//! Row types of the workflow tables, and the typed values of their text
//! columns.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use outbox_model::schema::{
    application_event, entity_row, workflow, workflow_block_execution, workflow_execution,
    workflow_version,
};
use serde_json::Value;
use uuid::Uuid;

/// A text column held a value its type does not know (the table's CHECK
/// constraint makes this impossible unless the schema changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
#[non_exhaustive]
pub struct UnknownValue {
    /// The type: `workflow status`, `trigger kind`, …
    pub what: &'static str,
    /// The value as stored.
    pub value: String,
}

/// Declares a text enum: `as_str`, `FromStr`, `TryFrom<String>`, `Display`.
macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The stored text.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    _ => Err(UnknownValue { what: $what, value: s.to_owned() }),
                }
            }
        }

        impl TryFrom<String> for $name {
            type Error = UnknownValue;

            fn try_from(s: String) -> Result<Self, UnknownValue> {
                s.parse()
            }
        }

        /// The stored text; honours width and alignment (`{:<8}`), so
        /// tables line up.
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.as_str())
            }
        }
    };
}

text_enum! {
    /// `workflow.status`.
    WorkflowStatus, "workflow status" {
        /// Being edited; triggers never start it.
        Draft => "draft",
        /// Triggers start runs on its current version.
        Live => "live",
    }
}

text_enum! {
    /// `workflow_execution.trigger_kind`: what started a run.
    TriggerKind, "trigger kind" {
        /// A person (manualTrigger).
        Manual => "manual",
        /// An API request (apiTrigger).
        Api => "api",
        /// An application event (eventTrigger).
        Event => "event",
        /// An event stream.
        Stream => "stream",
    }
}

text_enum! {
    /// `workflow_execution.status`. `queued`, `running` and `waiting` are
    /// unfinished ([`ExecutionStatus::is_finished`]); the others are
    /// final.
    ExecutionStatus, "execution status" {
        /// Created, not yet picked up by the runner.
        Queued => "queued",
        /// The runner is working on it.
        Running => "running",
        /// Suspended in a `waitForInput` block (`waiting_block`).
        Waiting => "waiting",
        /// Ended after its last block.
        Success => "success",
        /// A block failed.
        Error => "error",
        /// Refused before any block ran (preflight).
        Rejected => "rejected",
        /// Stopped by a person before it ended
        /// ([`cancel_execution`](crate::cancel_execution)); `error`
        /// says who. A run the runner is working on stops at its next
        /// block.
        Cancelled => "cancelled",
    }
}

impl ExecutionStatus {
    /// True for the final statuses (`success`, `error`, `rejected`,
    /// `cancelled`): nothing moves such a run again.
    #[must_use]
    pub const fn is_finished(self) -> bool {
        match self {
            Self::Queued | Self::Running | Self::Waiting => false,
            Self::Success | Self::Error | Self::Rejected | Self::Cancelled => true,
        }
    }
}

text_enum! {
    /// `workflow_block_execution.status`.
    BlockExecutionStatus, "block execution status" {
        /// Claimed before its call (`httpRequest`, a bridge's `code`): the
        /// call may have been made; no result is recorded yet.
        Running => "running",
        /// The block finished and took an output.
        Success => "success",
        /// The block failed.
        Error => "error",
        /// The block suspended the run.
        Waiting => "waiting",
    }
}

/// A `workflow` row.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable)]
#[diesel(table_name = workflow)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct Workflow {
    /// Primary key.
    pub id: Uuid,
    /// The tenant it belongs to.
    pub tenant_id: String,
    /// Unique within the tenant.
    pub name: String,
    /// Draft or live.
    #[diesel(deserialize_as = String)]
    pub status: WorkflowStatus,
    /// The version new executions start on.
    pub current_version: i32,
    /// When it was first saved.
    pub created_at: DateTime<Utc>,
    /// The last save or status change.
    pub updated_at: DateTime<Utc>,
}

/// A `workflow_version` row: one saved definition.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = workflow_version)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct WorkflowVersion {
    /// The workflow.
    pub workflow_id: Uuid,
    /// 1, 2, …
    pub version: i32,
    /// The definition as validated when saved.
    pub definition: Value,
    /// When it was (last) saved.
    pub created_at: DateTime<Utc>,
}

/// A `workflow_execution` row: one run.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable)]
#[diesel(table_name = workflow_execution)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct WorkflowExecution {
    /// Primary key.
    pub id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The workflow.
    pub workflow_id: Uuid,
    /// The version the run started on.
    pub workflow_version: i32,
    /// What started it.
    #[diesel(deserialize_as = String)]
    pub trigger_kind: TriggerKind,
    /// Where it stands.
    #[diesel(deserialize_as = String)]
    pub status: ExecutionStatus,
    /// The trigger's data.
    pub input: Value,
    /// The last block's output, once it succeeded.
    pub output: Option<Value>,
    /// Why it ended in error or was rejected, or who cancelled it.
    pub error: Option<String>,
    /// The block a waiting run waits in.
    pub waiting_block: Option<String>,
    /// The run's variables.
    pub vars: Value,
    /// The outbox event that started it.
    pub trigger_event_id: Option<Uuid>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// The last change of status.
    pub updated_at: DateTime<Utc>,
    /// When the runner first picked it up.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// Whether its `httpRequest` blocks may call out: false for a run
    /// started by an event a workflow's own row block caused.
    pub allow_external_callouts: bool,
    /// The job holding the run (a fresh id per take of the lease).
    pub lease_owner: Option<Uuid>,
    /// Until when the holder may write without renewing; `None` or past:
    /// the run is free to take.
    pub lease_until: Option<DateTime<Utc>>,
}

/// A `workflow_block_execution` row: one block run of an execution.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = workflow_block_execution)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct WorkflowBlockExecution {
    /// The execution.
    pub execution_id: Uuid,
    /// The block's id in the definition.
    pub block_id: String,
    /// The block's run number within the execution, from 1.
    pub sequence: i32,
    /// How the block run ended.
    #[diesel(deserialize_as = String)]
    pub status: BlockExecutionStatus,
    /// The block's output.
    pub output: Option<Value>,
    /// Why it failed.
    pub error: Option<String>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// How many times the block was claimed (2 or more: a holder died
    /// after claiming it, and its call may have been made).
    pub attempt: i32,
}

/// The field of a waiting block run's output that names who answered it
/// ([`crate::admin::answer_run`]).
pub(crate) const ANSWERED_BY: &str = "answeredBy";

impl WorkflowBlockExecution {
    /// Who answered this wait (`outbox workflow answer --by`, or
    /// `console:<name> (<role>)`), and when: kept on the waiting block run
    /// by [`crate::admin::answer_run`]. `None` for any other block run,
    /// a wait not answered yet, one that timed out, or one answered before
    /// answers were recorded.
    #[must_use]
    pub fn answered_by(&self) -> Option<(&str, Option<DateTime<Utc>>)> {
        if self.status != BlockExecutionStatus::Waiting {
            return None;
        }
        let output = self.output.as_ref()?;
        let by = output.get(ANSWERED_BY)?.as_str()?;
        let at = output
            .get("answeredAt")
            .and_then(Value::as_str)
            .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
            .map(|at| at.with_timezone(&Utc));
        Some((by, at))
    }
}

/// An `entity_row` row: a generic entity row the row blocks work on.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable)]
#[diesel(table_name = entity_row)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct EntityRow {
    /// Primary key.
    pub id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The entity (`order`).
    pub entity: String,
    /// The fields, a JSON object.
    pub data: Value,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When it was deleted (kept, no longer found).
    pub deleted_at: Option<DateTime<Utc>>,
}

/// An `application_event` row: what eventTrigger workflows match on.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable)]
#[diesel(table_name = application_event)]
#[diesel(check_for_backend(diesel::pg::Pg))]
pub struct ApplicationEvent {
    /// Primary key.
    pub id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The entity.
    pub entity: String,
    /// `row.created`, … or a custom name.
    pub event: String,
    /// The entity row concerned, for row events.
    pub row_id: Option<Uuid>,
    /// The payload.
    pub data: Value,
    /// When it happened.
    pub created_at: DateTime<Utc>,
}
