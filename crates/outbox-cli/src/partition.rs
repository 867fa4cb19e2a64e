//! `outbox partition convert | status`: partitioning `outbox_event` by
//! creation time, and what its partitions hold.
//!
//! `convert` turns the one table into a table partitioned by range on
//! `created_at` (`outbox_store::convert_to_partitioned`); from then on the
//! dispatcher's retention keeps partitions created ahead and drops those
//! that hold only old `DONE` rows. `status` lists the partitions.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use outbox_store::{PartitionInfo, PartitionUnit};
use serde::Serialize;

use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// Arguments of `outbox partition`.
#[derive(Debug, Args)]
pub struct PartitionArgs {
    #[command(subcommand)]
    command: PartitionCommand,
}

#[derive(Debug, Subcommand)]
enum PartitionCommand {
    /// Partition outbox_event by created_at; the existing rows stay where they are, in its first partition.
    Convert(ConvertArgs),
    /// Whether outbox_event is partitioned, and its partitions: range, rows (estimated) and size; exits 1 when rows are in the default partition or a failed conversion left parts behind.
    Status,
}

/// Arguments of `outbox partition convert`.
#[derive(Debug, Args)]
struct ConvertArgs {
    /// The width of one partition: hour, day, week or month.
    #[arg(long, default_value = "day")]
    unit: PartitionUnit,
    /// How many partitions past the current one to keep created (the dispatcher's retention keeps them).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=1000))]
    ahead: u32,
}

/// Runs `outbox partition`.
pub async fn run(cli: &Cli, args: &PartitionArgs) -> Outcome {
    match &args.command {
        PartitionCommand::Convert(convert_args) => convert(cli, convert_args).await,
        PartitionCommand::Status => status(cli).await,
    }
}

async fn convert(cli: &Cli, args: &ConvertArgs) -> Outcome {
    let mut conn = connect(cli).await?;
    let converted = outbox_store::convert_to_partitioned(&mut conn, args.unit, args.ahead)
        .await
        .context("cannot partition outbox_event")?;
    if cli.json {
        print_json(&serde_json::json!({
            "converted": true,
            "unit": args.unit.as_str(),
            "ahead": args.ahead,
            "legacy_until": converted.legacy_until,
            "dispatch_keys": converted.keys,
            "dispatch_keys_rechecked": converted.keys_rechecked,
            "created": converted.created,
            "locked_ms": converted.locked_for.as_secs_f64() * 1000.0,
        }))?;
    } else {
        println!(
            "outbox_event is partitioned by created_at, one partition a {}: rows created before {} stay in {}, {} dispatch key(s) held ({} written during the copy and read again under the lock), partitions created: {}; the table was locked for {:.1} ms",
            args.unit,
            crate::render::utc(converted.legacy_until),
            outbox_store::LEGACY_PARTITION,
            converted.keys,
            converted.keys_rechecked,
            converted.created.join(", "),
            converted.locked_for.as_secs_f64() * 1000.0
        );
    }
    Ok(ExitStatus::Ok)
}

/// One partition in `--json`.
#[derive(Debug, Serialize)]
struct Partition<'a> {
    name: &'a str,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    rows_estimate: u64,
    bytes: i64,
}

impl<'a> From<&'a PartitionInfo> for Partition<'a> {
    fn from(p: &'a PartitionInfo) -> Self {
        Self {
            name: &p.name,
            from: p.from,
            to: p.to,
            rows_estimate: p.rows_estimate as u64,
            bytes: p.bytes,
        }
    }
}

async fn status(cli: &Cli) -> Outcome {
    let mut conn = connect(cli).await?;
    let partitioning = outbox_store::partitioning(&mut conn)
        .await
        .context("cannot read outbox_partitioning")?;
    let parts = outbox_store::partitions(&mut conn)
        .await
        .context("cannot list the partitions of outbox_event")?;
    let other_means = outbox_store::partitioned_by_other_means(&mut conn)
        .await
        .context("cannot tell how outbox_event is partitioned")?;
    let leftovers = outbox_store::conversion_leftovers(&mut conn)
        .await
        .context("cannot look for what a failed conversion left")?;
    // Rows in the default partition mean a partition was missing when they
    // were written: worth an operator's look.
    let in_default = parts
        .iter()
        .any(|p| p.name == outbox_store::DEFAULT_PARTITION && p.rows_estimate > 0.0);
    if cli.json {
        print_json(&serde_json::json!({
            "partitioned": partitioning.is_some(),
            "partitioned_by_other_means": other_means,
            "unit": partitioning.as_ref().map(|p| p.unit.as_str()),
            "ahead": partitioning.as_ref().map(|p| p.ahead),
            "converted_at": partitioning.as_ref().map(|p| p.converted_at),
            "partitions": parts.iter().map(Partition::from).collect::<Vec<_>>(),
            "conversion_leftovers": leftovers,
        }))?;
    } else if let Some(p) = &partitioning {
        println!(
            "outbox_event is partitioned by created_at, one partition a {}, {} kept ahead (converted {})",
            p.unit,
            p.ahead,
            crate::render::utc(p.converted_at)
        );
        println!(
            "{:<32}  {:<20}  {:<20}  {:>12}  {:>10}",
            "PARTITION", "FROM", "TO", "ROWS (EST.)", "MIB"
        );
        for part in &parts {
            println!(
                "{:<32}  {:<20}  {:<20}  {:>12}  {:>10.1}",
                part.name,
                part.from.map_or("-".to_owned(), crate::render::utc),
                part.to.map_or("-".to_owned(), crate::render::utc),
                part.rows_estimate as u64,
                part.bytes as f64 / 1_048_576.0
            );
        }
        if in_default {
            println!(
                "rows are in {}: a partition was missing when they were written",
                outbox_store::DEFAULT_PARTITION
            );
        }
    } else if other_means {
        println!(
            "outbox_event is partitioned, but not by `outbox partition convert`: dispatch keys are not \
             unique across its partitions, retention cannot clean it, and worker-general refuses to start"
        );
    } else {
        println!(
            "outbox_event is one table (not partitioned): `outbox partition convert` partitions it"
        );
        if !leftovers.is_empty() {
            println!(
                "a conversion that failed left: {}; worker-general's retention job removes them \
                 (within 10 minutes while it runs), or run `outbox partition convert` again",
                leftovers.join(", ")
            );
        }
    }
    Ok(ExitStatus::alert_if(
        in_default || other_means || !leftovers.is_empty(),
    ))
}
