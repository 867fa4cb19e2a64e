//! The worker's configuration, read once from the environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use outbox_dispatch::{DispatcherConfig, RetentionConfig, Router};
use outbox_http_guard::{AddressPolicy, AllowList, AllowListError};
use outbox_queue::{QueueError, redact_url};
use outbox_subscriber::WorkerSettings;
use outbox_workflow_bridge::BridgeSecret;
use outbox_workflow_bridge::executor::{ExecutorMode, UnknownExecutor};

use crate::variables::{self as v, Flag, Text, WORKER_HTTP_ADDR_GENERAL, Whole};

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

/// A variable that stops start-up; the message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {variable}={value:?}: {problem}")]
pub struct ConfigError {
    /// The environment variable.
    pub variable: &'static str,
    /// Its value as found (empty when missing); for the URL variables
    /// (`DATABASE_URL`, `REDIS_URL`, `SMTP_URL`) with the password hidden
    /// ([`outbox_queue::redact_url`]).
    pub value: String,
    /// What is wrong.
    pub problem: String,
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
    /// `OUTBOX_QUEUE_PREFIX`: a key prefix for every queue (empty in production).
    pub queue_prefix: String,
    /// The routing table: the standard one plus the rules of
    /// `OUTBOX_ROUTES_FILE`, when set.
    pub router: Router,
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
    /// `SMTP_URL` (mail group).
    pub smtp_url: Option<String>,
    /// `MAIL_FROM`: the default sender.
    pub mail_from: String,
    /// `WEBHOOK_TIMEOUT_MS`.
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
    /// retried after it. Keep it above the HTTP and SMTP timeouts.
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
    /// default).
    pub workflow_executor: ExecutorMode,
    /// `WORKFLOW_BRIDGE_URL` and `WORKFLOW_BRIDGE_SECRET`: required for the
    /// `hybrid` and `http` executors.
    pub workflow_bridge: Option<BridgeSettings>,
    /// `WORKFLOW_RUN_LEASE_MS`: how long a workflow run stays held after
    /// its holder's last write ([`outbox_workflow_runner::DEFAULT_LEASE`]),
    /// so how soon a run whose worker died can be resumed.
    pub workflow_lease: Duration,
    /// `WORKFLOW_SWEEP_INTERVAL_MS`: how often the general group looks for
    /// runs left `running` with an expired lease and requests their resume
    /// ([`outbox_workflow_store::sweep::DEFAULT_SWEEP_INTERVAL`]).
    pub workflow_sweep_interval: Duration,
}

/// Where the signed workflow bridge is, and the key to sign with.
#[derive(Clone)]
pub struct BridgeSettings {
    /// `WORKFLOW_BRIDGE_URL`: the bridge's base URL.
    pub url: String,
    /// `WORKFLOW_BRIDGE_SECRET`.
    pub secret: BridgeSecret,
}

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
            queue_prefix,
            router,
            dispatcher_enabled,
            dispatcher,
            wakeups,
            retention,
            retention_every,
            worker,
            pool_size,
            smtp_url,
            mail_from,
            webhook_timeout,
            address_policy,
            shutdown_grace,
            delivery_lease,
            queue_done_retention,
            delivery_record_ttl,
            queue_dead_retention,
            gauge_interval,
            redis_check_interval,
            allow_redis_eviction,
            workflow_executor,
            workflow_bridge,
            workflow_lease,
            workflow_sweep_interval,
        } = self;
        f.debug_struct("WorkerConfig")
            .field("group", group)
            .field("database_url", &redact_url(database_url))
            .field("redis_url", &redact_url(redis_url))
            .field("redis_ca_cert", redis_ca_cert)
            .field("http_addr", http_addr)
            .field("queue_prefix", queue_prefix)
            .field("router", &router.rules())
            .field("dispatcher_enabled", dispatcher_enabled)
            .field("dispatcher", dispatcher)
            .field("wakeups", wakeups)
            .field("retention", retention)
            .field("retention_every", retention_every)
            .field("worker", worker)
            .field("pool_size", pool_size)
            .field("smtp_url", &smtp_url.as_deref().map(redact_url))
            .field("mail_from", mail_from)
            .field("webhook_timeout", webhook_timeout)
            .field("address_policy", address_policy)
            .field("shutdown_grace", shutdown_grace)
            .field("delivery_lease", delivery_lease)
            .field("queue_done_retention", queue_done_retention)
            .field("delivery_record_ttl", delivery_record_ttl)
            .field("queue_dead_retention", queue_dead_retention)
            .field("gauge_interval", gauge_interval)
            .field("redis_check_interval", redis_check_interval)
            .field("allow_redis_eviction", allow_redis_eviction)
            .field("workflow_executor", workflow_executor)
            .field("workflow_bridge", workflow_bridge)
            .field("workflow_lease", workflow_lease)
            .field("workflow_sweep_interval", workflow_sweep_interval)
            .finish()
    }
}

/// Reads variables through `get` (the process environment in production).
struct Env<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
}

impl Env<'_> {
    fn raw(&self, variable: &'static str) -> Option<String> {
        (self.get)(variable).filter(|v| !v.trim().is_empty())
    }

    fn required(&self, variable: &'static str) -> Result<String, ConfigError> {
        self.raw(variable).ok_or_else(|| ConfigError {
            variable,
            value: String::new(),
            problem: "is required".into(),
        })
    }

    fn number<T: std::str::FromStr + PartialOrd + Copy + std::fmt::Display>(
        &self,
        variable: &'static str,
        default: T,
        min: T,
        max: T,
    ) -> Result<T, ConfigError> {
        let Some(value) = self.raw(variable) else {
            return Ok(default);
        };
        let parsed: T = value.trim().parse().map_err(|_| ConfigError {
            variable,
            value: value.clone(),
            problem: "is not a whole number".into(),
        })?;
        if parsed < min || parsed > max {
            return Err(ConfigError {
                variable,
                value,
                problem: format!("must be between {min} and {max}"),
            });
        }
        Ok(parsed)
    }

    /// A [`Whole`] variable as `T` (its range fits `T`).
    fn whole<T: TryFrom<u64>>(&self, spec: &Whole) -> Result<T, ConfigError> {
        let value = self.number(spec.name, spec.default, spec.min, spec.max)?;
        T::try_from(value).map_err(|_| ConfigError {
            variable: spec.name,
            value: value.to_string(),
            problem: "is too large".into(),
        })
    }

    /// A [`Whole`] variable counted in milliseconds.
    fn spec_millis(&self, spec: &Whole) -> Result<Duration, ConfigError> {
        self.whole(spec).map(Duration::from_millis)
    }

    /// A [`Whole`] variable counted in hours.
    fn spec_hours(&self, spec: &Whole) -> Result<Duration, ConfigError> {
        self.whole::<u64>(spec)
            .map(|hours| Duration::from_secs(3600 * hours))
    }

    /// The address policy of the flag `allow_all` and the list `listed`
    /// ([`AddressPolicy::from_settings`]). The list is read even when the
    /// flag is on, so that a malformed one stops start-up either way.
    fn address_policy(
        &self,
        allow_all: &Flag,
        listed: &Text,
    ) -> Result<AddressPolicy, ConfigError> {
        let allow_all = self.spec_flag(allow_all)?;
        let listed = match self.raw(listed.name) {
            None => AllowList::default(),
            Some(value) => value.parse().map_err(|e: AllowListError| ConfigError {
                variable: listed.name,
                value: value.clone(),
                problem: e.to_string(),
            })?,
        };
        Ok(AddressPolicy::from_settings(allow_all, listed))
    }

    /// A [`Flag`] variable.
    fn spec_flag(&self, spec: &Flag) -> Result<bool, ConfigError> {
        self.flag(spec.name, spec.default)
    }

    fn flag(&self, variable: &'static str, default: bool) -> Result<bool, ConfigError> {
        let Some(value) = self.raw(variable) else {
            return Ok(default);
        };
        match value.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(ConfigError {
                variable,
                value,
                problem: "must be true or false".into(),
            }),
        }
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
        let env = Env { get };
        let group = group(&env, binary_group)?;
        let http_addr = http_addr(&env, group)?;
        let wakeups = env.spec_flag(&v::OUTBOX_WAKEUPS)?;
        let dispatcher = dispatcher(&env, wakeups)?;
        let retention = RetentionConfig::new(
            env.spec_hours(&v::OUTBOX_DONE_RETENTION_HOURS)?,
            // Out-of-range batch sizes are clamped, as the contract says; non-numbers are errors.
            env.whole(&v::OUTBOX_DONE_RETENTION_BATCH_SIZE)?,
        );
        let (worker, shutdown_grace) = worker_settings(&env)?;
        let (smtp_url, mail_from) = mail(&env, group)?;
        let database_url = database_url(&env)?;
        let (queue_done_retention, delivery_record_ttl) = dedupe_window(&env, &dispatcher)?;
        let (redis_url, redis_ca_cert) = redis(&env)?;
        let (workflow_executor, workflow_bridge) = workflow_executor(&env)?;
        Ok(Self {
            workflow_executor,
            workflow_bridge,
            workflow_lease: env.spec_millis(&v::WORKFLOW_RUN_LEASE_MS)?,
            workflow_sweep_interval: env.spec_millis(&v::WORKFLOW_SWEEP_INTERVAL_MS)?,
            group,
            database_url,
            redis_url,
            redis_ca_cert,
            http_addr,
            queue_prefix: queue_prefix(&env)?,
            router: router(&env)?,
            dispatcher_enabled: env.spec_flag(&v::OUTBOX_DISPATCHER_ENABLED)?,
            dispatcher,
            wakeups,
            retention,
            retention_every: env.spec_millis(&v::OUTBOX_DONE_RETENTION_INTERVAL_MS)?,
            worker,
            pool_size: env.whole(&v::DATABASE_POOL_SIZE)?,
            smtp_url,
            mail_from,
            webhook_timeout: env.spec_millis(&v::WEBHOOK_TIMEOUT_MS)?,
            address_policy: env.address_policy(
                &v::WEBHOOK_ALLOW_PRIVATE_ADDRESSES,
                &v::OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS,
            )?,
            shutdown_grace,
            delivery_lease: env.spec_millis(&v::DELIVERY_LEASE_MS)?,
            gauge_interval: env.spec_millis(&v::WORKER_GAUGE_INTERVAL_MS)?,
            redis_check_interval: env.spec_millis(&v::OUTBOX_REDIS_CHECK_INTERVAL_MS)?,
            allow_redis_eviction: env.spec_flag(&v::OUTBOX_ALLOW_REDIS_EVICTION)?,
            queue_done_retention,
            delivery_record_ttl,
            queue_dead_retention: env.spec_hours(&v::QUEUE_DEAD_RETENTION_HOURS)?,
        })
    }
}

/// `WORKER_QUEUE_GROUP`: unset, or the group of the binary.
fn group(env: &Env<'_>, binary_group: Group) -> Result<Group, ConfigError> {
    let variable = v::WORKER_QUEUE_GROUP.name;
    let group = match env.raw(variable) {
        None => binary_group,
        Some(value) => match [Group::General, Group::Mail]
            .into_iter()
            .find(|group| group.as_str() == value.trim())
        {
            Some(group) => group,
            None => {
                return Err(ConfigError {
                    variable,
                    value,
                    problem: "must be general or mail".into(),
                });
            }
        },
    };
    if group != binary_group {
        return Err(ConfigError {
            variable,
            value: group.as_str().into(),
            problem: format!("this binary runs the {} group", binary_group.as_str()),
        });
    }
    Ok(group)
}

/// `WORKER_HTTP_ADDR`, with the default of `group`.
fn http_addr(env: &Env<'_>, group: Group) -> Result<SocketAddr, ConfigError> {
    let variable = WORKER_HTTP_ADDR_GENERAL.name;
    let text = env
        .raw(variable)
        .unwrap_or_else(|| group.default_http_addr().to_owned());
    text.trim().parse().map_err(|_| ConfigError {
        variable,
        value: text.clone(),
        problem: "must be host:port, like 127.0.0.1:9464".into(),
    })
}

/// The dispatcher's variables; it listens for `NOTIFY` when `wakeups`.
fn dispatcher(env: &Env<'_>, wakeups: bool) -> Result<DispatcherConfig, ConfigError> {
    Ok(DispatcherConfig {
        listen: wakeups,
        interval: env.spec_millis(&v::OUTBOX_DISPATCH_INTERVAL_MS)?,
        batch_size: env.whole(&v::OUTBOX_DISPATCH_BATCH_SIZE)?,
        concurrency: env.whole(&v::OUTBOX_DISPATCH_CONCURRENCY)?,
        loops: env.whole(&v::OUTBOX_DISPATCH_LOOPS)?,
        vacuum_every: env.whole(&v::OUTBOX_DISPATCH_VACUUM_EVERY)?,
        max_retries: env.whole(&v::OUTBOX_MAX_RETRIES)?,
        lock_timeout: env.spec_millis(&v::OUTBOX_LOCK_TIMEOUT_MS)?,
        unrouted_grace: env
            .whole(&v::OUTBOX_UNROUTED_GRACE_SECONDS)
            .map(Duration::from_secs)?,
        ..DispatcherConfig::default()
    })
}

/// The queue workers' variables and `WORKER_SHUTDOWN_GRACE_MS`, which must
/// end before the workers' heartbeats are missed.
fn worker_settings(env: &Env<'_>) -> Result<(WorkerSettings, Duration), ConfigError> {
    let worker = WorkerSettings {
        concurrency: env.whole(&v::WORKER_CONCURRENCY)?,
        retries: env.whole(&v::WORKER_RETRIES)?,
        // apalis-redis counts the orphan window in whole seconds: below
        // 1 s it rounds to zero and workers would steal each other's jobs.
        heartbeat: env.spec_millis(&v::WORKER_HEARTBEAT_MS)?,
        poll_interval: env.spec_millis(&v::WORKER_POLL_INTERVAL_MS)?,
        ..WorkerSettings::default()
    };
    let shutdown_grace = env.spec_millis(&v::WORKER_SHUTDOWN_GRACE_MS)?;
    let orphan_window = worker.heartbeat * worker.missed_heartbeats as u32;
    if shutdown_grace >= orphan_window {
        // A draining worker sends no heartbeats: past this window other
        // replicas would take over its jobs while it still runs them.
        return Err(ConfigError {
            variable: v::WORKER_SHUTDOWN_GRACE_MS.name,
            value: shutdown_grace.as_millis().to_string(),
            problem: format!(
                "must be shorter than {} heartbeats (WORKER_HEARTBEAT_MS={}), i.e. below {} ms",
                worker.missed_heartbeats,
                worker.heartbeat.as_millis(),
                orphan_window.as_millis()
            ),
        });
    }
    Ok((worker, shutdown_grace))
}

/// `SMTP_URL` (required by the mail group) and `MAIL_FROM`.
fn mail(env: &Env<'_>, group: Group) -> Result<(Option<String>, String), ConfigError> {
    let smtp_url = env.raw(v::SMTP_URL.name);
    if group == Group::Mail && smtp_url.is_none() {
        env.required(v::SMTP_URL.name)?;
    }
    if let Some(url) = &smtp_url {
        check_smtp_url(url)?;
    }
    let mail_from = env
        .raw(v::MAIL_FROM.name)
        .unwrap_or_else(|| v::MAIL_FROM.default.into());
    if let Err(e) = mail_from.parse::<lettre::message::Mailbox>() {
        return Err(ConfigError {
            variable: v::MAIL_FROM.name,
            value: mail_from,
            problem: format!("is not a mail address: {e}"),
        });
    }
    Ok((smtp_url, mail_from))
}

/// `DATABASE_URL`, required; a mistake in it (sslmode, sslrootcert and the
/// rest) stops start-up here, not at the first connection.
fn database_url(env: &Env<'_>) -> Result<String, ConfigError> {
    let variable = v::DATABASE_URL.name;
    let url = env.required(variable)?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(ConfigError {
            variable,
            value: redact_url(&url),
            problem: "must start with postgres:// or postgresql://".into(),
        });
    }
    if let Err(e) = outbox_postgres::PgConnectOptions::from_url(&url) {
        return Err(ConfigError {
            variable,
            value: redact_url(&url),
            problem: e.to_string(),
        });
    }
    Ok(url)
}

/// `REDIS_URL`, required, and `REDIS_CA_CERT`, checked by making a client.
fn redis(env: &Env<'_>) -> Result<(String, Option<PathBuf>), ConfigError> {
    let url = env.required(v::REDIS_URL.name)?;
    let ca_cert = env.raw(v::REDIS_CA_CERT.name).map(PathBuf::from);
    let invalid_url = |problem: String| ConfigError {
        variable: v::REDIS_URL.name,
        value: redact_url(&url),
        problem,
    };
    match outbox_queue::redis_client(&url, ca_cert.as_deref()) {
        Ok(_) => Ok((url, ca_cert)),
        Err(e @ QueueError::CaCert { .. }) => Err(ConfigError {
            variable: v::REDIS_CA_CERT.name,
            value: ca_cert.map(|p| p.display().to_string()).unwrap_or_default(),
            problem: e.to_string(),
        }),
        Err(QueueError::InvalidUrl { source, .. }) => {
            Err(invalid_url(format!("is not a Redis URL: {source}")))
        }
        Err(e) => Err(invalid_url(e.to_string())),
    }
}

/// `OUTBOX_QUEUE_PREFIX`: empty, or ending with ':' ([`outbox_queue::QueueNamespace::checked`]).
fn queue_prefix(env: &Env<'_>) -> Result<String, ConfigError> {
    let prefix = env.raw(v::OUTBOX_QUEUE_PREFIX.name).unwrap_or_default();
    match outbox_queue::QueueNamespace::checked(&prefix) {
        Ok(_) => Ok(prefix),
        Err(e) => Err(ConfigError {
            variable: v::OUTBOX_QUEUE_PREFIX.name,
            value: prefix,
            problem: e.problem.into(),
        }),
    }
}

/// `OUTBOX_ROUTES_FILE`: the standard routing table plus the file's rules,
/// read and validated now (a missing file, bad TOML or a refused rule stops
/// start-up naming the variable).
fn router(env: &Env<'_>) -> Result<Router, ConfigError> {
    let path = env.raw(v::OUTBOX_ROUTES_FILE.name);
    let fail = |problem: String| ConfigError {
        variable: v::OUTBOX_ROUTES_FILE.name,
        value: path.clone().unwrap_or_default(),
        problem,
    };
    // The built-in subscribers' routes; a test keeps them valid.
    let standard = outbox_catalog::standard_router()
        .map_err(|e| fail(format!("the built-in routing table is refused: {e}")))?;
    let Some(path) = &path else {
        return Ok(standard);
    };
    let text =
        std::fs::read_to_string(path.trim()).map_err(|e| fail(format!("cannot be read: {e}")))?;
    standard
        .with_routes_file(&text)
        .map_err(|e| fail(e.to_string()))
}

/// Reads `WORKFLOW_EXECUTOR`, `WORKFLOW_BRIDGE_URL` and
/// `WORKFLOW_BRIDGE_SECRET`: `hybrid` and `http` need both bridge
/// variables; a secret, when given, must be long enough, and a URL must be
/// http(s), whatever the mode.
fn workflow_executor(env: &Env<'_>) -> Result<(ExecutorMode, Option<BridgeSettings>), ConfigError> {
    let mode = match env.raw(v::WORKFLOW_EXECUTOR.name) {
        None => ExecutorMode::default(),
        Some(value) => value
            .trim()
            .parse()
            .map_err(|e: UnknownExecutor| ConfigError {
                variable: v::WORKFLOW_EXECUTOR.name,
                value: value.clone(),
                problem: format!("is not an executor: {e}"),
            })?,
    };
    let url = env.raw(v::WORKFLOW_BRIDGE_URL.name);
    if let Some(url) = &url {
        let parsed = url::Url::parse(url.trim());
        if !parsed
            .as_ref()
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
        {
            return Err(ConfigError {
                variable: v::WORKFLOW_BRIDGE_URL.name,
                value: redact_url(url),
                problem: "must be an http:// or https:// URL with a host".into(),
            });
        }
    }
    let secret = match env.raw(v::WORKFLOW_BRIDGE_SECRET.name) {
        None => None,
        Some(value) => Some(BridgeSecret::new(&value).map_err(|e| ConfigError {
            variable: v::WORKFLOW_BRIDGE_SECRET.name,
            value: "<redacted>".into(),
            problem: e.to_string(),
        })?),
    };
    let bridge = match (url, secret) {
        (Some(url), Some(secret)) => Some(BridgeSettings {
            url: url.trim().to_owned(),
            secret,
        }),
        (url, _) if mode.needs_bridge() => {
            let variable = if url.is_none() {
                v::WORKFLOW_BRIDGE_URL.name
            } else {
                v::WORKFLOW_BRIDGE_SECRET.name
            };
            return Err(ConfigError {
                variable,
                value: String::new(),
                problem: format!("is required with WORKFLOW_EXECUTOR={mode}"),
            });
        }
        _ => None,
    };
    Ok((mode, bridge))
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
    env: &Env<'_>,
    dispatcher: &outbox_dispatch::DispatcherConfig,
) -> Result<(Duration, Duration), ConfigError> {
    let hours = |h: u64| Duration::from_secs(3600 * h);
    let retention: u64 = env.whole(&v::QUEUE_DONE_RETENTION_HOURS)?;
    let ttl: u64 = env.whole(&v::DELIVERY_RECORD_TTL_HOURS)?;
    let repush = dispatcher.repush_window();
    if hours(retention) < repush {
        return Err(ConfigError {
            variable: v::QUEUE_DONE_RETENTION_HOURS.name,
            value: retention.to_string(),
            problem: format!(
                "must cover the time in which the dispatcher may push an event again (OUTBOX_LOCK_TIMEOUT_MS={} plus {} retries with backoff, OUTBOX_MAX_RETRIES): at least {} hours; raise it, or lower OUTBOX_LOCK_TIMEOUT_MS / OUTBOX_MAX_RETRIES",
                dispatcher.lock_timeout.as_millis(),
                dispatcher.max_retries,
                repush.as_secs().div_ceil(3600)
            ),
        });
    }
    if ttl < retention {
        return Err(ConfigError {
            variable: v::DELIVERY_RECORD_TTL_HOURS.name,
            value: ttl.to_string(),
            problem: format!(
                "must be at least QUEUE_DONE_RETENTION_HOURS ({retention}): receivers must remember a delivery as long as its job can be pushed again"
            ),
        });
    }
    Ok((hours(retention), hours(ttl)))
}

fn check_smtp_url(url: &str) -> Result<(), ConfigError> {
    let problem = match url::Url::parse(url) {
        Ok(parsed) if !matches!(parsed.scheme(), "smtp" | "smtps") => {
            format!("scheme {:?} is not smtp or smtps", parsed.scheme())
        }
        Ok(parsed) if parsed.host_str().is_none_or(str::is_empty) => "has no host".to_owned(),
        Ok(_) => return Ok(()),
        Err(e) => format!("is not a URL: {e}"),
    };
    Err(ConfigError {
        variable: v::SMTP_URL.name,
        value: redact_url(url),
        problem,
    })
}

/// Default of `WORKFLOW_BRIDGE_ADDR`: loopback only.
pub const DEFAULT_BRIDGE_ADDR: &str = "127.0.0.1:8787";

/// Everything the `workflow-bridge` process needs.
#[derive(Clone)]
pub struct BridgeConfig {
    /// `DATABASE_URL`.
    pub database_url: String,
    /// `WORKFLOW_BRIDGE_ADDR` ([`DEFAULT_BRIDGE_ADDR`]): the bridge and its
    /// `/healthz`, `/readyz`, `/metrics`.
    pub addr: SocketAddr,
    /// `WORKFLOW_BRIDGE_SECRET`, then `WORKFLOW_BRIDGE_PREVIOUS_SECRET` when
    /// set (accepted during a key rotation).
    pub secrets: Vec<BridgeSecret>,
    /// `DATABASE_POOL_SIZE`.
    pub pool_size: u32,
    /// Which internal addresses `httpRequest` blocks may call
    /// (`WEBHOOK_ALLOW_PRIVATE_ADDRESSES`, `OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS`,
    /// as [`WorkerConfig::address_policy`]).
    pub address_policy: AddressPolicy,
    /// `WORKER_SHUTDOWN_GRACE_MS`: how long requests in progress may take
    /// after SIGTERM.
    pub shutdown_grace: Duration,
    /// `WORKFLOW_RUN_LEASE_MS`: the lease the bridge's runner holds runs
    /// with (as the workers').
    pub workflow_lease: Duration,
}

impl std::fmt::Debug for BridgeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeConfig")
            .field("database_url", &redact_url(&self.database_url))
            .field("addr", &self.addr)
            .field("secrets", &self.secrets.len())
            .field("pool_size", &self.pool_size)
            .field("address_policy", &self.address_policy)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("workflow_lease", &self.workflow_lease)
            .finish()
    }
}

impl BridgeConfig {
    /// Reads the process environment.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`].
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads variables through `get`.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`].
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env { get };
        let database_url = database_url(&env)?;
        let addr_text = env
            .raw(v::WORKFLOW_BRIDGE_ADDR.name)
            .unwrap_or_else(|| DEFAULT_BRIDGE_ADDR.to_owned());
        let addr = addr_text.trim().parse().map_err(|_| ConfigError {
            variable: v::WORKFLOW_BRIDGE_ADDR.name,
            value: addr_text.clone(),
            problem: "is not an address like 127.0.0.1:8787".into(),
        })?;
        let secret = |variable: &'static str, value: String| {
            BridgeSecret::new(&value).map_err(|e| ConfigError {
                variable,
                value: "<redacted>".into(),
                problem: e.to_string(),
            })
        };
        let mut secrets = vec![secret(
            v::WORKFLOW_BRIDGE_SECRET_BRIDGE.name,
            env.required(v::WORKFLOW_BRIDGE_SECRET_BRIDGE.name)?,
        )?];
        if let Some(previous) = env.raw(v::WORKFLOW_BRIDGE_PREVIOUS_SECRET.name) {
            secrets.push(secret(v::WORKFLOW_BRIDGE_PREVIOUS_SECRET.name, previous)?);
        }
        Ok(Self {
            database_url,
            addr,
            secrets,
            pool_size: env.whole(&v::DATABASE_POOL_SIZE_BRIDGE)?,
            address_policy: env.address_policy(
                &v::WEBHOOK_ALLOW_PRIVATE_ADDRESSES_BRIDGE,
                &v::OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS_BRIDGE,
            )?,
            shutdown_grace: env.spec_millis(&v::WORKER_SHUTDOWN_GRACE_MS_BRIDGE)?,
            workflow_lease: env.spec_millis(&v::WORKFLOW_RUN_LEASE_MS)?,
        })
    }
}

#[cfg(test)]
#[path = "config/tests.rs"]
mod tests;
