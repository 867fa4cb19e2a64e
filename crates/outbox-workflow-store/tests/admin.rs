//! `outbox_workflow_store::admin` and the store's lookups on real Postgres: a
//! workflow named by id or by name within its tenant, and a save that
//! keeps the workflow's status unless told otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use outbox_test_support::TestDatabase;
use outbox_workflow_store::admin::{self, AdminError};
use outbox_workflow_store::{self as store, StoreError, WorkflowRef, WorkflowStatus};

const LOGS: &str = r#"{
  "blocks": [
    { "id": "start", "type": "manualTrigger" },
    { "id": "note", "type": "log", "params": { "message": "hello" } }
  ],
  "edges": [{ "from": "start", "to": "note" }]
}"#;

#[tokio::test]
async fn a_workflow_is_found_by_id_or_name_within_its_tenant_only() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let saved = admin::save_document(&mut conn, "t1", "approval", None, LOGS)
        .await
        .unwrap();
    let id = saved.workflow.id;
    // A workflow whose name reads as a UUID is still found by that name.
    let odd_name = uuid::Uuid::new_v4().to_string();
    let odd = admin::save_document(&mut conn, "t1", &odd_name, None, LOGS)
        .await
        .unwrap();

    for (reference, expected) in [
        ("approval".parse::<WorkflowRef>().unwrap(), id),
        (id.to_string().parse().unwrap(), id),
        (odd_name.parse().unwrap(), odd.workflow.id),
    ] {
        let found = store::find_workflow(&mut conn, "t1", &reference)
            .await
            .unwrap();
        assert_eq!(found.id, expected, "{reference}");
    }
    for reference in [WorkflowRef::Id(id), WorkflowRef::Name("approval".into())] {
        let refused = store::find_workflow(&mut conn, "t2", &reference).await;
        assert!(
            matches!(&refused, Err(StoreError::WorkflowNotFoundByRef { tenant_id, .. }) if tenant_id == "t2"),
            "{refused:?}"
        );
        let refused = admin::publish_workflow(&mut conn, "t2", &reference).await;
        assert!(
            refused.as_ref().is_err_and(AdminError::is_refusal),
            "{refused:?}"
        );
    }
}

#[tokio::test]
async fn a_save_without_a_status_keeps_the_workflow_s_and_a_new_workflow_is_a_draft() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let first = admin::save_document(&mut conn, "t1", "approval", None, LOGS)
        .await
        .unwrap();
    assert_eq!(first.workflow.status, WorkflowStatus::Draft);
    let live = admin::save_document(
        &mut conn,
        "t1",
        "approval",
        Some(WorkflowStatus::Live),
        LOGS,
    )
    .await
    .unwrap();
    assert_eq!(
        (live.workflow.status, live.version),
        (WorkflowStatus::Live, 2)
    );
    let kept = admin::save_document(&mut conn, "t1", "approval", None, LOGS)
        .await
        .unwrap();
    assert_eq!(
        (kept.workflow.status, kept.version),
        (WorkflowStatus::Live, 3)
    );

    let refused =
        admin::save_document(&mut conn, "t1", "approval", None, "{ \"blocks\": [] }").await;
    assert!(
        matches!(&refused, Err(AdminError::Definition(_)))
            && refused.as_ref().is_err_and(AdminError::is_refusal),
        "{refused:?}"
    );
    let (_, versions) =
        admin::list_versions(&mut conn, "t1", &WorkflowRef::Name("approval".into()))
            .await
            .unwrap();
    let listed: Vec<(i32, bool)> = versions.iter().map(|v| (v.version, v.current)).collect();
    assert_eq!(listed, [(1, false), (2, false), (3, true)]);
}

// A publish committing while a save without a status runs must not be
// undone by the save writing back the status it read before.
// Break checked: the status read without `FOR UPDATE` in
// `admin::save_document` leaves the workflow a draft: left Draft, right Live.
#[tokio::test]
async fn a_save_without_a_status_keeps_a_publish_that_commits_while_it_runs() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    admin::save_document(&mut conn, "t1", "approval", None, LOGS)
        .await
        .unwrap();
    // A publish, not committed yet.
    let mut publishing = db.conn().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut publishing,
        "BEGIN; UPDATE workflow SET status = 'live' WHERE tenant_id = 't1' AND name = 'approval'",
    )
    .await
    .unwrap();
    let saving = {
        let mut conn = db.conn().await;
        tokio::spawn(async move {
            admin::save_document(&mut conn, "t1", "approval", None, LOGS)
                .await
                .unwrap()
        })
    };
    outbox_test_support::eventually(
        "the save to wait on the publish's lock, or to end",
        std::time::Duration::from_secs(30),
        async || saving.is_finished() || db.waits_on_a_lock("%workflow%").await,
    )
    .await;
    diesel_async::SimpleAsyncConnection::batch_execute(&mut publishing, "COMMIT")
        .await
        .unwrap();

    let saved = saving.await.unwrap();
    assert_eq!(saved.workflow.status, WorkflowStatus::Live);
    let found = store::find_workflow(&mut conn, "t1", &"approval".parse().unwrap())
        .await
        .unwrap();
    assert_eq!(found.status, WorkflowStatus::Live);
}
