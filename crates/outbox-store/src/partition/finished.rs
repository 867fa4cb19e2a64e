//! Retention on a partitioned `outbox_event`: dropping a partition whose
//! rows are all old `DONE` ones ([`drop_finished_partition`]).

use diesel::sql_types::{Double, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tracing::instrument;

use super::{
    Count, DEFAULT_PARTITION, Flag, LEGACY_PARTITION, LOCK_TIMEOUT, PartitionInfo, partitioning,
    partitions, quote_ident,
};
use crate::{Result, StoreError};

/// What [`drop_finished_partition`] dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct DroppedPartition {
    /// The partition's name.
    pub name: String,
    /// Its rows as the catalog estimated them (all `DONE`).
    pub rows_estimate: f64,
    /// Dispatch keys its rows held, forgotten with it.
    pub keys: i64,
}

/// Drops the oldest partition of a partitioned `outbox_event` whose range
/// ended before the retention window and whose rows are all `DONE` and
/// handed off before the window (`processed_at` older than
/// `older_than_secs`), with the dispatch keys its rows held. The legacy and
/// default partitions are never dropped (their `DONE` rows are deleted row
/// by row, [`crate::purge_done_batch_in`]). Returns `None` when no
/// partition can go, and on one table.
///
/// The dispatch keys are forgotten first, by creation time, outside the
/// lock; then one transaction takes `ACCESS EXCLUSIVE` on `outbox_event`
/// (what detaching needs), checks again that every row is an old `DONE`
/// one (three reads of partial indexes), detaches and drops the partition.
/// Writers wait for that transaction only, and at most [`LOCK_TIMEOUT`]
/// for the lock: when it is not granted, nothing is dropped, the keys are
/// taken back, and the next run tries again.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err)]
pub async fn drop_finished_partition(
    conn: &mut AsyncPgConnection,
    older_than_secs: f64,
) -> Result<Option<DroppedPartition>> {
    if partitioning(conn).await?.is_none() {
        return Ok(None);
    }
    let candidates: Vec<PartitionInfo> = partitions(conn)
        .await?
        .into_iter()
        .filter(|p| p.name != LEGACY_PARTITION && p.name != DEFAULT_PARTITION)
        .collect();
    for part in candidates {
        let (Some(from), Some(to)) = (part.from, part.to) else {
            continue;
        };
        let ended: Flag =
            diesel::sql_query("SELECT $1 <= now() - make_interval(secs => $2) AS yes")
                .bind::<Timestamptz, _>(to)
                .bind::<Double, _>(older_than_secs)
                .get_result(conn)
                .await?;
        if !ended.yes {
            // Partitions are in range order: no later one has ended either.
            return Ok(None);
        }
        if busy(conn, &part.name, older_than_secs).await? {
            continue;
        }
        let keys: Count = diesel::sql_query(
            "WITH gone AS (
                 DELETE FROM outbox_dispatch_key WHERE created_at >= $1 AND created_at < $2
                 RETURNING 1
             )
             SELECT count(*) AS n FROM gone",
        )
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .get_result(conn)
        .await?;
        let name = part.name.clone();
        let dropped = conn
            .transaction::<_, StoreError, _>(async |conn| {
                conn.batch_execute(&format!(
                    "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}';
                         LOCK TABLE outbox_event IN ACCESS EXCLUSIVE MODE;"
                ))
                .await?;
                if busy(conn, &name, older_than_secs).await? {
                    return Ok(false);
                }
                let name = quote_ident(&name);
                conn.batch_execute(&format!(
                    "ALTER TABLE outbox_event DETACH PARTITION {name}; DROP TABLE {name};"
                ))
                .await?;
                Ok(true)
            })
            .await;
        match dropped {
            Ok(true) => {
                return Ok(Some(DroppedPartition {
                    name: part.name,
                    rows_estimate: part.rows_estimate,
                    keys: keys.n,
                }));
            }
            Ok(false) => take_keys_back(conn, &part.name).await?,
            Err(e) => {
                take_keys_back(conn, &part.name).await?;
                return Err(e);
            }
        }
    }
    Ok(None)
}

/// Whether a partition holds a row that is not an old `DONE` one. Each
/// test reads one partial index of the partition: the claim index
/// (PENDING, PROCESSING), the operators' (FAILED, CANCELLED) and the
/// retention index (DONE by processed_at).
async fn busy(conn: &mut AsyncPgConnection, partition: &str, older_than_secs: f64) -> Result<bool> {
    let name = quote_ident(partition);
    let busy: Flag = diesel::sql_query(format!(
        "SELECT EXISTS (SELECT 1 FROM {name} WHERE status IN ('PENDING', 'PROCESSING'))
             OR EXISTS (SELECT 1 FROM {name} WHERE status IN ('FAILED', 'CANCELLED'))
             OR EXISTS (SELECT 1 FROM {name} WHERE status = 'DONE'
                        AND processed_at >= now() - make_interval(secs => $1)) AS yes"
    ))
    .bind::<Double, _>(older_than_secs)
    .get_result(conn)
    .await?;
    Ok(busy.yes)
}

/// The keys of a partition that was not dropped after all, held again.
async fn take_keys_back(conn: &mut AsyncPgConnection, partition: &str) -> Result<()> {
    conn.batch_execute(&format!(
        "INSERT INTO outbox_dispatch_key (dispatch_key, event_id, created_at)
         SELECT dispatch_key, id, created_at FROM {}
         WHERE dispatch_key IS NOT NULL
         ON CONFLICT (dispatch_key) DO NOTHING",
        quote_ident(partition)
    ))
    .await?;
    Ok(())
}
