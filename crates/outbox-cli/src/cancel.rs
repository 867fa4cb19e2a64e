//! `outbox cancel ID…` or `outbox cancel <filters>`: PENDING or FAILED
//! rows to CANCELLED, with a history entry each (`outbox_event_requeue`,
//! action `cancel`), so that `outbox show` tells who cancelled what and
//! why, and `outbox requeue` can bring the row back. PROCESSING (a
//! dispatcher holds it) and DONE (already handed off) rows are refused: the
//! policy and the statements are `outbox_operator::cancel`'s, shared with
//! the console. By filters, it counts first and is guarded like `outbox
//! requeue`: more than `--confirm-above` rows need `--yes` (without it
//! nothing changes and the exit status is 2), and it cancels in batches.

use anyhow::{Context, anyhow};
use clap::Args;
use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use outbox_operator::cancel::bulk::{self, DEFAULT_BATCH_SIZE, Request};
use outbox_operator::cancel::{execute, refusal};
use outbox_operator::confirm::{DEFAULT_CONFIRM_ABOVE, needs_confirmation};
use serde::Serialize;
use uuid::Uuid;

use crate::filters::Filters;
use crate::render::thousands;
use crate::{Cli, ExitStatus, Failure, Outcome, connect, print_json};

/// Rows a cancel by filters lists (to cancel, and refused) before it only
/// counts them.
const SHOWN_ROWS: u64 = 100;

/// Default of `--reason`.
const DEFAULT_REASON: &str = "cancelled by operator";

/// Arguments of `outbox cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The event ids (one or more), instead of filters.
    pub ids: Vec<Uuid>,
    /// Without ids, the rows these select (at least one filter; PENDING and FAILED rows are cancelled, the others refused).
    #[command(flatten)]
    pub filters: Filters,
    /// Cancel at most this many rows, oldest first [default: every matching row].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Why, kept in the row's history.
    #[arg(long, default_value = DEFAULT_REASON)]
    pub reason: String,
    /// Show what would be cancelled; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Confirm a cancel by filters of more rows than --confirm-above.
    #[arg(long, conflicts_with = "ids")]
    pub yes: bool,
    /// A cancel by filters that would change more rows than this needs --yes; without it, it changes nothing and exits 2.
    #[arg(long, default_value_t = DEFAULT_CONFIRM_ABOVE, conflicts_with = "ids")]
    pub confirm_above: u64,
    /// Rows cancelled per statement (by filters), each with its history rows.
    #[arg(long, default_value_t = DEFAULT_BATCH_SIZE, value_parser = clap::value_parser!(u64).range(1..=10_000), conflicts_with = "ids")]
    pub batch_size: u64,
}

/// One row of the report.
#[derive(Debug, Serialize)]
struct Row {
    id: Uuid,
    /// The status before (absent: no such row).
    status: Option<OutboxStatus>,
    /// Why it is left alone, when it is.
    refused: Option<String>,
}

/// Runs `outbox cancel`.
pub async fn run(cli: &Cli, args: &CancelArgs) -> Outcome {
    let by_ids = !args.ids.is_empty();
    if by_ids && (!args.filters.is_empty() || args.limit.is_some()) {
        return Err(Failure::from(anyhow!(
            "give either ids or filters (and --limit), not both"
        )));
    }
    if !by_ids {
        if args.filters.is_empty() {
            return Err(Failure::from(anyhow!(
                "name the events to cancel: their ids, or at least one filter (--status, --type-prefix, --tenant, --created-after, …); --limit alone selects every event"
            )));
        }
        return by_filters(cli, args).await;
    }
    let mut conn = connect(cli).await?;
    let found: Vec<(Uuid, OutboxStatus)> = outbox_store::statuses(&mut conn, &args.ids)
        .await
        .context("cannot read the rows")?;
    let rows: Vec<Row> = args
        .ids
        .iter()
        .map(|id| {
            let status = found.iter().find(|(f, _)| f == id).map(|(_, s)| *s);
            Row {
                id: *id,
                status,
                refused: match status {
                    None => Some("no such event".to_owned()),
                    Some(status) => refusal(status).map(str::to_owned),
                },
            }
        })
        .collect();
    let wanted: Vec<Uuid> = rows
        .iter()
        .filter(|r| r.refused.is_none())
        .map(|r| r.id)
        .collect();
    let cancelled = if args.dry_run || wanted.is_empty() {
        Vec::new()
    } else {
        let requested_by = std::env::var("USER").ok();
        execute(&mut conn, &wanted, &args.reason, requested_by.as_deref())
            .await
            .context("cannot cancel")?
    };
    if cli.json {
        print_json(&serde_json::json!({
            "dry_run": args.dry_run,
            "rows": rows,
            "cancelled": cancelled,
        }))?;
    } else {
        print(&rows, &cancelled, args.dry_run);
    }
    let changed = if args.dry_run {
        wanted.len()
    } else {
        cancelled.len()
    };
    Ok(ExitStatus::alert_if(changed == 0))
}

fn print(rows: &[Row], cancelled: &[Uuid], dry_run: bool) {
    for row in rows {
        let status = row.status.map_or("-", OutboxStatus::as_str);
        match &row.refused {
            Some(why) => println!("{}  {status:<10}  left alone: {why}", row.id),
            None if dry_run => println!("{}  {status:<10}  would be cancelled", row.id),
            None if cancelled.contains(&row.id) => {
                println!("{}  {status:<10}  cancelled", row.id);
            }
            None => println!("{}  {status:<10}  left alone: changed meanwhile", row.id),
        }
    }
    if dry_run {
        println!("dry run: nothing changed");
    } else {
        println!("{} row(s) cancelled", cancelled.len());
    }
}

/// What a cancel by filters reports (`--json`).
#[derive(Debug, Default, Serialize)]
struct FilterReport {
    dry_run: bool,
    /// Rows matching the filters, whatever their status.
    matching: u64,
    /// Rows cancelled, or that a dry run would cancel.
    to_cancel: u64,
    /// Matching rows the policy refuses.
    refused_count: u64,
    /// The first rows (at most [`SHOWN_ROWS`] to cancel and as many refused).
    rows: Vec<Row>,
    /// Every row cancelled (none in a dry run).
    cancelled: Vec<Uuid>,
    /// Statements committed.
    batches: usize,
}

/// Rows by filters: count, guard, preview, then batches.
async fn by_filters(cli: &Cli, args: &CancelArgs) -> Outcome {
    let mut conn = connect(cli).await?;
    let filter = args.filters.selection();
    let selection = bulk::select(&mut conn, &filter, args.limit).await?;
    if !args.dry_run && !args.yes && needs_confirmation(selection.to_cancel, args.confirm_above) {
        return Err(Failure::from(anyhow!(
            "refusing to cancel {} rows without --yes ({} matching; more than --confirm-above {}): \
             look at them with --dry-run, then run again with --yes, or narrow the filters or pass --limit",
            thousands(selection.to_cancel),
            thousands(selection.matching),
            thousands(args.confirm_above)
        )));
    }
    let mut report = FilterReport {
        dry_run: args.dry_run,
        matching: selection.matching,
        to_cancel: selection.to_cancel,
        refused_count: selection.refused(),
        rows: preview(&mut conn, &filter, &selection).await?,
        ..FilterReport::default()
    };
    if !args.dry_run {
        let requested_by = std::env::var("USER").ok();
        let done = bulk::run(
            &mut conn,
            &filter,
            &Request {
                reason: &args.reason,
                requested_by: requested_by.as_deref(),
                total: selection.to_cancel,
                batch_size: args.batch_size,
            },
        )
        .await?;
        report.to_cancel = done.ids.len() as u64;
        report.cancelled = done.ids;
        report.batches = done.batches;
    }
    if cli.json {
        print_json(&report)?;
    } else {
        print_filter_report(&report);
    }
    Ok(ExitStatus::alert_if(report.to_cancel == 0))
}

async fn preview(
    conn: &mut AsyncPgConnection,
    filter: &outbox_store::EventFilter,
    selection: &bulk::Selection,
) -> Result<Vec<Row>, Failure> {
    Ok(bulk::preview(conn, filter, selection, SHOWN_ROWS)
        .await?
        .into_iter()
        .map(|shown| Row {
            id: shown.row.id,
            status: Some(shown.row.status),
            refused: shown.refused.map(str::to_owned),
        })
        .collect())
}

fn print_filter_report(report: &FilterReport) {
    for row in &report.rows {
        let status = row.status.map_or("-", OutboxStatus::as_str);
        match &row.refused {
            Some(why) => println!("{}  {status:<10}  left alone: {why}", row.id),
            None if report.dry_run => println!("{}  {status:<10}  would be cancelled", row.id),
            None if report.cancelled.contains(&row.id) => {
                println!("{}  {status:<10}  cancelled", row.id);
            }
            None => println!("{}  {status:<10}  left alone: changed meanwhile", row.id),
        }
    }
    let verb = if report.dry_run {
        "would be cancelled (dry run: nothing changed)"
    } else {
        "cancelled"
    };
    println!(
        "{} of {} matching row(s) {verb}; {} refused",
        thousands(report.to_cancel),
        thousands(report.matching),
        thousands(report.refused_count)
    );
}
