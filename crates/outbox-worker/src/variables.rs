//! Which variables `worker-general`, `worker-mail` and `workflow-bridge`
//! read, and their `--help` made of them. Each variable is defined once,
//! as a `pub const` of [`outbox_env`] beside the settings type that uses
//! it, in the library that owns that type (`OUTBOX_DISPATCH_BATCH_SIZE` in
//! `outbox-dispatch` beside `DispatcherConfig`, `WORKER_CONCURRENCY` in
//! `outbox-subscriber` beside `WorkerSettings`, ...; the worker's own
//! beside [`WorkerConfig`](crate::WorkerConfig)); its default and bounds
//! are that type's constants, and the type reads itself through it. What
//! is the binaries' own is here: [`variables`] and [`bridge_variables`],
//! lists of references to those definitions (a few reworded for one
//! binary, never with another default or bound), and [`command`] and
//! [`bridge_command`], which turn the lists into `--help` (with clap's
//! `env` support, so each variable is also a flag of the same name in
//! lowercase: `OUTBOX_DISPATCH_BATCH_SIZE` is
//! `--outbox-dispatch-batch-size`).
//!
//! A new variable of an existing settings type is one definition beside
//! the type (read in its `from_lookup`) and one entry in the lists here.
//! The tests walk the lists: each listed variable is read, each read one
//! is listed, each is documented in `docs/operations/configuration.md`, none is listed
//! twice, every default lies in its range, and the configuration of an
//! empty environment is the libraries' own defaults.

use outbox_env::Whole;
pub use outbox_env::{Flag, Text, Variable};

use crate::Group;
use crate::config as own;

/// `WORKER_HTTP_ADDR` of `worker-mail`: its own default port.
pub const WORKER_HTTP_ADDR_MAIL: Text = Text {
    default: Group::Mail.default_http_addr(),
    ..own::WORKER_HTTP_ADDR
};
/// `DATABASE_POOL_SIZE` as the workers use it.
pub const DATABASE_POOL_SIZE_WORKERS: Whole = Whole {
    meaning: "Postgres connections (plus two for the dispatcher: LISTEN and the wake gate); keep it at least WORKER_CONCURRENCY",
    ..outbox_pg::DATABASE_POOL_SIZE
};
/// `WORKFLOW_BRIDGE_SECRET` of `workflow-bridge`, which requires it.
#[cfg(feature = "workflow")]
pub const WORKFLOW_BRIDGE_SECRET_BRIDGE: Text = Text {
    default: "required",
    meaning: "the key a request's signature must verify with; never printed",
    ..outbox_workflow_bridge::WORKFLOW_BRIDGE_SECRET
};
/// `WEBHOOK_ALLOW_PRIVATE_ADDRESSES` of `workflow-bridge`.
#[cfg(feature = "workflow")]
pub const WEBHOOK_ALLOW_PRIVATE_ADDRESSES_BRIDGE: Flag = Flag {
    meaning: "allow loopback, private and link-local targets of workflow HTTP blocks (tests, demos)",
    ..outbox_http_guard::WEBHOOK_ALLOW_PRIVATE_ADDRESSES
};
/// `OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS` of `workflow-bridge`.
#[cfg(feature = "workflow")]
pub const OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS_BRIDGE: Text = Text {
    meaning: "internal targets workflow HTTP blocks may reach: a listed name may resolve to internal addresses, an internal address in a listed range may be reached; every other internal address stays refused",
    ..outbox_http_guard::OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS
};
/// `WORKER_SHUTDOWN_GRACE_MS` of `workflow-bridge`.
#[cfg(feature = "workflow")]
pub const WORKER_SHUTDOWN_GRACE_MS_BRIDGE: Whole = Whole {
    meaning: "time requests in progress may take after SIGTERM, in ms",
    ..own::WORKER_SHUTDOWN_GRACE_MS
};
/// `OTEL_EXPORTER_OTLP_ENDPOINT` of `workflow-bridge`.
#[cfg(feature = "workflow")]
pub const OTEL_EXPORTER_OTLP_ENDPOINT_BRIDGE: Text = Text {
    meaning: "export the span of each request (protobuf, to <URL>/v1/traces), in its caller's trace",
    ..crate::traces::OTEL_EXPORTER_OTLP_ENDPOINT
};
/// `OTEL_SERVICE_NAME` of `workflow-bridge`.
#[cfg(feature = "workflow")]
pub const OTEL_SERVICE_NAME_BRIDGE: Text = Text {
    default: crate::BRIDGE_BINARY,
    ..crate::traces::OTEL_SERVICE_NAME
};

/// Every variable the binary of `group` reads, in the order `--help`
/// lists them.
#[must_use]
pub fn variables(group: Group) -> Vec<Variable> {
    use outbox_dispatch as dispatch;
    let http_addr = match group {
        Group::General => own::WORKER_HTTP_ADDR,
        Group::Mail => WORKER_HTTP_ADDR_MAIL,
    };
    // The console is worker-general's only.
    let console: Vec<Variable> = match group {
        Group::General => vec![
            own::OUTBOX_CONSOLE_TOKENS.into(),
            own::OUTBOX_CONSOLE_ADDR.into(),
        ],
        Group::Mail => Vec::new(),
    };
    let mut list: Vec<Variable> = vec![
        outbox_pg::DATABASE_URL.into(),
        outbox_queue::REDIS_URL.into(),
        outbox_queue::REDIS_CA_CERT.into(),
        #[cfg(feature = "mail")]
        outbox_subscriber_mail::SMTP_URL.into(),
        #[cfg(feature = "mail")]
        outbox_subscriber_mail::MAIL_FROM.into(),
        own::WORKER_QUEUE_GROUP.into(),
        http_addr.into(),
        outbox_queue::OUTBOX_QUEUE_PREFIX.into(),
        dispatch::OUTBOX_ROUTES_FILE.into(),
        own::OUTBOX_DISPATCHER_ENABLED.into(),
        own::OUTBOX_WAKEUPS.into(),
        dispatch::OUTBOX_DISPATCH_INTERVAL_MS.into(),
        dispatch::OUTBOX_DISPATCH_BATCH_SIZE.into(),
        dispatch::OUTBOX_DISPATCH_CONCURRENCY.into(),
        dispatch::OUTBOX_DISPATCH_LOOPS.into(),
        dispatch::OUTBOX_DISPATCH_LOOPS_TOTAL.into(),
        dispatch::OUTBOX_DISPATCH_VACUUM_EVERY.into(),
        dispatch::OUTBOX_MAX_RETRIES.into(),
        dispatch::OUTBOX_LOCK_TIMEOUT_MS.into(),
        dispatch::OUTBOX_UNROUTED_GRACE_SECONDS.into(),
        dispatch::OUTBOX_DONE_RETENTION_HOURS.into(),
        dispatch::OUTBOX_DONE_RETENTION_BATCH_SIZE.into(),
        own::OUTBOX_DONE_RETENTION_INTERVAL_MS.into(),
        outbox_subscriber::WORKER_CONCURRENCY.into(),
        outbox_subscriber::WORKER_RETRIES.into(),
        outbox_subscriber::WORKER_HEARTBEAT_MS.into(),
        outbox_subscriber::WORKER_POLL_INTERVAL_MS.into(),
        own::WORKER_SHUTDOWN_GRACE_MS.into(),
        DATABASE_POOL_SIZE_WORKERS.into(),
        #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
        outbox_subscriber_webhook::WEBHOOK_TIMEOUT_MS.into(),
        outbox_http_guard::WEBHOOK_ALLOW_PRIVATE_ADDRESSES.into(),
        outbox_http_guard::OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS.into(),
        #[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
        outbox_subscriber_webhook::DELIVERY_LEASE_MS.into(),
        own::WORKER_GAUGE_INTERVAL_MS.into(),
        dispatch::OUTBOX_REDIS_CHECK_INTERVAL_MS.into(),
        own::OUTBOX_ALLOW_REDIS_EVICTION.into(),
        outbox_queue::QUEUE_DONE_RETENTION_HOURS.into(),
        own::DELIVERY_RECORD_TTL_HOURS.into(),
        own::QUEUE_DEAD_RETENTION_HOURS.into(),
        #[cfg(feature = "workflow")]
        outbox_workflow_bridge::executor::WORKFLOW_EXECUTOR.into(),
        #[cfg(feature = "workflow")]
        outbox_workflow_bridge::executor::WORKFLOW_BRIDGE_URL.into(),
        #[cfg(feature = "workflow")]
        outbox_workflow_bridge::WORKFLOW_BRIDGE_SECRET.into(),
        #[cfg(feature = "workflow")]
        outbox_workflow_store::sweep::WORKFLOW_RUN_LEASE_MS.into(),
        #[cfg(feature = "workflow")]
        outbox_workflow_store::sweep::WORKFLOW_SWEEP_INTERVAL_MS.into(),
        crate::LOG_FORMAT.into(),
        crate::error_reports::SENTRY_DSN.into(),
        crate::traces::OTEL_EXPORTER_OTLP_ENDPOINT.into(),
        crate::traces::OTEL_SERVICE_NAME.into(),
    ];
    // After WORKER_HTTP_ADDR, the other address.
    let after = list
        .iter()
        .position(|v| v.name() == own::WORKER_HTTP_ADDR.name)
        .map_or(list.len(), |i| i + 1);
    list.splice(after..after, console);
    list
}

/// Every variable `workflow-bridge` reads, in the order its `--help`
/// lists them (feature `workflow`).
#[cfg(feature = "workflow")]
#[must_use]
pub fn bridge_variables() -> Vec<Variable> {
    vec![
        outbox_pg::DATABASE_URL.into(),
        outbox_workflow_bridge::WORKFLOW_BRIDGE_ADDR.into(),
        WORKFLOW_BRIDGE_SECRET_BRIDGE.into(),
        outbox_workflow_bridge::WORKFLOW_BRIDGE_PREVIOUS_SECRET.into(),
        outbox_pg::DATABASE_POOL_SIZE.into(),
        WEBHOOK_ALLOW_PRIVATE_ADDRESSES_BRIDGE.into(),
        OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS_BRIDGE.into(),
        WORKER_SHUTDOWN_GRACE_MS_BRIDGE.into(),
        outbox_workflow_store::sweep::WORKFLOW_RUN_LEASE_MS.into(),
        crate::LOG_FORMAT.into(),
        OTEL_EXPORTER_OTLP_ENDPOINT_BRIDGE.into(),
        OTEL_SERVICE_NAME_BRIDGE.into(),
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
#[cfg(feature = "workflow")]
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
/// prints the version (feature `workflow`).
#[cfg(feature = "workflow")]
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
// The lists as the binaries read them: the default features.
#[cfg(feature = "default")]
mod tests;
