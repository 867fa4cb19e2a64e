//! The signed bridge over real HTTP and Postgres: signed runs, refusals of
//! forged, tampered, expired and replayed requests, tenant isolation, and
//! stream runs read as server-sent events.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{SECRET, client, serve_bridge};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{entity_row, outbox_event, workflow_block_execution};
use outbox_publish::OutboxTx;
use outbox_test_support::TestDatabase;
use outbox_workflow_bridge::signing::{REQUEST_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use outbox_workflow_bridge::wire::{RUN_PATH, RunRequest, STREAM_PATH, StreamRequest};
use outbox_workflow_bridge::{BridgeCallError, BridgeSecret, SignatureError, WeakSecret};
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_model::events::CONTINUE_REQUESTED;
use outbox_workflow_runner::{RunOutcome, Runner};
use outbox_workflow_store::producers::{self, EventContext, ProducerError, RunTrigger};
use outbox_workflow_store::{self as store, ExecutionStatus, TriggerKind, WorkflowStatus};
use serde_json::{Value, json};
use uuid::Uuid;

async fn save(conn: &mut AsyncPgConnection, tenant: &str, definition: Value) -> Uuid {
    let definition = WorkflowDefinition::from_value(definition).unwrap();
    store::save_workflow(conn, tenant, "wf", WorkflowStatus::Live, &definition)
        .await
        .unwrap()
        .workflow
        .id
}

async fn request(conn: &mut AsyncPgConnection, tenant: &str, workflow: Uuid, input: Value) -> Uuid {
    conn.transaction::<_, ProducerError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        producers::request_execution(&mut tx, tenant, workflow, RunTrigger::Api, &input).await
    })
    .await
    .unwrap()
}

async fn status(conn: &mut AsyncPgConnection, id: Uuid) -> ExecutionStatus {
    store::get_execution(conn, id)
        .await
        .unwrap()
        .unwrap()
        .status
}

async fn blocks(conn: &mut AsyncPgConnection, id: Uuid) -> Vec<String> {
    workflow_block_execution::table
        .filter(workflow_block_execution::execution_id.eq(id))
        .order((
            workflow_block_execution::started_at,
            workflow_block_execution::sequence,
        ))
        .select(workflow_block_execution::block_id)
        .load(conn)
        .await
        .unwrap()
}

fn steps() -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "apiTrigger" },
            { "id": "double", "type": "variable", "params": { "name": "n", "value": { "var": "input.n" } } },
            { "id": "note", "type": "log", "params": { "message": "n is {{ vars.n }}" } }
        ],
        "edges": [{ "from": "start", "to": "double" }, { "from": "double", "to": "note" }]
    })
}

/// Posts `body` to `path` with hand-made signature headers.
async fn post_signed(
    url: &str,
    path: &str,
    body: &[u8],
    request_id: &str,
    timestamp: i64,
    signature: &str,
) -> (u16, String) {
    let response = reqwest::Client::new()
        .post(format!("{url}{path}"))
        .header(REQUEST_ID_HEADER, request_id)
        .header(TIMESTAMP_HEADER, timestamp.to_string())
        .header(SIGNATURE_HEADER, signature)
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test]
async fn a_signed_run_request_runs_the_execution_on_the_bridge() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow = save(&mut conn, "t1", steps()).await;
    let id = request(&mut conn, "t1", workflow, json!({ "n": 7 })).await;
    let url = serve_bridge(db.pool().clone(), Runner::new().unwrap(), &[SECRET]).await;

    let outcome = client(&url, SECRET).run("t1", id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    assert_eq!(status(&mut conn, id).await, ExecutionStatus::Success);
    assert_eq!(blocks(&mut conn, id).await, ["start", "double", "note"]);
    // Asking again changes nothing.
    let again = client(&url, SECRET).run("t1", id).await.unwrap();
    assert_eq!(again, RunOutcome::Unchanged(ExecutionStatus::Success));
}

#[tokio::test]
async fn forged_tampered_expired_and_replayed_requests_are_refused() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow = save(&mut conn, "t1", steps()).await;
    let id = request(&mut conn, "t1", workflow, json!({ "n": 1 })).await;
    let url = serve_bridge(db.pool().clone(), Runner::new().unwrap(), &[SECRET]).await;

    // Another key.
    let forged = client(&url, "another-secret-that-is-32-bytes-long!")
        .run("t1", id)
        .await
        .unwrap_err();
    assert!(
        matches!(&forged, BridgeCallError::Refused { status: 401, message } if message.contains("does not verify")),
        "{forged:?}"
    );

    let secret = BridgeSecret::new(SECRET).unwrap();
    let body = serde_json::to_vec(&RunRequest {
        tenant_id: "t1".into(),
        execution_id: id,
    })
    .unwrap();
    let now = chrono::Utc::now().timestamp();

    // A body other than the one signed.
    let request_id = Uuid::new_v4().to_string();
    let signature = secret.sign(&request_id, now, b"{}");
    let (code, text) = post_signed(&url, RUN_PATH, &body, &request_id, now, &signature).await;
    assert_eq!(code, 401, "{text}");

    // Signed six minutes ago.
    let request_id = Uuid::new_v4().to_string();
    let old = now - 360;
    let signature = secret.sign(&request_id, old, &body);
    let (code, text) = post_signed(&url, RUN_PATH, &body, &request_id, old, &signature).await;
    assert_eq!(code, 401);
    assert!(text.contains("at most 300 s"), "{text}");

    // No signature at all.
    let response = reqwest::Client::new()
        .post(format!("{url}{RUN_PATH}"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(
        status(&mut conn, id).await,
        ExecutionStatus::Queued,
        "nothing ran"
    );

    // A valid request, then the same request again.
    let request_id = Uuid::new_v4().to_string();
    let signature = secret.sign(&request_id, now, &body);
    let (code, text) = post_signed(&url, RUN_PATH, &body, &request_id, now, &signature).await;
    assert_eq!(code, 200, "{text}");
    let (code, text) = post_signed(&url, RUN_PATH, &body, &request_id, now, &signature).await;
    assert_eq!(code, 409);
    assert!(text.contains("replay"), "{text}");
    assert_eq!(status(&mut conn, id).await, ExecutionStatus::Success);
}

#[tokio::test]
async fn during_a_key_rotation_the_previous_secret_is_accepted() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow = save(&mut conn, "t1", steps()).await;
    let id = request(&mut conn, "t1", workflow, json!({ "n": 1 })).await;
    let previous = "the-previous-secret-also-32-bytes-long";
    let url = serve_bridge(
        db.pool().clone(),
        Runner::new().unwrap(),
        &[SECRET, previous],
    )
    .await;
    let outcome = client(&url, previous).run("t1", id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
}

#[test]
fn a_short_secret_and_unreadable_headers_are_typed_errors() {
    assert_eq!(BridgeSecret::new("short"), Err(WeakSecret { len: 5 }));
    let secret = BridgeSecret::new(SECRET).unwrap();
    assert_eq!(format!("{secret:?}"), "BridgeSecret(<redacted>)");
    let request = outbox_workflow_bridge::signing::SignedRequest {
        request_id: Some("not-a-uuid"),
        timestamp: Some("1"),
        signature: Some("v1=AAAA"),
        body: b"{}",
    };
    assert_eq!(
        outbox_workflow_bridge::signing::verify_request(&[secret], request, 1),
        Err(SignatureError::BadRequestId)
    );
}

#[tokio::test]
async fn another_tenants_execution_and_rows_are_out_of_reach() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    // Tenant t2 owns a row.
    let theirs = conn
        .transaction::<_, ProducerError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            let data = json!({ "secret": "t2 data" });
            producers::create_row(&mut tx, "t2", "note", &data, &EventContext::None).await
        })
        .await
        .unwrap()
        .row
        .id;
    // Tenant t1's workflow reads and updates that id.
    let workflow = save(
        &mut conn,
        "t1",
        json!({
            "blocks": [
                { "id": "start", "type": "apiTrigger" },
                { "id": "read", "type": "rowGet", "params": { "entity": "note", "id": { "var": "input.id" } } },
                { "id": "write", "type": "rowUpdate", "params": {
                    "entity": "note", "id": { "var": "input.id" }, "patch": { "secret": "overwritten" } } }
            ],
            "edges": [{ "from": "start", "to": "read" }, { "from": "read", "to": "write" }]
        }),
    )
    .await;
    let id = request(&mut conn, "t1", workflow, json!({ "id": theirs })).await;
    let url = serve_bridge(db.pool().clone(), Runner::new().unwrap(), &[SECRET]).await;

    // t2 cannot have t1's execution run.
    let refused = client(&url, SECRET).run("t2", id).await.unwrap_err();
    assert!(
        matches!(&refused, BridgeCallError::Refused { status: 404, .. }),
        "{refused:?}"
    );
    assert_eq!(status(&mut conn, id).await, ExecutionStatus::Queued);

    // t1's run sees no row and changes none.
    let outcome = client(&url, SECRET).run("t1", id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let outputs: Vec<Option<Value>> = workflow_block_execution::table
        .filter(workflow_block_execution::execution_id.eq(id))
        .filter(workflow_block_execution::block_id.ne("start"))
        .order(workflow_block_execution::started_at)
        .select(workflow_block_execution::output)
        .load(&mut conn)
        .await
        .unwrap();
    assert_eq!(outputs, vec![Some(Value::Null), Some(Value::Null)]);
    let data: Value = entity_row::table
        .find(theirs)
        .select(entity_row::data)
        .first(&mut conn)
        .await
        .unwrap();
    assert_eq!(data, json!({ "secret": "t2 data" }));
}

/// Reads a server-sent event stream to its end: (event, data) pairs.
async fn read_events(mut response: reqwest::Response) -> Vec<(String, Value)> {
    let mut text = String::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text.split("\n\n")
        .filter_map(|frame| {
            let mut event = None;
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(name) = line.strip_prefix("event:") {
                    event = Some(name.trim().to_owned());
                } else if let Some(part) = line.strip_prefix("data:") {
                    data.push_str(part.trim_start());
                }
            }
            Some((event?, serde_json::from_str(&data).unwrap()))
        })
        .collect()
}

#[tokio::test]
async fn a_stream_run_reports_each_block_in_order_as_server_sent_events() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow = save(&mut conn, "t1", steps()).await;
    let url = serve_bridge(db.pool().clone(), Runner::new().unwrap(), &[SECRET]).await;

    let response = client(&url, SECRET)
        .post(
            STREAM_PATH,
            &StreamRequest {
                tenant_id: "t1".into(),
                workflow_id: workflow,
                input: json!({ "n": 3 }),
            },
        )
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let events = read_events(response).await;
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["started", "block", "block", "block", "ended"]);
    let order: Vec<&str> = events[1..4]
        .iter()
        .map(|(_, data)| data["blockId"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["start", "double", "note"]);
    assert_eq!(events[2].1["output"], json!(3));
    assert_eq!(events[4].1["status"], "success");
    let id: Uuid = events[0].1["executionId"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let run = store::get_execution(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(run.trigger_kind, TriggerKind::Stream);
    assert_eq!(run.status, ExecutionStatus::Success);
    // A stream run does not go through the outbox.
    let published: i64 = outbox_event::table
        .filter(outbox_event::event_type.like("workflow.execution.%"))
        .count()
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(published, 0);
}

#[tokio::test]
async fn a_stream_run_that_waits_ends_its_stream_and_is_continued_through_the_outbox() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow = save(
        &mut conn,
        "t1",
        json!({
            "blocks": [
                { "id": "start", "type": "apiTrigger" },
                { "id": "ask", "type": "waitForInput", "params": { "prompt": "ok?" } },
                { "id": "note", "type": "log", "params": { "message": "answered" } }
            ],
            "edges": [{ "from": "start", "to": "ask" }, { "from": "ask", "to": "note", "label": "input" }]
        }),
    )
    .await;
    let url = serve_bridge(db.pool().clone(), Runner::new().unwrap(), &[SECRET]).await;
    let response = client(&url, SECRET)
        .post(
            STREAM_PATH,
            &StreamRequest {
                tenant_id: "t1".into(),
                workflow_id: workflow,
                input: json!({}),
            },
        )
        .await
        .unwrap();
    let events = read_events(response).await;
    let last = &events.last().unwrap().1;
    assert_eq!(last["status"], "waiting");
    assert_eq!(last["waitingBlock"], "ask");
    let id: Uuid = events[0].1["executionId"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    conn.transaction::<_, ProducerError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        producers::request_continuation(&mut tx, "t1", id, &json!({ "ok": true }), None).await
    })
    .await
    .unwrap();
    let types: Vec<String> = outbox_event::table
        .select(outbox_event::event_type)
        .load(&mut conn)
        .await
        .unwrap();
    assert_eq!(types, [CONTINUE_REQUESTED]);
    assert_eq!(status(&mut conn, id).await, ExecutionStatus::Waiting);
}

#[tokio::test]
async fn a_stream_run_of_an_unknown_or_foreign_workflow_is_a_404() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow = save(&mut conn, "t1", steps()).await;
    let url = serve_bridge(db.pool().clone(), Runner::new().unwrap(), &[SECRET]).await;
    for (tenant, id) in [("t2", workflow), ("t1", Uuid::new_v4())] {
        let response = client(&url, SECRET)
            .post(
                STREAM_PATH,
                &StreamRequest {
                    tenant_id: tenant.into(),
                    workflow_id: id,
                    input: json!({}),
                },
            )
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 404, "{tenant} {id}");
    }
    let executions: i64 = outbox_model::schema::workflow_execution::table
        .count()
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(executions, 0);
}
