//! The worker's configuration, read once from the environment: the
//! composition of the libraries' settings (each read through the variables
//! its library defines beside it) and the worker's own variables, defined
//! here beside [`WorkerConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use outbox_dispatch::{DispatcherConfig, RetentionConfig, Router};
use outbox_env::{Flag, MAX_MILLIS, Text, Whole, millis};
use outbox_http_guard::AddressPolicy;
use outbox_queue::{QueueNamespace, redact_url};
use outbox_subscriber::WorkerSettings;
#[cfg(feature = "mail")]
use outbox_subscriber_mail::SmtpSettings;
#[cfg(feature = "workflow")]
use outbox_workflow_bridge::BridgeSecret;
#[cfg(feature = "workflow")]
use outbox_workflow_bridge::executor::{ExecutorMode, WORKFLOW_BRIDGE_URL};
#[cfg(feature = "workflow")]
use outbox_workflow_store::sweep::{WORKFLOW_RUN_LEASE_MS, WORKFLOW_SWEEP_INTERVAL_MS};

#[cfg(feature = "workflow")]
mod bridge;
mod console;

#[cfg(feature = "workflow")]
pub use bridge::BridgeConfig;
pub use console::{
    ConsoleConfig, DEFAULT_CONSOLE_ADDR, OUTBOX_CONSOLE_ADDR, OUTBOX_CONSOLE_TOKENS,
};
#[cfg(feature = "workflow")]
pub use outbox_workflow_bridge::DEFAULT_BRIDGE_ADDR;

/// A variable that stops start-up; the message names it. The libraries'
/// readers return it too, and a handler added to a worker may refuse its
/// own variable with it.
pub use outbox_env::VariableError as ConfigError;

/// The two deployable groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Dispatcher, retention, outbox.workflow/audit/notification/plugin-hook, toolctrl.plugin-invoke.
    General,
    /// outbox.mail/webhook/marketing, toolctrl.email.
    Mail,
}

impl Group {
    /// The default of `WORKER_HTTP_ADDR`: every interface, so that a
    /// Prometheus outside the container can scrape `/metrics` (it serves no
    /// secrets); a fixed port per binary, so that both run side by side on
    /// one host (9464 is the port commonly used for Prometheus exporters).
    #[must_use]
    pub const fn default_http_addr(self) -> &'static str {
        match self {
            Self::General => "0.0.0.0:9464",
            Self::Mail => "0.0.0.0:9465",
        }
    }

    /// The name used in `WORKER_QUEUE_GROUP`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::General => "general",
            Self::Mail => "mail",
        }
    }
}

/// Everything a worker process needs. Its `Debug` output shows the URLs
/// without their passwords.
#[derive(Clone)]
pub struct WorkerConfig {
    /// Which group this process runs.
    pub group: Group,
    /// `DATABASE_URL`.
    pub database_url: String,
    /// `REDIS_URL`.
    pub redis_url: String,
    /// `REDIS_CA_CERT`: the CA file for a `rediss://` URL (`None`: the
    /// system's roots).
    pub redis_ca_cert: Option<PathBuf>,
    /// `WORKER_HTTP_ADDR`.
    pub http_addr: SocketAddr,
    /// The operator console (`OUTBOX_CONSOLE_TOKENS`, `OUTBOX_CONSOLE_ADDR`;
    /// general group only): `None`, the default, serves none.
    pub console: Option<ConsoleConfig>,
    /// `OUTBOX_QUEUE_PREFIX`: a key prefix for every queue (empty in production).
    pub queue_prefix: String,
    /// The routing table: the standard one plus the rules of
    /// `OUTBOX_ROUTES_FILE`, when set.
    pub router: Router,
    /// The periodic events of `OUTBOX_ROUTES_FILE`'s `[[schedule]]`
    /// tables; a run adds those of [`crate::WorkerBuilder::schedule`].
    pub schedules: Vec<crate::Schedule>,
    /// `OUTBOX_DISPATCHER_ENABLED` (general group only).
    pub dispatcher_enabled: bool,
    /// The dispatcher's settings.
    pub dispatcher: DispatcherConfig,
    /// `OUTBOX_WAKEUPS`: the dispatcher wakes on `NOTIFY outbox_event` and
    /// the queue workers on Redis wake-up messages (on by default); off, both
    /// only poll (`OUTBOX_DISPATCH_INTERVAL_MS`, `WORKER_POLL_INTERVAL_MS`).
    /// [`DispatcherConfig::listen`] follows it.
    pub wakeups: bool,
    /// Retention of DONE rows.
    pub retention: RetentionConfig,
    /// `OUTBOX_DONE_RETENTION_INTERVAL_MS`: how often retention runs (daily).
    pub retention_every: Duration,
    /// Per-queue worker settings.
    pub worker: WorkerSettings,
    /// `DATABASE_POOL_SIZE`.
    pub pool_size: u32,
    /// `SMTP_URL` (mail group; feature `mail`).
    #[cfg(feature = "mail")]
    pub smtp_url: Option<String>,
    /// `MAIL_FROM`: the default sender (feature `mail`).
    #[cfg(feature = "mail")]
    pub mail_from: String,
    /// `WEBHOOK_TIMEOUT_MS` (features `webhook`, `plugin`, `mail`).
    #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
    pub webhook_timeout: Duration,
    /// Which internal addresses webhook and plugin deliveries and workflow
    /// `httpRequest` blocks may reach: every one with
    /// `WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true`, else those
    /// `OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS` lists, else none.
    pub address_policy: AddressPolicy,
    /// `WORKER_SHUTDOWN_GRACE_MS`: how long in-flight work may take after SIGTERM.
    pub shutdown_grace: Duration,
    /// `DELIVERY_LEASE_MS`: how long a delivery (webhook, plugin, mail) in
    /// progress holds its idempotency key; a crashed worker's delivery is
    /// retried after it. Keep it above the HTTP and SMTP timeouts
    /// (features `webhook`, `plugin`, `mail`).
    #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
    pub delivery_lease: Duration,
    /// `QUEUE_DONE_RETENTION_HOURS`: finished jobs are removed from Redis
    /// after this (general group, with the daily retention run).
    pub queue_done_retention: Duration,
    /// How long receivers remember a completed delivery (a sent mail, a
    /// delivered webhook or plugin call), `DELIVERY_RECORD_TTL_HOURS`
    /// ([`DEFAULT_DELIVERY_RECORD_TTL_HOURS`]). At least
    /// `QUEUE_DONE_RETENTION_HOURS`: a job pushed again after its first copy
    /// was trimmed is still recognised by the receivers.
    pub delivery_record_ttl: Duration,
    /// `QUEUE_DEAD_RETENTION_HOURS`: dead jobs are removed from Redis after this.
    pub queue_dead_retention: Duration,
    /// `WORKER_GAUGE_INTERVAL_MS`: how often the Prometheus gauges of the
    /// outbox and the queues are refreshed.
    pub gauge_interval: Duration,
    /// `OUTBOX_REDIS_CHECK_INTERVAL_MS`: how often the dispatcher's Redis
    /// guard checks its marker while all is well (10 s; every second while
    /// Redis does not answer, and after every failed hand-off).
    pub redis_check_interval: Duration,
    /// `OUTBOX_ALLOW_REDIS_EVICTION`: start (with a warning) even though
    /// Redis' `maxmemory-policy` is not `noeviction`, i.e. Redis may drop
    /// queued jobs and idempotency keys. Off by default: such a Redis stops
    /// start-up with exit code 2.
    pub allow_redis_eviction: bool,
    /// `WORKFLOW_EXECUTOR`: where workflow executions run (`native` by
    /// default; feature `workflow`).
    #[cfg(feature = "workflow")]
    pub workflow_executor: ExecutorMode,
    /// `WORKFLOW_BRIDGE_URL` and `WORKFLOW_BRIDGE_SECRET`: required for the
    /// `hybrid` and `http` executors (feature `workflow`).
    #[cfg(feature = "workflow")]
    pub workflow_bridge: Option<BridgeSettings>,
    /// `WORKFLOW_RUN_LEASE_MS`: how long a workflow run stays held after
    /// its holder's last write ([`outbox_workflow_runner::DEFAULT_LEASE`]),
    /// so how soon a run whose worker died can be resumed (feature
    /// `workflow`).
    #[cfg(feature = "workflow")]
    pub workflow_lease: Duration,
    /// `WORKFLOW_SWEEP_INTERVAL_MS`: how often the general group looks for
    /// runs left `running` with an expired lease and requests their resume
    /// ([`outbox_workflow_store::sweep::DEFAULT_SWEEP_INTERVAL`]; feature
    /// `workflow`).
    #[cfg(feature = "workflow")]
    pub workflow_sweep_interval: Duration,
}

/// Where the signed workflow bridge is, and the key to sign with.
#[cfg(feature = "workflow")]
#[derive(Clone)]
pub struct BridgeSettings {
    /// `WORKFLOW_BRIDGE_URL`: the bridge's base URL.
    pub url: String,
    /// `WORKFLOW_BRIDGE_SECRET`.
    pub secret: BridgeSecret,
}

#[cfg(feature = "workflow")]
impl std::fmt::Debug for BridgeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeSettings")
            .field("url", &redact_url(&self.url))
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured so that a new field cannot be forgotten here.
        let Self {
            group,
            database_url,
            redis_url,
            redis_ca_cert,
            http_addr,
            console,
            queue_prefix,
            router,
            schedules,
            dispatcher_enabled,
            dispatcher,
            wakeups,
            retention,
            retention_every,
            worker,
            pool_size,
            #[cfg(feature = "mail")]
            smtp_url,
            #[cfg(feature = "mail")]
            mail_from,
            #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
            webhook_timeout,
            address_policy,
            shutdown_grace,
            #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
            delivery_lease,
            queue_done_retention,
            delivery_record_ttl,
            queue_dead_retention,
            gauge_interval,
            redis_check_interval,
            allow_redis_eviction,
            #[cfg(feature = "workflow")]
            workflow_executor,
            #[cfg(feature = "workflow")]
            workflow_bridge,
            #[cfg(feature = "workflow")]
            workflow_lease,
            #[cfg(feature = "workflow")]
            workflow_sweep_interval,
        } = self;
        let mut f = f.debug_struct("WorkerConfig");
        f.field("group", group);
        f.field("database_url", &redact_url(database_url));
        f.field("redis_url", &redact_url(redis_url));
        f.field("redis_ca_cert", redis_ca_cert);
        f.field("http_addr", http_addr);
        f.field("console", console);
        f.field("queue_prefix", queue_prefix);
        f.field("router", &router.rules());
        f.field("schedules", schedules);
        f.field("dispatcher_enabled", dispatcher_enabled);
        f.field("dispatcher", dispatcher);
        f.field("wakeups", wakeups);
        f.field("retention", retention);
        f.field("retention_every", retention_every);
        f.field("worker", worker);
        f.field("pool_size", pool_size);
        #[cfg(feature = "mail")]
        f.field("smtp_url", &smtp_url.as_deref().map(redact_url));
        #[cfg(feature = "mail")]
        f.field("mail_from", mail_from);
        #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
        f.field("webhook_timeout", webhook_timeout);
        f.field("address_policy", address_policy);
        f.field("shutdown_grace", shutdown_grace);
        #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
        f.field("delivery_lease", delivery_lease);
        f.field("queue_done_retention", queue_done_retention);
        f.field("delivery_record_ttl", delivery_record_ttl);
        f.field("queue_dead_retention", queue_dead_retention);
        f.field("gauge_interval", gauge_interval);
        f.field("redis_check_interval", redis_check_interval);
        f.field("allow_redis_eviction", allow_redis_eviction);
        #[cfg(feature = "workflow")]
        f.field("workflow_executor", workflow_executor);
        #[cfg(feature = "workflow")]
        f.field("workflow_bridge", workflow_bridge);
        #[cfg(feature = "workflow")]
        f.field("workflow_lease", workflow_lease);
        #[cfg(feature = "workflow")]
        f.field("workflow_sweep_interval", workflow_sweep_interval);
        f.finish()
    }
}

impl WorkerConfig {
    /// Reads the process environment for the binary of `group`.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`]: nothing starts half-configured.
    pub fn from_env(group: Group) -> Result<Self, ConfigError> {
        Self::from_lookup(group, &|name| std::env::var(name).ok())
    }

    /// Reads variables through `get`; see [`WorkerConfig::from_env`].
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`].
    pub fn from_lookup(
        binary_group: Group,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let group = group(get, binary_group)?;
        let http_addr = http_addr(get, group)?;
        let console = match group {
            Group::General => ConsoleConfig::from_lookup(get)?,
            Group::Mail => None,
        };
        let wakeups = OUTBOX_WAKEUPS.read(get)?;
        let dispatcher = DispatcherConfig {
            listen: wakeups,
            ..DispatcherConfig::from_lookup(get)?
        };
        let retention = RetentionConfig::from_lookup(get)?;
        let (worker, shutdown_grace) = worker_settings(get)?;
        #[cfg(feature = "mail")]
        let smtp_url = SmtpSettings::url_from_lookup(get)?;
        #[cfg(feature = "mail")]
        if group == Group::Mail && smtp_url.is_none() {
            outbox_subscriber_mail::SMTP_URL.required(get)?;
        }
        #[cfg(feature = "mail")]
        let mail_from = SmtpSettings::default_from_lookup(get)?;
        let database_url = database_url(get)?;
        let (queue_done_retention, delivery_record_ttl) = dedupe_window(get, &dispatcher)?;
        let (redis_url, redis_ca_cert) = outbox_queue::redis_from_lookup(get)?;
        #[cfg(feature = "workflow")]
        let workflow_executor = ExecutorMode::from_lookup(get)?;
        #[cfg(feature = "workflow")]
        let workflow_bridge = workflow_bridge(get, workflow_executor)?;
        let (router, schedules) = routes_file(get)?;
        Ok(Self {
            #[cfg(feature = "workflow")]
            workflow_bridge,
            #[cfg(feature = "workflow")]
            workflow_executor,
            #[cfg(feature = "workflow")]
            workflow_lease: WORKFLOW_RUN_LEASE_MS.read_millis(get)?,
            #[cfg(feature = "workflow")]
            workflow_sweep_interval: WORKFLOW_SWEEP_INTERVAL_MS.read_millis(get)?,
            group,
            database_url,
            redis_url,
            redis_ca_cert,
            http_addr,
            console,
            queue_prefix: QueueNamespace::from_lookup(get)?.prefix().to_owned(),
            router,
            schedules,
            dispatcher_enabled: OUTBOX_DISPATCHER_ENABLED.read(get)?,
            dispatcher,
            wakeups,
            retention,
            retention_every: OUTBOX_DONE_RETENTION_INTERVAL_MS.read_millis(get)?,
            worker,
            pool_size: outbox_pg::DATABASE_POOL_SIZE.read_as(get)?,
            #[cfg(feature = "mail")]
            smtp_url,
            #[cfg(feature = "mail")]
            mail_from,
            #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
            webhook_timeout: outbox_subscriber_webhook::WEBHOOK_TIMEOUT_MS.read_millis(get)?,
            address_policy: AddressPolicy::from_lookup(get)?,
            shutdown_grace,
            #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
            delivery_lease: outbox_subscriber_webhook::DELIVERY_LEASE_MS.read_millis(get)?,
            gauge_interval: WORKER_GAUGE_INTERVAL_MS.read_millis(get)?,
            redis_check_interval: outbox_dispatch::OUTBOX_REDIS_CHECK_INTERVAL_MS
                .read_millis(get)?,
            allow_redis_eviction: OUTBOX_ALLOW_REDIS_EVICTION.read(get)?,
            queue_done_retention,
            delivery_record_ttl,
            queue_dead_retention: QUEUE_DEAD_RETENTION_HOURS.read_hours(get)?,
        })
    }
}

/// `WORKER_QUEUE_GROUP`: [`WorkerConfig::group`], which must be the
/// binary's.
pub const WORKER_QUEUE_GROUP: Text = Text {
    name: "WORKER_QUEUE_GROUP",
    default: "the binary's own group",
    form: "general, mail (must match the binary)",
    meaning: "the handler group this process runs",
};
/// `WORKER_HTTP_ADDR`: [`WorkerConfig::http_addr`], with the default of
/// `worker-general` ([`Group::default_http_addr`] gives each binary's).
pub const WORKER_HTTP_ADDR: Text = Text {
    name: "WORKER_HTTP_ADDR",
    default: Group::General.default_http_addr(),
    form: "host:port",
    meaning: "where /healthz, /readyz and /metrics are served (every interface by default, so a scraper outside the container reaches it); unused by a worker embedded with WorkerBuilder::without_http_listener",
};
/// `OUTBOX_DISPATCHER_ENABLED`: [`WorkerConfig::dispatcher_enabled`].
pub const OUTBOX_DISPATCHER_ENABLED: Flag = Flag {
    name: "OUTBOX_DISPATCHER_ENABLED",
    default: false,
    meaning: "worker-general: run the dispatcher (outbox rows to Redis queues)",
};
/// `OUTBOX_WAKEUPS`: [`WorkerConfig::wakeups`].
pub const OUTBOX_WAKEUPS: Flag = Flag {
    name: "OUTBOX_WAKEUPS",
    default: true,
    meaning: "wake the dispatcher on LISTEN/NOTIFY and the queue workers on Redis wake-ups; false polls only (for comparisons)",
};
/// `OUTBOX_DONE_RETENTION_INTERVAL_MS`: [`WorkerConfig::retention_every`].
pub const OUTBOX_DONE_RETENTION_INTERVAL_MS: Whole = Whole {
    name: "OUTBOX_DONE_RETENTION_INTERVAL_MS",
    default: millis(DEFAULT_RETENTION_EVERY),
    min: 1000,
    max: MAX_MILLIS,
    meaning: "how often retention runs (Postgres rows and Redis jobs), in ms",
};
/// `WORKER_SHUTDOWN_GRACE_MS`: [`WorkerConfig::shutdown_grace`].
pub const WORKER_SHUTDOWN_GRACE_MS: Whole = Whole {
    name: "WORKER_SHUTDOWN_GRACE_MS",
    default: millis(DEFAULT_SHUTDOWN_GRACE),
    min: 0,
    max: MAX_MILLIS,
    meaning: "time to finish jobs in hand after SIGTERM, in ms; below 4 heartbeats",
};
/// `WORKER_GAUGE_INTERVAL_MS`: [`WorkerConfig::gauge_interval`].
pub const WORKER_GAUGE_INTERVAL_MS: Whole = Whole {
    name: "WORKER_GAUGE_INTERVAL_MS",
    default: millis(DEFAULT_GAUGE_INTERVAL),
    min: 100,
    max: MAX_MILLIS,
    meaning: "refresh of the queue and outbox gauges, in ms",
};
/// `OUTBOX_ALLOW_REDIS_EVICTION` ([`crate::ALLOW_EVICTION_VARIABLE`]):
/// [`WorkerConfig::allow_redis_eviction`].
pub const OUTBOX_ALLOW_REDIS_EVICTION: Flag = Flag {
    name: crate::ALLOW_EVICTION_VARIABLE,
    default: false,
    meaning: "start (with a warning) although Redis' maxmemory-policy is not noeviction",
};
/// `DELIVERY_RECORD_TTL_HOURS`: [`WorkerConfig::delivery_record_ttl`].
pub const DELIVERY_RECORD_TTL_HOURS: Whole = Whole {
    name: "DELIVERY_RECORD_TTL_HOURS",
    default: DEFAULT_DELIVERY_RECORD_TTL_HOURS,
    min: 1,
    max: 1_000_000,
    meaning: "how long receivers remember a completed delivery, in hours; at least QUEUE_DONE_RETENTION_HOURS",
};
/// `QUEUE_DEAD_RETENTION_HOURS`: [`WorkerConfig::queue_dead_retention`].
pub const QUEUE_DEAD_RETENTION_HOURS: Whole = Whole {
    name: "QUEUE_DEAD_RETENTION_HOURS",
    default: DEFAULT_QUEUE_DEAD_RETENTION_HOURS,
    min: 1,
    max: 1_000_000,
    meaning: "dead jobs are removed from Redis after this many hours",
};

/// `WORKER_QUEUE_GROUP`: unset, or the group of the binary.
fn group(get: &dyn Fn(&str) -> Option<String>, binary_group: Group) -> Result<Group, ConfigError> {
    let group = match WORKER_QUEUE_GROUP.read(get) {
        None => binary_group,
        Some(value) => match [Group::General, Group::Mail]
            .into_iter()
            .find(|group| group.as_str() == value.trim())
        {
            Some(group) => group,
            None => return Err(WORKER_QUEUE_GROUP.refuse(value, "must be general or mail")),
        },
    };
    if group != binary_group {
        return Err(WORKER_QUEUE_GROUP.refuse(
            group.as_str(),
            format!("this binary runs the {} group", binary_group.as_str()),
        ));
    }
    Ok(group)
}

/// `WORKER_HTTP_ADDR`, with the default of `group`.
fn http_addr(
    get: &dyn Fn(&str) -> Option<String>,
    group: Group,
) -> Result<SocketAddr, ConfigError> {
    let text = WORKER_HTTP_ADDR
        .read(get)
        .unwrap_or_else(|| group.default_http_addr().to_owned());
    text.trim().parse().map_err(|_| {
        WORKER_HTTP_ADDR.refuse(text.clone(), "must be host:port, like 127.0.0.1:9464")
    })
}

/// The queue workers' settings and `WORKER_SHUTDOWN_GRACE_MS`, which must
/// end before the workers' heartbeats are missed.
fn worker_settings(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<(WorkerSettings, Duration), ConfigError> {
    let worker = WorkerSettings::from_lookup(get)?;
    let shutdown_grace = WORKER_SHUTDOWN_GRACE_MS.read_millis(get)?;
    let orphan_window = worker.heartbeat * worker.missed_heartbeats as u32;
    if shutdown_grace >= orphan_window {
        // A draining worker sends no heartbeats: past this window other
        // replicas would take over its jobs while it still runs them.
        return Err(WORKER_SHUTDOWN_GRACE_MS.refuse(
            shutdown_grace.as_millis().to_string(),
            format!(
                "must be shorter than {} heartbeats (WORKER_HEARTBEAT_MS={}), i.e. below {} ms",
                worker.missed_heartbeats,
                worker.heartbeat.as_millis(),
                orphan_window.as_millis()
            ),
        ));
    }
    Ok((worker, shutdown_grace))
}

/// `DATABASE_URL`, required; a mistake in it (sslmode, sslrootcert and the
/// rest) stops start-up here, not at the first connection.
pub(crate) fn database_url(get: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    let spec = outbox_pg::DATABASE_URL;
    let url = spec.required(get)?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(spec.refuse(
            redact_url(&url),
            "must start with postgres:// or postgresql://",
        ));
    }
    if let Err(e) = outbox_pg::PgConnectOptions::from_url(&url) {
        return Err(spec.refuse(redact_url(&url), e.to_string()));
    }
    Ok(url)
}

/// `OUTBOX_ROUTES_FILE`: the standard routing table plus the file's rules,
/// and the file's schedules, read and validated now (a missing file, bad
/// TOML, a refused rule or schedule stops start-up naming the variable).
fn routes_file(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<(Router, Vec<crate::Schedule>), ConfigError> {
    let spec = outbox_dispatch::OUTBOX_ROUTES_FILE;
    let path = spec.read(get);
    let fail = |problem: String| spec.refuse(path.clone().unwrap_or_default(), problem);
    // The built-in subscribers' routes; a test keeps them valid.
    let standard = outbox_catalog::standard_router()
        .map_err(|e| fail(format!("the built-in routing table is refused: {e}")))?;
    let Some(path) = &path else {
        return Ok((standard, Vec::new()));
    };
    let text =
        std::fs::read_to_string(path.trim()).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let router = standard
        .with_routes_file(&text)
        .map_err(|e| fail(e.to_string()))?;
    let schedules = crate::schedules_from_file(&text).map_err(|e| fail(e.to_string()))?;
    Ok((router, schedules))
}

/// `WORKFLOW_BRIDGE_URL` and `WORKFLOW_BRIDGE_SECRET`: the `hybrid` and
/// `http` executors need both; a secret, when given, must be long enough,
/// and a URL must be http(s), whatever the mode.
#[cfg(feature = "workflow")]
fn workflow_bridge(
    get: &dyn Fn(&str) -> Option<String>,
    mode: ExecutorMode,
) -> Result<Option<BridgeSettings>, ConfigError> {
    let url = WORKFLOW_BRIDGE_URL.read(get);
    if let Some(url) = &url {
        let parsed = url::Url::parse(url.trim());
        if !parsed
            .as_ref()
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
        {
            return Err(WORKFLOW_BRIDGE_URL.refuse(
                redact_url(url),
                "must be an http:// or https:// URL with a host",
            ));
        }
    }
    let secret_spec = outbox_workflow_bridge::WORKFLOW_BRIDGE_SECRET;
    let secret = BridgeSecret::from_lookup(&secret_spec, get)?;
    match (url, secret) {
        (Some(url), Some(secret)) => Ok(Some(BridgeSettings {
            url: url.trim().to_owned(),
            secret,
        })),
        (url, _) if mode.needs_bridge() => {
            let missing = if url.is_none() {
                WORKFLOW_BRIDGE_URL
            } else {
                secret_spec
            };
            Err(missing.refuse("", format!("is required with WORKFLOW_EXECUTOR={mode}")))
        }
        _ => Ok(None),
    }
}

/// Default of `DELIVERY_RECORD_TTL_HOURS`.
pub const DEFAULT_DELIVERY_RECORD_TTL_HOURS: u64 = 48;

/// Default of `QUEUE_DONE_RETENTION_HOURS` (stated once, beside the trim
/// it drives: [`outbox_queue::DEFAULT_DONE_RETENTION_HOURS`]).
pub const DEFAULT_QUEUE_DONE_RETENTION_HOURS: u64 = outbox_queue::DEFAULT_DONE_RETENTION_HOURS;

/// Default of `QUEUE_DEAD_RETENTION_HOURS`: dead jobs stay 30 days for triage.
pub const DEFAULT_QUEUE_DEAD_RETENTION_HOURS: u64 = 720;

/// Default of `OUTBOX_DONE_RETENTION_INTERVAL_MS`: retention runs daily.
pub const DEFAULT_RETENTION_EVERY: Duration = Duration::from_secs(24 * 3600);

/// Default of `WORKER_SHUTDOWN_GRACE_MS`.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Default of `WORKER_GAUGE_INTERVAL_MS`.
pub const DEFAULT_GAUGE_INTERVAL: Duration = Duration::from_secs(15);

/// Reads `QUEUE_DONE_RETENTION_HOURS` and `DELIVERY_RECORD_TTL_HOURS` and
/// checks that deduplication outlives every way an event generation can be
/// pushed again: a finished job must stay in Redis (so a second push of its
/// task id is a no-op) at least as long as the dispatcher may push the same
/// row again (its lease plus its whole retry ladder), and receivers must
/// remember a completed delivery at least as long as the job stays.
fn dedupe_window(
    get: &dyn Fn(&str) -> Option<String>,
    dispatcher: &DispatcherConfig,
) -> Result<(Duration, Duration), ConfigError> {
    let hours = |h: u64| Duration::from_secs(3600 * h);
    let retention_spec = outbox_queue::QUEUE_DONE_RETENTION_HOURS;
    let retention = retention_spec.read(get)?;
    let ttl = DELIVERY_RECORD_TTL_HOURS.read(get)?;
    let repush = dispatcher.repush_window();
    if hours(retention) < repush {
        return Err(retention_spec.refuse(
            retention.to_string(),
            format!(
                "must cover the time in which the dispatcher may push an event again (OUTBOX_LOCK_TIMEOUT_MS={} plus {} retries with backoff, OUTBOX_MAX_RETRIES): at least {} hours; raise it, or lower OUTBOX_LOCK_TIMEOUT_MS / OUTBOX_MAX_RETRIES",
                dispatcher.lock_timeout.as_millis(),
                dispatcher.max_retries,
                repush.as_secs().div_ceil(3600)
            ),
        ));
    }
    if ttl < retention {
        return Err(DELIVERY_RECORD_TTL_HOURS.refuse(
            ttl.to_string(),
            format!(
                "must be at least QUEUE_DONE_RETENTION_HOURS ({retention}): receivers must remember a delivery as long as its job can be pushed again"
            ),
        ));
    }
    Ok((hours(retention), hours(ttl)))
}

#[cfg(test)]
#[cfg(all(feature = "mail", feature = "webhook", feature = "workflow"))]
#[path = "config/tests.rs"]
mod tests;
