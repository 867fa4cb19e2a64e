//! The operations files in `deploy/` stay true to the code: every metric an
//! alert rule reads is one the processes export, and every runbook link
//! points at a section of `docs/operations.md`.

use outbox_worker::catalog::METRICS;

const ALERTS: &str = include_str!("../../../deploy/prometheus-alerts.yml");
const RUNBOOK: &str = include_str!("../../../docs/operations.md");

/// The metric names in a PromQL expression (series suffixes removed).
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("outbox_") || word.starts_with("workflow_bridge_"))
        .map(|word| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix))
                .unwrap_or(word)
                .to_owned()
        })
        .collect()
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
            let names = metric_names(expr);
            assert!(!names.is_empty(), "no metric in {expr}");
            for name in names {
                assert!(
                    METRICS.iter().any(|(n, _, _)| *n == name),
                    "{name} (in {expr}) is not exported"
                );
            }
            alerts += 1;
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
