//! `cargo xtask explain`: `EXPLAIN ANALYZE` of every statement of a
//! dispatcher tick at several batch sizes, before and after the batch-size
//! fix, on a scratch table of due rows.
//!
//! Each case runs in a transaction that is rolled back: the claim of the
//! batch (for the outcome statements), the statistics state, the plan cache
//! mode, then `PREPARE` and `EXPLAIN (ANALYZE, BUFFERS) EXECUTE` of the
//! statement with the batch's values. The table is vacuumed between cases so
//! every case starts from the same state. Prints a Markdown table on stdout
//! (progress on stderr): per case the fastest of `--repeat` runs, the time
//! per row, the shared buffers touched and the plan's shape, with `×n` on a
//! node that ran `n` times.

use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use diesel::QueryableByName;
use diesel::sql_types::{Json, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_store as db;
use serde_json::Value;

use crate::bench::handoff::HANDOFF_TYPES;
use crate::bench::kit::{Scratch, preload_pending};
use crate::services;

const DB: &str = "outbox_explain";

/// Options of `cargo xtask explain`.
#[derive(Args)]
pub struct ExplainArgs {
    /// Due `PENDING` rows in the scratch table.
    #[arg(long, default_value_t = 50_000)]
    rows: usize,
    /// Batch sizes (claim `LIMIT`, rows per outcome statement).
    #[arg(long, value_delimiter = ',', default_values_t = [100, 500, 1000, 5000])]
    sizes: Vec<usize>,
    /// Runs per case; the fastest is reported (the machine is shared).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Only the statements whose name starts with this (`claim`, `done`,
    /// `retry`, `failed`, `release`).
    #[arg(long)]
    only: Option<String>,
    /// Only the `before` or the `after` formulations.
    #[arg(long)]
    variant: Option<String>,
}

/// The statements as they were before the batch-size fix (commit 6932ce2):
/// the claim joined its CTE back by id and gave each row its own
/// `clock_timestamp()` lease; the outcome statements joined an `unnest` of
/// per-row arrays.
mod before {
    pub const CLAIM: &str = "\
WITH due AS (
    SELECT id FROM outbox_event
    WHERE status IN ('PENDING', 'PROCESSING')
      AND (CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END) <= now()
    ORDER BY (CASE WHEN status = 'PENDING' THEN scheduled_at ELSE locked_until END)
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_event e
SET status = 'PROCESSING',
    locked_until = clock_timestamp() + make_interval(secs => $2 / 1000.0)
FROM due
WHERE e.id = due.id
RETURNING e.*";

    pub const DONE: &str = "UPDATE outbox_event e
         SET status = 'DONE', processed_at = now(), locked_until = NULL,
             last_error = NULL, target_queue = v.queue
         FROM unnest($1::uuid[], $2::timestamptz[], $3::text[]) AS v(id, lease, queue)
         WHERE e.id = v.id AND e.status = 'PROCESSING' AND e.locked_until = v.lease
         RETURNING e.id";

    pub const RETRY: &str = "UPDATE outbox_event e
         SET status = 'PENDING', retries = e.retries + 1, locked_until = NULL,
             scheduled_at = now() + make_interval(secs => v.delay_ms / 1000.0),
             last_error = v.error, target_queue = v.queue
         FROM unnest($1::uuid[], $2::timestamptz[], $3::bigint[], $4::text[], $5::text[])
              AS v(id, lease, delay_ms, error, queue)
         WHERE e.id = v.id AND e.status = 'PROCESSING' AND e.locked_until = v.lease
         RETURNING e.id";

    pub const FAILED: &str = "UPDATE outbox_event e
         SET status = 'FAILED', retries = e.retries + v.increment, locked_until = NULL,
             last_error = v.error, target_queue = v.queue, failed_at = now()
         FROM unnest($1::uuid[], $2::timestamptz[], $3::int[], $4::text[], $5::text[])
              AS v(id, lease, increment, error, queue)
         WHERE e.id = v.id AND e.status = 'PROCESSING' AND e.locked_until = v.lease
         RETURNING e.id";

    pub const RELEASE: &str = "UPDATE outbox_event e
         SET status = 'PENDING', locked_until = NULL
         FROM unnest($1::uuid[], $2::timestamptz[]) AS v(id, lease)
         WHERE e.id = v.id AND e.status = 'PROCESSING' AND e.locked_until = v.lease
         RETURNING e.id";
}

const QUEUE: &str = "outbox.mail";
const ERROR: &str = "hand-off to outbox.mail failed: connection refused";

/// The rows a case's claim took, as SQL text, ordered by id.
struct Claimed {
    ids: Vec<String>,
    leases: Vec<String>,
}

fn array(items: &[String], ty: &str) -> String {
    let mut out = String::from("'{");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "\"{item}\"");
    }
    let _ = write!(out, "}}'::{ty}[]");
    out
}

/// One statement of the tick in one formulation.
struct Statement {
    name: &'static str,
    variant: &'static str,
    sql: &'static str,
    /// What the statement binds after the ids and the lease(s): value and
    /// type; empty for the claim. Before the fix each was an array with one
    /// element per row; after it a scalar, except a `jsonb` one, which maps
    /// every id to the value.
    values: &'static [(&'static str, &'static str)],
}

impl Statement {
    fn is_claim(&self) -> bool {
        self.name == "claim"
    }

    /// The claim that makes the rows `PROCESSING` before an outcome statement.
    fn setup(&self) -> Option<&'static str> {
        match (self.is_claim(), self.variant) {
            (true, _) => None,
            (false, "before") => Some(before::CLAIM),
            (false, _) => Some(db::CLAIM_SQL),
        }
    }

    /// `PREPARE` parameter types.
    fn types(&self) -> String {
        if self.is_claim() {
            return "bigint, bigint".to_owned();
        }
        if self.variant == "before" {
            let mut types = "uuid[], timestamptz[]".to_owned();
            for (_, ty) in self.values {
                let ty = if *ty == "jsonb" { "text" } else { ty };
                let _ = write!(types, ", {ty}[]");
            }
            return types;
        }
        let mut types = "uuid[], timestamptz".to_owned();
        for (_, ty) in self.values {
            let _ = write!(types, ", {ty}");
        }
        types
    }

    /// The `EXECUTE` arguments for a batch of `n`.
    fn args(&self, claimed: Option<&Claimed>, n: usize) -> String {
        let Some(c) = claimed else {
            return format!("{n}, 300000");
        };
        let mut args = array(&c.ids, "uuid");
        if self.variant == "before" {
            let _ = write!(args, ", {}", array(&c.leases, "timestamptz"));
            for (value, ty) in self.values {
                let ty = if *ty == "jsonb" { "text" } else { ty };
                let _ = write!(args, ", {}", array(&vec![(*value).to_owned(); n], ty));
            }
        } else {
            // The claim gives every row the same lease.
            let _ = write!(args, ", '{}'::timestamptz", c.leases[0]);
            for (value, ty) in self.values {
                if *ty == "jsonb" {
                    let map: serde_json::Map<String, serde_json::Value> = c
                        .ids
                        .iter()
                        .map(|id| (id.clone(), serde_json::Value::from(*value)))
                        .collect();
                    let _ = write!(args, ", '{}'::jsonb", serde_json::Value::Object(map));
                } else {
                    let _ = write!(args, ", '{value}'::{ty}");
                }
            }
        }
        args
    }
}

const DONE_VALUES: &[(&str, &str)] = &[(QUEUE, "jsonb")];
const RETRY_VALUES: &[(&str, &str)] = &[("60000", "bigint"), (ERROR, "text"), (QUEUE, "text")];
// The before statement leaves the last (unrouted) parameter unused.
const FAILED_VALUES: &[(&str, &str)] = &[
    ("1", "int"),
    (ERROR, "text"),
    (QUEUE, "text"),
    ("false", "boolean"),
];

fn statements() -> Vec<Statement> {
    let pair = |name, values, old, new| {
        [
            Statement {
                name,
                variant: "before",
                sql: old,
                values,
            },
            Statement {
                name,
                variant: "after",
                sql: new,
                values,
            },
        ]
    };
    [
        pair("claim", &[][..], before::CLAIM, db::CLAIM_SQL),
        pair("done", DONE_VALUES, before::DONE, db::DONE_SQL),
        pair("retry", RETRY_VALUES, before::RETRY, db::RETRY_SQL),
        pair("failed", FAILED_VALUES, before::FAILED, db::FAILED_SQL),
        pair("release", &[][..], before::RELEASE, db::RELEASE_SQL),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The planner's statistics when the statement runs.
#[derive(Clone, Copy)]
enum Stats {
    /// `ANALYZE` just before the statement (after the batch's claim).
    Fresh,
    /// The statistics of the loaded table: every row `PENDING`, none
    /// `PROCESSING` (what the planner knew before the dispatcher started).
    Stale,
    /// No column statistics at all (a table never analyzed).
    None,
}

impl Stats {
    fn name(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Stale => "stale",
            Self::None => "none",
        }
    }
    fn sql(self) -> &'static str {
        match self {
            Self::Fresh => "ANALYZE outbox_event",
            Self::Stale => "",
            Self::None => {
                "DELETE FROM pg_statistic WHERE starelid = 'outbox_event'::regclass
                    OR starelid IN (SELECT indexrelid FROM pg_index
                                    WHERE indrelid = 'outbox_event'::regclass)"
            }
        }
    }
}

#[derive(QueryableByName)]
struct ClaimedRow {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    lease: String,
}

#[derive(QueryableByName)]
struct PlanJson {
    #[diesel(sql_type = Json, column_name = "QUERY PLAN")]
    plan: Value,
}

/// One measured case.
struct Measured {
    ms: f64,
    buffers: u64,
    rows: u64,
    shape: String,
}

/// Runs the comparison and prints the table.
pub async fn run(args: ExplainArgs) -> Result<()> {
    if args.repeat == 0 || args.sizes.is_empty() {
        bail!("--repeat and --sizes need at least one");
    }
    let found = services::ensure().await?;
    let scratch = Scratch::create(&found.database_url, DB).await?;
    let mut conn = outbox_pg::establish(&scratch.url).await?;
    eprintln!("explain: loading {} PENDING rows", args.rows);
    preload_pending(&mut conn, args.rows, &HANDOFF_TYPES).await?;

    let version: Vec<PlanLine> = diesel::sql_query("SELECT version() AS line")
        .load(&mut conn)
        .await?;
    println!(
        "{} PENDING rows; {}; fastest of {} run(s) per case.\n",
        args.rows,
        version.iter().map(|v| v.line.as_str()).next().unwrap_or(""),
        args.repeat
    );
    println!("| statement | variant | batch | stats | plan | ms | µs/row | buffers | plan shape |");
    println!("|---|---|---:|---|---|---:|---:|---:|---|");
    let started = Instant::now();
    for statement in statements().into_iter().filter(|s| selected(&args, s)) {
        for &n in &args.sizes {
            for stats in [Stats::Fresh, Stats::Stale, Stats::None] {
                for mode in ["custom", "generic"] {
                    eprintln!(
                        "explain: {} {} batch {n} stats {} plan {mode} ({:.0} s so far)",
                        statement.name,
                        statement.variant,
                        stats.name(),
                        started.elapsed().as_secs_f64()
                    );
                    let at = Case {
                        statement: &statement,
                        n,
                        stats,
                        mode,
                    };
                    let m = fastest(&mut conn, &at, args.repeat).await?;
                    println!("{}", table_row(&at, &m));
                }
            }
        }
    }
    drop(conn);
    scratch.remove().await
}

/// Whether `--only` and `--variant` keep `statement`.
fn selected(args: &ExplainArgs, statement: &Statement) -> bool {
    let by_name = args
        .only
        .as_deref()
        .is_none_or(|only| statement.name.starts_with(only));
    let by_variant = args
        .variant
        .as_deref()
        .is_none_or(|v| v == statement.variant);
    by_name && by_variant
}

/// One case of the comparison: a statement at a batch size, statistics
/// state and plan cache mode.
struct Case<'a> {
    statement: &'a Statement,
    n: usize,
    stats: Stats,
    mode: &'static str,
}

/// The fastest of `repeat` runs of the case `at` (one run when it is
/// slow); fails unless it updated `n` rows.
async fn fastest(conn: &mut AsyncPgConnection, at: &Case<'_>, repeat: usize) -> Result<Measured> {
    let Case {
        statement,
        n,
        stats,
        mode,
    } = *at;
    let mut best: Option<Measured> = None;
    for _ in 0..repeat {
        let m = case(conn, statement, n, stats, mode).await?;
        let slow = m.ms > 1000.0;
        if best.as_ref().is_none_or(|b| m.ms < b.ms) {
            best = Some(m);
        }
        if slow {
            break; // one run of a slow case says enough
        }
    }
    let m = best.context("no run")?;
    if m.rows != n as u64 {
        bail!(
            "{} {} batch {n}: updated {} rows",
            statement.name,
            statement.variant,
            m.rows
        );
    }
    Ok(m)
}

/// The Markdown table row of the case `at` measured as `m`.
fn table_row(at: &Case<'_>, m: &Measured) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {} | {} |",
        at.statement.name,
        at.statement.variant,
        at.n,
        at.stats.name(),
        at.mode,
        m.ms,
        m.ms * 1000.0 / at.n as f64,
        m.buffers,
        m.shape
    )
}

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text)]
    line: String,
}

async fn case(
    conn: &mut AsyncPgConnection,
    statement: &Statement,
    n: usize,
    stats: Stats,
    mode: &str,
) -> Result<Measured> {
    conn.batch_execute("VACUUM outbox_event").await?;
    conn.batch_execute(&format!(
        "BEGIN; SET LOCAL plan_cache_mode = force_{mode}_plan"
    ))
    .await?;
    let result = async {
        let claimed = match statement.setup() {
            Some(claim) => {
                let sql = claim.replace("$1", &n.to_string()).replace("$2", "300000");
                conn.batch_execute(&sql).await?;
                let rows: Vec<ClaimedRow> = diesel::sql_query(
                    "SELECT id::text AS id, locked_until::text AS lease FROM outbox_event
                     WHERE status = 'PROCESSING' ORDER BY id",
                )
                .load(conn)
                .await?;
                Some(Claimed {
                    ids: rows.iter().map(|r| r.id.clone()).collect(),
                    leases: rows.into_iter().map(|r| r.lease).collect(),
                })
            }
            None => None,
        };
        if !stats.sql().is_empty() {
            conn.batch_execute(stats.sql()).await?;
        }
        conn.batch_execute(&format!(
            "PREPARE explain_case({}) AS {}",
            statement.types(),
            statement.sql
        ))
        .await?;
        let explain = format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE explain_case({})",
            statement.args(claimed.as_ref(), n)
        );
        let plan: Vec<PlanJson> = diesel::sql_query(explain).load(conn).await?;
        let plan = plan
            .into_iter()
            .next()
            .context("EXPLAIN returned nothing")?;
        Ok::<_, anyhow::Error>(plan.plan)
    }
    .await;
    conn.batch_execute("ROLLBACK").await?;
    conn.batch_execute("DEALLOCATE explain_case").await.ok();
    let plan = result?;
    let root = &plan[0];
    let top = &root["Plan"];
    Ok(Measured {
        ms: root["Execution Time"].as_f64().unwrap_or(f64::NAN),
        buffers: top["Shared Hit Blocks"].as_u64().unwrap_or(0)
            + top["Shared Read Blocks"].as_u64().unwrap_or(0),
        rows: top["Actual Rows"].as_u64().unwrap_or(0),
        shape: shape(top),
    })
}

/// The plan as a compact tree: node type, the relation or index it reads,
/// `×n` when it ran `n > 1` times; children in parentheses.
fn shape(node: &Value) -> String {
    let kind = node["Node Type"].as_str().unwrap_or("?");
    let mut out = match kind {
        "ModifyTable" => node["Operation"].as_str().unwrap_or(kind).to_owned(),
        _ => kind.to_owned(),
    };
    if let Some(index) = node["Index Name"].as_str() {
        let _ = write!(out, " {}", index.trim_start_matches("outbox_event_"));
    } else if let Some(relation) = node["Relation Name"].as_str() {
        if kind != "ModifyTable" {
            let _ = write!(out, " {relation}");
        }
    } else if let Some(function) = node["Function Name"].as_str() {
        let _ = write!(out, " {function}");
    }
    let loops = node["Actual Loops"].as_u64().unwrap_or(1);
    if loops > 1 {
        let _ = write!(out, " ×{loops}");
    }
    if let Some(children) = node["Plans"].as_array() {
        let inner: Vec<String> = children.iter().map(shape).collect();
        let _ = write!(out, " ({})", inner.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(only: Option<&str>, variant: Option<&str>) -> ExplainArgs {
        ExplainArgs {
            rows: 10,
            sizes: vec![100],
            repeat: 1,
            only: only.map(str::to_owned),
            variant: variant.map(str::to_owned),
        }
    }

    #[test]
    fn only_and_variant_select_the_statements() {
        let all = statements();
        let kept = |a: &ExplainArgs| all.iter().filter(|s| selected(a, s)).count();
        assert_eq!(kept(&args(None, None)), all.len());
        let claims = kept(&args(Some("claim"), None));
        assert!(claims > 0 && claims < all.len());
        assert_eq!(kept(&args(Some("claim"), Some("after"))) * 2, claims);
        assert_eq!(kept(&args(Some("nothing"), None)), 0);
    }

    #[test]
    fn a_row_gives_the_time_per_row() {
        let all = statements();
        let at = Case {
            statement: &all[0],
            n: 500,
            stats: Stats::Fresh,
            mode: "generic",
        };
        let m = Measured {
            ms: 2.0,
            buffers: 7,
            rows: 500,
            shape: "Update".to_owned(),
        };
        assert_eq!(
            table_row(&at, &m),
            format!(
                "| {} | {} | 500 | {} | generic | 2.0 | 4.0 | 7 | Update |",
                all[0].name,
                all[0].variant,
                Stats::Fresh.name()
            )
        );
    }
}
