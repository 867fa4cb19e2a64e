//! Priorities in the claim: which due rows a claim takes first, how plain
//! SQL sets the column, and the claim's plan with levels.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{database, insert_row, new_row, row, set};
use diesel::QueryableByName;
use diesel::prelude::*;
use diesel::sql_types::Text;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_model::schema::outbox_event;
use outbox_model::{NewOutboxEventRow, OutboxStatus, Priority};
use outbox_store::claim;
use uuid::Uuid;

const LEASE_MS: i64 = 60_000;

/// Inserts `n` due rows of `level` by plain SQL, as a bulk producer would,
/// each created a second before the one after it, the oldest an hour ago.
async fn backlog(conn: &mut AsyncPgConnection, n: usize, level: i16) {
    // One creation time for all: spread like the schedule, 20,000 rows
    // reached 4.5 hours ahead, into tomorrow's partition when the run is
    // late in the day (UTC), and the plan test then saw that partition read
    // by a scan.
    conn.batch_execute(&format!(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, priority, created_at, scheduled_at)
         SELECT 'acme', 'mail.newsletter.sent', '{{}}', {level},
                now() - interval '1 hour',
                now() - interval '1 hour' + make_interval(secs => g)
         FROM generate_series(1, {n}) AS g"
    ))
    .await
    .unwrap();
}

async fn insert_at(conn: &mut AsyncPgConnection, priority: Priority) -> Uuid {
    insert_row(
        conn,
        NewOutboxEventRow {
            priority,
            ..new_row("mail.user.password-reset")
        },
    )
    .await
}

fn ids(events: &[outbox_model::OutboxEvent]) -> Vec<Uuid> {
    events.iter().map(|e| e.id).collect()
}

#[tokio::test]
async fn a_highest_priority_row_published_after_a_backlog_of_bulk_rows_is_in_the_first_claim() {
    let (_db, mut conn) = database().await;
    backlog(&mut conn, 5_000, -2).await;
    backlog(&mut conn, 100, 0).await;
    let reset = insert_at(&mut conn, Priority::HIGHEST).await;

    let claimed = claim(&mut conn, 10, LEASE_MS).await.unwrap();

    assert_eq!(claimed.len(), 10);
    assert!(ids(&claimed).contains(&reset), "the reset mail waits");
    assert_eq!(row(&mut conn, reset).await.status, OutboxStatus::Processing);
    assert_eq!(
        claimed
            .iter()
            .filter(|e| e.priority == Priority::NORMAL)
            .count(),
        9,
        "the rest of the batch is the next level down, not the bulk rows"
    );
}

#[tokio::test]
async fn a_claim_takes_levels_highest_first_and_each_level_oldest_first() {
    let (_db, mut conn) = database().await;
    // Inserted lowest level first, so that creation order and priority
    // order disagree.
    let mut by_level = Vec::new();
    for level in Priority::ALL.iter().rev() {
        let older = insert_at(&mut conn, *level).await;
        let newer = insert_at(&mut conn, *level).await;
        set(
            &mut conn,
            older,
            "scheduled_at = now() - interval '1 minute'",
        )
        .await;
        by_level.push((*level, older, newer));
    }

    let mut claimed_in_order = Vec::new();
    for _ in 0..5 {
        let mut claimed = claim(&mut conn, 2, LEASE_MS).await.unwrap();
        claimed.sort_by_key(|e| e.scheduled_at);
        claimed_in_order.extend(claimed.into_iter().map(|e| (e.priority, e.id)));
    }

    let expected: Vec<(Priority, Uuid)> = by_level
        .iter()
        .rev()
        .flat_map(|(level, older, newer)| [(*level, *older), (*level, *newer)])
        .collect();
    assert_eq!(claimed_in_order, expected);
}

#[tokio::test]
async fn a_highest_priority_row_scheduled_for_later_waits_for_its_time() {
    let (_db, mut conn) = database().await;
    let later = insert_at(&mut conn, Priority::HIGHEST).await;
    set(&mut conn, later, "scheduled_at = now() + interval '1 hour'").await;
    let bulk = insert_at(&mut conn, Priority::LOWEST).await;

    let claimed = claim(&mut conn, 10, LEASE_MS).await.unwrap();

    assert_eq!(ids(&claimed), [bulk]);
    assert_eq!(row(&mut conn, later).await.status, OutboxStatus::Pending);
}

async fn count(conn: &mut AsyncPgConnection) -> i64 {
    outbox_event::table.count().get_result(conn).await.unwrap()
}

#[tokio::test]
async fn a_plain_sql_insert_sets_the_priority_and_an_out_of_range_one_is_refused_and_writes_nothing()
 {
    let (_db, mut conn) = database().await;
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         VALUES ('acme', 'mail.newsletter.sent', '{}');
         INSERT INTO outbox_event (tenant_id, event_type, payload, priority)
         VALUES ('acme', 'mail.user.password-reset', '{}', 1)",
    )
    .await
    .unwrap();

    let refused = conn
        .batch_execute(
            "INSERT INTO outbox_event (tenant_id, event_type, payload, priority)
             VALUES ('acme', 'mail.user.password-reset', '{}', 3)",
        )
        .await
        .unwrap_err();

    assert!(
        refused.to_string().contains("outbox_event_priority_check"),
        "{refused}"
    );
    assert_eq!(count(&mut conn).await, 2);
    let claimed = claim(&mut conn, 1, LEASE_MS).await.unwrap();
    assert_eq!(
        (claimed[0].event_type.as_str(), claimed[0].priority),
        ("mail.user.password-reset", Priority::HIGH)
    );
    let normal = claim(&mut conn, 1, LEASE_MS).await.unwrap();
    assert_eq!(normal[0].priority, Priority::NORMAL, "the default level");
}

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

/// Each level is one range of the claim index, bounded by `now()`: rows
/// scheduled for later (here 20,000 of the highest level) are never walked,
/// nothing is sorted, and no level reads the table.
// Break checked: the claim index without its leading `priority` column
// fails this with a Sort and no `priority = 2` in the index condition.
#[tokio::test]
async fn each_level_of_the_claim_is_a_range_of_the_claim_index_bounded_by_now() {
    let (_db, mut conn) = database().await;
    backlog(&mut conn, 20_000, -2).await;
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, priority, scheduled_at)
         SELECT 'acme', 'mail.user.password-reset', '{}', 2, now() + interval '1 day'
         FROM generate_series(1, 20000);
         ANALYZE outbox_event",
    )
    .await
    .unwrap();

    let partitioned = outbox_store::partitioning(&mut conn)
        .await
        .unwrap()
        .is_some();
    let plan: Vec<PlanLine> = diesel::sql_query(format!(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {}",
        outbox_store::CLAIM_SQL
            .replace("$1", "100")
            .replace("$2", "300000")
    ))
    .load(&mut conn)
    .await
    .unwrap();
    let plan = plan
        .into_iter()
        .map(|l| l.line)
        .collect::<Vec<_>>()
        .join("\n");

    // The status and the priority are domains over text and smallint
    // (their rules live in the column types): Postgres shows the columns
    // relabelled to the base types.
    let due = "(CASE WHEN ((status)::text = 'PENDING'::text) THEN scheduled_at ELSE locked_until END <= now())";
    for level in Priority::ALL {
        // Postgres shows a negative literal quoted.
        let literal = if level.get() < 0 {
            format!("'{level}'::integer")
        } else {
            level.to_string()
        };
        let ranges = plan
            .matches(&format!(
                "Index Cond: (((priority)::smallint = {literal}) AND {due})"
            ))
            .count();
        // A partitioned table has one claim index per partition: the
        // partition holding the rows is read by a range of its own.
        assert!(
            ranges == 1 || (partitioned && ranges >= 1),
            "level {level} is not a range of the claim index bounded by now():\n{plan}"
        );
    }
    if !partitioned {
        assert_eq!(
            plan.matches("Index Scan using outbox_event_claimable_idx")
                .count(),
            5,
            "one scan of the claim index per level:\n{plan}"
        );
        for forbidden in ["Seq Scan", "Sort", "Rows Removed by Filter"] {
            assert!(
                !plan.contains(forbidden),
                "{forbidden} in the claim:\n{plan}"
            );
        }
        return;
    }
    // The rows are in the partition that was the table before the
    // conversion; the planner may read an empty partition by a scan of its
    // (zero) pages, never one that holds rows.
    assert_eq!(
        plan.matches("Index Scan using outbox_event_claimable_idx_legacy")
            .count(),
        5,
        "one scan of the claim index per level:\n{plan}"
    );
    let empty: Vec<String> = outbox_store::partitions(&mut conn)
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p.rows_estimate == 0.0)
        .map(|p| p.name)
        .collect();
    for line in plan.lines().filter(|l| l.contains("Seq Scan on ")) {
        assert!(
            empty
                .iter()
                .any(|name| line.contains(&format!("Seq Scan on {name} "))),
            "a partition holding rows is read without its index: {line}\n{plan}"
        );
    }
    assert!(
        !plan.contains("Rows Removed by Filter"),
        "the claim read rows it did not take:\n{plan}"
    );
}
