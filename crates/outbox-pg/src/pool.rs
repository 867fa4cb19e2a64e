//! The bb8 pool of Postgres connections the processes share.

use std::sync::Arc;

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, PoolError, PoolableConnection, RecyclingMethod,
};

use crate::PgConnectOptions;

/// A bb8 pool of diesel-async Postgres connections.
pub type PgPool = bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>;

/// A connection checked out of a [`PgPool`].
pub type PooledPg<'a> = bb8::PooledConnection<'a, AsyncDieselConnectionManager<AsyncPgConnection>>;

/// Default pool size of the processes (`DATABASE_POOL_SIZE`).
pub const DEFAULT_POOL_SIZE: u32 = 10;

/// `DATABASE_POOL_SIZE`: the `max_size` of [`connect_pool`].
pub const DATABASE_POOL_SIZE: outbox_env::Whole = outbox_env::Whole {
    name: "DATABASE_POOL_SIZE",
    default: DEFAULT_POOL_SIZE as u64,
    min: 1,
    max: 1000,
    meaning: "Postgres connections",
};

/// How long a checkout waits for a free connection of a full pool before it
/// fails (bb8's error reads "Timed out in bb8").
pub const CHECKOUT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Builds a pool of at most `max_size` connections to `database_url`,
/// each opened by [`PgConnectOptions::connect`] (so with the URL's
/// `sslmode` and `sslrootcert`).
///
/// Connections are opened lazily except for the first, which is opened now
/// so that a wrong URL fails here rather than at first use.
///
/// A checkout costs no round trip: the pool hands out an idle connection
/// unless its socket has closed (the server restarted, or ended the
/// backend) or it was left in a broken transaction, in which case it opens
/// another. A server that closes a connection is seen as soon as the
/// connection's task has read the end of the stream; a peer that vanishes
/// without closing it is seen by the next statement's error.
///
/// # Errors
///
/// [`PoolError::ConnectionError`] with
/// [`diesel::ConnectionError::InvalidConnectionUrl`] when the URL is
/// unusable (see [`PgConnectOptions::from_url`]); otherwise the connection
/// error of the first connection.
pub async fn connect_pool(database_url: &str, max_size: u32) -> Result<PgPool, PoolError> {
    let options = PgConnectOptions::from_url(database_url).map_err(|e| {
        PoolError::ConnectionError(diesel::ConnectionError::InvalidConnectionUrl(e.to_string()))
    })?;
    pool_with(options, max_size).await
}

/// As [`connect_pool`], with options parsed already.
///
/// # Errors
///
/// The connection error of the first connection.
pub async fn pool_with(options: PgConnectOptions, max_size: u32) -> Result<PgPool, PoolError> {
    let options = Arc::new(options);
    let mut config = ManagerConfig::default();
    config.recycling_method = RecyclingMethod::CustomFunction(Box::new(|conn| {
        Box::pin(std::future::ready(checkout_check(conn)))
    }));
    config.custom_setup = Box::new(move |_url| {
        let options = Arc::clone(&options);
        Box::pin(async move { options.connect().await })
    });
    // The URL is only a label now: the setup above ignores it.
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config("", config);
    let pool = bb8::Pool::builder()
        .max_size(max_size.max(1))
        .min_idle(Some(0))
        .connection_timeout(CHECKOUT_TIMEOUT)
        .build_unchecked(manager);
    // Prove the URL works now: a misconfiguration should fail at start-up.
    drop(pool.dedicated_connection().await?);
    Ok(pool)
}

/// The pool's check of an idle connection before it hands it out: the
/// connection is refused (and another opened) when its socket has closed or
/// its transaction state is broken. No statement is sent: the check of
/// diesel-async's default (`SELECT 1` before every checkout) added a round
/// trip to every dispatcher tick and every handler's statement (59,936
/// pings against 33,068 claims over one latency stage of the bench). A peer
/// that vanishes without closing the connection is now seen by the next
/// statement's error, where the ping saw it at checkout (after the pool's
/// connection timeout).
///
/// # Errors
///
/// [`DieselError::DatabaseError`] of kind
/// [`DatabaseErrorKind::ClosedConnection`] when the connection is unusable.
fn checkout_check(conn: &mut AsyncPgConnection) -> diesel::QueryResult<()> {
    if conn.is_broken() {
        Err(DieselError::DatabaseError(
            DatabaseErrorKind::ClosedConnection,
            Box::new("the pooled connection is closed or its transaction is broken".to_owned()),
        ))
    } else {
        Ok(())
    }
}
