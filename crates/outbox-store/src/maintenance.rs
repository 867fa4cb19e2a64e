//! Upkeep of `outbox_event` itself: the dispatcher's `VACUUM` rounds (why
//! they exist is told in `outbox-dispatch`'s `vacuum` module) and what they
//! look up in the catalog.

use diesel::QueryableByName;
use diesel::sql_types::{Bool, Double};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tracing::instrument;

use crate::Result;

/// The statement of one vacuum round. `SKIP_LOCKED` skips the round when
/// another vacuum of the table (autovacuum, another dispatcher) is under
/// way instead of queuing behind it.
pub const VACUUM_SQL: &str = "VACUUM (SKIP_LOCKED) outbox_event";

/// Runs [`VACUUM_SQL`] (outside any transaction, as `VACUUM` must be).
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn vacuum(conn: &mut AsyncPgConnection) -> Result<()> {
    Ok(conn.batch_execute(VACUUM_SQL).await?)
}

/// Runs `VACUUM ANALYZE outbox_event`: dead rows gone and fresh statistics,
/// the state the benchmarks start their measurements from.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn vacuum_analyze(conn: &mut AsyncPgConnection) -> Result<()> {
    Ok(conn.batch_execute("VACUUM ANALYZE outbox_event").await?)
}

#[derive(QueryableByName)]
struct TableRows {
    #[diesel(sql_type = Double)]
    n: f64,
}

/// The rows of `outbox_event` as the catalog counts them (set by the
/// last vacuum or analyze; -1 when never counted). A partitioned table's
/// count is its partitions' summed; a partition the catalog counts as
/// empty or never counted (a new day's, vacuumed while still empty or not
/// yet analyzed; Postgres 13 says 0 for never counted) adds the live rows
/// the statistics system tracks for it instead, so that its rows are not
/// left out. The catalog's count is kept where it has one: the tracked
/// count drifts (it can count rows twice around an analyze).
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn table_rows(conn: &mut AsyncPgConnection) -> Result<f64> {
    let row: TableRows = diesel::sql_query(
        // A partitioned table has no count of its own: its partitions'
        // are summed; -1 when none was counted.
        "SELECT CASE WHEN bool_or(c.reltuples >= 0)
                     THEN sum(CASE WHEN c.reltuples > 0 THEN c.reltuples
                                   ELSE pg_stat_get_live_tuples(c.oid) END)
                     ELSE -1 END::float8 AS n
         FROM pg_class c
         WHERE c.relkind = 'r'
           AND c.oid IN (SELECT relid FROM pg_partition_tree('outbox_event')
                         UNION ALL SELECT 'outbox_event'::regclass)",
    )
    .get_result(conn)
    .await?;
    Ok(row.n)
}

#[derive(QueryableByName)]
struct Allowed {
    #[diesel(sql_type = Bool)]
    allowed: bool,
}

/// Whether the session's role may vacuum `outbox_event`: a superuser, or a
/// member of the table's owner role.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn may_vacuum(conn: &mut AsyncPgConnection) -> Result<bool> {
    let row: Allowed = diesel::sql_query(
        "SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
                OR pg_has_role(current_user, c.relowner, 'MEMBER') AS allowed
         FROM pg_class c WHERE c.oid = 'outbox_event'::regclass",
    )
    .get_result(conn)
    .await?;
    Ok(row.allowed)
}
