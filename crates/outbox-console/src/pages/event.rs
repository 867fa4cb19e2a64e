//! One event: its columns, its payload pretty-printed with secrets masked,
//! its trace id, its job's state in Redis (when the console was given the
//! queues), its history (requeues, replays, cancels, reschedules, dead
//! jobs put back) and what an operator may do with it.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use outbox_model::{OutboxEvent, OutboxStatus};
use outbox_operator::requeue::refusal;
use outbox_queue::JobStateKind;
use outbox_store::HistoryEntry;
use serde::Deserialize;
use uuid::Uuid;

use super::{Viewer, layout, not_found};
use crate::{Console, ConsoleError};

#[derive(Deserialize)]
pub(crate) struct Shown {
    /// What an action just did (`requeued`, `replayed`, `unchanged`), to
    /// say so at the top.
    #[serde(default)]
    pub(crate) done: Option<String>,
}

/// What the page says after an action.
fn said(done: &str) -> Option<&'static str> {
    match done {
        "requeued" => Some("Requeued: it is PENDING again."),
        "replayed" => Some("Replayed: it is PENDING again, in a new delivery generation."),
        "cancelled" => Some("Cancelled: it will not be delivered unless requeued."),
        "unchanged" => Some("Nothing changed: its status changed meanwhile."),
        _ => None,
    }
}

fn time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), |at| at.to_rfc3339())
}

pub(crate) async fn page(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Query(shown): Query<Shown>,
) -> Result<Response, ConsoleError> {
    let mut conn = console.conn().await?;
    let Some(row) = outbox_store::event(&mut conn, id).await? else {
        return Ok(not_found(&viewer.base, id));
    };
    let history = outbox_store::history(&mut conn, id).await?;
    drop(conn);
    let job = job(&console, &viewer, &row).await;
    let body = html! {
        @if let Some(said) = shown.done.as_deref().and_then(said) { p.ok #done { (said) } }
        (actions(&viewer, &row))
        (details(&row))
        h2 { "Its job in Redis" }
        (job)
        h2 { "Payload" }
        pre #payload { (pretty_payload(&row)) }
        h2 { "History" }
        (history_table(&history))
    };
    Ok(layout(&viewer, &format!("Event {id}"), body).into_response())
}

/// How long the page waits for Redis before it says it could not read the
/// job (the rest of the page does not need Redis).
const JOB_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The state of the event's own job in its current delivery generation
/// (`outbox_queue::job_states`, following its retry copies, and the
/// record of its last run): waiting or running, done, dead (why, after how
/// many attempts) or not in Redis. Jobs derived from it by its handler
/// (one mail per recipient, say) are not shown.
async fn job(console: &Console, viewer: &Viewer, row: &OutboxEvent) -> Markup {
    let Some(queues) = console.inner.queues.as_ref() else {
        return html! { p.muted #job { "Not shown: the console was not given the Redis queues." } };
    };
    let Some(queue) = row.target_queue.as_deref() else {
        return html! { p.muted #job { "No job yet: the event has not been routed to a queue." } };
    };
    let task = outbox_queue::generation_task_id(row.id, u32::try_from(row.generation).unwrap_or(0));
    let mut redis = queues.redis.clone();
    let read = async {
        let state = outbox_queue::job_states(
            &mut redis,
            &queues.namespace,
            queue,
            std::slice::from_ref(&task),
        )
        .await?
        .pop()
        .ok_or_else(|| outbox_queue::QueueError::Unexpected("no job state".to_owned()))?;
        let record = if state.is_present() {
            outbox_queue::job_record(&mut redis, &queues.namespace, queue, &state.latest).await?
        } else {
            outbox_queue::JobRecord::default()
        };
        Ok::<_, outbox_queue::QueueError>((state, record))
    };
    let (state, record) = match tokio::time::timeout(JOB_READ_TIMEOUT, read).await {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => {
            let problem = outbox_queue::redact_urls_in(&e.to_string());
            return html! { p.warning #job { "Could not read the job " (task) " from Redis: " (problem) } };
        }
        Err(_) => {
            return html! { p.warning #job { "Could not read the job " (task) " from Redis within " (JOB_READ_TIMEOUT.as_secs()) " s." } };
        }
    };
    // A first delivery its ordering key has moved past is acknowledged
    // without running the handler: putting it back would do nothing.
    let passed_over =
        state.kind == JobStateKind::Dead && row.generation == 0 && key_past(console, row).await;
    let finished = state
        .finished_at
        .and_then(|at| DateTime::<Utc>::from_timestamp_millis((at * 1000.0) as i64))
        .map(|at| at.to_rfc3339());
    let (word, meaning) = match state.kind {
        JobStateKind::Waiting => ("waiting", "on its queue, due or running"),
        JobStateKind::Done => ("done", "its handler finished it"),
        JobStateKind::Dead if passed_over => (
            "dead",
            "its retries ran out, and its ordering key has moved past it since: put back, it would be acknowledged without running the handler; replay the event to run it",
        ),
        JobStateKind::Dead => (
            "dead",
            "its retries ran out: put it back from the queue's dead jobs",
        ),
        JobStateKind::Missing => (
            "not in Redis",
            "never pushed yet, removed after the done retention, or lost with a Redis that forgot (reconciliation pushes it again)",
        ),
    };
    let dead_jobs =
        listed(console, queue).then(|| viewer.base.to(&format!("/queues/{queue}/dead")));
    html! {
        table.details #job {
            tr { th { "queue" } td #job-queue { (queue) } }
            tr { th { "task id" } td #job-task { (state.latest) } }
            tr { th { "state" } td #job-state { strong { (word) } " (" (meaning) ")" } }
            @if let Some(finished) = finished { tr { th { "finished" } td #job-finished { (finished) } } }
            @if let Some(attempts) = &record.attempts { tr { th { "attempts" } td #job-attempts { (attempts) } } }
            @if let Some(result) = record.result.as_deref().filter(|_| state.kind == JobStateKind::Dead) {
                tr { th { "why it died" } td #job-reason { (outbox_queue::redact_urls_in(result)) } }
            }
            @if let Some(link) = dead_jobs.filter(|_| state.kind == JobStateKind::Dead && !passed_over) {
                tr { th { "" } td { a #job-dead-jobs href=(link) { "The queue's dead jobs, to put it back" } } }
            }
        }
    }
}

/// Whether the event is ordered and its key has moved past its position
/// (false when Postgres cannot tell: the page then offers the put-back,
/// whose dry run checks again).
async fn key_past(console: &Console, row: &OutboxEvent) -> bool {
    let (Some(key), Some(position)) = (row.ordering_key.as_deref(), row.ordering_position) else {
        return false;
    };
    match console.conn().await {
        Ok(mut conn) => outbox_store::is_finished(&mut conn, key, position)
            .await
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Whether the console lists `queue`'s dead jobs (it is one of its queues).
fn listed(console: &Console, queue: &str) -> bool {
    console
        .inner
        .queues
        .as_ref()
        .is_some_and(|queues| queues.names.iter().any(|name| name == queue))
}

/// The payload as indented JSON, with secret-looking fields masked (a
/// payload that is not JSON, which the table does not allow, is not shown).
fn pretty_payload(row: &OutboxEvent) -> String {
    match serde_json::from_str::<serde_json::Value>(row.payload.get()) {
        Ok(payload) => super::shown_json(&payload),
        Err(e) => format!("(not shown: the payload does not parse as JSON: {e})"),
    }
}

fn actions(viewer: &Viewer, row: &OutboxEvent) -> Markup {
    let requeue = viewer.base.to(&format!("/events/{}/requeue", row.id));
    let cancel = viewer.base.to(&format!("/events/{}/cancel", row.id));
    html! {
        div.actions {
            @if refusal(row.status, false).is_none() {
                a.button #requeue href=(requeue) { "Requeue…" }
            } @else if row.status == OutboxStatus::Done {
                a.button #replay href=(format!("{requeue}?replay=true")) { "Replay…" }
            } @else {
                span.muted { (refusal(row.status, false).unwrap_or_default()) }
            }
            " "
            @if outbox_operator::cancel::refusal(row.status).is_none() {
                a.button.secondary #cancel href=(cancel) { "Cancel…" }
            }
        }
    }
}

fn details(row: &OutboxEvent) -> Markup {
    let trace = match (&row.traceparent, outbox_queue::stored_trace_context(row)) {
        (_, Some(trace)) => trace.trace_id().to_owned(),
        (Some(_), None) => "- (its traceparent is not valid; the dispatcher ignores it)".to_owned(),
        (None, None) => "-".to_owned(),
    };
    let generation = u32::try_from(row.generation).unwrap_or(0);
    let rows: [(&str, &str, String); 15] = [
        ("status", "status", row.status.to_string()),
        ("tenant", "tenant", row.tenant_id.clone()),
        ("event type", "event-type", row.event_type.clone()),
        ("retries", "retries", row.retries.to_string()),
        (
            "generation",
            "generation",
            format!(
                "{} (task id {})",
                row.generation,
                outbox_queue::generation_task_id(row.id, generation)
            ),
        ),
        ("created", "created", row.created_at.to_rfc3339()),
        ("scheduled", "scheduled", row.scheduled_at.to_rfc3339()),
        ("locked until", "locked-until", time(row.locked_until)),
        ("processed", "processed", time(row.processed_at)),
        ("failed", "failed", time(row.failed_at)),
        (
            "target queue",
            "target-queue",
            row.target_queue.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "dispatch key",
            "dispatch-key",
            row.dispatch_key.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "ordering key",
            "ordering-key",
            row.ordering_key.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "last error",
            "last-error",
            row.last_error
                .as_deref()
                .map_or_else(|| "-".to_owned(), outbox_queue::redact_urls_in),
        ),
        ("trace id", "trace-id", trace),
    ];
    html! {
        table.details #details {
            @for (label, id, value) in &rows {
                tr { th { (label) } td id=(format!("field-{id}")) { (value) } }
            }
        }
    }
}

/// What an entry changed, as `outbox show` words it, and whether it was a replay.
fn change(entry: &HistoryEntry) -> String {
    match (entry.replay, entry.generation) {
        (true, Some(n)) => format!("{} as a replay (generation {n})", entry.change()),
        (true, None) => format!("{} as a replay", entry.change()),
        (false, _) => entry.change(),
    }
}

fn history_table(history: &[HistoryEntry]) -> Markup {
    html! {
        @if history.is_empty() {
            p.muted #no-history { "Never requeued, replayed, cancelled or rescheduled." }
        } @else {
            table #history {
                thead { tr {
                    th { "when (UTC)" } th { "what" } th { "who" } th { "why" }
                    th.num { "retries before" } th { "last error before" }
                } }
                tbody {
                    @for entry in history {
                        tr {
                            td { (entry.requeued_at.format("%Y-%m-%d %H:%M:%S").to_string()) }
                            td { (change(entry)) }
                            td { (entry.requested_by.as_deref().unwrap_or("-")) }
                            td { (entry.reason) }
                            td.num { (entry.previous_retries) }
                            td { (entry.previous_last_error.as_deref().map_or_else(|| "-".to_owned(), outbox_queue::redact_urls_in)) }
                        }
                    }
                }
            }
        }
    }
}
