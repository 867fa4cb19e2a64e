//! One workflow execution (`outbox workflow show`): its fields, input,
//! output and error, and the timeline of its block runs (outputs, errors,
//! timings); the answer form of a waiting run and the cancel of an
//! unfinished one (operators only, CSRF-checked, the operator named in
//! the log and, for a cancel, in the run's error); and `/live`, which
//! follows an unfinished run until it ends.

use std::collections::HashMap;
use std::convert::Infallible;
use std::hash::{DefaultHasher, Hash, Hasher};

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use futures_util::stream::{self, Stream};
use maud::{Markup, html};
use outbox_store::{EventKey, EventSummary};
use outbox_workflow_model::events::execution_requested_key;
use outbox_workflow_store::{
    self as store, WorkflowBlockExecution, WorkflowExecution, admin::answer_run,
};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::event::Shown;
use super::overview::LIVE_EVERY;
use super::{Base, Viewer, layout, refusal, shown_json, when};
use crate::{Console, ConsoleError};

/// The key of the live part of the page (`data-live-html`).
const LIVE_KEY: &str = "execution";

/// An execution with everything its page shows.
struct Loaded {
    execution: WorkflowExecution,
    workflow_name: Option<String>,
    /// Block id → type, from the version the run started on.
    types: HashMap<String, String>,
    /// The prompt of the block a waiting run waits in (`params.prompt`).
    prompt: Option<String>,
    blocks: Vec<WorkflowBlockExecution>,
    /// The outbox event that started the run, while it is kept: its
    /// trigger event, or the request of a manual or API run.
    started_by: Option<EventSummary>,
}

/// The execution `id` and what its page shows, `None` when there is none.
async fn load(console: &Console, id: Uuid) -> Result<Option<Loaded>, ConsoleError> {
    let mut conn = console.conn().await?;
    let Some(execution) = store::get_execution(&mut conn, id).await? else {
        return Ok(None);
    };
    let names = store::workflow_names(&mut conn, &[execution.workflow_id]).await?;
    let definition =
        store::version_definition(&mut conn, execution.workflow_id, execution.workflow_version)
            .await?;
    let types =
        store::block_types(&mut conn, execution.workflow_id, execution.workflow_version).await?;
    let prompt = execution
        .waiting_block
        .as_deref()
        .and_then(|block| prompt_of(definition.as_ref()?, block));
    let blocks = store::block_executions(&mut conn, id).await?;
    let requested = execution_requested_key(id);
    let key = match execution.trigger_event_id {
        Some(event) => EventKey::Id(event),
        None => EventKey::DispatchKey(&requested),
    };
    let started_by = outbox_store::summary(&mut conn, key).await?;
    Ok(Some(Loaded {
        started_by,
        workflow_name: names.get(&execution.workflow_id).cloned(),
        execution,
        types,
        prompt,
        blocks,
    }))
}

/// The `prompt` param of block `block` of `definition`.
fn prompt_of(definition: &Value, block: &str) -> Option<String> {
    definition
        .get("blocks")?
        .as_array()?
        .iter()
        .find(|b| b.get("id").and_then(Value::as_str) == Some(block))?
        .get("params")?
        .get("prompt")?
        .as_str()
        .map(str::to_owned)
}

/// How long from `from` to `to`, as people read it: `12 ms`, `3.4 s`,
/// `5 min`; `-` while it has not ended.
fn took(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> String {
    let (Some(from), Some(to)) = (from, to) else {
        return "-".to_owned();
    };
    let ms = (to - from).num_milliseconds().max(0);
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..120_000 => format!("{:.1} s", ms as f64 / 1_000.0),
        _ => crate::figures::age(Some(ms as f64 / 1_000.0)),
    }
}

fn not_found(base: &Base, id: Uuid) -> Response {
    refusal(
        base,
        StatusCode::NOT_FOUND,
        &format!("There is no workflow execution {id}."),
    )
}

/// What the page says after an action.
fn said(done: &str) -> Option<&'static str> {
    match done {
        "answered" => Some("Answered: a worker resumes the run."),
        "duplicate" => {
            Some("This wait already had an answer: the first one stands, nothing written.")
        }
        "cancelled" => Some("Cancelled: the run ends here (a running one at its next block)."),
        _ => None,
    }
}

pub(crate) async fn page(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Query(shown): Query<Shown>,
) -> Result<Response, ConsoleError> {
    let Some(loaded) = load(&console, id).await? else {
        return Ok(not_found(&viewer.base, id));
    };
    let (view, version) = live_part(&viewer, &loaded);
    let unfinished = !loaded.execution.status.is_finished();
    let body = html! {
        @if let Some(said) = shown.done.as_deref().and_then(said) { p.ok #done { (said) } }
        @if unfinished {
            section.live data-live-url=(viewer.base.to(&format!("/executions/{id}/live"))) {
                p.muted { "Following: " span data-live-stamp { "connecting…" } }
            }
        }
        div #execution data-live-html=(LIVE_KEY) data-live-version=(version) { (view) }
    };
    let title = format!(
        "Execution of {}",
        loaded
            .workflow_name
            .as_deref()
            .unwrap_or("a deleted workflow")
    );
    Ok(layout(&viewer, &title, body).into_response())
}

/// The part of the page that follows the run, and its version (a digest
/// of its HTML: the script swaps it only when it changed, so that an
/// answer being typed is not lost).
fn live_part(viewer: &Viewer, loaded: &Loaded) -> (Markup, String) {
    let view = html! {
        (actions(viewer, loaded))
        (details(viewer, loaded))
        h2 { "Timeline" }
        (timeline(loaded))
        h2 { "Input" }
        pre #input { (shown_json(&loaded.execution.input)) }
        @if let Some(output) = &loaded.execution.output {
            h2 { "Output" }
            pre #output { (shown_json(output)) }
        }
        h2 { "Variables" }
        pre #vars { (shown_json(&loaded.execution.vars)) }
    };
    let mut hasher = DefaultHasher::new();
    view.0.hash(&mut hasher);
    (view, format!("{:016x}", hasher.finish()))
}

fn actions(viewer: &Viewer, loaded: &Loaded) -> Markup {
    let execution = &loaded.execution;
    let base = &viewer.base;
    html! {
        @if let Some(block) = &execution.waiting_block {
            section.answer {
                h2 { "Waiting for input in block " code { (block) } }
                @if let Some(prompt) = &loaded.prompt { p #prompt { (prompt) } }
                form #answer-form method="post" action=(base.to(&format!("/executions/{}/answer", execution.id))) {
                    input type="hidden" name="csrf" value=(viewer.csrf_field());
                    label { "answer (JSON: it becomes the block's output "
                        code { "answer" } ")" br;
                        textarea #answer name="answer" rows="4" cols="60" { "{}" }
                    }
                    br;
                    button #send-answer type="submit" { "Answer" }
                }
            }
        }
        @if !execution.status.is_finished() {
            form.actions #cancel-form method="post" action=(base.to(&format!("/executions/{}/cancel", execution.id))) {
                input type="hidden" name="csrf" value=(viewer.csrf_field());
                button.secondary #cancel type="submit" { "Cancel this execution" }
                span.muted { " It ends cancelled, with your name in its error; a running one stops at its next block." }
            }
        }
    }
}

fn details(viewer: &Viewer, loaded: &Loaded) -> Markup {
    let (execution, workflow_name) = (&loaded.execution, loaded.workflow_name.as_deref());
    let base = &viewer.base;
    html! {
        table.details #details {
            tr { th { "id" } td #field-id { (execution.id.to_string()) } }
            tr { th { "status" } td #field-status { span class=(format!("status {}", execution.status)) { (execution.status.as_str()) } } }
            tr { th { "tenant" } td #field-tenant { (execution.tenant_id) } }
            tr { th { "workflow" } td #field-workflow {
                a href=(base.to(&format!("/workflows/{}", execution.workflow_id))) { (workflow_name.unwrap_or("-")) }
                ", version " (execution.workflow_version)
            } }
            tr { th { "trigger" } td #field-trigger { (execution.trigger_kind.as_str()) } }
            tr { th { "waiting block" } td #field-waiting-block { (execution.waiting_block.as_deref().unwrap_or("-")) } }
            tr { th { "started by" } td #field-started-by {
                @match (&loaded.started_by, execution.trigger_event_id) {
                    (Some(event), _) => {
                        "outbox event " a #started-by href=(base.to(&format!("/events/{}", event.id))) { (event.id.to_string()) }
                        " (" (event.event_type) ", " (event.status.as_str()) ")"
                    }
                    (None, Some(event)) => { "outbox event " (event.to_string()) " (row no longer kept)" }
                    (None, None) => { "- (no outbox row found)" }
                }
            } }
            tr { th { "created (UTC)" } td #field-created { (when(Some(execution.created_at))) } }
            tr { th { "started (UTC)" } td #field-started { (when(execution.started_at)) } }
            tr { th { "finished (UTC)" } td #field-finished { (when(execution.finished_at)) } }
            tr { th { "ran for" } td #field-took { (took(execution.started_at, execution.finished_at)) } }
            tr { th { "error" } td #field-error {
                (execution.error.as_deref().map_or_else(|| "-".to_owned(), outbox_queue::redact_urls_in))
            } }
        }
    }
}

fn timeline(loaded: &Loaded) -> Markup {
    html! {
        @if loaded.blocks.is_empty() {
            p.muted #no-blocks { "No block has run yet." }
        } @else {
            table #timeline {
                thead { tr {
                    th { "started (UTC)" } th { "block" } th { "type" } th.num { "run" } th { "status" }
                    th { "took" } th.num { "attempt" } th { "output / error" }
                } }
                tbody {
                    @for block in &loaded.blocks {
                        tr.block data-block=(block.block_id) data-status=(block.status.as_str()) {
                            td { (when(Some(block.started_at))) }
                            td { code { (block.block_id) } }
                            td { (loaded.types.get(&block.block_id).map_or("-", String::as_str)) }
                            td.num { (block.sequence) }
                            td { span class=(format!("status {}", block.status)) { (block.status.as_str()) } }
                            td { (took(Some(block.started_at), block.finished_at)) }
                            td.num { (block.attempt) }
                            td {
                                @if let Some(error) = &block.error { p.error { (outbox_queue::redact_urls_in(error)) } }
                                @if let Some((by, at)) = block.answered_by() {
                                    p.answered-by { "answered by " span.who { (by) } @if let Some(at) = at { " at " (when(Some(at))) } }
                                } @else if let Some(output) = &block.output { pre.output { (shown_json(output)) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `/executions/<id>/live`: the live part of the page as a `fragments`
/// event (a JSON object from `data-live-html` key to `{version, html}`)
/// every [`LIVE_EVERY`] when it changed, then `done` once the run has
/// ended, and the stream ends. An `error` event when it cannot be read.
pub(crate) async fn live(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    /// Where the stream is: the version last sent, and whether the run ended.
    struct Following {
        console: Console,
        viewer: Viewer,
        last: Option<String>,
        first: bool,
        ended: bool,
    }
    let start = Following {
        console,
        viewer,
        last: None,
        first: true,
        ended: false,
    };
    let updates = stream::unfold(start, move |mut at| async move {
        if at.ended {
            return None;
        }
        loop {
            if !at.first {
                tokio::select! {
                    () = tokio::time::sleep(LIVE_EVERY) => {}
                    () = at.console.inner.stop.cancelled() => return None,
                }
            }
            at.first = false;
            // A signed-out or expired session gets no more updates.
            if let Some(session) = &at.viewer.session
                && at.console.inner.sessions.identity(session).is_none()
            {
                return None;
            }
            let loaded = match load(&at.console, id).await {
                Ok(Some(loaded)) => loaded,
                Ok(None) => return None,
                Err(e) => {
                    let message = outbox_queue::redact_urls_in(&e.to_string());
                    return Some((Ok(Event::default().event("error").data(message)), at));
                }
            };
            if loaded.execution.status.is_finished() {
                at.ended = true;
            }
            let (view, version) = live_part(&at.viewer, &loaded);
            if at.last.as_ref() != Some(&version) {
                let fragments = serde_json::json!({
                    LIVE_KEY: { "version": version, "html": view.0 }
                });
                at.last = Some(version);
                let event = Event::default()
                    .event("fragments")
                    .json_data(fragments)
                    .unwrap_or_else(|_| Event::default().event("error"));
                return Some((Ok(event), at));
            }
            if at.ended {
                return None;
            }
        }
    });
    // After the last fragment of an ended run, say so: the script stops
    // listening (an event stream that just ends is opened again).
    let updates = futures_util::StreamExt::chain(
        updates,
        stream::once(async { Ok(Event::default().event("done").data("ended")) }),
    );
    Sse::new(updates).keep_alive(KeepAlive::default())
}

/// What the answer form posts.
#[derive(Deserialize)]
pub(crate) struct AnswerForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    answer: String,
}

/// What the cancel form posts.
#[derive(Deserialize)]
pub(crate) struct CancelForm {
    #[serde(default)]
    csrf: String,
}

/// The 403 of an action this viewer may not take, logged.
fn refused(viewer: &Viewer, csrf: &str, id: Uuid, action: &str) -> Option<Response> {
    let refused = viewer.refusal_of_action(csrf)?;
    tracing::warn!(execution_id = %id, name = %viewer.identity.name, role = %viewer.identity.role, action, "console action refused");
    Some(refused)
}

/// The tenant of execution `id` (the store's actions take it), or its 404.
async fn tenant_of(
    conn: &mut diesel_async::AsyncPgConnection,
    viewer: &Viewer,
    id: Uuid,
) -> Result<Result<String, Response>, ConsoleError> {
    Ok(store::get_execution(conn, id)
        .await?
        .map(|execution| execution.tenant_id)
        .ok_or_else(|| not_found(&viewer.base, id)))
}

/// The 409 of an action the store refused (`error` names why: not
/// waiting, already finished), which wrote nothing.
fn conflict(viewer: &Viewer, verb: &str, error: &dyn std::fmt::Display) -> Response {
    refusal(
        &viewer.base,
        StatusCode::CONFLICT,
        &format!("Not {verb}: {error}."),
    )
}

fn back_to_execution(viewer: &Viewer, id: Uuid, done: &str) -> Response {
    let to = format!(
        "{}?done={done}",
        viewer.base.to(&format!("/executions/{id}"))
    );
    Redirect::to(&to).into_response()
}

/// `POST /executions/<id>/answer`: answers the waiting run with the form's
/// JSON, as `outbox workflow answer` does.
pub(crate) async fn answer(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Form(form): Form<AnswerForm>,
) -> Result<Response, ConsoleError> {
    if let Some(refused) = refused(&viewer, &form.csrf, id, "answer") {
        return Ok(refused);
    }
    let input: Value = match serde_json::from_str(form.answer.trim()) {
        Ok(input) => input,
        Err(e) => {
            return Ok(refusal(
                &viewer.base,
                StatusCode::BAD_REQUEST,
                &format!("The answer is not JSON ({e}): nothing was sent."),
            ));
        }
    };
    let mut conn = console.conn().await?;
    let tenant = match tenant_of(&mut conn, &viewer, id).await? {
        Ok(tenant) => tenant,
        Err(missing) => return Ok(missing),
    };
    let actor = viewer.identity.actor();
    match answer_run(&mut conn, &tenant, id, &input, &actor).await {
        Ok(answered) => {
            let duplicate = answered.event.is_duplicate();
            tracing::info!(execution_id = %id, actor = %actor, block = %answered.waiting_block, event_id = %answered.event.id(), duplicate, "console answer");
            Ok(back_to_execution(
                &viewer,
                id,
                if duplicate { "duplicate" } else { "answered" },
            ))
        }
        Err(e) if e.is_refusal() => Ok(conflict(&viewer, "answered", &e)),
        Err(e) => Err(e.into()),
    }
}

/// `POST /executions/<id>/cancel`: cancels the unfinished run, as
/// `outbox workflow cancel --by console:<name> (<role>)` does.
pub(crate) async fn cancel(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<Uuid>,
    Form(form): Form<CancelForm>,
) -> Result<Response, ConsoleError> {
    if let Some(refused) = refused(&viewer, &form.csrf, id, "cancel") {
        return Ok(refused);
    }
    let mut conn = console.conn().await?;
    let tenant = match tenant_of(&mut conn, &viewer, id).await? {
        Ok(tenant) => tenant,
        Err(missing) => return Ok(missing),
    };
    let actor = viewer.identity.actor();
    match store::cancel_execution(&mut conn, &tenant, id, &actor).await {
        Ok(cancelled) => {
            tracing::info!(execution_id = %id, actor = %actor, previous = %cancelled.previous, "console cancel of an execution");
            Ok(back_to_execution(&viewer, id, "cancelled"))
        }
        Err(e) if e.is_refusal() => Ok(conflict(&viewer, "cancelled", &e)),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_prompt_is_the_waiting_blocks_param() {
        let definition = json!({ "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "ask", "type": "waitForInput", "params": { "prompt": "Approve?" } }
        ] });
        assert_eq!(prompt_of(&definition, "ask").as_deref(), Some("Approve?"));
        assert_eq!(prompt_of(&definition, "start"), None);
    }

    #[test]
    fn durations_read_in_ms_seconds_then_larger_units() {
        let at = |ms: i64| DateTime::from_timestamp_millis(ms);
        assert_eq!(took(at(0), at(12)), "12 ms");
        assert_eq!(took(at(0), at(3_400)), "3.4 s");
        assert_eq!(took(at(0), at(600_000)), "10 min");
        assert_eq!(took(at(0), None), "-");
    }
}
