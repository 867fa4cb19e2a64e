//! The Postgres connection pool type shared by the workspace.

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;

/// A bb8 pool of diesel-async Postgres connections.
pub type PgPool = bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>;

/// A connection checked out of a [`PgPool`].
pub type PooledPg<'a> = bb8::PooledConnection<'a, AsyncDieselConnectionManager<AsyncPgConnection>>;

/// Default pool size of the processes (`DATABASE_POOL_SIZE`).
pub const DEFAULT_POOL_SIZE: u32 = 10;

/// Builds a pool of at most `max_size` connections to `database_url`.
///
/// Connections are opened lazily except for the first, which is opened now
/// so that a wrong URL fails here rather than at first use.
///
/// # Errors
///
/// The connection error of the first connection.
pub async fn connect_pool(
    database_url: &str,
    max_size: u32,
) -> Result<PgPool, diesel_async::pooled_connection::PoolError> {
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(database_url);
    let pool = bb8::Pool::builder()
        .max_size(max_size.max(1))
        .min_idle(Some(0))
        .connection_timeout(std::time::Duration::from_secs(10))
        .build_unchecked(manager);
    // Prove the URL works now: a misconfiguration should fail at start-up.
    drop(pool.dedicated_connection().await?);
    Ok(pool)
}
