//! `outbox list`: rows matching the filters, oldest first, as a table or JSON.

use clap::Args;
use outbox_model::{OutboxEvent, OutboxStatus};
use serde::Serialize;
use uuid::Uuid;

use crate::filters::Filters;
use crate::render::showing;
use crate::{Cli, DEFAULT_LIST_LIMIT, ExitStatus, MAX_LIST_LIMIT, Outcome, connect, print_json};

#[derive(Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub(crate) filters: Filters,
    /// At most this many rows, oldest first.
    #[arg(long, default_value_t = DEFAULT_LIST_LIMIT, value_parser = clap::value_parser!(u64).range(1..=MAX_LIST_LIMIT))]
    pub(crate) limit: u64,
}

#[derive(Serialize)]
pub(crate) struct ListRow<'a> {
    id: Uuid,
    tenant_id: &'a str,
    event_type: &'a str,
    status: OutboxStatus,
    retries: i32,
    created_at: chrono::DateTime<chrono::Utc>,
    scheduled_at: chrono::DateTime<chrono::Utc>,
    failed_at: Option<chrono::DateTime<chrono::Utc>>,
    target_queue: Option<&'a str>,
    last_error: Option<&'a str>,
}

pub(crate) async fn list(cli: &Cli, args: &ListArgs) -> Outcome {
    let mut conn = connect(cli).await?;
    let rows: Vec<OutboxEvent> = args
        .filters
        .oldest_first(&mut conn, i64::try_from(args.limit).unwrap_or(i64::MAX))
        .await?;
    let shown = rows.len() as u64;
    // Only a full page can hide more rows; count them then.
    let matching = if shown == args.limit {
        args.filters.count(&mut conn).await?
    } else {
        shown
    };
    let view: Vec<ListRow> = rows
        .iter()
        .map(|r| ListRow {
            id: r.id,
            tenant_id: &r.tenant_id,
            event_type: &r.event_type,
            status: r.status,
            retries: r.retries,
            created_at: r.created_at,
            scheduled_at: r.scheduled_at,
            failed_at: r.failed_at,
            target_queue: r.target_queue.as_deref(),
            last_error: r.last_error.as_deref(),
        })
        .collect();
    if cli.json {
        // stdout stays a plain array of rows; the note is for the operator.
        print_json(&view)?;
        if let Some(showing) = showing(shown, matching) {
            eprintln!("outbox: {showing}");
        }
    } else {
        println!(
            "{:<36}  {:<10}  {:<12}  {:<32}  {:>7}  {:<20}  QUEUE / LAST ERROR",
            "ID", "STATUS", "TENANT", "EVENT TYPE", "RETRIES", "CREATED"
        );
        for r in &view {
            println!(
                "{:<36}  {:<10}  {:<12}  {:<32}  {:>7}  {:<20}  {}",
                r.id,
                r.status,
                r.tenant_id,
                r.event_type,
                r.retries,
                crate::render::utc(r.created_at),
                r.last_error.or(r.target_queue).unwrap_or("-")
            );
        }
        match showing(shown, matching) {
            Some(showing) => println!("{showing}"),
            None => println!("{} row(s)", view.len()),
        }
    }
    Ok(ExitStatus::alert_if(view.is_empty()))
}
