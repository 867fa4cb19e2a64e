//! `outbox requeue`: its arguments, the run (one id, or filters in
//! batches), and what it prints.

use anyhow::anyhow;
use clap::Args;
use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use serde::Serialize;
use uuid::Uuid;

use super::bulk::{
    self, DEFAULT_BATCH_SIZE, DEFAULT_CONFIRM_ABOVE, MAX_BATCH_SIZE, Request, SHOWN_ROWS, Selection,
};
use super::{Candidate, Plan, PlanRow, execute, plan};
use crate::filters::Filters;
use crate::render::{showing, thousands};
use crate::{Cli, ExitStatus, Failure, Outcome, connect, print_json};

/// Default of `--reason`.
pub const DEFAULT_REASON: &str = "requeued by operator";

/// `outbox requeue` arguments.
#[derive(Args)]
pub struct RequeueArgs {
    /// One event id (instead of filters).
    pub id: Option<Uuid>,
    #[command(flatten)]
    pub filters: Filters,
    /// Requeue at most this many rows, oldest first [default: every matching row].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Also requeue DONE rows: their side effects run again.
    #[arg(long)]
    pub replay: bool,
    /// Show what would change (the first rows and the counts); change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Confirm a requeue of more rows than --confirm-above.
    #[arg(long)]
    pub yes: bool,
    /// A requeue that would change more rows than this (every matching row, or --limit) needs --yes; without it, it changes nothing and exits 2.
    #[arg(long, default_value_t = DEFAULT_CONFIRM_ABOVE)]
    pub confirm_above: u64,
    /// Rows requeued per transaction, each with its history rows and a wake-up of the dispatchers.
    #[arg(long, default_value_t = DEFAULT_BATCH_SIZE, value_parser = clap::value_parser!(u64).range(1..=MAX_BATCH_SIZE))]
    pub batch_size: u64,
    /// Why (kept in the history).
    #[arg(long, default_value = DEFAULT_REASON)]
    pub reason: String,
}

/// What a requeue reports (`--json`), and what its table shows.
#[derive(Debug, Default, Serialize)]
struct Report {
    dry_run: bool,
    /// Rows matching the id or the filters, whatever their status.
    matching: u64,
    /// Rows requeued, or that a dry run would requeue.
    to_requeue: u64,
    /// Matching rows the policy refuses.
    refused_count: u64,
    /// The first rows to requeue (at most [`SHOWN_ROWS`]).
    would_requeue: Vec<PlanRow>,
    /// The first refused rows, with the reason.
    refused: Vec<PlanRow>,
    /// Every row requeued (none in a dry run).
    requeued: Vec<Uuid>,
    /// Transactions committed.
    batches: usize,
    /// DONE rows that started a new delivery generation.
    replayed: usize,
    warning: Option<String>,
}

/// Runs `outbox requeue`.
pub async fn run(cli: &Cli, args: &RequeueArgs) -> Outcome {
    if args.id.is_some() && (!args.filters.is_empty() || args.limit.is_some()) {
        return Err(Failure::from(anyhow!(
            "give either an id or filters (and --limit), not both"
        )));
    }
    let mut conn = connect(cli).await?;
    let requested_by = std::env::var("USER").ok();
    let report = match args.id {
        Some(id) => one(&mut conn, id, args, requested_by.as_deref()).await?,
        None => many(&mut conn, args, requested_by.as_deref()).await?,
    };
    if cli.json {
        print_json(&report)?;
    } else {
        print_table(&report);
    }
    let changed = if args.dry_run {
        report.to_requeue
    } else {
        report.requeued.len() as u64
    };
    Ok(ExitStatus::alert_if(changed == 0))
}

/// One row by id: no count, no guard, one transaction.
async fn one(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    args: &RequeueArgs,
    requested_by: Option<&str>,
) -> Result<Report, Failure> {
    let rows: Vec<Candidate> = outbox_store::candidate(conn, id)
        .await?
        .into_iter()
        .collect();
    let matching = rows.len() as u64;
    let plan = plan(rows, args.replay);
    let mut report = Report {
        dry_run: args.dry_run,
        matching,
        to_requeue: plan.requeue.len() as u64,
        refused_count: plan.refused.len() as u64,
        warning: replay_warning(plan.requeue.iter().filter(|r| r.replay).count(), args),
        ..Report::default()
    };
    if !args.dry_run && !plan.requeue.is_empty() {
        let executed = execute(conn, &plan, &args.reason, requested_by, args.replay).await?;
        report.requeued = executed.requeued;
        report.replayed = executed.replayed;
        report.batches = 1;
    }
    report.would_requeue = plan.requeue;
    report.refused = plan.refused;
    Ok(report)
}

/// Rows by filters: count, guard, preview, then batches.
async fn many(
    conn: &mut AsyncPgConnection,
    args: &RequeueArgs,
    requested_by: Option<&str>,
) -> Result<Report, Failure> {
    let mut filters = args.filters.clone();
    if filters.statuses.is_empty() {
        // Without --status, a bulk requeue means the dead letters.
        filters.statuses = vec![OutboxStatus::Failed];
    }
    let selection: Selection = bulk::select(conn, &filters, args.replay, args.limit).await?;
    if !args.dry_run {
        bulk::confirm(&selection, args.confirm_above, args.yes).map_err(Failure::from)?;
    }
    let Plan { requeue, refused } =
        bulk::preview(conn, &filters, args.replay, &selection, SHOWN_ROWS).await?;
    let mut report = Report {
        dry_run: args.dry_run,
        matching: selection.matching,
        to_requeue: selection.to_requeue,
        refused_count: selection.refused(),
        would_requeue: requeue,
        refused,
        ..Report::default()
    };
    if args.dry_run {
        let replays = if args.replay {
            match filters.selection().only(&[OutboxStatus::Done]) {
                Some(done) => outbox_store::count_events(conn, &done)
                    .await?
                    .min(selection.to_requeue),
                None => 0,
            }
        } else {
            0
        };
        report.warning = replay_warning(usize::try_from(replays).unwrap_or(usize::MAX), args);
        return Ok(report);
    }
    let request = Request {
        reason: &args.reason,
        requested_by,
        replay: args.replay,
        total: selection.to_requeue,
        batch_size: args.batch_size,
    };
    let done = bulk::run(conn, &filters, &request).await?;
    report.to_requeue = done.ids.len() as u64;
    report.requeued = done.ids;
    report.batches = done.batches;
    report.replayed = done.replayed;
    report.warning = replay_warning(done.replayed, args);
    Ok(report)
}

fn replay_warning(replays: usize, args: &RequeueArgs) -> Option<String> {
    let verb = if args.dry_run {
        "would be replayed"
    } else {
        "replayed"
    };
    (replays > 0).then(|| {
        format!(
            "{replays} DONE row(s) {verb}: their side effects (mails, webhooks, …) may run again"
        )
    })
}

fn print_table(report: &Report) {
    let verb = if report.dry_run {
        "would requeue"
    } else {
        "requeue"
    };
    for r in &report.would_requeue {
        println!(
            "{verb} {}  {:<32}  {} → PENDING (retries {} → 0, last error cleared: {})",
            r.id,
            r.event_type,
            r.status,
            r.retries,
            r.last_error.as_deref().unwrap_or("-")
        );
    }
    for r in &report.refused {
        println!(
            "refused {}  {:<32}  {}",
            r.id,
            r.event_type,
            r.refused.as_deref().unwrap_or("")
        );
    }
    if let Some(warning) = &report.warning {
        println!("WARNING: {warning}");
    }
    let shown = (report.would_requeue.len() + report.refused.len()) as u64;
    if let Some(showing) = showing(shown, report.matching) {
        println!("{showing}");
    }
    if report.dry_run {
        println!(
            "dry run: {} row(s) would be requeued, {} refused; nothing changed",
            thousands(report.to_requeue),
            thousands(report.refused_count)
        );
    } else {
        println!(
            "requeued {} row(s) in {} batch(es), refused {}",
            thousands(report.requeued.len() as u64),
            report.batches,
            thousands(report.refused_count)
        );
    }
}
