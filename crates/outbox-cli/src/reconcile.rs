//! `outbox reconcile`: after Redis lost data, find the handed-off jobs it
//! no longer has and push them again, on demand.
//!
//! The dispatcher's Redis guard does the same by itself when it notices a
//! loss; this command is for checking by hand (a loss the guard could not
//! see, such as keys deleted one by one, or to confirm after an incident)
//! and for a dry run that lists what is missing. It runs
//! [`outbox_dispatch::Reconciler`], so what counts as missing and how it is
//! repaired is the guard's, described in `docs/reliability.md`.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use outbox_dispatch::{MissingJob, QueueCounts, ReconcileOptions, Reconciler, retention_floor};
use outbox_queue::{QueueNamespace, redact_url};
use serde_json::json;

use crate::known::Known;
use crate::{Cli, ExitStatus, Outcome, connect, filters, print_json, redis};

/// Default of `--retention-hours`: the workers' `QUEUE_DONE_RETENTION_HOURS`.
const DEFAULT_RETENTION_HOURS: u64 = outbox_queue::DEFAULT_DONE_RETENTION_HOURS;

/// Arguments of `outbox reconcile`.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Examine the rows handed off this long ago or later (30m, 2h, 1d); by
    /// default as far back as --retention-hours allows.
    #[arg(long, value_parser = filters::parse_duration)]
    pub since: Option<Duration>,
    /// Only the rows of this queue (repeatable): an outbox queue such as
    /// outbox.mail; every outbox queue when omitted.
    #[arg(long = "queue")]
    pub queues: Vec<String>,
    /// List the missing jobs; push nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The workers' QUEUE_DONE_RETENTION_HOURS: finished jobs older than
    /// this are trimmed from Redis on purpose, so --since may not reach
    /// further back (they would look lost).
    #[arg(long, env = "QUEUE_DONE_RETENTION_HOURS", default_value_t = DEFAULT_RETENTION_HOURS)]
    pub retention_hours: u64,
}

/// The outbox queues asked for: `--queue` values checked against
/// `known`, or all of its routed queues.
fn chosen_queues(asked: &[String], known: &Known) -> anyhow::Result<Vec<String>> {
    let routed = known.routed_queues();
    if asked.is_empty() {
        return Ok(routed.iter().map(|q| (*q).to_owned()).collect());
    }
    for queue in asked {
        if let Some(derived_from) = known.derived_from(queue) {
            anyhow::bail!(
                "--queue {queue}: its jobs are derived by subscribers, not handed off; reconcile \
                 the queue that derives them ({}), which recreates lost derived jobs",
                derived_from.join(" or ")
            );
        }
        if !routed.contains(&queue.as_str()) {
            anyhow::bail!(
                "--queue {queue:?} is not an outbox queue; the outbox queues are: {}",
                routed.join(", ")
            );
        }
    }
    let mut chosen = asked.to_vec();
    chosen.sort();
    chosen.dedup();
    Ok(chosen)
}

/// Runs `outbox reconcile`.
pub async fn run(cli: &Cli, args: &ReconcileArgs) -> Outcome {
    let mut conn = connect(cli).await?;
    let known = Known::read(cli, &mut conn).await?;
    let queues = chosen_queues(&args.queues, &known)?;
    let retention = Duration::from_secs(3600 * args.retention_hours.max(1));
    let now = outbox_store::db_now(&mut conn).await?;
    let floor = retention_floor(now, retention);
    let since = match args.since {
        None => floor,
        Some(since) => {
            let since = now - chrono::Duration::from_std(since).unwrap_or(chrono::Duration::MAX);
            if since < floor {
                return Err(anyhow::anyhow!(
                    "--since reaches back to {since}, past what Redis keeps: finished jobs are \
                     trimmed after QUEUE_DONE_RETENTION_HOURS ({} h, less {} minutes of margin), \
                     so older ones would look lost; use --since {}m or less, or pass \
                     --retention-hours as the workers have it",
                    args.retention_hours,
                    outbox_dispatch::RETENTION_MARGIN.as_secs() / 60,
                    (now - floor).num_minutes()
                )
                .into());
            }
            since
        }
    };
    let redis = redis(cli)?;
    let namespace = QueueNamespace::for_redis(
        cli.queue_prefix.clone(),
        cli.redis_url.as_deref().unwrap_or_default(),
    );
    let report = Reconciler::new(redis, namespace, known.receivers())
        .reconcile(
            &mut conn,
            &ReconcileOptions {
                since,
                queues,
                dry_run: args.dry_run,
            },
        )
        .await
        .with_context(|| {
            format!(
                "reconciliation against Redis at {} failed (jobs already pushed again stay pushed; \
                 running it again is safe)",
                redact_url(cli.redis_url.as_deref().unwrap_or_default())
            )
        })?;
    let missing = report.missing_total();
    if cli.json {
        let per_queue: Vec<_> = report
            .queues
            .iter()
            .map(|(queue, counts)| json!({ "queue": queue, "counts": counts }))
            .collect();
        print_json(&json!({
            "since": report.since,
            "dry_run": report.dry_run,
            "queues": per_queue,
            "missing": report.missing,
            "missing_total": missing,
            "repushed_total": report.repushed_total(),
        }))?;
    } else {
        print_report(&report.queues, &report.missing, report.since, args.dry_run);
        if args.dry_run {
            println!(
                "dry run: {missing} handed-off job(s) missing; nothing was changed (run without --dry-run to push them again)"
            );
        } else {
            println!(
                "{missing} handed-off job(s) missing, {} pushed again or run again",
                report.repushed_total()
            );
        }
    }
    Ok(ExitStatus::alert_if(missing > 0))
}

fn print_report(
    per_queue: &std::collections::BTreeMap<String, QueueCounts>,
    missing: &[MissingJob],
    since: chrono::DateTime<chrono::Utc>,
    dry_run: bool,
) {
    println!(
        "DONE rows handed off since {}{}",
        crate::render::utc(since),
        if dry_run { " (dry run)" } else { "" }
    );
    println!(
        "{:<32} {:>8} {:>8} {:>8} {:>10}",
        "QUEUE", "CHECKED", "FOUND", "MISSING", "RE-PUSHED"
    );
    for (queue, c) in per_queue {
        println!(
            "{queue:<32} {:>8} {:>8} {:>8} {:>10}",
            c.checked, c.found, c.missing, c.repushed
        );
    }
    if missing.is_empty() {
        return;
    }
    println!();
    println!(
        "{:<24} {:<58} {:<36}  HANDED OFF           TYPE / NOTE",
        "QUEUE", "TASK ID", "EVENT"
    );
    for job in missing {
        let note = match &job.derived_from {
            Some(parent) => format!("{} (derived; {} runs again)", job.event_type, parent),
            None => job.event_type.clone(),
        };
        println!(
            "{:<24} {:<58} {:<36}  {:<20} {note}",
            job.queue,
            job.task_id,
            job.event_id,
            crate::render::utc(job.handed_off_at),
        );
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn only_outbox_queues_can_be_reconciled() {
        let cli = Cli::parse_from(["outbox", "stats"]);
        let known =
            Known::with(&cli, outbox_catalog::registration::Registrations::default()).unwrap();
        assert_eq!(
            chosen_queues(&[], &known).unwrap(),
            outbox_catalog::Catalog::built_in().routed_queues()
        );
        assert_eq!(
            chosen_queues(&["outbox.mail".into(), "outbox.mail".into()], &known).unwrap(),
            ["outbox.mail"]
        );
        let derived = chosen_queues(&["toolctrl.email".into()], &known)
            .unwrap_err()
            .to_string();
        assert!(derived.contains("outbox.mail"), "{derived}");
        let unknown = chosen_queues(&["outbox.nope".into()], &known)
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("not an outbox queue"), "{unknown}");
    }
}
