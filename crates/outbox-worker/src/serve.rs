//! The worker's composition root: connect, build the services, register
//! them with a [`Supervisor`] in the order they start, run them until the
//! shutdown future resolves. Each service's wiring is a function of its
//! own below; what decides (which queues to measure, whether the pool is
//! large enough) is in plain functions apart from what starts things.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use anyhow::{Context, Result};
use outbox_dispatch::{Dispatcher, RedisGuardSettings, run_retention};
use outbox_pg::PgPool;
use outbox_queue::RedisConnection;
use outbox_queue::{QueueNamespace, RedisSettings, redact_url};
use outbox_subscriber::{HandlerGroup, SubscriberError};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::schedule::runner::{Clock, SystemClock, run_schedules};
use crate::supervisor::{Backoff, OnFailure, Run, Stopped, Supervisor};
use crate::{
    GaugeSettings, Group, WorkerBuilder, WorkerConfig, enforce_eviction_policy, pool_demand,
    read_eviction_policy, read_persistence, refresh_gauges, registration, report_persistence, trim,
};

/// How every service but the queue workers is supervised: restarted after
/// a failure, 1 s to 30 s apart.
pub(crate) const RESTART: OnFailure = OnFailure::Restart(Backoff::STANDARD);

/// The connections every service shares, made at start.
#[derive(Clone)]
pub(crate) struct Connections {
    pub pool: PgPool,
    pub redis: RedisConnection,
    pub namespace: QueueNamespace,
}

/// Runs the worker `builder` describes (its routes already in
/// `config.router`) until `shutdown` resolves; its answer (`SIGTERM`, ...)
/// goes to the log.
pub(crate) async fn serve(
    mut builder: WorkerBuilder,
    config: WorkerConfig,
    shutdown: impl Future<Output = &'static str>,
) -> Result<()> {
    let metrics = crate::recorder::for_run(builder.binary())?;
    let connections = connect(&config).await?;
    let _running = builder
        .readiness()
        .running(connections.pool.clone(), connections.redis.clone());
    let group = builder.assemble(
        &config,
        &connections.pool,
        &connections.redis,
        &connections.namespace,
    )?;
    let registration = builder.registration(&config, &group)?;
    registration::record(&connections.pool, &config.queue_prefix, &registration).await;
    let queues = measured_queues(&builder, &config, &group);
    let listener = if builder.binds_http_listener() {
        Some(bind(&config).await?)
    } else {
        None
    };
    let console_listener = match &config.console {
        Some(console) => Some(bind_console(console).await?),
        None => None,
    };
    log_started(&config, &group, listener.as_ref());
    warn_pool_shortfall(&config, &group);

    let mut services = Supervisor::new(config.shutdown_grace);
    if let Some(listener) = listener {
        let routes = crate::http::routes(builder.readiness().clone(), metrics.clone());
        services = services.service("http", RESTART, http(listener, routes)?);
    }
    if let Some(handle) = metrics {
        services = services.service("metrics upkeep", RESTART, crate::recorder::upkeep(handle));
    }
    if let (Some(listener), Some(settings)) = (console_listener, &config.console) {
        let console = outbox_console::Console::new(connections.pool.clone())
            .with_tokens(settings.tokens.clone())
            .with_queues(
                connections.redis.clone(),
                connections.namespace.clone(),
                queues.clone(),
            );
        // Each run's token also ends the live streams, or its graceful
        // shutdown would wait for every open overview.
        let app =
            move |token: &CancellationToken| console.clone().with_shutdown(token.clone()).router();
        services = services.service("console", RESTART, http_with(listener, app)?);
    }
    if config.group == Group::General {
        services = general_services(services, &builder, &config, &connections, &queues)?;
    }
    if !config.schedules.is_empty() {
        let (pool, schedules) = (connections.pool.clone(), config.schedules.clone());
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        services = services.service("schedules", RESTART, move |token| {
            endless(run_schedules(
                pool.clone(),
                schedules.clone(),
                clock.clone(),
                token,
            ))
        });
    }
    let stopped = services
        .service(
            "gauges",
            RESTART,
            gauges(&builder, &config, &connections, queues),
        )
        .service(
            "queue workers",
            OnFailure::StopAll,
            queue_workers(group, &config, &connections)?,
        )
        .run_until(shutdown)
        .await?;
    log_stopped(&stopped);
    Ok(())
}

/// The services only the general group runs: the dispatcher (when
/// enabled), retention, the workflow sweep (when the worker runs the
/// workflow subscriber) and the trim of finished jobs.
fn general_services(
    services: Supervisor,
    builder: &WorkerBuilder,
    config: &WorkerConfig,
    connections: &Connections,
    queues: &[String],
) -> Result<Supervisor> {
    let (services, draining) = if config.dispatcher_enabled {
        let dispatcher = dispatcher(builder, config, connections)?;
        let draining = dispatcher.draining();
        let services = services.service("dispatcher", RESTART, move |token| {
            let dispatcher = dispatcher.clone();
            async move {
                dispatcher.run(token).await.inspect_err(|e| {
                    tracing::error!(error = %e, "dispatcher stopped");
                })
            }
        });
        (services, Some(draining))
    } else {
        tracing::info!("dispatcher disabled (OUTBOX_DISPATCHER_ENABLED=false)");
        (services, None)
    };
    let (pool, retention, every) = (
        connections.pool.clone(),
        config.retention,
        config.retention_every,
    );
    // Retention slows down while this process's dispatcher drains a backlog.
    let services = services.service("retention", RESTART, move |token| {
        endless(run_retention(
            pool.clone(),
            retention,
            every,
            draining.clone(),
            token,
        ))
    });
    #[cfg(feature = "workflow")]
    let services = if builder.runs_workflows() {
        let (pool, lease, every) = (
            connections.pool.clone(),
            config.workflow_lease,
            config.workflow_sweep_interval,
        );
        services.service("workflow sweep", RESTART, move |token| {
            endless(outbox_subscriber_workflow::sweep(
                pool.clone(),
                lease,
                every,
                token,
            ))
        })
    } else {
        services
    };
    let (connections, queues, config) = (connections.clone(), queues.to_vec(), config.clone());
    Ok(services.service("queue trim", RESTART, move |token| {
        endless(trim::trim_queues(
            connections.redis.clone(),
            connections.namespace.clone(),
            queues.clone(),
            config.clone(),
            token,
        ))
    }))
}

/// Postgres, Redis (refused when it may evict keys, unless allowed) and the
/// queues' namespace.
async fn connect(config: &WorkerConfig) -> Result<Connections> {
    let pool = connect_postgres(&config.database_url, config.pool_size).await?;
    if config.group == Group::General {
        refuse_unknown_partitioning(&pool).await?;
    }
    let redis = outbox_queue::connect(&RedisSettings {
        ca_cert: config.redis_ca_cert.clone(),
        ..RedisSettings::new(&config.redis_url)
    })
    .context("invalid REDIS_URL or REDIS_CA_CERT")?;
    enforce_eviction_policy(
        &read_eviction_policy(&redis).await,
        config.allow_redis_eviction,
    )?;
    report_persistence(&read_persistence(&redis).await);
    Ok(Connections {
        pool,
        redis,
        namespace: QueueNamespace::for_redis(config.queue_prefix.clone(), &config.redis_url),
    })
}

/// `outbox_event` partitioned by other means than `outbox partition
/// convert` (by hand, by an extension): its dispatch keys are not kept
/// unique across its partitions and retention does not know them, so
/// `worker-general` (the dispatcher and retention) does not start on it
/// (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error(
    "outbox_event is partitioned, but not by `outbox partition convert` (outbox_partitioning is empty): \
     dispatch keys would not be unique across its partitions and retention could not clean it; \
     keep it one table, or convert one table with `outbox partition convert` (docs/operations/retention.md, \"A partitioned outbox table\")"
)]
pub struct UnknownPartitioning;

/// Refuses to go on when `outbox_event` is [`UnknownPartitioning`]; a
/// database that cannot answer the question (core migrations missing) is
/// left to the checks that follow.
async fn refuse_unknown_partitioning(pool: &PgPool) -> Result<()> {
    let Ok(mut conn) = pool.get().await else {
        return Ok(());
    };
    match outbox_store::partitioned_by_other_means(&mut conn).await {
        Ok(true) => Err(UnknownPartitioning.into()),
        Ok(false) => Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell how outbox_event is partitioned; starting anyway");
            Ok(())
        }
    }
}

/// The Postgres pool of `DATABASE_URL` (the workers' and the bridge's).
pub(crate) async fn connect_postgres(database_url: &str, size: u32) -> Result<PgPool> {
    outbox_pg::connect_pool(database_url, size)
        .await
        .with_context(|| {
            format!(
                "cannot connect to Postgres at {} (DATABASE_URL)",
                redact_url(database_url)
            )
        })
}

/// Every queue this worker measures (and, in the general group, trims):
/// the general group all routed and downstream queues, the mail group its
/// own; both also every queue their handlers consume.
fn measured_queues(
    builder: &WorkerBuilder,
    config: &WorkerConfig,
    group: &HandlerGroup,
) -> Vec<String> {
    let mut queues: Vec<String> = group.queues().into_iter().map(str::to_owned).collect();
    if config.group == Group::General {
        queues.extend(config.router.queues().into_iter().map(str::to_owned));
        queues.extend(
            builder
                .catalog()
                .downstream_queues()
                .into_iter()
                .map(str::to_owned),
        );
    }
    queues.sort_unstable();
    queues.dedup();
    queues
}

/// `WORKER_HTTP_ADDR`, bound at start so that a taken address stops it.
async fn bind(config: &WorkerConfig) -> Result<TcpListener> {
    TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot bind WORKER_HTTP_ADDR={}", config.http_addr))
}

/// `OUTBOX_CONSOLE_ADDR`, bound at start so that a taken address stops it.
async fn bind_console(console: &crate::ConsoleConfig) -> Result<TcpListener> {
    let listener = TcpListener::bind(console.addr)
        .await
        .with_context(|| format!("cannot bind OUTBOX_CONSOLE_ADDR={}", console.addr))?;
    tracing::info!(addr = %listener.local_addr()?, tokens = ?console.tokens, "console served");
    if !console.addr.ip().is_loopback() {
        tracing::warn!(
            addr = %console.addr,
            "the console listens beyond loopback: put a TLS proxy in front of it (tokens and session cookies cross the network)"
        );
    }
    Ok(listener)
}

/// `app` served on `listener` until its token is cancelled (requests in
/// progress finish); a restart binds the same address again.
pub(crate) fn http(
    listener: TcpListener,
    app: axum::Router,
) -> Result<impl FnMut(CancellationToken) -> Run<std::io::Error> + Send + 'static> {
    http_with(listener, move |_: &CancellationToken| app.clone())
}

/// As [`http`], with the app of each run made by `app` from that run's token.
pub(crate) fn http_with(
    listener: TcpListener,
    app: impl Fn(&CancellationToken) -> axum::Router + Send + 'static,
) -> Result<impl FnMut(CancellationToken) -> Run<std::io::Error> + Send + 'static> {
    let addr = listener.local_addr()?;
    let mut listener = Some(listener);
    Ok(move |token: CancellationToken| {
        let (listener, app) = (listener.take(), app(&token));
        let run: Run<std::io::Error> = Box::pin(async move {
            let listener = match listener {
                Some(listener) => listener,
                None => TcpListener::bind(addr).await?,
            };
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { token.cancelled().await })
                .await
        });
        run
    })
}

/// The dispatcher with its Redis guard, after the warnings its settings
/// call for.
fn dispatcher(
    builder: &WorkerBuilder,
    config: &WorkerConfig,
    connections: &Connections,
) -> Result<Arc<Dispatcher>> {
    if config.dispatcher.loops >= config.pool_size as usize {
        tracing::warn!(
            loops = config.dispatcher.loops,
            pool_size = config.pool_size,
            "OUTBOX_DISPATCH_LOOPS is not below DATABASE_POOL_SIZE: under a backlog the \
             dispatch loops can hold every pooled connection while this process's \
             handlers wait for one"
        );
    }
    let dispatcher = Dispatcher::new(
        connections.pool.clone(),
        config.database_url.clone(),
        connections.redis.clone(),
        connections.namespace.clone(),
        config.router.clone(),
        config.dispatcher.clone(),
    )?
    .with_redis_guard(
        RedisGuardSettings {
            check_every: config.redis_check_interval,
            retention: config.queue_done_retention,
            ..RedisGuardSettings::default()
        },
        builder.catalog().receivers(),
    );
    // The general group's gauge task sets `outbox_pending_due` from the
    // figures the processes share: the dispatcher does not count for it.
    let dispatcher = if config.group == Group::General {
        dispatcher.without_pending_gauge()
    } else {
        dispatcher
    };
    for feed in builder.catalog().unreconciled_feeds() {
        tracing::warn!(
            queue = feed.queue,
            derived_from = ?feed.derived_from,
            "after a Redis loss, a job of this queue lost after its parent finished is not \
             noticed: reconciliation pushes lost parents again but cannot find these jobs"
        );
    }
    Ok(Arc::new(dispatcher))
}

/// The Prometheus gauges of `queues` (and, in the general group, of the
/// outbox table).
fn gauges(
    builder: &WorkerBuilder,
    config: &WorkerConfig,
    connections: &Connections,
    queues: Vec<String>,
) -> impl FnMut(CancellationToken) -> Run<Infallible> + Send + 'static {
    let settings = GaugeSettings {
        queues,
        outbox_table: config.group == Group::General,
        workflow_executions: builder.runs_workflows(),
        every: config.gauge_interval,
        stall_after: config.worker.heartbeat * 4,
    };
    let connections = connections.clone();
    move |token| {
        Box::pin(endless(refresh_gauges(
            connections.pool.clone(),
            connections.redis.clone(),
            connections.namespace.clone(),
            settings.clone(),
            token,
        )))
    }
}

/// The queue workers of `group` (each queue restarted by the group
/// itself), woken by Redis messages unless `OUTBOX_WAKEUPS=false`.
fn queue_workers(
    group: HandlerGroup,
    config: &WorkerConfig,
    connections: &Connections,
) -> Result<impl FnMut(CancellationToken) -> Run<SubscriberError> + Send + 'static> {
    let wake = if config.wakeups {
        Some(
            outbox_queue::pubsub_clients(&config.redis_url, config.redis_ca_cert.as_deref())
                .context("invalid REDIS_URL or REDIS_CA_CERT")?,
        )
    } else {
        None
    };
    let (group, connections, settings) =
        (Arc::new(group), connections.clone(), config.worker.clone());
    Ok(move |token| {
        let (group, connections, settings, wake) = (
            group.clone(),
            connections.clone(),
            settings.clone(),
            wake.clone(),
        );
        let run: Run<SubscriberError> = Box::pin(async move {
            group
                .run_with_wakeups(
                    connections.redis,
                    wake,
                    &connections.namespace,
                    &settings,
                    token,
                )
                .await
        });
        run
    })
}

/// A service that only ends when told to.
async fn endless(run: impl Future<Output = ()>) -> Result<(), Infallible> {
    run.await;
    Ok(())
}

/// The line operators look for once the worker is up; `listener` is the
/// worker's own HTTP listener, if it has one.
fn log_started(config: &WorkerConfig, group: &HandlerGroup, listener: Option<&TcpListener>) {
    let http = match listener.map(TcpListener::local_addr) {
        Some(Ok(addr)) => addr.to_string(),
        Some(Err(_)) => config.http_addr.to_string(),
        None => "served by the application".to_owned(),
    };
    #[cfg(feature = "workflow")]
    let workflow_executor = config.workflow_executor.to_string();
    #[cfg(not(feature = "workflow"))]
    let workflow_executor = String::new();
    #[cfg(feature = "mail")]
    let smtp = config
        .smtp_url
        .as_deref()
        .map(redact_url)
        .unwrap_or_default();
    #[cfg(not(feature = "mail"))]
    let smtp = String::new();
    tracing::info!(
        group = config.group.as_str(),
        http = %http,
        queues = ?group.queues(),
        queue_prefix = %config.queue_prefix,
        dispatcher = config.group == Group::General && config.dispatcher_enabled,
        database = %redact_url(&config.database_url),
        workflow_executor = %workflow_executor,
        redis = %redact_url(&config.redis_url),
        smtp = %smtp,
        "worker started"
    );
}

/// Warns when the queue workers and dispatch loops may want more Postgres
/// connections than `DATABASE_POOL_SIZE` gives.
fn warn_pool_shortfall(config: &WorkerConfig, group: &HandlerGroup) {
    let dispatch_loops = if config.group == Group::General && config.dispatcher_enabled {
        config.dispatcher.loops
    } else {
        0
    };
    if let Some(shortfall) = pool_demand::pool_shortfall(
        config.group.as_str(),
        config.worker.concurrency,
        &group.queues(),
        config.pool_size,
        dispatch_loops,
    ) {
        tracing::warn!(
            worker_concurrency = shortfall.concurrency,
            connection_jobs = shortfall.jobs(),
            pool_size = shortfall.pool_size,
            "{shortfall}"
        );
    }
}

/// The last line: a clean stop, or work left for redelivery.
fn log_stopped(stopped: &Stopped) {
    if stopped.overran.is_empty() {
        tracing::info!("worker stopped cleanly");
    } else {
        tracing::warn!(
            services = ?stopped.overran,
            "grace period over; exiting with work unfinished (it will be redelivered)"
        );
    }
}
