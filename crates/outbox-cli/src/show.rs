//! `outbox show ID`: one row with its history (requeues, cancels, skips
//! and reschedules).

use outbox_model::OutboxEvent;
use outbox_store::HistoryEntry;
use serde_json::json;
use uuid::Uuid;

use crate::{Cli, ExitStatus, Outcome, connect, print_json};

pub(crate) async fn show(cli: &Cli, id: Uuid) -> Outcome {
    let mut conn = connect(cli).await?;
    let Some(row) = outbox_store::event(&mut conn, id).await? else {
        if cli.json {
            print_json(&json!({ "error": "not found", "id": id }))?;
        } else {
            println!("no outbox event {id}");
        }
        return Ok(ExitStatus::Alert);
    };
    let history: Vec<HistoryEntry> = outbox_store::history(&mut conn, id).await?;
    if cli.json {
        print_json(&json!({ "event": row, "history": history }))?;
        return Ok(ExitStatus::Ok);
    }
    let time =
        |t: Option<chrono::DateTime<chrono::Utc>>| t.map_or("-".to_owned(), |t| t.to_rfc3339());
    println!("id            {}", row.id);
    println!("tenant        {}", row.tenant_id);
    println!("event type    {}", row.event_type);
    println!("status        {}", row.status);
    println!("retries       {}", row.retries);
    println!(
        "generation    {} (task id {})",
        row.generation,
        outbox_queue::generation_task_id(row.id, u32::try_from(row.generation).unwrap_or(0))
    );
    println!("created       {}", row.created_at.to_rfc3339());
    println!("scheduled     {}", row.scheduled_at.to_rfc3339());
    println!("locked until  {}", time(row.locked_until));
    println!("processed     {}", time(row.processed_at));
    println!("failed        {}", time(row.failed_at));
    println!(
        "target queue  {}",
        row.target_queue.as_deref().unwrap_or("-")
    );
    println!(
        "dispatch key  {}",
        row.dispatch_key.as_deref().unwrap_or("-")
    );
    println!("last error    {}", row.last_error.as_deref().unwrap_or("-"));
    println!("trace         {}", trace_line(&row));
    println!("payload\n{}", serde_json::to_string_pretty(&row.payload)?);
    print_history(&history);
    Ok(ExitStatus::Ok)
}

/// The row's requeues, cancels, skips and reschedules, oldest first.
fn print_history(history: &[HistoryEntry]) {
    if history.is_empty() {
        println!("history       (never requeued, cancelled or rescheduled)");
    } else {
        println!("history");
        for h in history {
            println!(
                "  {}  {} (retries {}, last error: {}){}: {}",
                h.requeued_at.to_rfc3339(),
                h.change(),
                h.previous_retries,
                h.previous_last_error.as_deref().unwrap_or("-"),
                match (h.replay, h.generation) {
                    (true, Some(n)) => format!(" as a replay (generation {n})"),
                    (true, None) => " as a replay".to_owned(),
                    (false, _) => String::new(),
                },
                h.reason
            );
        }
    }
}

/// The trace id stored with the row (what to look up in a trace viewer),
/// or why there is none.
fn trace_line(row: &OutboxEvent) -> String {
    match (&row.traceparent, outbox_queue::stored_trace_context(row)) {
        (_, Some(trace)) => trace.trace_id().to_owned(),
        (Some(raw), None) => {
            format!("- (traceparent {raw:?} is not valid; the dispatcher ignores it)")
        }
        (None, None) => "-".to_owned(),
    }
}
