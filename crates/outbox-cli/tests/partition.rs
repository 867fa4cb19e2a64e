//! `outbox partition convert | status` on the real binary: a table with
//! rows is converted, its rows are all still there and in the legacy
//! partition, a second conversion is refused with exit code 2, and
//! `status` lists the partitions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use diesel_async::SimpleAsyncConnection;

use crate::common::Env;

/// A test database and a connection to it, unless the run's databases are
/// partitioned already (`OUTBOX_TEST_PARTITIONED`).
async fn one_table() -> Option<(Env, diesel_async::AsyncPgConnection)> {
    let env = Env::new().await;
    let mut conn = env.db.conn().await;
    let partitioned = outbox_store::partitioning(&mut conn)
        .await
        .unwrap()
        .is_some();
    (!partitioned).then_some((env, conn))
}

#[tokio::test]
async fn convert_partitions_a_table_with_rows_and_status_lists_its_partitions() {
    let Some((env, mut conn)) = one_table().await else {
        return; // the run's databases are partitioned already
    };
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, status, processed_at, dispatch_key)
         SELECT 'acme', 'audit.user.login', '{}', 'DONE', now(), 'k-' || g
         FROM generate_series(1, 50) AS g",
    )
    .await
    .unwrap();
    let before = env.outbox(&["partition", "status", "--json"]);
    assert_eq!(before.code, 0, "{}{}", before.stdout, before.stderr);
    assert_eq!(before.json()["partitioned"], false);

    let convert = env.outbox(&[
        "partition",
        "convert",
        "--unit",
        "day",
        "--ahead",
        "2",
        "--json",
    ]);

    assert_eq!(convert.code, 0, "{}{}", convert.stdout, convert.stderr);
    assert_eq!(convert.json()["dispatch_keys"], 50, "{}", convert.stdout);
    assert!(
        convert.json()["locked_ms"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "the conversion says how long it held the table's lock: {}",
        convert.stdout
    );
    let status = env.outbox(&["partition", "status", "--json"]);
    assert_eq!(status.code, 0, "{}{}", status.stdout, status.stderr);
    let status = status.json();
    assert_eq!(status["partitioned"], true);
    assert_eq!(status["unit"], "day");
    let names: Vec<&str> = status["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.first(), Some(&"outbox_event_legacy"), "{names:?}");
    assert_eq!(names.last(), Some(&"outbox_event_default"), "{names:?}");
    // Legacy, the partitions ahead, default. The legacy partition holds
    // up to the day after the one ten minutes from now, so in the last ten
    // minutes of a UTC day one fewer partition is ahead of it.
    assert!(names.len() >= 3, "{names:?}");
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let legacy: Count = diesel_async::RunQueryDsl::get_result(
        diesel::sql_query("SELECT count(*) AS n FROM outbox_event_legacy WHERE status = 'DONE'"),
        &mut conn,
    )
    .await
    .unwrap();
    assert_eq!(legacy.n, 50, "every row stays where it was");

    let again = env.outbox(&["partition", "convert"]);
    assert_eq!(again.code, 2, "{}{}", again.stdout, again.stderr);
    assert!(
        again.stderr.contains("partitioned already"),
        "{}",
        again.stderr
    );
}

#[tokio::test]
async fn status_names_a_table_partitioned_by_other_means_and_exits_1() {
    let Some((env, mut conn)) = one_table().await else {
        return; // the run's databases are partitioned already
    };
    conn.batch_execute(
        "ALTER TABLE outbox_event RENAME TO outbox_event_before_by_hand;
         CREATE TABLE outbox_event (LIKE outbox_event_before_by_hand)
             PARTITION BY RANGE (created_at)",
    )
    .await
    .unwrap();

    let status = env.outbox(&["partition", "status", "--json"]);
    assert_eq!(status.code, 1, "{}{}", status.stdout, status.stderr);
    assert_eq!(status.json()["partitioned_by_other_means"], true);
    let text = env.outbox(&["partition", "status"]);
    assert!(
        text.stdout
            .contains("outbox_event is partitioned, but not by `outbox partition convert`"),
        "{}",
        text.stdout
    );
}

// What a failed conversion left on the one table (here its bound
// constraint, which would refuse rows created past it) is named, with
// exit code 1, until the retention job or another conversion removes it.
// Break checked: with `conversion_leftovers` answering nothing, status
// exits 0 and names nothing.
#[tokio::test]
async fn status_names_what_a_failed_conversion_left_and_exits_1_until_it_is_removed() {
    let Some((env, mut conn)) = one_table().await else {
        return; // the run's databases are partitioned already
    };
    conn.batch_execute(
        "ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_partition_bound
             CHECK (created_at < now() + interval '1 day') NOT VALID",
    )
    .await
    .unwrap();

    let status = env.outbox(&["partition", "status", "--json"]);
    assert_eq!(status.code, 1, "{}{}", status.stdout, status.stderr);
    assert_eq!(
        status.json()["conversion_leftovers"],
        serde_json::json!(["outbox_event_partition_bound"])
    );
    let text = env.outbox(&["partition", "status"]);
    assert!(
        text.stdout
            .contains("a conversion that failed left: outbox_event_partition_bound"),
        "{}",
        text.stdout
    );

    outbox_store::remove_conversion_leftovers(&mut conn)
        .await
        .unwrap();
    let after = env.outbox(&["partition", "status", "--json"]);
    assert_eq!(after.code, 0, "{}{}", after.stdout, after.stderr);
    assert_eq!(after.json()["conversion_leftovers"], serde_json::json!([]));
}
