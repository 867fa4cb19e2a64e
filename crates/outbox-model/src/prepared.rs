//! Raw SQL that stays prepared on its connection.
//!
//! `diesel::sql_query` marks itself unsafe to cache (its text may be built
//! at run time), so diesel-async prepares it afresh on every call: a
//! `Parse` round trip before the `Bind`/`Execute` one, and the statement
//! closed again afterwards. The dispatcher runs the same few statements on
//! every tick; [`prepared`] takes only a `&'static str`, whose text cannot
//! change, and lets the connection's statement cache keep it, so each call
//! after the first is one round trip.
//!
//! Postgres plans a prepared statement for each call's values (a custom
//! plan) and, after five calls, may switch to one generic plan when its
//! estimated cost is no worse. For the dispatcher's claim, a test checks
//! that the plan kept after many calls still walks the claim index; give
//! [`prepared`] only statements whose plan does not hinge on their values.
//!
//! It relies on diesel's `QueryFragment::is_safe_to_cache_prepared`, a
//! method diesel documents only for backend implementers; the same test
//! fails if a diesel upgrade stops the statements from being kept.

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, BoxedSqlQuery, Query, QueryFragment, QueryId, SqlQuery};
use diesel::result::QueryResult;
use diesel::serialize::ToSql;
use diesel::sql_types::HasSqlType;

/// A statement of fixed text with its bound values; built by [`prepared`]
/// and run with `diesel_async::RunQueryDsl` like `diesel::sql_query`.
#[must_use = "a statement does nothing until it is executed or loaded"]
pub struct Prepared<'f>(BoxedSqlQuery<'f, Pg, SqlQuery>);

/// A raw statement whose text is fixed at compile time, kept prepared on
/// each connection that runs it (see the module documentation). Bind its
/// `$n` placeholders in order with [`Prepared::bind`], as with
/// `diesel::sql_query`.
pub fn prepared<'f>(sql: &'static str) -> Prepared<'f> {
    Prepared(diesel::sql_query(sql).into_boxed())
}

impl<'f> Prepared<'f> {
    /// Binds the next placeholder (`$1` first) to `value` of SQL type `ST`.
    pub fn bind<ST, V>(self, value: V) -> Self
    where
        Pg: HasSqlType<ST>,
        V: ToSql<ST, Pg> + Send + 'f,
        ST: Send + 'f,
    {
        Self(self.0.bind::<ST, V>(value))
    }
}

impl std::fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Prepared")
            .field(&diesel::debug_query::<Pg, _>(&self.0).to_string())
            .finish()
    }
}

impl QueryFragment<Pg> for Prepared<'_> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    // The inner query says "unsafe to cache" because its text could have
    // been built at run time; this one's text is a `&'static str`.
    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> QueryResult<bool> {
        Ok(true)
    }
}

impl QueryId for Prepared<'_> {
    // No type-level id: the cache keys the statement by its text and the
    // types of its binds.
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Prepared<'_> {
    type SqlType = <SqlQuery as Query>::SqlType;
}
