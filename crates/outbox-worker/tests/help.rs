//! The worker binaries and `workflow-bridge` describe themselves: `--help`
//! lists every variable with its default, accepted values and meaning,
//! `--version` prints the version, and neither starts anything (no
//! database or Redis is needed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use outbox_worker::Group;
use outbox_worker::variables::{bridge_variables, variables};

const GENERAL: &str = env!("CARGO_BIN_EXE_worker-general");
const MAIL: &str = env!("CARGO_BIN_EXE_worker-mail");
const BRIDGE: &str = env!("CARGO_BIN_EXE_workflow-bridge");
const OPERATIONS: &str = include_str!("../../../docs/operations/configuration.md");

/// Runs `binary args` with an empty environment: (exit code, stdout, stderr).
fn run(binary: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(binary)
        .args(args)
        .env_clear()
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn help_lists_every_variable_with_its_default_and_range_and_starts_nothing() {
    for (binary, group) in [(GENERAL, Group::General), (MAIL, Group::Mail)] {
        let (code, stdout, stderr) = run(binary, &["--help"]);
        assert_eq!(code, Some(0), "{binary}: {stderr}");
        for variable in variables(group) {
            assert!(
                stdout.contains(&format!("[env: {}]", variable.name())),
                "{binary}: {} missing from\n{stdout}",
                variable.name()
            );
            let help = variable.help();
            let default = &help[help.rfind("[default:").unwrap()..];
            assert!(stdout.contains(default), "{binary}: {default} missing");
        }
        assert!(
            stdout.contains("[range: 1..=10000] [default: 500]"),
            "{stdout}"
        );
        assert!(stdout.contains(group.default_http_addr()), "{stdout}");
        assert!(stdout.contains("Exit codes"), "{stdout}");
        assert!(stdout.contains("OTEL_BSP_SCHEDULE_DELAY"), "{stdout}");
    }
}

#[test]
fn help_never_shows_the_environment_s_values() {
    let output = Command::new(GENERAL)
        .arg("--help")
        .env("DATABASE_URL", "postgres://app:s3cr3t-db@db/app")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("[env: DATABASE_URL]"), "{stdout}");
    assert!(!stdout.contains("s3cr3t-db"), "{stdout}");
}

#[test]
fn version_prints_the_binary_and_its_version() {
    for (binary, name) in [(GENERAL, "worker-general"), (MAIL, "worker-mail")] {
        let (code, stdout, _) = run(binary, &["--version"]);
        assert_eq!(code, Some(0));
        assert_eq!(
            stdout.trim(),
            format!("{name} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn an_unknown_flag_exits_2_and_names_it() {
    let (code, _, stderr) = run(GENERAL, &["--frobnicate"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--frobnicate"), "{stderr}");
}

/// The `[default: …]` of a variable's help line.
fn default_of(help: &str) -> &str {
    &help[help.rfind("[default:").unwrap()..]
}

#[test]
fn the_bridge_s_help_lists_each_of_its_variables_with_its_default_and_starts_nothing() {
    // An empty environment: without --help the bridge would exit 2 for the
    // missing DATABASE_URL, so exit 0 means nothing was started.
    let (code, stdout, stderr) = run(BRIDGE, &["--help"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    // Each line names the variable, and its default, on the same line.
    let line_of = |name: &str| {
        stdout
            .lines()
            .find(|line| line.contains(&format!("[env: {name}]")))
            .unwrap_or_else(|| panic!("{name} missing from\n{stdout}"))
            .to_owned()
    };
    let expected = [
        ("DATABASE_URL", "[default: required]"),
        ("WORKFLOW_BRIDGE_ADDR", "[default: 127.0.0.1:8787]"),
        ("WORKFLOW_BRIDGE_SECRET", "[default: required]"),
        ("WORKFLOW_BRIDGE_PREVIOUS_SECRET", "[default: unset"),
        ("DATABASE_POOL_SIZE", "[range: 1..=1000] [default: 10]"),
        ("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "[default: false]"),
        ("OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS", "[default: unset"),
        ("WORKER_SHUTDOWN_GRACE_MS", "[default: 30000]"),
        ("WORKFLOW_RUN_LEASE_MS", "[default: 30000]"),
        ("LOG_FORMAT", "[values: text, json] [default: text]"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "[default: unset"),
        ("OTEL_SERVICE_NAME", "[default: workflow-bridge]"),
    ];
    for (name, default) in expected {
        let line = line_of(name);
        assert!(line.contains(default), "{name}: {default} missing: {line}");
    }
    // The list it prints is the library's, and nothing of the workers'.
    let listed = bridge_variables();
    assert_eq!(listed.len(), expected.len());
    for variable in listed {
        let help = variable.help();
        assert!(line_of(variable.name()).contains(default_of(&help)));
    }
    for absent in ["REDIS_URL", "WORKER_HTTP_ADDR", "SMTP_URL"] {
        assert!(
            !stdout.contains(&format!("[env: {absent}]")),
            "{absent} is not the bridge's: {stdout}"
        );
    }
    assert!(stdout.contains("Exit codes"), "{stdout}");
}

#[test]
fn the_bridge_s_help_never_shows_the_environment_s_values() {
    let output = Command::new(BRIDGE)
        .arg("--help")
        .env_clear()
        .env("WORKFLOW_BRIDGE_SECRET", "s3cr3t-key-s3cr3t-key-s3cr3t-key")
        .env("DATABASE_URL", "postgres://app:s3cr3t-db@db/app")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0));
    assert!(stdout.contains("[env: WORKFLOW_BRIDGE_SECRET]"), "{stdout}");
    assert!(!stdout.contains("s3cr3t"), "{stdout}");
}

#[test]
fn the_bridge_s_version_prints_its_name_and_version() {
    let (code, stdout, stderr) = run(BRIDGE, &["--version"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout.trim(),
        format!("workflow-bridge {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn the_bridge_exits_2_on_an_unknown_flag_and_names_it() {
    let (code, _, stderr) = run(BRIDGE, &["--frobnicate"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("'--frobnicate'"), "{stderr}");
    // Refused by the command line, before the configuration is read.
    assert!(!stderr.contains("invalid configuration"), "{stderr}");
}

#[test]
fn a_bad_bridge_variable_or_flag_exits_2_naming_the_variable() {
    // No server is contacted: the configuration is refused first.
    let database = ("DATABASE_URL", "postgres://127.0.0.1:1/none");
    let secret = ("WORKFLOW_BRIDGE_SECRET", "k".repeat(32));
    type Case = (
        Vec<(&'static str, String)>,
        &'static [&'static str],
        &'static str,
    );
    let cases: [Case; 5] = [
        (vec![], &[], "DATABASE_URL"),
        (
            vec![(database.0, database.1.to_owned())],
            &[],
            "WORKFLOW_BRIDGE_SECRET",
        ),
        (
            vec![
                (database.0, database.1.to_owned()),
                secret.clone(),
                ("WORKFLOW_BRIDGE_ADDR", "everywhere".to_owned()),
            ],
            &[],
            "WORKFLOW_BRIDGE_ADDR",
        ),
        // The flag reaches the configuration as its variable does.
        (
            vec![(database.0, database.1.to_owned()), secret.clone()],
            &["--database-pool-size", "0"],
            "DATABASE_POOL_SIZE",
        ),
        (
            vec![
                (database.0, database.1.to_owned()),
                secret.clone(),
                ("LOG_FORMAT", "yaml".to_owned()),
            ],
            &[],
            "LOG_FORMAT",
        ),
    ];
    for (env, args, variable) in cases {
        let output = Command::new(BRIDGE)
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{env:?} {args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "workflow-bridge: invalid configuration: {variable}="
            )),
            "{env:?} {args:?}: {stderr}"
        );
        assert!(
            !stderr.contains(&"k".repeat(32)),
            "a secret is never echoed"
        );
    }
}

/// The (variable, read by) rows of the configuration table of
/// `docs/operations/configuration.md`.
fn documented_variables() -> Vec<(String, String)> {
    let table = OPERATIONS
        .split("| variable | read by | default | meaning |")
        .nth(1)
        .expect("the configuration table with its read-by column");
    table
        .lines()
        .skip(1)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect()
}

#[test]
fn the_docs_say_which_binary_reads_each_variable() {
    let rows = documented_variables();
    assert!(rows.len() > 20, "{rows:?}");
    let bridge: Vec<String> = bridge_variables()
        .iter()
        .map(|v| v.name().to_owned())
        .collect();
    let workers: Vec<String> = variables(Group::General)
        .iter()
        .map(|v| v.name().to_owned())
        .collect();
    for (name, read_by) in &rows {
        let by: Vec<&str> = read_by.split(", ").collect();
        assert_eq!(
            by.contains(&"bridge"),
            bridge.contains(name),
            "{name}: read by {read_by}"
        );
        assert_eq!(
            by.contains(&"workers"),
            workers.contains(name),
            "{name}: read by {read_by}"
        );
    }
    // Every variable of the bridge is in the table, but DATABASE_URL, which
    // the text before it names.
    for name in &bridge {
        assert!(
            name == "DATABASE_URL" || rows.iter().any(|(row, _)| row == name),
            "{name} is not in the table"
        );
    }
    let before = OPERATIONS.split("| variable | read by |").next().unwrap();
    assert!(before.contains("`workflow-bridge` needs Postgres only: it reads `DATABASE_URL`"));
    assert!(before.contains("`workflow-bridge --help`"));
}

#[test]
fn a_malformed_allow_list_stops_every_binary_with_exit_2_naming_the_variable_and_the_item() {
    // Servers nobody listens on: the configuration is refused before any
    // connection is tried.
    let secret = "k".repeat(32);
    let base = [
        ("DATABASE_URL", "postgres://127.0.0.1:1/none"),
        ("REDIS_URL", "redis://127.0.0.1:1"),
        ("SMTP_URL", "smtp://127.0.0.1:1"),
        ("WORKFLOW_BRIDGE_SECRET", secret.as_str()),
    ];
    let variable = outbox_http_guard::ALLOW_LIST_VARIABLE;
    for binary in [GENERAL, MAIL, BRIDGE] {
        for (value, item) in [
            (
                "crm.internal,10.0.0.0/33",
                "\"10.0.0.0/33\" is not a CIDR range",
            ),
            ("crm.internal,", "item 2 is empty"),
            (
                "http://crm.internal,10.0.0.0/8",
                "\"http://crm.internal\" is not a host name",
            ),
        ] {
            let output = Command::new(binary)
                .env_clear()
                .envs(base)
                .env(variable, value)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{binary} {value}: {stderr}");
            assert!(
                stderr.contains(&format!("invalid configuration: {variable}=")),
                "{binary} {value}: {stderr}"
            );
            assert!(stderr.contains(item), "{binary} {value}: {stderr}");
        }
    }
}
