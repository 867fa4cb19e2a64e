//! Requeue every event a filter selects (`outbox requeue` with filters):
//! the dry run (how many would be requeued and refused, the first rows),
//! then the confirmation, which requeues in batches through
//! `outbox_operator::requeue::bulk` with the operator as who asked. More
//! than [`DEFAULT_CONFIRM_ABOVE`] need the box ticked, as the CLI needs
//! `--yes`. Without a status filter it selects FAILED events, as the CLI.
//! With the status filter DONE and `replay=true` (`outbox requeue --status
//! done --replay`) the matching DONE events are replayed: each starts a
//! new delivery generation, so its side effects run again, and the dry run
//! says how many would. The status filter takes one status, so a replay's
//! selection holds DONE events only, and the confirmation's count bounds
//! how many are replayed.

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
use crate::figures::grouped;
use crate::{Console, ConsoleError};

/// Rows the dry run lists (to requeue, and refused).
pub const SHOWN_ROWS: u64 = 20;

/// The reason kept in the history when the operator gives none.
pub const DEFAULT_REASON: &str = "requeued from the console (by filter)";

/// The reason kept in the history of a replay when the operator gives none.
pub const DEFAULT_REPLAY_REASON: &str = "replayed from the console (by filter)";

/// The store's filter of `filters`, FAILED only when no status is given.
fn selection(filters: &Filters) -> Result<EventFilter, String> {
    let mut filter = filters.selection()?;
    if filter.statuses.is_empty() {
        filter.statuses = vec![OutboxStatus::Failed];
    }
    Ok(filter)
}

/// `replay=true`: DONE events are replayed too (`outbox requeue --replay`).
#[derive(Deserialize, Default)]
pub(crate) struct Replay {
    #[serde(default)]
    replay: String,
}

impl Replay {
    fn on(&self) -> bool {
        self.replay == "true"
    }
}

/// How many of the events a requeue changes are DONE ones it replays.
async fn replays(
    conn: &mut diesel_async::AsyncPgConnection,
    filter: &EventFilter,
    to_requeue: u64,
) -> Result<u64, ConsoleError> {
    Ok(match filter.only(&[OutboxStatus::Done]) {
        Some(done) => outbox_store::count_events(conn, &done)
            .await?
            .min(to_requeue),
        None => 0,
    })
}

fn bad_filter(viewer: &Viewer, problem: &str) -> Response {
    refusal(&viewer.base, StatusCode::BAD_REQUEST, problem)
}

pub(crate) async fn dry_run(
    State(console): State<Console>,
    viewer: Viewer,
    Query(filters): Query<Filters>,
    Query(replay): Query<Replay>,
) -> Result<Response, ConsoleError> {
    let filter = match selection(&filters) {
        Ok(filter) => filter,
        Err(problem) => return Ok(bad_filter(&viewer, &problem)),
    };
    let replay = replay.on();
    let mut conn = console.conn().await?;
    let selection = bulk::select(&mut conn, &filter, replay, None).await?;
    let preview = bulk::preview(&mut conn, &filter, replay, &selection, SHOWN_ROWS).await?;
    let replayed = if replay {
        replays(&mut conn, &filter, selection.to_requeue).await?
    } else {
        0
    };
    drop(conn);
    let here = format!("{}?{}", viewer.base.to("/events/requeue"), filters.query());
    let toggle = if replay {
        here.clone()
    } else {
        format!(
            "{here}{}replay=true",
            if filters.query().is_empty() { "" } else { "&" }
        )
    };
    // Only a DONE status filter selects events a replay would run again
    // (without one the selection is FAILED, as the CLI's).
    let selects_done = filter.statuses.contains(&OutboxStatus::Done);
    let guarded = needs_confirmation(selection.to_requeue, DEFAULT_CONFIRM_ABOVE);
    let event = |id| viewer.base.to(&format!("/events/{id}"));
    let body = html! {
        p #dry-run {
            "Dry run: " span #dry-run-count { (grouped(selection.to_requeue)) } " event(s) would be requeued, "
            (grouped(selection.refused())) " of the " (grouped(selection.matching)) " matching refused; nothing changed yet."
        }
        @if replay {
            p.warning #replay-warning {
                span #replay-count { (replayed) } " DONE event(s) would be replayed: each starts a new delivery generation, "
                "so its side effects (mails, webhooks, …) run again. "
                a #without-replay href=(toggle) { "Leave DONE events alone" }
            }
        } @else if selects_done {
            p { a #with-replay href=(toggle) { "Replay the matching DONE events…" } }
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
                @if replay { input type="hidden" name="replay" value="true"; }
                label { "reason " input #reason name="reason" value=(if replay { DEFAULT_REPLAY_REASON } else { DEFAULT_REASON }) size="40"; }
                @if guarded {
                    label.warning {
                        input #yes type="checkbox" name="yes" value="true";
                        " Yes, requeue all " (grouped(selection.to_requeue)) " (more than " (grouped(DEFAULT_CONFIRM_ABOVE)) ")"
                    }
                }
                button #confirm type="submit" {
                    "Confirm: requeue " (grouped(selection.to_requeue)) " event(s)"
                    @if replayed > 0 { ", replaying " (replayed) }
                }
            }
        }
        p { a href=(format!("{}?{}", viewer.base.to("/events"), filters.query())) { "Back to the events" } }
    };
    let title = if replay {
        "Requeue and replay the matching events"
    } else {
        "Requeue the matching events"
    };
    Ok(layout(&viewer, title, body).into_response())
}

/// What the confirmation of an action by filter posts (this requeue, and
/// the cancel of `bulk_cancel`): the filters, and the form's own fields.
#[derive(Deserialize)]
pub(crate) struct Confirm {
    #[serde(flatten)]
    pub(crate) filters: Filters,
    #[serde(default)]
    pub(crate) csrf: String,
    /// `true` when the confirmation box is ticked.
    #[serde(default)]
    yes: String,
    #[serde(default)]
    reason: String,
    /// How many events the dry run counted when the operator confirmed:
    /// more than that now and nothing changes.
    #[serde(default)]
    expected: Option<u64>,
    /// `true`: DONE events are replayed too (a requeue only).
    #[serde(default)]
    replay: String,
}

impl Confirm {
    /// The refusal (409, nothing changed) of this confirmation when
    /// `to_change` events would now be `done` (requeued, cancelled): none
    /// would, the form does not say how many it was for, more than that
    /// would, or more than [`DEFAULT_CONFIRM_ABOVE`] without the box ticked.
    pub(crate) fn refusal(&self, viewer: &Viewer, to_change: u64, done: &str) -> Option<Response> {
        let message = match self.expected {
            _ if to_change == 0 => {
                format!("No matching event may be {done} (any more): nothing changed.")
            }
            None => "The confirmation did not say how many events it was for: confirm from the dry run (nothing changed).".to_owned(),
            Some(expected) if to_change > expected => format!(
                "{to_change} events now match, {expected} were confirmed: run the dry run again (nothing changed)."
            ),
            Some(_) if needs_confirmation(to_change, DEFAULT_CONFIRM_ABOVE) && self.yes != "true" => {
                format!(
                    "{to_change} events would be {done}, more than {DEFAULT_CONFIRM_ABOVE}: tick the confirmation box (nothing changed)."
                )
            }
            Some(_) => return None,
        };
        Some(refusal(&viewer.base, StatusCode::CONFLICT, &message))
    }

    /// The reason the operator typed, or `default` when none.
    pub(crate) fn reason_or<'a>(&'a self, default: &'a str) -> &'a str {
        match self.reason.trim() {
            "" => default,
            reason => reason,
        }
    }
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
    let replay = form.replay == "true";
    let mut conn = console.conn().await?;
    let selection = bulk::select(&mut conn, &filter, replay, None).await?;
    if let Some(refused) = form.refusal(&viewer, selection.to_requeue, "requeued") {
        return Ok(refused);
    }
    let actor = viewer.identity.actor();
    let reason = form.reason_or(if replay {
        DEFAULT_REPLAY_REASON
    } else {
        DEFAULT_REASON
    });
    let request = Request {
        reason,
        requested_by: Some(&actor),
        replay,
        total: selection.to_requeue,
        batch_size: DEFAULT_BATCH_SIZE,
    };
    let done = bulk::run(&mut conn, &filter, &request).await?;
    tracing::info!(actor = %actor, requeued = done.ids.len(), replayed = done.replayed, batches = done.batches, "console requeue by filter");
    let query = form.filters.query();
    let mut to = format!(
        "{}?{query}{}requeued={}",
        viewer.base.to("/events"),
        if query.is_empty() { "" } else { "&" },
        done.ids.len()
    );
    if replay {
        to.push_str(&format!("&replayed={}", done.replayed));
    }
    Ok(Redirect::to(&to).into_response())
}
