//! Dev-only test helpers for the outbox workspace: real services, isolated
//! per test.
//!
//! - [`TestDatabase`]: a fresh Postgres database per test, cloned in
//!   milliseconds from a template that is migrated once per schema version,
//!   and dropped when the value is dropped (also on panic); re-exported from
//!   `outbox-testkit`, the test kit for applications, which holds it.
//! - [`TestRedis`]: a unique key prefix per test on a real Redis, whose keys
//!   are deleted on drop; also `outbox-testkit`'s.
//! - [`RedisProcess`]: a private `redis-server` a test can stop and restart,
//!   or one that speaks TLS only.
//! - [`RedisCluster`]: a private Redis Cluster (primaries with replicas) a
//!   test can kill a primary of.
//! - [`PostgresProcess`]: a private Postgres cluster that accepts TLS only,
//!   with a certificate from a [`TestPki`] (a test CA made on the spot).
//! - [`SmtpSink`]: a real SMTP server on 127.0.0.1 that records the mails it
//!   accepts ([`ReceivedMail`]), or refuses recipients on demand.
//! - [`HttpSink`]: a real HTTP server on 127.0.0.1 that records every request
//!   ([`ReceivedRequest`]) and answers with scripted status codes.
//! - [`ChildOutput`]: the output of a child process (a worker binary),
//!   collected line by line and echoed to the test's stderr.
//! - [`LogCapture`]: the log lines the code under test writes on the
//!   test's thread, for tests of a warning.
//!
//! The servers come from `OUTBOX_TEST_DATABASE_URL` / `DATABASE_URL` and
//! `OUTBOX_TEST_REDIS_URL` / `REDIS_URL`, defaulting to the standard local
//! ports; `cargo xtask test` sets them after finding or starting the
//! services. Nothing here mocks Postgres or Redis. Not for production code.

mod child_output;
mod http_sink;
mod log_capture;
mod metrics_recording;
mod pki;
mod postgres_process;
mod redis_cluster;
mod redis_process;
mod smtp_sink;
mod url;

pub use child_output::ChildOutput;
pub use http_sink::{HttpSink, ReceivedRequest};
pub use log_capture::LogCapture;
pub use metrics_recording::with_metrics_recorder;
pub use outbox_testkit::{
    POLL, Swept, TestDatabase, TestRedis, consistently, database_server_url, eventually,
    eventually_reaching, redis_server_url, sweep_abandoned_databases, sweep_abandoned_namespaces,
    with_database,
};
pub use pki::TestPki;
pub use postgres_process::PostgresProcess;
pub use redis_cluster::{NODE_TIMEOUT_MS, RedisCluster};
pub use redis_process::RedisProcess;
pub use smtp_sink::{ReceivedMail, SmtpSink};
pub use url::workflow_e2e_server_url;

/// Installs a tracing subscriber that writes through the test harness'
/// capture (shown for failing tests). Honors `RUST_LOG`; safe to call from
/// every test.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
}
