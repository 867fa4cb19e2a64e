//! The actions on one event: requeue (and replay of a DONE one) and
//! cancel. Each shows its dry run first (what would change, or why the
//! policy refuses, by `outbox-operator`, as the CLI decides), then a
//! confirmation POST that records the operator as the actor in the
//! event's history.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use outbox_operator::requeue::{Plan, execute, plan};
use outbox_store::Candidate;
use serde::Deserialize;
use uuid::Uuid;

use super::{Viewer, layout, not_found, refusal};
use crate::{Console, ConsoleError};

/// The reason a requeue keeps in the history when the operator gives none.
pub const DEFAULT_REQUEUE_REASON: &str = "requeued from the console";

/// The reason a cancel keeps in the history when the operator gives none.
pub const DEFAULT_CANCEL_REASON: &str = "cancelled from the console";

#[derive(Deserialize)]
pub(crate) struct Replay {
    #[serde(default)]
    replay: bool,
}

/// What a confirmation form posts.
#[derive(Deserialize)]
pub(crate) struct Confirm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    replay: bool,
    #[serde(default)]
    reason: String,
}

impl Confirm {
    fn reason<'a>(&'a self, default: &'a str) -> &'a str {
        match self.reason.trim() {
            "" => default,
            reason => reason,
        }
    }
}

/// A dry run as the page shows it.
struct DryRun<'a> {
    /// Rows that would change (0 or 1).
    count: usize,
    /// `requeued`, `replayed`, `cancelled`.
    verb: &'a str,
    /// What would change, one line each.
    changes: Vec<String>,
    /// What to know before confirming.
    warnings: Vec<&'a str>,
    /// Why the policy refuses, when it does.
    refused: Option<&'a str>,
    /// Where the confirmation posts.
    action: String,
    /// The `replay` field of the form.
    replay: bool,
    /// The reason field's value.
    reason: &'a str,
    /// The confirmation button's text.
    button: &'a str,
}

fn dry_run_page(viewer: &Viewer, id: Uuid, title: &str, dry_run: &DryRun<'_>) -> Markup {
    let body = html! {
        p #dry-run {
            "Dry run: " span #dry-run-count { (dry_run.count) } " event(s) would be " (dry_run.verb)
            ", " (1 - dry_run.count) " refused; nothing changed yet."
        }
        @for change in &dry_run.changes { p { (change) } }
        @for warning in &dry_run.warnings { p.warning { (warning) } }
        @if let Some(refused) = dry_run.refused { p.refused #refused-reason { (refused) } }
        @if dry_run.count > 0 {
            form #confirm-form method="post" action=(dry_run.action) {
                input type="hidden" name="csrf" value=(viewer.csrf_field());
                input type="hidden" name="replay" value=(if dry_run.replay { "true" } else { "false" });
                label { "reason " input #reason name="reason" value=(dry_run.reason) size="40"; }
                button #confirm type="submit" { (dry_run.button) }
            }
        }
        p { a href=(viewer.base.to(&format!("/events/{id}"))) { "Back to the event" } }
    };
    layout(viewer, title, body)
}

/// The row `id` as the policies look at it.
async fn candidate(console: &Console, id: Uuid) -> Result<Option<Candidate>, ConsoleError> {
    let mut conn = console.conn().await?;
    Ok(outbox_store::candidate(&mut conn, id).await?)
}

/// The requeue plan for the one row `id` (empty when there is no such row).
async fn plan_for(console: &Console, id: Uuid, replay: bool) -> Result<Plan, ConsoleError> {
    Ok(plan(
        candidate(console, id).await?.into_iter().collect(),
        replay,
    ))
}

/// The 403 of an action this viewer may not take (a reader's, or one
/// without the session's CSRF token), logged.
fn refused(viewer: &Viewer, form: &Confirm, id: Uuid, action: &str) -> Option<Response> {
    let refused = viewer.refusal_of_action(&form.csrf)?;
    tracing::warn!(event_id = %id, name = %viewer.identity.name, role = %viewer.identity.role, action, "console action refused");
    Some(refused)
}

/// Where the event's page says what an action did (`done=…`).
fn back_to_event(viewer: &Viewer, id: Uuid, done: &str) -> Response {
    let to = format!("{}?done={done}", viewer.base.to(&format!("/events/{id}")));
    Redirect::to(&to).into_response()
}

pub(crate) async fn requeue_dry_run(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Query(Replay { replay }): Query<Replay>,
) -> Result<Response, ConsoleError> {
    let plan = plan_for(&console, id, replay).await?;
    let Some(row) = plan.requeue.first().or(plan.refused.first()) else {
        return Ok(not_found(&viewer.base, id));
    };
    let dry_run = DryRun {
        count: plan.requeue.len(),
        verb: if replay { "replayed" } else { "requeued" },
        changes: vec![format!(
            "{}: {} → PENDING (retries {} → 0, last error cleared)",
            row.event_type, row.status, row.retries
        )],
        warnings: if row.replay && row.refused.is_none() {
            vec![
                "It is DONE: its side effects (mails, webhooks, …) run again, as a new delivery generation.",
            ]
        } else {
            Vec::new()
        },
        refused: row.refused.as_deref(),
        action: viewer.base.to(&format!("/events/{id}/requeue")),
        replay,
        reason: DEFAULT_REQUEUE_REASON,
        button: if replay {
            "Confirm: replay 1 event"
        } else {
            "Confirm: requeue 1 event"
        },
    };
    let title = if replay {
        "Replay an event"
    } else {
        "Requeue an event"
    };
    Ok(dry_run_page(&viewer, id, title, &dry_run).into_response())
}

pub(crate) async fn requeue_confirm(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Form(form): Form<Confirm>,
) -> Result<Response, ConsoleError> {
    if let Some(refused) = refused(&viewer, &form, id, "requeue") {
        return Ok(refused);
    }
    let plan = plan_for(&console, id, form.replay).await?;
    if plan.requeue.is_empty() {
        return Ok(
            match plan.refused.first().and_then(|row| row.refused.as_deref()) {
                Some(why) => refusal(&viewer.base, StatusCode::CONFLICT, why),
                None => not_found(&viewer.base, id),
            },
        );
    }
    let actor = viewer.identity.actor();
    let mut conn = console.conn().await?;
    let done = execute(
        &mut conn,
        &plan,
        form.reason(DEFAULT_REQUEUE_REASON),
        Some(&actor),
        form.replay,
    )
    .await?;
    tracing::info!(event_id = %id, actor = %actor, requeued = done.requeued.len(), replayed = done.replayed, "console requeue");
    let done = match (done.requeued.len(), done.replayed) {
        (0, _) => "unchanged",
        (_, 0) => "requeued",
        _ => "replayed",
    };
    Ok(back_to_event(&viewer, id, done))
}

pub(crate) async fn cancel_dry_run(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
) -> Result<Response, ConsoleError> {
    let Some(row) = candidate(&console, id).await? else {
        return Ok(not_found(&viewer.base, id));
    };
    let refused = outbox_operator::cancel::refusal(row.status);
    let dry_run = DryRun {
        count: usize::from(refused.is_none()),
        verb: "cancelled",
        changes: vec![format!("{}: {} → CANCELLED", row.event_type, row.status)],
        warnings: vec!["A cancelled event is not delivered; a requeue brings it back."],
        refused,
        action: viewer.base.to(&format!("/events/{id}/cancel")),
        replay: false,
        reason: DEFAULT_CANCEL_REASON,
        button: "Confirm: cancel 1 event",
    };
    Ok(dry_run_page(&viewer, id, "Cancel an event", &dry_run).into_response())
}

pub(crate) async fn cancel_confirm(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Form(form): Form<Confirm>,
) -> Result<Response, ConsoleError> {
    if let Some(refused) = refused(&viewer, &form, id, "cancel") {
        return Ok(refused);
    }
    let Some(row) = candidate(&console, id).await? else {
        return Ok(not_found(&viewer.base, id));
    };
    if let Some(why) = outbox_operator::cancel::refusal(row.status) {
        return Ok(refusal(&viewer.base, StatusCode::CONFLICT, why));
    }
    let actor = viewer.identity.actor();
    let mut conn = console.conn().await?;
    let cancelled = outbox_operator::cancel::execute(
        &mut conn,
        &[id],
        form.reason(DEFAULT_CANCEL_REASON),
        Some(&actor),
    )
    .await?;
    tracing::info!(event_id = %id, actor = %actor, cancelled = cancelled.len(), "console cancel");
    let done = if cancelled.is_empty() {
        "unchanged"
    } else {
        "cancelled"
    };
    Ok(back_to_event(&viewer, id, done))
}
