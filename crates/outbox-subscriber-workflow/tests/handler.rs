//! The `outbox.workflow` handler called directly with the jobs the
//! producers' outbox rows become, on real Postgres: what each job kind
//! leaves in the database, and what a redelivery changes (nothing).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_model::OutboxEvent;
use outbox_model::schema::{outbox_event, workflow_execution};
use outbox_publish::OutboxTx;
use outbox_queue::OutboxJob;
use outbox_subscriber::{JobError, JobHandler, JobMeta};
use outbox_subscriber_workflow::WorkflowHandler;
use outbox_test_support::{LogCapture, TestDatabase};
use outbox_workflow_bridge::executor::Executor;
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_runner::{AddressPolicy, EMAIL_EVENT, HOOK_EXECUTED, HOOK_FAILED, Runner};
use outbox_workflow_store::producers::{self, EventContext, ProducerError, RunTrigger};
use outbox_workflow_store::{self as store, ExecutionStatus, WorkflowExecution, WorkflowStatus};
use serde_json::{Value, json};
use uuid::Uuid;

fn meta() -> JobMeta {
    JobMeta {
        queue: "outbox.workflow".into(),
        task_id: "t".into(),
        attempt: 1,
    }
}

/// The job of the newest outbox row of `event_type`.
async fn job(conn: &mut AsyncPgConnection, event_type: &str) -> OutboxJob {
    let event: OutboxEvent = outbox_event::table
        .filter(outbox_event::event_type.eq(event_type))
        .order(outbox_event::id.desc())
        .select(OutboxEvent::as_select())
        .first(conn)
        .await
        .unwrap();
    OutboxJob::from_event(&event)
}

async fn count(conn: &mut AsyncPgConnection, event_type: &str) -> i64 {
    outbox_event::table
        .filter(outbox_event::event_type.eq(event_type))
        .count()
        .get_result(conn)
        .await
        .unwrap()
}

async fn executions(conn: &mut AsyncPgConnection) -> Vec<WorkflowExecution> {
    store::list_executions(conn, &store::ExecutionFilter::default())
        .await
        .unwrap()
}

async fn save(conn: &mut AsyncPgConnection, definition: Value) -> Uuid {
    save_as(conn, "wf", definition).await
}

async fn save_as(conn: &mut AsyncPgConnection, name: &str, definition: Value) -> Uuid {
    let definition = WorkflowDefinition::from_value(definition).unwrap();
    store::save_workflow(conn, "t1", name, WorkflowStatus::Live, &definition)
        .await
        .unwrap()
        .workflow
        .id
}

fn handler(db: &TestDatabase) -> WorkflowHandler {
    WorkflowHandler::new(db.pool().clone(), Executor::native(Runner::new().unwrap()))
}

macro_rules! in_tx {
    ($conn:expr, |$tx:ident| $body:expr) => {
        $conn
            .transaction::<_, ProducerError, _>(async |conn| {
                let mut $tx = OutboxTx::new(conn)?;
                let $tx = &mut $tx;
                $body
            })
            .await
            .unwrap()
    };
}

#[tokio::test]
async fn a_trigger_event_starts_each_matching_workflow_once() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    save(
        &mut conn,
        json!({
            "blocks": [
                { "id": "created", "type": "eventTrigger",
                  "params": { "entity": "order", "event": "row.created" } },
                { "id": "big", "type": "if", "params": { "condition":
                    { "left": { "var": "input.order.total" }, "op": "gt", "right": 100 } } },
                { "id": "thank", "type": "email", "params": {
                    "to": ["{{ input.order.email }}"], "subject": "Thanks", "text": "{{ input.order.total }}" } }
            ],
            "edges": [
                { "from": "created", "to": "big" },
                { "from": "big", "to": "thank", "label": "true" }
            ]
        }),
    )
    .await;
    let data = json!({ "total": 150, "email": "a@example.test" });
    in_tx!(conn, |tx| {
        producers::create_row(
            tx,
            "t1",
            "order",
            &data,
            &EventContext::Request { actor: None },
        )
        .await
    });
    let trigger = job(&mut conn, "workflow.trigger.event").await;
    let handler = handler(&db);

    handler.handle(trigger.clone(), &meta()).await.unwrap();
    let runs = executions(&mut conn).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, ExecutionStatus::Success);
    assert_eq!(runs[0].trigger_event_id, Some(trigger.outbox_event_id));
    assert_eq!(runs[0].input["order"]["total"], 150);
    assert_eq!(count(&mut conn, EMAIL_EVENT).await, 1);
    assert_eq!(count(&mut conn, HOOK_EXECUTED).await, 1);

    // Redelivered: no new execution, no second mail.
    handler.handle(trigger, &meta()).await.unwrap();
    assert_eq!(executions(&mut conn).await.len(), 1);
    assert_eq!(count(&mut conn, EMAIL_EVENT).await, 1);
    assert_eq!(count(&mut conn, HOOK_EXECUTED).await, 1);
}

/// eventTrigger(order, row.created) → log.
fn order_log_workflow() -> Value {
    json!({
        "blocks": [
            { "id": "created", "type": "eventTrigger",
              "params": { "entity": "order", "event": "row.created" } },
            { "id": "log", "type": "log", "params": { "message": "order" } }
        ],
        "edges": [{ "from": "created", "to": "log" }]
    })
}

/// Creates an `order` row of tenant t1; the job of its trigger event.
async fn order_created(conn: &mut AsyncPgConnection) -> OutboxJob {
    let data = json!({ "total": 1 });
    in_tx!(conn, |tx| {
        producers::create_row(
            tx,
            "t1",
            "order",
            &data,
            &EventContext::Request { actor: None },
        )
        .await
    });
    job(conn, "workflow.trigger.event").await
}

// Break checked: without the runs an earlier delivery created
// (`created_before` in `event_executions`), the run stays queued.
#[tokio::test]
async fn a_redelivered_trigger_runs_the_run_it_created_even_after_its_workflow_became_a_draft() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let definition = order_log_workflow();
    let workflow = save_as(&mut conn, "a-drafted", definition.clone()).await;
    save_as(&mut conn, "b-live", definition).await;
    let trigger = order_created(&mut conn).await;
    // The first delivery created the run, and its worker died before
    // running it; the workflow was saved as a draft before the redelivery.
    let payload: outbox_workflow_model::events::TriggerEventPayload =
        trigger.payload.parse().unwrap();
    let created = store::event_executions(&mut conn, &payload, trigger.outbox_event_id)
        .await
        .unwrap();
    assert_eq!(created.len(), 2);
    store::set_status(&mut conn, "t1", workflow, WorkflowStatus::Draft)
        .await
        .unwrap();

    handler(&db).handle(trigger, &meta()).await.unwrap();
    let runs = executions(&mut conn).await;
    let statuses: Vec<ExecutionStatus> = runs.iter().map(|run| run.status).collect();
    assert_eq!(
        statuses,
        [ExecutionStatus::Success, ExecutionStatus::Success],
        "each run once, both run"
    );
}

// Break checked: with `triggered_workflows` failing on a definition that
// does not validate (as `live_event_workflows` does), the job fails for
// good and neither workflow runs.
#[tokio::test]
async fn a_live_workflow_whose_stored_definition_no_longer_validates_ends_in_error_and_the_others_run()
 {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let definition = order_log_workflow();
    let good = save_as(&mut conn, "a-good", definition.clone()).await;
    let broken = save_as(&mut conn, "b-broken", definition).await;
    // Saved under an older, looser validator: an edge to no block.
    conn.batch_execute(&format!(
        r#"UPDATE workflow_version
           SET definition = jsonb_set(definition, '{{edges}}', '[{{"from": "created", "to": "nowhere"}}]')
           WHERE workflow_id = '{broken}'"#
    ))
    .await
    .unwrap();
    let trigger = order_created(&mut conn).await;

    handler(&db).handle(trigger, &meta()).await.unwrap();
    let runs = executions(&mut conn).await;
    let status_of = |workflow: Uuid| {
        runs.iter()
            .find(|run| run.workflow_id == workflow)
            .map(|run| (run.status, run.error.clone()))
    };
    assert_eq!(status_of(good), Some((ExecutionStatus::Success, None)));
    let (status, error) = status_of(broken).expect("the broken workflow's run exists");
    assert_eq!(status, ExecutionStatus::Error);
    assert!(
        error.as_deref().unwrap_or_default().contains("nowhere"),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_execution_request_runs_the_queued_execution_and_a_continuation_resumes_it() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let workflow = save(
        &mut conn,
        json!({
            "blocks": [
                { "id": "start", "type": "manualTrigger" },
                { "id": "ask", "type": "waitForInput", "params": { "prompt": "ok?", "timeoutMs": 60000 } },
                { "id": "note", "type": "log", "params": { "message": "ok" } }
            ],
            "edges": [
                { "from": "start", "to": "ask" },
                { "from": "ask", "to": "note", "label": "input" }
            ]
        }),
    )
    .await;
    let id = in_tx!(conn, |tx| {
        producers::request_execution(tx, "t1", workflow, RunTrigger::Api, &json!({})).await
    });
    let handler = handler(&db);
    let logs = LogCapture::start();
    let requested = job(&mut conn, "workflow.execution.requested").await;
    handler.handle(requested.clone(), &meta()).await.unwrap();
    let run = store::get_execution(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(run.status, ExecutionStatus::Waiting);
    // The timeout continuation is scheduled; hold on to it.
    let timeout = job(&mut conn, "workflow.execution.continue.requested").await;

    in_tx!(conn, |tx| {
        producers::request_continuation(tx, "t1", id, &json!({ "ok": true }), None).await
    });
    let answer = job(&mut conn, "workflow.execution.continue.requested").await;
    assert_ne!(answer.outbox_event_id, timeout.outbox_event_id);
    handler.handle(answer.clone(), &meta()).await.unwrap();
    let run = store::get_execution(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(run.status, ExecutionStatus::Success);
    assert_eq!(
        run.output,
        Some(json!({ "level": "info", "message": "ok" }))
    );

    // Late timeout, redelivered answer and request: no-ops.
    for late in [timeout, answer, requested] {
        handler.handle(late, &meta()).await.unwrap();
    }
    assert_eq!(count(&mut conn, HOOK_EXECUTED).await, 1);
    // Each job's log line names the execution and what became of it.
    let advanced: Vec<String> = logs
        .text()
        .lines()
        .filter(|l| l.contains("workflow execution advanced"))
        .map(str::to_owned)
        .collect();
    let outcomes: Vec<&str> = advanced
        .iter()
        .map(|l| {
            assert!(l.contains(&format!("execution={id}")), "{l}");
            l.split("outcome=").nth(1).unwrap_or_default().trim()
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            r#"Waiting("ask")"#,
            "Finished(Success)",
            "Unchanged(Success)",
            "Unchanged(Success)",
            "Unchanged(Success)",
        ],
        "{}",
        logs.text()
    );
    let status: String = workflow_execution::table
        .find(id)
        .select(workflow_execution::status)
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(status, "success");
}

#[tokio::test]
async fn other_event_types_bad_payloads_and_unknown_executions_fail_permanently() {
    let db = TestDatabase::new().await;
    let handler = handler(&db);
    let base = |event_type: &str, payload: Value| {
        let mut job: OutboxJob = serde_json::from_value(json!({
            "outbox_event_id": Uuid::now_v7(), "tenant_id": "t1", "event_type": event_type,
            "payload": payload, "dispatch_key": null, "created_at": chrono::Utc::now(),
        }))
        .unwrap();
        job.generation = 0;
        job
    };
    let cases = [
        base("workflow.other", json!({})),
        base("workflow.execution.requested", json!({ "executionId": 5 })),
        base(
            "workflow.execution.requested",
            json!({ "executionId": Uuid::now_v7(), "tenantId": "t1", "workflowId": Uuid::now_v7() }),
        ),
    ];
    for job in cases {
        let event_type = job.event_type.clone();
        match handler.handle(job, &meta()).await {
            Err(JobError::Permanent(reason)) => assert!(!reason.is_empty(), "{event_type}"),
            other => panic!("{event_type}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_workflow_is_not_started_by_the_events_of_its_own_row_blocks() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    save(
        &mut conn,
        json!({
            "blocks": [
                { "id": "updated", "type": "eventTrigger",
                  "params": { "entity": "order", "event": "row.updated" } },
                { "id": "touch", "type": "rowUpdate", "params": { "entity": "order",
                    "id": { "var": "input.order.id" }, "patch": { "seen": true } } }
            ],
            "edges": [{ "from": "updated", "to": "touch" }]
        }),
    )
    .await;
    let row = in_tx!(conn, |tx| {
        producers::create_row(tx, "t1", "order", &json!({ "n": 1 }), &EventContext::None).await
    })
    .row;
    in_tx!(conn, |tx| {
        let context = EventContext::Request { actor: None };
        producers::update_row(tx, "t1", "order", row.id, &json!({ "n": 2 }), &context).await
    });
    let handler = handler(&db);
    let first = job(&mut conn, "workflow.trigger.event").await;
    handler.handle(first.clone(), &meta()).await.unwrap();
    assert_eq!(executions(&mut conn).await.len(), 1);
    // The run's own update produced a trigger event: it starts nothing.
    let own = job(&mut conn, "workflow.trigger.event").await;
    assert_ne!(own.outbox_event_id, first.outbox_event_id);
    assert!(own.payload.value().unwrap().get("origin").is_some());
    handler.handle(own, &meta()).await.unwrap();
    let runs = executions(&mut conn).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, ExecutionStatus::Success);
}

#[tokio::test]
async fn a_run_started_by_a_workflows_row_event_makes_no_external_call() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = outbox_test_support::HttpSink::start().await;
    // A opens a ticket; B posts every new ticket to the sink.
    let a = save_as(
        &mut conn,
        "a",
        json!({
            "blocks": [
                { "id": "start", "type": "manualTrigger" },
                { "id": "open", "type": "rowCreate", "params": {
                    "entity": "ticket", "values": { "title": "from A" } } }
            ],
            "edges": [{ "from": "start", "to": "open" }]
        }),
    )
    .await;
    let b = save_as(
        &mut conn,
        "b",
        json!({
            "blocks": [
                { "id": "created", "type": "eventTrigger",
                  "params": { "entity": "ticket", "event": "row.created" } },
                { "id": "post", "type": "httpRequest", "params": {
                    "method": "POST", "url": sink.url_for("/tickets"),
                    "body": { "var": "input.ticket" } } }
            ],
            "edges": [{ "from": "created", "to": "post" }]
        }),
    )
    .await;
    // The sink is on 127.0.0.1: the guard is lifted, as in the demo.
    let runner = Runner::with_address_policy(AddressPolicy::AllowInternal).unwrap();
    let handler = WorkflowHandler::new(db.pool().clone(), Executor::native(runner));
    let runs_of_b = async |conn: &mut AsyncPgConnection| -> Vec<WorkflowExecution> {
        let mut runs: Vec<WorkflowExecution> = executions(conn)
            .await
            .into_iter()
            .filter(|run| run.workflow_id == b)
            .collect();
        runs.sort_by_key(|run| run.created_at);
        runs
    };

    in_tx!(conn, |tx| {
        producers::request_execution(tx, "t1", a, RunTrigger::Manual, &json!({})).await
    });
    let requested = job(&mut conn, "workflow.execution.requested").await;
    handler.handle(requested, &meta()).await.unwrap();
    let from_a = job(&mut conn, "workflow.trigger.event").await;
    assert_eq!(
        from_a.payload.value().unwrap()["allowExternalCallouts"],
        false
    );
    handler.handle(from_a, &meta()).await.unwrap();
    let runs = runs_of_b(&mut conn).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, ExecutionStatus::Error);
    let reason = "block post: external callouts are disabled for runs started by a workflow's own row events";
    assert_eq!(runs[0].error.as_deref(), Some(reason));
    let failed = job(&mut conn, HOOK_FAILED).await;
    assert_eq!(failed.payload.value().unwrap()["error"], reason);
    assert!(sink.requests().is_empty());

    // The same B, started by the application's own request, calls out.
    in_tx!(conn, |tx| {
        let context = EventContext::Request { actor: None };
        let data = json!({ "title": "from the app" });
        producers::create_row(tx, "t1", "ticket", &data, &context).await
    });
    let from_app = job(&mut conn, "workflow.trigger.event").await;
    handler.handle(from_app, &meta()).await.unwrap();
    let runs = runs_of_b(&mut conn).await;
    assert_eq!(runs.len(), 2);
    assert_eq!(
        runs[1].status,
        ExecutionStatus::Success,
        "{:?}",
        runs[1].error
    );
    let calls = sink.requests_to("/tickets");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].json()["title"], "from the app");
}

// Break checked (a mutation run's shard 6 of the subscriber crates): the
// handler consuming another queue (`queue()` answering "") fails here.
#[tokio::test]
async fn the_handler_consumes_the_queue_the_description_names() {
    let db = TestDatabase::new().await;
    assert_eq!(
        vec![handler(&db).queue()],
        outbox_catalog::built_in::WORKFLOW.queues()
    );
    assert_eq!(handler(&db).queue(), outbox_queue::queues::WORKFLOW);
}

// The sweep task finds a run left `running` by a holder whose lease
// expired, requests its resume once, counts it and logs it; passes that
// find nothing count and log nothing. Break checked: with `sweep` emptied
// no resume is requested; with the counter's `>` made `==`, the resume is
// requested and not counted; with it made `>=`, an empty pass registers
// the counter.
#[test]
fn the_sweep_task_resumes_a_run_whose_lease_expired_once_counting_and_logging_it_and_an_empty_pass_does_neither()
 {
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    outbox_test_support::with_metrics_recorder(&recorder, async || {
        let db = TestDatabase::new().await;
        let mut conn = db.conn().await;
        let id = log_run(&mut conn).await;
        let requested = count(&mut conn, "workflow.execution.requested").await;
        let logs = LogCapture::start();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let sweeping = tokio::spawn(outbox_subscriber_workflow::sweep(
            db.pool().clone(),
            std::time::Duration::from_secs(30),
            std::time::Duration::from_millis(50),
            shutdown.clone(),
        ));
        // Passes that find nothing say and count nothing (six passes' time).
        outbox_test_support::consistently(
            "no sweep log line and no resume counted while nothing is orphaned",
            std::time::Duration::from_millis(300),
            async || {
                logs.count("nobody holding them") == 0 && resumed_counter(&snapshotter).is_empty()
            },
        )
        .await;
        hold(&mut conn, id, "now() - interval '1 second'").await;

        outbox_test_support::eventually(
            "the sweep to request a resume",
            std::time::Duration::from_secs(30),
            async || count(&mut conn, "workflow.execution.requested").await == requested + 1,
        )
        .await;
        // Later passes find the same holder and request nothing more.
        outbox_test_support::consistently(
            "one resume, however many passes",
            std::time::Duration::from_millis(200),
            async || count(&mut conn, "workflow.execution.requested").await == requested + 1,
        )
        .await;
        shutdown.cancel();
        sweeping.await.unwrap();
        assert_eq!(
            count(&mut conn, "workflow.execution.requested").await,
            requested + 1
        );
        assert!(
            logs.count("orphaned=1 published=1") == 1,
            "the pass that resumed the run says so: {}",
            logs.text()
        );
    });
    assert_eq!(resumed_counter(&snapshotter), vec![1]);
}

/// The values of `outbox_workflow_runs_resumed_total` recorded so far.
fn resumed_counter(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<u64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "outbox_workflow_runs_resumed_total")
        .filter_map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => Some(n),
            _ => None,
        })
        .collect()
}

// A run another job holds (its lease is live) is left alone, and the log
// says so rather than that it advanced. Break checked: without that arm of
// `log_outcome`, the log says "advanced".
#[tokio::test]
async fn a_run_held_by_another_job_is_left_alone_and_the_log_says_so() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = log_run(&mut conn).await;
    hold(&mut conn, id, "now() + interval '1 hour'").await;
    let logs = LogCapture::start();
    let requested = job(&mut conn, "workflow.execution.requested").await;
    handler(&db).handle(requested, &meta()).await.unwrap();
    assert_eq!(
        logs.count("workflow execution held by another job: left alone"),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(
        logs.count("workflow execution advanced"),
        0,
        "{}",
        logs.text()
    );
    let run = store::get_execution(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(
        run.status,
        ExecutionStatus::Running,
        "still the other job's"
    );
}

/// A queued run of a one-block workflow (manualTrigger → log).
async fn log_run(conn: &mut AsyncPgConnection) -> Uuid {
    let workflow = save(
        conn,
        json!({
            "blocks": [
                { "id": "start", "type": "manualTrigger" },
                { "id": "note", "type": "log", "params": { "message": "ok" } }
            ],
            "edges": [{ "from": "start", "to": "note" }]
        }),
    )
    .await;
    in_tx!(conn, |tx| {
        producers::request_execution(tx, "t1", workflow, RunTrigger::Api, &json!({})).await
    })
}

/// Marks run `id` running, held by a job of its own until `until` (SQL).
async fn hold(conn: &mut AsyncPgConnection, id: Uuid, until: &str) {
    diesel::sql_query(format!(
        "UPDATE workflow_execution SET status = 'running', started_at = now(),
                lease_owner = '{}', lease_until = {until} WHERE id = '{id}'",
        Uuid::new_v4()
    ))
    .execute(conn)
    .await
    .unwrap();
}
