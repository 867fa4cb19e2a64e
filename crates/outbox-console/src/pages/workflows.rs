//! The workflows (definitions, their versions) and their executions with
//! the CLI's filters (`outbox workflow versions`, `outbox workflow
//! executions`), read through `outbox-workflow-store`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::DateTime;
use maud::{Markup, html};
use outbox_workflow_store::{
    self as store, ExecutionFilter, ExecutionPosition, ExecutionStatus, Workflow, WorkflowExecution,
};
use serde::Deserialize;
use uuid::Uuid;

use super::{Viewer, layout, refusal, shown_json, when};
use crate::figures::grouped;
use crate::{Console, ConsoleError};

/// Workflows listed at most.
pub const WORKFLOWS_SHOWN: i64 = 200;

/// Executions per page, newest first (the CLI's default limit).
pub const EXECUTIONS_SHOWN: i64 = 50;

/// Matching executions the executions page counts at most (it says "more
/// than" past it), so that a count never reads the whole table.
pub const EXECUTIONS_COUNTED: u64 = 10_000;

/// The tenant filter of the workflows page.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct TenantFilter {
    #[serde(default)]
    tenant: String,
}

pub(crate) async fn list(
    State(console): State<Console>,
    viewer: Viewer,
    Query(filter): Query<TenantFilter>,
) -> Result<Response, ConsoleError> {
    let tenant = filter.tenant.trim();
    let mut conn = console.conn().await?;
    let workflows = store::list_workflows(
        &mut conn,
        (!tenant.is_empty()).then_some(tenant),
        WORKFLOWS_SHOWN,
    )
    .await?;
    let base = &viewer.base;
    let body = html! {
        form.filters #filters method="get" action=(base.to("/workflows")) {
            label { "tenant " input name="tenant" value=(tenant); }
            button #apply type="submit" { "Filter" }
        }
        @if workflows.is_empty() {
            p.muted #no-workflows { "No workflow saved yet (outbox workflow save)." }
        } @else {
            table #workflows {
                thead { tr {
                    th { "tenant" } th { "name" } th { "status" } th.num { "current version" }
                    th { "updated (UTC)" } th { "executions" }
                } }
                tbody {
                    @for workflow in &workflows {
                        tr {
                            td { (workflow.tenant_id) }
                            td { a.workflow-link href=(base.to(&format!("/workflows/{}", workflow.id))) { (workflow.name) } }
                            td { (workflow.status.as_str()) }
                            td.num { (workflow.current_version) }
                            td { (when(Some(workflow.updated_at))) }
                            td { a href=(executions_of(&viewer, workflow)) { "executions" } }
                        }
                    }
                }
            }
            @if workflows.len() as i64 == WORKFLOWS_SHOWN {
                p.muted { "The first " (WORKFLOWS_SHOWN) " by tenant and name: filter by tenant to see others." }
            }
        }
    };
    Ok(layout(&viewer, "Workflows", body).into_response())
}

fn executions_of(viewer: &Viewer, workflow: &Workflow) -> String {
    format!("{}?workflow={}", viewer.base.to("/executions"), workflow.id)
}

/// Which version of a workflow its page shows.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Version {
    #[serde(default)]
    version: Option<i32>,
}

pub(crate) async fn one(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Query(Version { version }): Query<Version>,
) -> Result<Response, ConsoleError> {
    let mut conn = console.conn().await?;
    let Some(workflow) = store::get_workflow(&mut conn, id).await? else {
        return Ok(refusal(
            &viewer.base,
            StatusCode::NOT_FOUND,
            &format!("There is no workflow {id}."),
        ));
    };
    let shown = version.unwrap_or(workflow.current_version);
    let versions = store::workflow_versions(&mut conn, id).await?;
    let definition = store::version_definition(&mut conn, id, shown).await?;
    let filter = ExecutionFilter {
        workflow_id: Some(id),
        limit: Some(10),
        ..ExecutionFilter::default()
    };
    let recent = store::list_executions(&mut conn, &filter).await?;
    let base = &viewer.base;
    let page = base.to(&format!("/workflows/{id}"));
    let body = html! {
        table.details #details {
            tr { th { "tenant" } td #field-tenant { (workflow.tenant_id) } }
            tr { th { "status" } td #field-status { (workflow.status.as_str()) } }
            tr { th { "current version" } td #field-current-version { (workflow.current_version) } }
            tr { th { "created" } td { (when(Some(workflow.created_at))) } }
            tr { th { "updated" } td { (when(Some(workflow.updated_at))) } }
        }
        h2 { "Versions" }
        table #versions {
            thead { tr { th.num { "version" } th { "saved (UTC)" } th { "" } } }
            tbody {
                @for v in &versions {
                    tr {
                        td.num { a href=(format!("{page}?version={}", v.version)) { (v.version) } }
                        td { (when(Some(v.created_at))) }
                        td { @if v.current { "current: new runs start on it" } }
                    }
                }
            }
        }
        h2 { "Definition, version " (shown) }
        @match &definition {
            Some(definition) => { pre #definition { (shown_json(definition)) } }
            None => { p.refused #definition { "There is no version " (shown) "." } }
        }
        h2 { "Recent executions" }
        (executions_table(&viewer, &recent, &[(id, workflow.name.clone())].into()))
        p { a #all-executions href=(executions_of(&viewer, &workflow)) { "All its executions →" } }
    };
    let status = if definition.is_some() {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    };
    Ok((
        status,
        layout(&viewer, &format!("Workflow {}", workflow.name), body),
    )
        .into_response())
}

/// The filters of the executions page, as the query string carries them
/// (an empty field is no filter).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct Filters {
    #[serde(default)]
    status: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    workflow: String,
    /// Where the page starts: `<created_at in µs>_<id>` of the execution
    /// before.
    #[serde(default)]
    after: String,
}

/// The filters as the store takes them, or what is wrong with a field.
#[derive(Debug)]
struct Selection {
    status: Option<ExecutionStatus>,
    tenant: Option<String>,
    workflow: Option<Uuid>,
    after: Option<ExecutionPosition>,
}

/// `position` as the `after` field carries it.
fn position_text(position: ExecutionPosition) -> String {
    format!("{}_{}", position.created_at.timestamp_micros(), position.id)
}

/// The position an `after` field carries, or what is wrong with it.
fn parse_position(raw: &str) -> Result<ExecutionPosition, String> {
    let bad = || format!("after: {raw:?} is not a page position");
    let (micros, id) = raw.split_once('_').ok_or_else(bad)?;
    Ok(ExecutionPosition {
        created_at: micros
            .parse()
            .ok()
            .and_then(DateTime::from_timestamp_micros)
            .ok_or_else(bad)?,
        id: Uuid::parse_str(id).map_err(|_| bad())?,
    })
}

impl Filters {
    fn selection(&self) -> Result<Selection, String> {
        let status = match self.status.trim() {
            "" => None,
            raw => Some(
                raw.to_ascii_lowercase()
                    .parse::<ExecutionStatus>()
                    .map_err(|e| format!("status: {e}"))?,
            ),
        };
        let workflow = match self.workflow.trim() {
            "" => None,
            raw => {
                Some(Uuid::parse_str(raw).map_err(|_| format!("workflow: {raw:?} is not a UUID"))?)
            }
        };
        let tenant = Some(self.tenant.trim().to_owned()).filter(|t| !t.is_empty());
        let after = match self.after.trim() {
            "" => None,
            raw => Some(parse_position(raw)?),
        };
        Ok(Selection {
            status,
            tenant,
            workflow,
            after,
        })
    }

    /// The query string of these filters with the page starting after `last`.
    fn next_page(&self, last: &WorkflowExecution) -> String {
        [
            ("status", self.status.trim()),
            ("tenant", self.tenant.trim()),
            ("workflow", self.workflow.trim()),
        ]
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| format!("{name}={}", super::events::encode(value)))
        .chain([format!(
            "after={}",
            position_text(ExecutionPosition::of(last))
        )])
        .collect::<Vec<_>>()
        .join("&")
    }
}

pub(crate) async fn executions(
    State(console): State<Console>,
    viewer: Viewer,
    Query(filters): Query<Filters>,
) -> Result<Response, ConsoleError> {
    let selection = match filters.selection() {
        Ok(selection) => selection,
        Err(problem) => {
            let body = html! {
                (executions_form(&viewer, &filters))
                p.refused #filter-problem { (problem) }
            };
            return Ok(
                (StatusCode::BAD_REQUEST, layout(&viewer, "Executions", body)).into_response(),
            );
        }
    };
    let statuses: Vec<ExecutionStatus> = selection.status.into_iter().collect();
    let filter = ExecutionFilter {
        tenant_id: selection.tenant.as_deref(),
        workflow_id: selection.workflow,
        statuses: &statuses,
        limit: Some(EXECUTIONS_SHOWN),
        after: selection.after,
    };
    let mut conn = console.conn().await?;
    let rows = store::list_executions(&mut conn, &filter).await?;
    let full = rows.len() as i64 == EXECUTIONS_SHOWN;
    // Only a full page, or one after others, can leave executions out:
    // count them then, reading no more than EXECUTIONS_COUNTED of them.
    let matching = if full || selection.after.is_some() {
        store::count_executions_up_to(&mut conn, &filter, EXECUTIONS_COUNTED).await?
    } else {
        Some(rows.len() as u64)
    };
    let next = rows.last().filter(|_| full).map(|last| {
        format!(
            "{}?{}",
            viewer.base.to("/executions"),
            filters.next_page(last)
        )
    });
    let mut ids: Vec<Uuid> = rows.iter().map(|e| e.workflow_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let names = store::workflow_names(&mut conn, &ids).await?;
    let body = html! {
        (executions_form(&viewer, &filters))
        p #matching {
            @match matching {
                Some(n) => { (grouped(n)) " matching execution(s), newest first" }
                None => { "More than " (grouped(EXECUTIONS_COUNTED)) " matching executions, newest first" }
            }
            @if selection.after.is_some() { ", this page after the ones before" }
        }
        (executions_table(&viewer, &rows, &names))
        @if let Some(next) = next {
            p { a #next-page href=(next) { "Next page →" } }
        }
    };
    Ok(layout(&viewer, "Executions", body).into_response())
}

fn executions_form(viewer: &Viewer, filters: &Filters) -> Markup {
    html! {
        form.filters #filters method="get" action=(viewer.base.to("/executions")) {
            label { "status "
                select name="status" {
                    option value="" { "any" }
                    @for status in ExecutionStatus::ALL {
                        option value=(status.as_str()) selected[filters.status.eq_ignore_ascii_case(status.as_str())] { (status.as_str()) }
                    }
                }
            }
            label { "tenant " input name="tenant" value=(filters.tenant); }
            label { "workflow id " input name="workflow" value=(filters.workflow) size="36"; }
            button #apply type="submit" { "Filter" }
        }
    }
}

/// The executions as a table, newest first, each a link to its page.
fn executions_table(
    viewer: &Viewer,
    rows: &[WorkflowExecution],
    names: &std::collections::HashMap<Uuid, String>,
) -> Markup {
    let base = &viewer.base;
    html! {
        @if rows.is_empty() {
            p.muted #no-executions { "No execution." }
        } @else {
            table #executions {
                thead { tr {
                    th { "created (UTC)" } th { "id" } th { "status" } th { "tenant" } th { "workflow" }
                    th.num { "version" } th { "trigger" } th { "finished (UTC)" } th { "waiting in / error" }
                } }
                tbody {
                    @for row in rows {
                        tr {
                            td { (when(Some(row.created_at))) }
                            td { a.execution-link href=(base.to(&format!("/executions/{}", row.id))) { (row.id.to_string()) } }
                            td { span class=(format!("status {}", row.status)) { (row.status.as_str()) } }
                            td { (row.tenant_id) }
                            td {
                                a href=(base.to(&format!("/workflows/{}", row.workflow_id))) {
                                    (names.get(&row.workflow_id).map_or("-", String::as_str))
                                }
                            }
                            td.num { (row.workflow_version) }
                            td { (row.trigger_kind.as_str()) }
                            td { (when(row.finished_at)) }
                            td { (note(row)) }
                        }
                    }
                }
            }
        }
    }
}

/// The block a run waits in, or the first line of its error (URLs reduced).
fn note(row: &WorkflowExecution) -> String {
    match (&row.waiting_block, &row.error) {
        (Some(block), _) => block.clone(),
        (None, Some(error)) => {
            outbox_queue::redact_urls_in(error.lines().next().unwrap_or_default())
        }
        (None, None) => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execution_filters_become_the_stores_and_wrong_ones_are_named() {
        let filters = Filters {
            status: "Waiting".into(),
            tenant: " acme ".into(),
            workflow: String::new(),
            after: String::new(),
        };
        let selection = filters.selection().unwrap();
        assert_eq!(selection.status, Some(ExecutionStatus::Waiting));
        assert_eq!(selection.tenant.as_deref(), Some("acme"));
        assert_eq!(selection.workflow, None);
        let wrong = Filters {
            workflow: "42".into(),
            ..Filters::default()
        };
        assert!(wrong.selection().unwrap_err().contains("not a UUID"));
        let unknown = Filters {
            status: "sleeping".into(),
            ..Filters::default()
        };
        assert!(
            unknown
                .selection()
                .unwrap_err()
                .contains("unknown execution status")
        );
    }
}
