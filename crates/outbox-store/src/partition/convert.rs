//! Converting one `outbox_event` into a partitioned one
//! ([`convert_to_partitioned`]): the checks and indexes built while writers
//! go on, the copy of the held dispatch keys before the lock, and the swap
//! under it.

use chrono::{DateTime, Utc};
use diesel::sql_types::Bool;
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tracing::instrument;

use super::{
    Count, DEFAULT_PARTITION, Definition, Flag, Instant, LOCK_TIMEOUT, PartitionError,
    PartitionUnit, create_ahead, is_partitioned, quote_ident, sql_instant,
};
use crate::{Result, StoreError};

/// What [`convert_to_partitioned`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// Rows created before this are in [`LEGACY_PARTITION`](super::LEGACY_PARTITION).
    pub legacy_until: DateTime<Utc>,
    /// Dispatch keys held in `outbox_dispatch_key` after the conversion:
    /// one per row of the table that held a key.
    pub keys: i64,
    /// The keys that writers took, changed or gave up while the keys were
    /// copied before the lock, read again under it (a key given up is
    /// counted here and not in `keys`).
    pub keys_rechecked: i64,
    /// The partitions created after the legacy one.
    pub created: Vec<String>,
    /// How long the swap's transaction held `ACCESS EXCLUSIVE` on
    /// `outbox_event` (from its first lock to its commit): what writers and
    /// dispatchers waited at most.
    pub locked_for: std::time::Duration,
}

/// Converts `outbox_event` into a table partitioned by range on
/// `created_at`, one partition per `unit`, and creates `ahead` partitions
/// past the current one. The rows stay where they are: the table becomes
/// the partition [`LEGACY_PARTITION`](super::LEGACY_PARTITION) for everything created before the
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
/// bound as before. Each of those removals waits at most
/// [`LOCK_TIMEOUT`] for its lock; what a long transaction on `outbox_event`
/// kept is logged and removed later by [`remove_conversion_leftovers`].
///
/// # Errors
///
/// [`PartitionError`] (inside [`StoreError::Partition`]) when the table is
/// partitioned already, holds rows past the bound, or another conversion
/// is running; a database error
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
    if !take_convert_lock(conn).await? {
        return Err(PartitionError::ConversionRunning.into());
    }
    let result = convert_below(conn, unit, ahead, bound).await;
    if result.is_err() && !is_partitioned(conn).await.unwrap_or(true) {
        // A failure must not leave a bound that refuses rows later, nor
        // triggers that note keys: each part goes as far as its lock is
        // granted within LOCK_TIMEOUT, and what stays is logged and removed
        // by the retention job later (`remove_conversion_leftovers`).
        match find_leftovers(conn).await {
            Ok(found) => {
                let cleanup = remove_found(conn, found).await;
                log_left(&cleanup, "the conversion failed and left this");
            }
            Err(e) => tracing::warn!(
                error = %e,
                "the conversion failed and could not look for what it left; \
                 worker-general's retention job removes it"
            ),
        }
    }
    release_convert_lock(conn).await;
    result
}

/// The session advisory lock a conversion holds from start to end, so that
/// a second one started meanwhile is refused
/// ([`PartitionError::ConversionRunning`]) rather than undoing the first
/// one's copy. The key is `hashtextextended(CONVERT_LOCK, 0)`, so an
/// operator's script can ask whether a conversion runs:
///
/// ```
/// let sql = format!(
///     "SELECT NOT pg_try_advisory_lock(hashtextextended('{}', 0)) AS running",
///     outbox_store::CONVERT_LOCK,
/// );
/// assert!(sql.contains("outbox_partition_convert"));
/// // (a `false` answer took the lock: release it with pg_advisory_unlock)
/// ```
pub const CONVERT_LOCK: &str = "outbox_partition_convert";

/// Tries to take [`CONVERT_LOCK`] for this session; false when another
/// session holds it.
async fn take_convert_lock(conn: &mut AsyncPgConnection) -> Result<bool> {
    let taken: Flag = diesel::sql_query(format!(
        "SELECT pg_try_advisory_lock(hashtextextended('{CONVERT_LOCK}', 0)) AS yes"
    ))
    .get_result(conn)
    .await?;
    Ok(taken.yes)
}

/// Releases [`CONVERT_LOCK`]; the lock also goes when the connection
/// closes, so a failure here is not one.
async fn release_convert_lock(conn: &mut AsyncPgConnection) {
    let _ = conn
        .batch_execute(&format!(
            "SELECT pg_advisory_unlock(hashtextextended('{CONVERT_LOCK}', 0))"
        ))
        .await;
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
    let schema: Definition =
        diesel::sql_query("SELECT 'schema' AS name, quote_ident(current_schema()) AS def")
            .get_result(conn)
            .await?;
    let schema = schema.def;
    let ddl = format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {KEYS_CHANGED} (dispatch_key text NOT NULL);
         COMMENT ON TABLE {KEYS_CHANGED} IS
             'While outbox partition convert runs: the dispatch keys of rows written during its copy of the held keys (dropped when it ends).';
         CREATE OR REPLACE FUNCTION outbox_dispatch_key_note() RETURNS trigger
             LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
         BEGIN
             -- Triggers a failed conversion could not drop note nothing
             -- once their table is gone (the next conversion drops them).
             IF to_regclass('{KEYS_CHANGED}') IS NULL THEN
                 RETURN NULL;
             END IF;
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
    // outbox_event first, as writers take it before they note a key. The
    // lock waits for the writers in flight and keeps new ones out until
    // the triggers are there.
    let leftovers = leftover_note_triggers(conn).await?;
    let mut ddl = format!(
        "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}';
         LOCK TABLE outbox_event IN SHARE ROW EXCLUSIVE MODE;\n"
    );
    for trigger in &leftovers {
        ddl.push_str(&format!("DROP TRIGGER {trigger} ON outbox_event;\n"));
    }
    ddl.push_str(&format!("TRUNCATE {KEYS_CHANGED};\n"));
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

/// The note triggers an interrupted conversion left on `outbox_event`.
async fn leftover_note_triggers(conn: &mut AsyncPgConnection) -> Result<Vec<&'static str>> {
    let present: Vec<Definition> = diesel::sql_query(
        "SELECT tgname::text AS name, '' AS def FROM pg_trigger
         WHERE tgrelid = 'outbox_event'::regclass",
    )
    .load(conn)
    .await?;
    Ok(NOTE_TRIGGERS
        .into_iter()
        .filter(|t| present.iter().any(|p| p.name == *t))
        .collect())
}

/// What a conversion that failed or was killed left on the one table,
/// and what [`remove_conversion_leftovers`] did with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConversionLeftovers {
    /// The parts removed (see [`LEFTOVER_PARTS`]).
    pub removed: Vec<&'static str>,
    /// The parts still there, each with the error that kept it (a lock
    /// not granted within [`LOCK_TIMEOUT`](super::LOCK_TIMEOUT), or a role
    /// that does not own `outbox_event`); the next call tries again.
    pub left: Vec<(&'static str, String)>,
    /// A conversion held [`CONVERT_LOCK`], so nothing was looked at: its
    /// parts are not leftovers while it runs.
    pub conversion_running: bool,
}

impl ConversionLeftovers {
    /// Whether the bound constraint is still there: it refuses rows created
    /// past it (as early as ten minutes after the conversion started), so
    /// a caller should try again soon rather than at its usual pace.
    #[must_use]
    pub fn bound_left(&self) -> bool {
        self.left.iter().any(|(part, _)| *part == LEFTOVER_PARTS[2])
    }
}

/// The parts of an unfinished conversion, as [`ConversionLeftovers`] names
/// them, in the order they are removed:
///
/// - `outbox_dispatch_key_changed`: the table of the keys written during the
///   copy (without it the triggers note nothing);
/// - `outbox_dispatch_key rows`: the copied keys (unused while the table is
///   one table);
/// - `outbox_event_partition_bound`: the `CHECK (created_at < bound)`
///   constraint, which refuses rows created at or after the bound (the end
///   of the unit after the one ten minutes past the conversion's start);
/// - `outbox_event_note_dispatch_key triggers`: the triggers that note keys
///   (a function call per keyed row written);
/// - `outbox_dispatch_key_note()`: their function.
///
/// The constraint and the triggers go together, in one transaction that
/// needs `ACCESS EXCLUSIVE` on `outbox_event` for a moment; like the
/// function, they need the role that owns `outbox_event`. The two indexes
/// built `CONCURRENTLY` (`outbox_event_id_created_at_key`,
/// `outbox_event_dispatch_key_idx`) are kept for the next conversion.
pub const LEFTOVER_PARTS: [&str; 5] = [
    "outbox_dispatch_key_changed",
    "outbox_dispatch_key rows",
    "outbox_event_partition_bound",
    "outbox_event_note_dispatch_key triggers",
    "outbox_dispatch_key_note()",
];

/// Which of [`LEFTOVER_PARTS`] are there.
#[derive(QueryableByName, Debug, Clone, Copy, Default)]
struct Found {
    #[diesel(sql_type = Bool)]
    notes: bool,
    #[diesel(sql_type = Bool)]
    keys: bool,
    #[diesel(sql_type = Bool)]
    bound: bool,
    #[diesel(sql_type = Bool)]
    triggers: bool,
    #[diesel(sql_type = Bool)]
    function: bool,
}

impl Found {
    fn any(self) -> bool {
        self.notes || self.keys || self.bound || self.triggers || self.function
    }

    fn parts(self) -> Vec<&'static str> {
        let [notes, keys, bound, triggers, function] = LEFTOVER_PARTS;
        [
            (self.notes, notes),
            (self.keys, keys),
            (self.bound, bound),
            (self.triggers, triggers),
            (self.function, function),
        ]
        .into_iter()
        .filter_map(|(present, part)| present.then_some(part))
        .collect()
    }
}

/// The parts there on a table that is not partitioned (none on a
/// partitioned one).
async fn find_leftovers(conn: &mut AsyncPgConnection) -> Result<Found> {
    if is_partitioned(conn).await? {
        return Ok(Found::default());
    }
    Ok(diesel::sql_query(format!(
        "SELECT to_regclass('{KEYS_CHANGED}') IS NOT NULL AS notes,
                EXISTS (SELECT 1 FROM outbox_dispatch_key) AS keys,
                EXISTS (SELECT 1 FROM pg_constraint
                        WHERE conrelid = 'outbox_event'::regclass
                          AND conname = 'outbox_event_partition_bound') AS bound,
                EXISTS (SELECT 1 FROM pg_trigger
                        WHERE tgrelid = 'outbox_event'::regclass
                          AND tgname IN ('{}', '{}', '{}')) AS triggers,
                to_regprocedure('outbox_dispatch_key_note()') IS NOT NULL AS function",
        NOTE_TRIGGERS[0], NOTE_TRIGGERS[1], NOTE_TRIGGERS[2]
    ))
    .get_result(conn)
    .await?)
}

/// Whether a session holds [`CONVERT_LOCK`], read from `pg_locks` without
/// taking it (a conversion started meanwhile is not refused).
async fn conversion_running(conn: &mut AsyncPgConnection) -> Result<bool> {
    let running: Flag = diesel::sql_query(format!(
        "SELECT EXISTS (
             SELECT 1 FROM pg_locks l,
                  (SELECT hashtextextended('{CONVERT_LOCK}', 0) AS k) key
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.classid = ((key.k >> 32) & 4294967295)::oid
               AND l.objid = (key.k & 4294967295)::oid
         ) AS yes"
    ))
    .get_result(conn)
    .await?;
    Ok(running.yes)
}

/// Removes what a conversion that failed or was killed left on the one
/// table ([`LEFTOVER_PARTS`]). Each step is a transaction of its own that
/// first takes [`CONVERT_LOCK`] for the transaction only (so it never
/// runs beside a conversion, and nothing stays locked if the caller is
/// cancelled or its connection goes back to a pool), then waits at most
/// [`LOCK_TIMEOUT`](super::LOCK_TIMEOUT) for the table's lock, so that a
/// long transaction on `outbox_event` never queues producers behind it.
/// Parts whose lock was not granted are returned in
/// [`ConversionLeftovers::left`]; call again later, soon while
/// [`ConversionLeftovers::bound_left`].
///
/// Does nothing on a partitioned table, and while a conversion runs
/// ([`ConversionLeftovers::conversion_running`]). The role needs to own
/// `outbox_event`. `worker-general`'s retention job calls it on a table
/// that is not partitioned, at every run and every ten minutes between
/// runs (every 30 seconds while the bound is left).
///
/// ```no_run
/// # async fn f(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// let cleanup = outbox_store::remove_conversion_leftovers(conn).await?;
/// for (part, why) in &cleanup.left {
///     eprintln!("{part} is still there: {why}");
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// A database error when the catalog cannot be read; a part that cannot
/// be removed is not an error.
#[instrument(level = "debug", skip(conn), err)]
pub async fn remove_conversion_leftovers(
    conn: &mut AsyncPgConnection,
) -> Result<ConversionLeftovers> {
    let found = find_leftovers(conn).await?;
    if !found.any() {
        return Ok(ConversionLeftovers::default());
    }
    Ok(remove_found(conn, found).await)
}

/// Which of [`LEFTOVER_PARTS`] a conversion that failed or was killed left
/// on the one table, without removing them (what `outbox partition status`
/// shows). Empty on a partitioned table, and while a conversion runs: its
/// parts are not leftovers then. Takes no lock.
///
/// ```no_run
/// # async fn f(conn: &mut diesel_async::AsyncPgConnection) -> outbox_store::Result<()> {
/// let left = outbox_store::conversion_leftovers(conn).await?;
/// if !left.is_empty() {
///     eprintln!("a failed conversion left: {}", left.join(", "));
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// A database error when the catalog cannot be read.
pub async fn conversion_leftovers(conn: &mut AsyncPgConnection) -> Result<Vec<&'static str>> {
    let found = find_leftovers(conn).await?;
    if !found.any() || conversion_running(conn).await? {
        return Ok(Vec::new());
    }
    Ok(found.parts())
}

/// Removes the parts `found`, each step as far as it goes (see
/// [`remove_conversion_leftovers`]). A conversion's own failure path calls
/// it while holding [`CONVERT_LOCK`] for its session, which the steps'
/// transaction locks then take as well.
async fn remove_found(conn: &mut AsyncPgConnection, found: Found) -> ConversionLeftovers {
    let [notes, keys, bound, triggers, function] = LEFTOVER_PARTS;
    let drop_triggers: String = NOTE_TRIGGERS
        .iter()
        .map(|t| format!("DROP TRIGGER IF EXISTS {t} ON outbox_event;"))
        .collect();
    let drop_bound =
        "ALTER TABLE outbox_event DROP CONSTRAINT IF EXISTS outbox_event_partition_bound;";
    // The bound and the triggers need the same lock: one wait for both.
    let table_parts: (Vec<&'static str>, String) = match (found.bound, found.triggers) {
        (true, true) => (
            vec![bound, triggers],
            format!("{drop_bound}{drop_triggers}"),
        ),
        (true, false) => (vec![bound], drop_bound.to_owned()),
        (false, true) => (vec![triggers], drop_triggers),
        (false, false) => (Vec::new(), String::new()),
    };
    let steps = [
        (
            if found.notes { vec![notes] } else { Vec::new() },
            format!("DROP TABLE IF EXISTS {KEYS_CHANGED};"),
        ),
        (
            if found.keys { vec![keys] } else { Vec::new() },
            "TRUNCATE outbox_dispatch_key;".to_owned(),
        ),
        table_parts,
        (
            if found.function {
                vec![function]
            } else {
                Vec::new()
            },
            "DROP FUNCTION IF EXISTS outbox_dispatch_key_note();".to_owned(),
        ),
    ];
    let mut cleanup = ConversionLeftovers::default();
    for (parts, sql) in steps {
        if parts.is_empty() {
            continue;
        }
        // The function goes only once its triggers have.
        if parts == [function] && cleanup.left.iter().any(|(p, _)| *p == triggers) {
            cleanup
                .left
                .push((function, "its triggers are still there".to_owned()));
            continue;
        }
        let step = conn
            .transaction::<_, StoreError, _>(async |conn| {
                let mine: Flag = diesel::sql_query(format!(
                    "SELECT pg_try_advisory_xact_lock(hashtextextended('{CONVERT_LOCK}', 0)) AS yes"
                ))
                .get_result(conn)
                .await?;
                if !mine.yes {
                    return Ok(Step::ConversionRunning);
                }
                // Checked under the lock: a conversion may have ended since
                // the parts were found, and its table is partitioned now.
                if is_partitioned(conn).await? {
                    return Ok(Step::Partitioned);
                }
                conn.batch_execute(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; {sql}"))
                    .await?;
                Ok(Step::Done)
            })
            .await;
        match step {
            Ok(Step::Done) => cleanup.removed.extend(parts),
            Ok(Step::ConversionRunning) => {
                cleanup.conversion_running = true;
                break;
            }
            Ok(Step::Partitioned) => break,
            Err(e) => cleanup
                .left
                .extend(parts.into_iter().map(|p| (p, e.to_string()))),
        }
    }
    cleanup
}

/// How one step of [`remove_found`] ended without an error.
enum Step {
    Done,
    ConversionRunning,
    Partitioned,
}

/// Logs each part still there.
fn log_left(cleanup: &ConversionLeftovers, message: &'static str) {
    for (part, error) in &cleanup.left {
        tracing::warn!(
            part = %part,
            error = %error,
            "{message}: worker-general's retention job removes it \
             (or run `outbox partition convert` again)"
        );
    }
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
    let [insert, update, delete] = NOTE_TRIGGERS;
    let triggers: Vec<Definition> = diesel::sql_query(format!(
        "SELECT tgname::text AS name, pg_get_triggerdef(oid) AS def
         FROM pg_trigger WHERE tgrelid = 'outbox_event'::regclass AND NOT tgisinternal
           AND tgname NOT IN ('{insert}', '{update}', '{delete}')
         ORDER BY tgname"
    ))
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
