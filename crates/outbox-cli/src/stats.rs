//! `outbox stats`: rows per status and per queue; exit 1 on the pending alert.

use outbox_model::OutboxStatus;

use crate::{Cli, ExitStatus, Outcome, connect, print_json, router};

pub(crate) async fn stats(cli: &Cli) -> Outcome {
    let mut conn = connect(cli).await?;
    let stats = outbox_dispatch::stats::outbox_stats(&mut conn, &router(cli)?).await?;
    if cli.json {
        print_json(&stats)?;
    } else {
        println!("{:<12} {:>10}", "STATUS", "ROWS");
        for (status, n) in &stats.by_status {
            println!("{status:<12} {n:>10}");
        }
        println!();
        println!(
            "{:<32} {:>9} {:>10} {:>9} {:>9} {:>9}",
            "QUEUE", "PENDING", "PROCESSING", "DONE", "FAILED", "CANCELLED"
        );
        for (queue, counts) in &stats.by_queue {
            let n = |s: OutboxStatus| counts.get(s.as_str()).copied().unwrap_or(0);
            println!(
                "{queue:<32} {:>9} {:>10} {:>9} {:>9} {:>9}",
                n(OutboxStatus::Pending),
                n(OutboxStatus::Processing),
                n(OutboxStatus::Done),
                n(OutboxStatus::Failed),
                n(OutboxStatus::Cancelled)
            );
        }
        println!();
        let age = stats
            .pending
            .oldest_due_age_secs
            .map_or("-".to_owned(), |s| format!("{s:.0}s"));
        println!(
            "due pending: {} (over 60 s: {}), oldest due: {age}",
            stats.pending.due, stats.pending.overdue
        );
        if stats.pending_alert {
            println!(
                "ALERT: {} rows PENDING and due for over 60 s (> {}): the dispatcher is behind or down",
                stats.pending.overdue,
                outbox_dispatch::stats::PENDING_ALERT_THRESHOLD
            );
        }
    }
    Ok(ExitStatus::alert_if(stats.pending_alert))
}
