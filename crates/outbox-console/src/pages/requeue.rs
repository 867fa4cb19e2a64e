//! Requeue (or replay) one event: the dry run first (what would change, or
//! why it is refused, by the CLI's policy), then the confirmation POST,
//! which records the operator as the actor in the event's history.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use outbox_operator::requeue::{Plan, plan, requeueable};
use outbox_store::Change;
use serde::Deserialize;
use uuid::Uuid;

use super::{Viewer, layout, not_found, refusal};
use crate::{Console, ConsoleError};

/// The reason kept in the history when the operator gives none.
pub const DEFAULT_REASON: &str = "requeued from the console";

#[derive(Deserialize)]
pub(crate) struct Replay {
    #[serde(default)]
    replay: bool,
}

/// The plan for the one row `id` (empty when there is no such row).
async fn plan_for(console: &Console, id: Uuid, replay: bool) -> Result<Plan, ConsoleError> {
    let mut conn = console.conn().await?;
    let rows = outbox_store::candidate(&mut conn, id)
        .await?
        .into_iter()
        .collect();
    Ok(plan(rows, replay))
}

pub(crate) async fn dry_run(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Query(Replay { replay }): Query<Replay>,
) -> Result<Response, ConsoleError> {
    let plan = plan_for(&console, id, replay).await?;
    if plan.requeue.is_empty() && plan.refused.is_empty() {
        return Ok(not_found(&viewer.base, id));
    }
    let verb = if replay { "replayed" } else { "requeued" };
    let action = viewer.base.to(&format!("/events/{id}/requeue"));
    let body = html! {
        p #dry-run {
            "Dry run: " span #dry-run-count { (plan.requeue.len()) } " event(s) would be " (verb)
            ", " (plan.refused.len()) " refused; nothing changed yet."
        }
        @for row in &plan.requeue {
            p { (row.event_type) ": " (row.status.as_str()) " → PENDING (retries " (row.retries) " → 0, last error cleared)" }
            @if row.replay {
                p.warning { "It is DONE: its side effects (mails, webhooks, …) run again, as a new delivery generation." }
            }
        }
        @for row in &plan.refused {
            p.refused #refused-reason { (row.refused.as_deref().unwrap_or_default()) }
        }
        @if !plan.requeue.is_empty() {
            form #confirm-form method="post" action=(action) {
                input type="hidden" name="csrf" value=(viewer.csrf_field());
                input type="hidden" name="replay" value=(if replay { "true" } else { "false" });
                label { "reason " input #reason name="reason" value=(DEFAULT_REASON) size="40"; }
                button #confirm type="submit" { "Confirm: " @if replay { "replay" } @else { "requeue" } " 1 event" }
            }
        }
        p { a href=(viewer.base.to(&format!("/events/{id}"))) { "Back to the event" } }
    };
    let title = if replay {
        "Replay an event"
    } else {
        "Requeue an event"
    };
    Ok(layout(&viewer, title, body).into_response())
}

#[derive(Deserialize)]
pub(crate) struct Confirm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    replay: bool,
    #[serde(default)]
    reason: String,
}

pub(crate) async fn confirm(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Form(form): Form<Confirm>,
) -> Result<Response, ConsoleError> {
    if let Some(refused) = viewer.refusal_of_action(&form.csrf) {
        tracing::warn!(event_id = %id, name = %viewer.identity.name, role = %viewer.identity.role, "console requeue refused");
        return Ok(refused);
    }
    let plan = plan_for(&console, id, form.replay).await?;
    if plan.requeue.is_empty() {
        let why = plan
            .refused
            .first()
            .and_then(|row| row.refused.clone())
            .unwrap_or_else(|| format!("There is no outbox event {id}."));
        return Ok(refusal(&viewer.base, StatusCode::CONFLICT, &why));
    }
    let reason = match form.reason.trim() {
        "" => DEFAULT_REASON,
        reason => reason,
    };
    let actor = viewer.identity.actor();
    let ids = [id];
    let allowed = requeueable(form.replay);
    let mut conn = console.conn().await?;
    let done = outbox_store::requeue(
        &mut conn,
        Change {
            ids: &ids,
            allowed: &allowed,
            reason,
            requested_by: Some(&actor),
        },
    )
    .await?;
    tracing::info!(event_id = %id, actor = %actor, requeued = done.ids.len(), replayed = done.replayed, "console requeue");
    let done = match (done.ids.len(), done.replayed) {
        (0, _) => "unchanged",
        (_, 0) => "requeued",
        _ => "replayed",
    };
    let to = format!("{}?done={done}", viewer.base.to(&format!("/events/{id}")));
    Ok(Redirect::to(&to).into_response())
}
