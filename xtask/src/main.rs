//! `cargo xtask`: the developer commands of the outbox workspace.
//!
//! - `services`: find Postgres and Redis, or start private ones, and print
//!   their URLs;
//! - `test`: everything CI runs (fmt, clippy, schema drift, tests, the
//!   examples with workspaces of their own, docs, a `cargo package` dry
//!   run of the publishable crates);
//! - `demo`: the real binaries end to end, with progress and an
//!   exactly-once verdict;
//! - `bench`: performance figures as JSON lines (a release build; `--smoke`
//!   at tiny sizes);
//! - `explain`: `EXPLAIN ANALYZE` of the dispatcher's statements per batch
//!   size, before and after the batch-size fix;
//! - `image`: the container image of `deploy/Dockerfile` with podman
//!   (`--local-bases` builds its base images from Debian's packages where
//!   no registry can be reached);
//! - `schema`: regenerate `outbox-model`'s `schema.rs` (`--check` verifies);
//! - `inventory`: check the production sources against the workflow
//!   boundary's rules;
//! - `verify-workflow-outbox-native`: the workflow readiness gate;
//! - `mutants`: mutation testing with a time budget, caught ratio per crate;
//! - `publish-check`: `cargo publish --workspace --dry-run` of the
//!   publishable crates, run before a release.
//!
//! One binary, reached through the `.cargo/config.toml` alias. Not shipped.

// Shadow std's printing macros in every module below: a closed pipe ends
// the process quietly instead of panicking (see `outbox_cli::stdout`).
macro_rules! println {
    () => {
        outbox_cli::stdout::write("xtask", format_args!(""), true)
    };
    ($($arg:tt)*) => {
        outbox_cli::stdout::write("xtask", format_args!($($arg)*), true)
    };
}
macro_rules! print {
    ($($arg:tt)*) => {
        outbox_cli::stdout::write("xtask", format_args!($($arg)*), false)
    };
}

mod bench;
mod cmd;
mod demo;
mod examples;
mod explain;
mod image;
mod install;
mod mutants;
mod publish;
mod schema;
mod services;
mod test;
mod verify;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Developer commands of the outbox workspace.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Find (or start) Postgres and Redis and print their URLs as shell exports.
    Services {
        /// Skip the environment and the standard ports: use (or start) the
        /// private servers under target/services/.
        #[arg(long)]
        private: bool,
    },
    /// Run everything CI runs: services, fmt, clippy, schema check, tests,
    /// the examples with workspaces of their own, a smoke run of the bench,
    /// docs.
    Test(test::TestArgs),
    /// The same as `test`; what `.ci/run` calls.
    Ci(test::TestArgs),
    /// The real binaries end to end: publish a mix over every route and two
    /// workflows, kill worker-general once, print a summary and an
    /// exactly-once verdict (exit 1 when it fails).
    Demo(demo::DemoArgs),
    /// Performance figures as JSON lines on stdout.
    Bench(Box<bench::BenchArgs>),
    /// EXPLAIN ANALYZE of every statement of a dispatcher tick at several
    /// batch sizes, statistics states and plan cache modes, as a Markdown table.
    Explain(explain::ExplainArgs),
    /// Build the container image of deploy/Dockerfile with podman
    /// (`--local-bases`: its base images from Debian's packages and rustup,
    /// where no registry can be reached).
    Image(image::ImageArgs),
    /// Regenerate crates/outbox-model/src/schema.rs from the migrations.
    Schema {
        /// Fail instead of writing when the file differs from the migrations.
        #[arg(long)]
        check: bool,
    },
    /// Check the production sources against the workflow boundary's rules
    /// (runs are published, only the bridge executes triggers); exit 1 on
    /// any violation.
    Inventory,
    /// The workflow readiness gate: run the focused tests of each claim and
    /// print a pass/fail table; exit 0 only when every part passes.
    VerifyWorkflowOutboxNative,
    /// Mutation testing (cargo-mutants) of the dispatcher, queue,
    /// idempotency, publish, subscriber, CLI and operator crates, with a
    /// time budget; prints the caught ratio per crate and the mutants no
    /// test noticed.
    Mutants(mutants::MutantsArgs),
    /// Package every publishable crate and build each from its archive
    /// (`cargo publish --workspace --dry-run`), as crates.io would receive
    /// it; run before a release (it needs the network).
    PublishCheck,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    if let Command::Bench(args) = &cli.command
        && cfg!(debug_assertions)
        && !args.smoke
    {
        return bench::rerun_in_release();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Services { private } => {
                let found = if private {
                    services::ensure_private().await?
                } else {
                    services::ensure().await?
                };
                println!("export DATABASE_URL={}", found.database_url);
                println!("export REDIS_URL={}", found.redis_url);
                Ok(())
            }
            Command::Test(args) | Command::Ci(args) => test::run(args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Bench(args) => bench::run(*args).await,
            Command::Explain(args) => explain::run(args).await,
            Command::Image(args) => image::run(args),
            Command::Schema { check } => schema::run(check).await,
            Command::Inventory => verify::inventory::run(),
            Command::VerifyWorkflowOutboxNative => verify::workflow::run().await,
            Command::Mutants(args) => mutants::run(args).await,
            Command::PublishCheck => publish::check(),
        }
    })
}
