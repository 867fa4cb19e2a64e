//! The migration sets (`outbox_model::MigrationSet`): the tables a
//! core-only application gets; every set applied one after another makes
//! the schema the single migrations tree of earlier releases made; and a
//! database that tree migrated upgrades with nothing failing and nothing
//! left pending.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails loudly by design

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_model::{MigrationSet, migration_set_status, run_migration_sets};
use outbox_test_support::TestDatabase;

/// The tables of the core set: what publishing, dispatching, requeue
/// history, the Redis guard, worker registration, ordering keys and
/// periodic events need.
const CORE_TABLES: [&str; 9] = [
    "outbox_dispatch_key",
    "outbox_event",
    "outbox_event_requeue",
    "outbox_ordering_key",
    "outbox_partitioning",
    "outbox_redis_epoch",
    "outbox_redis_safe_point",
    "outbox_schedule",
    "outbox_worker_registration",
];

/// Every table the single migrations tree (17 migrations, up to
/// 2026-12-05-040000) made, and `outbox_ordering_key`, `outbox_schedule`,
/// `outbox_dispatch_key` and `outbox_partitioning`, which the core set
/// added since.
const SINGLE_TREE_TABLES: [&str; 21] = [
    "application_event",
    "audit_log",
    "entity_row",
    "notification",
    "outbox_dispatch_key",
    "outbox_event",
    "outbox_event_requeue",
    "outbox_ordering_key",
    "outbox_partitioning",
    "outbox_redis_epoch",
    "outbox_redis_safe_point",
    "outbox_schedule",
    "outbox_worker_registration",
    "plugin_hook_subscription",
    "tenant_mail_settings",
    "webhook_endpoint",
    "workflow",
    "workflow_block_execution",
    "workflow_bridge_request",
    "workflow_execution",
    "workflow_version",
];

/// The versions that tree recorded for the tables now split off
/// 2026-11-29-000002 into a set each: the four migrations added since.
const SPLIT_OFF: [&str; 4] = [
    "20261205050001",
    "20261205050002",
    "20261205050003",
    "20261205050004",
];

/// An empty database next to the test's own, on the same server, dropped
/// with the value's `drop` call.
struct Blank {
    admin: AsyncPgConnection,
    name: String,
    url: String,
}

impl Blank {
    async fn new(db: &TestDatabase) -> Self {
        let name = format!("{}_blank", db.name());
        let url = outbox_test_support::with_database(db.url(), &name);
        let mut admin = db.conn().await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap();
        Self { admin, name, url }
    }

    async fn conn(&self) -> AsyncPgConnection {
        outbox_pg::establish(&self.url).await.unwrap()
    }

    async fn drop(mut self) {
        self.admin
            .batch_execute(&format!("DROP DATABASE \"{}\" WITH (FORCE)", self.name))
            .await
            .unwrap();
    }
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    text: String,
}

/// The tables in `public`, by name (diesel's own table left out).
async fn tables(conn: &mut AsyncPgConnection) -> Vec<String> {
    rows(
        conn,
        "SELECT tablename::text AS text FROM pg_tables WHERE schemaname = 'public' \
         AND tablename <> '__diesel_schema_migrations' ORDER BY 1",
    )
    .await
}

/// Every table, column, constraint, index, trigger and function of
/// `public` with its definition: two databases with the same list have
/// the same schema.
async fn schema(conn: &mut AsyncPgConnection) -> Vec<String> {
    rows(
        conn,
        "SELECT text FROM (
           SELECT format('column %s.%s %s %s %s', table_name, column_name, data_type,
                         is_nullable, column_default) AS text
             FROM information_schema.columns WHERE table_schema = 'public'
           UNION ALL
           SELECT format('constraint %s %s %s', conrelid::regclass, conname,
                         pg_get_constraintdef(oid))
             FROM pg_constraint WHERE connamespace = 'public'::regnamespace
           UNION ALL
           SELECT format('index %s', indexdef) FROM pg_indexes WHERE schemaname = 'public'
           UNION ALL
           SELECT format('trigger %s', pg_get_triggerdef(oid))
             FROM pg_trigger WHERE NOT tgisinternal
           UNION ALL
           SELECT format('function %s', pg_get_functiondef(oid))
             FROM pg_proc WHERE pronamespace = 'public'::regnamespace
           UNION ALL
           SELECT format('comment %s %s %s', objoid::regclass, objsubid, description)
             FROM pg_description WHERE classoid = 'pg_class'::regclass
         ) AS schema ORDER BY 1",
    )
    .await
}

async fn rows(conn: &mut AsyncPgConnection, sql: &str) -> Vec<String> {
    diesel::sql_query(sql)
        .load::<Row>(conn)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.text)
        .collect()
}

#[tokio::test]
async fn the_core_set_alone_makes_the_nine_core_tables_and_takes_events() {
    let db = TestDatabase::new().await;
    let blank = Blank::new(&db).await;
    let applied = run_migration_sets(blank.conn().await, &[MigrationSet::Core])
        .await
        .unwrap();
    assert_eq!(applied.len(), 21, "{applied:?}");
    let mut conn = blank.conn().await;
    assert_eq!(tables(&mut conn).await, CORE_TABLES);
    // A plain-SQL producer's insert is a valid event on the core tables.
    conn.batch_execute(
        "INSERT INTO outbox_event (tenant_id, event_type, payload)
         VALUES ('acme', 'orders.order.created', '{\"orderId\": 7}')",
    )
    .await
    .unwrap();
    let status = migration_set_status(&mut conn, &MigrationSet::ALL)
        .await
        .unwrap();
    let pending: Vec<MigrationSet> = status
        .iter()
        .filter(|m| !m.applied)
        .map(|m| m.set)
        .collect();
    assert!(!pending.contains(&MigrationSet::Core), "{pending:?}");
    assert!(pending.contains(&MigrationSet::Audit), "{pending:?}");
    drop(conn);
    blank.drop().await;
}

#[tokio::test]
async fn the_sets_applied_one_after_another_make_the_single_tree_s_schema() {
    let db = TestDatabase::new().await; // every set applied at once
    let blank = Blank::new(&db).await;
    for set in MigrationSet::ALL {
        let applied = run_migration_sets(blank.conn().await, &[set])
            .await
            .unwrap();
        assert!(!applied.is_empty(), "{set} applied nothing");
    }
    let mut one_by_one = blank.conn().await;
    assert_eq!(tables(&mut one_by_one).await, SINGLE_TREE_TABLES);
    assert_eq!(
        schema(&mut one_by_one).await,
        schema(&mut db.conn().await).await
    );
    let status = migration_set_status(&mut one_by_one, &MigrationSet::ALL)
        .await
        .unwrap();
    assert_eq!(status.len(), 32);
    assert!(status.iter().all(|m| m.applied), "{status:?}");
    drop(one_by_one);
    blank.drop().await;
}

#[tokio::test]
async fn a_database_of_the_single_tree_upgrades_with_nothing_failing_or_pending() {
    let db = TestDatabase::new().await;
    let mut conn = db.conn().await;
    let before = schema(&mut conn).await;
    // The single tree's state: the same schema, without the versions of the
    // migrations added when its second migration was split into sets.
    conn.batch_execute(&format!(
        "DELETE FROM __diesel_schema_migrations WHERE version IN ('{}');
         INSERT INTO notification (outbox_event_id, tenant_id, kind, title, data)
         VALUES (gen_random_uuid(), 'acme', 'mention', 'Hello', '{{}}');",
        SPLIT_OFF.join("', '")
    ))
    .await
    .unwrap();
    let status = migration_set_status(&mut conn, &MigrationSet::ALL)
        .await
        .unwrap();
    let pending: Vec<&str> = status
        .iter()
        .filter(|m| !m.applied)
        .map(|m| m.version.as_str())
        .collect();
    assert_eq!(pending, SPLIT_OFF);

    let applied = run_migration_sets(db.conn().await, &MigrationSet::ALL)
        .await
        .unwrap();
    assert_eq!(applied, SPLIT_OFF);
    let status = migration_set_status(&mut conn, &MigrationSet::ALL)
        .await
        .unwrap();
    assert!(status.iter().all(|m| m.applied), "{status:?}");
    assert_eq!(schema(&mut conn).await, before);
    let kept = rows(&mut conn, "SELECT title AS text FROM notification").await;
    assert_eq!(kept, ["Hello"], "the upgrade keeps the rows it finds");
}
