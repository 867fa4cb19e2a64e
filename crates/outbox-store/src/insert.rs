//! The publisher's statements: new rows, written in the caller's
//! transaction (`outbox-publish` validates them and owns the transaction).

use std::collections::{HashMap, HashSet};

use diesel::pg::data_types::PgInterval;
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::NewOutboxEventRow;
use outbox_model::schema::outbox_event;
use tracing::instrument;
use uuid::Uuid;

use crate::Result;

/// Rows per INSERT statement in a batch: 12 bind parameters a row stays well
/// under Postgres' 65,535-parameter limit.
pub const ROWS_PER_STATEMENT: usize = 5_000;

/// One event's insert as SQL text, for drivers other than diesel (the
/// `sqlx` feature's `sqlx::insert_event`): the same columns and
/// values as [`insert_event`] writes, every column bound, an absent
/// `scheduled_at` taking the database's `now()`. A row whose dispatch key
/// another row holds is skipped, and then no id comes back.
///
/// Parameters, in order: `$1` id (uuid), `$2` tenant_id (text),
/// `$3` event_type (text), `$4` payload (jsonb), `$5` dispatch_key (text or
/// NULL), `$6` scheduled_at (timestamptz or NULL), `$7` traceparent (text or
/// NULL), `$8` tracestate (text or NULL), `$9` dedupe_for (interval or
/// NULL), `$10` dedupe_while_pending (boolean), `$11` priority (smallint,
/// -2 to 2), `$12` ordering_key (text or NULL). Returns `id`.
pub const INSERT_EVENT_SQL: &str = "INSERT INTO outbox_event \
     (id, tenant_id, event_type, payload, dispatch_key, scheduled_at, traceparent, tracestate, \
      dedupe_for, dedupe_while_pending, priority, ordering_key) \
     VALUES ($1, $2, $3, $4, $5, COALESCE($6, now()), $7, $8, $9, $10, $11, $12) \
     ON CONFLICT DO NOTHING \
     RETURNING id";

/// One event's insert in replace mode as SQL text (what [`insert_event`]
/// runs for a row with `replace_pending`): the parameters of
/// [`INSERT_EVENT_SQL`]; when a PENDING row of the same tenant and event
/// type holds the dispatch key (and its dedupe window has not passed), that
/// row's payload becomes `$4` and its `scheduled_at` `$6` (when not NULL)
/// instead. Returns the `id` written or updated; none when a row that is
/// not PENDING (or of another tenant or type) holds the key, and none when
/// another transaction wrote the key's first row meanwhile: run it once
/// more then (a new statement sees that row, and replaces it).
///
/// An update and an insert rather than `ON CONFLICT (dispatch_key) DO
/// UPDATE`, which a partitioned `outbox_event` cannot take (no unique index
/// on the key alone there, see [`crate::convert_to_partitioned`]).
pub const REPLACE_EVENT_SQL: &str = "WITH replaced AS ( \
         UPDATE outbox_event \
         SET payload = $4::jsonb, scheduled_at = COALESCE($6::timestamptz, scheduled_at) \
         WHERE dispatch_key = $5::text AND status = 'PENDING' \
           AND tenant_id = $2::text AND event_type = $3::text \
           AND (dedupe_for IS NULL OR created_at + dedupe_for > now()) \
         RETURNING id \
     ), inserted AS ( \
         INSERT INTO outbox_event \
         (id, tenant_id, event_type, payload, dispatch_key, scheduled_at, traceparent, tracestate, \
          dedupe_for, dedupe_while_pending, priority, ordering_key) \
         SELECT $1::uuid, $2::text, $3::text, $4::jsonb, $5::text, \
                COALESCE($6::timestamptz, now()), $7::text, $8::text, $9::interval, \
                $10::boolean, $11::smallint, $12::text \
         WHERE NOT EXISTS (SELECT 1 FROM replaced) \
         ON CONFLICT DO NOTHING \
         RETURNING id \
     ) \
     SELECT id FROM replaced UNION ALL SELECT id FROM inserted";

/// Many events' insert as SQL text, one array per column: the rows of
/// [`insert_events`], in the order given (so that within a batch the first
/// event with a dispatch key wins), skipping those whose dispatch key
/// another row holds. One text whatever the number of rows.
///
/// Parameters, in order, each an array with one element per event: `$1`
/// uuid[], `$2` text[] (tenant_id), `$3` text[] (event_type), `$4` jsonb[],
/// `$5` text[] (dispatch_key, NULL elements), `$6` timestamptz[]
/// (scheduled_at, NULL elements for `now()`), `$7` text[] (traceparent),
/// `$8` text[] (tracestate), `$9` interval[] (dedupe_for, NULL elements),
/// `$10` boolean[] (dedupe_while_pending), `$11` smallint[] (priority),
/// `$12` text[] (ordering_key, NULL elements). Returns the `id`s written.
/// Rows are inserted in the order given, so events of one ordering key get
/// their positions in that order.
pub const INSERT_EVENTS_SQL: &str = "INSERT INTO outbox_event \
     (id, tenant_id, event_type, payload, dispatch_key, scheduled_at, traceparent, tracestate, \
      dedupe_for, dedupe_while_pending, priority, ordering_key) \
     SELECT id, tenant_id, event_type, payload, dispatch_key, COALESCE(scheduled_at, now()), \
            traceparent, tracestate, dedupe_for, dedupe_while_pending, priority, ordering_key \
     FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::text[], \
                 $6::timestamptz[], $7::text[], $8::text[], $9::interval[], $10::boolean[], \
                 $11::smallint[], $12::text[]) \
          WITH ORDINALITY \
          AS e (id, tenant_id, event_type, payload, dispatch_key, scheduled_at, \
                traceparent, tracestate, dedupe_for, dedupe_while_pending, priority, \
                ordering_key, n) \
     ORDER BY n \
     ON CONFLICT DO NOTHING \
     RETURNING id";

/// The rows holding some dispatch keys, as SQL text (what
/// [`dispatch_key_holders`] reads). `$1` text[], the keys; returns
/// `(dispatch_key, id)`.
pub const DISPATCH_KEY_HOLDERS_SQL: &str =
    "SELECT dispatch_key, id FROM outbox_event WHERE dispatch_key = ANY($1)";

/// What inserting one row did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Inserted {
    /// The row was written with this id.
    New(Uuid),
    /// A row with the same dispatch key exists already; this is its id.
    /// Nothing was written and the transaction is intact.
    Existing(Uuid),
    /// In replace mode, a PENDING row held the dispatch key; this is its
    /// id, and its payload (and schedule, when given) is now the new row's.
    Replaced(Uuid),
}

/// Inserts one row. A row with a dispatch key that another row holds is
/// not written (`ON CONFLICT DO NOTHING`, so the caller's
/// transaction survives) and the holder's id comes back. In replace mode
/// (`row.replace_pending`, [`REPLACE_EVENT_SQL`]) a PENDING holder of the
/// same tenant and event type takes the row's payload (and schedule, when
/// given) instead.
///
/// It takes the connection shared: a caller may poll it together with
/// other statements on the same connection (joined futures), and the
/// connection then sends them without waiting for each answer
/// (pipelined), in the order the futures are first polled.
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn insert_event(conn: &AsyncPgConnection, row: &NewOutboxEventRow) -> Result<Inserted> {
    let mut conn = conn;
    let Some(key) = row.dispatch_key.as_deref() else {
        let id = diesel::insert_into(outbox_event::table)
            .values(one_row(row))
            .returning(outbox_event::id)
            .get_result::<Uuid>(&mut conn)
            .await?;
        return Ok(Inserted::New(id));
    };
    let inserted = if row.replace_pending {
        // Twice at most: an empty first answer may mean that another
        // transaction wrote the key's first row meanwhile (see
        // REPLACE_EVENT_SQL).
        match replace_pending(conn, row).await? {
            Some(id) => Some(id),
            None => replace_pending(conn, row).await?,
        }
    } else {
        diesel::insert_into(outbox_event::table)
            .values(one_row(row))
            .on_conflict_do_nothing()
            .returning(outbox_event::id)
            .get_result::<Uuid>(&mut conn)
            .await
            .optional()?
    };
    Ok(match inserted {
        Some(id) => written(row, id),
        None => Inserted::Existing(
            outbox_event::table
                .filter(outbox_event::dispatch_key.eq(key))
                .select(outbox_event::id)
                .get_result::<Uuid>(&mut conn)
                .await?,
        ),
    })
}

/// One run of [`REPLACE_EVENT_SQL`].
async fn replace_pending(
    mut conn: &AsyncPgConnection,
    row: &NewOutboxEventRow,
) -> Result<Option<Uuid>> {
    use diesel::sql_types::{
        Bool, Interval, Jsonb, Nullable, SmallInt, Text, Timestamptz, Uuid as SqlUuid,
    };
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = SqlUuid)]
        id: Uuid,
    }
    let found: Option<Id> = diesel::sql_query(REPLACE_EVENT_SQL)
        .bind::<SqlUuid, _>(row.id)
        .bind::<Text, _>(row.tenant_id.as_str())
        .bind::<Text, _>(row.event_type.as_str())
        .bind::<Jsonb, _>(&row.payload)
        .bind::<Nullable<Text>, _>(row.dispatch_key.as_deref())
        .bind::<Nullable<Timestamptz>, _>(row.scheduled_at)
        .bind::<Nullable<Text>, _>(row.traceparent.as_deref())
        .bind::<Nullable<Text>, _>(row.tracestate.as_deref())
        .bind::<Nullable<Interval>, _>(row.dedupe_for)
        .bind::<Bool, _>(row.dedupe_while_pending)
        .bind::<SmallInt, _>(row.priority.get())
        .bind::<Nullable<Text>, _>(row.ordering_key.as_deref())
        .get_result(&mut conn)
        .await
        .optional()?;
    Ok(found.map(|found| found.id))
}

/// What an insert that returned `id` for `row` did: wrote it, or (in
/// replace mode) updated the holder with this id.
pub(crate) fn written(row: &NewOutboxEventRow, id: Uuid) -> Inserted {
    if id == row.id {
        Inserted::New(id)
    } else {
        Inserted::Replaced(id)
    }
}

/// Inserts `rows` with one statement per [`ROWS_PER_STATEMENT`] rows,
/// skipping those whose dispatch key another row holds. Returns the ids
/// written. `replace_pending` is not read here: rows in replace mode go
/// through [`insert_event`] one by one (the publisher does so).
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn insert_events(
    mut conn: &AsyncPgConnection,
    rows: &[NewOutboxEventRow],
) -> Result<HashSet<Uuid>> {
    let mut inserted: HashSet<Uuid> = HashSet::with_capacity(rows.len());
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let ids: Vec<Uuid> = diesel::insert_into(outbox_event::table)
            .values(chunk)
            .on_conflict_do_nothing()
            .returning(outbox_event::id)
            .get_results(&mut conn)
            .await?;
        inserted.extend(ids);
    }
    Ok(inserted)
}

/// The ids of the rows holding `keys` (dispatch keys), by key.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip_all, err(level = "debug"))]
pub async fn dispatch_key_holders(
    mut conn: &AsyncPgConnection,
    keys: &[&str],
) -> Result<HashMap<String, Uuid>> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let found: Vec<(Option<String>, Uuid)> = outbox_event::table
        .filter(outbox_event::dispatch_key.eq_any(keys))
        .select((outbox_event::dispatch_key, outbox_event::id))
        .load(&mut conn)
        .await?;
    Ok(found
        .into_iter()
        .filter_map(|(key, id)| key.map(|key| (key, id)))
        .collect())
}

diesel::define_sql_function! {
    /// `COALESCE` of a timestamp that may be absent and one that is not.
    fn coalesce(
        value: diesel::sql_types::Nullable<diesel::sql_types::Timestamptz>,
        otherwise: diesel::sql_types::Timestamptz,
    ) -> diesel::sql_types::Timestamptz;
}

/// The bound columns of one event's insert (see [`one_row`]).
type OneRow<'r> = (
    diesel::dsl::Eq<outbox_event::id, Uuid>,
    diesel::dsl::Eq<outbox_event::tenant_id, &'r str>,
    diesel::dsl::Eq<outbox_event::event_type, &'r str>,
    diesel::dsl::Eq<outbox_event::payload, &'r serde_json::Value>,
    diesel::dsl::Eq<outbox_event::dispatch_key, Option<&'r str>>,
    diesel::dsl::Eq<
        outbox_event::scheduled_at,
        coalesce<Option<chrono::DateTime<chrono::Utc>>, diesel::dsl::now>,
    >,
    diesel::dsl::Eq<outbox_event::traceparent, Option<&'r str>>,
    diesel::dsl::Eq<outbox_event::tracestate, Option<&'r str>>,
    diesel::dsl::Eq<outbox_event::dedupe_for, Option<PgInterval>>,
    diesel::dsl::Eq<outbox_event::dedupe_while_pending, bool>,
    diesel::dsl::Eq<outbox_event::priority, outbox_model::Priority>,
    diesel::dsl::Eq<outbox_event::ordering_key, Option<&'r str>>,
);

/// The values of one event's `INSERT`, every column bound (an absent
/// `scheduled_at` becomes the database's `now()`).
///
/// The row type's own `Insertable` writes `DEFAULT` for an absent optional
/// column, so its statement text depends on the values and diesel prepares
/// it afresh on every call: a `Parse` round trip before the insert. Bound
/// this way the text is fixed, the connection keeps the statement prepared,
/// and a publish is one round trip.
fn one_row(row: &NewOutboxEventRow) -> OneRow<'_> {
    (
        outbox_event::id.eq(row.id),
        outbox_event::tenant_id.eq(row.tenant_id.as_str()),
        outbox_event::event_type.eq(row.event_type.as_str()),
        outbox_event::payload.eq(&row.payload),
        outbox_event::dispatch_key.eq(row.dispatch_key.as_deref()),
        outbox_event::scheduled_at.eq(coalesce(row.scheduled_at, diesel::dsl::now)),
        outbox_event::traceparent.eq(row.traceparent.as_deref()),
        outbox_event::tracestate.eq(row.tracestate.as_deref()),
        outbox_event::dedupe_for.eq(row.dedupe_for),
        outbox_event::dedupe_while_pending.eq(row.dedupe_while_pending),
        outbox_event::priority.eq(row.priority),
        outbox_event::ordering_key.eq(row.ordering_key.as_deref()),
    )
}
