//! The conventions users of other database CLIs expect from the real
//! `outbox` binary: output into a closed pipe ends quietly; shell
//! completions; `migrate --status` and `--dry-run`; `cancel` with history;
//! a reschedule from code in `show`'s history;
//! `retry-dead`, guarded like `requeue`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use outbox_queue::{RedisSettings, push_raw, queues};
use outbox_subscriber::{HandlerGroup, JobError, JobHandler, JobMeta, WorkerSettings};
use outbox_test_support::eventually;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common::Env;

#[tokio::test]
async fn list_into_a_pipe_its_reader_closed_ends_quietly() {
    let env = Env::new().await;
    let rows: Vec<String> = (0..2000)
        .map(|i| format!("('acme', 'audit.user.login', '{{\"n\": {i}}}')"))
        .collect();
    env.sql(&format!(
        "INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES {}",
        rows.join(", ")
    ))
    .await;
    for args in [
        &["list", "--limit", "2000"][..],
        &["list", "--limit", "2000", "--json"],
    ] {
        // As `outbox list | head -0`: the reader is gone before the first line.
        let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(args)
            .env("DATABASE_URL", env.db.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn completions_cover_every_command() {
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let output = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&output.stdout);
        for command in ["migrate", "retry-dead", "cancel", "health"] {
            assert!(script.contains(command), "{shell}: {command}");
        }
    }
    let output = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

#[tokio::test]
async fn migrate_status_and_dry_run_list_without_changing_anything() {
    let env = Env::new().await;
    let status = env.outbox(&["migrate", "--status", "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let json = status.json();
    assert_eq!(json["pending"], 0);
    let migrations = json["migrations"].as_array().unwrap();
    assert!(migrations.iter().all(|m| m["applied"] == true));
    assert!(
        migrations
            .iter()
            .any(|m| m["name"] == "2026-11-29-000001_create_outbox_event")
    );

    // Forget the newest migration: it is pending, and --dry-run leaves it so.
    let newest = migrations.last().unwrap()["version"]
        .as_str()
        .unwrap()
        .to_owned();
    env.sql(&format!(
        "DELETE FROM __diesel_schema_migrations WHERE version = '{newest}'"
    ))
    .await;
    let table = env.outbox(&["migrate", "--status"]);
    assert!(table.stdout.contains("pending"), "{}", table.stdout);
    let dry = env.outbox(&["migrate", "--dry-run", "--json"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let would: Vec<Value> = dry.json()["would_apply"].as_array().unwrap().clone();
    assert_eq!(would.len(), 1);
    assert_eq!(
        env.outbox(&["migrate", "--status", "--json"]).json()["pending"],
        1,
        "--dry-run applied nothing"
    );
}

/// A database without the workflow migration set (a bare application's):
/// `outbox health` reports the queues and says the set is missing instead
/// of failing; `outbox migrate --set workflow` adds the set later.
#[tokio::test]
async fn health_without_the_workflow_set_answers_and_migrate_set_adds_it() {
    let env = Env::new().await;
    let status = env.outbox(&["migrate", "--status", "--json"]).json();
    let workflow_versions: Vec<String> = status["migrations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["set"] == "workflow")
        .map(|m| format!("'{}'", m["version"].as_str().unwrap()))
        .collect();
    assert_eq!(workflow_versions.len(), 6);
    env.sql(&format!(
        "DROP TABLE workflow_block_execution, workflow_execution, workflow_version, workflow,
                    entity_row, application_event, workflow_bridge_request CASCADE;
         DELETE FROM __diesel_schema_migrations WHERE version IN ({});",
        workflow_versions.join(", ")
    ))
    .await;

    let health = env.outbox(&["health", "--json"]);
    assert_eq!(health.code, 0, "{}", health.stderr);
    assert_eq!(health.json()["workflows"], Value::Null);
    let text = env.outbox(&["health"]);
    assert!(
        text.stdout
            .contains("WORKFLOW: the workflow migration set is not applied"),
        "{}",
        text.stdout
    );

    let migrate = env.outbox(&["migrate", "--set", "workflow", "--json"]);
    assert_eq!(migrate.code, 0, "{}", migrate.stderr);
    assert_eq!(migrate.json()["applied"].as_array().unwrap().len(), 6);
    assert_eq!(migrate.json()["sets"], serde_json::json!(["workflow"]));
    let health = env.outbox(&["health", "--json"]);
    assert_eq!(health.code, 0, "{}", health.stderr);
    assert!(health.json()["workflows"]["stuck"].is_array());
    let unknown = env.outbox(&["migrate", "--set", "billing"]);
    assert_eq!(unknown.code, 2);
    assert!(
        unknown.stderr.contains("unknown migration set \"billing\""),
        "{}",
        unknown.stderr
    );
}

#[tokio::test]
async fn cancel_sets_pending_and_failed_rows_cancelled_with_history_and_refuses_done() {
    let env = Env::new().await;
    env.sql(
        "INSERT INTO outbox_event (id, tenant_id, event_type, payload, status, retries, last_error, failed_at, processed_at)
         VALUES ('00000000-0000-4000-8000-000000000001', 'acme', 'audit.user.login', '{}', 'PENDING', 0, NULL, NULL, NULL),
                ('00000000-0000-4000-8000-000000000002', 'acme', 'webhook.order.paid', '{}', 'FAILED', 7, 'HTTP 500', now(), NULL),
                ('00000000-0000-4000-8000-000000000003', 'acme', 'audit.user.login', '{}', 'DONE', 0, NULL, NULL, now())",
    )
    .await;
    let [pending, failed, done] = [
        "00000000-0000-4000-8000-000000000001",
        "00000000-0000-4000-8000-000000000002",
        "00000000-0000-4000-8000-000000000003",
    ];

    let dry = env.outbox(&["cancel", pending, failed, "--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    for id in [pending, failed] {
        assert!(
            dry.stdout
                .lines()
                .any(|l| l.starts_with(id) && l.ends_with("would be cancelled")),
            "the dry run names {id} as a row it would cancel:\n{}",
            dry.stdout
        );
    }
    assert_eq!(
        env.outbox(&["show", pending, "--json"]).json()["event"]["status"],
        "PENDING",
        "a dry run changes nothing"
    );

    let run = env.outbox(&[
        "cancel",
        pending,
        failed,
        done,
        "--reason",
        "customer withdrew",
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["cancelled"].as_array().unwrap().len(), 2);
    for id in [pending, failed] {
        let shown = env.outbox(&["show", id, "--json"]).json();
        assert_eq!(shown["event"]["status"], "CANCELLED");
        let history = shown["history"].as_array().unwrap();
        assert_eq!(history.len(), 1);
        assert_eq!(history[0]["action"], "cancel");
        assert_eq!(history[0]["reason"], "customer withdrew");
    }
    let failed_history = env.outbox(&["show", failed, "--json"]).json()["history"][0].clone();
    assert_eq!(failed_history["previous_status"], "FAILED");
    assert_eq!(failed_history["previous_last_error"], "HTTP 500");
    assert_eq!(
        env.outbox(&["show", done, "--json"]).json()["event"]["status"],
        "DONE"
    );
    let table = env.outbox(&["show", failed]);
    assert!(
        table.stdout.contains("cancelled from FAILED"),
        "{}",
        table.stdout
    );

    // Nothing left to cancel: exit 1, like a command that matched nothing.
    let again = env.outbox(&["cancel", done]);
    assert_eq!(again.code, 1);
    assert!(again.stdout.contains("DONE"), "{}", again.stdout);

    // The table of a real run says what it did, not what it would do.
    // Break checked: every row printed as in a dry run ("would be
    // cancelled") fails here.
    let later = "00000000-0000-4000-8000-000000000004";
    env.sql(&format!(
        "INSERT INTO outbox_event (id, tenant_id, event_type, payload) \
         VALUES ('{later}', 'acme', 'audit.user.login', '{{}}')"
    ))
    .await;
    let table = env.outbox(&["cancel", later, "--reason", "test"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table
            .stdout
            .contains(&format!("{later}  PENDING     cancelled"))
            && !table.stdout.contains("would be cancelled")
            && table.stdout.contains("1 row(s) cancelled"),
        "{}",
        table.stdout
    );
}

/// A reschedule from code (`outbox_publish::reschedule`) is in the row's
/// history as `outbox show` prints it: the due time the row had, the
/// reason, and the action in the JSON.
#[tokio::test]
async fn show_lists_a_reschedule_from_code_with_the_due_time_it_had() {
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    use outbox_publish::{ChangeError, EventRef, OutboxTx, reschedule};

    let env = Env::new().await;
    let id = "00000000-0000-4000-8000-000000000006";
    env.sql(&format!(
        "INSERT INTO outbox_event (id, tenant_id, event_type, payload, scheduled_at) \
         VALUES ('{id}', 'acme', 'audit.user.login', '{{}}', '2031-05-06T07:00:00Z')"
    ))
    .await;
    let later = chrono::DateTime::parse_from_rfc3339("2031-05-06T19:00:00Z")
        .unwrap()
        .to_utc();
    let mut conn: AsyncPgConnection = env.db.conn().await;
    conn.transaction::<_, ChangeError, _>(async |conn| {
        let mut tx = OutboxTx::new(conn)?;
        reschedule(
            &mut tx,
            EventRef::Id(id.parse().unwrap()),
            later,
            "evening slot",
        )
        .await
    })
    .await
    .unwrap();

    let table = env.outbox(&["show", id]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table
            .stdout
            .contains("rescheduled from 2031-05-06T07:00:00+00:00")
            && table.stdout.contains(": evening slot"),
        "{}",
        table.stdout
    );
    let shown = env.outbox(&["show", id, "--json"]).json();
    assert_eq!(shown["event"]["scheduled_at"], "2031-05-06T19:00:00Z");
    let history = shown["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{shown}");
    assert_eq!(history[0]["action"], "reschedule");
    assert_eq!(history[0]["previous_scheduled_at"], "2031-05-06T07:00:00Z");
}

#[tokio::test]
async fn cancel_by_filters_counts_first_needs_yes_above_the_threshold_and_cancels_only_what_matches()
 {
    let env = Env::new().await;
    // Three PENDING and one FAILED webhook of acme, one DONE webhook of acme,
    // one PENDING webhook of globex, one PENDING audit event of acme.
    env.sql(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, failed_at, processed_at)
         SELECT 'acme', 'webhook.order.paid', '{}', 'PENDING', NULL, NULL FROM generate_series(1, 3);
         INSERT INTO outbox_event (tenant_id, event_type, payload, status, failed_at, processed_at)
         VALUES ('acme', 'webhook.order.paid', '{}', 'FAILED', now(), NULL),
                ('acme', 'webhook.order.paid', '{}', 'DONE', NULL, now()),
                ('globex', 'webhook.order.paid', '{}', 'PENDING', NULL, NULL),
                ('acme', 'audit.user.login', '{}', 'PENDING', NULL, NULL)",
    )
    .await;
    let filters = ["--tenant", "acme", "--type-prefix", "webhook."];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        let mut args = vec!["cancel"];
        args.extend(filters);
        args.extend(extra);
        args
    };

    let dry = env.outbox(&with(&["--dry-run", "--json"]));
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    let dry = dry.json();
    assert_eq!(
        (&dry["matching"], &dry["to_cancel"], &dry["refused_count"]),
        (&Value::from(5), &Value::from(4), &Value::from(1)),
        "{dry}"
    );

    let guarded = env.outbox(&with(&["--confirm-above", "3"]));
    assert_eq!(guarded.code, 2, "{}", guarded.stderr);
    assert!(guarded.stderr.contains("--yes"), "{}", guarded.stderr);
    let still_pending = env
        .outbox(&["list", "--status", "pending", "--json"])
        .json();
    assert_eq!(
        still_pending.as_array().map(Vec::len),
        Some(5),
        "{still_pending}"
    );

    let with_ids = env.outbox(&["cancel", "00000000-0000-4000-8000-000000000001", "--yes"]);
    assert_eq!(with_ids.code, 2, "--yes is for a cancel by filters");
    assert!(with_ids.stderr.contains("--yes"), "{}", with_ids.stderr);
    // Break checked: ids with a filter but no --limit, or with --limit but
    // no filter, let through when the rule is an `&&`, fail here.
    let id = "00000000-0000-4000-8000-000000000001";
    for mixed in [
        &["cancel", id, "--tenant", "acme"][..],
        &["cancel", id, "--limit", "1"],
    ] {
        let refused = env.outbox(mixed);
        assert_eq!(refused.code, 2, "{mixed:?}: {}", refused.stderr);
        assert!(
            refused.stderr.contains("give either ids or filters"),
            "{mixed:?}: {}",
            refused.stderr
        );
    }
    for unfiltered in [&["cancel"][..], &["cancel", "--limit", "1", "--yes"]] {
        let none = env.outbox(unfiltered);
        assert_eq!(none.code, 2, "{unfiltered:?}");
        assert!(none.stderr.contains("name the events"), "{}", none.stderr);
    }

    let run = env.outbox_as(
        "ana",
        &with(&[
            "--confirm-above",
            "3",
            "--yes",
            "--batch-size",
            "3",
            "--reason",
            "partner retired",
            "--json",
        ]),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = run.json();
    assert_eq!(run["cancelled"].as_array().unwrap().len(), 4, "{run}");
    assert_eq!(run["batches"], 2, "four rows in batches of three");
    for id in run["cancelled"].as_array().unwrap() {
        let shown = env.outbox(&["show", id.as_str().unwrap(), "--json"]).json();
        assert_eq!(shown["event"]["status"], "CANCELLED");
        assert_eq!(shown["history"][0]["action"], "cancel");
        assert_eq!(shown["history"][0]["requested_by"], "ana");
        assert_eq!(shown["history"][0]["reason"], "partner retired");
    }
    let pending = env
        .outbox(&["list", "--status", "pending", "--json"])
        .json();
    let left: Vec<(&str, &str)> = pending
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["tenant_id"].as_str().unwrap(),
                e["event_type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        left.len(),
        2,
        "globex's webhook and acme's audit event are outside the filters: {left:?}"
    );
    assert!(
        left.contains(&("globex", "webhook.order.paid"))
            && left.contains(&("acme", "audit.user.login"))
    );
    let again = env.outbox(&with(&[]));
    assert_eq!(again.code, 1, "nothing left to cancel: {}", again.stdout);
}

#[tokio::test]
async fn a_row_handed_off_while_cancel_waits_for_it_is_left_alone_and_reported_so() {
    use diesel_async::SimpleAsyncConnection;

    let env = Env::new().await;
    let id = "00000000-0000-4000-8000-000000000005";
    env.sql(&format!(
        "INSERT INTO outbox_event (id, tenant_id, event_type, payload) \
         VALUES ('{id}', 'acme', 'audit.user.login', '{{}}')"
    ))
    .await;
    // A dispatcher holds the row: cancel reads it as PENDING, then waits
    // on its lock while the dispatcher hands it off.
    let mut dispatcher = env.db.conn().await;
    dispatcher
        .batch_execute(&format!(
            "BEGIN; SELECT id FROM outbox_event WHERE id = '{id}' FOR UPDATE"
        ))
        .await
        .unwrap();
    let cancel = env.start(&["cancel", id]);
    eventually(
        "cancel to wait on the row's lock",
        Duration::from_secs(30),
        async || env.db.waits_on_a_lock("%FOR UPDATE%").await,
    )
    .await;
    dispatcher
        .batch_execute(&format!(
            "UPDATE outbox_event SET status = 'DONE', processed_at = now() WHERE id = '{id}'; COMMIT"
        ))
        .await
        .unwrap();

    let run = cancel.finish().await;
    assert_eq!(
        run.code, 1,
        "nothing was cancelled:\n{}{}",
        run.stdout, run.stderr
    );
    assert!(
        run.stdout
            .contains(&format!("{id}  PENDING     left alone: changed meanwhile"))
            && run.stdout.contains("0 row(s) cancelled"),
        "{}",
        run.stdout
    );
    assert_eq!(
        env.outbox(&["show", id, "--json"]).json()["event"]["status"],
        "DONE"
    );
}

struct Doomed;

impl JobHandler for Doomed {
    type Job = Value;

    fn queue(&self) -> &str {
        queues::WEBHOOK
    }

    async fn handle(&self, _job: Value, _meta: &JobMeta) -> Result<(), JobError> {
        Err(JobError::permanent("the receiver refuses this body"))
    }
}

impl Env {
    /// Pushes the jobs (task id, body) on the webhook queue and runs a
    /// handler that refuses each until all of them are dead.
    async fn dead_webhook_jobs(&self, jobs: &[(&str, &str)]) {
        let conn = outbox_queue::connect(&RedisSettings::new(self.redis.url())).unwrap();
        let jobs: Vec<(String, Vec<u8>)> = jobs
            .iter()
            .map(|(id, body)| ((*id).to_owned(), body.as_bytes().to_vec()))
            .collect();
        push_raw(&mut conn.clone(), &self.namespace, queues::WEBHOOK, &jobs)
            .await
            .unwrap();
        let group = HandlerGroup::new().with(Doomed).unwrap();
        let (namespace, shutdown) = (self.namespace.clone(), CancellationToken::new());
        let stop = shutdown.clone();
        let worker = tokio::spawn(async move {
            group
                .run(conn, &namespace, &WorkerSettings::default(), shutdown)
                .await
        });
        eventually("every job dead", Duration::from_secs(30), async || {
            self.outbox(&["dead", queues::WEBHOOK, "--json"]).json()["dead"]
                .as_array()
                .is_some_and(|d| d.len() == jobs.len())
        })
        .await;
        stop.cancel();
        worker.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_dead_puts_dead_jobs_back_records_them_in_their_events_history_and_needs_yes_above_the_threshold()
 {
    let env = Env::new().await;
    // job-2 is an event's own job: its event's history records the retry.
    let event = uuid::Uuid::now_v7();
    env.sql(&format!(
        "INSERT INTO outbox_event (id, tenant_id, event_type, payload, status, processed_at)
         VALUES ('{event}', 't', 'webhook.order.paid', '{{}}', 'DONE', now())"
    ))
    .await;
    let job_2 = outbox_queue::task_id(event);
    env.dead_webhook_jobs(&[("job-1", "{}"), (&job_2, "{}"), ("job-3", "{}")])
        .await;

    let guarded = env.outbox(&["retry-dead", queues::WEBHOOK, "--confirm-above", "2"]);
    assert_eq!(guarded.code, 2);
    assert!(guarded.stderr.contains("--yes"), "{}", guarded.stderr);
    let dry = env.outbox(&["retry-dead", queues::WEBHOOK, "--dry-run", "--json"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert_eq!(dry.json()["put_back"], 0);
    assert_eq!(dry.json()["task_ids"].as_array().unwrap().len(), 3);

    let one = env.outbox_as(
        "ana",
        &[
            "retry-dead",
            queues::WEBHOOK,
            "--task-id",
            &job_2,
            "--reason",
            "the receiver is back",
            "--json",
        ],
    );
    assert_eq!(one.code, 0, "{}", one.stderr);
    assert_eq!(one.json()["put_back"], 1);
    assert_eq!(one.json()["recorded"], 1);
    let shown = env.outbox(&["show", &event.to_string(), "--json"]).json();
    let history = shown["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{shown}");
    assert_eq!(
        (
            &history[0]["action"],
            &history[0]["queue"],
            &history[0]["task_id"],
            &history[0]["requested_by"],
            &history[0]["reason"],
            &history[0]["previous_status"],
        ),
        (
            &Value::from("retry_dead"),
            &Value::from(queues::WEBHOOK),
            &Value::from(job_2.as_str()),
            &Value::from("ana"),
            &Value::from("the receiver is back"),
            &Value::from("DONE"),
        ),
        "the event's history says who put its dead job back, why, and where"
    );
    let text = env.outbox(&["show", &event.to_string()]);
    assert!(
        text.stdout
            .contains(&format!("dead job {job_2} put back on {}", queues::WEBHOOK)),
        "{}",
        text.stdout
    );
    let rest = env.outbox(&[
        "retry-dead",
        queues::WEBHOOK,
        "--confirm-above",
        "2",
        "--yes",
    ]);
    assert_eq!(rest.code, 0, "{}", rest.stderr);
    assert!(rest.stdout.contains("put 2 of 2"), "{}", rest.stdout);
    assert!(
        rest.stdout
            .contains("not recorded, they name no outbox event: job-1, job-3"),
        "jobs of no event are named as unrecorded: {}",
        rest.stdout
    );

    let health = env
        .outbox(&["health", "--json", "--max-backlog", "100000"])
        .json();
    let webhook = health["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == queues::WEBHOOK)
        .unwrap()
        .clone();
    assert_eq!(
        (webhook["dead"].clone(), webhook["backlog"].clone()),
        (0.into(), 3.into())
    );
    let unknown = env.outbox(&["retry-dead", queues::WEBHOOK, "--task-id", "job-9"]);
    assert_eq!(unknown.code, 2);
    assert!(unknown.stderr.contains("not dead"), "{}", unknown.stderr);
}

// Break checked: with `past_their_keys` answering no job, the dry run
// exits 0 and names no job that stays dead (a run would put the ordered
// job back, where its worker acknowledges it without running the handler);
// taking replays (generation 1) for first deliveries leaves the replay's
// job dead too, and the test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_dead_leaves_an_ordered_job_dead_once_its_key_moved_past_it_and_names_the_replay() {
    let env = Env::new().await;
    let (ordered, plain) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    env.sql(&format!(
        "INSERT INTO outbox_event (id, tenant_id, event_type, payload, ordering_key)
         VALUES ('{ordered}', 't', 'webhook.order.paid', '{{}}', 'acct-7');
         INSERT INTO outbox_event (id, tenant_id, event_type, payload, ordering_key)
         VALUES (gen_random_uuid(), 't', 'webhook.order.paid', '{{}}', 'acct-7');
         INSERT INTO outbox_event (id, tenant_id, event_type, payload)
         VALUES ('{plain}', 't', 'webhook.order.paid', '{{}}');
         UPDATE outbox_event SET status = 'DONE', processed_at = now()
         WHERE id IN ('{ordered}', '{plain}');
         UPDATE outbox_ordering_key
         SET held_event_id = '{ordered}', held_since = now(), held_reason = 'receiver refused'
         WHERE ordering_key = 'acct-7'"
    ))
    .await;
    // The event's first delivery, a replay of it and an unordered event's
    // job, with the bodies the dispatcher writes (the ordering fields).
    let ordered_job = outbox_queue::task_id(ordered);
    let replay_job = outbox_queue::generation_task_id(ordered, 1);
    let plain_job = outbox_queue::task_id(plain);
    let first_body = format!(
        r#"{{"outbox_event_id":"{ordered}","ordering_key":"acct-7","ordering_position":1}}"#
    );
    let replay_body = format!(
        r#"{{"outbox_event_id":"{ordered}","generation":1,"ordering_key":"acct-7","ordering_position":1}}"#
    );
    let plain_body = format!(r#"{{"outbox_event_id":"{plain}"}}"#);
    env.dead_webhook_jobs(&[
        (&ordered_job, &first_body),
        (&replay_job, &replay_body),
        (&plain_job, &plain_body),
    ])
    .await;
    let release = env.outbox(&["ordering", "release", "acct-7", "--skip-event"]);
    assert_eq!(release.code, 0, "{}{}", release.stdout, release.stderr);

    let passed = serde_json::json!([{
        "task_id": ordered_job,
        "event_id": ordered,
        "ordering_key": "acct-7",
        "position": 1,
    }]);
    let dry = env.outbox(&["retry-dead", queues::WEBHOOK, "--dry-run", "--json"]);
    assert_eq!(
        dry.code, 1,
        "a job that would stay dead is an alert: {}",
        dry.stderr
    );
    assert_eq!(dry.json()["passed_over"], passed, "{}", dry.stdout);
    let text = env.outbox(&["retry-dead", queues::WEBHOOK, "--dry-run"]);
    assert!(
        text.stdout.contains(&format!(
            "{ordered_job} would stay dead: its ordering key acct-7 has moved past its position 1"
        )) && text
            .stdout
            .contains(&format!("`outbox requeue --replay {ordered}`"))
            && text.stdout.contains("would put 2 dead job(s) back"),
        "{}",
        text.stdout
    );
    // Two going back are within --confirm-above 2: the one staying dead
    // is not counted.
    let run = env.outbox(&[
        "retry-dead",
        queues::WEBHOOK,
        "--confirm-above",
        "2",
        "--json",
    ]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let report = run.json();
    assert_eq!(
        (
            &report["put_back"],
            &report["recorded"],
            &report["passed_over"]
        ),
        (&Value::from(2), &Value::from(2), &passed),
        "{report}"
    );
    let dead = env.outbox(&["dead", queues::WEBHOOK, "--json"]).json();
    let still: Vec<&Value> = dead["dead"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| &job["task_id"])
        .collect();
    assert_eq!(still, [&Value::from(ordered_job.as_str())], "{dead}");
    let shown = env.outbox(&["show", &ordered.to_string(), "--json"]).json();
    let entries: Vec<(&Value, &Value)> = shown["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| (&entry["action"], &entry["task_id"]))
        .collect();
    assert_eq!(
        entries,
        [
            (&Value::from("skip"), &Value::Null),
            (
                &Value::from("retry_dead"),
                &Value::from(replay_job.as_str())
            )
        ],
        "the replay's job went back, the first delivery's did not: {shown}"
    );
}

#[tokio::test]
async fn a_routes_file_adds_its_queues_to_health_and_a_bad_one_is_refused() {
    let env = Env::new().await;
    let path = std::env::temp_dir().join(format!("routes-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(
        &path,
        "[[route]]\nprefix = \"orders.\"\nqueue = \"app.orders\"\n",
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let health = env.outbox(&["health", "--json", "--routes-file", file]);
    let queues: Vec<Value> = health.json()["queues"].as_array().unwrap().clone();
    assert!(
        queues.iter().any(|q| q["queue"] == "app.orders"),
        "{queues:?}"
    );
    let dead = env.outbox(&["dead", "app.orders", "--routes-file", file]);
    assert_eq!(dead.code, 1, "known queue, no dead jobs: {}", dead.stderr);
    std::fs::write(
        &path,
        "[[route]]\nprefix = \"mail.\"\nqueue = \"app.mail\"\n",
    )
    .unwrap();
    let refused = env.outbox(&["stats", "--routes-file", file]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(refused.code, 2);
    assert!(
        refused.stderr.contains("already routes to"),
        "{}",
        refused.stderr
    );
}

#[tokio::test]
async fn a_misspelled_queue_is_refused_by_dead_and_retry_dead_with_the_list_of_queues() {
    let env = Env::new().await;
    for args in [
        vec!["dead", "outbox.webhok"],
        vec!["dead", "outbox.webhok", "--json"],
        vec!["retry-dead", "outbox.webhok", "--yes"],
    ] {
        let refused = env.outbox(&args);
        assert_eq!(refused.code, 2, "{args:?}: {}", refused.stdout);
        assert!(
            refused.stderr.contains("unknown queue \"outbox.webhok\"")
                && refused.stderr.contains(queues::WEBHOOK)
                && refused.stderr.contains(queues::AUDIT),
            "{args:?}: {}",
            refused.stderr
        );
        assert!(
            !refused.stdout.contains("dead job"),
            "{args:?} printed as if the queue existed: {}",
            refused.stdout
        );
    }
}
