//! `outbox`: the operator CLI of the transactional outbox.
//!
//! `outbox migrate [--status|--dry-run] | stats | health | dead QUEUE |
//! retry-dead QUEUE | list | show ID | requeue | cancel ID… | ordering list |
//! ordering release KEY | reconcile |
//! workflow executions | workflow show ID | workflow validate | save |
//! publish | versions | start | answer | cancel | probe | schedules |
//! completions SHELL`
//! (one module per command; this file holds the command line, the
//! connections and the dispatch to the modules). Every command prints a table, or JSON with `--json`
//! (errors on stderr); output into a closed pipe ends quietly. `health`
//! covers the queues
//! (Redis), Redis' persistence and loss marker, and the workflow executions
//! stuck in `queued` or `running` (Postgres). `reconcile` finds the
//! handed-off jobs Redis no longer has and pushes them again (see the
//! `reconcile` module). `probe`
//! publishes a probe event (and with `--workflow` requests a run of the
//! probe workflow) on the live environment and waits until it is handed off
//! and handled (and the run succeeded), naming what is missing on timeout
//! (see the `probe` module). Exit codes: 0 fine; 1 an alert fired, nothing
//! matched, the probe did not get through or a workflow command was
//! refused (nothing written); 2 a usage, configuration or
//! connection error, a value no flag accepts, or a bulk requeue above
//! `--confirm-above` without `--yes` (nothing changed). The runbook in
//! `docs/operations.md` says when to run what, `docs/operations/cli.md`
//! lists every command.

// Shadow std's `print!` and `println!` in every module below: a closed pipe ends
// the process quietly instead of panicking (see `outbox_cli::stdout`).
macro_rules! print {
    ($($arg:tt)*) => {
        outbox_cli::stdout::write("outbox", format_args!($($arg)*), false)
    };
}
macro_rules! println {
    () => {
        outbox_cli::stdout::write("outbox", format_args!(""), true)
    };
    ($($arg:tt)*) => {
        outbox_cli::stdout::write("outbox", format_args!($($arg)*), true)
    };
}

mod cancel;
mod completions;
mod dead;
mod exit;
mod filters;
mod health_cmd;
mod known;
mod list;
mod migrate;
mod ordering;
mod partition;
mod probe;
mod reconcile;
mod redis_status;
mod render;
mod retry_dead;
mod schedules;
mod show;
mod stats;
mod unrouted;
mod workflow;
mod workflow_admin;

/// `outbox requeue`: the policy and the transaction are the library's
/// ([`outbox_cli::requeue`]); selecting, batching and printing are here.
mod requeue {
    pub mod bulk;
    pub mod command;

    pub use outbox_cli::requeue::*;
}

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use diesel_async::AsyncPgConnection;
use outbox_dispatch::Router;
use outbox_queue::{QueueNamespace, RedisSettings, redact_url};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

pub(crate) use crate::exit::{ExitStatus, Failure, Outcome};
use crate::requeue::command::RequeueArgs;

/// The exit codes, as `--help` shows them (a macro, so that commands can
/// put their examples in front with `concat!`).
macro_rules! exit_codes {
    () => {
        "Exit codes: 0 fine; 1 an alert fired, nothing matched, the probe did not get through, \
    reconcile found handed-off jobs missing (also with --dry-run), retry-dead left a job dead \
    because its ordering key moved past its event, or a workflow command was refused \
    (an invalid definition, no such workflow or execution, a run not waiting or already finished; \
    nothing written); 2 a usage, \
    configuration or connection error, a value no flag accepts (the message names the flag), or a \
    bulk requeue above --confirm-above without --yes (nothing changed)."
    };
}

/// The exit codes alone.
const EXIT_CODES: &str = exit_codes!();

/// Default of `list --limit` and `workflow executions --limit`.
const DEFAULT_LIST_LIMIT: u64 = 100;
/// Largest `list --limit` and `workflow executions --limit`.
const MAX_LIST_LIMIT: u64 = 100_000;

/// Operate the transactional outbox.
#[derive(Parser)]
#[command(
    name = "outbox",
    version,
    about,
    after_help = EXIT_CODES
)]
struct Cli {
    /// Postgres URL; `?sslmode=disable|prefer|require|verify-ca|verify-full` and `&sslrootcert=<CA file>` choose TLS (default prefer).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    /// Redis URL (health, dead, reconcile); `rediss://` for TLS.
    #[arg(long, env = "REDIS_URL", global = true, hide_env_values = true)]
    redis_url: Option<String>,
    /// CA certificates (PEM) a `rediss://` server's certificate must chain to, as the workers' REDIS_CA_CERT (default: the system's roots).
    #[arg(long, env = "REDIS_CA_CERT", global = true)]
    redis_ca_cert: Option<std::path::PathBuf>,
    /// Key prefix of the queues (as the workers' OUTBOX_QUEUE_PREFIX).
    #[arg(long, env = "OUTBOX_QUEUE_PREFIX", global = true, default_value = "", value_parser = queue_prefix)]
    queue_prefix: String,
    /// A routes file (TOML, `[[route]]` tables with prefix and queue) whose rules are added to the standard table, as the workers' OUTBOX_ROUTES_FILE (its `[[schedule]]` tables are the workers' only).
    #[arg(long, env = "OUTBOX_ROUTES_FILE", global = true)]
    routes_file: Option<std::path::PathBuf>,
    /// Machine-readable output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending migrations of every set (or those --set names); --status lists applied and pending ones, --dry-run what would be applied.
    #[command(after_help = concat!("Examples:\n  outbox migrate\n  outbox migrate --set core\n  outbox migrate --status\n  outbox migrate --dry-run --json\n\n", exit_codes!()))]
    Migrate(migrate::MigrateArgs),
    /// Counts by status and queue, oldest due pending age, the pending alert.
    #[command(after_help = concat!("Examples:\n  outbox stats\n  outbox stats --json | jq .by_status\n\n", exit_codes!()))]
    Stats,
    /// Backlog, due, running, done, dead and stalled workers of every queue; Redis' persistence and loss marker; workflow executions stuck in queued or running.
    #[command(after_help = concat!("Examples:\n  outbox health\n  outbox health --json --stall-after-secs 300\n  OUTBOX_QUEUE_PREFIX=staging: outbox health\n\n", exit_codes!()))]
    Health(health_cmd::HealthArgs),
    /// The dead jobs of a queue and why each failed.
    #[command(after_help = concat!("Examples:\n  outbox dead outbox.webhook\n  outbox dead toolctrl.email --limit 100 --json\n\n", exit_codes!()))]
    Dead(dead::DeadArgs),
    /// List outbox rows, oldest first; says how many match when it shows fewer.
    #[command(after_help = concat!("Examples:\n  outbox list --status failed --limit 20\n  outbox list --type-prefix webhook. --json | jq '.[].id'\n  outbox list | head\n\n", exit_codes!()))]
    List(list::ListArgs),
    /// One row with its payload and requeue history.
    #[command(after_help = EXIT_CODES)]
    Show {
        /// The event id.
        id: Uuid,
    },
    /// Put FAILED or CANCELLED rows (DONE with --replay) back to PENDING: one id, or every row the filters match (FAILED without --status), in batches.
    #[command(after_help = concat!("Examples:\n  outbox requeue 0190f3c2-7d1e-7a3b-9c4d-5e6f7a8b9c0d --reason \"endpoint fixed\"\n  outbox requeue --status failed --type-prefix webhook. --dry-run\n  outbox requeue --status done --replay --tenant acme --yes\n\n", exit_codes!()))]
    Requeue(RequeueArgs),
    /// Put the dead jobs of a queue back on it, due now (all, or --task-id ones); --dry-run lists them; more than --confirm-above need --yes.
    #[command(name = "retry-dead", after_help = concat!("Examples:\n  outbox retry-dead outbox.webhook --dry-run\n  outbox retry-dead toolctrl.email --task-id email:0190f3c2-7d1e-7a3b-9c4d-5e6f7a8b9c0d\n  outbox retry-dead outbox.webhook --yes\n\n", exit_codes!()))]
    RetryDead(retry_dead::RetryDeadArgs),
    /// Set PENDING or FAILED rows to CANCELLED, each with a history entry (who, why, what it was); PROCESSING and DONE rows are refused.
    #[command(after_help = concat!("Examples:\n  outbox cancel 0190f3c2-7d1e-7a3b-9c4d-5e6f7a8b9c0d --reason \"customer withdrew\"\n  outbox cancel <id> <id> --dry-run --json\n\n", exit_codes!()))]
    Cancel(cancel::CancelArgs),
    /// Ordering keys held on an event that failed for good: list them, or release one (deliver the event again, or --skip-event to move past it).
    #[command(after_help = concat!("Examples:\n  outbox ordering list\n  outbox ordering release order-7\n  outbox ordering release order-7 --skip-event --reason \"refund handled by hand\"\n\n", exit_codes!()))]
    Ordering(ordering::OrderingArgs),
    /// Partition outbox_event by creation time (convert), or list its partitions (status); retention then drops whole partitions of old DONE rows.
    #[command(after_help = concat!("Examples:\n  outbox partition status\n  outbox partition convert --unit day --ahead 7\n\n", exit_codes!()))]
    Partition(partition::PartitionArgs),
    /// Find the DONE rows whose job Redis lost (or a job derived from it) and push them again; --dry-run lists them.
    #[command(after_help = EXIT_CODES)]
    Reconcile(reconcile::ReconcileArgs),
    /// Workflows: validate, save, publish and list versions of definitions; start, answer and cancel runs; list executions or show one with its block runs.
    #[command(after_help = EXIT_CODES)]
    Workflow(workflow::WorkflowArgs),
    /// Periodic events: each schedule's last tick (published, or passed over at its first start), as the workers recorded it.
    #[command(after_help = concat!("Examples:\n  outbox schedules\n  outbox schedules --json\n\n", exit_codes!()))]
    Schedules,
    /// Print the shell completion script (bash, elvish, fish, powershell, zsh).
    #[command(after_help = concat!("Examples:\n  outbox completions bash > /etc/bash_completion.d/outbox\n  outbox completions zsh > \"${fpath[1]}/_outbox\"\n\n", exit_codes!()))]
    Completions(completions::CompletionsArgs),
    /// Publish a probe event (and with --workflow run the probe workflow) and wait until a dispatcher hands it off and a worker handles it; names what is missing on timeout.
    #[command(after_help = EXIT_CODES)]
    Probe(probe::ProbeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("outbox: cannot start: {e}");
            return ExitStatus::Error.into();
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(status) => status.into(),
        Err(Failure { status, error }) => {
            eprintln!("outbox: error: {error:#}");
            status.into()
        }
    }
}

/// `--queue-prefix`: empty, or ending with ':' as the workers require.
fn queue_prefix(prefix: &str) -> Result<String, String> {
    QueueNamespace::checked(prefix)
        .map(|_| prefix.to_owned())
        .map_err(|e| e.problem.to_owned())
}

/// The standard routing table plus the rules of `--routes-file`, when given.
fn router(cli: &Cli) -> Result<Router> {
    let standard = outbox_catalog::standard_router().context("the built-in routing table")?;
    let Some(path) = &cli.routes_file else {
        return Ok(standard);
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the routes file {}", path.display()))?;
    standard
        .with_routes_file(&text)
        .with_context(|| format!("invalid routes file {}", path.display()))
}

fn database_url(cli: &Cli) -> Result<&str> {
    cli.database_url
        .as_deref()
        .context("no database: set DATABASE_URL or pass --database-url")
}

/// A Postgres connection as the workers open theirs (`sslmode` and
/// `sslrootcert` in the URL, see `outbox_pg::PgConnectOptions`).
async fn connect(cli: &Cli) -> Result<AsyncPgConnection> {
    let url = database_url(cli)?;
    let options = outbox_pg::PgConnectOptions::from_url(url)
        .with_context(|| format!("invalid DATABASE_URL {}", redact_url(url)))?;
    options
        .connect()
        .await
        .with_context(|| format!("cannot connect to Postgres at {}", redact_url(url)))
}

fn redis(cli: &Cli) -> Result<outbox_queue::RedisConnection> {
    let url = cli
        .redis_url
        .as_deref()
        .context("no Redis: set REDIS_URL or pass --redis-url")?;
    Ok(outbox_queue::connect(&RedisSettings {
        ca_cert: cli.redis_ca_cert.clone(),
        ..RedisSettings::new(url)
    })?)
}

fn print_json(value: &impl Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

async fn run(cli: Cli) -> Outcome {
    match &cli.command {
        Command::Migrate(args) => migrate::run(&cli, args).await,
        Command::Completions(args) => completions::run(args),
        Command::Stats => stats::stats(&cli).await,
        Command::Health(args) => health_cmd::health(&cli, args).await,
        Command::Dead(args) => dead_cmd(&cli, args).await,
        Command::List(args) => list::list(&cli, args).await,
        Command::Show { id } => show::show(&cli, *id).await,
        Command::Requeue(args) => requeue::command::run(&cli, args).await,
        Command::Workflow(args) => workflow::run(&cli, args).await,
        Command::Probe(args) => probe::run(&cli, args).await,
        Command::Reconcile(args) => reconcile::run(&cli, args).await,
        Command::RetryDead(args) => retry_dead::run(&cli, args).await,
        Command::Cancel(args) => cancel::run(&cli, args).await,
        Command::Schedules => schedules::run(&cli).await,
        Command::Ordering(args) => ordering::run(&cli, args).await,
        Command::Partition(args) => partition::run(&cli, args).await,
    }
}

async fn dead_cmd(cli: &Cli, args: &dead::DeadArgs) -> Outcome {
    dead::check_queue(
        &args.queue,
        &known::Known::read_if_possible(cli).await?.queues(),
    )?;
    let mut redis = redis(cli)?;
    let namespace = QueueNamespace::for_redis(
        cli.queue_prefix.clone(),
        cli.redis_url.as_deref().unwrap_or_default(),
    );
    let jobs = dead::dead_jobs(&mut redis, &namespace, args)
        .await
        .with_context(|| {
            format!(
                "cannot read the dead jobs of {} from Redis at {}",
                args.queue,
                redact_url(cli.redis_url.as_deref().unwrap_or_default())
            )
        })?;
    if cli.json {
        print_json(&json!({ "queue": args.queue, "dead": jobs }))?;
    } else {
        dead::print_table(&args.queue, &jobs);
    }
    Ok(ExitStatus::alert_if(jobs.is_empty()))
}
