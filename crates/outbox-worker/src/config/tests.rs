//! The configuration read from a map: defaults, refused values, the
//! messages naming them, and URLs without their passwords.

use super::*;
use std::collections::HashMap;

fn read(group: Group, vars: &[(&str, &str)]) -> Result<WorkerConfig, ConfigError> {
    let mut map: HashMap<String, String> = [
        ("DATABASE_URL", "postgres://x/y"),
        ("REDIS_URL", "redis://x"),
        ("SMTP_URL", "smtp://x:25"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (k, v) in vars {
        map.insert((*k).to_owned(), (*v).to_owned());
    }
    WorkerConfig::from_lookup(group, &|name| map.get(name).cloned())
}

const LIST: &str = "OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS";

/// The allow-list becomes the policy of every group; a malformed item
/// stops start-up naming the variable and the item, even when
/// `WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true` would allow everything anyway.
#[test]
fn the_allow_list_sets_the_address_policy_and_a_bad_item_is_named() {
    for group in [Group::General, Group::Mail] {
        let config = read(group, &[(LIST, " crm.internal, 10.20.0.0/16 ")]).unwrap();
        assert_eq!(
            config.address_policy,
            AddressPolicy::AllowListed("crm.internal,10.20.0.0/16".parse().unwrap())
        );
        let all = read(
            group,
            &[
                (LIST, "crm.internal"),
                ("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "true"),
            ],
        )
        .unwrap();
        assert_eq!(all.address_policy, AddressPolicy::AllowInternal);
    }
    for (value, item) in [
        (
            "crm.internal,10.0.0.0/33",
            "\"10.0.0.0/33\" is not a CIDR range",
        ),
        ("crm.internal,,10.0.0.0/8", "item 2 is empty"),
        (
            "https://crm.internal/",
            "\"https://crm.internal/\" is not a host name",
        ),
    ] {
        for flag in ["false", "true"] {
            let error = read(
                Group::General,
                &[(LIST, value), ("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", flag)],
            )
            .unwrap_err();
            assert_eq!(error.variable, LIST);
            assert_eq!(error.value, value);
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("invalid configuration: {LIST}=")),
                "{message}"
            );
            assert!(message.contains(item), "{message}");
        }
    }
}

#[test]
fn defaults_follow_the_contract() {
    let config = read(Group::General, &[]).unwrap();
    assert!(!config.dispatcher_enabled);
    // The one deliberate deviation: 500, not 100 (measured; see
    // `outbox_dispatch::DEFAULT_BATCH_SIZE`).
    assert_eq!(config.dispatcher.batch_size, 500);
    assert_eq!(config.dispatcher.concurrency, 10);
    assert_eq!(config.dispatcher.max_retries, 6);
    assert_eq!(
        config.dispatcher.lock_timeout,
        Duration::from_millis(300_000)
    );
    assert_eq!(config.dispatcher.interval, Duration::from_millis(1000));
    assert_eq!(config.retention.retention, Duration::from_secs(720 * 3600));
    assert_eq!(config.retention.batch_size, 1000);
    // Scrapeable from outside a container, one port per binary.
    assert_eq!(config.http_addr, "0.0.0.0:9464".parse().unwrap());
    assert_eq!(
        read(Group::Mail, &[]).unwrap().http_addr,
        "0.0.0.0:9465".parse().unwrap()
    );
    assert!(!config.allow_redis_eviction);
    assert!(config.wakeups && config.dispatcher.listen);
    // Webhooks, plugin calls and workflow HTTP blocks may not reach
    // loopback, private or link-local addresses unless told.
    assert_eq!(config.address_policy, AddressPolicy::PublicOnly);
    assert_eq!(
        read(Group::Mail, &[]).unwrap().address_policy,
        AddressPolicy::PublicOnly
    );
    assert_eq!(
        read(Group::Mail, &[("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "true")])
            .unwrap()
            .address_policy,
        AddressPolicy::AllowInternal
    );
    assert_eq!(config.redis_check_interval, Duration::from_secs(10));
    assert_eq!(
        read(Group::General, &[("OUTBOX_REDIS_CHECK_INTERVAL_MS", "50")])
            .unwrap_err()
            .variable,
        "OUTBOX_REDIS_CHECK_INTERVAL_MS"
    );
    assert!(
        read(Group::Mail, &[("OUTBOX_ALLOW_REDIS_EVICTION", "true")])
            .unwrap()
            .allow_redis_eviction
    );
}

#[test]
fn deduplication_must_outlive_every_way_back() {
    let defaults = read(Group::General, &[]).unwrap();
    assert_eq!(
        defaults.queue_done_retention,
        Duration::from_secs(24 * 3600)
    );
    assert_eq!(defaults.delivery_record_ttl, Duration::from_secs(48 * 3600));
    // Lease 5 min + 6 retries (1..32 min backoff, each under a new lease).
    assert!(defaults.dispatcher.repush_window() < defaults.queue_done_retention);

    let short = read(Group::General, &[("QUEUE_DONE_RETENTION_HOURS", "1")]).unwrap_err();
    assert_eq!(short.variable, "QUEUE_DONE_RETENTION_HOURS");
    let text = short.to_string();
    assert!(
        text.contains("OUTBOX_LOCK_TIMEOUT_MS") && text.contains("OUTBOX_MAX_RETRIES"),
        "{text}"
    );
    assert!(!text.contains("  "), "one space between words: {text:?}");
    // A long lease pushes the window past the default retention too.
    let lease = read(Group::General, &[("OUTBOX_LOCK_TIMEOUT_MS", "86400000")]).unwrap_err();
    assert_eq!(lease.variable, "QUEUE_DONE_RETENTION_HOURS");
    assert!(
        read(
            Group::General,
            &[
                ("OUTBOX_MAX_RETRIES", "0"),
                ("QUEUE_DONE_RETENTION_HOURS", "1")
            ]
        )
        .is_ok(),
        "without retries the lease alone must be covered"
    );

    let forgetful = read(
        Group::Mail,
        &[
            ("QUEUE_DONE_RETENTION_HOURS", "72"),
            ("DELIVERY_RECORD_TTL_HOURS", "48"),
        ],
    )
    .unwrap_err();
    assert_eq!(forgetful.variable, "DELIVERY_RECORD_TTL_HOURS");
    assert!(
        forgetful
            .to_string()
            .contains("QUEUE_DONE_RETENTION_HOURS (72)"),
        "{forgetful}"
    );
    assert!(
        !forgetful.to_string().contains("  "),
        "one space between words: {forgetful}"
    );
}

#[test]
fn wakeups_off_means_polling_only() {
    let config = read(Group::General, &[("OUTBOX_WAKEUPS", "false")]).unwrap();
    assert!(!config.wakeups);
    assert!(!config.dispatcher.listen);
}

#[test]
fn bad_values_name_their_variable() {
    let cases: &[(&str, &str, &str)] = &[
        ("OUTBOX_QUEUE_PREFIX", "adopt-app", "must end with ':'"),
        ("OUTBOX_DISPATCH_BATCH_SIZE", "0", "between"),
        ("OUTBOX_DISPATCH_BATCH_SIZE", "lots", "whole number"),
        ("OUTBOX_DISPATCH_INTERVAL_MS", "-5", "whole number"),
        ("OUTBOX_DISPATCHER_ENABLED", "maybe", "true or false"),
        ("OUTBOX_ALLOW_REDIS_EVICTION", "perhaps", "true or false"),
        ("OUTBOX_WAKEUPS", "sometimes", "true or false"),
        ("WORKER_QUEUE_GROUP", "billing", "general or mail"),
        ("WORKER_QUEUE_GROUP", "mail", "runs the general group"),
        ("WORKER_HTTP_ADDR", "nine", "host:port"),
        ("OUTBOX_DONE_RETENTION_BATCH_SIZE", "x", "whole number"),
        ("WORKER_HEARTBEAT_MS", "500", "between"),
        ("SMTP_URL", "bogus://x", "not smtp"),
        ("SMTP_URL", "smtp://", "no host"),
        ("MAIL_FROM", "not an address", "not a mail address"),
        ("REDIS_URL", "notaurl", "not a Redis URL"),
        ("DATABASE_URL", "mysql://x/y", "postgres://"),
        (
            "WORKER_SHUTDOWN_GRACE_MS",
            "120000",
            "shorter than 4 heartbeats",
        ),
    ];
    for (variable, value, problem) in cases {
        let err = read(Group::General, &[(variable, value)]).unwrap_err();
        assert_eq!(err.variable, *variable);
        assert!(err.to_string().contains(problem), "{err}");
    }
    assert_eq!(
        read(Group::General, &[("DATABASE_URL", "")])
            .unwrap_err()
            .variable,
        "DATABASE_URL"
    );
}

#[test]
fn passwords_in_urls_never_show() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "DATABASE_URL",
            "mysql://app:s3cr3t-db-pw@db/x",
            "mysql://app:***@db/x",
        ),
        (
            "REDIS_URL",
            "redis://:s3cr3t-redis-pw@cache:notaport",
            "redis://:***@cache:notaport",
        ),
        (
            "SMTP_URL",
            "bogus://mailer:s3cr3t-smtp-pw@mail",
            "bogus://mailer:***@mail",
        ),
    ];
    for (variable, value, shown) in cases {
        let err = read(Group::Mail, &[(variable, value)]).unwrap_err();
        assert_eq!(err.variable, *variable);
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains("s3cr3t"), "{text}");
            assert!(text.contains(shown), "{text}");
        }
    }
    let config = read(
        Group::Mail,
        &[
            ("DATABASE_URL", "postgres://app:s3cr3t-db-pw@db/x"),
            ("REDIS_URL", "redis://:s3cr3t-redis-pw@cache:6379"),
            ("SMTP_URL", "smtps://mailer:s3cr3t-smtp-pw@mail"),
        ],
    )
    .unwrap();
    assert_eq!(config.database_url, "postgres://app:s3cr3t-db-pw@db/x");
    let debug = format!("{config:?}");
    assert!(!debug.contains("s3cr3t"), "{debug}");
    for shown in [
        "postgres://app:***@db/x",
        "redis://:***@cache:6379",
        "smtps://mailer:***@mail",
    ] {
        assert!(debug.contains(shown), "{debug}");
    }
}

#[test]
fn retention_batch_is_clamped_and_mail_needs_smtp() {
    let config = read(
        Group::General,
        &[("OUTBOX_DONE_RETENTION_BATCH_SIZE", "50000")],
    )
    .unwrap();
    assert_eq!(config.retention.batch_size, 10_000);
    let err = WorkerConfig::from_lookup(Group::Mail, &|name| match name {
        "DATABASE_URL" => Some("postgres://x/y".into()),
        "REDIS_URL" => Some("redis://x".into()),
        _ => None,
    })
    .unwrap_err();
    assert_eq!(err.variable, "SMTP_URL");
}

#[test]
fn the_workflow_executor_is_native_unless_told_and_a_bridge_mode_needs_the_bridge() {
    let config = read(Group::General, &[]).unwrap();
    assert_eq!(config.workflow_executor, ExecutorMode::Native);
    assert!(config.workflow_bridge.is_none());
    let secret = "s".repeat(32);
    for mode in ["hybrid", "http"] {
        let missing = read(Group::General, &[("WORKFLOW_EXECUTOR", mode)]).unwrap_err();
        assert_eq!(missing.variable, "WORKFLOW_BRIDGE_URL");
        assert!(missing.problem.contains(mode), "{missing}");
        let no_secret = read(
            Group::General,
            &[
                ("WORKFLOW_EXECUTOR", mode),
                ("WORKFLOW_BRIDGE_URL", "http://bridge:8787"),
            ],
        )
        .unwrap_err();
        assert_eq!(no_secret.variable, "WORKFLOW_BRIDGE_SECRET");
        let config = read(
            Group::General,
            &[
                ("WORKFLOW_EXECUTOR", mode),
                ("WORKFLOW_BRIDGE_URL", "http://bridge:8787"),
                ("WORKFLOW_BRIDGE_SECRET", &secret),
            ],
        )
        .unwrap();
        assert_eq!(config.workflow_executor.as_str(), mode);
        let debug = format!("{config:?}");
        assert!(
            debug.contains("bridge:8787") && !debug.contains(&secret),
            "{debug}"
        );
    }
    let bad = read(Group::General, &[("WORKFLOW_EXECUTOR", "remote")]).unwrap_err();
    assert_eq!(bad.variable, "WORKFLOW_EXECUTOR");
    assert!(bad.problem.contains("native, hybrid or http"), "{bad}");
    let weak = read(Group::General, &[("WORKFLOW_BRIDGE_SECRET", "short")]).unwrap_err();
    assert_eq!(weak.variable, "WORKFLOW_BRIDGE_SECRET");
    assert!(!weak.to_string().contains("short"), "{weak}");
    let url = read(Group::General, &[("WORKFLOW_BRIDGE_URL", "bridge:8787")]).unwrap_err();
    assert_eq!(url.variable, "WORKFLOW_BRIDGE_URL");
}

#[test]
fn the_bridge_listens_on_loopback_by_default_and_needs_a_strong_secret() {
    let secret = "s".repeat(32);
    let read_bridge = |vars: &[(&str, &str)]| {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        BridgeConfig::from_lookup(&|name| map.get(name).cloned())
    };
    let base = [
        ("DATABASE_URL", "postgres://x/y"),
        ("WORKFLOW_BRIDGE_SECRET", secret.as_str()),
    ];
    let config = read_bridge(&base).unwrap();
    assert!(config.addr.ip().is_loopback());
    assert_eq!(config.address_policy, AddressPolicy::PublicOnly);
    let listed = read_bridge(&[base[0], base[1], (LIST, "crm.internal")]).unwrap();
    assert_eq!(
        listed.address_policy,
        AddressPolicy::AllowListed("crm.internal".parse().unwrap())
    );
    let bad = read_bridge(&[base[0], base[1], (LIST, "crm.internal,")]).unwrap_err();
    assert_eq!(bad.variable, LIST);
    assert_eq!(config.addr, DEFAULT_BRIDGE_ADDR.parse().unwrap());
    assert_eq!(config.secrets.len(), 1);
    assert!(!format!("{config:?}").contains(&secret));
    let missing = read_bridge(&base[..1]).unwrap_err();
    assert_eq!(missing.variable, "WORKFLOW_BRIDGE_SECRET");
    let weak = read_bridge(&[base[0], ("WORKFLOW_BRIDGE_SECRET", "short")]).unwrap_err();
    assert_eq!(weak.variable, "WORKFLOW_BRIDGE_SECRET");
    let rotated = read_bridge(&[
        base[0],
        base[1],
        ("WORKFLOW_BRIDGE_PREVIOUS_SECRET", &"p".repeat(40)),
    ])
    .unwrap();
    assert_eq!(rotated.secrets.len(), 2);
    let addr =
        read_bridge(&[base[0], base[1], ("WORKFLOW_BRIDGE_ADDR", "everywhere")]).unwrap_err();
    assert_eq!(addr.variable, "WORKFLOW_BRIDGE_ADDR");
}
