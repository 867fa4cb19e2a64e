//! A partitioned `outbox_event`: converting the table, keeping partitions
//! created ahead, and dropping the ones that hold only old `DONE` rows.
//!
//! Partitioning is opt in. The migrations leave `outbox_event` one table;
//! [`convert_to_partitioned`] (`outbox partition convert`) turns it into a
//! table partitioned by range on `created_at`, and from then on
//! [`outbox_partitioning`] has its one row. The table that was converted
//! becomes the first partition (`outbox_event_legacy`, every row created
//! before the conversion's bound), so no row is copied.
//!
//! # What changes on a partitioned table
//!
//! - The primary key is `(id, created_at)`: a unique index of a
//!   partitioned table must hold the partition key.
//! - Dispatch keys stay unique across partitions through
//!   `outbox_dispatch_key` (one row per key a live row holds), kept by
//!   triggers the conversion adds: a second row with a held key is skipped,
//!   as `ON CONFLICT DO NOTHING` skips it on one table, whether or not the
//!   statement says `ON CONFLICT`.
//! - Retention drops a partition once every row in it is `DONE` and was
//!   handed off before the retention window, instead of deleting its rows
//!   ([`drop_finished_partition`]); the rows of partitions that cannot go
//!   yet are deleted as before.
//! - Rows whose `created_at` no partition covers go to
//!   `outbox_event_default`, so an insert never fails for lack of a
//!   partition; [`create_partitions_ahead`] keeps that from happening.
//!
//! # Locks
//!
//! The conversion validates its bound, builds its two indexes and copies
//! the held dispatch keys without blocking writers (its triggers that note
//! the keys written during the copy keep writers out only while they are
//! created), then swaps the tables in one transaction that holds `ACCESS
//! EXCLUSIVE` on `outbox_event` for as long as reading again the keys
//! written during the copy takes: milliseconds, however many keys the
//! table holds, and more when many were written meanwhile. Creating and dropping
//! partitions take `ACCESS EXCLUSIVE` on the parent for a moment. Every
//! such statement runs with a `lock_timeout` ([`LOCK_TIMEOUT`]), so it
//! gives up instead of queueing producers behind a long transaction.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Double, Integer, Nullable, Text, Timestamptz};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tracing::instrument;

use crate::{Result, StoreError};

mod convert;
mod finished;

pub use convert::{
    CONVERT_LOCK, ConversionLeftovers, Converted, LEFTOVER_PARTS, conversion_leftovers,
    convert_to_partitioned, remove_conversion_leftovers,
};
pub use finished::{DroppedPartition, drop_finished_partition};

/// How long a statement that needs `ACCESS EXCLUSIVE` on `outbox_event`
/// waits for it before it gives up (and is retried at the next run).
pub const LOCK_TIMEOUT: &str = "1s";

/// The name of the partition that was the whole table before the conversion.
pub const LEGACY_PARTITION: &str = "outbox_event_legacy";

/// `parts, ranges`: the partitions of `outbox_event` with their bounds as
/// text (`lo` NULL for `MINVALUE` and for the default partition, `hi` NULL
/// for the default partition), read from the catalog whatever the
/// session's time zone (the bounds carry their offset).
const PARTITION_RANGES: &str = "parts AS (
             SELECT c.oid, c.relname::text AS name, c.reltuples,
                    pg_get_expr(c.relpartbound, c.oid) AS bound
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'outbox_event'::regclass
         ), ranges AS (
             SELECT p.*,
                    substring(bound FROM 'FROM \\(''([^'']*)''\\)') AS lo,
                    substring(bound FROM 'TO \\(''([^'']*)''\\)') AS hi
             FROM parts p
         )";

/// The name of the partition for rows no other partition covers.
pub const DEFAULT_PARTITION: &str = "outbox_event_default";

/// The width of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartitionUnit {
    /// One partition an hour.
    Hour,
    /// One partition a day (the default).
    Day,
    /// One partition a week (from Monday).
    Week,
    /// One partition a calendar month.
    Month,
}

impl PartitionUnit {
    /// The unit as `date_trunc` and `interval` spell it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
        }
    }
}

impl fmt::Display for PartitionUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A partition unit that is not `hour`, `day`, `week` or `month`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown partition unit {0:?}: expected hour, day, week or month")]
pub struct UnknownPartitionUnit(pub String);

impl FromStr for PartitionUnit {
    type Err = UnknownPartitionUnit;

    /// ```
    /// use outbox_store::PartitionUnit;
    /// assert_eq!("day".parse::<PartitionUnit>(), Ok(PartitionUnit::Day));
    /// assert!("fortnight".parse::<PartitionUnit>().is_err());
    /// ```
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "hour" => Ok(Self::Hour),
            "day" => Ok(Self::Day),
            "week" => Ok(Self::Week),
            "month" => Ok(Self::Month),
            other => Err(UnknownPartitionUnit(other.to_owned())),
        }
    }
}

/// Why a partitioning operation refused to run. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PartitionError {
    /// `outbox_event` is partitioned already.
    #[error("outbox_event is partitioned already")]
    AlreadyPartitioned,
    /// Rows were created at or after the bound the conversion chose for the
    /// table's existing rows (`created_at` set in the future by a producer).
    #[error(
        "{rows} row(s) of outbox_event have created_at at or after {bound}: \
         the conversion puts every existing row in one partition that ends there; \
         fix or remove those rows and run it again"
    )]
    RowsPastBound {
        /// How many rows.
        rows: i64,
        /// The bound.
        bound: DateTime<Utc>,
    },
    /// `ahead` is outside 1 to 1,000.
    #[error("partitions ahead must be 1 to 1000, not {0}")]
    AheadOutOfRange(u32),
    /// Another conversion of the same database is running (it holds the
    /// advisory lock [`CONVERT_LOCK`]), or the retention job holds that
    /// lock for one step of [`remove_conversion_leftovers`].
    #[error(
        "another `outbox partition convert` of this database is running \
         (or, for a moment, worker-general's retention job is removing what a failed one left); \
         wait for it to end (`outbox partition status`)"
    )]
    ConversionRunning,
}

/// How `outbox_event` is partitioned (the row of `outbox_partitioning`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitioning {
    /// The width of one partition.
    pub unit: PartitionUnit,
    /// How many partitions past the current one are kept created.
    pub ahead: u32,
    /// When the table was converted.
    pub converted_at: DateTime<Utc>,
    /// Rows created before this live in [`LEGACY_PARTITION`].
    pub legacy_until: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct PartitioningRow {
    #[diesel(sql_type = Text)]
    unit: String,
    #[diesel(sql_type = Integer)]
    ahead: i32,
    #[diesel(sql_type = Timestamptz)]
    converted_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    legacy_until: DateTime<Utc>,
}

/// How `outbox_event` is partitioned; `None` while it is one table.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn partitioning(conn: &mut AsyncPgConnection) -> Result<Option<Partitioning>> {
    let row: Option<PartitioningRow> = diesel::sql_query(
        "SELECT unit, ahead, converted_at, legacy_until FROM outbox_partitioning",
    )
    .get_result(conn)
    .await
    .optional()?;
    Ok(row.map(|row| Partitioning {
        unit: row.unit.parse().unwrap_or(PartitionUnit::Day),
        ahead: u32::try_from(row.ahead).unwrap_or(1),
        converted_at: row.converted_at,
        legacy_until: row.legacy_until,
    }))
}

#[derive(QueryableByName)]
struct OtherMeans {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    other: bool,
}

/// Whether `outbox_event` is a partitioned table (declarative
/// partitioning) that [`convert_to_partitioned`] did not make (no
/// [`partitioning`] row): partitioned by hand or by an extension such as
/// pg_partman. Partitioning by inheritance is not recognised. Such a table has none of what
/// the conversion installs: its dispatch keys are not kept unique across
/// partitions (`outbox_dispatch_key`) and retention does not know its
/// partitions, so the workers refuse to start on it.
///
/// # Example
///
/// ```no_run
/// # async fn check(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// if outbox_store::partitioned_by_other_means(conn).await? {
///     eprintln!("outbox_event was partitioned by hand: use `outbox partition convert`");
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// When Postgres fails (or the core migrations were not applied).
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn partitioned_by_other_means(conn: &mut AsyncPgConnection) -> Result<bool> {
    let row: OtherMeans = diesel::sql_query(
        "SELECT COALESCE((SELECT relkind = 'p' FROM pg_class
                          WHERE oid = to_regclass('outbox_event')), false)
                AND NOT EXISTS (SELECT 1 FROM outbox_partitioning) AS other",
    )
    .get_result(conn)
    .await?;
    Ok(row.other)
}

#[derive(QueryableByName)]
struct Instant {
    #[diesel(sql_type = Timestamptz)]
    at: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    yes: bool,
}

#[derive(QueryableByName)]
struct Definition {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    def: String,
}

/// Whether `outbox_event` is a partitioned table.
async fn is_partitioned(conn: &mut AsyncPgConnection) -> Result<bool> {
    let row: Flag = diesel::sql_query(
        "SELECT relkind = 'p' AS yes FROM pg_class WHERE oid = 'outbox_event'::regclass",
    )
    .get_result(conn)
    .await?;
    Ok(row.yes)
}

/// Creates the partitions from `from` (default: the current unit) up to
/// `ahead` units past the current one that no partition covers yet, their
/// bounds on the unit's boundaries in UTC whatever the session's time
/// zone. Returns their names.
async fn create_ahead(
    conn: &mut AsyncPgConnection,
    unit: PartitionUnit,
    ahead: u32,
    from: Option<DateTime<Utc>>,
) -> Result<Vec<String>> {
    #[derive(QueryableByName)]
    struct Missing {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = Text)]
        lo: String,
        #[diesel(sql_type = Text)]
        hi: String,
    }
    // Starts of the wanted ranges that no partition covers yet, with
    // their names (outbox_event_p<yyyymmdd>[hh]).
    let missing: Vec<Missing> = diesel::sql_query(format!(
        "WITH {PARTITION_RANGES}, wanted AS (
             SELECT lo AT TIME ZONE 'UTC' AS lo, (lo + interval '1 {unit}') AT TIME ZONE 'UTC' AS hi,
                    'outbox_event_p' || to_char(lo, '{fmt}') AS name
             FROM generate_series(
                 date_trunc('{unit}', now() AT TIME ZONE 'UTC'),
                 date_trunc('{unit}', now() AT TIME ZONE 'UTC') + {ahead} * interval '1 {unit}',
                 interval '1 {unit}') AS lo
         )
         SELECT name, quote_literal(lo::text) AS lo, quote_literal(hi::text) AS hi
         FROM wanted w
         WHERE w.lo >= COALESCE($1, '-infinity'::timestamptz)
           AND w.lo >= COALESCE((SELECT legacy_until FROM outbox_partitioning), '-infinity'::timestamptz)
           AND NOT EXISTS (
               SELECT 1 FROM ranges r
               WHERE COALESCE(r.lo::timestamptz, '-infinity') < w.hi AND r.hi::timestamptz > w.lo)
         ORDER BY w.lo",
        fmt = match unit {
            PartitionUnit::Hour => "YYYYMMDD\"h\"HH24",
            _ => "YYYYMMDD",
        }
    ))
    .bind::<Nullable<Timestamptz>, _>(from)
    .load(conn)
    .await?;
    let mut created = Vec::with_capacity(missing.len());
    for m in missing {
        conn.batch_execute(&format!(
            "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}';
             CREATE TABLE IF NOT EXISTS {name} PARTITION OF outbox_event
                 FOR VALUES FROM ({lo}) TO ({hi});",
            name = quote_ident(&m.name),
            lo = m.lo,
            hi = m.hi,
        ))
        .await?;
        created.push(m.name);
    }
    Ok(created)
}

/// On a partitioned `outbox_event`, creates the partitions from the current
/// one to [`Partitioning::ahead`] past it that do not exist yet; does
/// nothing on one table. Returns the names of the partitions created. The
/// dispatcher's retention runs it at every run.
///
/// # Errors
///
/// When Postgres fails (a lock not granted within [`LOCK_TIMEOUT`], or a
/// row in the default partition inside a new partition's range).
#[instrument(level = "debug", skip_all, err)]
pub async fn create_partitions_ahead(conn: &mut AsyncPgConnection) -> Result<Vec<String>> {
    let Some(p) = partitioning(conn).await? else {
        return Ok(Vec::new());
    };
    conn.transaction::<_, StoreError, _>(async |conn| {
        create_ahead(conn, p.unit, p.ahead, None).await
    })
    .await
}

/// One partition of a partitioned `outbox_event`, as [`partitions`] lists it.
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct PartitionInfo {
    /// The partition's table name.
    #[diesel(sql_type = Text)]
    pub name: String,
    /// The start of its `created_at` range (`None`: unbounded, or the default partition).
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub from: Option<DateTime<Utc>>,
    /// The end of its range, exclusive (`None`: the default partition).
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub to: Option<DateTime<Utc>>,
    /// Its rows as the catalog estimates them (0 when never counted).
    #[diesel(sql_type = Double)]
    pub rows_estimate: f64,
    /// Its size on disk, indexes included, in bytes.
    #[diesel(sql_type = BigInt)]
    pub bytes: i64,
}

/// The partitions of `outbox_event`, oldest first (the default partition
/// last); empty when the table is not partitioned.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn partitions(conn: &mut AsyncPgConnection) -> Result<Vec<PartitionInfo>> {
    Ok(diesel::sql_query(format!(
        "WITH {PARTITION_RANGES}
         SELECT name, lo::timestamptz AS \"from\", hi::timestamptz AS \"to\",
                greatest(reltuples, 0)::float8 AS rows_estimate,
                pg_total_relation_size(oid) AS bytes
         FROM ranges
         ORDER BY (bound = 'DEFAULT'), hi::timestamptz NULLS FIRST"
    ))
    .load(conn)
    .await?)
}

/// An instant as an SQL literal.
fn sql_instant(at: DateTime<Utc>) -> String {
    format!("'{}'::timestamptz", at.to_rfc3339())
}

/// A name as an SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_and_their_quotes_doubled() {
        assert_eq!(
            quote_ident("outbox_event_p20261206"),
            "\"outbox_event_p20261206\""
        );
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn every_unit_reads_back_as_itself() {
        for unit in [
            PartitionUnit::Hour,
            PartitionUnit::Day,
            PartitionUnit::Week,
            PartitionUnit::Month,
        ] {
            assert_eq!(unit.as_str().parse::<PartitionUnit>(), Ok(unit));
        }
    }
}
