//! What the workflow end-to-end tests share: a stack on the workflow
//! suite's database server, saving workflows, requesting and answering
//! runs, and reading what runs left.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, RunQueryDsl};
use outbox_model::schema::workflow_block_execution;
use outbox_publish::OutboxTx;
use outbox_queue::queues;
use outbox_test_support::{TestDatabase, eventually, workflow_e2e_server_url};
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_store::producers::{self, ProducerError, RunTrigger};
use outbox_workflow_store::{self as store, ExecutionStatus, WorkflowExecution, WorkflowStatus};
use serde_json::Value;
use uuid::Uuid;

use crate::common::Stack;

pub const WAIT: Duration = Duration::from_secs(60);

pub async fn stack() -> Stack {
    Stack::with_database(TestDatabase::on_server(&workflow_e2e_server_url(), 4).await).await
}

/// Saves `definition` as the tenant `acme`'s workflow `name`; its id.
pub async fn save(stack: &Stack, name: &str, status: WorkflowStatus, definition: Value) -> Uuid {
    let definition = WorkflowDefinition::from_value(definition).unwrap();
    let mut conn = stack.db.conn().await;
    store::save_workflow(&mut conn, "acme", name, status, &definition)
        .await
        .unwrap()
        .workflow
        .id
}

/// Requests a manual run of `workflow` with `input`; the execution's id.
pub async fn request_run(stack: &Stack, workflow: Uuid, input: Value) -> Uuid {
    let mut conn = stack.db.conn().await;
    conn.transaction::<_, ProducerError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        producers::request_execution(&mut tx, "acme", workflow, RunTrigger::Manual, &input).await
    })
    .await
    .unwrap()
}

pub async fn execution(stack: &Stack, id: Uuid) -> WorkflowExecution {
    let mut conn = stack.db.conn().await;
    store::get_execution(&mut conn, id).await.unwrap().unwrap()
}

/// Waits until execution `id` has `status`; the execution then.
pub async fn wait_status(stack: &Stack, id: Uuid, status: ExecutionStatus) -> WorkflowExecution {
    eventually(&format!("execution {id} {status:?}"), WAIT, async || {
        execution(stack, id).await.status == status
    })
    .await;
    execution(stack, id).await
}

/// The execution's block rows: (block, sequence, status), in run order.
pub async fn block_rows(stack: &Stack, id: Uuid) -> Vec<(String, i32, String)> {
    let mut conn = stack.db.conn().await;
    workflow_block_execution::table
        .filter(workflow_block_execution::execution_id.eq(id))
        .order((
            workflow_block_execution::started_at,
            workflow_block_execution::sequence,
        ))
        .select((
            workflow_block_execution::block_id,
            workflow_block_execution::sequence,
            workflow_block_execution::status,
        ))
        .load(&mut conn)
        .await
        .unwrap()
}

pub fn successes(blocks: &[&str]) -> Vec<(String, i32, String)> {
    blocks
        .iter()
        .map(|b| ((*b).to_owned(), 1, "success".to_owned()))
        .collect()
}

/// The subjects of every mail the SMTP sink received, sorted, once `n`
/// arrived and the queues on the way to it are idle (so that no later mail
/// can still come).
pub async fn settled_subjects(stack: &Stack, n: usize) -> Vec<String> {
    stack.smtp.wait_for_messages(n, WAIT).await;
    stack
        .wait_idle(&[queues::WORKFLOW, queues::MAIL, queues::TOOLCTRL_EMAIL])
        .await;
    let mut subjects: Vec<String> = stack
        .smtp
        .messages()
        .iter()
        .map(|m| m.header("subject").unwrap_or_default())
        .collect();
    subjects.sort();
    subjects
}

pub async fn continue_run(stack: &Stack, id: Uuid, input: Value) -> Result<(), ProducerError> {
    let mut conn = stack.db.conn().await;
    conn.transaction::<_, ProducerError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        producers::request_continuation(&mut tx, "acme", id, &input, None).await
    })
    .await
    .map(|_| ())
}
