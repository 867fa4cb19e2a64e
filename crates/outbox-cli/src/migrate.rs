//! `outbox migrate`: apply the pending migrations; `--status` lists every
//! migration as applied or pending, `--dry-run` lists what would be
//! applied. Neither of those changes anything.

use anyhow::Context;
use clap::Args;
use outbox_model::MigrationState;
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
}

/// Runs `outbox migrate`.
pub async fn run(cli: &Cli, args: &MigrateArgs) -> Outcome {
    // A wrong sslmode or sslrootcert is a configuration error, said once,
    // as is a database that cannot be reached.
    let mut conn = connect(cli).await?;
    if args.status || args.dry_run {
        let states = outbox_model::migration_status(&mut conn)
            .await
            .context("cannot read the migration status")?;
        if args.status {
            print_status(cli.json, &states)?;
        } else {
            print_dry_run(cli.json, &states)?;
        }
        return Ok(ExitStatus::Ok);
    }
    let applied = outbox_model::run_migrations(conn)
        .await
        .context("migration failed")?;
    if cli.json {
        print_json(&json!({ "applied": applied }))?;
    } else if applied.is_empty() {
        println!("schema is up to date");
    } else {
        println!(
            "applied {} migration(s): {}",
            applied.len(),
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
    println!("{:<60}  STATE", "MIGRATION");
    for m in states {
        println!(
            "{:<60}  {}",
            m.name,
            if m.applied { "applied" } else { "pending" }
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
