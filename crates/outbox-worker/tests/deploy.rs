//! The operations files in `deploy/` stay true to the code: every metric an
//! alert rule or the dashboard reads is one the processes export, every
//! runbook link points at a section of `docs/operations.md`, the rules pass
//! their `promtool` unit tests, and the compose file runs the image's
//! binaries with variables the workers read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;

use outbox_worker::catalog::METRICS;
use outbox_worker::{Group, WorkerConfig};
use serde_yaml::Value;

const ALERTS: &str = include_str!("../../../deploy/prometheus-alerts.yml");
const RUNBOOK: &str = include_str!("../../../docs/operations.md");
const DASHBOARD: &str = include_str!("../../../deploy/grafana-dashboard.json");
const DOCKERFILE: &str = include_str!("../../../deploy/Dockerfile");
const COMPOSE: &str = include_str!("../../../deploy/compose.yml");
const PROMETHEUS: &str = include_str!("../../../deploy/prometheus.yml");

/// Variables the processes read outside [`WorkerConfig`] (logging, error
/// reports).
const PROCESS_VARIABLES: &[&str] = &["LOG_FORMAT", "RUST_LOG", "SENTRY_DSN"];

fn deploy_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy"))
}

/// The metric names in a PromQL expression (series suffixes removed).
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("outbox_") || word.starts_with("workflow_"))
        .map(|word| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix))
                .unwrap_or(word)
                .to_owned()
        })
        .collect()
}

/// The metrics `expr` reads; fails unless it reads some and each is in the
/// catalog.
fn exported_metrics_of(expr: &str) -> Vec<String> {
    let names = metric_names(expr);
    assert!(!names.is_empty(), "no metric in {expr}");
    for name in &names {
        assert!(
            METRICS.iter().any(|(n, _, _)| n == name),
            "{name} (in {expr}) is not exported"
        );
    }
    names
}

/// GitHub's anchor of a heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' => Some(c),
            ' ' => Some('-'),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_reads_exported_metrics_and_links_a_runbook_section() {
    let anchors: Vec<String> = RUNBOOK
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let mut alerts = 0;
    for line in ALERTS.lines().map(str::trim) {
        if let Some(expr) = line.strip_prefix("expr:") {
            exported_metrics_of(expr);
            alerts += 1;
        }
        if let Some(name) = line.strip_prefix("- alert:") {
            let row = format!("| `{}` |", name.trim());
            assert!(
                RUNBOOK.contains(&row),
                "the runbook's alert table has no {row}"
            );
        }
        if let Some(link) = line.strip_prefix("runbook:") {
            let target = link.trim().trim_matches('"');
            let (file, section) = target.split_once('#').unwrap_or((target, ""));
            assert_eq!(file, "docs/operations.md", "{line}");
            assert!(
                anchors.iter().any(|a| a == section),
                "no section #{section} in docs/operations.md"
            );
        }
    }
    assert!(alerts >= 8, "only {alerts} alerts");
}

#[test]
fn metric_names_are_found_in_expressions() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, rate(outbox_dispatch_handoff_latency_seconds_bucket[5m])) > 5"
        ),
        ["outbox_dispatch_handoff_latency_seconds"]
    );
    assert_eq!(
        anchor(" Pending alert: the dispatcher is behind"),
        "pending-alert-the-dispatcher-is-behind"
    );
}

#[test]
fn every_dashboard_query_reads_exported_metrics_and_the_dashboard_covers_the_issue_panels() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let mut queried = BTreeSet::new();
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            queried.extend(exported_metrics_of(target["expr"].as_str().unwrap()));
        }
    }
    for wanted in [
        "outbox_dispatch_dispatched_total",
        "outbox_queue_backlog",
        "outbox_dispatch_handoff_latency_seconds",
        "outbox_subscriber_commit_to_start_seconds",
        "outbox_queue_dead",
        "outbox_dispatch_failed_total",
    ] {
        assert!(queried.contains(wanted), "the dashboard shows no {wanted}");
    }
}

#[test]
fn the_alert_rules_pass_their_promtool_unit_tests() {
    let Ok(output) = std::process::Command::new("promtool")
        .arg("test")
        .arg("rules")
        .arg("prometheus-alerts.test.yml")
        .current_dir(deploy_dir())
        .output()
    else {
        println!(
            "skipped: promtool is not on PATH (install Prometheus' promtool to run the rule tests)"
        );
        return;
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

/// The binaries the Dockerfile builds (`--bin NAME`).
fn image_binaries() -> BTreeSet<String> {
    let words: Vec<&str> = DOCKERFILE.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "--bin")
        .map(|w| w[1].to_owned())
        .collect()
}

/// Every variable `WorkerConfig` reads for `group`, found by reading a
/// configuration through a lookup that records the names it is asked for.
fn variables_read(group: Group, values: &[(String, String)]) -> (BTreeSet<String>, String) {
    let asked = RefCell::new(BTreeSet::new());
    let result = WorkerConfig::from_lookup(group, &|name| {
        asked.borrow_mut().insert(name.to_owned());
        values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    });
    (asked.into_inner(), format!("{result:?}"))
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

#[test]
fn compose_runs_the_image_binaries_with_variables_the_workers_read() {
    let compose: Value = serde_yaml::from_str(COMPOSE).unwrap();
    let mut compose = compose;
    compose.apply_merge().unwrap();
    let services = compose["services"].as_mapping().unwrap();
    let binaries = image_binaries();
    for required in ["worker-general", "worker-mail", "outbox"] {
        assert!(
            binaries.contains(required),
            "the image lacks {required}: {binaries:?}"
        );
    }
    for needed in [
        "postgres",
        "redis",
        "worker-general",
        "worker-mail",
        "mailcatcher",
        "prometheus",
    ] {
        assert!(
            services.contains_key(needed),
            "compose has no service {needed}"
        );
    }
    let mut workers = 0;
    for (name, service) in services {
        let name = text(name);
        if service["image"].as_str() != Some("outbox:local") {
            continue;
        }
        let command: Vec<String> = service["command"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{name} has no command"))
            .iter()
            .map(text)
            .collect();
        assert!(
            binaries.contains(&command[0]),
            "{name} runs {command:?}, not in the image"
        );
        let env: Vec<(String, String)> = service["environment"]
            .as_mapping()
            .unwrap()
            .iter()
            .map(|(k, v)| (text(k), text(v)))
            .collect();
        let group = match command[0].as_str() {
            "worker-general" => Group::General,
            "worker-mail" => Group::Mail,
            _ => continue,
        };
        let (read, result) = variables_read(group, &env);
        assert!(
            result.starts_with("Ok("),
            "{name}'s environment does not configure it: {result}"
        );
        for (variable, _) in &env {
            assert!(
                read.contains(variable) || PROCESS_VARIABLES.contains(&variable.as_str()),
                "{name} sets {variable}, which the worker does not read"
            );
        }
        // Prometheus scrapes it on the port it serves /metrics on.
        let port = env
            .iter()
            .find(|(n, _)| n == "WORKER_HTTP_ADDR")
            .and_then(|(_, v)| v.rsplit(':').next())
            .unwrap_or_else(|| panic!("{name} sets no WORKER_HTTP_ADDR"))
            .to_owned();
        assert!(
            PROMETHEUS.contains(&format!("{name}:{port}")),
            "Prometheus does not scrape {name}:{port}"
        );
        workers += 1;
    }
    assert_eq!(workers, 2, "worker-general and worker-mail");
    let prometheus = &services["prometheus"];
    let mounts: Vec<String> = prometheus["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert!(
        mounts
            .iter()
            .any(|m| m.starts_with("./prometheus-alerts.yml:")),
        "Prometheus does not load the alert rules: {mounts:?}"
    );
    docker_compose_config();
}

/// `docker compose config` validates the file against the compose schema,
/// where docker has the compose plugin.
fn docker_compose_config() {
    let plugin = std::process::Command::new("docker")
        .args(["compose", "version"])
        .output();
    match plugin {
        Ok(output) if output.status.success() => {}
        Ok(_) => {
            println!("skipped docker compose config: docker has no compose plugin here");
            return;
        }
        Err(e) => {
            println!("skipped docker compose config: cannot run docker ({e})");
            return;
        }
    }
    let output = std::process::Command::new("docker")
        .args(["compose", "-f", "compose.yml", "config", "--quiet"])
        .current_dir(deploy_dir())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "docker compose config: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
