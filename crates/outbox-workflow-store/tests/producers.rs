//! The producers of `workflow.*` events on real Postgres: what a row
//! mutation, a run request and a continuation request leave in the
//! database, inside the caller's transaction.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::{DateTime, Duration, DurationRound, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{application_event, entity_row, outbox_event, workflow_execution};
use outbox_publish::OutboxTx;
use outbox_test_support::TestDatabase;
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_model::events::{
    CONTINUE_REQUESTED, ContinueKind, ContinueRequestedPayload, EXECUTION_REQUESTED,
    ExecutionRequestedPayload, TRIGGER_EVENT, TriggerEventPayload,
};
use outbox_workflow_store::producers::{self, EventContext, ProducerError, RowChange, RunTrigger};
use outbox_workflow_store::{
    self as store, ExecutionStatus, StoreError, TriggerKind, WorkflowStatus,
};
use serde_json::{Value, json};
use uuid::Uuid;

/// One outbox row as a test looks at it.
#[derive(Debug, Queryable)]
struct Outbox {
    event_type: String,
    payload: Value,
    dispatch_key: Option<String>,
    status: String,
    scheduled_at: DateTime<Utc>,
}

async fn outbox(conn: &mut AsyncPgConnection) -> Vec<Outbox> {
    outbox_event::table
        .select((
            outbox_event::event_type,
            outbox_event::payload,
            outbox_event::dispatch_key,
            outbox_event::status,
            outbox_event::scheduled_at,
        ))
        .order(outbox_event::id)
        .load(conn)
        .await
        .unwrap()
}

async fn counts(conn: &mut AsyncPgConnection) -> (i64, i64, i64) {
    (
        entity_row::table.count().get_result(conn).await.unwrap(),
        application_event::table
            .count()
            .get_result(conn)
            .await
            .unwrap(),
        outbox_event::table.count().get_result(conn).await.unwrap(),
    )
}

/// Runs `f` in a committed transaction with an [`OutboxTx`].
macro_rules! in_tx {
    ($conn:expr, |$tx:ident| $body:expr) => {
        $conn
            .transaction::<_, ProducerError, _>(async |conn| {
                let mut $tx = OutboxTx::new(conn)?;
                let $tx = &mut $tx;
                $body
            })
            .await
    };
}

fn manual_workflow() -> WorkflowDefinition {
    WorkflowDefinition::from_value(json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "ask", "type": "waitForInput",
              "params": { "prompt": "approve?", "timeoutMs": 60000 } },
            { "id": "note", "type": "log", "params": { "message": "done" } }
        ],
        "edges": [
            { "from": "start", "to": "ask" },
            { "from": "ask", "to": "note", "label": "input" }
        ]
    }))
    .unwrap()
}

async fn workflow(conn: &mut AsyncPgConnection, tenant: &str) -> Uuid {
    store::save_workflow(
        conn,
        tenant,
        "approve",
        WorkflowStatus::Live,
        &manual_workflow(),
    )
    .await
    .unwrap()
    .workflow
    .id
}

/// A run of a fresh workflow, moved to `waiting` in block `ask`.
async fn waiting_execution(conn: &mut AsyncPgConnection, tenant: &str) -> Uuid {
    let workflow_id = workflow(conn, tenant).await;
    let id = in_tx!(conn, |tx| {
        producers::request_execution(tx, tenant, workflow_id, RunTrigger::Manual, &json!({})).await
    })
    .unwrap();
    diesel::update(workflow_execution::table.find(id))
        .set((
            workflow_execution::status.eq("waiting"),
            workflow_execution::waiting_block.eq("ask"),
        ))
        .execute(conn)
        .await
        .unwrap();
    diesel::delete(outbox_event::table)
        .execute(conn)
        .await
        .unwrap();
    id
}

#[tokio::test]
async fn a_request_create_writes_the_row_the_application_event_and_one_pending_trigger() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let data = json!({ "total": 120, "customerEmail": "a@example.test" });

    let change: RowChange = in_tx!(conn, |tx| {
        producers::create_row(
            tx,
            "t1",
            "order",
            &data,
            &EventContext::Request {
                actor: Some("user-7".into()),
            },
        )
        .await
    })
    .unwrap();

    assert_eq!(change.row.data, data);
    assert_eq!(change.row.entity, "order");
    let rows: Vec<(Uuid, String, Value)> = entity_row::table
        .select((entity_row::id, entity_row::tenant_id, entity_row::data))
        .load(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, vec![(change.row.id, "t1".to_owned(), data.clone())]);

    let events: Vec<(Uuid, String, String, Option<Uuid>, Value)> = application_event::table
        .select((
            application_event::id,
            application_event::entity,
            application_event::event,
            application_event::row_id,
            application_event::data,
        ))
        .load(&mut conn)
        .await
        .unwrap();
    let app_event = change.application_event_id.unwrap();
    assert_eq!(
        events,
        vec![(
            app_event,
            "order".to_owned(),
            "row.created".to_owned(),
            Some(change.row.id),
            json!({ "order": { "id": change.row.id.to_string(), "total": 120,
                               "customerEmail": "a@example.test" } }),
        )]
    );

    let outbox = outbox(&mut conn).await;
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].event_type, TRIGGER_EVENT);
    assert_eq!(outbox[0].status, "PENDING");
    assert_eq!(
        outbox[0].dispatch_key.as_deref(),
        Some(format!("app-event:{app_event}").as_str())
    );
    assert_eq!(
        outbox[0].payload,
        json!({
            "tenantId": "t1", "entity": "order", "event": "row.created",
            "rowId": change.row.id, "row": data, "applicationEventId": app_event,
            "allowExternalCallouts": true, "actor": "user-7"
        })
    );
    let parsed: TriggerEventPayload = serde_json::from_value(outbox[0].payload.clone()).unwrap();
    assert!(parsed.allow_external_callouts);
    assert!(!change.outbox_event.unwrap().is_duplicate());
}

#[tokio::test]
async fn a_rolled_back_request_create_leaves_nothing() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;

    let result = conn
        .transaction::<(), ProducerError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            producers::create_row(
                &mut tx,
                "t1",
                "order",
                &json!({ "total": 5 }),
                &EventContext::Request { actor: None },
            )
            .await?;
            // The business logic fails after the row was written.
            Err(ProducerError::DataNotObject)
        })
        .await;

    assert!(matches!(result, Err(ProducerError::DataNotObject)));
    assert_eq!(counts(&mut conn).await, (0, 0, 0));
}

#[tokio::test]
async fn a_workflow_update_publishes_without_external_callouts_and_names_its_origin() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let created = in_tx!(conn, |tx| {
        producers::create_row(
            tx,
            "t1",
            "order",
            &json!({ "total": 120, "vip": false }),
            &EventContext::None,
        )
        .await
    })
    .unwrap();
    let execution = Uuid::now_v7();

    let updated = in_tx!(conn, |tx| {
        producers::update_row(
            tx,
            "t1",
            "order",
            created.row.id,
            &json!({ "vip": true }),
            &EventContext::Workflow {
                execution_id: execution,
                block_id: "mark".into(),
            },
        )
        .await
    })
    .unwrap()
    .expect("the row exists");

    assert_eq!(updated.row.data, json!({ "total": 120, "vip": true }));
    let outbox = outbox(&mut conn).await;
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].event_type, TRIGGER_EVENT);
    assert_eq!(
        outbox[0].payload,
        json!({
            "tenantId": "t1", "entity": "order", "event": "row.updated",
            "rowId": created.row.id, "row": { "total": 120, "vip": true },
            "applicationEventId": updated.application_event_id.unwrap(),
            "allowExternalCallouts": false,
            "origin": { "executionId": execution, "blockId": "mark" }
        })
    );
}

#[tokio::test]
async fn eventless_mutations_write_only_the_row() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;

    let created = in_tx!(conn, |tx| {
        producers::create_row(
            tx,
            "t1",
            "order",
            &json!({ "total": 1 }),
            &EventContext::None,
        )
        .await
    })
    .unwrap();
    assert_eq!(created.application_event_id, None);
    assert_eq!(created.outbox_event, None);
    let id = created.row.id;
    let updated = in_tx!(conn, |tx| {
        producers::update_row(
            tx,
            "t1",
            "order",
            id,
            &json!({ "total": 2 }),
            &EventContext::None,
        )
        .await
    })
    .unwrap()
    .unwrap();
    assert_eq!(updated.row.data, json!({ "total": 2 }));
    assert_eq!(counts(&mut conn).await, (1, 0, 0));

    let deleted = in_tx!(conn, |tx| {
        producers::delete_row(tx, "t1", "order", id, &EventContext::None).await
    })
    .unwrap()
    .unwrap();
    assert!(deleted.row.deleted_at.is_some());
    assert_eq!(counts(&mut conn).await, (1, 0, 0));

    // A deleted row is no longer found: nothing more is written.
    let again = in_tx!(conn, |tx| {
        producers::delete_row(
            tx,
            "t1",
            "order",
            id,
            &EventContext::Request { actor: None },
        )
        .await
    })
    .unwrap();
    assert!(again.is_none());
    assert_eq!(counts(&mut conn).await, (1, 0, 0));
}

#[tokio::test]
async fn a_request_delete_publishes_the_rows_last_data() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let created = in_tx!(conn, |tx| {
        producers::create_row(
            tx,
            "t1",
            "order",
            &json!({ "total": 3 }),
            &EventContext::None,
        )
        .await
    })
    .unwrap();
    // Another tenant's delete does not find the row.
    let other = in_tx!(conn, |tx| {
        producers::delete_row(
            tx,
            "t2",
            "order",
            created.row.id,
            &EventContext::Request { actor: None },
        )
        .await
    })
    .unwrap();
    assert!(other.is_none());

    in_tx!(conn, |tx| {
        producers::delete_row(
            tx,
            "t1",
            "order",
            created.row.id,
            &EventContext::Request { actor: None },
        )
        .await
    })
    .unwrap()
    .unwrap();
    let outbox = outbox(&mut conn).await;
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].payload["event"], "row.deleted");
    assert_eq!(outbox[0].payload["row"], json!({ "total": 3 }));
}

#[tokio::test]
async fn bad_entities_and_data_are_refused_before_any_write() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let context = EventContext::Request { actor: None };
    let bad_entity = in_tx!(conn, |tx| {
        producers::create_row(tx, "t1", "order-line", &json!({}), &context).await
    });
    assert!(
        matches!(bad_entity, Err(ProducerError::InvalidEntity { ref entity }) if entity == "order-line")
    );
    let bad_data = in_tx!(conn, |tx| {
        producers::create_row(tx, "t1", "order", &json!([1]), &context).await
    });
    assert!(matches!(bad_data, Err(ProducerError::DataNotObject)));
    assert_eq!(counts(&mut conn).await, (0, 0, 0));
}

#[tokio::test]
async fn request_execution_queues_a_run_and_publishes_one_request() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow_id = workflow(&mut conn, "t1").await;
    let input = json!({ "amount": 12 });

    let id = in_tx!(conn, |tx| {
        producers::request_execution(tx, "t1", workflow_id, RunTrigger::Api, &input).await
    })
    .unwrap();

    let execution = store::get_execution(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(execution.status, ExecutionStatus::Queued);
    assert_eq!(execution.trigger_kind, TriggerKind::Api);
    assert_eq!(execution.input, input);
    assert_eq!(execution.workflow_version, 1);
    assert_eq!(execution.started_at, None);
    let blocks: i64 = outbox_model::schema::workflow_block_execution::table
        .count()
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(blocks, 0, "nothing runs inline");

    let outbox = outbox(&mut conn).await;
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].event_type, EXECUTION_REQUESTED);
    assert_eq!(outbox[0].status, "PENDING");
    assert_eq!(
        outbox[0].payload,
        json!({ "executionId": id, "tenantId": "t1", "workflowId": workflow_id })
    );
    let parsed: ExecutionRequestedPayload =
        serde_json::from_value(outbox[0].payload.clone()).unwrap();
    assert_eq!(parsed.execution_id, id);
}

#[tokio::test]
async fn request_execution_of_another_tenants_workflow_is_refused() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow_id = workflow(&mut conn, "t1").await;
    let result = in_tx!(conn, |tx| {
        producers::request_execution(tx, "t2", workflow_id, RunTrigger::Manual, &json!({})).await
    });
    assert!(matches!(
        result,
        Err(ProducerError::Store(StoreError::WorkflowNotFound { workflow_id: w })) if w == workflow_id
    ));
    assert_eq!(counts(&mut conn).await.2, 0);
}

#[tokio::test]
async fn a_continuation_of_a_run_that_is_not_waiting_is_refused_and_writes_nothing() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow_id = workflow(&mut conn, "t1").await;
    let id = in_tx!(conn, |tx| {
        producers::request_execution(tx, "t1", workflow_id, RunTrigger::Manual, &json!({})).await
    })
    .unwrap();
    diesel::delete(outbox_event::table)
        .execute(&mut conn)
        .await
        .unwrap();

    let result = in_tx!(conn, |tx| {
        producers::request_continuation(tx, "t1", id, &json!({ "approved": true }), None).await
    });
    match result {
        Err(ProducerError::NotWaiting {
            execution_id,
            status,
        }) => {
            assert_eq!(execution_id, id);
            assert_eq!(status, ExecutionStatus::Queued);
        }
        other => panic!("expected NotWaiting, got {other:?}"),
    }
    let unknown = Uuid::now_v7();
    let missing = in_tx!(conn, |tx| {
        producers::request_continuation(tx, "t1", unknown, &json!({}), None).await
    });
    assert!(
        matches!(missing, Err(ProducerError::ExecutionNotFound { execution_id }) if execution_id == unknown)
    );
    assert!(outbox(&mut conn).await.is_empty());
}

#[tokio::test]
async fn an_input_continuation_publishes_the_answer_and_a_repeat_is_a_duplicate() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = waiting_execution(&mut conn, "t1").await;
    let answer = json!({ "approved": true });

    let first = in_tx!(conn, |tx| {
        producers::request_continuation(tx, "t1", id, &answer, None).await
    })
    .unwrap();
    let second = in_tx!(conn, |tx| {
        producers::request_continuation(tx, "t1", id, &answer, None).await
    })
    .unwrap();

    assert!(!first.is_duplicate());
    assert!(second.is_duplicate());
    assert_eq!(second.id(), first.id());
    let outbox = outbox(&mut conn).await;
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].event_type, CONTINUE_REQUESTED);
    assert_eq!(outbox[0].status, "PENDING");
    assert_eq!(
        outbox[0].payload,
        json!({ "executionId": id, "tenantId": "t1", "waitingBlock": "ask",
                "input": answer, "kind": "input" })
    );
    assert_eq!(
        outbox[0].dispatch_key.as_deref(),
        Some(format!("wf-continue:{id}:ask:input").as_str())
    );
    assert!(outbox[0].scheduled_at <= Utc::now());
}

#[tokio::test]
async fn a_timeout_continuation_is_scheduled_at_the_deadline() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = waiting_execution(&mut conn, "t1").await;
    // Postgres keeps microseconds.
    let deadline = (Utc::now() + Duration::minutes(10))
        .duration_trunc(Duration::microseconds(1))
        .unwrap();

    in_tx!(conn, |tx| {
        producers::request_continuation(tx, "t1", id, &Value::Null, Some(deadline)).await
    })
    .unwrap();
    // The answer can still arrive before the timeout: a different key.
    in_tx!(conn, |tx| {
        producers::request_continuation(tx, "t1", id, &json!({ "approved": false }), None).await
    })
    .unwrap();

    let outbox = outbox(&mut conn).await;
    assert_eq!(outbox.len(), 2);
    let timeout = &outbox[0];
    assert_eq!(timeout.status, "PENDING");
    assert_eq!(timeout.scheduled_at, deadline);
    let parsed: ContinueRequestedPayload = serde_json::from_value(timeout.payload.clone()).unwrap();
    assert_eq!(parsed.kind, ContinueKind::Timeout);
    assert_eq!(parsed.waiting_block, "ask");
    assert_eq!(
        timeout.dispatch_key.as_deref(),
        Some(format!("wf-continue:{id}:ask:timeout").as_str())
    );
    assert_eq!(outbox[1].payload["kind"], "input");
}

#[test]
fn every_workflow_event_routes_to_the_workflow_queue() {
    let router = outbox_catalog::standard_router().unwrap();
    for event_type in [TRIGGER_EVENT, EXECUTION_REQUESTED, CONTINUE_REQUESTED] {
        assert_eq!(
            router.route(event_type),
            Some("outbox.workflow"),
            "{event_type}"
        );
    }
}
