//! [`StoreError`]: why a store operation failed.

use uuid::Uuid;

use outbox_workflow_model::DefinitionError;

/// Why a workflow store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The definition was refused by validation; nothing was written. The
    /// inner error names the block (or edge) at fault.
    #[error("invalid workflow definition: {0}")]
    Definition(Box<DefinitionError>),
    /// No workflow with this id (for this tenant, where a tenant is given).
    #[error("no workflow {workflow_id}")]
    WorkflowNotFound {
        /// The id asked for.
        workflow_id: Uuid,
    },
    /// The tenant has no workflow with this id or name (see
    /// [`find_workflow`](crate::find_workflow)).
    #[error("tenant {tenant_id:?} has no workflow {reference}")]
    WorkflowNotFoundByRef {
        /// The tenant.
        tenant_id: String,
        /// The id, or the name in quotes, as asked for.
        reference: String,
    },
    /// The workflow exists but has no such version.
    #[error("workflow {workflow_id} has no version {version}")]
    VersionNotFound {
        /// The workflow.
        workflow_id: Uuid,
        /// The version asked for.
        version: i32,
    },
    /// A stored definition no longer passes validation (the block registry
    /// changed since it was saved).
    #[error("stored definition of workflow {workflow_id} version {version} is invalid: {source}")]
    StoredDefinition {
        /// The workflow.
        workflow_id: Uuid,
        /// The version.
        version: i32,
        /// Why it is refused now.
        source: Box<DefinitionError>,
    },
    /// A definition could not be turned into JSON (does not happen with
    /// definitions built by this crate).
    #[error("cannot serialize the definition: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The database refused the statement or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] diesel::result::Error),
}

impl From<DefinitionError> for StoreError {
    fn from(error: DefinitionError) -> Self {
        Self::Definition(Box::new(error))
    }
}
