//! The bench's chart: an SVG drawn from the JSON lines of the run (no
//! plotting library), with hand-off throughput per configuration against
//! its baselines, the other throughput figures, the latency
//! percentiles per load on a log scale, and the peers stage's arms (drain
//! rates; p50 and p99 per load). `cargo xtask bench --chart FILE`
//! writes it; sections whose stages did not run are left out.

use std::fmt::Write as _;

use serde_json::Value;

/// One bar.
struct Bar {
    series: &'static str,
    value: f64,
}

/// One labelled row of bars.
struct Row {
    label: String,
    bars: Vec<Bar>,
}

/// One panel of the chart.
struct Section {
    title: String,
    log: bool,
    rows: Vec<Row>,
}

const WIDTH: f64 = 1000.0;
const LABEL_W: f64 = 380.0;
const BAR_W: f64 = 520.0;
const BAR_H: f64 = 14.0;
const COLORS: [&str; 4] = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2"];
const SERIES: [&str; 4] = ["p50", "p95", "p99", "max"];

fn field(line: &Value, name: &str) -> f64 {
    line.get(name).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn named<'a>(lines: &'a [Value], bench: &str) -> impl Iterator<Item = &'a Value> {
    let bench = bench.to_owned();
    lines
        .iter()
        .filter(move |l| l.get("bench").and_then(Value::as_str) == Some(bench.as_str()))
}

fn single(label: impl Into<String>, value: f64) -> Row {
    Row {
        label: label.into(),
        bars: vec![Bar { series: "", value }],
    }
}

/// The chart's panels, each left out when its stages did not run.
fn sections(lines: &[Value]) -> Vec<Section> {
    [
        (
            "Throughput, events per second (medians of the run)",
            false,
            throughput_rows(lines),
        ),
        (
            "Business transactions per second, 8 clients",
            false,
            publish_rows(lines),
        ),
        (
            "Commit → handler start, milliseconds (log scale): p50, p95, p99, max",
            true,
            latency_rows(lines),
        ),
        (
            "Peers: a backlog of no-op jobs drained, jobs per second (medians)",
            false,
            peer_drain_rows(lines),
        ),
        (
            "Peers: commit → handler entry, milliseconds (log scale): p50, p99 (medians)",
            true,
            peer_latency_rows(lines),
        ),
    ]
    .into_iter()
    .filter(|(_, _, rows)| !rows.is_empty())
    .map(|(title, log, rows)| Section {
        title: title.into(),
        log,
        rows,
    })
    .collect()
}

/// A binary's label after a row's name, none for the tree under test.
fn binary_label(line: &Value) -> String {
    match line.get("binary").and_then(Value::as_str) {
        Some("this") | None => String::new(),
        Some(label) => format!(" [{label}]"),
    }
}

/// Hand-off against its baselines, the audit drain and retention.
fn throughput_rows(lines: &[Value]) -> Vec<Row> {
    let mut throughput = Vec::new();
    let mut sql_only = f64::NAN;
    for base in named(lines, "handoff_baselines_median") {
        sql_only = field(base, "sql_only_per_second");
        throughput.push(single("baseline: SQL-only claim-and-DONE", sql_only));
        throughput.push(single(
            "baseline: Redis-only push",
            field(base, "redis_only_per_second"),
        ));
    }
    for m in named(lines, "handoff_median") {
        let rate = field(m, "per_second");
        throughput.push(single(
            format!(
                "hand-off: {} × worker-general{}, batch {} ({:.2} of SQL-only)",
                field(m, "processes"),
                binary_label(m),
                field(m, "batch_size"),
                rate / sql_only
            ),
            rate,
        ));
    }
    for d in named(lines, "drain_audit") {
        throughput.push(single(
            format!("drain through the audit subscriber{}", binary_label(d)),
            field(d, "per_second"),
        ));
    }
    for r in named(lines, "retention") {
        throughput.push(single(
            "hand-off, retention idle",
            field(r, "without_per_second"),
        ));
        throughput.push(single(
            format!(
                "hand-off, retention deleting ({:.2} of idle)",
                field(r, "ratio")
            ),
            field(r, "with_per_second"),
        ));
    }
    throughput
}

/// The publisher's overhead on a business transaction.
fn publish_rows(lines: &[Value]) -> Vec<Row> {
    named(lines, "publish_overhead")
        .flat_map(|p| {
            [
                single("business transaction alone", field(p, "bare_per_second")),
                single(
                    format!(
                        "business transaction + one event, no dispatcher waiting ({:.2})",
                        field(p, "ratio")
                    ),
                    field(p, "with_event_per_second"),
                ),
                single(
                    format!(
                        "+ one event, a dispatcher waiting: each commit notifies ({:.2})",
                        field(p, "ratio_dispatcher_waiting")
                    ),
                    field(p, "with_event_dispatcher_waiting_per_second"),
                ),
                single(
                    format!(
                        "+ the event row by one plain INSERT ({:.2})",
                        field(p, "ratio_sql_only")
                    ),
                    field(p, "with_event_sql_only_per_second"),
                ),
                single(
                    format!(
                        "+ that row into the table without its CHECKs ({:.2})",
                        field(p, "ratio_sql_only_unchecked")
                    ),
                    field(p, "with_event_sql_only_unchecked_per_second"),
                ),
            ]
        })
        .collect()
}

/// The latency percentiles per offered load.
fn latency_rows(lines: &[Value]) -> Vec<Row> {
    named(lines, "latency_ms")
        .map(|l| Row {
            label: format!(
                "{} events/s offered ({} achieved), {}",
                field(l, "offered_per_second"),
                field(l, "achieved_per_second"),
                if l.get("wakeups").and_then(Value::as_bool) == Some(true) {
                    "wake-ups on"
                } else {
                    "polling only"
                }
            ),
            bars: SERIES
                .iter()
                .map(|s| Bar {
                    series: s,
                    value: field(l, s),
                })
                .collect(),
        })
        .collect()
}

/// How the peers stage's arms read in a row's label.
fn arm_label(arm: &str) -> String {
    match arm {
        "this" => "this project (its path includes the Redis hand-off)".to_owned(),
        "river_defaults" => "River, defaults (1,000 workers)".to_owned(),
        "river_low_latency" => "River, 1 ms fetch cooldown (100 workers)".to_owned(),
        other => other.to_owned(),
    }
}

/// Each arm's drain rate, from the peers stage's summary.
fn peer_drain_rows(lines: &[Value]) -> Vec<Row> {
    named(lines, "peers_summary")
        .filter_map(|s| s.get("arms").and_then(Value::as_object))
        .flat_map(|arms| {
            arms.iter()
                .map(|(arm, figures)| single(arm_label(arm), field(figures, "drain_per_second")))
        })
        .collect()
}

/// Each arm's p50 and p99 per load, from the peers stage's summary.
fn peer_latency_rows(lines: &[Value]) -> Vec<Row> {
    let mut rows = Vec::new();
    for arms in
        named(lines, "peers_summary").filter_map(|s| s.get("arms").and_then(Value::as_object))
    {
        for (arm, figures) in arms {
            let Some(loads) = figures.get("latency_ms").and_then(Value::as_object) else {
                continue;
            };
            // The summary's keys are text ("2000" sorts before "500"):
            // the loads go in numeric order.
            let mut loads: Vec<_> = loads.iter().collect();
            loads.sort_by_key(|(load, _)| load.parse::<u64>().unwrap_or(u64::MAX));
            for (load, at) in loads {
                rows.push(Row {
                    label: format!("{}, {load} jobs/s", arm_label(arm)),
                    bars: ["p50", "p99"]
                        .into_iter()
                        .map(|series| Bar {
                            series,
                            value: field(at, series),
                        })
                        .collect(),
                });
            }
        }
    }
    rows
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn number(value: f64) -> String {
    if !value.is_finite() {
        "n/a".into()
    } else if value >= 100.0 {
        let whole = value.round() as i64;
        let digits = whole.to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(c);
        }
        grouped
    } else {
        format!("{value:.1}")
    }
}

/// Where `value` ends on a bar of `BAR_W`, for a section whose values run
/// up to `max` (and, on a log scale, down from `min`).
fn scale(value: f64, min: f64, max: f64, log: bool) -> f64 {
    if !value.is_finite() || value <= 0.0 {
        return 0.0;
    }
    if log {
        let (lo, hi) = (
            min.log10().floor(),
            max.log10().ceil().max(min.log10().floor() + 1.0),
        );
        ((value.log10() - lo) / (hi - lo) * BAR_W).clamp(1.0, BAR_W)
    } else {
        value / max * BAR_W
    }
}

/// The SVG of the figures in `lines` under `title`; `None` when no stage
/// that the chart shows has run.
pub fn render(lines: &[Value], title: &str) -> Option<String> {
    let sections = sections(lines);
    if sections.is_empty() {
        return None;
    }
    let mut body = String::new();
    let mut y = 40.0;
    for section in &sections {
        y = draw_section(&mut body, section, y) + 20.0;
    }
    Some(format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="20" font-size="14" font-weight="bold">{}</text>
{body}</svg>
"#,
        escape(title)
    ))
}

/// Draws `section` into `body` from the height `y`; returns the height
/// below it.
fn draw_section(body: &mut String, section: &Section, mut y: f64) -> f64 {
    let values: Vec<f64> = section
        .rows
        .iter()
        .flat_map(|r| r.bars.iter().map(|b| b.value))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let max = values.iter().copied().fold(f64::MIN_POSITIVE, f64::max);
    let min = values.iter().copied().fold(max, f64::min);
    let _ = writeln!(
        body,
        r#"<text x="10" y="{y}" font-weight="bold">{}</text>"#,
        escape(&section.title)
    );
    y += 12.0;
    if section.log {
        let (lo, hi) = (min.log10().floor() as i32, max.log10().ceil() as i32);
        for decade in lo..=hi.max(lo + 1) {
            let v = 10f64.powi(decade);
            let x = LABEL_W + scale(v, min, max, true);
            let _ = writeln!(
                body,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" stroke="#ccc"/><text x="{x:.1}" y="{}" font-size="10" text-anchor="middle">{}</text>"##,
                y + 8.0,
                y + 10.0
                    + section
                        .rows
                        .iter()
                        .map(|r| r.bars.len() as f64 * BAR_H + 8.0)
                        .sum::<f64>(),
                y + 6.0,
                number(v)
            );
        }
        y += 10.0;
    }
    for row in &section.rows {
        let height = row.bars.len() as f64 * BAR_H;
        let _ = writeln!(
            body,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            LABEL_W - 8.0,
            y + height / 2.0 + 4.0,
            escape(&row.label)
        );
        for (i, bar) in row.bars.iter().enumerate() {
            let w = scale(bar.value, min, max, section.log);
            let color = COLORS[i % COLORS.len()];
            let by = y + i as f64 * BAR_H;
            let _ = writeln!(
                body,
                r#"<rect x="{LABEL_W}" y="{by}" width="{w:.1}" height="{}" fill="{color}"/><text x="{:.1}" y="{}" font-size="11">{}{}</text>"#,
                BAR_H - 2.0,
                LABEL_W + w + 4.0,
                by + BAR_H - 4.0,
                if bar.series.is_empty() {
                    String::new()
                } else {
                    format!("{} ", bar.series)
                },
                number(bar.value)
            );
        }
        y += height + 8.0;
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn draws_the_sections_whose_stages_ran() {
        let lines = [
            json!({"bench": "handoff_baselines_median", "sql_only_per_second": 70000.0, "redis_only_per_second": 110000.0}),
            json!({"bench": "handoff_median", "binary": "this", "batch_size": 500, "processes": 2, "per_second": 28000.0}),
            json!({"bench": "latency_ms", "wakeups": true, "offered_per_second": 500, "achieved_per_second": 498, "p50": 2.1, "p95": 4.0, "p99": 6.5, "max": 30.0}),
        ];
        let svg = render(&lines, "run").unwrap();
        assert!(svg.contains("2 × worker-general, batch 500 (0.40 of SQL-only)"));
        assert!(svg.contains("70,000"));
        assert!(svg.contains("500 events/s offered (498 achieved), wake-ups on"));
        assert!(!svg.contains("Business transactions"));
        assert!(render(&[], "run").is_none());
    }

    #[test]
    fn draws_the_peers_drain_rates_and_their_p50_and_p99_per_load() {
        let lines = [json!({"bench": "peers_summary", "arms": {
            "river_low_latency": {"drain_per_second": 7397.0,
                                  "latency_ms": {"500": {"p50": 2.55, "p99": 7.83}}},
            "this": {"drain_per_second": 15000.0,
                     "latency_ms": {"500": {"p50": 1.5, "p99": 4.2}}},
        }})];
        let svg = render(&lines, "run").unwrap();
        assert!(svg.contains("Peers: a backlog of no-op jobs drained"));
        assert!(svg.contains("River, 1 ms fetch cooldown (100 workers)"));
        assert!(svg.contains("7,397"));
        assert!(svg.contains("this project (its path includes the Redis hand-off), 500 jobs/s"));
        assert!(svg.contains("p99 7.8"));
    }

    #[test]
    fn the_peers_loads_are_drawn_in_numeric_order() {
        let lines = [json!({"bench": "peers_summary", "arms": {
            "this": {"drain_per_second": 15000.0,
                     "latency_ms": {"2000": {"p50": 5.0, "p99": 29.0},
                                    "500": {"p50": 2.2, "p99": 8.6}}},
        }})];
        let svg = render(&lines, "run").unwrap();
        let at = |load: &str| svg.find(&format!("{load} jobs/s")).unwrap();
        assert!(at(", 500") < at(", 2000"), "{svg}");
    }
}
