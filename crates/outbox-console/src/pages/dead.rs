//! A queue's dead jobs and why each died, and putting them back on their
//! queue (`outbox retry-dead`): the page is the dry run (how many would go
//! back, the first ones listed), the confirmation POST puts them back
//! through `outbox_operator::dead`, which records each one in its event's
//! history with the operator as who asked and the form's reason; more
//! than [`DEFAULT_CONFIRM_ABOVE`] need the box ticked, as the CLI needs
//! `--yes`.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use outbox_operator::confirm::{DEFAULT_CONFIRM_ABOVE, needs_confirmation};
use outbox_operator::dead::{self, PutBackError};
use serde::Deserialize;

use super::{Viewer, layout, refusal};
use crate::figures::grouped;
use crate::{Console, ConsoleError, Queues};

/// Dead jobs listed on the page (all are counted and put back).
pub const SHOWN_JOBS: usize = 50;

/// The reason kept in the events' history when the operator gives none.
pub const DEFAULT_REASON: &str = "dead job put back from the console";

#[derive(Deserialize)]
pub(crate) struct Shown {
    /// How many jobs the last retry put back.
    #[serde(default)]
    put_back: Option<usize>,
    /// How many of them were recorded in their events' history.
    #[serde(default)]
    recorded: Option<usize>,
    /// How many it left dead: ordered events their key has moved past.
    #[serde(default)]
    left: Option<usize>,
}

#[derive(Deserialize)]
pub(crate) struct Retry {
    #[serde(default)]
    csrf: String,
    /// The box "yes, put them all back" (needed above the threshold).
    #[serde(default)]
    yes: bool,
    /// How many dead jobs the page showed when the operator confirmed:
    /// more than that now and nothing is put back.
    #[serde(default)]
    expected: Option<u64>,
    /// Why, kept in the history of each job's event.
    #[serde(default)]
    reason: String,
}

/// The dead jobs of `ids` a put-back leaves dead (see
/// `outbox_operator::dead::past_their_keys`).
async fn staying(
    console: &Console,
    queues: &Queues,
    queue: &str,
    ids: &[String],
) -> Result<Vec<dead::PassedOver>, ConsoleError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut redis = queues.redis.clone();
    dead::past_their_keys(
        &mut redis,
        &queues.namespace,
        queue,
        &mut *console.conn().await?,
        ids,
    )
    .await
    .map_err(|e| match e {
        dead::CheckError::Postgres(e) => ConsoleError::Store(e),
        e => ConsoleError::Redis(e.to_string()),
    })
}

/// The console's queues, if `queue` is one of them.
fn known<'a>(console: &'a Console, queue: &str) -> Option<&'a Queues> {
    console
        .inner
        .queues
        .as_ref()
        .filter(|queues| queues.names.iter().any(|name| name == queue))
}

fn unknown(viewer: &Viewer, queue: &str) -> Response {
    refusal(
        &viewer.base,
        StatusCode::NOT_FOUND,
        &format!("{queue} is not a queue this console reads."),
    )
}

pub(crate) async fn page(
    State(console): State<Console>,
    viewer: Viewer,
    Path(queue): Path<String>,
    Query(shown): Query<Shown>,
) -> Result<Response, ConsoleError> {
    let Some(queues) = known(&console, &queue) else {
        return Ok(unknown(&viewer, &queue));
    };
    let mut redis = queues.redis.clone();
    let read = async {
        let ids = outbox_queue::dead_task_ids(&mut redis, &queues.namespace, &queue).await?;
        let jobs =
            outbox_queue::dead_jobs(&mut redis, &queues.namespace, &queue, SHOWN_JOBS).await?;
        Ok::<_, outbox_queue::QueueError>((ids, jobs))
    };
    let (ids, jobs) = read.await.map_err(|e| ConsoleError::Redis(e.to_string()))?;
    let passed_over = staying(&console, queues, &queue, &ids).await?;
    let going_back = ids.len() - passed_over.len();
    let guarded = needs_confirmation(going_back as u64, DEFAULT_CONFIRM_ABOVE);
    let action = viewer.base.to(&format!("/queues/{queue}/dead"));
    let body = html! {
        @if let Some(n) = shown.put_back {
            p.ok #done {
                "Put " (grouped(n)) " dead job(s) back on " (queue) "; "
                (grouped(shown.recorded.unwrap_or(0))) " recorded in their events' history."
                @if let Some(left) = shown.left.filter(|left| *left > 0) {
                    " " (grouped(left)) " left dead: their ordering key has moved past their event."
                }
            }
        }
        p #dry-run {
            "Dry run: " span #dry-run-count { (grouped(going_back)) } " dead job(s) would go back on " (queue)
            ", due now; nothing changed yet."
        }
        @if !passed_over.is_empty() {
            div.warning #passed-over {
                p {
                    (grouped(passed_over.len())) " would stay dead: first deliveries of ordered events whose key has moved past them "
                    "(the event was skipped, or delivered by a replay since: its history tells which). Their worker would acknowledge them "
                    "without running the handler; to run the handler once more, replay the event from its page."
                }
                ul {
                    @for passed in passed_over.iter().take(SHOWN_JOBS) {
                        li {
                            (passed.task_id) ": key " (passed.ordering_key) ", position " (passed.position)
                            @if let Some(event) = passed.event_id {
                                ", event " a href=(viewer.base.to(&format!("/events/{event}"))) { (event) }
                            }
                        }
                    }
                }
            }
        }
        @if !jobs.is_empty() {
            table #dead-jobs {
                thead { tr { th { "task id" } th.num { "attempts" } th { "reason" } } }
                tbody {
                    @for job in &jobs {
                        tr {
                            td { (job.task_id) }
                            td.num { (job.attempts.as_deref().unwrap_or("-")) }
                            td { (job.reason.as_deref().map_or_else(|| "-".to_owned(), outbox_queue::redact_urls_in)) }
                        }
                    }
                }
            }
            @if ids.len() > jobs.len() { p.muted { (grouped(jobs.len())) " of the " (grouped(ids.len())) " shown, taken at random." } }
        }
        @if going_back > 0 {
            form #confirm-form method="post" action=(action) {
                input type="hidden" name="csrf" value=(viewer.csrf_field());
                input type="hidden" name="expected" value=(going_back);
                label { "reason " input #reason name="reason" value=(DEFAULT_REASON) size="40"; }
                @if guarded {
                    label.warning {
                        input #yes type="checkbox" name="yes" value="true";
                        " Yes, put all " (grouped(going_back)) " back (more than " (grouped(DEFAULT_CONFIRM_ABOVE)) ")"
                    }
                }
                button #confirm type="submit" { "Confirm: put " (grouped(going_back)) " dead job(s) back" }
            }
        }
    };
    Ok(layout(&viewer, &format!("Dead jobs of {queue}"), body).into_response())
}

pub(crate) async fn retry(
    State(console): State<Console>,
    viewer: Viewer,
    Path(queue): Path<String>,
    Form(form): Form<Retry>,
) -> Result<Response, ConsoleError> {
    if let Some(refused) = viewer.refusal_of_action(&form.csrf) {
        tracing::warn!(queue = %queue, name = %viewer.identity.name, role = %viewer.identity.role, "console retry of dead jobs refused");
        return Ok(refused);
    }
    let Some(queues) = known(&console, &queue) else {
        return Ok(unknown(&viewer, &queue));
    };
    let mut redis = queues.redis.clone();
    let ids = outbox_queue::dead_task_ids(&mut redis, &queues.namespace, &queue)
        .await
        .map_err(|e| ConsoleError::Redis(e.to_string()))?;
    let going_back = (ids.len() - staying(&console, queues, &queue, &ids).await?.len()) as u64;
    if let Some(refused) = more_than_confirmed(&viewer, going_back, form.expected, &queue) {
        return Ok(refused);
    }
    if needs_confirmation(going_back, DEFAULT_CONFIRM_ABOVE) && !form.yes {
        return Ok(refusal(
            &viewer.base,
            StatusCode::CONFLICT,
            &format!(
                "{} dead jobs of {queue} would go back, more than {DEFAULT_CONFIRM_ABOVE}: tick the confirmation box (nothing changed).",
                grouped(going_back)
            ),
        ));
    }
    let actor = viewer.identity.actor();
    let reason = match form.reason.trim() {
        "" => DEFAULT_REASON,
        reason => reason,
    };
    let mut conn = console.conn().await?;
    let done = dead::put_back(
        &mut redis,
        &queues.namespace,
        &queue,
        &ids,
        &mut conn,
        reason,
        Some(&actor),
    )
    .await
    .map_err(|e| match e {
        PutBackError::NotRecorded { .. } => ConsoleError::PutBack(e),
        PutBackError::Check {
            source: dead::CheckError::Postgres(source),
            ..
        } => ConsoleError::Store(source),
        _ => ConsoleError::Redis(e.to_string()),
    })?;
    if !done.passed_over.is_empty() {
        tracing::warn!(
            queue = %queue,
            actor = %actor,
            passed_over = ?done.passed_over,
            "dead jobs left dead: their ordering key has moved past their event; replay the events to run them"
        );
    }
    tracing::info!(
        queue = %queue,
        actor = %actor,
        put_back = done.task_ids.len(),
        recorded = done.recorded,
        without_event = ?done.without_event,
        "console retry of dead jobs"
    );
    let mut to = format!(
        "{}?put_back={}&recorded={}",
        viewer.base.to(&format!("/queues/{queue}/dead")),
        done.task_ids.len(),
        done.recorded
    );
    if !done.passed_over.is_empty() {
        to.push_str(&format!("&left={}", done.passed_over.len()));
    }
    Ok(Redirect::to(&to).into_response())
}

/// A refusal when the queue now holds more dead jobs than the operator saw
/// and confirmed (`expected`, `None` when the form did not come from the
/// page): the confirmation never acts on more than it showed.
fn more_than_confirmed(
    viewer: &Viewer,
    going_back: u64,
    expected: Option<u64>,
    queue: &str,
) -> Option<Response> {
    let message = match expected {
        None => "The confirmation did not say how many jobs it was for: confirm from the dead jobs page (nothing changed).".to_owned(),
        Some(expected) if going_back > expected => format!(
            "{} dead jobs of {queue} would now go back, {} were confirmed: look again (nothing changed).",
            grouped(going_back),
            grouped(expected)
        ),
        Some(_) => return None,
    };
    Some(refusal(&viewer.base, StatusCode::CONFLICT, &message))
}
