//! The worker as a library ([`WorkerBuilder`]: an application's own `main`
//! adds routing rules, handlers and mail templates to a group), the two
//! worker processes built on it with nothing added, `worker-general` and
//! `worker-mail`; and `workflow-bridge` ([`bridge_main`], [`run_bridge`]),
//! the signed bridge that runs workflow executions for workers in `hybrid`
//! and `http` mode. Each lists its variables in its `--help` (see
//! [`variables`]). A worker reads its environment once into a
//! [`WorkerConfig`], the bridge into a [`BridgeConfig`] (a bad value stops
//! start-up with a message naming the variable); a worker then wires
//! the handler group of its `WORKER_QUEUE_GROUP`, starts the daily retention
//! job when it is the general group (and the dispatcher too when
//! `OUTBOX_DISPATCHER_ENABLED=true`; off by default), serves `/healthz`,
//! `/readyz` and `/metrics` on `WORKER_HTTP_ADDR`, and on SIGTERM or Ctrl-C
//! stops taking work, finishes what is in hand and exits 0. Each of these
//! is a named service of a supervisor (restarted with backoff when it
//! fails, except the queue workers, whose failure stops the worker with an
//! error; stopped within `WORKER_SHUTDOWN_GRACE_MS`); an application that
//! owns the process's signals runs the worker with
//! [`WorkerBuilder::run_until`] and its own shutdown future instead, and
//! may serve the endpoints on its own router
//! ([`WorkerBuilder::http_routes`]).
//!
//! Redis must keep what it is given: at start the worker asks for its
//! `maxmemory-policy` and exits with code 2 unless it is `noeviction` (an
//! evicting Redis silently drops queued jobs and idempotency keys), or
//! `OUTBOX_ALLOW_REDIS_EVICTION=true` says to start anyway. When Redis does
//! not allow `CONFIG GET` or does not answer at start, it warns and starts.
//! It also reports Redis' persistence, read from `appendonly`, `appendfsync`
//! and `save` (`mode` one of `aof-always`, `aof-everysec`, `aof-no`, `rdb`,
//! `none`, `unknown`), in its log and as the gauge
//! `outbox_redis_persistence{mode}`;
//! in the general group the dispatcher runs with its Redis guard, which
//! notices a Redis that lost handed-off jobs and pushes them again
//! (`docs/reliability.md`). Every variable is listed in `docs/operations/configuration.md`.

#[cfg(feature = "workflow")]
mod bridge;
mod builder;
mod built_in;
pub mod catalog;
mod config;
mod declared;
mod error_reports;
mod gauges;
mod http;
mod ordering;
mod pool_demand;
mod recorder;
mod redis_check;
mod registration;
mod schedule;
mod serve;
mod subscriber;
mod supervisor;
mod traces;
mod trim;
pub mod variables;

use std::process::ExitCode;

#[cfg(feature = "workflow")]
use anyhow::Context;
use anyhow::Result;
#[cfg(feature = "workflow")]
use outbox_workflow_bridge::BridgeClient;
#[cfg(feature = "workflow")]
use outbox_workflow_bridge::executor::Executor;
#[cfg(feature = "workflow")]
use outbox_workflow_runner::Runner;

#[cfg(feature = "workflow")]
pub use bridge::{BRIDGE_BINARY, bridge_main, run_bridge};
pub use builder::{BARE_BINARY, WorkerBuilder};
pub use built_in::{BuiltIn, built_in_subscribers};
#[cfg(feature = "workflow")]
pub use config::{BridgeConfig, BridgeSettings, DEFAULT_BRIDGE_ADDR};
pub use config::{
    ConfigError, ConsoleConfig, DEFAULT_CONSOLE_ADDR, DEFAULT_DELIVERY_RECORD_TTL_HOURS,
    DEFAULT_GAUGE_INTERVAL, DEFAULT_QUEUE_DEAD_RETENTION_HOURS, DEFAULT_QUEUE_DONE_RETENTION_HOURS,
    DEFAULT_RETENTION_EVERY, DEFAULT_SHUTDOWN_GRACE, Group, WorkerConfig,
};
pub use declared::UnroutedEventTypes;
pub use error_reports::{
    ErrorReportLayer, ErrorReports, SENTRY_DSN_VARIABLE, error_report_layer, start_error_reports,
};
pub use gauges::{GaugeSettings, refresh_gauges};
pub use ordering::OrderingPolicy;
pub use recorder::METRICS_UPKEEP_EVERY;
pub use redis_check::{
    ALLOW_EVICTION_VARIABLE, EVICTION_CHECK_TIMEOUT, EvictionPolicy, NO_EVICTION, RedisMayEvict,
    enforce_eviction_policy, read_eviction_policy, read_persistence, report_persistence,
    set_persistence_gauge,
};
pub use schedule::{MAX_SCHEDULE_NAME_LEN, Missed, Schedule, ScheduleError, schedules_from_file};
pub use subscriber::{Resources, Subscriber, handler_group};
pub use traces::{
    OTLP_ENDPOINT_VARIABLE, SERVICE_NAME_VARIABLE, TraceExport, TraceExportConfig,
    start_trace_export, trace_layer,
};

/// The adoption guide's examples (a rollback with the application's own
/// error type, a worker inside the application's service), compiled as
/// doctests
/// so that they cannot rot; here because this crate sees every crate they
/// use.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/adopting.md")]
struct AdoptingDoctests;

/// The examples of the adoption guide's pages on handlers and on testing.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/adopting/handlers.md")]
#[doc = include_str!("../../../docs/adopting/testing.md")]
struct AdoptingPagesDoctests;

/// The README's examples (the quick start's migrations, publishing and
/// handler, publishing without a struct), compiled as doctests so that
/// they cannot rot; here because this crate sees every crate they use.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// The exit code of a worker stopped by its configuration: a malformed
/// variable (a [`ConfigError`], also from a handler added with
/// [`WorkerBuilder::handler_with`]), a Redis that may evict keys (see
/// [`RedisMayEvict`]), a declared event type no rule routes
/// ([`UnroutedEventTypes`]), two schedules of one name
/// ([`ScheduleError`]), or an `outbox_event` partitioned by other means
/// than `outbox partition convert`.
pub const EXIT_CONFIGURATION: u8 = 2;

/// The entry point of both binaries: command line (`--help` lists every
/// variable, see [`variables`]), configuration, runtime, exit code; the
/// worker of `group` with nothing added ([`WorkerBuilder::main`]).
#[must_use]
pub fn main_for(group: Group) -> ExitCode {
    WorkerBuilder::new(group).main()
}

/// [`WorkerBuilder::main`]: command line, configuration, runtime, exit code.
pub(crate) fn process_main(builder: WorkerBuilder) -> ExitCode {
    let group = builder.worker_group();
    let binary = builder.binary();
    // Exits 0 after --help or --version, 2 on an unknown flag.
    let matches = variables::command(group)
        .name(binary)
        .about(builder.about())
        .get_matches();
    let lookup = variables::lookup(&matches);
    // Before logging starts: its error lines go to Sentry when this is on.
    let _reports = match start_error_reports(&lookup, binary) {
        Ok(reports) => reports,
        Err(e) => {
            eprintln!("{binary}: {e}");
            return ExitCode::from(EXIT_CONFIGURATION);
        }
    };
    // Declared before the runtime, so dropped after it: the last spans are
    // sent once the work is done, outside the runtime.
    let _traces = match init_tracing(&lookup, binary) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("{binary}: {e}");
            return ExitCode::from(EXIT_CONFIGURATION);
        }
    };
    let mut config = match WorkerConfig::from_lookup(group, &lookup) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{binary}: {e}");
            tracing::error!(variable = e.variable, "{e}");
            return ExitCode::from(EXIT_CONFIGURATION);
        }
    };
    config.router = match builder.routes(config.router) {
        Ok(router) => router,
        Err(e) => {
            eprintln!("{binary}: a routing rule added to the worker: {e}");
            tracing::error!("a routing rule added to the worker: {e}");
            return ExitCode::from(EXIT_CONFIGURATION);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{binary}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(builder.run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "worker failed");
            eprintln!("{binary}: {e:#}");
            // A handler added at start may refuse its own variable the
            // same way the worker refuses one of its own.
            if e.downcast_ref::<RedisMayEvict>().is_some()
                || e.downcast_ref::<ConfigError>().is_some()
                || e.downcast_ref::<UnroutedEventTypes>().is_some()
                || e.downcast_ref::<ScheduleError>().is_some()
                || e.downcast_ref::<serve::UnknownPartitioning>().is_some()
            {
                ExitCode::from(EXIT_CONFIGURATION)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `LOG_FORMAT`: [`LogFormat`].
pub const LOG_FORMAT: outbox_env::Text = outbox_env::Text {
    name: "LOG_FORMAT",
    default: "text",
    form: "text, json",
    meaning: "one readable line or one JSON object per log event (RUST_LOG filters either)",
};

/// `LOG_FORMAT`: how the processes write their log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event (the default).
    #[default]
    Text,
    /// One JSON object per line, with the fields of the current span (a
    /// job's queue, task id, event id, tenant, round and attempt) and the
    /// event's own fields, for log pipelines.
    Json,
}

impl LogFormat {
    /// Reads `LOG_FORMAT` through `get`: `text` (default) or `json`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the variable for any other value.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        match LOG_FORMAT.read(get).as_deref().map(str::trim) {
            None | Some("text") => Ok(Self::Text),
            Some("json") => Ok(Self::Json),
            Some(other) => Err(LOG_FORMAT.refuse(other, "must be text or json")),
        }
    }
}

/// Sets up logging as `LOG_FORMAT` (read through `get`) says (`RUST_LOG`
/// filters), and trace export when `OTEL_EXPORTER_OTLP_ENDPOINT` asks for
/// it (see [`TraceExportConfig`]; `binary` is the default service name).
/// The returned guard keeps the export on.
///
/// # Errors
///
/// A bad `LOG_FORMAT` (logging then stays text, so the error can be shown)
/// or a bad `OTEL_EXPORTER_OTLP_ENDPOINT` (logging starts without export).
pub(crate) fn init_tracing(
    get: &dyn Fn(&str) -> Option<String>,
    binary: &str,
) -> Result<TraceExport, ConfigError> {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(
                "info,apalis=warn,apalis_core=warn,apalis_redis=warn",
            )
        })
    };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let format = LogFormat::from_lookup(get);
    let export = TraceExportConfig::from_lookup(get, binary)
        .and_then(|config| config.as_ref().map(start_trace_export).transpose());
    let (export, export_error) = match export {
        Ok(export) => (export.unwrap_or_default(), None),
        Err(e) => (TraceExport::default(), Some(e)),
    };
    let registry = tracing_subscriber::registry()
        .with(filter())
        .with(error_reports::error_report_layer())
        .with(export.provider().map(trace_layer));
    match format {
        Ok(LogFormat::Json) => {
            let _ = registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .json()
                        .with_current_span(true)
                        .with_span_list(false)
                        .with_target(false),
                )
                .try_init();
        }
        _ => {
            let _ = registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_target(false)
                        // Colours only on a terminal: a file or a log
                        // collector would get the escape codes as text.
                        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout())),
                )
                .try_init();
        }
    }
    format?;
    export_error.map_or(Ok(export), Err)
}

/// The workflow executor `WORKFLOW_EXECUTOR` asks for (feature `workflow`).
///
/// # Errors
///
/// When the runner's or the bridge client's HTTP client cannot be built.
#[cfg(feature = "workflow")]
pub fn workflow_executor(config: &WorkerConfig) -> Result<Executor> {
    let runner = Runner::with_address_policy(config.address_policy.clone())
        .context("cannot build the workflow runner's HTTP client")?
        .with_lease(config.workflow_lease);
    let bridge = config
        .workflow_bridge
        .as_ref()
        .map(|bridge| BridgeClient::new(&bridge.url, bridge.secret.clone()))
        .transpose()
        .context("WORKFLOW_BRIDGE_URL")?;
    Ok(Executor::new(config.workflow_executor, runner, bridge)?)
}

/// Runs a worker process until SIGTERM / Ctrl-C.
///
/// At start it asks Redis for its `maxmemory-policy` (see
/// [`read_eviction_policy`]): anything but `noeviction` stops it with
/// [`RedisMayEvict`] unless `OUTBOX_ALLOW_REDIS_EVICTION=true`; a Redis that
/// refuses `CONFIG` or does not answer is only warned about, so the worker
/// still starts before Redis, as it always did.
///
/// # Errors
///
/// When Postgres or Redis cannot be set up at start, Redis may evict keys
/// ([`RedisMayEvict`]), the HTTP address cannot be bound, or a queue worker
/// fails.
pub async fn run(config: WorkerConfig) -> Result<()> {
    WorkerBuilder::new(config.group).run(config).await
}

/// The binaries' shutdown signal: SIGTERM or Ctrl-C, whichever comes
/// first, named for the log. Only [`WorkerBuilder::run`] and
/// [`WorkerBuilder::main`] install it; [`WorkerBuilder::run_until`] leaves
/// signals to the application.
pub(crate) async fn shutdown_signal() -> &'static str {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => "Ctrl-C",
        () = terminate => "SIGTERM",
    }
}
