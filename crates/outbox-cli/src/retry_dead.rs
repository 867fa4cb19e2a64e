//! `outbox retry-dead <queue>`: put dead jobs back on their queue, due now,
//! guarded like `outbox requeue`: `--dry-run` lists them, and more than
//! `--confirm-above` jobs need `--yes` (without it nothing changes and the
//! exit status is 2). Each job put back is recorded in its event's history
//! (`outbox show`: action `retry_dead`, with `--reason` and `$USER`), which
//! is why the command needs the database as well as Redis. The first
//! delivery of an ordered event whose key has moved past the event stays
//! dead (its worker would acknowledge it without running the handler): the
//! command names it and the replay that runs it, and exits 1.

use anyhow::Context;
use clap::Args;
use outbox_queue::QueueNamespace;
use serde::Serialize;

use crate::requeue::bulk::DEFAULT_CONFIRM_ABOVE;
use crate::{Cli, ExitStatus, Failure, Outcome, connect, dead, print_json, redis};

/// Arguments of `outbox retry-dead`.
#[derive(Debug, Args)]
pub struct RetryDeadArgs {
    /// The queue, e.g. `outbox.webhook` or `toolctrl.email`.
    pub queue: String,
    /// Only this dead job (repeatable); without it, every dead job of the queue.
    #[arg(long = "task-id")]
    pub task_ids: Vec<String>,
    /// List the dead jobs that would go back; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Confirm putting back more jobs than --confirm-above.
    #[arg(long)]
    pub yes: bool,
    /// Putting back more jobs than this needs --yes; without it, nothing changes and the exit status is 2.
    #[arg(long, default_value_t = DEFAULT_CONFIRM_ABOVE)]
    pub confirm_above: u64,
    /// Why, kept in the history of each job's event.
    #[arg(long, default_value = DEFAULT_REASON)]
    pub reason: String,
}

/// Default of `--reason`.
const DEFAULT_REASON: &str = "dead job put back by operator";

/// What `retry-dead` did or would do.
#[derive(Debug, Serialize)]
struct Report<'a> {
    queue: &'a str,
    dry_run: bool,
    /// The dead jobs selected.
    task_ids: Vec<String>,
    /// How many went back (0 with --dry-run).
    put_back: usize,
    /// History entries written (one per job put back that names an event).
    recorded: usize,
    /// Jobs put back whose task id names no outbox event (no history to
    /// record them in).
    without_event: Vec<String>,
    /// Jobs left dead (or that a run would leave dead): first deliveries of
    /// ordered events whose key has moved past them.
    passed_over: Vec<outbox_operator::dead::PassedOver>,
}

/// The policy: how many jobs may go back without `--yes`.
fn guard(selected: usize, args: &RetryDeadArgs) -> Result<(), Failure> {
    let selected = selected as u64;
    if !args.dry_run
        && !args.yes
        && outbox_operator::confirm::needs_confirmation(selected, args.confirm_above)
    {
        return Err(Failure::from(anyhow::anyhow!(
            "{selected} dead jobs of {} would go back, more than --confirm-above {}; \
             run with --dry-run to see them, then with --yes (nothing changed)",
            args.queue,
            args.confirm_above
        )));
    }
    Ok(())
}

/// Runs `outbox retry-dead`.
pub async fn run(cli: &Cli, args: &RetryDeadArgs) -> Outcome {
    dead::check_queue(
        &args.queue,
        &crate::known::Known::read_if_possible(cli).await?.queues(),
    )?;
    let mut redis = redis(cli)?;
    let namespace = QueueNamespace::for_redis(
        cli.queue_prefix.clone(),
        cli.redis_url.as_deref().unwrap_or_default(),
    );
    let dead_ids = outbox_queue::dead_task_ids(&mut redis, &namespace, &args.queue)
        .await
        .with_context(|| format!("cannot read the dead jobs of {}", args.queue))?;
    let selected: Vec<String> = if args.task_ids.is_empty() {
        dead_ids
    } else {
        let missing: Vec<&String> = args
            .task_ids
            .iter()
            .filter(|id| !dead_ids.contains(id))
            .collect();
        if !missing.is_empty() {
            return Err(Failure::from(anyhow::anyhow!(
                "not dead on {}: {} (see `outbox dead {}`; nothing changed)",
                args.queue,
                missing
                    .iter()
                    .map(|id| id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                args.queue
            )));
        }
        args.task_ids.clone()
    };
    let done = if selected.is_empty() {
        outbox_operator::dead::PutBack::default()
    } else {
        let mut conn = connect(cli).await?;
        let passed_over = outbox_operator::dead::past_their_keys(
            &mut redis,
            &namespace,
            &args.queue,
            &mut conn,
            &selected,
        )
        .await
        .with_context(|| format!("cannot check the dead jobs of {}", args.queue))?;
        guard(selected.len() - passed_over.len(), args)?;
        if args.dry_run {
            outbox_operator::dead::PutBack {
                passed_over,
                ..Default::default()
            }
        } else {
            let requested_by = std::env::var("USER").ok();
            outbox_operator::dead::put_back(
                &mut redis,
                &namespace,
                &args.queue,
                &selected,
                &mut conn,
                &args.reason,
                requested_by.as_deref(),
            )
            .await?
        }
    };
    let report = Report {
        queue: &args.queue,
        dry_run: args.dry_run,
        task_ids: selected,
        put_back: done.task_ids.len(),
        recorded: done.recorded,
        without_event: done.without_event,
        passed_over: done.passed_over,
    };
    if cli.json {
        print_json(&report)?;
    } else {
        print(&report);
    }
    Ok(ExitStatus::alert_if(
        report.task_ids.is_empty() || !report.passed_over.is_empty(),
    ))
}

fn print(report: &Report<'_>) {
    if report.task_ids.is_empty() {
        println!("no dead jobs on {}", report.queue);
        return;
    }
    for id in &report.task_ids {
        println!("{id}");
    }
    for passed in &report.passed_over {
        let event = passed
            .event_id
            .map_or_else(|| "<event id>".to_owned(), |id| id.to_string());
        let stays = if report.dry_run {
            "would stay"
        } else {
            "stays"
        };
        println!(
            "{} {stays} dead: its ordering key {} has moved past its position {} (the event was \
             skipped, or delivered by a replay since: `outbox show {event}` tells which), so its \
             worker would acknowledge it without running the handler; to run the handler once \
             more: `outbox requeue --replay {event}`",
            passed.task_id, passed.ordering_key, passed.position,
        );
    }
    if report.dry_run {
        println!(
            "would put {} dead job(s) back on {} (dry run: nothing changed)",
            report.task_ids.len() - report.passed_over.len(),
            report.queue
        );
    } else {
        println!(
            "put {} of {} dead job(s) back on {} ({} recorded in their events' history)",
            report.put_back,
            report.task_ids.len(),
            report.queue,
            report.recorded
        );
        if !report.without_event.is_empty() {
            println!(
                "not recorded, they name no outbox event: {}",
                report.without_event.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dry_run: bool, yes: bool) -> RetryDeadArgs {
        RetryDeadArgs {
            queue: "outbox.webhook".into(),
            task_ids: Vec::new(),
            dry_run,
            yes,
            confirm_above: 2,
            reason: DEFAULT_REASON.into(),
        }
    }

    #[test]
    fn more_jobs_than_the_threshold_need_yes_unless_it_is_a_dry_run() {
        assert!(guard(2, &args(false, false)).is_ok());
        let refused = guard(3, &args(false, false)).err().unwrap();
        assert_eq!(refused.status, ExitStatus::Error);
        assert!(refused.error.to_string().contains("--yes"));
        assert!(guard(3, &args(false, true)).is_ok());
        assert!(guard(3, &args(true, false)).is_ok());
    }
}
