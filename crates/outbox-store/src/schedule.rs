//! The periodic events' table, `outbox_schedule`: one row per schedule
//! holding its newest settled tick. The worker's schedule runner decides
//! which tick is due; these statements only record it.
//!
//! # Transactions and locks
//!
//! [`advance_schedule`] is one conditional upsert: call it in the
//! transaction that publishes the tick's event, and publish only when it
//! returns `true`. Of several transactions advancing the same schedule to
//! the same tick, the first to commit advances it; the others wait on the
//! row's lock and then find `last_tick` no longer older, so they return
//! `false` (and publish nothing). The other operations are single
//! statements.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::upsert::excluded;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_model::schema::outbox_schedule;
use tracing::instrument;

use crate::Result;

/// One schedule's row.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, serde::Serialize)]
#[diesel(table_name = outbox_schedule)]
pub struct ScheduleRow {
    /// The schedule's name.
    pub name: String,
    /// The newest tick published, or passed over at the schedule's first
    /// start.
    pub last_tick: DateTime<Utc>,
    /// When the row last advanced (Postgres time).
    pub updated_at: DateTime<Utc>,
}

/// Advances schedule `name` to `tick` when its row is older (or absent):
/// `INSERT … ON CONFLICT (name) DO UPDATE … WHERE outbox_schedule.last_tick
/// < EXCLUDED.last_tick`. Returns whether it advanced, i.e. whether the
/// caller's transaction is the one that publishes `tick`.
///
/// # Errors
///
/// When Postgres fails (the caller's transaction is aborted then).
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn advance_schedule(
    conn: &mut AsyncPgConnection,
    name: &str,
    tick: DateTime<Utc>,
) -> Result<bool> {
    // `filter` of an upsert (its `DO UPDATE … WHERE`), which the prelude's
    // `QueryDsl` does not offer for an insert.
    use diesel::query_dsl::methods::FilterDsl as _;
    let advanced = diesel::insert_into(outbox_schedule::table)
        .values(row(name, tick))
        .on_conflict(outbox_schedule::name)
        .do_update()
        .set((
            outbox_schedule::last_tick.eq(excluded(outbox_schedule::last_tick)),
            outbox_schedule::updated_at.eq(diesel::dsl::now),
        ))
        // DO UPDATE … WHERE: only a later tick moves the row.
        .filter(outbox_schedule::last_tick.lt(excluded(outbox_schedule::last_tick)))
        .returning(outbox_schedule::name)
        .get_result::<String>(conn)
        .await
        .optional()?;
    Ok(advanced.is_some())
}

/// Writes the row of schedule `name` at `at` unless it has one (its first
/// start: nothing before `at` is due). Returns whether it wrote it.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn anchor_schedule(
    conn: &mut AsyncPgConnection,
    name: &str,
    at: DateTime<Utc>,
) -> Result<bool> {
    let written = diesel::insert_into(outbox_schedule::table)
        .values(row(name, at))
        .on_conflict_do_nothing()
        .execute(conn)
        .await?;
    Ok(written == 1)
}

/// The values of a new row of schedule `name` at `tick`.
fn row(
    name: &str,
    tick: DateTime<Utc>,
) -> (
    diesel::dsl::Eq<outbox_schedule::name, &str>,
    diesel::dsl::Eq<outbox_schedule::last_tick, DateTime<Utc>>,
) {
    (
        outbox_schedule::name.eq(name),
        outbox_schedule::last_tick.eq(tick),
    )
}

/// The row of schedule `name`, if it has one.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn schedule_row(conn: &mut AsyncPgConnection, name: &str) -> Result<Option<ScheduleRow>> {
    Ok(outbox_schedule::table
        .filter(outbox_schedule::name.eq(name))
        .select(ScheduleRow::as_select())
        .get_result(conn)
        .await
        .optional()?)
}

/// Every schedule's row, by name.
///
/// # Errors
///
/// When Postgres fails.
#[instrument(level = "debug", skip(conn), err(level = "debug"))]
pub async fn schedule_rows(conn: &mut AsyncPgConnection) -> Result<Vec<ScheduleRow>> {
    Ok(outbox_schedule::table
        .order(outbox_schedule::name)
        .select(ScheduleRow::as_select())
        .load(conn)
        .await?)
}
