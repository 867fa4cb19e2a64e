//! Workflow runs under SIGKILL, with the real binaries: `worker-general` is
//! killed before, during and after an `httpRequest` block's call, in the
//! main path and in the branches a wait's answer or timeout takes, and
//! restarted. Every run reaches its terminal status (resumed by its
//! redelivered job or by the sweep), each mail and row effect happens once,
//! and a call is repeated only when the killed process made it, with the
//! same `Idempotency-Key`. Two live jobs on one run make one call.
//!
//! The workers run with a 1 s run lease and a 300 ms sweep, so a run whose
//! holder died is free again about a second after its last write (a call
//! holds it for its own limit plus the lease), and a 3 s dispatch lease, so
//! rows a killed dispatcher had claimed are claimed again soon.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod workflow_support;

use std::time::Duration;

use common::{GENERAL, MAIL, Stack, Worker};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_model::schema::{outbox_event, workflow_block_execution};
use outbox_queue::{OutboxJob, RedisSettings, push_raw, queues};
use outbox_test_support::{ReceivedRequest, eventually};
use outbox_workflow_model::events::EXECUTION_REQUESTED;
use outbox_workflow_runner::{IDEMPOTENCY_KEY_HEADER, idempotency_key};
use outbox_workflow_store::{ExecutionStatus, WorkflowStatus};
use serde_json::{Value, json};
use uuid::Uuid;
use workflow_support::{
    WAIT, block_rows, continue_run, request_run, save, settled_subjects, stack, successes,
    wait_status,
};

/// The workers' run lease and sweep in these tests, and the dispatcher's
/// lease: a worker killed in a dispatch tick leaves the rows it claimed
/// `PROCESSING` until that lease runs out (5 minutes by default), and the
/// runs' mail events are among them.
const FAST_RECOVERY: [(&str, &str); 3] = [
    ("WORKFLOW_RUN_LEASE_MS", "1000"),
    ("WORKFLOW_SWEEP_INTERVAL_MS", "300"),
    ("OUTBOX_LOCK_TIMEOUT_MS", "3000"),
];

async fn general(stack: &Stack) -> Worker {
    stack.start(GENERAL, &FAST_RECOVERY).await
}

/// Kills `worker` with SIGKILL and waits until it is gone.
async fn kill(mut worker: Worker) {
    worker.signal("KILL");
    worker.wait_exit(WAIT).await;
}

/// manualTrigger → email → rowCreate → httpRequest(`url`) → rowUpdate →
/// email.
fn onboarding(url: &str) -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "hello", "type": "email", "params": {
                "to": ["{{ input.email }}"], "subject": "Step one", "text": "1" } },
            { "id": "account", "type": "rowCreate", "params": {
                "entity": "account", "values": { "email": { "var": "input.email" } } } },
            { "id": "provision", "type": "httpRequest", "params": {
                "method": "POST", "url": url,
                "body": { "var": "blocks.account.output" }, "timeoutMs": 5000 } },
            { "id": "activate", "type": "rowUpdate", "params": {
                "entity": "account", "id": { "var": "blocks.account.output.id" },
                "patch": { "active": true } } },
            { "id": "done", "type": "email", "params": {
                "to": ["{{ input.email }}"], "subject": "Step two", "text": "2" } }
        ],
        "edges": [
            { "from": "start", "to": "hello" },
            { "from": "hello", "to": "account" },
            { "from": "account", "to": "provision" },
            { "from": "provision", "to": "activate" },
            { "from": "activate", "to": "done" }
        ]
    })
}

/// manualTrigger → waitForInput (`timeout_ms`) → `input`: httpRequest to
/// `/answered` then a mail; `timeout`: httpRequest to `/late` then a mail.
fn approval(stack: &Stack, timeout_ms: u64) -> Value {
    json!({
        "blocks": [
            { "id": "start", "type": "manualTrigger" },
            { "id": "ask", "type": "waitForInput",
              "params": { "prompt": "Approve?", "timeoutMs": timeout_ms } },
            { "id": "tell", "type": "httpRequest", "params": {
                "method": "POST", "url": stack.http.url_for("/answered"),
                "body": { "var": "blocks.ask.output.answer" }, "timeoutMs": 5000 } },
            { "id": "thanks", "type": "email", "params": {
                "to": ["boss@example.com"], "subject": "Answered", "text": "thanks" } },
            { "id": "escalate", "type": "httpRequest", "params": {
                "method": "POST", "url": stack.http.url_for("/late"), "timeoutMs": 5000 } },
            { "id": "sorry", "type": "email", "params": {
                "to": ["boss@example.com"], "subject": "No answer", "text": "timed out" } }
        ],
        "edges": [
            { "from": "start", "to": "ask" },
            { "from": "ask", "to": "tell", "label": "input" },
            { "from": "tell", "to": "thanks" },
            { "from": "ask", "to": "escalate", "label": "timeout" },
            { "from": "escalate", "to": "sorry" }
        ]
    })
}

/// Asserts that every call is the block's, with its idempotency key.
fn assert_keyed(calls: &[ReceivedRequest], execution: Uuid, block: &str) {
    let key = idempotency_key(execution, block);
    for call in calls {
        assert_eq!(
            call.header(IDEMPOTENCY_KEY_HEADER),
            Some(key.as_str()),
            "every attempt carries the block's key"
        );
    }
}

/// The attempt count of `block`'s row in execution `id`.
async fn attempts(stack: &Stack, id: Uuid, block: &str) -> i32 {
    let mut conn = stack.db.conn().await;
    workflow_block_execution::table
        .filter(workflow_block_execution::execution_id.eq(id))
        .filter(workflow_block_execution::block_id.eq(block))
        .select(workflow_block_execution::attempt)
        .first(&mut conn)
        .await
        .unwrap()
}

/// The onboarding run's own effects, once each: two mails, one account,
/// active.
async fn assert_onboarding_effects_once(stack: &Stack, id: Uuid) {
    let run = wait_status(stack, id, ExecutionStatus::Success).await;
    assert_eq!(run.error, None);
    assert_eq!(
        block_rows(stack, id).await,
        successes(&["start", "hello", "account", "provision", "activate", "done"])
    );
    assert_eq!(
        settled_subjects(stack, 2).await,
        vec!["Step one", "Step two"],
        "each mail once"
    );
    stack
        .wait_count(
            "SELECT count(*) FROM entity_row WHERE entity = 'account' AND data->>'active' = 'true'",
            1,
        )
        .await;
    stack
        .wait_count(
            "SELECT count(*) FROM entity_row WHERE entity = 'account'",
            1,
        )
        .await;
}

/// A connection holding an open transaction (a lock the test takes), and
/// a wait for a worker's statement to queue behind it.
struct Blocker {
    conn: AsyncPgConnection,
}

impl Blocker {
    async fn hold(stack: &Stack, sql: &str) -> Self {
        let mut conn = stack.db.conn().await;
        conn.batch_execute(&format!("BEGIN; {sql}")).await.unwrap();
        Self { conn }
    }

    /// Waits until a statement of the worker waits for the lock this
    /// blocker holds (`what` says which, for the failure message).
    async fn wait_for_waiter(stack: &Stack, what: &str) {
        let sql = "SELECT count(*) FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
        eventually(
            &format!("a statement waiting on {what}"),
            WAIT,
            async || {
                let mut conn = stack.db.conn().await;
                let n: i64 = diesel::sql_query(sql)
                    .get_result::<Count>(&mut conn)
                    .await
                    .unwrap()
                    .count;
                n >= 1
            },
        )
        .await;
    }

    async fn release(mut self) {
        self.conn.batch_execute("ROLLBACK").await.unwrap();
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    count: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_a_call_the_run_finishes_and_repeats_the_call_once_with_its_key() {
    let stack = stack().await;
    stack.http.respond_after("/slow", Duration::from_secs(30));
    let workflow = save(
        &stack,
        "onboarding",
        WorkflowStatus::Live,
        onboarding(&stack.http.url_for("/slow")),
    )
    .await;
    let worker = general(&stack).await;
    let _mail = stack.start(MAIL, &[]).await;

    let id = request_run(&stack, workflow, json!({ "email": "ada@example.com" })).await;
    // The call is in flight: the blocks before it have committed.
    stack.http.wait_for_requests("/slow", 1, WAIT).await;
    kill(worker).await;
    stack.http.respond_after("/slow", Duration::ZERO);
    let _general = general(&stack).await;

    assert_onboarding_effects_once(&stack, id).await;
    // The call is the one effect at least once: the killed process made
    // it, and the next holder made it again, under the same key.
    let calls = stack.http.requests_to("/slow");
    assert_eq!(calls.len(), 2);
    assert_keyed(&calls, id, "provision");
    assert_eq!(attempts(&stack, id, "provision").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_a_call_answered_before_it_was_recorded_the_call_is_repeated_once() {
    let stack = stack().await;
    stack
        .http
        .respond_after("/crm", Duration::from_millis(1500));
    let workflow = save(
        &stack,
        "onboarding",
        WorkflowStatus::Live,
        onboarding(&stack.http.url_for("/crm")),
    )
    .await;
    let worker = general(&stack).await;
    let _mail = stack.start(MAIL, &[]).await;

    let id = request_run(&stack, workflow, json!({ "email": "ada@example.com" })).await;
    stack.http.wait_for_requests("/crm", 1, WAIT).await;
    // While the receiver holds the answer, lock the run: the worker gets
    // the answer and waits to record it.
    let blocker = Blocker::hold(
        &stack,
        &format!("SELECT 1 FROM workflow_execution WHERE id = '{id}' FOR UPDATE"),
    )
    .await;
    Blocker::wait_for_waiter(&stack, "the run's row").await;
    kill(worker).await;
    blocker.release().await;
    stack.http.respond_after("/crm", Duration::ZERO);
    let _general = general(&stack).await;

    assert_onboarding_effects_once(&stack, id).await;
    let calls = stack.http.requests_to("/crm");
    assert_eq!(calls.len(), 2, "answered once, recorded never: made again");
    assert_keyed(&calls, id, "provision");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_before_a_call_the_run_finishes_and_makes_the_call_once() {
    let stack = stack().await;
    let workflow = save(
        &stack,
        "onboarding",
        WorkflowStatus::Live,
        onboarding(&stack.http.url_for("/crm")),
    )
    .await;
    let worker = general(&stack).await;
    let _mail = stack.start(MAIL, &[]).await;

    // The block before the call waits for its insert: the run is taken, its
    // first blocks committed, the call not yet claimed.
    let blocker = Blocker::hold(&stack, "LOCK TABLE entity_row IN SHARE MODE").await;
    let id = request_run(&stack, workflow, json!({ "email": "ada@example.com" })).await;
    Blocker::wait_for_waiter(&stack, "entity_row").await;
    kill(worker).await;
    blocker.release().await;
    let _general = general(&stack).await;

    assert_onboarding_effects_once(&stack, id).await;
    let calls = stack.http.requests_to("/crm");
    assert_eq!(calls.len(), 1, "the killed process never made it");
    assert_keyed(&calls, id, "provision");
    assert_eq!(attempts(&stack, id, "provision").await, 1);
}

/// The approval workflow saved live with `timeout_ms`, both workers
/// started, and a run requested: (worker-general, worker-mail, the run).
async fn approval_run(stack: &Stack, timeout_ms: u64) -> (Worker, Worker, Uuid) {
    let workflow = save(
        stack,
        "approval",
        WorkflowStatus::Live,
        approval(stack, timeout_ms),
    )
    .await;
    let general = general(stack).await;
    let mail = stack.start(MAIL, &[]).await;
    let id = request_run(stack, workflow, json!({})).await;
    (general, mail, id)
}

/// An approval run answered `approved: true`, its branch's receiver holding
/// the call for `hold`: (worker-general, worker-mail, the run).
async fn answered_run(stack: &Stack, hold: Duration) -> (Worker, Worker, Uuid) {
    stack.http.respond_after("/answered", hold);
    let (general, mail, id) = approval_run(stack, 60_000).await;
    wait_status(stack, id, ExecutionStatus::Waiting).await;
    continue_run(stack, id, json!({ "approved": true }))
        .await
        .unwrap();
    (general, mail, id)
}

/// One branch of the approval workflow: the path its call goes to, its
/// block, the mail after it, and the other branch's path.
struct Branch {
    path: &'static str,
    block: &'static str,
    after: &'static str,
    mail: &'static str,
    other: &'static str,
}

/// The branch an answer takes.
const ANSWERED: Branch = Branch {
    path: "/answered",
    block: "tell",
    after: "thanks",
    mail: "Answered",
    other: "/late",
};

/// The branch a timeout takes.
const TIMED_OUT: Branch = Branch {
    path: "/late",
    block: "escalate",
    after: "sorry",
    mail: "No answer",
    other: "/answered",
};

/// Kills worker-general while the call of `branch` is in flight (the
/// receiver holds it), restarts it, and checks that the run finished along
/// that branch with the call made twice under its key.
async fn kill_during_the_branch_call(
    stack: &Stack,
    general_worker: Worker,
    id: Uuid,
    branch: &Branch,
) {
    kill_in_the_branch_call(stack, general_worker, id, branch, Moment::During).await;
}

/// When a kill lands in a call.
enum Moment {
    /// The receiver holds the call.
    During,
    /// The receiver answered; the worker waits to record the answer (the
    /// run's row is locked).
    Answered,
}

/// As [`kill_during_the_branch_call`], the kill landing at `moment`.
async fn kill_in_the_branch_call(
    stack: &Stack,
    general_worker: Worker,
    id: Uuid,
    branch: &Branch,
    moment: Moment,
) {
    stack.http.wait_for_requests(branch.path, 1, WAIT).await;
    match moment {
        Moment::During => kill(general_worker).await,
        Moment::Answered => {
            let blocker = Blocker::hold(
                stack,
                &format!("SELECT 1 FROM workflow_execution WHERE id = '{id}' FOR UPDATE"),
            )
            .await;
            Blocker::wait_for_waiter(stack, "the run's row").await;
            kill(general_worker).await;
            blocker.release().await;
        }
    }
    stack.http.respond_after(branch.path, Duration::ZERO);
    let _general = general(stack).await;

    let run = wait_status(stack, id, ExecutionStatus::Success).await;
    assert_eq!(run.error, None);
    let blocks: Vec<String> = block_rows(stack, id)
        .await
        .into_iter()
        .map(|(block, _, _)| block)
        .collect();
    assert_eq!(
        blocks,
        vec!["start", "ask", "ask", branch.block, branch.after]
    );
    assert_eq!(settled_subjects(stack, 1).await, vec![branch.mail]);
    let calls = stack.http.requests_to(branch.path);
    assert_eq!(calls.len(), 2);
    assert_keyed(&calls, id, branch.block);
    assert!(stack.http.requests_to(branch.other).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_the_call_of_an_answered_branch_the_run_finishes() {
    let stack = stack().await;
    let (general, _mail, id) = answered_run(&stack, Duration::from_secs(30)).await;
    kill_during_the_branch_call(&stack, general, id, &ANSWERED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_call_of_an_answered_branch_was_answered_the_run_finishes() {
    let stack = stack().await;
    let (general, _mail, id) = answered_run(&stack, Duration::from_millis(1500)).await;
    kill_in_the_branch_call(&stack, general, id, &ANSWERED, Moment::Answered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_the_call_of_a_timeout_branch_the_run_finishes() {
    let stack = stack().await;
    stack.http.respond_after("/late", Duration::from_secs(30));
    let (general, _mail, id) = approval_run(&stack, 1_000).await;
    kill_during_the_branch_call(&stack, general, id, &TIMED_OUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_job_on_a_run_whose_call_is_in_flight_calls_nothing() {
    let stack = stack().await;
    let (general, _mail, id) = answered_run(&stack, Duration::from_secs(4)).await;
    stack.http.wait_for_requests("/answered", 1, WAIT).await;

    // The run's request job again, as a redelivery after an earlier kill:
    // a second live job on the run while the answer's job calls.
    let request = {
        let mut conn = stack.db.conn().await;
        outbox_event::table
            .filter(outbox_event::event_type.eq(EXECUTION_REQUESTED))
            .select(outbox_model::OutboxEvent::as_select())
            .first(&mut conn)
            .await
            .unwrap()
    };
    let mut redis = outbox_queue::connect(&RedisSettings::new(stack.redis.url())).unwrap();
    let job = OutboxJob::from_event(&request);
    push_raw(
        &mut redis,
        &stack.namespace,
        queues::WORKFLOW,
        &[(
            "request-redelivery".into(),
            serde_json::to_vec(&job).unwrap(),
        )],
    )
    .await
    .unwrap();
    general
        .wait_line("workflow execution held by another job: left alone")
        .await;
    assert_eq!(
        stack.http.requests_to("/answered").len(),
        1,
        "the second job left the run alone while the call was in flight"
    );

    wait_status(&stack, id, ExecutionStatus::Success).await;
    assert_eq!(settled_subjects(&stack, 1).await, vec!["Answered"]);
    assert_eq!(stack.http.requests_to("/answered").len(), 1, "one call");
    assert_eq!(attempts(&stack, id, "tell").await, 1);
}

/// The load the issue was found under, scaled to the suite: many answered
/// runs in their branch's call while worker-general is killed three times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_answered_runs_through_three_kills_all_finish_with_calls_repeated_only_under_their_keys()
 {
    const RUNS: usize = 40;
    const KILLS: usize = 3;
    let stack = stack().await;
    stack
        .http
        .respond_after("/answered", Duration::from_millis(800));
    let (mut worker, _mail, first) = approval_run(&stack, 600_000).await;
    let workflow = workflow_support::execution(&stack, first).await.workflow_id;
    let mut ids = vec![first];
    for _ in 1..RUNS {
        ids.push(request_run(&stack, workflow, json!({})).await);
    }
    for id in &ids {
        wait_status(&stack, *id, ExecutionStatus::Waiting).await;
    }
    for id in &ids {
        continue_run(&stack, *id, json!({ "approved": true }))
            .await
            .unwrap();
    }
    for round in 1..=KILLS {
        // Calls are in flight: kill the worker making them.
        stack
            .http
            .wait_for_requests("/answered", round * 8, WAIT)
            .await;
        kill(worker).await;
        worker = general(&stack).await;
    }
    stack.http.respond_after("/answered", Duration::ZERO);

    for id in &ids {
        let run = wait_status(&stack, *id, ExecutionStatus::Success).await;
        assert_eq!(run.error, None);
    }
    assert_eq!(settled_subjects(&stack, RUNS).await, vec!["Answered"; RUNS]);
    let mut calls: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for call in stack.http.requests_to("/answered") {
        let key = call.header(IDEMPOTENCY_KEY_HEADER).unwrap().to_owned();
        *calls.entry(key).or_default() += 1;
    }
    let mut repeats = 0;
    for id in &ids {
        let n = calls.remove(&idempotency_key(*id, "tell")).unwrap_or(0);
        assert!(n >= 1, "run {id} made its call");
        assert!(
            n <= 1 + KILLS,
            "run {id} called {n} times through {KILLS} kills"
        );
        repeats += n - 1;
    }
    assert!(calls.is_empty(), "calls under no run's key: {calls:?}");
    // A repeat only for a call the killed process had made: at most the
    // worker's concurrency (10) per kill.
    assert!(repeats <= KILLS * 10, "{repeats} repeated calls");
    drop(worker);
}
