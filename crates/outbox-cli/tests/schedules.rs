//! `outbox schedules`: each schedule's last tick, as a table and as JSON.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use chrono::{DateTime, Utc};

use crate::common::Env;

#[tokio::test]
async fn schedules_lists_each_schedule_s_last_tick_by_name() {
    let env = Env::new().await;
    let empty = env.outbox(&["schedules"]);
    assert_eq!(empty.code, 0, "{}", empty.stderr);
    assert!(
        empty.stdout.contains("no schedule has run yet"),
        "{}",
        empty.stdout
    );

    let tick = |t: &str| DateTime::parse_from_rfc3339(t).unwrap().with_timezone(&Utc);
    let mut conn = env.db.conn().await;
    outbox_store::advance_schedule(&mut conn, "nightly-report", tick("2026-12-05T02:00:00Z"))
        .await
        .unwrap();
    outbox_store::advance_schedule(&mut conn, "heartbeat", tick("2026-12-05T10:15:30Z"))
        .await
        .unwrap();

    let table = env.outbox(&["schedules"]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table.line("heartbeat").contains("2026-12-05 10:15:30Z"),
        "{}",
        table.stdout
    );
    assert!(
        table
            .line("nightly-report")
            .contains("2026-12-05 02:00:00Z"),
        "{}",
        table.stdout
    );

    let json = env.outbox(&["schedules", "--json"]).json();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["name"], "heartbeat");
    assert_eq!(rows[1]["name"], "nightly-report");
    assert_eq!(
        tick(rows[1]["last_tick"].as_str().unwrap()),
        tick("2026-12-05T02:00:00Z")
    );
}
