//! The native runner on real Postgres: what a run leaves in the database
//! (outbox rows, entity rows, block rows, the execution), reruns, crashes,
//! failures and waits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runs;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{entity_row, outbox_event};
use outbox_publish::OutboxTx;
use outbox_test_support::TestDatabase;
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_model::events::{
    CONTINUE_REQUESTED, ContinueKind, TRIGGER_EVENT, TriggerEventPayload,
};
use outbox_workflow_runner::{
    AddressPolicy, EMAIL_EVENT, HOOK_EXECUTED, HOOK_FAILED, RunOutcome, Runner,
};
use outbox_workflow_store::producers::{self, EventContext, ProducerError};
use outbox_workflow_store::{self as store, ExecutionStatus, WorkflowStatus};
use runs::{block_rows, execution, outbox, queued};
use serde_json::{Value, json};
use uuid::Uuid;

/// Saves `definition` live as `name`; returns the workflow's id.
async fn live(conn: &mut AsyncPgConnection, name: &str, definition: Value) -> Uuid {
    let definition = WorkflowDefinition::from_value(definition).unwrap();
    store::save_workflow(conn, "t1", name, WorkflowStatus::Live, &definition)
        .await
        .unwrap()
        .workflow
        .id
}

async fn order(conn: &mut AsyncPgConnection, total: i64) -> Uuid {
    conn.transaction::<_, ProducerError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        let data = json!({ "total": total });
        producers::create_row(&mut tx, "t1", "order", &data, &EventContext::None).await
    })
    .await
    .unwrap()
    .row
    .id
}

/// manualTrigger → if total > 100 → email → rowUpdate → log.
fn order_workflow() -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "big", "type": "if", "params": { "condition":
                { "left": { "var": "input.total" }, "op": "gt", "right": 100 } } },
            { "id": "thank", "type": "email", "params": {
                "to": ["{{ input.email }}"], "subject": "Order {{ input.id }}",
                "text": "Total {{ input.total }}" } },
            { "id": "mark", "type": "rowUpdate", "params": {
                "entity": "order", "id": { "var": "input.id" }, "patch": { "vip": true } } },
            { "id": "note", "type": "log", "params": { "message": "done {{ input.id }}" } }
        ],
        "edges": [
            { "from": "start", "to": "big" },
            { "from": "big", "to": "thank", "label": "true" },
            { "from": "thank", "to": "mark" },
            { "from": "mark", "to": "note" }
        ]
    })
}

fn one_success_each(blocks: &[&str]) -> Vec<(String, i32, String)> {
    blocks
        .iter()
        .map(|b| ((*b).to_owned(), 1, "success".to_owned()))
        .collect()
}

async fn assert_order_run_done(conn: &mut AsyncPgConnection, id: Uuid, order_id: Uuid) {
    let run = execution(conn, id).await;
    assert_eq!(run.status, ExecutionStatus::Success);
    assert!(run.started_at.is_some() && run.finished_at.is_some());
    assert_eq!(
        block_rows(conn, id).await,
        one_success_each(&["start", "big", "thank", "mark", "note"])
    );
    let data: Value = entity_row::table
        .find(order_id)
        .select(entity_row::data)
        .get_result(conn)
        .await
        .unwrap();
    assert_eq!(data, json!({ "total": 150, "vip": true }));
    let events = outbox(conn).await;
    let types: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    // The row update's trigger event, the mail, the hook: once each.
    assert_eq!(types.iter().filter(|t| **t == EMAIL_EVENT).count(), 1);
    assert_eq!(types.iter().filter(|t| **t == HOOK_EXECUTED).count(), 1);
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == "workflow.trigger.event")
            .count(),
        1
    );
    assert_eq!(events.len(), 3);
    let mail = events.iter().find(|e| e.0 == EMAIL_EVENT).unwrap();
    assert_eq!(
        mail.1,
        json!({ "to": ["a@example.test"], "subject": format!("Order {order_id}"), "text": "Total 150" })
    );
    assert_eq!(mail.2, Some(format!("wf-email:{id}:thank")));
    let hook = events.iter().find(|e| e.0 == HOOK_EXECUTED).unwrap();
    assert_eq!(
        hook.1,
        json!({ "executionId": id, "workflowId": run.workflow_id, "status": "success" })
    );
    assert_eq!(hook.2, Some(format!("wf-hook:{id}")));
    let trigger = events
        .iter()
        .find(|e| e.0 == "workflow.trigger.event")
        .unwrap();
    assert_eq!(
        trigger.1["origin"],
        json!({ "executionId": id, "blockId": "mark" })
    );
}

#[tokio::test]
async fn a_run_sends_the_mail_once_updates_the_row_and_a_rerun_changes_nothing() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let order_id = order(&mut conn, 150).await;
    let input = json!({ "id": order_id, "total": 150, "email": "a@example.test" });
    let id = queued(&mut conn, order_workflow(), input).await;
    let runner = Runner::new().unwrap();

    let outcome = runner.run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    assert_order_run_done(&mut conn, id, order_id).await;
    let run = execution(&mut conn, id).await;
    assert_eq!(run.output.unwrap()["message"], format!("done {order_id}"));

    // A redelivered job runs it again: nothing changes.
    let again = runner.run(&mut conn, id).await.unwrap();
    assert_eq!(again, RunOutcome::Unchanged(ExecutionStatus::Success));
    assert_order_run_done(&mut conn, id, order_id).await;
}

#[tokio::test]
async fn a_run_cut_short_resumes_at_the_first_unfinished_block() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let order_id = order(&mut conn, 150).await;
    let input = json!({ "id": order_id, "total": 150, "email": "a@example.test" });
    let id = queued(&mut conn, order_workflow(), input).await;

    // The worker "dies" after the trigger, the if and the email.
    let crashing = Runner::new().unwrap().stop_after(3);
    assert_eq!(
        crashing.run(&mut conn, id).await.unwrap(),
        RunOutcome::Paused
    );
    assert_eq!(
        execution(&mut conn, id).await.status,
        ExecutionStatus::Running
    );
    assert_eq!(
        block_rows(&mut conn, id).await,
        one_success_each(&["start", "big", "thank"])
    );
    let types: Vec<String> = outbox(&mut conn).await.into_iter().map(|e| e.0).collect();
    assert_eq!(types, vec![EMAIL_EVENT.to_owned()]);

    // The redelivery resumes at `mark`; the mail is not sent again.
    let outcome = Runner::new().unwrap().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    assert_order_run_done(&mut conn, id, order_id).await;
}

#[tokio::test]
async fn a_small_order_takes_the_false_output_and_ends_there() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let order_id = order(&mut conn, 50).await;
    let input = json!({ "id": order_id, "total": 50, "email": "a@example.test" });
    let id = queued(&mut conn, order_workflow(), input).await;
    let outcome = Runner::new().unwrap().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    assert_eq!(
        block_rows(&mut conn, id).await,
        one_success_each(&["start", "big"])
    );
    let run = execution(&mut conn, id).await;
    assert_eq!(run.output, Some(json!({ "result": false })));
    let types: Vec<String> = outbox(&mut conn).await.into_iter().map(|e| e.0).collect();
    assert_eq!(types, vec![HOOK_EXECUTED.to_owned()]);
}

#[tokio::test]
async fn a_bridge_only_block_rejects_the_run_before_its_first_block() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let definition = json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "note", "type": "log", "params": { "message": "before" } },
            { "id": "js", "type": "code", "params": { "language": "javascript", "source": "return 1" } }
        ],
        "edges": [{ "from": "start", "to": "note" }, { "from": "note", "to": "js" }]
    });
    let id = queued(&mut conn, definition, json!({})).await;
    let outcome = Runner::new().unwrap().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Rejected));
    let run = execution(&mut conn, id).await;
    assert_eq!(run.status, ExecutionStatus::Rejected);
    let reason = run.error.unwrap();
    assert!(reason.contains("js"), "{reason}");
    assert!(block_rows(&mut conn, id).await.is_empty());
    let events = outbox(&mut conn).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, HOOK_FAILED);
    assert_eq!(
        events[0].1,
        json!({ "executionId": id, "workflowId": run.workflow_id, "status": "rejected", "error": reason })
    );
}

#[tokio::test]
async fn a_failing_block_ends_the_run_in_error_with_the_hook() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    // The id is not a UUID: the rowUpdate block fails.
    let input = json!({ "id": "not-a-row", "total": 150, "email": "a@example.test" });
    let id = queued(&mut conn, order_workflow(), input).await;
    let outcome = Runner::new().unwrap().run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Error));
    let run = execution(&mut conn, id).await;
    let reason = run.error.unwrap();
    assert!(reason.starts_with("block mark:"), "{reason}");
    let mut expected = one_success_each(&["start", "big", "thank"]);
    expected.push(("mark".into(), 1, "error".into()));
    assert_eq!(block_rows(&mut conn, id).await, expected);
    let types: Vec<String> = outbox(&mut conn).await.into_iter().map(|e| e.0).collect();
    assert_eq!(types, vec![EMAIL_EVENT.to_owned(), HOOK_FAILED.to_owned()]);
    // Rerunning a failed run does nothing.
    let again = Runner::new().unwrap().run(&mut conn, id).await.unwrap();
    assert_eq!(again, RunOutcome::Unchanged(ExecutionStatus::Error));
}

fn wait_workflow() -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "ask", "type": "waitForInput", "params": { "prompt": "ok?", "timeoutMs": 60000 } },
            { "id": "keep", "type": "variable", "params": { "name": "answer",
                "value": { "var": "blocks.ask.output.answer.approved" } } },
            { "id": "late", "type": "log", "params": { "message": "timed out" } }
        ],
        "edges": [
            { "from": "start", "to": "ask" },
            { "from": "ask", "to": "keep", "label": "input" },
            { "from": "ask", "to": "late", "label": "timeout" }
        ]
    })
}

#[tokio::test]
async fn wait_for_input_stops_the_run_and_the_first_continuation_resumes_it() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, wait_workflow(), json!({})).await;
    let runner = Runner::new().unwrap();

    let outcome = runner.run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Waiting("ask".into()));
    let run = execution(&mut conn, id).await;
    assert_eq!(run.status, ExecutionStatus::Waiting);
    assert_eq!(run.waiting_block.as_deref(), Some("ask"));
    let events = outbox(&mut conn).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, CONTINUE_REQUESTED);
    assert_eq!(events[0].1["kind"], "timeout");
    // Running a waiting execution again does nothing.
    assert_eq!(
        runner.run(&mut conn, id).await.unwrap(),
        RunOutcome::Unchanged(ExecutionStatus::Waiting)
    );
    // A continuation for another block changes nothing.
    let other = runner
        .resume(&mut conn, id, "keep", ContinueKind::Input, &json!({}))
        .await
        .unwrap();
    assert_eq!(other, RunOutcome::Unchanged(ExecutionStatus::Waiting));

    let answer = json!({ "approved": true });
    let outcome = runner
        .resume(&mut conn, id, "ask", ContinueKind::Input, &answer)
        .await
        .unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let run = execution(&mut conn, id).await;
    assert_eq!(run.vars, json!({ "answer": true }));
    assert_eq!(run.waiting_block, None);
    assert_eq!(
        block_rows(&mut conn, id).await,
        vec![
            ("start".into(), 1, "success".into()),
            ("ask".into(), 1, "waiting".into()),
            ("ask".into(), 2, "success".into()),
            ("keep".into(), 1, "success".into()),
        ]
    );
    // The timeout arrives later: the first continuation won.
    let late = runner
        .resume(&mut conn, id, "ask", ContinueKind::Timeout, &Value::Null)
        .await
        .unwrap();
    assert_eq!(late, RunOutcome::Unchanged(ExecutionStatus::Success));
}

#[tokio::test]
async fn a_timeout_continuation_takes_the_timeout_output() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, wait_workflow(), json!({})).await;
    let runner = Runner::new().unwrap();
    runner.run(&mut conn, id).await.unwrap();
    let outcome = runner
        .resume(&mut conn, id, "ask", ContinueKind::Timeout, &Value::Null)
        .await
        .unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let blocks: Vec<String> = block_rows(&mut conn, id)
        .await
        .into_iter()
        .map(|b| b.0)
        .collect();
    assert_eq!(blocks, vec!["start", "ask", "ask", "late"]);
}

fn http_workflow(url: &str) -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "call", "type": "httpRequest", "params": {
                "method": "POST", "url": url, "headers": { "X-Source": "workflow" },
                "body": { "var": "input" }, "timeoutMs": 5000 } },
            { "id": "check", "type": "if", "params": { "condition":
                { "left": { "var": "blocks.call.output.status" }, "op": "eq", "right": 503 } } }
        ],
        "edges": [{ "from": "start", "to": "call" }, { "from": "call", "to": "check" }]
    })
}

#[tokio::test]
async fn http_request_records_the_status_and_a_later_block_reads_it() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = outbox_test_support::HttpSink::start().await;
    sink.respond("/hook", vec![503]);
    let id = queued(
        &mut conn,
        http_workflow(&sink.url_for("/hook")),
        json!({ "n": 1 }),
    )
    .await;
    let runner = Runner::with_address_policy(AddressPolicy::AllowInternal).unwrap();
    let outcome = runner.run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let requests = sink.requests_to("/hook");
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].json(), json!({ "n": 1 }));
    assert_eq!(requests[0].header("x-source"), Some("workflow"));
    // The non-2xx status is the block's output, not a failure.
    assert_eq!(
        execution(&mut conn, id).await.output,
        Some(json!({ "result": true }))
    );
}

#[tokio::test]
async fn http_request_sends_the_runs_trace_unless_the_block_sets_its_own() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = outbox_test_support::HttpSink::start().await;
    let runner = Runner::with_address_policy(AddressPolicy::AllowInternal).unwrap();
    let run = outbox_trace::TraceContext::parse(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        Some("vendor=x"),
    )
    .unwrap();

    let traced = queued(
        &mut conn,
        http_workflow(&sink.url_for("/traced")),
        json!({}),
    )
    .await;
    outbox_trace::within(runner.run(&mut conn, traced), Some(&run))
        .await
        .unwrap();
    let untraced = queued(
        &mut conn,
        http_workflow(&sink.url_for("/untraced")),
        json!({}),
    )
    .await;
    runner.run(&mut conn, untraced).await.unwrap();
    let mut own = http_workflow(&sink.url_for("/own"));
    own["blocks"][1]["params"]["headers"]["Traceparent"] =
        json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    let own = queued(&mut conn, own, json!({})).await;
    outbox_trace::within(runner.run(&mut conn, own), Some(&run))
        .await
        .unwrap();

    let traced = &sink.requests_to("/traced")[0];
    assert_eq!(traced.header("traceparent"), Some(run.traceparent()));
    assert_eq!(traced.header("tracestate"), Some("vendor=x"));
    assert_eq!(sink.requests_to("/untraced")[0].header("traceparent"), None);
    let own = &sink.requests_to("/own")[0];
    let sent: Vec<&str> = own
        .headers
        .iter()
        .filter(|(name, _)| name == "traceparent")
        .map(|(_, value)| value.as_str())
        .collect();
    assert_eq!(
        sent,
        ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
        "the block's own header, once"
    );
    assert_eq!(own.header("tracestate"), Some("vendor=x"));
}

#[tokio::test]
async fn http_request_to_an_internal_address_fails_the_run_without_calling() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = outbox_test_support::HttpSink::start().await;
    let port = sink.port();
    let runner = Runner::new().unwrap();
    for (url, reason) in [
        // A name: refused on the resolution the connection would use, so
        // a second lookup cannot answer differently (DNS rebinding).
        (
            format!("http://localhost:{port}/hook"),
            "localhost resolves only to internal addresses; refused \
             (list the name in OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS to allow it)",
        ),
        // IP literals, which no resolver sees: refused before the request.
        (
            sink.url_for("/hook"),
            "127.0.0.1 is an internal address; refused \
             (list it or its range in OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS to allow it)",
        ),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/hook"),
            "::ffff:127.0.0.1 is an internal address; refused \
             (list it or its range in OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS to allow it)",
        ),
    ] {
        let id = queued(&mut conn, http_workflow(&url), json!({})).await;
        let outcome = runner.run(&mut conn, id).await.unwrap();
        assert_eq!(
            outcome,
            RunOutcome::Finished(ExecutionStatus::Error),
            "{url}"
        );
        let run = execution(&mut conn, id).await;
        assert_eq!(run.error.unwrap(), format!("block call: {reason}"));
        assert_eq!(
            block_rows(&mut conn, id).await.last().unwrap(),
            &("call".to_owned(), 1, "error".to_owned())
        );
    }
    assert!(sink.requests().is_empty());

    // WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true: the same name reaches the sink.
    let open = Runner::with_address_policy(AddressPolicy::AllowInternal).unwrap();
    let url = format!("http://localhost:{port}/hook");
    let id = queued(&mut conn, http_workflow(&url), json!({ "n": 2 })).await;
    let outcome = open.run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let requests = sink.requests_to("/hook");
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].json(), json!({ "n": 2 }));
}

#[tokio::test]
async fn a_run_started_by_a_workflows_row_event_makes_no_callout_even_after_a_wait() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = outbox_test_support::HttpSink::start().await;
    // A creates a ticket; B, on every new ticket, waits for an answer and
    // then calls the sink.
    let creator = json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "open", "type": "rowCreate", "params": {
                "entity": "ticket", "values": { "title": "from A" } } }
        ],
        "edges": [{ "from": "start", "to": "open" }]
    });
    let id_a = queued(&mut conn, creator, json!({})).await;
    live(
        &mut conn,
        "b",
        json!({
            "blocks": [
                { "id": "created", "type": "eventTrigger",
                  "params": { "entity": "ticket", "event": "row.created" } },
                { "id": "ask", "type": "waitForInput", "params": { "prompt": "call?" } },
                { "id": "call", "type": "httpRequest", "params": {
                    "method": "POST", "url": sink.url_for("/hook"), "body": { "var": "input" } } }
            ],
            "edges": [
                { "from": "created", "to": "ask" },
                { "from": "ask", "to": "call", "label": "input" }
            ]
        }),
    )
    .await;
    let runner = Runner::with_address_policy(AddressPolicy::AllowInternal).unwrap();
    assert_eq!(
        runner.run(&mut conn, id_a).await.unwrap(),
        RunOutcome::Finished(ExecutionStatus::Success)
    );

    // A's row event starts B, as the workflow subscriber does.
    let (event_id, payload): (Uuid, Value) = outbox_event::table
        .filter(outbox_event::event_type.eq(TRIGGER_EVENT))
        .select((outbox_event::id, outbox_event::payload))
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(payload["allowExternalCallouts"], false);
    let payload: TriggerEventPayload = serde_json::from_value(payload).unwrap();
    let started = store::event_executions(&mut conn, &payload, event_id)
        .await
        .unwrap();
    assert_eq!(started.len(), 1);
    let id_b = started[0].id;
    assert!(!started[0].allow_external_callouts);

    // The flag outlives the wait: the resumed run still may not call.
    assert_eq!(
        runner.run(&mut conn, id_b).await.unwrap(),
        RunOutcome::Waiting("ask".into())
    );
    let outcome = runner
        .resume(&mut conn, id_b, "ask", ContinueKind::Input, &json!({}))
        .await
        .unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Error));
    let run = execution(&mut conn, id_b).await;
    assert_eq!(
        run.error.as_deref(),
        Some(
            "block call: external callouts are disabled for runs started by a workflow's own row events"
        )
    );
    assert!(sink.requests().is_empty());
}

/// A peer on 127.0.0.1 that answers every request with `body`, announced
/// by its `Content-Length` or sent chunked (no length up front). Returns
/// its URL and the count of requests it answered.
async fn answering_peer(
    body: Vec<u8>,
    announced: bool,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/answer", listener.local_addr().unwrap());
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&calls);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = body.clone();
            tokio::spawn(async move {
                // The request is small: one read takes its head and body.
                let mut request = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut request).await;
                let head = if announced {
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    )
                } else {
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_owned()
                };
                let _ = socket.write_all(head.as_bytes()).await;
                if announced {
                    let _ = socket.write_all(&body).await;
                } else {
                    for chunk in body.chunks(64 * 1024) {
                        let size = format!("{:x}\r\n", chunk.len());
                        let _ = socket.write_all(size.as_bytes()).await;
                        let _ = socket.write_all(chunk).await;
                        let _ = socket.write_all(b"\r\n").await;
                    }
                    let _ = socket.write_all(b"0\r\n\r\n").await;
                }
                let _ = socket.shutdown().await;
            });
        }
    });
    (url, calls)
}

// An answer longer than a run records ends the block in error at once,
// instead of failing to record it and calling again up to the claim limit.
// Break checked: `answer_text` without its limit (the whole body read)
// records the 11 MiB answer: the run succeeds instead of ending in error
// (and without the limit on what arrived, the chunked answer does).
#[tokio::test]
async fn an_answer_over_the_size_a_run_records_fails_the_block_after_one_call() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let runner = Runner::with_address_policy(AddressPolicy::AllowInternal).unwrap();
    let limit = outbox_workflow_runner::MAX_ANSWER_BYTES;
    for announced in [true, false] {
        let (url, calls) = answering_peer(vec![b'a'; limit + 1024 * 1024], announced).await;
        let id = queued(&mut conn, http_workflow(&url), json!({})).await;
        let outcome = runner.run(&mut conn, id).await.unwrap();
        assert_eq!(
            outcome,
            RunOutcome::Finished(ExecutionStatus::Error),
            "announced: {announced}"
        );
        assert_eq!(
            execution(&mut conn, id).await.error.unwrap(),
            format!(
                "block call: the answer's body is over {limit} bytes, more than a run records; \
                 the call was made once and its answer dropped"
            )
        );
        assert_eq!(
            std::sync::atomic::AtomicUsize::load(&calls, std::sync::atomic::Ordering::SeqCst),
            1
        );
    }

    // An answer of exactly the limit is recorded whole.
    let (url, _) = answering_peer(vec![b'a'; limit], false).await;
    let id = queued(&mut conn, http_workflow(&url), json!({})).await;
    assert_eq!(
        runner.run(&mut conn, id).await.unwrap(),
        RunOutcome::Finished(ExecutionStatus::Success)
    );
}
