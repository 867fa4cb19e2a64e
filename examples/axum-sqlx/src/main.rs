//! The shop service: `DATABASE_URL`, `REDIS_URL` and the worker's
//! variables (`OUTBOX_DISPATCHER_ENABLED=true` on at least one replica;
//! see `worker-general --help`), and `SHOP_ADDR` (127.0.0.1:3000 by
//! default) for its one listener. Ctrl-C or SIGTERM stops the service and
//! the worker inside it.

use anyhow::Context;
use axum_sqlx_example::{migrate, pool, serve};
use outbox_worker::{Group, WorkerConfig};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Where the service listens unless `SHOP_ADDR` says otherwise.
const DEFAULT_ADDR: &str = "127.0.0.1:3000";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let database_url = std::env::var("DATABASE_URL").context("DATABASE_URL is not set")?;
    let addr = std::env::var("SHOP_ADDR").unwrap_or_else(|_| DEFAULT_ADDR.to_owned());
    // The worker's variables, read once (a bad value names the variable).
    let config = WorkerConfig::from_env(Group::General)?;

    migrate(&database_url).await?;
    let pool = pool(&database_url).await?;
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!("shop listening on http://{addr}");

    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.cancel();
        }
    });
    serve(listener, pool, config, stop).await
}

/// Ctrl-C, or SIGTERM on Unix (what a container runtime sends).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
