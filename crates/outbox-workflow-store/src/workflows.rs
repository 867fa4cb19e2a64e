//! A tenant's workflow found by id or by name ([`find_workflow`]), and the
//! versions of a workflow ([`workflow_versions`]). Nothing here writes.

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{workflow, workflow_version};
use serde::Serialize;
use uuid::Uuid;

use super::{StoreError, Workflow};

/// How a person names a workflow: its id, or its name within the tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WorkflowRef {
    /// The workflow's id.
    Id(Uuid),
    /// The workflow's name (unique within a tenant).
    Name(String),
}

/// A UUID is an [`WorkflowRef::Id`]; anything else a
/// [`WorkflowRef::Name`]. A name that looks like a UUID is still found:
/// [`find_workflow`] falls back to the name when no workflow has that id.
impl FromStr for WorkflowRef {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(s.parse::<Uuid>()
            .map_or_else(|_| Self::Name(s.to_owned()), Self::Id))
    }
}

impl fmt::Display for WorkflowRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Id(id) => write!(f, "{id}"),
            Self::Name(name) => write!(f, "{name:?}"),
        }
    }
}

/// The workflow of `tenant_id` that `reference` names: by id (another
/// tenant's workflow is not found), or by name; an id that no workflow of
/// the tenant has is tried as a name.
///
/// # Errors
///
/// [`StoreError::WorkflowNotFoundByRef`] when the tenant has no such
/// workflow; [`StoreError::Database`].
pub async fn find_workflow(
    conn: &mut AsyncPgConnection,
    tenant_id: &str,
    reference: &WorkflowRef,
) -> Result<Workflow, StoreError> {
    let by_name = |name: String| {
        workflow::table
            .filter(workflow::tenant_id.eq(tenant_id.to_owned()))
            .filter(workflow::name.eq(name))
            .select(Workflow::as_select())
    };
    let found = match reference {
        WorkflowRef::Id(id) => {
            let by_id = workflow::table
                .find(*id)
                .filter(workflow::tenant_id.eq(tenant_id))
                .select(Workflow::as_select())
                .get_result(conn)
                .await
                .optional()?;
            match by_id {
                Some(found) => Some(found),
                None => by_name(id.to_string()).get_result(conn).await.optional()?,
            }
        }
        WorkflowRef::Name(name) => by_name(name.clone()).get_result(conn).await.optional()?,
    };
    found.ok_or_else(|| StoreError::WorkflowNotFoundByRef {
        tenant_id: tenant_id.to_owned(),
        reference: reference.to_string(),
    })
}

/// One saved version of a workflow, as [`workflow_versions`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Queryable)]
#[non_exhaustive]
pub struct VersionSummary {
    /// 1, 2, …
    pub version: i32,
    /// When it was saved (a draft overwritten in place: its last save).
    pub created_at: DateTime<Utc>,
    /// True for the workflow's current version: the one new runs start on.
    pub current: bool,
}

/// The versions of workflow `workflow_id`, oldest first, the current one
/// marked. Empty when there is no such workflow.
///
/// # Errors
///
/// [`StoreError::Database`].
pub async fn workflow_versions(
    conn: &mut AsyncPgConnection,
    workflow_id: Uuid,
) -> Result<Vec<VersionSummary>, StoreError> {
    Ok(workflow_version::table
        .inner_join(workflow::table)
        .filter(workflow_version::workflow_id.eq(workflow_id))
        .order(workflow_version::version)
        .select((
            workflow_version::version,
            workflow_version::created_at,
            workflow_version::version.eq(workflow::current_version),
        ))
        .load(conn)
        .await?)
}
