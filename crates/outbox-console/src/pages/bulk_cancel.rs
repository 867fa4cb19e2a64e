//! Cancel every event a filter selects (`outbox cancel` with filters): the
//! dry run (how many would be cancelled and refused, the first rows), then
//! the confirmation, which cancels in batches through
//! `outbox_operator::cancel::bulk` with the operator as who asked. PENDING
//! and FAILED events are cancelled, the others refused, as `outbox cancel`
//! does. At least one filter is needed; more than [`DEFAULT_CONFIRM_ABOVE`]
//! events need the box ticked, as the CLI needs `--yes`.

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use outbox_operator::cancel::bulk::{self, DEFAULT_BATCH_SIZE, Request};
use outbox_operator::confirm::{DEFAULT_CONFIRM_ABOVE, needs_confirmation};
use outbox_store::EventFilter;

use super::bulk::Confirm;
use super::events::Filters;
use super::{Viewer, layout, refusal};
use crate::figures::grouped;
use crate::{Console, ConsoleError};

/// Rows the dry run lists (to cancel, and refused).
pub const SHOWN_ROWS: u64 = 20;

/// The reason kept in the history when the operator gives none.
pub const DEFAULT_REASON: &str = "cancelled from the console (by filter)";

/// The store's filter of `filters`; refused without any filter, so that
/// no click cancels every pending event.
fn selection(filters: &Filters) -> Result<EventFilter, String> {
    if filters.query().is_empty() {
        return Err(
            "Choose at least one filter before cancelling by filter (nothing changed).".to_owned(),
        );
    }
    filters.selection()
}

pub(crate) async fn dry_run(
    State(console): State<Console>,
    viewer: Viewer,
    Query(filters): Query<Filters>,
) -> Result<Response, ConsoleError> {
    let filter = match selection(&filters) {
        Ok(filter) => filter,
        Err(problem) => return Ok(refusal(&viewer.base, StatusCode::BAD_REQUEST, &problem)),
    };
    let mut conn = console.conn().await?;
    let selection = bulk::select(&mut conn, &filter, None).await?;
    let preview = bulk::preview(&mut conn, &filter, &selection, SHOWN_ROWS).await?;
    drop(conn);
    let guarded = needs_confirmation(selection.to_cancel, DEFAULT_CONFIRM_ABOVE);
    let event = |id| viewer.base.to(&format!("/events/{id}"));
    let body = html! {
        p #dry-run {
            "Dry run: " span #dry-run-count { (grouped(selection.to_cancel)) } " event(s) would be cancelled, "
            (grouped(selection.refused())) " of the " (grouped(selection.matching)) " matching refused; nothing changed yet."
        }
        @if !preview.is_empty() {
            table #preview {
                thead { tr { th { "id" } th { "event type" } th { "status" } th { "what happens" } } }
                tbody {
                    @for shown in &preview {
                        tr {
                            td { a href=(event(shown.row.id)) { (shown.row.id.to_string()) } }
                            td { (shown.row.event_type) }
                            td { (shown.row.status.as_str()) }
                            td { (shown.refused.unwrap_or("→ CANCELLED (a requeue can bring it back)")) }
                        }
                    }
                }
            }
        }
        @if selection.to_cancel > 0 {
            form #confirm-form method="post" action=(viewer.base.to("/events/cancel")) {
                (filters.hidden())
                input type="hidden" name="csrf" value=(viewer.csrf_field());
                input type="hidden" name="expected" value=(selection.to_cancel);
                label { "reason " input #reason name="reason" value=(DEFAULT_REASON) size="40"; }
                @if guarded {
                    label.warning {
                        input #yes type="checkbox" name="yes" value="true";
                        " Yes, cancel all " (grouped(selection.to_cancel)) " (more than " (grouped(DEFAULT_CONFIRM_ABOVE)) ")"
                    }
                }
                button #confirm type="submit" { "Confirm: cancel " (grouped(selection.to_cancel)) " event(s)" }
            }
        }
        p { a href=(format!("{}?{}", viewer.base.to("/events"), filters.query())) { "Back to the events" } }
    };
    Ok(layout(&viewer, "Cancel the matching events", body).into_response())
}

pub(crate) async fn confirm(
    State(console): State<Console>,
    viewer: Viewer,
    Form(form): Form<Confirm>,
) -> Result<Response, ConsoleError> {
    if let Some(refused) = viewer.refusal_of_action(&form.csrf) {
        tracing::warn!(name = %viewer.identity.name, role = %viewer.identity.role, "console cancel by filter refused");
        return Ok(refused);
    }
    let filter = match selection(&form.filters) {
        Ok(filter) => filter,
        Err(problem) => return Ok(refusal(&viewer.base, StatusCode::BAD_REQUEST, &problem)),
    };
    let mut conn = console.conn().await?;
    let selection = bulk::select(&mut conn, &filter, None).await?;
    if let Some(refused) = form.refusal(&viewer, selection.to_cancel, "cancelled") {
        return Ok(refused);
    }
    let actor = viewer.identity.actor();
    let reason = form.reason_or(DEFAULT_REASON);
    let request = Request {
        reason,
        requested_by: Some(&actor),
        total: selection.to_cancel,
        batch_size: DEFAULT_BATCH_SIZE,
    };
    let done = bulk::run(&mut conn, &filter, &request).await?;
    tracing::info!(actor = %actor, cancelled = done.ids.len(), batches = done.batches, "console cancel by filter");
    let query = form.filters.query();
    let to = format!(
        "{}?{query}&cancelled={}",
        viewer.base.to("/events"),
        done.ids.len()
    );
    Ok(Redirect::to(&to).into_response())
}
