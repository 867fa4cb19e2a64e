//! Every environment variable `worker-general`, `worker-mail` and
//! `workflow-bridge` read: its default (the constant of the library type
//! that uses it), the values it accepts and what it means.
//! [`WorkerConfig::from_lookup`] and [`BridgeConfig::from_lookup`] read
//! through these specifications, and [`command`] and [`bridge_command`]
//! turn them into the binaries' `--help` (with clap's `env` support, so
//! each variable is also a flag of the same name in lowercase:
//! `OUTBOX_DISPATCH_BATCH_SIZE` is `--outbox-dispatch-batch-size`).
//!
//! Each variable is defined once, here: name, default, range and meaning.
//! A default or bound that a library type also uses is that library's
//! constant (`outbox_dispatch::DEFAULT_BATCH_SIZE`, `MAX_BATCH_SIZE`, ...),
//! never a second literal; `config.rs` reads each variable through its
//! definition (`Whole` and `Flag` parse and check themselves), and
//! `--help` prints it. A new variable is one constant here, one line in
//! [`variables`], and one read in `config.rs`. The unit tests walk the
//! definitions: each listed one is read, each read one is listed, each is
//! documented in `docs/operations.md`, none is listed twice, every default
//! lies in its range, and the configuration of an empty environment is the
//! libraries' own defaults.
//!
//! [`WorkerConfig::from_lookup`]: crate::WorkerConfig::from_lookup
//! [`BridgeConfig::from_lookup`]: crate::BridgeConfig::from_lookup

use std::time::Duration;

use outbox_dispatch::{
    DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, DEFAULT_INTERVAL, DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MAX_RETRIES, MAX_BATCH_SIZE, RedisGuardSettings, RetentionConfig,
};
use outbox_subscriber::WorkerSettings;
use outbox_subscriber_mail::SmtpSettings;
use outbox_subscriber_webhook::{DeliverySettings, OnceSettings};

use crate::Group;

/// Largest value of a millisecond variable.
const MAX_MILLIS: u64 = u64::MAX / 2;

const fn millis(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

/// A whole-number variable: its default and the range it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whole {
    /// The variable.
    pub name: &'static str,
    /// The value when unset.
    pub default: u64,
    /// Smallest accepted value.
    pub min: u64,
    /// Largest accepted value.
    pub max: u64,
    /// What it is for.
    pub meaning: &'static str,
}

/// A true/false variable (`true`, `1`, `yes`, `on` or `false`, `0`, `no`,
/// `off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag {
    /// The variable.
    pub name: &'static str,
    /// The value when unset.
    pub default: bool,
    /// What it is for.
    pub meaning: &'static str,
}

/// A text variable (a URL, an address, a name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Text {
    /// The variable.
    pub name: &'static str,
    /// The value when unset, as shown: a value, `required`, or `unset`.
    pub default: &'static str,
    /// The values it accepts.
    pub form: &'static str,
    /// What it is for.
    pub meaning: &'static str,
}

/// One variable of [`variables`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variable {
    /// A whole number.
    Whole(Whole),
    /// True or false.
    Flag(Flag),
    /// Text.
    Text(Text),
}

impl Variable {
    /// The variable's name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Whole(v) => v.name,
            Self::Flag(v) => v.name,
            Self::Text(v) => v.name,
        }
    }

    /// Its line of `--help`: meaning, accepted values, default.
    #[must_use]
    pub fn help(&self) -> String {
        match self {
            Self::Whole(v) => {
                let range = if v.max >= MAX_MILLIS {
                    format!("at least {}", v.min)
                } else {
                    format!("{}..={}", v.min, v.max)
                };
                format!("{} [range: {range}] [default: {}]", v.meaning, v.default)
            }
            Self::Flag(v) => format!(
                "{} [values: true, false] [default: {}]",
                v.meaning, v.default
            ),
            Self::Text(v) => format!(
                "{} [values: {}] [default: {}]",
                v.meaning, v.form, v.default
            ),
        }
    }

    /// The flag of the same name: `--outbox-dispatch-batch-size`.
    #[must_use]
    pub fn flag(&self) -> String {
        self.name().to_ascii_lowercase().replace('_', "-")
    }
}

/// `DATABASE_URL`.
pub const DATABASE_URL: Text = Text {
    name: "DATABASE_URL",
    default: "required",
    form: "postgres://user:password@host:port/database[?sslmode=disable|prefer|require|verify-ca|verify-full&sslrootcert=<CA file>|system]",
    meaning: "Postgres; sslmode prefer (TLS when offered, unverified) unless the URL says otherwise",
};
/// `REDIS_URL`.
pub const REDIS_URL: Text = Text {
    name: "REDIS_URL",
    default: "required",
    form: "redis://host:port[/db], or rediss:// for TLS",
    meaning: "Redis (a single server, not a cluster; maxmemory-policy noeviction)",
};
/// `REDIS_CA_CERT`.
pub const REDIS_CA_CERT: Text = Text {
    name: "REDIS_CA_CERT",
    default: "unset (the system's trusted roots)",
    form: "a path to a PEM file of CA certificates",
    meaning: "the CA a rediss:// server's certificate must chain to",
};
/// `SMTP_URL`.
pub const SMTP_URL: Text = Text {
    name: "SMTP_URL",
    default: "required by worker-mail",
    form: "smtp://host:port, smtps://user:pass@host, smtp://host?tls=required",
    meaning: "where toolctrl.email sends",
};
/// `MAIL_FROM`.
pub const MAIL_FROM: Text = Text {
    name: "MAIL_FROM",
    default: SmtpSettings::DEFAULT_FROM,
    form: "a mail address",
    meaning: "sender when a mail names none",
};
/// `WORKER_QUEUE_GROUP`.
pub const WORKER_QUEUE_GROUP: Text = Text {
    name: "WORKER_QUEUE_GROUP",
    default: "the binary's own group",
    form: "general, mail (must match the binary)",
    meaning: "the handler group this process runs",
};
/// `WORKER_HTTP_ADDR` of `worker-general`.
pub const WORKER_HTTP_ADDR_GENERAL: Text = Text {
    name: "WORKER_HTTP_ADDR",
    default: Group::General.default_http_addr(),
    form: "host:port",
    meaning: "where /healthz, /readyz and /metrics are served (every interface by default, so a scraper outside the container reaches it)",
};
/// `WORKER_HTTP_ADDR` of `worker-mail`.
pub const WORKER_HTTP_ADDR_MAIL: Text = Text {
    default: Group::Mail.default_http_addr(),
    ..WORKER_HTTP_ADDR_GENERAL
};
/// `OUTBOX_QUEUE_PREFIX`.
pub const OUTBOX_QUEUE_PREFIX: Text = Text {
    name: "OUTBOX_QUEUE_PREFIX",
    default: "empty",
    form: "empty, or ending with ':' (adopt-app:)",
    meaning: "key prefix of every queue, for several environments on one Redis",
};
/// `OUTBOX_ROUTES_FILE`.
pub const OUTBOX_ROUTES_FILE: Text = Text {
    name: "OUTBOX_ROUTES_FILE",
    default: "unset (the standard table only)",
    form: "a path to a TOML file of [[route]] tables with prefix and queue",
    meaning: "routing rules added to the standard table, validated at start",
};
/// `OUTBOX_DISPATCHER_ENABLED`.
pub const OUTBOX_DISPATCHER_ENABLED: Flag = Flag {
    name: "OUTBOX_DISPATCHER_ENABLED",
    default: false,
    meaning: "worker-general: run the dispatcher (outbox rows to Redis queues)",
};
/// `OUTBOX_WAKEUPS`.
pub const OUTBOX_WAKEUPS: Flag = Flag {
    name: "OUTBOX_WAKEUPS",
    default: true,
    meaning: "wake the dispatcher on LISTEN/NOTIFY and the queue workers on Redis wake-ups; false polls only (for comparisons)",
};
/// `OUTBOX_DISPATCH_INTERVAL_MS`.
pub const OUTBOX_DISPATCH_INTERVAL_MS: Whole = Whole {
    name: "OUTBOX_DISPATCH_INTERVAL_MS",
    default: millis(DEFAULT_INTERVAL),
    min: 1,
    max: MAX_MILLIS,
    meaning: "dispatcher poll cadence in ms (inserts also wake it through NOTIFY)",
};
/// `OUTBOX_DISPATCH_BATCH_SIZE`.
pub const OUTBOX_DISPATCH_BATCH_SIZE: Whole = Whole {
    name: "OUTBOX_DISPATCH_BATCH_SIZE",
    default: DEFAULT_BATCH_SIZE as u64,
    min: 1,
    max: MAX_BATCH_SIZE as u64,
    meaning: "rows the dispatcher claims per tick",
};
/// `OUTBOX_DISPATCH_CONCURRENCY`.
pub const OUTBOX_DISPATCH_CONCURRENCY: Whole = Whole {
    name: "OUTBOX_DISPATCH_CONCURRENCY",
    default: DEFAULT_CONCURRENCY as u64,
    min: 1,
    max: 1000,
    meaning: "queue pushes in flight within a tick",
};
/// `OUTBOX_DISPATCH_LOOPS`.
pub const OUTBOX_DISPATCH_LOOPS: Whole = Whole {
    name: "OUTBOX_DISPATCH_LOOPS",
    default: outbox_dispatch::DEFAULT_LOOPS as u64,
    min: 1,
    max: outbox_dispatch::MAX_LOOPS as u64,
    meaning: "claim-and-hand-off loops the dispatcher runs at once (each uses one Postgres connection while it ticks)",
};
/// `OUTBOX_DISPATCH_VACUUM_EVERY`.
pub const OUTBOX_DISPATCH_VACUUM_EVERY: Whole = Whole {
    name: "OUTBOX_DISPATCH_VACUUM_EVERY",
    default: outbox_dispatch::DEFAULT_VACUUM_EVERY,
    min: 0,
    max: 1_000_000_000,
    meaning: "the most claimed rows between two VACUUM (SKIP_LOCKED) outbox_event of the dispatcher (the first after 1,000, later ones after the table's row count while that is smaller), which keep dead entries out of the claim index and plans fresh; 0 leaves the table to autovacuum",
};
/// `OUTBOX_MAX_RETRIES`.
pub const OUTBOX_MAX_RETRIES: Whole = Whole {
    name: "OUTBOX_MAX_RETRIES",
    default: DEFAULT_MAX_RETRIES as u64,
    min: 0,
    max: 1000,
    meaning: "failed hand-offs retried (1, 2, 4 … 32 min apart) before a row is FAILED",
};
/// `OUTBOX_LOCK_TIMEOUT_MS`.
pub const OUTBOX_LOCK_TIMEOUT_MS: Whole = Whole {
    name: "OUTBOX_LOCK_TIMEOUT_MS",
    default: millis(DEFAULT_LOCK_TIMEOUT),
    min: 1000,
    max: MAX_MILLIS,
    meaning: "lease of a claimed row in ms; past it another dispatcher may claim it",
};
/// `OUTBOX_DONE_RETENTION_HOURS`.
pub const OUTBOX_DONE_RETENTION_HOURS: Whole = Whole {
    name: "OUTBOX_DONE_RETENTION_HOURS",
    default: RetentionConfig::DEFAULT_RETENTION.as_secs() / 3600,
    min: 0,
    max: 1_000_000,
    meaning: "DONE rows are deleted after this many hours",
};
/// `OUTBOX_DONE_RETENTION_BATCH_SIZE`.
pub const OUTBOX_DONE_RETENTION_BATCH_SIZE: Whole = Whole {
    name: "OUTBOX_DONE_RETENTION_BATCH_SIZE",
    default: RetentionConfig::DEFAULT_BATCH as u64,
    min: 0,
    max: u32::MAX as u64,
    meaning: "rows deleted per retention batch (clamped to 1..=10000)",
};
/// `OUTBOX_DONE_RETENTION_INTERVAL_MS`.
pub const OUTBOX_DONE_RETENTION_INTERVAL_MS: Whole = Whole {
    name: "OUTBOX_DONE_RETENTION_INTERVAL_MS",
    default: millis(crate::DEFAULT_RETENTION_EVERY),
    min: 1000,
    max: MAX_MILLIS,
    meaning: "how often retention runs (Postgres rows and Redis jobs), in ms",
};
/// `WORKER_CONCURRENCY`.
pub const WORKER_CONCURRENCY: Whole = Whole {
    name: "WORKER_CONCURRENCY",
    default: WorkerSettings::DEFAULT_CONCURRENCY as u64,
    min: 1,
    max: 1000,
    meaning: "jobs per queue in parallel (the audit and notification queues run at least 100); a job of a database-using queue holds a pooled connection, so a value above DATABASE_POOL_SIZE is warned about at start",
};
/// `WORKER_RETRIES`.
pub const WORKER_RETRIES: Whole = Whole {
    name: "WORKER_RETRIES",
    default: WorkerSettings::DEFAULT_RETRIES as u64,
    min: 0,
    max: 100,
    meaning: "quick in-process retries of a failing job before it goes back on the queue for later",
};
/// `WORKER_HEARTBEAT_MS`.
pub const WORKER_HEARTBEAT_MS: Whole = Whole {
    name: "WORKER_HEARTBEAT_MS",
    default: millis(WorkerSettings::DEFAULT_HEARTBEAT),
    min: 1000,
    max: MAX_MILLIS,
    meaning: "queue-worker heartbeat in ms; silent for 4 beats = presumed dead, its jobs redelivered",
};
/// `WORKER_POLL_INTERVAL_MS`.
pub const WORKER_POLL_INTERVAL_MS: Whole = Whole {
    name: "WORKER_POLL_INTERVAL_MS",
    default: millis(WorkerSettings::DEFAULT_POLL_INTERVAL),
    min: 10,
    max: MAX_MILLIS,
    meaning: "how often an idle queue worker looks for due jobs, in ms",
};
/// `WORKER_SHUTDOWN_GRACE_MS`.
pub const WORKER_SHUTDOWN_GRACE_MS: Whole = Whole {
    name: "WORKER_SHUTDOWN_GRACE_MS",
    default: millis(crate::DEFAULT_SHUTDOWN_GRACE),
    min: 0,
    max: MAX_MILLIS,
    meaning: "time to finish jobs in hand after SIGTERM, in ms; below 4 heartbeats",
};
/// `DATABASE_POOL_SIZE`.
pub const DATABASE_POOL_SIZE: Whole = Whole {
    name: "DATABASE_POOL_SIZE",
    default: outbox_postgres::DEFAULT_POOL_SIZE as u64,
    min: 1,
    max: 1000,
    meaning: "Postgres connections (plus two for the dispatcher: LISTEN and the wake gate); keep it at least WORKER_CONCURRENCY",
};
/// `WEBHOOK_TIMEOUT_MS`.
pub const WEBHOOK_TIMEOUT_MS: Whole = Whole {
    name: "WEBHOOK_TIMEOUT_MS",
    default: millis(DeliverySettings::DEFAULT_TIMEOUT),
    min: 100,
    max: MAX_MILLIS,
    meaning: "per-delivery HTTP timeout of webhooks and plugin calls, in ms",
};
/// `WEBHOOK_ALLOW_PRIVATE_ADDRESSES`.
pub const WEBHOOK_ALLOW_PRIVATE_ADDRESSES: Flag = Flag {
    name: "WEBHOOK_ALLOW_PRIVATE_ADDRESSES",
    default: false,
    meaning: "allow loopback, private and link-local targets of webhooks, plugins and workflow HTTP blocks (tests, demos)",
};
/// `OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS`.
pub const OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS: Text = Text {
    name: outbox_http_guard::ALLOW_LIST_VARIABLE,
    default: "unset (no internal target allowed)",
    form: "comma-separated host names, IP addresses and CIDR ranges: crm.internal,10.20.0.0/16,fd00::/8",
    meaning: "internal targets webhooks, plugins and workflow HTTP blocks may reach: a listed name may resolve to internal addresses, an internal address in a listed range may be reached; every other internal address stays refused",
};
/// `DELIVERY_LEASE_MS`.
pub const DELIVERY_LEASE_MS: Whole = Whole {
    name: "DELIVERY_LEASE_MS",
    default: millis(OnceSettings::DEFAULT_LEASE),
    min: 100,
    max: MAX_MILLIS,
    meaning: "how long a delivery in progress holds its idempotency key, in ms; keep above the timeouts",
};
/// `WORKER_GAUGE_INTERVAL_MS`.
pub const WORKER_GAUGE_INTERVAL_MS: Whole = Whole {
    name: "WORKER_GAUGE_INTERVAL_MS",
    default: millis(crate::DEFAULT_GAUGE_INTERVAL),
    min: 100,
    max: MAX_MILLIS,
    meaning: "refresh of the queue and outbox gauges, in ms",
};
/// `OUTBOX_REDIS_CHECK_INTERVAL_MS`.
pub const OUTBOX_REDIS_CHECK_INTERVAL_MS: Whole = Whole {
    name: "OUTBOX_REDIS_CHECK_INTERVAL_MS",
    default: millis(RedisGuardSettings::DEFAULT_CHECK_EVERY),
    min: 100,
    max: MAX_MILLIS,
    meaning: "how often the dispatcher checks that Redis kept its jobs, in ms",
};
/// `OUTBOX_ALLOW_REDIS_EVICTION`.
pub const OUTBOX_ALLOW_REDIS_EVICTION: Flag = Flag {
    name: crate::ALLOW_EVICTION_VARIABLE,
    default: false,
    meaning: "start (with a warning) although Redis' maxmemory-policy is not noeviction",
};
/// `QUEUE_DONE_RETENTION_HOURS`.
pub const QUEUE_DONE_RETENTION_HOURS: Whole = Whole {
    name: "QUEUE_DONE_RETENTION_HOURS",
    default: crate::DEFAULT_QUEUE_DONE_RETENTION_HOURS,
    min: 1,
    max: 1_000_000,
    meaning: "finished jobs are removed from Redis after this many hours; must cover the dispatcher's re-push window",
};
/// `DELIVERY_RECORD_TTL_HOURS`.
pub const DELIVERY_RECORD_TTL_HOURS: Whole = Whole {
    name: "DELIVERY_RECORD_TTL_HOURS",
    default: crate::DEFAULT_DELIVERY_RECORD_TTL_HOURS,
    min: 1,
    max: 1_000_000,
    meaning: "how long receivers remember a completed delivery, in hours; at least QUEUE_DONE_RETENTION_HOURS",
};
/// `QUEUE_DEAD_RETENTION_HOURS`.
pub const QUEUE_DEAD_RETENTION_HOURS: Whole = Whole {
    name: "QUEUE_DEAD_RETENTION_HOURS",
    default: crate::DEFAULT_QUEUE_DEAD_RETENTION_HOURS,
    min: 1,
    max: 1_000_000,
    meaning: "dead jobs are removed from Redis after this many hours",
};
/// `WORKFLOW_EXECUTOR`.
pub const WORKFLOW_EXECUTOR: Text = Text {
    name: "WORKFLOW_EXECUTOR",
    default: "native",
    form: "native, hybrid, http",
    meaning: "where workflow executions run",
};
/// `WORKFLOW_BRIDGE_URL`.
pub const WORKFLOW_BRIDGE_URL: Text = Text {
    name: "WORKFLOW_BRIDGE_URL",
    default: "unset (required by hybrid and http)",
    form: "http(s)://host:port",
    meaning: "the workflow bridge",
};
/// `WORKFLOW_BRIDGE_SECRET`.
pub const WORKFLOW_BRIDGE_SECRET: Text = Text {
    name: "WORKFLOW_BRIDGE_SECRET",
    default: "unset (required by hybrid and http)",
    form: "at least 32 bytes",
    meaning: "the key requests to the bridge are signed with; never printed",
};
/// `WORKFLOW_RUN_LEASE_MS`.
pub const WORKFLOW_RUN_LEASE_MS: Whole = Whole {
    name: "WORKFLOW_RUN_LEASE_MS",
    default: millis(outbox_workflow_runner::DEFAULT_LEASE),
    min: 100,
    max: 86_400_000,
    meaning: "how long a workflow run stays held after its holder's last write (an HTTP call holds it for its timeout plus this), so how soon a run whose worker died is resumed, in ms",
};
/// `WORKFLOW_SWEEP_INTERVAL_MS`.
pub const WORKFLOW_SWEEP_INTERVAL_MS: Whole = Whole {
    name: "WORKFLOW_SWEEP_INTERVAL_MS",
    default: millis(outbox_workflow_store::sweep::DEFAULT_SWEEP_INTERVAL),
    min: 100,
    max: MAX_MILLIS,
    meaning: "how often worker-general looks for workflow runs left running with an expired lease and requests their resume, in ms",
};
/// `LOG_FORMAT`.
pub const LOG_FORMAT: Text = Text {
    name: "LOG_FORMAT",
    default: "text",
    form: "text, json",
    meaning: "one readable line or one JSON object per log event (RUST_LOG filters either)",
};

/// `SENTRY_DSN`.
pub const SENTRY_DSN: Text = Text {
    name: crate::SENTRY_DSN_VARIABLE,
    default: "unset (no error reports)",
    form: "a Sentry DSN",
    meaning: "where error-level log lines and panics are reported, with ids as tags and secrets redacted",
};

/// `OTEL_EXPORTER_OTLP_ENDPOINT`.
pub const OTEL_EXPORTER_OTLP_ENDPOINT: Text = Text {
    name: crate::OTLP_ENDPOINT_VARIABLE,
    default: "unset (no trace export)",
    form: "an http:// or https:// base URL of an OTLP/HTTP collector",
    meaning: "export spans (protobuf, to <URL>/v1/traces) that continue each event's trace from its publisher to its side effects",
};

/// `OTEL_SERVICE_NAME`.
pub const OTEL_SERVICE_NAME: Text = Text {
    name: crate::SERVICE_NAME_VARIABLE,
    default: "the binary's name",
    form: "a name",
    meaning: "the service name of exported spans",
};

/// `WORKFLOW_BRIDGE_ADDR` of `workflow-bridge`.
pub const WORKFLOW_BRIDGE_ADDR: Text = Text {
    name: "WORKFLOW_BRIDGE_ADDR",
    default: crate::DEFAULT_BRIDGE_ADDR,
    form: "host:port",
    meaning: "where the bridge serves its signed endpoints, /healthz, /readyz and /metrics (loopback only by default)",
};
/// `WORKFLOW_BRIDGE_SECRET` of `workflow-bridge`.
pub const WORKFLOW_BRIDGE_SECRET_BRIDGE: Text = Text {
    default: "required",
    meaning: "the key a request's signature must verify with; never printed",
    ..WORKFLOW_BRIDGE_SECRET
};
/// `WORKFLOW_BRIDGE_PREVIOUS_SECRET` of `workflow-bridge`.
pub const WORKFLOW_BRIDGE_PREVIOUS_SECRET: Text = Text {
    name: "WORKFLOW_BRIDGE_PREVIOUS_SECRET",
    default: "unset (only WORKFLOW_BRIDGE_SECRET is accepted)",
    form: "at least 32 bytes",
    meaning: "a second key the bridge also accepts, during a key rotation; never printed",
};
/// `DATABASE_POOL_SIZE` of `workflow-bridge`.
pub const DATABASE_POOL_SIZE_BRIDGE: Whole = Whole {
    meaning: "Postgres connections",
    ..DATABASE_POOL_SIZE
};
/// `WEBHOOK_ALLOW_PRIVATE_ADDRESSES` of `workflow-bridge`.
pub const WEBHOOK_ALLOW_PRIVATE_ADDRESSES_BRIDGE: Flag = Flag {
    meaning: "allow loopback, private and link-local targets of workflow HTTP blocks (tests, demos)",
    ..WEBHOOK_ALLOW_PRIVATE_ADDRESSES
};
/// `OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS` of `workflow-bridge`.
pub const OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS_BRIDGE: Text = Text {
    meaning: "internal targets workflow HTTP blocks may reach: a listed name may resolve to internal addresses, an internal address in a listed range may be reached; every other internal address stays refused",
    ..OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS
};
/// `WORKER_SHUTDOWN_GRACE_MS` of `workflow-bridge`.
pub const WORKER_SHUTDOWN_GRACE_MS_BRIDGE: Whole = Whole {
    meaning: "time requests in progress may take after SIGTERM, in ms",
    ..WORKER_SHUTDOWN_GRACE_MS
};
/// `OTEL_EXPORTER_OTLP_ENDPOINT` of `workflow-bridge`.
pub const OTEL_EXPORTER_OTLP_ENDPOINT_BRIDGE: Text = Text {
    meaning: "export the span of each request (protobuf, to <URL>/v1/traces), in its caller's trace",
    ..OTEL_EXPORTER_OTLP_ENDPOINT
};
/// `OTEL_SERVICE_NAME` of `workflow-bridge`.
pub const OTEL_SERVICE_NAME_BRIDGE: Text = Text {
    default: crate::BRIDGE_BINARY,
    ..OTEL_SERVICE_NAME
};

/// Every variable the binary of `group` reads, in the order `--help`
/// lists them.
#[must_use]
pub fn variables(group: Group) -> Vec<Variable> {
    use Variable::{Flag as F, Text as T, Whole as W};
    let http_addr = match group {
        Group::General => WORKER_HTTP_ADDR_GENERAL,
        Group::Mail => WORKER_HTTP_ADDR_MAIL,
    };
    vec![
        T(DATABASE_URL),
        T(REDIS_URL),
        T(REDIS_CA_CERT),
        T(SMTP_URL),
        T(MAIL_FROM),
        T(WORKER_QUEUE_GROUP),
        T(http_addr),
        T(OUTBOX_QUEUE_PREFIX),
        T(OUTBOX_ROUTES_FILE),
        F(OUTBOX_DISPATCHER_ENABLED),
        F(OUTBOX_WAKEUPS),
        W(OUTBOX_DISPATCH_INTERVAL_MS),
        W(OUTBOX_DISPATCH_BATCH_SIZE),
        W(OUTBOX_DISPATCH_CONCURRENCY),
        W(OUTBOX_DISPATCH_LOOPS),
        W(OUTBOX_DISPATCH_VACUUM_EVERY),
        W(OUTBOX_MAX_RETRIES),
        W(OUTBOX_LOCK_TIMEOUT_MS),
        W(OUTBOX_DONE_RETENTION_HOURS),
        W(OUTBOX_DONE_RETENTION_BATCH_SIZE),
        W(OUTBOX_DONE_RETENTION_INTERVAL_MS),
        W(WORKER_CONCURRENCY),
        W(WORKER_RETRIES),
        W(WORKER_HEARTBEAT_MS),
        W(WORKER_POLL_INTERVAL_MS),
        W(WORKER_SHUTDOWN_GRACE_MS),
        W(DATABASE_POOL_SIZE),
        W(WEBHOOK_TIMEOUT_MS),
        F(WEBHOOK_ALLOW_PRIVATE_ADDRESSES),
        T(OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS),
        W(DELIVERY_LEASE_MS),
        W(WORKER_GAUGE_INTERVAL_MS),
        W(OUTBOX_REDIS_CHECK_INTERVAL_MS),
        F(OUTBOX_ALLOW_REDIS_EVICTION),
        W(QUEUE_DONE_RETENTION_HOURS),
        W(DELIVERY_RECORD_TTL_HOURS),
        W(QUEUE_DEAD_RETENTION_HOURS),
        T(WORKFLOW_EXECUTOR),
        T(WORKFLOW_BRIDGE_URL),
        T(WORKFLOW_BRIDGE_SECRET),
        W(WORKFLOW_RUN_LEASE_MS),
        W(WORKFLOW_SWEEP_INTERVAL_MS),
        T(LOG_FORMAT),
        T(SENTRY_DSN),
        T(OTEL_EXPORTER_OTLP_ENDPOINT),
        T(OTEL_SERVICE_NAME),
    ]
}

/// Every variable `workflow-bridge` reads, in the order its `--help`
/// lists them.
#[must_use]
pub fn bridge_variables() -> Vec<Variable> {
    use Variable::{Flag as F, Text as T, Whole as W};
    vec![
        T(DATABASE_URL),
        T(WORKFLOW_BRIDGE_ADDR),
        T(WORKFLOW_BRIDGE_SECRET_BRIDGE),
        T(WORKFLOW_BRIDGE_PREVIOUS_SECRET),
        W(DATABASE_POOL_SIZE_BRIDGE),
        F(WEBHOOK_ALLOW_PRIVATE_ADDRESSES_BRIDGE),
        T(OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS_BRIDGE),
        W(WORKER_SHUTDOWN_GRACE_MS_BRIDGE),
        W(WORKFLOW_RUN_LEASE_MS),
        T(LOG_FORMAT),
        T(OTEL_EXPORTER_OTLP_ENDPOINT_BRIDGE),
        T(OTEL_SERVICE_NAME_BRIDGE),
    ]
}

/// What `--help` says after the variables.
const AFTER_HELP: &str = "Every setting is an environment variable; the flag of the same name \
    overrides it. Values are checked at start: a bad one stops the process with exit code 2 and \
    a message naming the variable. Exit codes: 0 stopped cleanly (SIGTERM, Ctrl-C); 1 failed; \
    2 bad configuration, or a Redis that may evict keys.";

/// What every binary's `--help` says last: the trace exporter's own
/// variables, which the OpenTelemetry SDK reads, not this list.
const SDK_VARIABLES: &str = "With OTEL_EXPORTER_OTLP_ENDPOINT set, the OpenTelemetry SDK's own \
    variables (OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE, \
    OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_RESOURCE_ATTRIBUTES, ...) apply \
    as the SDK defines them; they are not checked at start. RUST_LOG filters the log lines \
    (default: info, with the queue library at warn).";

/// What the bridge's `--help` says after the variables.
const BRIDGE_AFTER_HELP: &str = "Every setting is an environment variable; the flag of the same \
    name overrides it. Values are checked at start: a bad one stops the process with exit code 2 \
    and a message naming the variable. Exit codes: 0 stopped cleanly (SIGTERM, Ctrl-C); 1 failed \
    (Postgres unreachable at start, the address taken); 2 bad configuration.";

/// What the binary of `group` is, as `--help` says it first.
#[must_use]
pub fn about(group: Group) -> &'static str {
    crate::built_in::about(group)
}

/// The command line of the binary of `group`: `--help` lists every
/// variable of [`variables`] with its default, accepted values and
/// meaning; `--version` prints the version. Values shown never include
/// the environment's own (URLs and secrets stay out of the help).
#[must_use]
pub fn command(group: Group) -> clap::Command {
    let name = match group {
        Group::General => "worker-general",
        Group::Mail => "worker-mail",
    };
    described(name, about(group), AFTER_HELP, variables(group))
}

/// The command line of `workflow-bridge`, as [`command`] is the workers':
/// `--help` lists every variable of [`bridge_variables`], `--version`
/// prints the version.
#[must_use]
pub fn bridge_command() -> clap::Command {
    described(
        crate::BRIDGE_BINARY,
        "The transactional outbox's workflow bridge: runs, over signed HTTP, the workflow executions that workers in hybrid or http mode hand it, and stream runs. Needs Postgres only.",
        BRIDGE_AFTER_HELP,
        bridge_variables(),
    )
}

/// A command named `name` whose flags are `variables`, each also read
/// from the environment variable of its name (never shown in the help).
fn described(
    name: &'static str,
    about: &'static str,
    after_help: &'static str,
    variables: Vec<Variable>,
) -> clap::Command {
    let mut command = clap::Command::new(name)
        .version(env!("CARGO_PKG_VERSION"))
        .about(about)
        .after_help(format!("{after_help}\n\n{SDK_VARIABLES}"))
        .next_line_help(true);
    for variable in variables {
        command = command.arg(
            clap::Arg::new(variable.name())
                .long(variable.flag())
                .env(variable.name())
                .hide_env_values(true)
                .value_name("VALUE")
                .action(clap::ArgAction::Set)
                .help(variable.help()),
        );
    }
    command
}

/// The variables as parsed by [`command`] (a flag, else the environment);
/// a name [`variables`] does not list is read from the environment.
pub fn lookup(matches: &clap::ArgMatches) -> impl Fn(&str) -> Option<String> + '_ {
    move |name| match matches.try_get_one::<String>(name) {
        Ok(value) => value.cloned(),
        Err(_) => std::env::var(name).ok(),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::{LogFormat, TraceExportConfig, WorkerConfig};

    /// The names the configuration of `group` asks for.
    fn read_by(group: Group) -> Vec<String> {
        let asked = RefCell::new(Vec::new());
        let get = |name: &str| {
            asked.borrow_mut().push(name.to_owned());
            match name {
                "DATABASE_URL" => Some("postgres://x/y".to_owned()),
                "REDIS_URL" => Some("redis://x".to_owned()),
                "SMTP_URL" => Some("smtp://x:25".to_owned()),
                "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4318".to_owned()),
                _ => None,
            }
        };
        WorkerConfig::from_lookup(group, &get).unwrap();
        LogFormat::from_lookup(&get).unwrap();
        TraceExportConfig::from_lookup(&get, "worker").unwrap();
        let _reports = crate::start_error_reports(&get, "worker").unwrap();
        asked.into_inner()
    }

    /// Every definition, walked once: each is read by the configuration of
    /// a binary that lists it, documented in `docs/operations.md`, listed
    /// once, and a whole number's default lies within its range.
    #[test]
    fn every_definition_is_read_documented_once_and_its_default_in_range() {
        let docs = include_str!("../../../docs/operations.md");
        for group in [Group::General, Group::Mail] {
            let read = read_by(group);
            for variable in variables(group) {
                let name = variable.name();
                assert!(
                    read.iter().any(|r| r == name),
                    "{name} is listed for the {} group but never read",
                    group.as_str()
                );
            }
        }
        for variable in variables(Group::General)
            .into_iter()
            .chain(variables(Group::Mail))
            .chain(bridge_variables())
        {
            let name = variable.name();
            assert!(
                docs.contains(&format!("`{name}`")),
                "{name} is not in docs/operations.md"
            );
            if let Variable::Whole(w) = variable {
                assert!(w.min <= w.default && w.default <= w.max, "{w:?}");
            }
        }
    }

    /// The configuration read from an empty environment is the libraries'
    /// own defaults, and the bounds of the dispatcher's definitions are the
    /// ones its validation applies: no default or bound is stated twice.
    #[test]
    fn the_definitions_are_the_libraries_defaults_and_bounds() {
        let required = |name: &str| match name {
            "DATABASE_URL" => Some("postgres://x/y".to_owned()),
            "REDIS_URL" => Some("redis://x".to_owned()),
            _ => None,
        };
        let config = WorkerConfig::from_lookup(Group::General, &required).unwrap();
        assert_eq!(
            config.dispatcher,
            outbox_dispatch::DispatcherConfig::default()
        );
        assert_eq!(config.worker, WorkerSettings::default());
        assert_eq!(config.retention, RetentionConfig::default());
        assert_eq!(config.webhook_timeout, DeliverySettings::DEFAULT_TIMEOUT);
        assert_eq!(config.delivery_lease, OnceSettings::DEFAULT_LEASE);
        assert_eq!(
            config.redis_check_interval,
            RedisGuardSettings::DEFAULT_CHECK_EVERY
        );
        assert_eq!(config.workflow_lease, outbox_workflow_runner::DEFAULT_LEASE);
        assert_eq!(
            config.workflow_sweep_interval,
            outbox_workflow_store::sweep::DEFAULT_SWEEP_INTERVAL
        );
        assert_eq!(config.pool_size, outbox_postgres::DEFAULT_POOL_SIZE);
        assert_eq!(
            config.queue_done_retention.as_secs(),
            3600 * outbox_queue::DEFAULT_DONE_RETENTION_HOURS
        );
        assert_eq!(config.mail_from, SmtpSettings::DEFAULT_FROM);
        // Each end of a dispatcher definition's range passes the
        // dispatcher's own validation.
        for spec in [
            OUTBOX_DISPATCH_INTERVAL_MS,
            OUTBOX_DISPATCH_BATCH_SIZE,
            OUTBOX_DISPATCH_CONCURRENCY,
            OUTBOX_DISPATCH_LOOPS,
            OUTBOX_DISPATCH_VACUUM_EVERY,
        ] {
            for end in [spec.min, spec.max] {
                let value = end.to_string();
                let get = |name: &str| {
                    if name == spec.name {
                        Some(value.clone())
                    } else {
                        required(name)
                    }
                };
                let config = WorkerConfig::from_lookup(Group::General, &get).unwrap();
                assert_eq!(config.dispatcher.validate(), Ok(()), "{}={end}", spec.name);
            }
        }
    }

    #[test]
    fn every_variable_the_configuration_reads_is_in_the_help() {
        for group in [Group::General, Group::Mail] {
            let listed: Vec<&str> = variables(group).iter().map(Variable::name).collect();
            for name in read_by(group) {
                assert!(
                    listed.contains(&name.as_str()),
                    "{name} is read but not listed in variables()"
                );
            }
            let mut unique = listed.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), listed.len(), "a variable is listed twice");
        }
    }

    #[test]
    fn the_bridge_lists_exactly_the_variables_it_reads() {
        let asked = RefCell::new(Vec::new());
        let get = |name: &str| {
            asked.borrow_mut().push(name.to_owned());
            match name {
                "DATABASE_URL" => Some("postgres://x/y".to_owned()),
                "WORKFLOW_BRIDGE_SECRET" | "WORKFLOW_BRIDGE_PREVIOUS_SECRET" => {
                    Some("k".repeat(32))
                }
                "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4318".to_owned()),
                _ => None,
            }
        };
        crate::BridgeConfig::from_lookup(&get).unwrap();
        LogFormat::from_lookup(&get).unwrap();
        let traces = TraceExportConfig::from_lookup(&get, crate::BRIDGE_BINARY).unwrap();
        let mut read = asked.into_inner();
        read.sort_unstable();
        read.dedup();
        let mut listed: Vec<String> = bridge_variables()
            .iter()
            .map(|v| v.name().to_owned())
            .collect();
        let count = listed.len();
        listed.sort_unstable();
        listed.dedup();
        assert_eq!(listed.len(), count, "a variable is listed twice");
        assert_eq!(read, listed);
        // The default service name is the one the help states.
        assert_eq!(
            traces.unwrap().service_name,
            OTEL_SERVICE_NAME_BRIDGE.default
        );
    }

    #[test]
    fn the_help_states_defaults_and_ranges() {
        let help = Variable::Whole(OUTBOX_DISPATCH_BATCH_SIZE).help();
        assert!(
            help.ends_with("[range: 1..=10000] [default: 500]"),
            "{help}"
        );
        let help = Variable::Whole(WORKER_HEARTBEAT_MS).help();
        assert!(
            help.contains("[range: at least 1000] [default: 30000]"),
            "{help}"
        );
        assert_eq!(
            Variable::Whole(OUTBOX_DISPATCH_BATCH_SIZE).flag(),
            "outbox-dispatch-batch-size"
        );
    }

    #[test]
    fn a_flag_reaches_the_configuration_like_its_variable() {
        let matches = command(Group::Mail)
            .try_get_matches_from(["worker-mail", "--worker-concurrency", "7"])
            .unwrap();
        let get = lookup(&matches);
        assert_eq!(get("WORKER_CONCURRENCY").as_deref(), Some("7"));
    }
}
