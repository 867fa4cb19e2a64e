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
//! the held dispatch keys without blocking writers, then swaps the tables
//! in one transaction that holds `ACCESS EXCLUSIVE` on `outbox_event` for
//! as long as reading again the keys written during the copy takes
//! (milliseconds, whatever the number of keys). Creating and dropping
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

/// What [`convert_to_partitioned`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// Rows created before this are in [`LEGACY_PARTITION`].
    pub legacy_until: DateTime<Utc>,
    /// Dispatch keys held in `outbox_dispatch_key` after the conversion:
    /// one per row of the table that held a key.
    pub keys: i64,
    /// Of those, the keys that writers took, changed or gave up while they
    /// were copied before the lock, and that were therefore read again
    /// under it.
    pub keys_rechecked: i64,
    /// The partitions created after the legacy one.
    pub created: Vec<String>,
    /// How long the swap's transaction held `ACCESS EXCLUSIVE` on
    /// `outbox_event` (from its first lock to its commit): what writers and
    /// dispatchers waited at most.
    pub locked_for: std::time::Duration,
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

/// Converts `outbox_event` into a table partitioned by range on
/// `created_at`, one partition per `unit`, and creates `ahead` partitions
/// past the current one. The rows stay where they are: the table becomes
/// the partition [`LEGACY_PARTITION`] for everything created before the
/// end of the next `unit` (at least ten minutes from now), validated
/// beforehand without blocking writers, so attaching it reads nothing.
///
/// Steps, each safe to run again after a failure:
///
/// 1. a `CHECK (created_at < bound)` constraint, added `NOT VALID` and then
///    validated (writers go on meanwhile);
/// 2. the unique index `(id, created_at)` and an index on `dispatch_key`,
///    built `CONCURRENTLY`;
/// 3. the dispatch keys the rows hold, copied into `outbox_dispatch_key`,
///    with triggers noting every key written meanwhile;
/// 4. one transaction under `ACCESS EXCLUSIVE`: the table is renamed to
///    the legacy partition, a partitioned `outbox_event` with the same
///    columns, defaults, checks, indexes, triggers, comments, owner and
///    grants is created,
///    the legacy table is attached, the keys noted during step 3 are read
///    again from it, and the default and future partitions are created.
///
/// When a step fails the constraint of step 1, the copy of step 3 and its
/// triggers are removed again, so the table takes rows created after the
/// bound as before.
///
/// # Errors
///
/// [`PartitionError`] (inside [`StoreError::Partition`]) when the table is
/// partitioned already or holds rows past the bound; a database error
/// otherwise (a lock not granted within [`LOCK_TIMEOUT`] among them).
#[instrument(level = "info", skip(conn), err)]
pub async fn convert_to_partitioned(
    conn: &mut AsyncPgConnection,
    unit: PartitionUnit,
    ahead: u32,
) -> Result<Converted> {
    if !(1..=1000).contains(&ahead) {
        return Err(PartitionError::AheadOutOfRange(ahead).into());
    }
    if is_partitioned(conn).await? {
        return Err(PartitionError::AlreadyPartitioned.into());
    }
    let bound: Instant = diesel::sql_query(format!(
        "SELECT (date_trunc('{unit}', (now() + interval '10 minutes') AT TIME ZONE 'UTC')
                 + interval '1 {unit}') AT TIME ZONE 'UTC' AS at"
    ))
    .get_result(conn)
    .await?;
    let bound = bound.at;
    let result = convert_below(conn, unit, ahead, bound).await;
    if result.is_err() && !is_partitioned(conn).await.unwrap_or(true) {
        // Best effort: a failure must not leave a bound that refuses rows later.
        let _ = conn
            .batch_execute(
                "ALTER TABLE outbox_event DROP CONSTRAINT IF EXISTS outbox_event_partition_bound",
            )
            .await;
        forget_keys_ahead(conn).await;
    }
    result
}

async fn convert_below(
    conn: &mut AsyncPgConnection,
    unit: PartitionUnit,
    ahead: u32,
    bound: DateTime<Utc>,
) -> Result<Converted> {
    let bound_sql = sql_instant(bound);
    conn.batch_execute(&format!(
        "SET lock_timeout = '{LOCK_TIMEOUT}';
         ALTER TABLE outbox_event DROP CONSTRAINT IF EXISTS outbox_event_partition_bound;
         ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_partition_bound
             CHECK (created_at < {bound_sql}) NOT VALID;
         RESET lock_timeout;"
    ))
    .await?;
    let past: Count = diesel::sql_query(format!(
        "SELECT count(*) AS n FROM outbox_event WHERE created_at >= {bound_sql}"
    ))
    .get_result(conn)
    .await?;
    if past.n > 0 {
        return Err(PartitionError::RowsPastBound {
            rows: past.n,
            bound,
        }
        .into());
    }
    conn.batch_execute("ALTER TABLE outbox_event VALIDATE CONSTRAINT outbox_event_partition_bound")
        .await?;
    for (name, def) in [
        (
            "outbox_event_id_created_at_key",
            "CREATE UNIQUE INDEX CONCURRENTLY outbox_event_id_created_at_key \
             ON outbox_event (id, created_at)",
        ),
        (
            "outbox_event_dispatch_key_idx",
            "CREATE INDEX CONCURRENTLY outbox_event_dispatch_key_idx \
             ON outbox_event (dispatch_key) WHERE dispatch_key IS NOT NULL",
        ),
    ] {
        // An interrupted CONCURRENTLY build leaves an invalid index behind.
        let valid: Option<Flag> = diesel::sql_query(format!(
            "SELECT indisvalid AS yes FROM pg_index WHERE indexrelid = to_regclass('{name}')"
        ))
        .get_result(conn)
        .await
        .optional()?;
        match valid {
            Some(Flag { yes: true }) => continue,
            Some(Flag { yes: false }) => conn.batch_execute(&format!("DROP INDEX {name}")).await?,
            None => {}
        }
        conn.batch_execute(def).await?;
    }
    let copied = copy_keys_ahead(conn).await?;
    let started = std::time::Instant::now();
    let mut converted = conn
        .transaction::<_, StoreError, _>(async |conn| swap(conn, unit, ahead, bound, copied).await)
        .await?;
    converted.locked_for = started.elapsed();
    Ok(converted)
}

/// The table noting the dispatch keys of rows written while
/// [`copy_keys_ahead`] copies (dropped by the swap).
const KEYS_CHANGED: &str = "outbox_dispatch_key_changed";

/// The triggers that fill [`KEYS_CHANGED`], on the table being converted.
const NOTE_TRIGGERS: [&str; 3] = [
    "outbox_event_note_dispatch_key_insert",
    "outbox_event_note_dispatch_key_update",
    "outbox_event_note_dispatch_key_delete",
];

/// Step 3 of [`convert_to_partitioned`], before the lock: copies the
/// dispatch keys the rows hold into `outbox_dispatch_key` while writers
/// go on, and notes in [`KEYS_CHANGED`] every key a writer takes, changes
/// or gives up from just before the copy's snapshot on, so that the swap
/// checks only those again under its lock. Returns how many it copied.
///
/// The triggers are created in a transaction of their own before the
/// copy starts. Creating them waits for the writers in flight, so a
/// write the copy's snapshot does not see ran with them in place and was
/// noted.
async fn copy_keys_ahead(conn: &mut AsyncPgConnection) -> Result<i64> {
    let ddl = format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {KEYS_CHANGED} (dispatch_key text NOT NULL);
         COMMENT ON TABLE {KEYS_CHANGED} IS
             'While outbox partition convert runs: the dispatch keys of rows written during its copy of the held keys (dropped when it ends).';
         CREATE OR REPLACE FUNCTION outbox_dispatch_key_note() RETURNS trigger
             LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
         BEGIN
             IF TG_OP <> 'INSERT' AND OLD.dispatch_key IS NOT NULL THEN
                 INSERT INTO {KEYS_CHANGED} (dispatch_key) VALUES (OLD.dispatch_key);
             END IF;
             IF TG_OP <> 'DELETE' AND NEW.dispatch_key IS NOT NULL THEN
                 INSERT INTO {KEYS_CHANGED} (dispatch_key) VALUES (NEW.dispatch_key);
             END IF;
             RETURN NULL;
         END;
         $$;"
    );
    conn.batch_execute(&ddl).await?;
    let mut ddl = format!(
        "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}';
         TRUNCATE {KEYS_CHANGED};\n"
    );
    for trigger in NOTE_TRIGGERS {
        ddl.push_str(&format!(
            "DROP TRIGGER IF EXISTS {trigger} ON outbox_event;\n"
        ));
    }
    let [insert, update, delete] = NOTE_TRIGGERS;
    ddl.push_str(&format!(
        "CREATE TRIGGER {insert} AFTER INSERT ON outbox_event
             FOR EACH ROW WHEN (NEW.dispatch_key IS NOT NULL)
             EXECUTE FUNCTION outbox_dispatch_key_note();
         CREATE TRIGGER {update} AFTER UPDATE OF dispatch_key ON outbox_event
             FOR EACH ROW WHEN (OLD.dispatch_key IS DISTINCT FROM NEW.dispatch_key)
             EXECUTE FUNCTION outbox_dispatch_key_note();
         CREATE TRIGGER {delete} AFTER DELETE ON outbox_event
             FOR EACH ROW WHEN (OLD.dispatch_key IS NOT NULL)
             EXECUTE FUNCTION outbox_dispatch_key_note();"
    ));
    conn.transaction::<_, StoreError, _>(async |conn| Ok(conn.batch_execute(&ddl).await?))
        .await?;
    // Unused while the table is one table: whatever an interrupted
    // conversion left there goes.
    conn.batch_execute("TRUNCATE outbox_dispatch_key").await?;
    let copied: Count = diesel::sql_query(
        "WITH copied AS (
             INSERT INTO outbox_dispatch_key (dispatch_key, event_id, created_at)
             SELECT dispatch_key, id, created_at FROM outbox_event
             WHERE dispatch_key IS NOT NULL
             ON CONFLICT (dispatch_key) DO NOTHING
             RETURNING 1
         )
         SELECT count(*) AS n FROM copied",
    )
    .get_result(conn)
    .await?;
    Ok(copied.n)
}

/// Undoes [`copy_keys_ahead`] after a conversion failed (best effort).
async fn forget_keys_ahead(conn: &mut AsyncPgConnection) {
    let mut ddl = format!("SET lock_timeout = '{LOCK_TIMEOUT}';\n");
    for trigger in NOTE_TRIGGERS {
        ddl.push_str(&format!(
            "DROP TRIGGER IF EXISTS {trigger} ON outbox_event;\n"
        ));
    }
    ddl.push_str(&format!(
        "DROP TABLE IF EXISTS {KEYS_CHANGED};
         DROP FUNCTION IF EXISTS outbox_dispatch_key_note();
         TRUNCATE outbox_dispatch_key;
         RESET lock_timeout;"
    ));
    let _ = conn.batch_execute(&ddl).await;
}

/// Step 4 of [`convert_to_partitioned`], inside its transaction.
async fn swap(
    conn: &mut AsyncPgConnection,
    unit: PartitionUnit,
    ahead: u32,
    bound: DateTime<Utc>,
    copied: i64,
) -> Result<Converted> {
    let bound_sql = sql_instant(bound);
    conn.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}';
         LOCK TABLE outbox_event IN ACCESS EXCLUSIVE MODE;"
    ))
    .await?;
    // Everything the new parent must have, read before the rename: indexes
    // (all but the primary key and the unique ones, which cannot exist on
    // the parent), triggers and the table's comment.
    let indexes: Vec<Definition> = diesel::sql_query(
        "SELECT c.relname::text AS name, pg_get_indexdef(i.indexrelid) AS def
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid = 'outbox_event'::regclass AND NOT i.indisunique
         ORDER BY c.relname",
    )
    .load(conn)
    .await?;
    let triggers: Vec<Definition> = diesel::sql_query(
        "SELECT tgname::text AS name, pg_get_triggerdef(oid) AS def
         FROM pg_trigger WHERE tgrelid = 'outbox_event'::regclass AND NOT tgisinternal
           AND tgname NOT LIKE 'outbox_event_note_dispatch_key_%'
         ORDER BY tgname",
    )
    .load(conn)
    .await?;
    // Its owner and grants, which a new table does not inherit.
    let rights: Vec<Definition> = diesel::sql_query(
        "SELECT 'owner' AS name, format('ALTER TABLE outbox_event OWNER TO %s', c.relowner::regrole) AS def
         FROM pg_class c WHERE c.oid = 'outbox_event'::regclass
         UNION ALL
         SELECT 'grant', format('GRANT %s ON outbox_event TO %s', a.privilege_type,
                                CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                     ELSE a.grantee::regrole::text END)
         FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'outbox_event'::regclass AND a.grantee <> c.relowner",
    )
    .load(conn)
    .await?;
    let mut ddl = String::from(
        "ALTER TABLE outbox_event RENAME TO outbox_event_legacy;
         ALTER INDEX outbox_event_pkey RENAME TO outbox_event_legacy_pkey;
         ALTER TABLE outbox_event_legacy ADD CONSTRAINT outbox_event_legacy_id_created_at_key
             UNIQUE USING INDEX outbox_event_id_created_at_key;\n",
    );
    for index in &indexes {
        ddl.push_str(&format!(
            "ALTER INDEX {} RENAME TO {};\n",
            quote_ident(&index.name),
            quote_ident(&format!("{}_legacy", index.name))
        ));
    }
    for trigger in &triggers {
        ddl.push_str(&format!(
            "DROP TRIGGER {} ON outbox_event_legacy;\n",
            quote_ident(&trigger.name)
        ));
    }
    ddl.push_str(
        "CREATE TABLE outbox_event (LIKE outbox_event_legacy
             INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS
             INCLUDING STORAGE INCLUDING GENERATED)
         PARTITION BY RANGE (created_at);
         ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_partition_bound;
         ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_pkey PRIMARY KEY (id, created_at);\n",
    );
    // The definitions name `outbox_event`, which is now the new parent.
    for index in &indexes {
        ddl.push_str(&index.def);
        ddl.push_str(";\n");
    }
    for statement in triggers.iter().chain(&rights) {
        ddl.push_str(&statement.def);
        ddl.push_str(";\n");
    }
    ddl.push_str(&format!(
        "CREATE TRIGGER outbox_event_take_dispatch_key
             BEFORE INSERT ON outbox_event
             FOR EACH ROW WHEN (NEW.dispatch_key IS NOT NULL)
             EXECUTE FUNCTION outbox_dispatch_key_take();
         CREATE TRIGGER outbox_event_forget_dispatch_key_delete
             AFTER DELETE ON outbox_event
             FOR EACH ROW WHEN (OLD.dispatch_key IS NOT NULL)
             EXECUTE FUNCTION outbox_dispatch_key_forget();
         CREATE TRIGGER outbox_event_forget_dispatch_key_update
             AFTER UPDATE OF dispatch_key ON outbox_event
             FOR EACH ROW WHEN (OLD.dispatch_key IS DISTINCT FROM NEW.dispatch_key)
             EXECUTE FUNCTION outbox_dispatch_key_forget();
         COMMENT ON TABLE outbox_event IS
             'Side effects recorded in the same transaction as the business write that causes them (partitioned by created_at).';
         ALTER TABLE outbox_event ATTACH PARTITION outbox_event_legacy
             FOR VALUES FROM (MINVALUE) TO ({bound_sql});
         ALTER TABLE outbox_event_legacy DROP CONSTRAINT outbox_event_partition_bound;
         CREATE TABLE {DEFAULT_PARTITION} PARTITION OF outbox_event DEFAULT;
         INSERT INTO outbox_partitioning (unit, ahead, converted_at, legacy_until)
             VALUES ('{unit}', {ahead}, now(), {bound_sql});\n"
    ));
    conn.batch_execute(&ddl).await?;
    // The keys written since the copy's snapshot: read again from the
    // table, which nobody writes now.
    let mut ddl = String::new();
    for trigger in NOTE_TRIGGERS {
        ddl.push_str(&format!("DROP TRIGGER {trigger} ON outbox_event_legacy;\n"));
    }
    ddl.push_str(&format!("ANALYZE {KEYS_CHANGED};"));
    conn.batch_execute(&ddl).await?;
    let rechecked: Count = diesel::sql_query(format!(
        "SELECT count(DISTINCT dispatch_key) AS n FROM {KEYS_CHANGED}"
    ))
    .get_result(conn)
    .await?;
    let forgotten: Count = diesel::sql_query(format!(
        "WITH gone AS (
             DELETE FROM outbox_dispatch_key
             WHERE dispatch_key IN (SELECT dispatch_key FROM {KEYS_CHANGED})
             RETURNING 1
         )
         SELECT count(*) AS n FROM gone"
    ))
    .get_result(conn)
    .await?;
    let taken: Count = diesel::sql_query(format!(
        "WITH taken AS (
             INSERT INTO outbox_dispatch_key (dispatch_key, event_id, created_at)
             SELECT dispatch_key, id, created_at FROM outbox_event_legacy
             WHERE dispatch_key IN (SELECT dispatch_key FROM {KEYS_CHANGED})
             ON CONFLICT (dispatch_key) DO NOTHING
             RETURNING 1
         )
         SELECT count(*) AS n FROM taken"
    ))
    .get_result(conn)
    .await?;
    conn.batch_execute(&format!(
        "DROP TABLE {KEYS_CHANGED}; DROP FUNCTION outbox_dispatch_key_note();"
    ))
    .await?;
    let created = create_ahead(conn, unit, ahead, Some(bound)).await?;
    Ok(Converted {
        legacy_until: bound,
        keys: copied - forgotten.n + taken.n,
        keys_rechecked: rechecked.n,
        created,
        locked_for: std::time::Duration::ZERO,
    })
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
