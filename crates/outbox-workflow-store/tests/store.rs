//! The workflow store on real Postgres: saving and versioning definitions,
//! event-trigger matching, executions and the tables' constraints.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::{workflow, workflow_execution, workflow_version};
use outbox_test_support::TestDatabase;
use outbox_workflow_model::{DefinitionError, WorkflowDefinition};
use outbox_workflow_store::{
    self as store, ExecutionFilter, ExecutionPosition, ExecutionStatus, NewExecution, StoreError,
    TriggerKind, WorkflowStatus,
};
use serde_json::{Value, json};
use uuid::Uuid;

/// eventTrigger(entity, event) → log(message).
fn event_workflow(entity: &str, event: &str, message: &str) -> WorkflowDefinition {
    WorkflowDefinition::from_value(json!({
        "blocks": [
            { "id": "start", "type": "eventTrigger",
              "params": { "entity": entity, "event": event } },
            { "id": "note", "type": "log", "params": { "message": message } }
        ],
        "edges": [{ "from": "start", "to": "note" }]
    }))
    .unwrap()
}

fn manual_workflow(message: &str) -> WorkflowDefinition {
    WorkflowDefinition::from_value(json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "note", "type": "log", "params": { "message": message } }
        ],
        "edges": [{ "from": "start", "to": "note" }]
    }))
    .unwrap()
}

fn log_message(workflow: &outbox_workflow_model::ValidatedWorkflow) -> Value {
    serde_json::to_value(workflow.block("note").unwrap()).unwrap()["params"]["message"].clone()
}

async fn count_workflows(conn: &mut AsyncPgConnection) -> (i64, i64) {
    let workflows = workflow::table.count().get_result(conn).await.unwrap();
    let versions = workflow_version::table
        .count()
        .get_result(conn)
        .await
        .unwrap();
    (workflows, versions)
}

async fn run(
    conn: &mut AsyncPgConnection,
    tenant: &str,
    workflow_id: Uuid,
    event: Option<Uuid>,
) -> Option<store::WorkflowExecution> {
    let input = json!({ "order": { "id": 7 } });
    store::create_execution(
        conn,
        &NewExecution {
            tenant_id: tenant,
            workflow_id,
            trigger_kind: if event.is_some() {
                TriggerKind::Event
            } else {
                TriggerKind::Manual
            },
            input: &input,
            trigger_event_id: event,
            allow_external_callouts: true,
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn an_invalid_definition_writes_nothing_and_names_the_block() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    // Valid JSON shape, but the if block's output `maybe` does not exist.
    let definition = WorkflowDefinition::from_value(json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "check", "type": "if", "params": { "condition":
                { "left": { "var": "input.amount" }, "op": "gt", "right": 1 } } },
            { "id": "note", "type": "log", "params": { "message": "hi" } }
        ],
        "edges": [
            { "from": "start", "to": "check" },
            { "from": "check", "to": "note", "label": "maybe" }
        ]
    }))
    .unwrap();

    let err = store::save_workflow(&mut conn, "t1", "broken", WorkflowStatus::Live, &definition)
        .await
        .unwrap_err();

    let StoreError::Definition(definition_error) = &err else {
        panic!("expected a definition error, got {err:?}");
    };
    match definition_error.as_ref() {
        DefinitionError::UnknownLabel { from, label, .. } => {
            assert_eq!(from, "check");
            assert_eq!(label, "maybe");
        }
        other => panic!("expected an unknown-label definition error, got {other:?}"),
    }
    assert!(err.to_string().contains("\"check\""), "{err}");
    assert_eq!(count_workflows(&mut conn).await, (0, 0));
}

#[tokio::test]
async fn saving_a_live_workflow_twice_keeps_running_executions_on_their_version() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;

    let first = store::save_workflow(
        &mut conn,
        "t1",
        "orders",
        WorkflowStatus::Live,
        &manual_workflow("first"),
    )
    .await
    .unwrap();
    assert_eq!((first.version, first.new_version), (1, true));
    assert_eq!(first.workflow.status, WorkflowStatus::Live);
    let id = first.workflow.id;

    let execution = run(&mut conn, "t1", id, None).await.unwrap();
    assert_eq!(execution.status, ExecutionStatus::Queued);
    assert_eq!(execution.workflow_version, 1);

    let second = store::save_workflow(
        &mut conn,
        "t1",
        "orders",
        WorkflowStatus::Live,
        &manual_workflow("second"),
    )
    .await
    .unwrap();
    assert_eq!(second.workflow.id, id);
    assert_eq!((second.version, second.new_version), (2, true));
    assert_eq!(second.workflow.current_version, 2);

    // The run in flight still loads what it started on.
    let stored = store::get_execution(&mut conn, execution.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.workflow_version, 1);
    let old = store::load_version(&mut conn, id, stored.workflow_version)
        .await
        .unwrap();
    assert_eq!(log_message(&old), json!("first"));
    let new = store::load_version(&mut conn, id, 2).await.unwrap();
    assert_eq!(log_message(&new), json!("second"));
    // A new run starts on version 2.
    assert_eq!(
        run(&mut conn, "t1", id, None)
            .await
            .unwrap()
            .workflow_version,
        2
    );

    let missing = store::load_version(&mut conn, id, 3).await.unwrap_err();
    assert!(
        matches!(missing, StoreError::VersionNotFound { version: 3, .. }),
        "{missing:?}"
    );
}

// Break checked: without the lock of the version's row in `save_over`,
// the save does not wait, overwrites version 1 under the run and answers
// (1, false).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_save_waits_for_a_run_being_created_on_it_and_then_appends_a_version() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let first = store::save_workflow(
        &mut conn,
        "t1",
        "draft",
        WorkflowStatus::Draft,
        &manual_workflow("a"),
    )
    .await
    .unwrap();
    // A test run of the draft, created in a transaction not yet committed.
    let mut creating = db.conn().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut creating,
        &format!(
            "BEGIN; INSERT INTO workflow_execution
                 (tenant_id, workflow_id, workflow_version, trigger_kind, input)
             VALUES ('t1', '{}', 1, 'manual', '{{}}')",
            first.workflow.id
        ),
    )
    .await
    .unwrap();
    let saving = {
        let mut conn = db.conn().await;
        tokio::spawn(async move {
            store::save_workflow(
                &mut conn,
                "t1",
                "draft",
                WorkflowStatus::Draft,
                &manual_workflow("b"),
            )
            .await
            .unwrap()
        })
    };
    outbox_test_support::eventually(
        "the save to wait on a lock, or to end",
        std::time::Duration::from_secs(30),
        async || saving.is_finished() || db.waits_on_a_lock("%FOR UPDATE%").await,
    )
    .await;
    diesel_async::SimpleAsyncConnection::batch_execute(&mut creating, "COMMIT")
        .await
        .unwrap();
    let saved = saving.await.unwrap();
    assert_eq!(
        (saved.version, saved.new_version),
        (2, true),
        "the run's version is not overwritten"
    );
    let pinned = store::load_version(&mut conn, first.workflow.id, 1)
        .await
        .unwrap();
    assert_eq!(log_message(&pinned), json!("a"));
}

#[tokio::test]
async fn a_draft_is_overwritten_until_a_run_uses_it_then_publishing_keeps_the_version() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let save = async |conn: &mut AsyncPgConnection, message: &str, status| {
        store::save_workflow(conn, "t1", "draft", status, &manual_workflow(message))
            .await
            .unwrap()
    };

    let first = save(&mut conn, "a", WorkflowStatus::Draft).await;
    let second = save(&mut conn, "b", WorkflowStatus::Draft).await;
    assert_eq!((second.version, second.new_version), (1, false));
    let loaded = store::load_version(&mut conn, first.workflow.id, 1)
        .await
        .unwrap();
    assert_eq!(log_message(&loaded), json!("b"));

    // A test run of the draft pins version 1: the next draft save appends.
    run(&mut conn, "t1", first.workflow.id, None).await.unwrap();
    let third = save(&mut conn, "c", WorkflowStatus::Draft).await;
    assert_eq!((third.version, third.new_version), (2, true));

    let published = store::publish(&mut conn, "t1", first.workflow.id)
        .await
        .unwrap();
    assert_eq!(published.status, WorkflowStatus::Live);
    assert_eq!(published.current_version, 2);
    let back = store::set_status(&mut conn, "t1", first.workflow.id, WorkflowStatus::Draft)
        .await
        .unwrap();
    assert_eq!(back.status, WorkflowStatus::Draft);

    let other_tenant = store::publish(&mut conn, "t2", first.workflow.id)
        .await
        .unwrap_err();
    assert!(
        matches!(other_tenant, StoreError::WorkflowNotFound { .. }),
        "{other_tenant:?}"
    );
}

#[tokio::test]
async fn live_event_workflows_match_entity_and_event_and_ignore_drafts_and_other_tenants() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let save = async |conn: &mut AsyncPgConnection, tenant, name, status, definition| {
        store::save_workflow(conn, tenant, name, status, &definition)
            .await
            .unwrap()
    };
    let live = WorkflowStatus::Live;
    let wanted = save(
        &mut conn,
        "t1",
        "a-created",
        live,
        event_workflow("order", "row.created", "a"),
    )
    .await;
    let also = save(
        &mut conn,
        "t1",
        "b-created",
        live,
        event_workflow("order", "row.created", "b"),
    )
    .await;
    save(
        &mut conn,
        "t1",
        "updated",
        live,
        event_workflow("order", "row.updated", "x"),
    )
    .await;
    save(
        &mut conn,
        "t1",
        "invoice",
        live,
        event_workflow("invoice", "row.created", "x"),
    )
    .await;
    save(
        &mut conn,
        "t1",
        "draft",
        WorkflowStatus::Draft,
        event_workflow("order", "row.created", "x"),
    )
    .await;
    save(&mut conn, "t1", "manual", live, manual_workflow("x")).await;
    save(
        &mut conn,
        "t2",
        "a-created",
        live,
        event_workflow("order", "row.created", "x"),
    )
    .await;

    let matched = store::live_event_workflows(&mut conn, "t1", "order", "row.created")
        .await
        .unwrap();
    let ids: Vec<Uuid> = matched.iter().map(|m| m.workflow.id).collect();
    assert_eq!(ids, vec![wanted.workflow.id, also.workflow.id]);
    assert!(
        matched
            .iter()
            .all(|m| m.workflow.tenant_id == "t1" && m.version == 1)
    );

    // A new live version is what matches from then on.
    save(
        &mut conn,
        "t1",
        "b-created",
        live,
        event_workflow("order", "order.shipped", "b2"),
    )
    .await;
    let matched = store::live_event_workflows(&mut conn, "t1", "order", "row.created")
        .await
        .unwrap();
    assert_eq!(matched.len(), 1);
    let shipped = store::live_event_workflows(&mut conn, "t1", "order", "order.shipped")
        .await
        .unwrap();
    assert_eq!(shipped.len(), 1);
    assert_eq!(
        (shipped[0].workflow.id, shipped[0].version),
        (also.workflow.id, 2)
    );

    assert!(
        store::live_event_workflows(&mut conn, "t3", "order", "row.created")
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_redelivered_trigger_event_starts_each_workflow_once() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let live = WorkflowStatus::Live;
    let a = store::save_workflow(
        &mut conn,
        "t1",
        "a",
        live,
        &event_workflow("order", "row.created", "a"),
    )
    .await
    .unwrap();
    let b = store::save_workflow(
        &mut conn,
        "t1",
        "b",
        live,
        &event_workflow("order", "row.created", "b"),
    )
    .await
    .unwrap();
    let event = Uuid::new_v4();

    let first = run(&mut conn, "t1", a.workflow.id, Some(event)).await;
    assert_eq!(
        first.as_ref().map(|e| e.trigger_event_id),
        Some(Some(event))
    );
    assert!(
        run(&mut conn, "t1", a.workflow.id, Some(event))
            .await
            .is_none()
    );
    // The same event still starts another workflow, and runs without an
    // event are not limited.
    assert!(
        run(&mut conn, "t1", b.workflow.id, Some(event))
            .await
            .is_some()
    );
    assert!(run(&mut conn, "t1", a.workflow.id, None).await.is_some());
    assert!(run(&mut conn, "t1", a.workflow.id, None).await.is_some());

    let of_a: i64 = workflow_execution::table
        .filter(workflow_execution::workflow_id.eq(a.workflow.id))
        .filter(workflow_execution::trigger_event_id.eq(event))
        .count()
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(of_a, 1);

    let listed = store::list_executions(
        &mut conn,
        &ExecutionFilter {
            tenant_id: Some("t1"),
            workflow_id: None,
            statuses: &[ExecutionStatus::Queued],
            limit: None,
            after: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(listed.len(), 4);
    assert!(
        listed
            .windows(2)
            .all(|w| w[0].created_at >= w[1].created_at)
    );
    let running = store::list_executions(
        &mut conn,
        &ExecutionFilter {
            statuses: &[ExecutionStatus::Running],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(running.is_empty());
    let elsewhere = store::list_executions(
        &mut conn,
        &ExecutionFilter {
            tenant_id: Some("t2"),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(elsewhere.is_empty());

    let foreign = store::create_execution(
        &mut conn,
        &NewExecution {
            tenant_id: "t2",
            workflow_id: a.workflow.id,
            trigger_kind: TriggerKind::Api,
            input: &json!({}),
            trigger_event_id: None,
            allow_external_callouts: true,
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(foreign, StoreError::WorkflowNotFound { .. }),
        "{foreign:?}"
    );
}

#[tokio::test]
async fn a_waiting_execution_must_name_its_block_and_only_a_waiting_one() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let saved = store::save_workflow(
        &mut conn,
        "t1",
        "w",
        WorkflowStatus::Live,
        &manual_workflow("x"),
    )
    .await
    .unwrap();
    let execution = run(&mut conn, "t1", saved.workflow.id, None).await.unwrap();
    let set = |status: &'static str, block: Option<&'static str>| {
        diesel::update(workflow_execution::table.find(execution.id)).set((
            workflow_execution::status.eq(status),
            workflow_execution::waiting_block.eq(block),
        ))
    };
    let check_violation = |result: Result<usize, diesel::result::Error>| match result {
        Err(diesel::result::Error::DatabaseError(_, info)) => {
            assert_eq!(
                info.constraint_name(),
                Some("workflow_execution_waiting_check")
            );
        }
        other => panic!("expected the waiting check to refuse, got {other:?}"),
    };

    check_violation(set("waiting", None).execute(&mut conn).await);
    check_violation(set("running", Some("note")).execute(&mut conn).await);
    assert_eq!(
        set("waiting", Some("note"))
            .execute(&mut conn)
            .await
            .unwrap(),
        1
    );

    let stored = store::get_execution(&mut conn, execution.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, ExecutionStatus::Waiting);
    assert_eq!(stored.waiting_block.as_deref(), Some("note"));
    assert!(
        store::get_execution(&mut conn, Uuid::new_v4())
            .await
            .unwrap()
            .is_none()
    );
}

/// (status, count, oldest) of the executions stuck for over `minutes`.
async fn stuck(conn: &mut AsyncPgConnection, minutes: u64) -> Vec<(ExecutionStatus, i64, Uuid)> {
    store::stuck_executions(conn, std::time::Duration::from_secs(minutes * 60))
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.status, s.count, s.oldest_id))
        .collect()
}

#[tokio::test]
async fn stuck_executions_are_old_queued_or_running_ones_never_waiting_ones() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let saved = store::save_workflow(
        &mut conn,
        "t1",
        "w",
        WorkflowStatus::Live,
        &manual_workflow("x"),
    )
    .await
    .unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            run(&mut conn, "t1", saved.workflow.id, None)
                .await
                .unwrap()
                .id,
        );
    }
    // (status, waiting block, unchanged for this many minutes)
    let states = [
        ("queued", None, 120),
        ("queued", None, 50),
        ("running", None, 60),
        ("waiting", Some("note"), 180),
        ("queued", None, 0),
    ];
    for (id, (status, block, minutes)) in ids.iter().zip(states) {
        diesel::sql_query(
            "UPDATE workflow_execution SET status = $2, waiting_block = $3,
                    updated_at = now() - make_interval(mins => $4) WHERE id = $1",
        )
        .bind::<diesel::sql_types::Uuid, _>(id)
        .bind::<diesel::sql_types::Text, _>(status)
        .bind::<diesel::sql_types::Nullable<diesel::sql_types::Text>, _>(block)
        .bind::<diesel::sql_types::Integer, _>(minutes)
        .execute(&mut conn)
        .await
        .unwrap();
    }

    assert_eq!(
        stuck(&mut conn, 30).await,
        [
            (ExecutionStatus::Queued, 2, ids[0]),
            (ExecutionStatus::Running, 1, ids[2]),
        ]
    );
    assert_eq!(
        stuck(&mut conn, 90).await,
        [(ExecutionStatus::Queued, 1, ids[0])]
    );
    assert_eq!(stuck(&mut conn, 600).await, []);

    let queued = ExecutionFilter {
        statuses: &[ExecutionStatus::Queued],
        limit: Some(1),
        ..Default::default()
    };
    assert_eq!(
        store::count_executions(&mut conn, &queued).await.unwrap(),
        3
    );
    // The bounded count: exact up to its cap, None past it.
    for (cap, counted) in [(3, Some(3)), (5, Some(3)), (2, None), (0, None)] {
        assert_eq!(
            store::count_executions_up_to(&mut conn, &queued, cap)
                .await
                .unwrap(),
            counted,
            "cap {cap}"
        );
    }
    assert_eq!(
        store::list_executions(&mut conn, &queued)
            .await
            .unwrap()
            .len(),
        1
    );
    let of_other = ExecutionFilter {
        workflow_id: Some(Uuid::new_v4()),
        ..Default::default()
    };
    assert_eq!(
        store::count_executions(&mut conn, &of_other).await.unwrap(),
        0
    );
}

#[tokio::test]
async fn workflows_are_listed_by_tenant_and_name_and_read_by_id_with_their_definitions_as_saved() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    for (tenant, name) in [("t2", "alpha"), ("t1", "zeta"), ("t1", "beta")] {
        store::save_workflow(
            &mut conn,
            tenant,
            name,
            WorkflowStatus::Draft,
            &manual_workflow(name),
        )
        .await
        .unwrap();
    }
    let names = |workflows: Vec<store::Workflow>| -> Vec<(String, String)> {
        workflows
            .into_iter()
            .map(|w| (w.tenant_id, w.name))
            .collect()
    };
    let all = store::list_workflows(&mut conn, None, 10).await.unwrap();
    let first = all[0].clone();
    assert_eq!(
        names(all),
        [("t1", "beta"), ("t1", "zeta"), ("t2", "alpha")]
            .map(|(t, n)| (t.to_owned(), n.to_owned()))
    );
    assert_eq!(
        names(
            store::list_workflows(&mut conn, Some("t2"), 10)
                .await
                .unwrap()
        ),
        [("t2".to_owned(), "alpha".to_owned())]
    );
    assert_eq!(
        store::list_workflows(&mut conn, None, 1)
            .await
            .unwrap()
            .len(),
        1
    );

    assert_eq!(
        store::get_workflow(&mut conn, first.id).await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        store::get_workflow(&mut conn, Uuid::now_v7())
            .await
            .unwrap(),
        None
    );
    let definition = store::version_definition(&mut conn, first.id, 1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(definition["blocks"][1]["params"]["message"], json!("beta"));
    assert_eq!(
        store::version_definition(&mut conn, first.id, 2)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn executions_page_newest_first_by_keyset_without_repeating_or_skipping_one() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let saved = store::save_workflow(
        &mut conn,
        "t1",
        "paged",
        WorkflowStatus::Live,
        &manual_workflow("paged"),
    )
    .await
    .unwrap();
    for _ in 0..23 {
        run(&mut conn, "t1", saved.workflow.id, None).await.unwrap();
    }
    // Three runs at each instant: the id orders the runs of one instant.
    diesel::sql_query(
        "UPDATE workflow_execution SET created_at = timestamptz '2026-12-01 10:00:00+00'
             + (SELECT count(*) FROM workflow_execution o WHERE o.id < workflow_execution.id) / 3
               * interval '1 second'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let all = store::list_executions(&mut conn, &ExecutionFilter::default())
        .await
        .unwrap();
    let mut expected: Vec<(chrono::DateTime<chrono::Utc>, Uuid)> =
        all.iter().map(|e| (e.created_at, e.id)).collect();
    expected.sort_by(|a, b| b.cmp(a));

    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = store::list_executions(
            &mut conn,
            &ExecutionFilter {
                workflow_id: Some(saved.workflow.id),
                limit: Some(5),
                after,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert!(page.len() <= 5);
        let Some(last) = page.last() else { break };
        after = Some(ExecutionPosition::of(last));
        paged.extend(page.iter().map(|e| (e.created_at, e.id)));
    }
    assert_eq!(paged.len(), 23);
    assert_eq!(paged, expected);
}

#[derive(QueryableByName, Debug)]
struct ReadByThisTransaction {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    seq_tup_read: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    idx_tup_fetch: i64,
}

/// A page of executions, and the rows of `workflow_execution` it read: by
/// sequential scans, and fetched along indexes.
async fn page_and_rows_read(
    conn: &mut AsyncPgConnection,
    filter: &ExecutionFilter<'_>,
) -> (usize, ReadByThisTransaction) {
    use diesel_async::AsyncConnection;
    // The backend's figures not yet sent to the statistics (those of its
    // earlier statements too): read before and after, the difference is
    // the listing's.
    let figures = "SELECT seq_tup_read, COALESCE(idx_tup_fetch, 0) AS idx_tup_fetch
                   FROM pg_stat_xact_user_tables WHERE relname = 'workflow_execution'";
    conn.transaction::<_, StoreError, _>(async |conn| {
        let before: ReadByThisTransaction = diesel::sql_query(figures).get_result(conn).await?;
        let page = store::list_executions(conn, filter).await?;
        let after: ReadByThisTransaction = diesel::sql_query(figures).get_result(conn).await?;
        Ok((
            page.len(),
            ReadByThisTransaction {
                seq_tup_read: after.seq_tup_read - before.seq_tup_read,
                idx_tup_fetch: after.idx_tup_fetch - before.idx_tup_fetch,
            },
        ))
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_page_of_the_newest_runs_reads_about_a_page_of_rows_with_or_without_a_tenant_not_every_run()
 {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let mut workflows = Vec::new();
    for (tenant, name) in [("t1", "first"), ("t2", "second")] {
        let saved = store::save_workflow(
            &mut conn,
            tenant,
            name,
            WorkflowStatus::Live,
            &manual_workflow(name),
        )
        .await
        .unwrap();
        workflows.push(saved.workflow.id);
        // 3,000 runs a second apart.
        diesel::sql_query(format!(
            "INSERT INTO workflow_execution (tenant_id, workflow_id, workflow_version, trigger_kind, input, created_at)
             SELECT '{tenant}', '{id}', (SELECT max(version) FROM workflow_version WHERE workflow_id = '{id}'),
                    'manual', '{{}}', now() - g * interval '1 second'
             FROM generate_series(1, 3000) AS g",
            id = saved.workflow.id
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    diesel::sql_query("ANALYZE workflow_execution")
        .execute(&mut conn)
        .await
        .unwrap();

    let second_page_of = |filter: ExecutionFilter<'static>, after| ExecutionFilter {
        after: Some(after),
        ..filter
    };
    for (what, filter) in [
        ("every run", ExecutionFilter::default()),
        (
            "one workflow's",
            ExecutionFilter {
                workflow_id: Some(workflows[1]),
                ..Default::default()
            },
        ),
        (
            "one tenant's",
            ExecutionFilter {
                tenant_id: Some("t2"),
                ..Default::default()
            },
        ),
    ] {
        let filter = ExecutionFilter {
            limit: Some(50),
            ..filter
        };
        let (shown, read) = page_and_rows_read(&mut conn, &filter).await;
        assert_eq!(shown, 50, "{what}");
        assert!(
            read.seq_tup_read == 0 && read.idx_tup_fetch <= 100,
            "{what}: a page of 50 of 6,000 runs read {read:?}"
        );
        let first = store::list_executions(&mut conn, &filter).await.unwrap();
        let next = second_page_of(filter, ExecutionPosition::of(first.last().unwrap()));
        let (shown, read) = page_and_rows_read(&mut conn, &next).await;
        assert_eq!(shown, 50, "{what}, second page");
        assert!(
            read.seq_tup_read == 0 && read.idx_tup_fetch <= 100,
            "{what}: the second page of 50 of 6,000 runs read {read:?}"
        );
    }
}
