//! `outbox migrate`: apply the pending migrations of every migration set
//! (the core and one per built-in subscriber), or of the sets `--set`
//! names; `--status` lists every migration of those sets as applied or
//! pending, with its set, `--dry-run` lists what would be applied. Neither
//! of those changes anything.

use anyhow::Context;
use clap::Args;
use outbox_model::{MigrationSet, MigrationState};
use serde_json::json;

use crate::{Cli, ExitStatus, Outcome, connect, print_json};

/// Arguments of `outbox migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// List every migration of this build as applied or pending; change nothing.
    #[arg(long, conflicts_with = "dry_run")]
    pub status: bool,
    /// List the migrations that would be applied; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only this migration set (repeatable): core, audit, notification,
    /// webhook, plugin, mail, workflow. Every set by default; a bare
    /// application (no built-in subscriber) needs `--set core` only.
    #[arg(long = "set", value_name = "SET", value_parser = parse_set)]
    pub sets: Vec<MigrationSet>,
}

fn parse_set(name: &str) -> Result<MigrationSet, String> {
    name.parse()
        .map_err(|e: outbox_model::UnknownMigrationSet| e.to_string())
}

impl MigrateArgs {
    /// The sets to work on: those named, else every set of this build.
    fn sets(&self) -> Vec<MigrationSet> {
        if self.sets.is_empty() {
            MigrationSet::built()
        } else {
            self.sets.clone()
        }
    }
}

/// Runs `outbox migrate`.
pub async fn run(cli: &Cli, args: &MigrateArgs) -> Outcome {
    // A wrong sslmode or sslrootcert is a configuration error, said once,
    // as is a database that cannot be reached.
    let mut conn = connect(cli).await?;
    if args.status || args.dry_run {
        let states = outbox_model::migration_set_status(&mut conn, &args.sets())
            .await
            .context("cannot read the migration status")?;
        if args.status {
            print_status(cli.json, &states)?;
        } else {
            print_dry_run(cli.json, &states)?;
        }
        return Ok(ExitStatus::Ok);
    }
    let sets = args.sets();
    let applied = outbox_model::run_migration_sets(conn, &sets)
        .await
        .context("migration failed")?;
    let names: Vec<&str> = sets.iter().map(|set| set.name()).collect();
    if cli.json {
        print_json(&json!({ "applied": applied, "sets": names }))?;
    } else if applied.is_empty() {
        println!("schema is up to date (sets: {})", names.join(", "));
    } else {
        println!(
            "applied {} migration(s) of the sets {}: {}",
            applied.len(),
            names.join(", "),
            applied.join(", ")
        );
    }
    Ok(ExitStatus::Ok)
}

fn pending(states: &[MigrationState]) -> Vec<&MigrationState> {
    states.iter().filter(|m| !m.applied).collect()
}

fn print_status(json: bool, states: &[MigrationState]) -> anyhow::Result<()> {
    let pending = pending(states).len();
    if json {
        return print_json(&json!({ "migrations": states, "pending": pending }));
    }
    println!("{:<60}  {:<12}  STATE", "MIGRATION", "SET");
    for m in states {
        println!(
            "{:<60}  {:<12}  {}",
            m.name,
            m.set.name(),
            if m.applied { "applied" } else { "pending" }
        );
    }
    let mut sets: Vec<MigrationSet> = states.iter().map(|m| m.set).collect();
    sets.sort_unstable();
    sets.dedup();
    for set in sets {
        let of_set: Vec<&MigrationState> = states.iter().filter(|m| m.set == set).collect();
        let waiting = of_set.iter().filter(|m| !m.applied).count();
        println!(
            "{set}: {} applied, {waiting} pending",
            of_set.len() - waiting
        );
    }
    println!("{} applied, {pending} pending", states.len() - pending);
    Ok(())
}

fn print_dry_run(json: bool, states: &[MigrationState]) -> anyhow::Result<()> {
    let pending = pending(states);
    if json {
        let names: Vec<&str> = pending.iter().map(|m| m.name.as_str()).collect();
        return print_json(&json!({ "would_apply": names }));
    }
    if pending.is_empty() {
        println!("schema is up to date; nothing would be applied");
    } else {
        println!("would apply {} migration(s):", pending.len());
        for m in pending {
            println!("  {}", m.name);
        }
    }
    Ok(())
}
