//! One writer per run, on real Postgres and a real HTTP peer: a run held by
//! a live lease is left alone, two jobs at once make one call, a holder
//! that died is followed by exactly one repeat of its claimed call (same
//! idempotency key), a continuation that finds its run `running` resumes
//! it, a holder whose lease was taken over writes nothing, and the sweep
//! requests one resume per dead holder.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod runs;

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_model::schema::{outbox_event, workflow_block_execution};
use outbox_test_support::{HttpSink, TestDatabase};
use outbox_workflow_model::events::{ContinueKind, EXECUTION_REQUESTED};
use outbox_workflow_runner::{
    AddressPolicy, IDEMPOTENCY_KEY_HEADER, RunOutcome, Runner, idempotency_key,
};
use outbox_workflow_store::ExecutionStatus;
use outbox_workflow_store::sweep;
use runs::{block_rows, execution, queued};
use serde_json::{Value, json};
use uuid::Uuid;

/// A runner that may call the local sink, holding runs for `lease`.
fn runner(lease: Duration) -> Runner {
    Runner::with_address_policy(AddressPolicy::AllowInternal)
        .unwrap()
        .with_lease(lease)
}

/// manualTrigger → httpRequest(url, 2 s limit) → log.
fn call_workflow(url: &str) -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "call", "type": "httpRequest", "params": {
                "method": "POST", "url": url, "body": { "var": "input" }, "timeoutMs": 2000 } },
            { "id": "after", "type": "log", "params": { "message": "called" } }
        ],
        "edges": [{ "from": "start", "to": "call" }, { "from": "call", "to": "after" }]
    })
}

/// manualTrigger → waitForInput → (input) httpRequest(url) → log.
fn answered_call_workflow(url: &str) -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "ask", "type": "waitForInput", "params": { "prompt": "ok?" } },
            { "id": "call", "type": "httpRequest", "params": {
                "method": "POST", "url": url, "timeoutMs": 2000 } },
            { "id": "after", "type": "log", "params": { "message": "called" } }
        ],
        "edges": [
            { "from": "start", "to": "ask" },
            { "from": "ask", "to": "call", "label": "input" },
            { "from": "call", "to": "after" }
        ]
    })
}

/// (block, attempt, status) of the execution's `call` block rows.
async fn call_rows(conn: &mut AsyncPgConnection, id: Uuid) -> Vec<(i32, String)> {
    workflow_block_execution::table
        .filter(workflow_block_execution::execution_id.eq(id))
        .filter(workflow_block_execution::block_id.eq("call"))
        .select((
            workflow_block_execution::attempt,
            workflow_block_execution::status,
        ))
        .load(conn)
        .await
        .unwrap()
}

/// Waits until the lease of execution `id` has expired (its dead holder's
/// call limit and lease have passed), by the database's clock.
async fn lease_expired(conn: &mut AsyncPgConnection, id: Uuid) {
    let sql = format!(
        "SELECT count(*) AS n FROM workflow_execution
         WHERE id = '{id}' AND lease_until < clock_timestamp()"
    );
    outbox_test_support::eventually(
        "the run's lease to expire",
        Duration::from_secs(10),
        async || {
            diesel::sql_query(&sql)
                .get_result::<Count>(conn)
                .await
                .unwrap()
                .n
                == 1
        },
    )
    .await;
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Runs a workflow whose call the receiver holds 600 ms and, once the call
/// is in flight, does `meanwhile` on `conn`: what the run returned, and the
/// execution.
async fn while_the_call_is_in_flight(
    db: &TestDatabase,
    conn: &mut AsyncPgConnection,
    meanwhile: impl AsyncFnOnce(&mut AsyncPgConnection, Uuid),
) -> (RunOutcome, Uuid) {
    let sink = HttpSink::start().await;
    sink.respond_after("/slow", Duration::from_millis(600));
    let id = queued(conn, call_workflow(&sink.url_for("/slow")), json!({})).await;
    let (mut holder, runner) = (db.conn().await, runner(Duration::from_secs(30)));
    let (outcome, ()) = tokio::join!(runner.run(&mut holder, id), async {
        sink.wait_for_requests("/slow", 1, Duration::from_secs(10))
            .await;
        meanwhile(conn, id).await;
    });
    (outcome.unwrap(), id)
}

async fn set_lease(conn: &mut AsyncPgConnection, id: Uuid, owner: Uuid, until: &str) {
    conn.batch_execute(&format!(
        "UPDATE workflow_execution SET status = 'running', started_at = now(),
                lease_owner = '{owner}', lease_until = {until} WHERE id = '{id}'"
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn a_run_held_by_a_live_lease_is_left_alone_without_calling() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = HttpSink::start().await;
    let id = queued(&mut conn, call_workflow(&sink.url_for("/hook")), json!({})).await;
    set_lease(&mut conn, id, Uuid::new_v4(), "now() + interval '1 hour'").await;

    let outcome = runner(Duration::from_secs(30)).run(&mut conn, id).await;
    assert_eq!(outcome.unwrap(), RunOutcome::Taken);
    assert!(sink.requests_to("/hook").is_empty(), "no call");
    assert!(block_rows(&mut conn, id).await.is_empty(), "no block ran");
    assert_eq!(
        execution(&mut conn, id).await.status,
        ExecutionStatus::Running
    );
}

#[tokio::test]
async fn two_jobs_advancing_one_run_at_once_make_one_call() {
    let db = TestDatabase::new().await;
    let (mut first, mut second) = (db.conn().await, db.conn().await);
    let sink = HttpSink::start().await;
    sink.respond_after("/slow", Duration::from_millis(800));
    let id = queued(&mut first, call_workflow(&sink.url_for("/slow")), json!({})).await;
    let runner = runner(Duration::from_secs(30));

    let (a, b) = tokio::join!(runner.run(&mut first, id), async {
        // The second job arrives while the first one's call is in flight.
        sink.wait_for_requests("/slow", 1, Duration::from_secs(10))
            .await;
        runner.run(&mut second, id).await
    });
    assert_eq!(a.unwrap(), RunOutcome::Finished(ExecutionStatus::Success));
    assert_eq!(b.unwrap(), RunOutcome::Taken);
    assert_eq!(sink.requests_to("/slow").len(), 1, "one call");
    assert_eq!(call_rows(&mut first, id).await, vec![(1, "success".into())]);
}

#[tokio::test]
async fn a_claimed_call_whose_holder_died_is_made_again_once_with_the_same_idempotency_key() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = HttpSink::start().await;
    sink.respond_after("/slow", Duration::from_millis(1500));
    let id = queued(&mut conn, call_workflow(&sink.url_for("/slow")), json!({})).await;
    let runner = runner(Duration::from_millis(200));

    // The holder dies while its call is in flight: its future is dropped.
    {
        let mut dying = db.conn().await;
        let cut = tokio::time::timeout(Duration::from_millis(500), runner.run(&mut dying, id));
        assert!(
            cut.await.is_err(),
            "the first holder was cut during its call"
        );
    }
    assert_eq!(call_rows(&mut conn, id).await, vec![(1, "running".into())]);
    // Its lease covers the call's limit (2 s) and one lease: until then, a
    // second job leaves the run alone.
    assert_eq!(runner.run(&mut conn, id).await.unwrap(), RunOutcome::Taken);
    assert_eq!(sink.requests_to("/slow").len(), 1);

    sink.respond_after("/slow", Duration::ZERO);
    lease_expired(&mut conn, id).await;
    let outcome = runner.run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    let calls = sink.requests_to("/slow");
    assert_eq!(calls.len(), 2, "the dead holder's call and one repeat");
    let key = idempotency_key(id, "call");
    for call in &calls {
        assert_eq!(call.header(IDEMPOTENCY_KEY_HEADER), Some(key.as_str()));
    }
    assert_eq!(call_rows(&mut conn, id).await, vec![(2, "success".into())]);
}

#[tokio::test]
async fn an_answer_redelivered_after_its_holder_died_resumes_the_run() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = HttpSink::start().await;
    sink.respond_after("/slow", Duration::from_millis(1500));
    let id = queued(
        &mut conn,
        answered_call_workflow(&sink.url_for("/slow")),
        json!({}),
    )
    .await;
    let runner = runner(Duration::from_millis(200));
    assert_eq!(
        runner.run(&mut conn, id).await.unwrap(),
        RunOutcome::Waiting("ask".into())
    );
    let answer = json!({ "ok": true });
    {
        let mut dying = db.conn().await;
        let resume = runner.resume(&mut dying, id, "ask", ContinueKind::Input, &answer);
        let cut = tokio::time::timeout(Duration::from_millis(500), resume);
        assert!(
            cut.await.is_err(),
            "the answer's holder was cut during the call"
        );
    }
    assert_eq!(
        execution(&mut conn, id).await.status,
        ExecutionStatus::Running
    );

    sink.respond_after("/slow", Duration::ZERO);
    lease_expired(&mut conn, id).await;
    // The same answer job, redelivered.
    let outcome = runner
        .resume(&mut conn, id, "ask", ContinueKind::Input, &answer)
        .await
        .unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    assert_eq!(sink.requests_to("/slow").len(), 2);
    let blocks: Vec<String> = block_rows(&mut conn, id)
        .await
        .into_iter()
        .map(|b| b.0)
        .collect();
    assert_eq!(blocks, vec!["start", "ask", "ask", "call", "after"]);
}

#[tokio::test]
async fn a_holder_whose_lease_was_taken_over_records_nothing_of_its_call() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let (outcome, id) = while_the_call_is_in_flight(&db, &mut conn, async |conn, id| {
        // Another job took the run over (as after an expiry).
        set_lease(conn, id, Uuid::new_v4(), "now() + interval '1 hour'").await;
    })
    .await;
    assert_eq!(outcome, RunOutcome::Taken);
    assert_eq!(call_rows(&mut conn, id).await, vec![(1, "running".into())]);
    let run = execution(&mut conn, id).await;
    assert_eq!(run.status, ExecutionStatus::Running);
    assert!(run.finished_at.is_none());
}

/// The resume events the sweep published: (execution, dead holder) of
/// each, read from its dispatch key, oldest first.
async fn resumes(conn: &mut AsyncPgConnection) -> Vec<(String, String)> {
    let keys: Vec<Option<String>> = outbox_event::table
        .filter(outbox_event::event_type.eq(EXECUTION_REQUESTED))
        .filter(outbox_event::dispatch_key.like("wf-resume:%"))
        .select(outbox_event::dispatch_key)
        .order(outbox_event::created_at)
        .load(conn)
        .await
        .unwrap();
    keys.into_iter()
        .map(|key| {
            let key = key.unwrap();
            let parts: Vec<&str> = key.split(':').collect();
            assert_eq!(parts.len(), 4, "{key}");
            (parts[1].to_owned(), parts[2].to_owned())
        })
        .collect()
}

#[tokio::test]
async fn the_sweep_requests_one_resume_per_expired_lease_and_none_for_a_live_one() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = HttpSink::start().await;
    let lease = Duration::from_secs(30);
    let id = queued(&mut conn, call_workflow(&sink.url_for("/hook")), json!({})).await;

    let live = Uuid::new_v4();
    set_lease(&mut conn, id, live, "now() + interval '1 hour'").await;
    let pass = sweep::resume_orphans(&mut conn, lease).await.unwrap();
    assert_eq!((pass.orphaned, pass.published), (0, 0));

    let dead = Uuid::new_v4();
    set_lease(&mut conn, id, dead, "now() - interval '1 second'").await;
    assert_eq!(
        sweep::count_orphaned_runs(&mut conn, lease, Duration::ZERO)
            .await
            .unwrap(),
        1
    );
    let pass = sweep::resume_orphans(&mut conn, lease).await.unwrap();
    assert_eq!((pass.orphaned, pass.published), (1, 1));
    // A second sweep (another worker, or the event still waits): no more.
    let pass = sweep::resume_orphans(&mut conn, lease).await.unwrap();
    assert_eq!((pass.orphaned, pass.published), (1, 0));
    let (run, dead) = (id.to_string(), dead.to_string());
    assert_eq!(resumes(&mut conn).await, vec![(run.clone(), dead.clone())]);

    // The resume's holder died too: one more.
    let next = Uuid::new_v4();
    set_lease(&mut conn, id, next, "now() - interval '1 second'").await;
    sweep::resume_orphans(&mut conn, lease).await.unwrap();
    let next = next.to_string();
    assert_eq!(
        resumes(&mut conn).await,
        vec![(run.clone(), dead), (run.clone(), next.clone())]
    );

    // That holder was only slow: it renewed its lease, then died for good.
    set_lease(
        &mut conn,
        id,
        Uuid::parse_str(&next).unwrap(),
        "now() - interval '10 milliseconds'",
    )
    .await;
    sweep::resume_orphans(&mut conn, lease).await.unwrap();
    assert_eq!(
        resumes(&mut conn).await.last(),
        Some(&(run, next)),
        "a later expiry of the same holder gets its own resume"
    );
    assert_eq!(resumes(&mut conn).await.len(), 3);

    // The resume runs the run to its end; nothing is orphaned after.
    let outcome = runner(lease).run(&mut conn, id).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    assert_eq!(
        sweep::count_orphaned_runs(&mut conn, lease, Duration::ZERO)
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn a_run_never_leased_is_orphaned_once_unchanged_for_longer_than_the_lease() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, call_workflow("http://127.0.0.1:9/"), json!({})).await;
    let lease = Duration::from_secs(60);
    conn.batch_execute(&format!(
        "UPDATE workflow_execution SET status = 'running', updated_at = now() - interval '30 seconds'
         WHERE id = '{id}'"
    ))
    .await
    .unwrap();
    assert_eq!(
        sweep::count_orphaned_runs(&mut conn, lease, Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    conn.batch_execute(&format!(
        "UPDATE workflow_execution SET updated_at = now() - interval '2 minutes' WHERE id = '{id}'"
    ))
    .await
    .unwrap();
    let pass = sweep::resume_orphans(&mut conn, lease).await.unwrap();
    assert_eq!((pass.orphaned, pass.published), (1, 1));
    assert_eq!(
        resumes(&mut conn).await,
        vec![(id.to_string(), "none".to_owned())]
    );
}

#[tokio::test]
async fn a_queued_manual_run_is_orphaned_only_once_taken_by_a_holder_that_died() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let id = queued(&mut conn, call_workflow("http://127.0.0.1:9/"), json!({})).await;
    let lease = Duration::from_secs(60);
    // Never taken, however old: its request event is on its way.
    conn.batch_execute(&format!(
        "UPDATE workflow_execution SET updated_at = now() - interval '1 hour' WHERE id = '{id}'"
    ))
    .await
    .unwrap();
    assert_eq!(
        sweep::count_orphaned_runs(&mut conn, lease, Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    // Taken by a holder that died before starting it.
    let dead = Uuid::new_v4();
    conn.batch_execute(&format!(
        "UPDATE workflow_execution SET lease_owner = '{dead}',
                lease_until = now() - interval '1 second' WHERE id = '{id}'"
    ))
    .await
    .unwrap();
    let pass = sweep::resume_orphans(&mut conn, lease).await.unwrap();
    assert_eq!((pass.orphaned, pass.published), (1, 1));
    assert_eq!(
        resumes(&mut conn).await,
        vec![(id.to_string(), dead.to_string())]
    );
}

// Break checked: with `NEVER_TAKEN_KINDS` naming no real kind, the stream
// run is not orphaned and the first assertion after the two minutes fails.
#[tokio::test]
async fn a_stream_run_never_taken_is_resumed_once_unchanged_for_longer_than_the_lease() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = HttpSink::start().await;
    let lease = Duration::from_secs(60);
    // Created by a bridge that died before taking it.
    let stream = queued(&mut conn, call_workflow(&sink.url_for("/hook")), json!({})).await;
    // Created by a trigger's handler that runs its runs one after another
    // (this one waits behind a slow one): its trigger event asks for it.
    let event = queued(&mut conn, call_workflow(&sink.url_for("/hook")), json!({})).await;
    conn.batch_execute(&format!(
        "UPDATE workflow_execution SET trigger_kind = 'stream',
                updated_at = now() - interval '30 seconds' WHERE id = '{stream}';
         UPDATE workflow_execution SET trigger_kind = 'event',
                updated_at = now() - interval '30 seconds' WHERE id = '{event}'"
    ))
    .await
    .unwrap();
    assert_eq!(
        sweep::count_orphaned_runs(&mut conn, lease, Duration::ZERO)
            .await
            .unwrap(),
        0,
        "not yet: the bridge may still take it"
    );
    conn.batch_execute("UPDATE workflow_execution SET updated_at = now() - interval '2 minutes'")
        .await
        .unwrap();
    let pass = sweep::resume_orphans(&mut conn, lease).await.unwrap();
    assert_eq!((pass.orphaned, pass.published), (1, 1));
    assert_eq!(
        resumes(&mut conn).await,
        vec![(stream.to_string(), "none".to_owned())]
    );
    // The resume runs it to its end.
    let outcome = runner(lease).run(&mut conn, stream).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Success));
    assert_eq!(sink.requests_to("/hook").len(), 1);
}

#[tokio::test]
async fn a_block_claimed_the_most_times_without_a_result_fails_without_calling_again() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let sink = HttpSink::start().await;
    let id = queued(&mut conn, call_workflow(&sink.url_for("/hook")), json!({})).await;
    // Five holders claimed the call and none recorded its result.
    conn.batch_execute(&format!(
        "UPDATE workflow_execution SET status = 'running' WHERE id = '{id}';
         INSERT INTO workflow_block_execution (execution_id, block_id, sequence, status, attempt)
         VALUES ('{id}', 'call', 1, 'running', {})",
        outbox_workflow_runner::MAX_CLAIMS
    ))
    .await
    .unwrap();

    let outcome = runner(Duration::from_secs(30)).run(&mut conn, id).await;
    assert_eq!(
        outcome.unwrap(),
        RunOutcome::Finished(ExecutionStatus::Error)
    );
    assert!(
        sink.requests_to("/hook").is_empty(),
        "not called a sixth time"
    );
    assert_eq!(call_rows(&mut conn, id).await, vec![(6, "error".into())]);
    let error = execution(&mut conn, id).await.error.unwrap();
    assert!(error.contains("claimed 5 times"), "{error}");
}

#[tokio::test]
async fn an_error_no_retry_changes_ends_the_run_instead_of_leaving_it_to_the_sweep() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    // The row block's trigger event would carry more than the outbox takes
    // (1 MiB): the outbox refuses it, and would again on every resume.
    let big = "x".repeat(1_100_000);
    let definition = json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "keep", "type": "rowCreate", "params": {
                "entity": "note", "values": { "text": { "var": "input.text" } } } }
        ],
        "edges": [{ "from": "start", "to": "keep" }]
    });
    let id = queued(&mut conn, definition, json!({ "text": big })).await;

    let outcome = runner(Duration::from_secs(30)).run(&mut conn, id).await;
    assert_eq!(
        outcome.unwrap(),
        RunOutcome::Finished(ExecutionStatus::Error)
    );
    let run = execution(&mut conn, id).await;
    assert!(
        run.error
            .as_deref()
            .unwrap()
            .starts_with("the run cannot go on"),
        "{:?}",
        run.error
    );
    assert_eq!(
        sweep::count_orphaned_runs(&mut conn, Duration::ZERO, Duration::ZERO)
            .await
            .unwrap(),
        0,
        "nothing left for the sweep"
    );
}

#[tokio::test]
async fn a_cancel_records_a_claimed_call_as_an_error_and_its_holder_records_nothing() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let (outcome, id) = while_the_call_is_in_flight(&db, &mut conn, async |conn, id| {
        outbox_workflow_store::cancel_execution(conn, "t1", id, "ops")
            .await
            .unwrap();
    })
    .await;
    assert_eq!(outcome, RunOutcome::Unchanged(ExecutionStatus::Cancelled));
    assert_eq!(call_rows(&mut conn, id).await, vec![(1, "error".into())]);
    let blocks: Vec<String> = block_rows(&mut conn, id)
        .await
        .into_iter()
        .map(|b| b.0)
        .collect();
    assert_eq!(blocks, vec!["start", "call"], "nothing after the call");
}
