//! `outbox schedules`: the periodic events' rows (`outbox_schedule`), each
//! schedule's newest settled tick, as the workers left them.

use outbox_store::ScheduleRow;

use crate::render::utc;
use crate::{Cli, ExitStatus, Outcome, connect, print_json};

pub(crate) async fn run(cli: &Cli) -> Outcome {
    let mut conn = connect(cli).await?;
    let rows = outbox_store::schedule_rows(&mut conn).await?;
    if cli.json {
        print_json(&rows)?;
    } else {
        print(&rows);
    }
    Ok(ExitStatus::Ok)
}

/// One line per schedule, by name.
fn print(rows: &[ScheduleRow]) {
    if rows.is_empty() {
        println!("no schedule has run yet");
        return;
    }
    println!("{:<40} {:<22} {:<22}", "SCHEDULE", "LAST TICK", "UPDATED");
    for row in rows {
        println!(
            "{:<40} {:<22} {:<22}",
            row.name,
            utc(row.last_tick),
            utc(row.updated_at)
        );
    }
}
