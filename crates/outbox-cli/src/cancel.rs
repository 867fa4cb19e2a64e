//! `outbox cancel ID…`: PENDING or FAILED rows to CANCELLED, with a history
//! entry each (`outbox_event_requeue`, action `cancel`), so that `outbox
//! show` tells who cancelled what and why, and `outbox requeue` can bring
//! the row back. PROCESSING (a dispatcher holds it) and DONE (already
//! handed off) rows are refused: the policy and the statement are
//! `outbox_operator::cancel`'s, shared with the console.

use anyhow::Context;
use clap::Args;
use outbox_model::OutboxStatus;
use outbox_operator::cancel::{execute, refusal};
use serde::Serialize;
use uuid::Uuid;

use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// Default of `--reason`.
const DEFAULT_REASON: &str = "cancelled by operator";

/// Arguments of `outbox cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The event ids (one or more).
    #[arg(required = true)]
    pub ids: Vec<Uuid>,
    /// Why, kept in the row's history.
    #[arg(long, default_value = DEFAULT_REASON)]
    pub reason: String,
    /// Show what would be cancelled; change nothing.
    #[arg(long)]
    pub dry_run: bool,
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
