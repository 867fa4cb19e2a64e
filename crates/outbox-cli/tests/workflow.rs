//! `outbox workflow executions | show` and the workflow section of
//! `outbox health`, run as the real binary against executions made by the
//! real producers and runner on Postgres.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_publish::OutboxTx;
use outbox_workflow_model::WorkflowDefinition;
use outbox_workflow_runner::{RunOutcome, Runner};
use outbox_workflow_store::producers::{self, ProducerError, RunTrigger};
use outbox_workflow_store::{self as store, ExecutionStatus, WorkflowStatus};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::common::Env;

/// Saves `blocks` (chained in order by edges) as live workflow `name` of
/// `tenant` and requests a manual run; returns (workflow id, execution id).
async fn requested(
    conn: &mut AsyncPgConnection,
    tenant: &str,
    name: &str,
    blocks: Value,
) -> (Uuid, Uuid) {
    let ids: Vec<&str> = blocks
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    let edges: Vec<Value> = ids
        .windows(2)
        .map(|w| json!({ "from": w[0], "to": w[1] }))
        .collect();
    let definition =
        WorkflowDefinition::from_value(json!({ "blocks": blocks, "edges": edges })).unwrap();
    let workflow = store::save_workflow(conn, tenant, name, WorkflowStatus::Live, &definition)
        .await
        .unwrap()
        .workflow
        .id;
    let input = json!({ "order": 7 });
    let execution = conn
        .transaction::<_, ProducerError, _>(async |conn| {
            let mut tx = OutboxTx::new(conn)?;
            producers::request_execution(&mut tx, tenant, workflow, RunTrigger::Manual, &input)
                .await
        })
        .await
        .unwrap();
    (workflow, execution)
}

/// The executions of [`seed`], oldest first.
struct Seeded {
    approval: Uuid,
    waiting: Uuid,
    failed: Uuid,
    running: Uuid,
    queued: Uuid,
}

/// Four executions, one in each status the CLI must tell apart:
/// `approval` waits in block `ask`; `notify` failed in block `call` (an
/// internal address, refused); `sync` stopped after its trigger, as a
/// crashed worker leaves it (`running`); `later` was never picked up
/// (`queued`).
async fn seed(env: &Env) -> Seeded {
    let mut conn = env.db.conn().await;
    let runner = Runner::new().unwrap();
    let trigger = json!({ "id": "start", "type": "manualTrigger" });

    let (approval, waiting) = requested(
        &mut conn,
        "acme",
        "approval",
        json!([trigger, { "id": "ask", "type": "waitForInput", "params": { "prompt": "ok?" } }]),
    )
    .await;
    let outcome = runner.run(&mut conn, waiting).await.unwrap();
    assert_eq!(outcome, RunOutcome::Waiting("ask".into()));

    let (_, failed) = requested(
        &mut conn,
        "acme",
        "notify",
        json!([trigger, { "id": "greet", "type": "variable", "params": { "name": "greeted", "value": true } },
               { "id": "call", "type": "httpRequest",
                 "params": { "method": "POST", "url": "http://127.0.0.1:9/hook" } }]),
    )
    .await;
    let outcome = runner.run(&mut conn, failed).await.unwrap();
    assert_eq!(outcome, RunOutcome::Finished(ExecutionStatus::Error));

    let sync = json!([trigger, { "id": "one", "type": "log", "params": { "message": "1" } },
                      { "id": "two", "type": "log", "params": { "message": "2" } }]);
    let (_, running) = requested(&mut conn, "globex", "sync", sync).await;
    let outcome = runner
        .clone()
        .stop_after(1)
        .run(&mut conn, running)
        .await
        .unwrap();
    assert_eq!(outcome, RunOutcome::Paused);

    let later = json!([trigger, { "id": "one", "type": "log", "params": { "message": "1" } }]);
    let (_, queued) = requested(&mut conn, "globex", "later", later).await;

    Seeded {
        approval,
        waiting,
        failed,
        running,
        queued,
    }
}

fn ids(listing: &Value) -> Vec<String> {
    listing
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn executions_are_listed_newest_first_and_filtered_by_status_tenant_and_workflow() {
    let env = Env::new().await;
    let s = seed(&env).await;

    let all = env.outbox(&["workflow", "executions", "--json"]);
    assert_eq!(all.code, 0, "{}{}", all.stdout, all.stderr);
    let newest_first: Vec<String> = [s.queued, s.running, s.failed, s.waiting]
        .iter()
        .map(Uuid::to_string)
        .collect();
    assert_eq!(ids(&all.json()), newest_first);

    // The columns line up whatever the status and trigger.
    let table = env.outbox(&["workflow", "executions"]);
    let header = table.line("ID");
    // Times are shown in UTC with their zone, to the second.
    // Break checked: rendering the time column as any other string fails this.
    let queued = all
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == s.queued.to_string())
        .unwrap()["created_at"]
        .as_str()
        .unwrap()
        .parse::<chrono::DateTime<chrono::Utc>>()
        .unwrap();
    let shown = queued.format("%Y-%m-%d %H:%M:%SZ").to_string();
    assert!(
        table.line(&s.queued.to_string()).contains(&shown),
        "created {shown} not in:\n{}",
        table.stdout
    );
    for (execution, tenant) in [(s.queued, "globex"), (s.failed, "acme")] {
        let line = table.line(&execution.to_string());
        assert_eq!(line.find(tenant), header.find("TENANT"), "{}", table.stdout);
        assert_eq!(
            line.find("manual"),
            header.find("TRIGGER"),
            "{}",
            table.stdout
        );
    }

    let waiting = env.outbox(&["workflow", "executions", "--status", "waiting"]);
    assert_eq!(waiting.code, 0, "{}", waiting.stderr);
    let line = waiting.line(&s.waiting.to_string());
    for cell in ["waiting", "acme", "approval", "manual", "ask"] {
        assert!(line.contains(cell), "{cell}: {line}");
    }
    for other in [s.failed, s.running, s.queued] {
        assert!(!waiting.stdout.contains(&other.to_string()));
    }
    assert!(
        waiting.stdout.contains("1 execution(s)"),
        "{}",
        waiting.stdout
    );

    let failed = env.outbox(&["workflow", "executions", "--status", "error", "--json"]);
    assert_eq!(failed.code, 0);
    let failed = failed.json();
    assert_eq!(ids(&failed), [s.failed.to_string()]);
    let row = &failed[0];
    assert_eq!(row["status"], "error");
    assert_eq!(row["tenant_id"], "acme");
    assert_eq!(row["workflow_name"], "notify");
    assert_eq!(row["workflow_version"], 1);
    assert_eq!(row["trigger_kind"], "manual");
    assert_eq!(row["waiting_block"], Value::Null);
    assert!(row["created_at"].is_string() && row["started_at"].is_string());
    assert!(row["finished_at"].is_string());
    let error = row["error"].as_str().unwrap();
    assert!(
        error.starts_with("block call:") && error.contains("internal address"),
        "{error}"
    );
    let table = env.outbox(&["workflow", "executions", "--status", "error"]);
    assert!(
        table.line(&s.failed.to_string()).contains("block call:"),
        "{}",
        table.stdout
    );

    let two = env.outbox(&[
        "workflow",
        "executions",
        "--status",
        "WAITING",
        "--status",
        "queued",
        "--json",
    ]);
    assert_eq!(
        ids(&two.json()),
        [s.queued.to_string(), s.waiting.to_string()]
    );
    let globex = env.outbox(&["workflow", "executions", "--tenant", "globex", "--json"]);
    assert_eq!(
        ids(&globex.json()),
        [s.queued.to_string(), s.running.to_string()]
    );
    let approval = s.approval.to_string();
    let of_workflow = env.outbox(&["workflow", "executions", "--workflow", &approval, "--json"]);
    assert_eq!(ids(&of_workflow.json()), [s.waiting.to_string()]);

    let limited = env.outbox(&["workflow", "executions", "--limit", "1"]);
    assert_eq!(limited.code, 0);
    assert!(limited.stdout.contains(&s.queued.to_string()));
    assert!(
        limited
            .stdout
            .contains("showing 1 of 4 matching executions"),
        "{}",
        limited.stdout
    );

    let none = env.outbox(&["workflow", "executions", "--tenant", "initech"]);
    assert_eq!(
        none.code, 1,
        "nothing matched: {}{}",
        none.stdout, none.stderr
    );
    assert!(none.stdout.contains("0 execution(s)"), "{}", none.stdout);
    let none = env.outbox(&["workflow", "executions", "--status", "rejected", "--json"]);
    assert_eq!(none.code, 1);
    assert_eq!(none.json(), json!([]));
}

#[tokio::test]
async fn bad_values_are_usage_errors_naming_the_flag() {
    let env = Env::new().await;
    let run = env.outbox(&["workflow", "executions", "--status", "stuck"]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("--status"), "{}", run.stderr);
    for accepted in [
        "queued",
        "running",
        "waiting",
        "success",
        "error",
        "rejected",
        "cancelled",
    ] {
        assert!(run.stderr.contains(accepted), "{accepted}: {}", run.stderr);
    }
    let run = env.outbox(&["workflow", "executions", "--workflow", "approval"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--workflow"), "{}", run.stderr);
    let run = env.outbox(&["workflow", "executions", "--limit", "0"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--limit"), "{}", run.stderr);
    let run = env.outbox(&["workflow", "show", "not-a-uuid"]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("not-a-uuid"), "{}", run.stderr);
    let run = env.outbox(&["health", "--stuck-after", "soon"]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("--stuck-after") && run.stderr.contains("length of time"),
        "{}",
        run.stderr
    );
    let cases: [&[&str]; 3] = [
        &["workflow", "executions", "--status", "FAİLED"],
        &["health", "--stuck-after", "99999999999999999999s"],
        &["health", "--stuck-after", "5é"],
    ];
    for args in cases {
        let run = env.outbox(args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{args:?}: {}", run.stderr);
    }
}

#[tokio::test]
async fn show_lists_the_block_runs_in_order_with_the_error_of_the_failed_block() {
    let env = Env::new().await;
    let s = seed(&env).await;

    // Runs of known length: the execution took 1.5 s, its `call` block 250 ms.
    env.sql(&format!(
        "UPDATE workflow_execution SET finished_at = started_at + interval '1500 ms' \
           WHERE id = '{failed}';
         UPDATE workflow_block_execution SET finished_at = started_at + interval '250 ms' \
           WHERE execution_id = '{failed}' AND block_id = 'call'",
        failed = s.failed
    ))
    .await;
    let run = env.outbox(&["workflow", "show", &s.failed.to_string(), "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let shown = run.json();
    let execution = &shown["execution"];
    assert_eq!(execution["id"], s.failed.to_string());
    assert_eq!(execution["status"], "error");
    assert_eq!(execution["workflow_name"], "notify");
    assert_eq!(execution["input"], json!({ "order": 7 }));
    assert_eq!(execution["output"], Value::Null);
    assert_eq!(execution["vars"], json!({ "greeted": true }));
    assert!(
        execution["error"]
            .as_str()
            .unwrap()
            .starts_with("block call:")
    );
    assert_eq!(
        execution["started_by"]["event_type"],
        "workflow.execution.requested"
    );
    assert_eq!(execution["duration_ms"], 1500);
    let blocks = shown["blocks"].as_array().unwrap();
    let summary: Vec<(&str, &str, &str, i64)> = blocks
        .iter()
        .map(|b| {
            (
                b["block_id"].as_str().unwrap(),
                b["block_type"].as_str().unwrap(),
                b["status"].as_str().unwrap(),
                b["sequence"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("start", "manualTrigger", "success", 1),
            ("greet", "variable", "success", 1),
            ("call", "httpRequest", "error", 1),
        ]
    );
    assert_eq!(blocks[0]["output"], json!({ "order": 7 }));
    assert!(
        blocks[2]["error"]
            .as_str()
            .unwrap()
            .contains("internal address"),
        "{}",
        blocks[2]
    );
    assert_eq!(blocks[2]["duration_ms"], 250);

    let table = env.outbox(&["workflow", "show", &s.failed.to_string()]);
    assert_eq!(table.code, 0);
    let position = |block: &str| {
        table
            .stdout
            .lines()
            .position(|l| l.trim_start().starts_with(block))
            .unwrap_or_else(|| panic!("no {block}: {}", table.stdout))
    };
    assert!(position("start ") < position("greet ") && position("greet ") < position("call "));
    let call = table.line("call ");
    assert!(
        call.contains("httpRequest") && call.contains("error") && call.contains("internal address"),
        "{call}"
    );
    assert!(call.contains("250 ms"), "the block's duration: {call}");
    let finished = table.line("finished");
    assert!(finished.contains("(ran 1.5 s)"), "{finished}");
    assert!(table.line("status").contains("error"));
    assert!(table.line("error").contains("block call:"));
    assert!(table.stdout.contains("\"order\": 7"), "{}", table.stdout);

    // Nothing has finished yet: no duration, not a duration of zero.
    let waiting = env
        .outbox(&["workflow", "show", &s.waiting.to_string(), "--json"])
        .json();
    assert!(waiting["execution"]["duration_ms"].is_null(), "{waiting}");
    let ask = &waiting["blocks"].as_array().unwrap().last().unwrap();
    assert_eq!(ask["block_id"], "ask");
    assert!(ask["duration_ms"].is_null(), "{ask}");

    let waiting = env.outbox(&["workflow", "show", &s.waiting.to_string()]);
    assert_eq!(waiting.code, 0);
    assert!(waiting.line("waiting block").contains("ask"));
    let ask = waiting.line("ask ");
    assert!(
        ask.contains("waitForInput") && ask.contains("waiting"),
        "{ask}"
    );
    let queued = env.outbox(&["workflow", "show", &s.queued.to_string()]);
    assert_eq!(queued.code, 0);
    assert!(queued.stdout.contains("none ran yet"), "{}", queued.stdout);

    let unknown = Uuid::new_v4().to_string();
    let missing = env.outbox(&["workflow", "show", &unknown]);
    assert_eq!(missing.code, 1, "{}{}", missing.stdout, missing.stderr);
    assert!(
        missing
            .stderr
            .contains(&format!("no workflow execution {unknown}")),
        "{}",
        missing.stderr
    );
    assert!(missing.stdout.is_empty());
}

#[tokio::test]
async fn health_alerts_on_an_execution_running_past_the_threshold_but_not_on_waiting_ones() {
    let env = Env::new().await;
    let s = seed(&env).await;

    let fresh = env.outbox(&["health", "--json"]);
    assert_eq!(fresh.code, 0, "{}{}", fresh.stdout, fresh.stderr);
    let report = fresh.json();
    assert_eq!(report["alert"], false);
    let workflows = &report["workflows"];
    assert_eq!(workflows["stuck_after_secs"], 900, "the default is 15m");
    assert_eq!(workflows["waiting"], 1);
    assert_eq!(workflows["alerts"], json!([]));
    assert_eq!(workflows["stuck"][0]["status"], "queued");
    assert_eq!(workflows["stuck"][0]["count"], 0);
    assert_eq!(workflows["stuck"][1]["status"], "running");
    assert_eq!(workflows["stuck"][1]["count"], 0);

    // The running run and the waiting one have not changed for an hour.
    env.sql(&format!(
        "UPDATE workflow_execution
            SET created_at = now() - interval '70 minutes',
                started_at = now() - interval '65 minutes',
                updated_at = now() - interval '1 hour'
          WHERE id IN ('{}', '{}')",
        s.running, s.waiting
    ))
    .await;

    let stuck = env.outbox(&["health", "--json"]);
    assert_eq!(stuck.code, 1, "{}{}", stuck.stdout, stuck.stderr);
    let report = stuck.json();
    assert_eq!(report["alert"], true);
    let workflows = &report["workflows"];
    assert_eq!(workflows["stuck"][0]["count"], 0, "the queued run is fresh");
    let running = &workflows["stuck"][1];
    assert_eq!(running["status"], "running");
    assert_eq!(running["count"], 1, "the waiting run is not stuck");
    assert_eq!(running["oldest_id"], s.running.to_string());
    assert!(running["oldest_updated_at"].is_string());
    assert_eq!(workflows["waiting"], 1);
    let alert = workflows["alerts"][0].as_str().unwrap();
    assert!(
        alert.contains("running") && alert.contains(&s.running.to_string()),
        "{alert}"
    );
    assert!(
        report["queues"]
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["alerts"] == json!([])),
        "only the workflow section alerts"
    );

    let table = env.outbox(&["health"]);
    assert_eq!(table.code, 1);
    let line = table.line("running ");
    assert!(
        line.contains(&s.running.to_string()) && line.contains("1h"),
        "{line}"
    );
    assert!(table.line("queued ").ends_with('-'), "{}", table.stdout);
    assert!(
        table.stdout.contains("1 execution(s) waiting for input"),
        "{}",
        table.stdout
    );

    let patient = env.outbox(&["health", "--stuck-after", "2h"]);
    assert_eq!(patient.code, 0, "{}{}", patient.stdout, patient.stderr);
    assert!(
        patient.line("running ").ends_with('-'),
        "{}",
        patient.stdout
    );

    // An old queued run (never picked up) is stuck too.
    env.sql(&format!(
        "UPDATE workflow_execution SET created_at = now() - interval '3 hours',
                updated_at = now() - interval '3 hours' WHERE id = '{}'",
        s.queued
    ))
    .await;
    let run = env.outbox(&["health", "--json", "--stuck-after", "2h"]);
    assert_eq!(run.code, 1);
    let workflows = &run.json()["workflows"];
    assert_eq!(workflows["stuck"][0]["count"], 1);
    assert_eq!(workflows["stuck"][0]["oldest_id"], s.queued.to_string());
    assert_eq!(workflows["stuck"][1]["count"], 0);
    assert_eq!(workflows["stuck_after_secs"], 7200);
}

#[tokio::test]
async fn health_alerts_on_a_run_left_running_with_an_expired_lease_that_no_sweep_resumed() {
    let env = Env::new().await;
    let s = seed(&env).await;

    // Its holder's lease ran out a minute ago: a sweep may still come.
    env.sql(&format!(
        "UPDATE workflow_execution SET lease_owner = gen_random_uuid(),
                lease_until = now() - interval '1 minute' WHERE id = '{}'",
        s.running
    ))
    .await;
    let recent = env.outbox(&["health", "--json"]);
    assert_eq!(recent.code, 0, "{}{}", recent.stdout, recent.stderr);
    assert_eq!(recent.json()["workflows"]["orphaned"], 0);

    // Ten minutes: no sweep ran.
    env.sql(&format!(
        "UPDATE workflow_execution SET lease_until = now() - interval '10 minutes'
          WHERE id = '{}'",
        s.running
    ))
    .await;
    let orphaned = env.outbox(&["health", "--json"]);
    assert_eq!(orphaned.code, 1, "{}{}", orphaned.stdout, orphaned.stderr);
    let workflows = &orphaned.json()["workflows"];
    assert_eq!(workflows["orphaned"], 1);
    let alert = workflows["alerts"][0].as_str().unwrap();
    assert!(alert.contains("nobody holding them"), "{alert}");
    let table = env.outbox(&["health"]);
    assert!(
        table.stdout.contains("1 running with nobody holding them"),
        "{}",
        table.stdout
    );
}

// Break checked: `workflow::health` counting with the sweep's default lease
// (30 s) whatever `WORKFLOW_RUN_LEASE_MS` says reports the run orphaned
// under a lease of ten minutes: orphaned 1 instead of 0.
#[tokio::test]
async fn health_judges_a_run_never_leased_by_the_workers_run_lease() {
    let env = Env::new().await;
    let s = seed(&env).await;

    // Running, never leased, unchanged for five minutes: with the default
    // lease (30 s) the sweep should have resumed it long ago; with a lease
    // of ten minutes it is not due yet.
    env.sql(&format!(
        "UPDATE workflow_execution SET lease_owner = NULL, lease_until = NULL,
                updated_at = now() - interval '5 minutes' WHERE id = '{}'",
        s.running
    ))
    .await;
    let default_lease = env.outbox(&["health", "--json"]);
    assert_eq!(default_lease.json()["workflows"]["orphaned"], 1);

    let long_lease = env.outbox_with(
        &[("WORKFLOW_RUN_LEASE_MS", "600000")],
        &["health", "--json"],
    );
    assert_eq!(
        long_lease.code, 0,
        "{}{}",
        long_lease.stdout, long_lease.stderr
    );
    assert_eq!(long_lease.json()["workflows"]["orphaned"], 0);
    let flag = env.outbox(&["health", "--json", "--workflow-run-lease-ms", "600000"]);
    assert_eq!(flag.json()["workflows"]["orphaned"], 0);

    let refused = env.outbox_with(&[("WORKFLOW_RUN_LEASE_MS", "soon")], &["health"]);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains("WORKFLOW_RUN_LEASE_MS"),
        "{}",
        refused.stderr
    );
}
