//! The dispatcher's everyday behaviour: hand-off, routing failures, what is
//! never claimed, graceful stop, and the claim plan.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, PausableRedis, exec, no_route_grace, quick_config};
use diesel::sql_types::Text;
use diesel_async::RunQueryDsl;
use outbox_dispatch::{DispatcherConfig, TickReport};
use outbox_model::OutboxStatus;
use outbox_publish::NewOutboxEvent;
use outbox_test_support::LogCapture;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn tick_hands_each_event_to_its_queue_and_marks_it_done() {
    let h = Harness::new().await;
    let ids = h
        .publish(vec![
            NewOutboxEvent::new(
                "acme",
                "mail.user.welcome",
                json!({ "to": "ada@example.com" }),
            )
            .dispatch_key("signup:1"),
            NewOutboxEvent::new("acme", "audit.user.login", json!({ "userId": 1 })),
            NewOutboxEvent::new(
                "globex",
                "billing.subscription.updated",
                json!({ "plan": "pro" }),
            ),
        ])
        .await;
    let dispatcher = h.dispatcher(quick_config());

    let report = dispatcher.tick().await.unwrap();

    assert_eq!(
        report,
        TickReport {
            claimed: 3,
            dispatched: 3,
            ..TickReport::default()
        }
    );
    let expected_queues = ["outbox.mail", "outbox.audit", "outbox.notification"];
    for (id, queue) in ids.iter().zip(expected_queues) {
        let row = h.row(*id).await;
        assert_eq!(row.status, OutboxStatus::Done);
        assert_eq!(row.target_queue.as_deref(), Some(queue));
        assert!(row.processed_at.is_some());
        assert_eq!(
            (row.locked_until, row.retries, row.last_error.clone()),
            (None, 0, None)
        );
        let task_id = format!("outbox:{id}");
        assert_eq!(h.task_ids(queue).await, vec![task_id.clone()]);
        let body = h.job_body(queue, &task_id).await;
        assert_eq!(body["outbox_event_id"], json!(id.to_string()));
        assert_eq!(body["tenant_id"], json!(row.tenant_id));
        assert_eq!(body["event_type"], json!(row.event_type));
        assert_eq!(body["payload"], row.payload.value().unwrap());
        assert_eq!(body["dispatch_key"], json!(row.dispatch_key));
        assert!(body["created_at"].is_string());
    }
    // Nothing left to do.
    assert_eq!(dispatcher.tick().await.unwrap().claimed, 0);
}

#[tokio::test]
async fn a_route_checked_publish_refuses_an_unrouted_event_and_keeps_the_transaction() {
    use diesel_async::AsyncConnection;
    use outbox_publish::{OutboxTx, PublishError, publish_routed_event};

    let h = Harness::new().await;
    let router = outbox_catalog::standard_router()
        .unwrap()
        .with_rule("orders.", "app.orders")
        .unwrap();
    let mut conn = h.conn().await;
    let refused = conn
        .transaction::<_, PublishError, _>(async |conn| {
            let tx = OutboxTx::new(conn)?;
            let refused = publish_routed_event(
                &tx,
                &outbox_catalog::standard_router().unwrap(),
                NewOutboxEvent::new("acme", "orders.order.shipped", json!({ "orderId": 7 })),
            )
            .await
            .unwrap_err();
            // The refusal ran no SQL: the same transaction still publishes.
            publish_routed_event(
                &tx,
                &router,
                NewOutboxEvent::new("acme", "orders.order.shipped", json!({ "orderId": 7 })),
            )
            .await?;
            Ok(refused)
        })
        .await
        .unwrap();

    assert!(
        matches!(&refused, PublishError::Unrouted { event_type } if event_type == "orders.order.shipped"),
        "{refused:?}"
    );
    assert!(refused.is_invalid_event());
    let rows = h.rows().await;
    assert_eq!(rows.len(), 1, "only the routed publish wrote a row");
    assert_eq!(rows[0].event_type, "orders.order.shipped");
}

/// An unroutable row fails by itself: the routed rows claimed with it
/// are handed off in the same tick.
// Break checked: routing that stops at the first unroutable row of a claim
// (a `break` after it in `Dispatcher::route`) leaves a routed row
// unhandled and fails the first assertion.
#[tokio::test]
async fn an_unrouted_event_fails_alone_and_the_rows_claimed_with_it_are_handed_off() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload, scheduled_at) VALUES
           ('globex', 'legacy.report.generated', '{}', now() - interval '3 seconds'),
           ('globex', 'audit.user.login', '{}', now() - interval '2 seconds'),
           ('globex', 'mail.user.welcome', '{}', now() - interval '1 second')",
    )
    .await;
    let dispatcher = h.dispatcher(no_route_grace());

    let report = dispatcher.tick().await.unwrap();

    assert_eq!(
        (report.claimed, report.unrouted, report.dispatched),
        (3, 1, 2),
        "{report:?}"
    );
    let mut statuses: Vec<(String, OutboxStatus)> = h
        .rows()
        .await
        .into_iter()
        .map(|row| (row.event_type, row.status))
        .collect();
    statuses.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        statuses,
        [
            ("audit.user.login".to_owned(), OutboxStatus::Done),
            ("legacy.report.generated".to_owned(), OutboxStatus::Failed),
            ("mail.user.welcome".to_owned(), OutboxStatus::Done),
        ]
    );
}

#[tokio::test]
async fn without_a_grace_period_unrouted_events_fail_at_once_with_the_reason() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         VALUES ('globex', 'legacy.report.generated', '{}')",
    )
    .await;
    let dispatcher = h.dispatcher(no_route_grace());

    let report = dispatcher.tick().await.unwrap();

    assert_eq!(
        (report.claimed, report.unrouted, report.dispatched),
        (1, 1, 0)
    );
    // Break checked: counting the dead-lettered rows into the lost leases
    // (`failures.len() + failed_ids.len()`) fails this.
    assert_eq!(
        report.lost_leases, 0,
        "a row this dispatcher dead-lettered itself is not a lost lease"
    );
    let row = &h.rows().await[0];
    assert_eq!(row.status, OutboxStatus::Failed);
    assert_eq!(row.retries, 0, "no attempt was made");
    assert_eq!(row.target_queue, None);
    let error = row.last_error.as_deref().unwrap();
    assert!(
        error.contains("no routing rule") && error.contains("legacy.report.generated"),
        "{error}"
    );
    assert!(
        h.redis.keys().await.is_empty(),
        "no job was pushed anywhere"
    );
    assert_eq!(
        dispatcher.tick().await.unwrap().claimed,
        0,
        "FAILED rows are not claimed again"
    );
}

// Break checked: a dispatcher that drops the stored trace context from
// its log lines (`trace_id_of` returning `None`) fails this.
#[tokio::test]
async fn the_error_log_of_an_unrouted_row_names_the_trace_of_the_transaction_that_wrote_it() {
    let h = Harness::new().await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        &format!(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, traceparent)
             VALUES ('globex', 'legacy.report.generated', '{{}}',
                     '00-{trace_id}-00f067aa0ba902b7-01')"
        ),
    )
    .await;
    let logs = LogCapture::start();

    let report = h.dispatcher(no_route_grace()).tick().await.unwrap();

    assert_eq!(report.unrouted, 1);
    let id = h.rows().await[0].id.to_string();
    let lines: Vec<String> = logs
        .text()
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains(&id))
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 1, "{}", logs.text());
    assert!(
        lines[0].contains(&format!("trace_id=\"{trace_id}\"")),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("legacy.report.generated"), "{}", lines[0]);
}

#[tokio::test]
async fn future_and_cancelled_rows_are_never_claimed() {
    let h = Harness::new().await;
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let ids = h
        .publish(vec![
            NewOutboxEvent::new("acme", "mail.order.reminder", json!({})).scheduled_at(later),
        ])
        .await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status)
         VALUES ('acme', 'mail.order.cancelled', '{}', 'CANCELLED')",
    )
    .await;
    let dispatcher = h.dispatcher(quick_config());

    for _ in 0..3 {
        assert_eq!(dispatcher.tick().await.unwrap().claimed, 0);
    }
    let rows = h.rows().await;
    let scheduled = rows.iter().find(|r| r.id == ids[0]).unwrap();
    assert_eq!(scheduled.status, OutboxStatus::Pending);
    assert!(rows.iter().any(|r| r.status == OutboxStatus::Cancelled));
    assert!(h.redis.keys().await.is_empty());
}

#[tokio::test]
async fn stopping_mid_tick_releases_the_unhanded_claim() {
    let h = Harness::new().await;
    let events = (0..5)
        .map(|i| NewOutboxEvent::new("acme", "webhook.order.created", json!({ "n": i })))
        .collect();
    h.publish(events).await;
    let dispatcher = h.dispatcher(quick_config());
    let stop = CancellationToken::new();
    stop.cancel();

    let report = dispatcher.tick_until(&stop).await.unwrap();

    assert_eq!(
        (report.claimed, report.released, report.dispatched),
        (5, 5, 0)
    );
    for row in h.rows().await {
        assert_eq!(row.status, OutboxStatus::Pending);
        assert_eq!((row.locked_until, row.retries), (None, 0));
    }
    assert!(h.redis.keys().await.is_empty());
    // Released rows are due at once for the next dispatcher.
    assert_eq!(dispatcher.tick().await.unwrap().dispatched, 5);
}

#[tokio::test]
async fn run_loop_dispatches_and_exits_on_shutdown() {
    let h = Harness::new().await;
    let dispatcher = h.dispatcher(quick_config());
    let shutdown = CancellationToken::new();
    let handle = dispatcher.spawn(shutdown.clone());
    let ids = h
        .publish(vec![NewOutboxEvent::new(
            "acme",
            "audit.user.login",
            json!({}),
        )])
        .await;

    h.wait_for(
        "the event to be DONE",
        Duration::from_secs(30),
        async || h.row(ids[0]).await.status == OutboxStatus::Done,
    )
    .await;
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(30), handle).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "{result:?}");
}

/// `Dispatcher::draining` (what the workers' retention job yields to) says
/// so while a loop hands a backlog off in full batches, and stops saying
/// so once the backlog is gone.
// Break checked: a loop that never records its ticks (`draining.record`
// removed from `run_loop`) fails "the dispatcher to say it drains".
#[tokio::test]
async fn the_dispatcher_says_it_drains_while_its_batches_come_back_full() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    // One row a claim: 2,000 full ticks back to back.
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         SELECT 'acme', 'audit.user.login', '{}' FROM generate_series(1, 2000)",
    )
    .await;
    let dispatcher = h.dispatcher(DispatcherConfig {
        batch_size: 1,
        loops: 1,
        ..quick_config()
    });
    let draining = dispatcher.draining();
    assert!(!draining.is_draining(), "nothing claimed yet");
    let shutdown = CancellationToken::new();
    let handle = dispatcher.spawn(shutdown.clone());

    h.wait_for(
        "the dispatcher to say it drains",
        Duration::from_secs(30),
        async || draining.is_draining(),
    )
    .await;
    h.wait_for(
        "the backlog to be handed off and the dispatcher to stop saying it drains",
        Duration::from_secs(60),
        async || {
            !draining.is_draining()
                && h.rows()
                    .await
                    .iter()
                    .all(|row| row.status == OutboxStatus::Done)
        },
    )
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[derive(diesel::QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

#[tokio::test]
async fn claim_is_an_index_scan_on_a_table_full_of_done_rows() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
         SELECT 't', 'audit.user.login', '{}', 'DONE', now() FROM generate_series(1, 50000);
         INSERT INTO outbox_event (tenant_id, event_type, payload)
         SELECT 't', 'audit.user.login', '{}' FROM generate_series(1, 200);
         ANALYZE outbox_event",
    )
    .await;
    let sql = format!(
        "EXPLAIN {}",
        outbox_store::CLAIM_SQL
            .replace("$1", "100")
            .replace("$2", "300000")
    );
    let plan: Vec<PlanLine> = diesel::sql_query(&sql).load(&mut conn).await.unwrap();
    let plan: Vec<String> = plan.into_iter().map(|l| l.line).collect();
    let text = plan.join("\n");
    assert!(
        text.contains("outbox_event_claimable_idx"),
        "claim does not use the claim index:\n{text}"
    );
    // Run, the claim reads due rows through the claim index (at most the
    // 200 there are: a partitioned table's plan may sort the few due rows
    // of its partitions) and the 100 it updates again by id, never the
    // 50,000 DONE ones.
    let reads = common::reads(&mut conn, &sql["EXPLAIN ".len()..]).await;
    assert_eq!(
        reads.sequential, 0.0,
        "claim scans the table: {reads:?}\n{text}"
    );
    assert!(
        reads.rows <= 300.0,
        "claim reads more than the due rows and its own: {reads:?}"
    );
    if common::partitioned(&mut conn).await {
        // The partitions that hold no due row are read by sequential scans
        // of nothing, and the levels with few rows sorted: what the rows
        // read above bound.
        return;
    }
    assert!(!text.contains("Seq Scan"), "claim scans the table:\n{text}");
    assert!(
        !text.contains("Sort"),
        "claim sorts instead of walking the index:\n{text}"
    );
}

/// A plan as text.
fn text(plan: Vec<PlanLine>) -> String {
    plan.into_iter()
        .map(|l| l.line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `plan` finds rows by id: through the table's primary key, or
/// on a partitioned table through a partition's own or its unique
/// `(id, created_at)` key.
fn by_id(plan: &str) -> bool {
    plan.contains("_pkey") || plan.contains("_id_created_at_key")
}

/// The plans of the four outcome statements (`DONE`, retry, failed,
/// release) for `ids` under `lease`, by name.
async fn outcome_plans(
    conn: &mut diesel_async::AsyncPgConnection,
    ids: &[uuid::Uuid],
    lease: chrono::DateTime<chrono::Utc>,
) -> [(&'static str, String); 5] {
    use diesel::sql_types::{
        Array, BigInt, Bool, Int4, Jsonb, Nullable, Timestamptz, Uuid as SqlUuid,
    };
    use outbox_store as db;

    let queues: serde_json::Map<String, serde_json::Value> = ids
        .iter()
        .map(|id| (id.to_string(), json!("outbox.audit")))
        .collect();
    // The creation times' bounds (see outbox_store's fenced statements).
    let (from, to) = (
        chrono::Utc::now() - chrono::Duration::days(1),
        chrono::Utc::now() + chrono::Duration::days(1),
    );
    let explain = |sql: &str| diesel::sql_query(format!("EXPLAIN {sql}"));
    let done = explain(db::DONE_SQL)
        .bind::<Array<SqlUuid>, _>(ids.to_vec())
        .bind::<Timestamptz, _>(lease)
        .bind::<Jsonb, _>(serde_json::Value::Object(queues))
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .load(conn)
        .await
        .unwrap();
    let retry = explain(db::RETRY_SQL)
        .bind::<Array<SqlUuid>, _>(ids.to_vec())
        .bind::<Timestamptz, _>(lease)
        .bind::<BigInt, _>(1000_i64)
        .bind::<Text, _>("boom")
        .bind::<Text, _>("outbox.audit")
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .load(conn)
        .await
        .unwrap();
    let failed = explain(db::FAILED_SQL)
        .bind::<Array<SqlUuid>, _>(ids.to_vec())
        .bind::<Timestamptz, _>(lease)
        .bind::<Int4, _>(1)
        .bind::<Text, _>("boom")
        .bind::<Nullable<Text>, _>(Some("outbox.audit"))
        .bind::<Bool, _>(false)
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .load(conn)
        .await
        .unwrap();
    let wait = explain(db::WAIT_FOR_ROUTE_SQL)
        .bind::<Array<SqlUuid>, _>(ids.to_vec())
        .bind::<Timestamptz, _>(lease)
        .bind::<BigInt, _>(30_000_i64)
        .bind::<Text, _>("no route")
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .load(conn)
        .await
        .unwrap();
    let release = explain(db::RELEASE_SQL)
        .bind::<Array<SqlUuid>, _>(ids.to_vec())
        .bind::<Timestamptz, _>(lease)
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .load(conn)
        .await
        .unwrap();
    [
        ("done", text(done)),
        ("retry", text(retry)),
        ("failed", text(failed)),
        ("release", text(release)),
        ("wait for a route", text(wait)),
    ]
}

/// A join of the batch against the table is what made big batches slow: at
/// 500 rows and more the planner hash-joined the claim over a sequential
/// scan of the table, and with statistics taken before the claim (saying
/// nothing is `PROCESSING`) it rescanned the outcome statements' batch once
/// per row. No statement of a tick may join anything, here at 1,000 rows on
/// a table of 50,000 with exactly those statistics (docs/performance.md,
/// "Batch size"). The planner may still read a small table whole instead of
/// probing the primary key once per id; that is one pass, never a rescan.
// Break checked: the outcome statements' former `FROM unnest(...) AS v ...
// WHERE e.id = v.id` form fails this with a Nested Loop over a Seq Scan, and
// the claim's former `FROM due WHERE e.id = due.id` with a Hash Join.
#[tokio::test]
async fn no_statement_of_a_tick_joins_its_batch_of_1000_against_the_table() {
    use diesel::sql_types::BigInt;
    use outbox_store as db;

    let h = Harness::new().await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         SELECT 't', 'audit.user.login', '{}' FROM generate_series(1, 50000);
         ANALYZE outbox_event",
    )
    .await;
    let explain = |sql: &str| diesel::sql_query(format!("EXPLAIN {sql}"));
    let claim = explain(db::CLAIM_SQL)
        .bind::<BigInt, _>(1000_i64)
        .bind::<BigInt, _>(300_000_i64)
        .load(&mut conn)
        .await
        .unwrap();
    let claimed = db::claim(&mut conn, 1000, 300_000).await.unwrap();
    assert_eq!(claimed.len(), 1000);
    let lease = claimed[0].locked_until.unwrap();
    assert!(
        claimed.iter().all(|e| e.locked_until == Some(lease)),
        "one lease for the whole claim"
    );
    let ids: Vec<uuid::Uuid> = claimed.iter().map(|e| e.id).collect();
    let mut plans = vec![("claim", text(claim))];
    plans.extend(outcome_plans(&mut conn, &ids, lease).await);
    for (name, plan) in &plans {
        for forbidden in ["Nested Loop", "Hash Join", "Merge Join", "Function Scan"] {
            assert!(
                !plan.contains(forbidden),
                "{name}: {forbidden} in the plan:\n{plan}"
            );
        }
    }
    let claim_plan = &plans[0].1;
    assert!(
        claim_plan.contains("outbox_event_claimable_idx"),
        "the claim does not use the claim index:\n{claim_plan}"
    );
    // Run, the next claim of 1,000 reads about 1,000 of the 49,000 due
    // rows along the claim index (it walks it, it does not sort them all),
    // and the same 1,000 again by id to update them.
    let reads = common::reads(
        &mut conn,
        &db::CLAIM_SQL.replace("$1", "1000").replace("$2", "300000"),
    )
    .await;
    assert!(
        reads.rows <= 2_100.0 && reads.sequential == 0.0,
        "the claim does not walk the claim index: {reads:?}\n{claim_plan}"
    );
    if !common::partitioned(&mut conn).await {
        // One table: one walk, no sort (a partitioned table's plan may sort
        // the few rows of the levels and partitions that hold little).
        assert!(
            !claim_plan.contains("Sort"),
            "the claim does not walk the claim index:\n{claim_plan}"
        );
    }
}

/// Statistics taken while nothing was due say the claim index is nearly
/// empty; then a backlog builds (a worker was down). The outcome statements
/// must still find their rows through the primary key: read through the
/// claim index (whose predicate a plain `status = 'PROCESSING'` matches),
/// each of them walked the entries of all 50,000 due rows, 5 ms a statement
/// instead of 0.04 (docs/performance.md, "Plans that go stale").
// Break checked: the fence written `status = 'PROCESSING'` again fails this
// with `Index Scan using outbox_event_claimable_idx` in every plan.
#[tokio::test]
async fn the_outcome_statements_use_the_primary_key_when_a_backlog_outgrew_the_statistics() {
    use outbox_store as db;

    let h = Harness::new().await;
    let mut conn = h.conn().await;
    // Autovacuum's own ANALYZE would refresh the statistics this test needs
    // stale.
    common::without_autovacuum(&mut conn).await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at)
         SELECT 't', 'audit.user.login', '{}', 'DONE', now() FROM generate_series(1, 2000);
         ANALYZE outbox_event;
         INSERT INTO outbox_event (tenant_id, event_type, payload)
         SELECT 't', 'audit.user.login', '{}' FROM generate_series(1, 50000)",
    )
    .await;
    let claimed = db::claim(&mut conn, 3, 300_000).await.unwrap();
    assert_eq!(claimed.len(), 3);
    let lease = claimed[0].locked_until.unwrap();
    let ids: Vec<uuid::Uuid> = claimed.iter().map(|e| e.id).collect();
    for (name, plan) in outcome_plans(&mut conn, &ids, lease).await {
        assert!(
            by_id(&plan) && !plan.contains("outbox_event_claimable_idx"),
            "{name} does not find its rows through the primary key:\n{plan}"
        );
    }
    // The dispatcher's statements are prepared, and Postgres may keep one
    // generic plan for them: that one too.
    let array = format!(
        "'{{{}}}'::uuid[]",
        ids.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    exec(
        &mut conn,
        &format!(
            "SET plan_cache_mode = force_generic_plan;
             PREPARE done_generic(uuid[], timestamptz, jsonb, timestamptz, timestamptz) AS {}",
            db::DONE_SQL
        ),
    )
    .await;
    let generic: Vec<PlanLine> = diesel::sql_query(format!(
        "EXPLAIN EXECUTE done_generic({array}, '{}'::timestamptz, '{{}}'::jsonb, \
         now() - interval '1 day', now() + interval '1 day')",
        lease.to_rfc3339()
    ))
    .load(&mut conn)
    .await
    .unwrap();
    let generic = text(generic);
    assert!(
        by_id(&generic) && !generic.contains("outbox_event_claimable_idx"),
        "the generic plan of done does not use the primary key:\n{generic}"
    );
    exec(&mut conn, "DEALLOCATE done_generic; RESET plan_cache_mode").await;
    // And the fence still fences: the rows are DONE under their lease, and
    // a second DONE under it finds no row still PROCESSING.
    let done: Vec<(db::Lease, String)> = claimed
        .iter()
        .map(|e| (db::Lease::of(e).unwrap(), "outbox.audit".to_owned()))
        .collect();
    let mut updated = db::mark_done(&mut conn, &done).await.unwrap();
    updated.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(updated, expected);
    assert!(db::mark_done(&mut conn, &done).await.unwrap().is_empty());
}

#[derive(diesel::QueryableByName)]
struct PreparedStatement {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    statement: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    generic_plans: i64,
}

/// A tick's statements stay prepared on their connection (one round trip a
/// call instead of a `Parse` and an `Execute`), and the plan Postgres keeps
/// for the claim after many calls (it may switch a prepared statement to
/// one generic plan after five) still walks the claim index without a
/// join, at 1,000 rows on a table of 50,000 due rows.
// Break checked: claiming through `diesel::sql_query` again leaves no
// prepared claim on the connection and fails the first assertion.
#[tokio::test]
async fn the_claim_and_done_statements_stay_prepared_and_keep_their_index_plan() {
    use outbox_store as db;

    let h = Harness::new().await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         SELECT 't', 'audit.user.login', '{}' FROM generate_series(1, 50000);
         ANALYZE outbox_event",
    )
    .await;
    for _ in 0..8 {
        let claimed = db::claim(&mut conn, 1000, 300_000).await.unwrap();
        assert_eq!(claimed.len(), 1000);
        let done: Vec<(db::Lease, String)> = claimed
            .iter()
            .map(|e| (db::Lease::of(e).unwrap(), "outbox.audit".to_owned()))
            .collect();
        assert_eq!(db::mark_done(&mut conn, &done).await.unwrap().len(), 1000);
    }
    let kept: Vec<PreparedStatement> =
        diesel::sql_query("SELECT name, statement, generic_plans FROM pg_prepared_statements")
            .load(&mut conn)
            .await
            .unwrap();
    let named = |sql: &str| -> Vec<&PreparedStatement> {
        kept.iter().filter(|p| p.statement == sql).collect()
    };
    let claims = named(db::CLAIM_SQL);
    assert_eq!(
        claims.len(),
        1,
        "the claim is not kept prepared: {:?}",
        kept.iter().map(|p| &p.statement).collect::<Vec<_>>()
    );
    assert_eq!(
        named(db::DONE_SQL).len(),
        1,
        "the DONE update is not kept prepared"
    );
    let plan: Vec<PlanLine> =
        diesel::sql_query(format!("EXPLAIN EXECUTE {}(1000, 300000)", claims[0].name))
            .load(&mut conn)
            .await
            .unwrap();
    let plan = text(plan);
    // A partitioned table's plan reads the partitions that hold nothing by
    // sequential scans of nothing: the rows read below bound it.
    let forbidden: &[&str] = if common::partitioned(&mut conn).await {
        &["Nested Loop", "Hash Join", "Merge Join"]
    } else {
        &["Nested Loop", "Hash Join", "Merge Join", "Seq Scan"]
    };
    for forbidden in forbidden {
        assert!(
            !plan.contains(forbidden),
            "claim after {} generic plans: {forbidden} in the plan:\n{plan}",
            claims[0].generic_plans
        );
    }
    assert!(
        plan.contains("outbox_event_claimable_idx"),
        "the prepared claim does not use the claim index:\n{plan}"
    );
    let reads = common::reads(
        &mut conn,
        &format!("EXECUTE {}(1000, 300000)", claims[0].name),
    )
    .await;
    assert!(
        reads.rows <= 2_100.0 && reads.sequential == 0.0 && reads.joins.is_empty(),
        "the prepared claim of 1,000 reads more than about 1,000 of the 42,000 due rows \
         (and the same again by id): {reads:?}"
    );
}

/// Payloads Postgres accepts but `serde_json::Value` cannot hold or would
/// change: 200 levels of nesting, a number outside f64, an integer past 64
/// bits, a long decimal.
fn awkward_payloads() -> Vec<String> {
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    vec![
        format!(r#"{{"deep": {deep}}}"#),
        r#"{"huge": 1e400}"#.to_owned(),
        r#"{"id": 123456789012345678901234567, "amount": 0.1000000000000000055511151231257827}"#
            .to_owned(),
    ]
}

#[tokio::test]
async fn payloads_travel_as_the_exact_text_postgres_holds_and_none_stalls_its_claim() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    // Plain-SQL producers: an ordinary row first and last, the awkward ones between.
    let mut payloads = vec![r#"{"userId": 1}"#.to_owned()];
    payloads.extend(awkward_payloads());
    payloads.push(r#"{"userId": 2}"#.to_owned());
    for payload in &payloads {
        diesel::sql_query(
            "INSERT INTO outbox_event (tenant_id, event_type, payload)
             VALUES ('acme', 'audit.user.login', $1::jsonb)",
        )
        .bind::<Text, _>(payload)
        .execute(&mut conn)
        .await
        .unwrap();
    }

    let report = h.dispatcher(quick_config()).tick().await.unwrap();
    assert_eq!(
        (report.claimed, report.dispatched, report.failed),
        (payloads.len(), payloads.len(), 0),
        "{report:?}"
    );
    #[derive(diesel::QueryableByName)]
    struct Stored {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        id: uuid::Uuid,
        #[diesel(sql_type = Text)]
        status: String,
        #[diesel(sql_type = Text)]
        payload: String,
    }
    let stored: Vec<Stored> =
        diesel::sql_query("SELECT id, status, payload::text AS payload FROM outbox_event")
            .load(&mut conn)
            .await
            .unwrap();
    assert_eq!(stored.len(), payloads.len());
    for row in stored {
        assert_eq!(row.status, "DONE");
        let body = h
            .job_text("outbox.audit", &format!("outbox:{}", row.id))
            .await;
        assert!(
            body.contains(&format!(r#""payload":{}"#, row.payload)),
            "the job carries the payload text unchanged:\nrow: {}\njob: {body}",
            row.payload
        );
    }
    // The CLI and tests load such rows too.
    assert_eq!(h.rows().await.len(), payloads.len());
}

#[tokio::test]
async fn an_oversized_plain_sql_payload_fails_alone_with_its_size() {
    let h = Harness::new().await;
    let mut conn = h.conn().await;
    let big = format!(
        r#"{{"blob": "{}"}}"#,
        "x".repeat(outbox_model::MAX_PAYLOAD_BYTES)
    );
    for payload in [r#"{"n": 1}"#, big.as_str(), r#"{"n": 2}"#] {
        diesel::sql_query(
            "INSERT INTO outbox_event (tenant_id, event_type, payload)
             VALUES ('acme', 'audit.user.login', $1::jsonb)",
        )
        .bind::<Text, _>(payload)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let report = h.dispatcher(quick_config()).tick().await.unwrap();
    assert_eq!(
        (report.claimed, report.dispatched, report.oversized),
        (3, 2, 1),
        "{report:?}"
    );
    let rows = h.rows().await;
    let failed: Vec<_> = rows
        .iter()
        .filter(|r| r.status == OutboxStatus::Failed)
        .collect();
    assert_eq!(failed.len(), 1);
    assert!(failed[0].payload.get().len() > outbox_model::MAX_PAYLOAD_BYTES);
    let reason = failed[0].last_error.as_deref().unwrap_or_default();
    assert!(
        reason.contains("exceeds the 1048576-byte limit"),
        "{reason}"
    );
    assert_eq!(failed[0].retries, 0);
    assert_eq!(
        rows.iter()
            .filter(|r| r.status == OutboxStatus::Done)
            .count(),
        2
    );
}

// Break checked: with `SKIP LOCKED` deleted from `db::CLAIM_SQL` (plain
// `FOR UPDATE`), or the whole `FOR UPDATE SKIP LOCKED` deleted, the claim
// waits for the other session and this fails with "the claim waited for the
// row another session holds".
#[tokio::test]
async fn a_row_locked_by_another_session_does_not_hold_up_the_others() {
    let h = Harness::new().await;
    let events = (0..3)
        .map(|i| NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": i })))
        .collect();
    let ids = h.publish(events).await;
    // An operator's session holds one due row in an open transaction.
    let mut operator = h.conn().await;
    exec(
        &mut operator,
        &format!(
            "BEGIN; SELECT id FROM outbox_event WHERE id = '{}' FOR UPDATE",
            ids[1]
        ),
    )
    .await;
    let dispatcher = h.dispatcher(quick_config());

    let report = tokio::time::timeout(Duration::from_secs(10), dispatcher.tick())
        .await
        .expect("the claim waited for the row another session holds")
        .unwrap();

    assert_eq!((report.claimed, report.dispatched), (2, 2), "{report:?}");
    assert_eq!(h.row(ids[1]).await.status, OutboxStatus::Pending);
    for id in [ids[0], ids[2]] {
        assert_eq!(h.row(id).await.status, OutboxStatus::Done);
    }
    // Once the session lets go, the row is dispatched like any other.
    exec(&mut operator, "ROLLBACK").await;
    assert_eq!(dispatcher.tick().await.unwrap().dispatched, 1);
    assert_eq!(h.row(ids[1]).await.status, OutboxStatus::Done);
}

/// `outbox stats` per queue: rows of several event types on one queue add
/// up, rows not yet routed count where the router would send them, and
/// unroutable ones under `(unrouted)`.
// Break checked: subtracting each group instead of adding it gives -2 for
// the mail queue.
#[tokio::test]
async fn stats_add_up_the_rows_of_every_event_type_on_a_queue() {
    let h = Harness::new().await;
    h.publish(vec![
        NewOutboxEvent::new("acme", "mail.user.welcome", json!({})),
        NewOutboxEvent::new("acme", "mail.user.goodbye", json!({})),
        NewOutboxEvent::new("acme", "audit.user.login", json!({})),
    ])
    .await;
    let mut conn = h.conn().await;
    exec(
        &mut conn,
        "INSERT INTO outbox_event (tenant_id, event_type, payload) VALUES ('t', 'legacy.report.generated', '{}')",
    )
    .await;

    let stats = outbox_dispatch::stats::outbox_stats(
        &mut conn,
        &outbox_catalog::standard_router().unwrap(),
    )
    .await
    .unwrap();

    assert_eq!(stats.by_status["PENDING"], 4, "{stats:?}");
    assert_eq!(stats.by_queue["outbox.mail"]["PENDING"], 2, "{stats:?}");
    assert_eq!(stats.by_queue["outbox.audit"]["PENDING"], 1, "{stats:?}");
    assert_eq!(stats.by_queue["(unrouted)"]["PENDING"], 1, "{stats:?}");
}

async fn processing(h: &Harness) -> usize {
    h.rows()
        .await
        .iter()
        .filter(|row| row.status == OutboxStatus::Processing)
        .count()
}

/// A dispatcher of `loops` loops (batches of 10, quick polling) on a Redis
/// of its own whose writes are paused: every push waits (up to the
/// connection's 5 s response timeout), so a loop that claimed holds its
/// rows meanwhile, and the rows in flight show which loops claimed.
struct PausedLoops {
    redis: PausableRedis,
    shutdown: CancellationToken,
    run: tokio::task::JoinHandle<Result<(), outbox_dispatch::DispatchError>>,
}

impl PausedLoops {
    async fn start(h: &Harness, loops: usize) -> Self {
        let mut redis = PausableRedis::start().await;
        redis.pause_writes().await;
        let dispatcher = h.dispatcher_on(
            &redis.process.url(),
            outbox_dispatch::DispatcherConfig {
                batch_size: 10,
                loops,
                backoff: vec![Duration::from_millis(100)],
                ..quick_config()
            },
        );
        let shutdown = CancellationToken::new();
        let run = dispatcher.spawn(shutdown.clone());
        Self {
            redis,
            shutdown,
            run,
        }
    }

    /// Lets the pushes through, waits until every row is handed off and
    /// stops the dispatcher.
    async fn finish(mut self, h: &Harness) {
        self.redis.unpause().await;
        h.wait_all_done("every row to be handed off", Duration::from_secs(60))
            .await;
        self.shutdown.cancel();
        self.run.await.unwrap().unwrap();
    }
}

/// Publishes a batch more than `loops` loops claim and waits until each of
/// them holds a batch of 10 behind the paused Redis.
async fn each_loop_holds_a_batch(loops: usize) {
    let h = Harness::with_pool_size(8).await;
    h.publish(
        (0..(loops + 1) * 10)
            .map(|n| NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": n })))
            .collect(),
    )
    .await;
    let paused = PausedLoops::start(&h, loops).await;
    h.wait_for(
        &format!("each of the {loops} loops to hold a batch of 10"),
        Duration::from_secs(30),
        async || processing(&h).await == loops * 10,
    )
    .await;
    paused.finish(&h).await;
}

// Break checked: `run` starting one loop whatever `loops` says fails with
// "each of the 2 loops to hold a batch of 10".
#[tokio::test]
async fn each_dispatch_loop_claims_its_own_batch_while_the_pushes_of_the_others_wait() {
    each_loop_holds_a_batch(2).await;
}

// Break checked: without the wake-up of a helping loop at a full claim
// (`more.notify_one()` left out) this fails with "each of the 4 loops to
// hold a batch of 10".
#[tokio::test]
async fn loops_beyond_the_answering_two_join_in_while_batches_come_back_full() {
    each_loop_holds_a_batch(4).await;
}

/// With two loops, a claim that comes back full wakes the other loop,
/// which claims the next batch beside it instead of waiting for its poll:
/// a backlog that appears while both wait is worked by both.
// Break checked: with the wake-up after a full claim left out (the
// condition `loops_running() > 1` as `== 1`, a miss of the mutation runs)
// this fails with "both loops to hold a batch of 10".
#[tokio::test]
async fn a_full_claim_wakes_the_other_loop_which_claims_beside_it() {
    let h = Harness::with_pool_size(8).await;
    let mut redis = PausableRedis::start().await;
    redis.pause_writes().await;
    // Neither loop polls again within the test: only a wake-up makes one
    // claim.
    let dispatcher = h.dispatcher_on(
        &redis.process.url(),
        DispatcherConfig {
            batch_size: 10,
            loops: 2,
            interval: Duration::from_secs(3600),
            backoff: vec![Duration::from_millis(100)],
            ..quick_config()
        },
    );
    // Due only after both loops' first claims found nothing.
    let due = chrono::Utc::now() + chrono::TimeDelta::seconds(3);
    h.publish(
        (0..30)
            .map(|n| {
                NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": n })).scheduled_at(due)
            })
            .collect(),
    )
    .await;
    let shutdown = CancellationToken::new();
    let run = dispatcher.clone().spawn(shutdown.clone());
    h.wait_for(
        "the rows to fall due",
        Duration::from_secs(30),
        async || chrono::Utc::now() > due + chrono::TimeDelta::milliseconds(100),
    )
    .await;
    assert_eq!(processing(&h).await, 0, "a loop claimed before the wake-up");
    // One wake-up, as one insert notification would give: one loop.
    dispatcher.wake();
    h.wait_for(
        "both loops to hold a batch of 10",
        Duration::from_secs(30),
        async || processing(&h).await == 20,
    )
    .await;
    redis.unpause().await;
    // Rows whose push timed out meanwhile are due again shortly; the loops
    // do not poll, so each look wakes one.
    h.wait_for(
        "every row to be handed off",
        Duration::from_secs(60),
        async || {
            dispatcher.wake();
            h.rows()
                .await
                .iter()
                .all(|row| row.status == OutboxStatus::Done)
        },
    )
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

/// Under a trickle (no claim comes back full) only the first
/// `WAKE_LOOPS` loops claim: the others neither poll nor answer wake-ups,
/// so that a steady load is not split into more, smaller ticks.
// Break checked: with every loop answering the poll interval (the
// behaviour before), the later trickles are claimed by the helping loops
// and this fails ("a helping loop claimed a trickle"), in two runs of two.
#[tokio::test]
async fn loops_beyond_the_answering_two_stay_out_of_a_trickle() {
    assert_eq!(outbox_dispatch::WAKE_LOOPS, 2);
    let h = Harness::with_pool_size(8).await;
    let paused = PausedLoops::start(&h, 4).await;
    let trickle = async |from: usize| {
        h.publish(
            (from..from + 3)
                .map(|n| NewOutboxEvent::new("acme", "audit.user.login", json!({ "n": n })))
                .collect(),
        )
        .await
    };
    // The rows of one claim share their `locked_until`: the loops holding
    // rows are the distinct values among the rows in flight.
    let one_or_two_claims = async || {
        let rows = h.rows().await;
        let held: std::collections::BTreeSet<_> = rows
            .iter()
            .filter(|row| row.status == OutboxStatus::Processing)
            .filter_map(|row| row.locked_until)
            .collect();
        (1..=2).contains(&held.len())
    };
    trickle(0).await;
    h.wait_for(
        "the first trickle to be claimed",
        Duration::from_secs(30),
        async || processing(&h).await == 3,
    )
    .await;
    // Each trickle three poll intervals after the one before, so that a
    // loop that polled would claim it on its own, and a second more after
    // the last. Every claim holds its rows meanwhile (well within the 5 s
    // push timeout).
    let what = "one or two claims in flight: a helping loop claimed a trickle";
    outbox_test_support::consistently(what, Duration::from_millis(300), one_or_two_claims).await;
    trickle(3).await;
    outbox_test_support::consistently(what, Duration::from_millis(300), one_or_two_claims).await;
    trickle(6).await;
    outbox_test_support::consistently(what, Duration::from_secs(1), one_or_two_claims).await;
    paused.finish(&h).await;
}

// Break checked: the dispatcher's `Debug` replaced by an empty result
// (a mutation run's shard 6) fails here; `Dispatcher::config` giving the
// defaults instead of its configuration fails the last assertion.
#[tokio::test]
async fn a_dispatcher_gives_back_its_settings_and_names_them_and_its_namespace_in_a_log_line() {
    let h = Harness::new().await;
    let config = DispatcherConfig {
        batch_size: 37,
        ..quick_config()
    };
    let dispatcher = h.dispatcher(config.clone());
    let shown = format!("{dispatcher:?}");
    assert!(shown.starts_with("Dispatcher"), "{shown}");
    assert!(shown.contains(h.namespace.prefix()), "{shown}");
    assert!(shown.contains("batch_size: 37"), "{shown}");
    assert_eq!(
        dispatcher.config(),
        &config,
        "the configuration it runs with"
    );
}
