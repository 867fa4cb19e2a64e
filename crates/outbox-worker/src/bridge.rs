//! The `workflow-bridge` process: the signed workflow bridge
//! ([`outbox_workflow_bridge::router`]) with `/healthz`, `/readyz`
//! (Postgres) and `/metrics`, pruning of old request ids, a graceful stop
//! on SIGTERM, and span export over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set (as the workers do; service name `workflow-bridge` by default).

use std::convert::Infallible;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use diesel_async::RunQueryDsl;
use outbox_pg::PgPool;
use outbox_queue::redact_url;
use outbox_workflow_bridge::{BridgeState, prune_request_ids, router};
use outbox_workflow_runner::Runner;
use tokio_util::sync::CancellationToken;

use crate::config::BridgeConfig;
use crate::serve::{RESTART, connect_postgres, http};
use crate::supervisor::Supervisor;
use crate::{EXIT_CONFIGURATION, init_tracing, shutdown_signal, variables};

/// The binary's name: its `--help`, its log and error lines, its metrics'
/// `binary` label, and the default `OTEL_SERVICE_NAME`.
pub const BRIDGE_BINARY: &str = "workflow-bridge";

/// How often request ids older than the signature window are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The entry point of `workflow-bridge`: command line (`--help` lists
/// every variable, see [`variables::bridge_variables`]), configuration,
/// runtime, exit code.
#[must_use]
pub fn bridge_main() -> ExitCode {
    // Exits 0 after --help or --version, 2 on an unknown flag.
    let matches = variables::bridge_command().get_matches();
    let lookup = variables::lookup(&matches);
    // Declared before the runtime, so dropped after it: the last spans are
    // sent once the requests in progress are done, outside the runtime.
    let _traces = match init_tracing(&lookup, BRIDGE_BINARY) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("{BRIDGE_BINARY}: {e}");
            return ExitCode::from(EXIT_CONFIGURATION);
        }
    };
    let config = match BridgeConfig::from_lookup(&lookup) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{BRIDGE_BINARY}: {e}");
            tracing::error!(variable = e.variable, "{e}");
            return ExitCode::from(EXIT_CONFIGURATION);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{BRIDGE_BINARY}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_bridge(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "bridge failed");
            eprintln!("{BRIDGE_BINARY}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn readyz(State(pool): State<PgPool>) -> impl IntoResponse {
    let check = async {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        diesel::sql_query("SELECT 1")
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(Duration::from_secs(3), check).await {
        Ok(Ok(_)) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({ "postgres": "ok" })),
        ),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({ "postgres": e })),
        ),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({ "postgres": "timed out" })),
        ),
    }
}

/// Serves the bridge until SIGTERM or Ctrl-C, then lets requests in
/// progress finish within the grace period.
///
/// # Errors
///
/// When Postgres cannot be reached at start, the address cannot be bound,
/// or the runner cannot be built.
pub async fn run_bridge(config: BridgeConfig) -> Result<()> {
    let metrics = crate::recorder::for_run(BRIDGE_BINARY)?;
    let pool = connect_postgres(&config.database_url, config.pool_size).await?;
    let runner = Runner::with_address_policy(config.address_policy.clone())
        .context("cannot build the workflow runner's HTTP client")?
        .with_bridge_blocks(std::sync::Arc::new(outbox_workflow_sandbox::QuickJs))
        .with_lease(config.workflow_lease);
    let app = router(BridgeState::new(
        pool.clone(),
        runner,
        config.secrets.clone(),
    ))
    .merge(
        axum::Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .with_state(pool.clone())
            .merge(crate::http::metrics_route(metrics.clone())),
    );
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("cannot bind WORKFLOW_BRIDGE_ADDR={}", config.addr))?;
    tracing::info!(
        addr = %listener.local_addr()?,
        database = %redact_url(&config.database_url),
        secrets = config.secrets.len(),
        "workflow bridge started"
    );
    let mut services = Supervisor::new(config.shutdown_grace)
        .saying("stopping: no new requests; finishing those in progress")
        .service("http", RESTART, http(listener, app)?)
        .service("request-id pruner", RESTART, move |token| {
            prune(pool.clone(), token)
        });
    if let Some(handle) = metrics {
        services = services.service("metrics upkeep", RESTART, crate::recorder::upkeep(handle));
    }
    let stopped = services.run_until(shutdown_signal()).await?;
    if stopped.overran.is_empty() {
        tracing::info!("bridge stopped cleanly");
    } else {
        tracing::warn!("grace period over; exiting with requests unfinished");
    }
    Ok(())
}

/// Deletes request ids older than the signature window, every
/// [`PRUNE_EVERY`], until `shutdown`.
async fn prune(pool: PgPool, shutdown: CancellationToken) -> Result<(), Infallible> {
    loop {
        if let Ok(mut conn) = pool.get().await {
            match prune_request_ids(&mut conn).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(removed = n, "pruned bridge request ids"),
                Err(e) => tracing::warn!(error = %e, "cannot prune bridge request ids"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(PRUNE_EVERY) => {}
        }
    }
}
