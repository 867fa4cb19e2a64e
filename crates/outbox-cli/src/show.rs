//! `outbox show ID`: one row with its requeue and cancel history.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use outbox_model::OutboxEvent;
use outbox_model::schema::{outbox_event, outbox_event_requeue};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use crate::{Cli, ExitStatus, Outcome, connect, print_json};

#[derive(Serialize, Queryable)]
pub(crate) struct History {
    requeued_at: chrono::DateTime<chrono::Utc>,
    reason: String,
    requested_by: Option<String>,
    previous_status: String,
    previous_retries: i32,
    previous_last_error: Option<String>,
    replay: bool,
    generation: Option<i32>,
    action: String,
}

pub(crate) async fn show(cli: &Cli, id: Uuid) -> Outcome {
    let mut conn = connect(cli).await?;
    let Some(row) = outbox_event::table
        .find(id)
        .select(OutboxEvent::as_select())
        .first(&mut conn)
        .await
        .optional()?
    else {
        if cli.json {
            print_json(&json!({ "error": "not found", "id": id }))?;
        } else {
            println!("no outbox event {id}");
        }
        return Ok(ExitStatus::Alert);
    };
    let history: Vec<History> = outbox_event_requeue::table
        .filter(outbox_event_requeue::outbox_event_id.eq(id))
        .order(outbox_event_requeue::requeued_at)
        .select((
            outbox_event_requeue::requeued_at,
            outbox_event_requeue::reason,
            outbox_event_requeue::requested_by,
            outbox_event_requeue::previous_status,
            outbox_event_requeue::previous_retries,
            outbox_event_requeue::previous_last_error,
            outbox_event_requeue::replay,
            outbox_event_requeue::generation,
            outbox_event_requeue::action,
        ))
        .load(&mut conn)
        .await?;
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
    if history.is_empty() {
        println!("history       (never requeued or cancelled)");
    } else {
        println!("history");
        for h in &history {
            println!(
                "  {}  {} from {} (retries {}, last error: {}){}: {}",
                h.requeued_at.to_rfc3339(),
                if h.action == "cancel" {
                    "cancelled"
                } else {
                    "requeued"
                },
                h.previous_status,
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
    Ok(ExitStatus::Ok)
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
