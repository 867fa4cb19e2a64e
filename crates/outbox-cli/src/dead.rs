//! `outbox dead <queue>`: the dead jobs of a queue and why each failed.

use clap::Args;
use outbox_queue::{DeadJob, QueueNamespace, redact_urls_in};

/// Arguments of `outbox dead`.
#[derive(Debug, Args)]
pub struct DeadArgs {
    /// The queue, e.g. `outbox.webhook` or `toolctrl.email`.
    pub queue: String,
    /// Show at most this many jobs.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

/// Refuses a queue name no worker or dispatcher uses (a typo would
/// otherwise look like an empty dead set); `known` is every queue the CLI
/// knows: routed, downstream, and registered by workers.
///
/// # Errors
///
/// The unknown name, with the list of queues.
pub fn check_queue(queue: &str, known: &[&str]) -> anyhow::Result<()> {
    if !known.contains(&queue) {
        anyhow::bail!(
            "unknown queue {queue:?}; the queues are: {}",
            known.join(", ")
        );
    }
    Ok(())
}

/// Reads up to `args.limit` dead jobs of `args.queue`. Reasons are shown
/// with any URL in them reduced ([`redact_urls_in`]): workers already
/// record endpoints by origin only, but reasons stored by older versions
/// may still hold a full URL with its token.
///
/// # Errors
///
/// Redis failing.
pub async fn dead_jobs(
    redis: &mut outbox_queue::RedisConnection,
    namespace: &QueueNamespace,
    args: &DeadArgs,
) -> Result<Vec<DeadJob>, outbox_queue::QueueError> {
    let mut jobs = outbox_queue::dead_jobs(redis, namespace, &args.queue, args.limit).await?;
    for job in &mut jobs {
        job.reason = job.reason.as_deref().map(redact_urls_in);
    }
    Ok(jobs)
}

/// The table form of `jobs`.
pub fn print_table(queue: &str, jobs: &[DeadJob]) {
    println!("{:<56}  {:>8}  REASON", "TASK ID", "ATTEMPTS");
    for job in jobs {
        println!(
            "{:<56}  {:>8}  {}",
            job.task_id,
            job.attempts.as_deref().unwrap_or("-"),
            job.reason.as_deref().unwrap_or("-")
        );
    }
    println!("{} dead job(s) shown on {queue}", jobs.len());
}
