//! The walk of the definitions the binaries list: each is read, listed
//! once, documented, in range, and the libraries' defaults; `--help`
//! lines and flags.

use std::cell::RefCell;

use outbox_dispatch::{
    OUTBOX_DISPATCH_BATCH_SIZE, OUTBOX_DISPATCH_CONCURRENCY, OUTBOX_DISPATCH_INTERVAL_MS,
    OUTBOX_DISPATCH_LOOPS, OUTBOX_DISPATCH_LOOPS_TOTAL, OUTBOX_DISPATCH_VACUUM_EVERY,
    RedisGuardSettings, RetentionConfig,
};
use outbox_subscriber::{WORKER_HEARTBEAT_MS, WorkerSettings};
use outbox_subscriber_mail::SmtpSettings;
use outbox_subscriber_webhook::{DeliverySettings, OnceSettings};

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
/// a binary that lists it, documented in `docs/operations/configuration.md`, listed
/// once, and a whole number's default lies within its range.
#[test]
fn every_definition_is_read_documented_once_and_its_default_in_range() {
    let docs = include_str!("../../../../docs/operations/configuration.md");
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
            "{name} is not in docs/operations/configuration.md"
        );
        assert!(variable.default_in_range(), "{variable:?}");
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
    assert_eq!(config.pool_size, outbox_pg::DEFAULT_POOL_SIZE);
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
        OUTBOX_DISPATCH_LOOPS_TOTAL,
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
            "WORKFLOW_BRIDGE_SECRET" | "WORKFLOW_BRIDGE_PREVIOUS_SECRET" => Some("k".repeat(32)),
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
