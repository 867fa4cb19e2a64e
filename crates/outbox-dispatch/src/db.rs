//! The reconciler's reads of the receivers' tables: which events already
//! have their handler's row (`audit_log.outbox_event_id`), and the enabled
//! plugin hook subscriptions. Every statement on the outbox's own tables is
//! in `outbox-store`.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

#[derive(QueryableByName)]
struct IdRow {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// Of `event_ids`, those that have a row in `table` (one row per event,
/// keyed by the event id): events whose handler already wrote what it
/// writes.
pub async fn events_with_rows(
    conn: &mut AsyncPgConnection,
    table: &RowTable,
    event_ids: &[Uuid],
) -> diesel::QueryResult<Vec<Uuid>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    // Both names passed `RowTable::parse` (lower-case letters, digits and
    // underscores only) and are quoted besides.
    let sql = format!(
        "SELECT \"{column}\" AS id FROM \"{table}\" WHERE \"{column}\" = ANY($1)",
        column = table.column(),
        table = table.table(),
    );
    diesel::sql_query(sql)
        .bind::<Array<SqlUuid>, _>(event_ids)
        .load::<IdRow>(conn)
        .await
        .map(|rows| rows.into_iter().map(|row| row.id).collect())
}

/// A table whose row is the whole effect of a handler, one per event,
/// found by the event id in one of its columns (`audit_log.outbox_event_id`).
/// It owns its name, so one read from a worker's registration at run time
/// serves as well as a description's constant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowTable {
    table: Cow<'static, str>,
}

impl RowTable {
    /// The column that holds the event id in a table whose rows are one
    /// per event.
    pub const EVENT_ID_COLUMN: &'static str = "outbox_event_id";

    /// Reads `table.outbox_event_id` (as a subscriber description records
    /// it): a table whose rows are one per event, keyed by the event id.
    /// `None` for any other column, or for names that are not plain
    /// lower-case SQL identifiers.
    ///
    /// ```
    /// use outbox_dispatch::RowTable;
    /// let audit = RowTable::parse("audit_log.outbox_event_id").unwrap();
    /// assert_eq!((audit.table(), audit.column()), ("audit_log", "outbox_event_id"));
    /// let read = RowTable::parse(String::from("search_document.outbox_event_id")).unwrap();
    /// assert_eq!(read.table(), "search_document");
    /// assert_eq!(RowTable::parse("workflow_execution.trigger_event_id"), None);
    /// assert_eq!(RowTable::parse("idempotency store"), None);
    /// assert_eq!(RowTable::parse("a\"; DROP TABLE x; --.outbox_event_id"), None);
    /// ```
    #[must_use]
    pub fn parse(recorded_in: impl Into<Cow<'static, str>>) -> Option<Self> {
        let recorded_in = recorded_in.into();
        let (table, column) = recorded_in.rsplit_once('.')?;
        let plain = |name: &str| {
            name.chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if column != Self::EVENT_ID_COLUMN || !plain(table) {
            return None;
        }
        let length = table.len();
        let table = match recorded_in {
            Cow::Borrowed(text) => Cow::Borrowed(&text[..length]),
            Cow::Owned(mut text) => {
                text.truncate(length);
                Cow::Owned(text)
            }
        };
        Some(Self { table })
    }

    /// The table (`audit_log`).
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The column holding the event id (`outbox_event_id`).
    #[must_use]
    pub fn column(&self) -> &'static str {
        Self::EVENT_ID_COLUMN
    }
}

/// An enabled plugin hook subscription.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct HookSubscription {
    /// The subscription.
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    /// Its tenant.
    #[diesel(sql_type = Text)]
    pub tenant_id: String,
    /// The hook (`workflow.executed`).
    #[diesel(sql_type = Text)]
    pub hook: String,
    /// When it was created: a fan-out before that did not include it.
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
}

/// The enabled plugin hook subscriptions of `tenants`.
pub async fn hook_subscriptions(
    conn: &mut AsyncPgConnection,
    tenants: &[String],
) -> diesel::QueryResult<Vec<HookSubscription>> {
    if tenants.is_empty() {
        return Ok(Vec::new());
    }
    diesel::sql_query(
        "SELECT id, tenant_id, hook, created_at FROM plugin_hook_subscription
         WHERE enabled AND tenant_id = ANY($1)",
    )
    .bind::<Array<Text>, _>(tenants)
    .load(conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::RowTable;

    // The same cases as `RowTable::parse`'s doctest, as a unit test: a
    // mutation run does not run doctests, and a `||` for the `&&` there let
    // any name ending in `.outbox_event_id`, an SQL injection among them,
    // into the statements the table name is pasted into.
    #[test]
    fn only_a_plain_table_with_the_event_id_column_is_a_row_table() {
        let audit = RowTable::parse("audit_log.outbox_event_id").unwrap();
        assert_eq!(
            (audit.table(), audit.column()),
            ("audit_log", "outbox_event_id")
        );
        assert!(RowTable::parse("_t2.outbox_event_id").is_some());
        for refused in [
            "workflow_execution.trigger_event_id",
            "idempotency store",
            "a\"; DROP TABLE x; --.outbox_event_id",
            "Audit.outbox_event_id",
            "2fa.outbox_event_id",
            ".outbox_event_id",
        ] {
            assert_eq!(RowTable::parse(refused), None, "{refused}");
        }
    }
}
