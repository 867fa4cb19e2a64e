//! Connections to Postgres for the outbox's processes: reading a database
//! URL ([`PgConnectOptions`], with libpq's `sslmode` and `sslrootcert`),
//! opening one connection over TLS through rustls when the URL asks for it
//! ([`establish`]), and the bb8 pool every process shares ([`connect_pool`],
//! [`PgPool`]).
//!
//! The dispatcher, the workers, the operator CLI, xtask and the test
//! harness open every connection here, so that they read a URL the same
//! way. It is not what an application needs to publish: `outbox-publish`
//! takes the application's own `AsyncPgConnection` and does not depend on
//! this crate, so the TLS connector and the pool stay out of its build. It
//! holds no schema and no SQL beyond the connection itself; those are in
//! `outbox-model` and the crates that own the tables.

mod connect;
mod pool;

pub use connect::{DATABASE_URL, DatabaseUrlError, PgConnectOptions, SslMode, establish};
pub use pool::{
    CHECKOUT_TIMEOUT, DATABASE_POOL_SIZE, DEFAULT_POOL_SIZE, PgPool, PooledPg, connect_pool,
    pool_with,
};
