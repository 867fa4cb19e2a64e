//! Requeue every event a filter selects (`outbox requeue` with filters):
//! the dry run (how many would be requeued and refused, the first rows),
//! then the confirmation, which requeues in batches through
//! `outbox_operator::requeue::bulk` with the operator as who asked. More
//! than [`DEFAULT_CONFIRM_ABOVE`] need the box ticked, as the CLI needs
//! `--yes`. Without a status filter it selects FAILED events, as the CLI.

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use outbox_model::OutboxStatus;
use outbox_operator::confirm::{DEFAULT_CONFIRM_ABOVE, needs_confirmation};
use outbox_operator::requeue::bulk::{self, DEFAULT_BATCH_SIZE, Request};
use outbox_store::EventFilter;
use serde::Deserialize;

use super::events::Filters;
use super::{Viewer, layout, refusal};
use crate::{Console, ConsoleError};

/// Rows the dry run lists (to requeue, and refused).
pub const SHOWN_ROWS: u64 = 20;

/// The reason kept in the history when the operator gives none.
pub const DEFAULT_REASON: &str = "requeued from the console (by filter)";

/// The store's filter of `filters`, FAILED only when no status is given.
fn selection(filters: &Filters) -> Result<EventFilter, String> {
    let mut filter = filters.selection()?;
    if filter.statuses.is_empty() {
        filter.statuses = vec![OutboxStatus::Failed];
    }
    Ok(filter)
}

fn bad_filter(viewer: &Viewer, problem: &str) -> Response {
    refusal(&viewer.base, StatusCode::BAD_REQUEST, problem)
}

pub(crate) async fn dry_run(
    State(console): State<Console>,
    viewer: Viewer,
    Query(filters): Query<Filters>,
) -> Result<Response, ConsoleError> {
    let filter = match selection(&filters) {
        Ok(filter) => filter,
        Err(problem) => return Ok(bad_filter(&viewer, &problem)),
    };
    let mut conn = console.conn().await?;
    let selection = bulk::select(&mut conn, &filter, false, None).await?;
    let preview = bulk::preview(&mut conn, &filter, false, &selection, SHOWN_ROWS).await?;
    drop(conn);
    let guarded = needs_confirmation(selection.to_requeue, DEFAULT_CONFIRM_ABOVE);
    let event = |id| viewer.base.to(&format!("/events/{id}"));
    let body = html! {
        p #dry-run {
            "Dry run: " span #dry-run-count { (selection.to_requeue) } " event(s) would be requeued, "
            (selection.refused()) " of the " (selection.matching) " matching refused; nothing changed yet."
        }
        @if !preview.requeue.is_empty() || !preview.refused.is_empty() {
            table #preview {
                thead { tr { th { "id" } th { "event type" } th { "status" } th { "what happens" } } }
                tbody {
                    @for row in preview.requeue.iter().chain(&preview.refused) {
                        tr {
                            td { a href=(event(row.id)) { (row.id.to_string()) } }
                            td { (row.event_type) }
                            td { (row.status.as_str()) }
                            td { (row.refused.as_deref().unwrap_or("→ PENDING (retries → 0, last error cleared)")) }
                        }
                    }
                }
            }
        }
        @if selection.to_requeue > 0 {
            form #confirm-form method="post" action=(viewer.base.to("/events/requeue")) {
                (filters.hidden())
                input type="hidden" name="csrf" value=(viewer.csrf_field());
                input type="hidden" name="expected" value=(selection.to_requeue);
                label { "reason " input #reason name="reason" value=(DEFAULT_REASON) size="40"; }
                @if guarded {
                    label.warning {
                        input #yes type="checkbox" name="yes" value="true";
                        " Yes, requeue all " (selection.to_requeue) " (more than " (DEFAULT_CONFIRM_ABOVE) ")"
                    }
                }
                button #confirm type="submit" { "Confirm: requeue " (selection.to_requeue) " event(s)" }
            }
        }
        p { a href=(format!("{}?{}", viewer.base.to("/events"), filters.query())) { "Back to the events" } }
    };
    Ok(layout(&viewer, "Requeue the matching events", body).into_response())
}

/// What the confirmation posts: the filters, and the form's own fields.
#[derive(Deserialize)]
pub(crate) struct Confirm {
    #[serde(flatten)]
    filters: Filters,
    #[serde(default)]
    csrf: String,
    /// `true` when the confirmation box is ticked.
    #[serde(default)]
    yes: String,
    #[serde(default)]
    reason: String,
    /// How many events the dry run counted when the operator confirmed:
    /// more than that now and nothing is requeued.
    #[serde(default)]
    expected: Option<u64>,
}

pub(crate) async fn confirm(
    State(console): State<Console>,
    viewer: Viewer,
    Form(form): Form<Confirm>,
) -> Result<Response, ConsoleError> {
    if let Some(refused) = viewer.refusal_of_action(&form.csrf) {
        tracing::warn!(name = %viewer.identity.name, role = %viewer.identity.role, "console requeue by filter refused");
        return Ok(refused);
    }
    let filter = match selection(&form.filters) {
        Ok(filter) => filter,
        Err(problem) => return Ok(bad_filter(&viewer, &problem)),
    };
    let mut conn = console.conn().await?;
    let selection = bulk::select(&mut conn, &filter, false, None).await?;
    if selection.to_requeue == 0 {
        return Ok(refusal(
            &viewer.base,
            StatusCode::CONFLICT,
            "No matching event may be requeued (any more): nothing changed.",
        ));
    }
    let Some(expected) = form.expected else {
        return Ok(refusal(
            &viewer.base,
            StatusCode::CONFLICT,
            "The confirmation did not say how many events it was for: confirm from the dry run (nothing changed).",
        ));
    };
    if selection.to_requeue > expected {
        return Ok(refusal(
            &viewer.base,
            StatusCode::CONFLICT,
            &format!(
                "{} events now match, {expected} were confirmed: run the dry run again (nothing changed).",
                selection.to_requeue
            ),
        ));
    }
    if needs_confirmation(selection.to_requeue, DEFAULT_CONFIRM_ABOVE) && form.yes != "true" {
        return Ok(refusal(
            &viewer.base,
            StatusCode::CONFLICT,
            &format!(
                "{} events would be requeued, more than {DEFAULT_CONFIRM_ABOVE}: tick the confirmation box (nothing changed).",
                selection.to_requeue
            ),
        ));
    }
    let actor = viewer.identity.actor();
    let reason = match form.reason.trim() {
        "" => DEFAULT_REASON,
        reason => reason,
    };
    let request = Request {
        reason,
        requested_by: Some(&actor),
        replay: false,
        total: selection.to_requeue,
        batch_size: DEFAULT_BATCH_SIZE,
    };
    let done = bulk::run(&mut conn, &filter, &request).await?;
    tracing::info!(actor = %actor, requeued = done.ids.len(), batches = done.batches, "console requeue by filter");
    let query = form.filters.query();
    let to = format!(
        "{}?{query}{}requeued={}",
        viewer.base.to("/events"),
        if query.is_empty() { "" } else { "&" },
        done.ids.len()
    );
    Ok(Redirect::to(&to).into_response())
}
