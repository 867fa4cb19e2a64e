//! `cargo xtask demo`: the real binaries end to end, every route and two
//! workflows, with progress and an exactly-once verdict.
//!
//! Finds Postgres and Redis or starts private ones (installing their
//! packages when it may, see [`crate::install`]); builds `worker-general`,
//! `worker-mail` and `outbox` (release, or `--debug`), or takes them from a
//! container image (`--image`, run by podman on the host's network);
//! migrates a fresh
//! `outbox_demo` database; starts an SMTP sink, an HTTP sink and the two
//! workers as child processes (`worker-general` with the dispatcher);
//! creates the tenants, their endpoints and workflows; publishes the mix
//! (`--events`, see [`publish`]); answers the workflow run
//! that waits for input; kills `worker-general` with SIGKILL once mid-run
//! and starts it again (`--no-chaos` skips this); waits until everything
//! due has settled; prints the summary and the verdict
//! ([`verdict`]). Exit 0 only when the verdict passes.
//! `--keep-running` leaves it all up until Ctrl-C; otherwise everything it
//! started is stopped and removed.

mod observe;
mod progress;
mod publish;
mod report;
mod stack;
mod verdict;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use outbox_queue::{QueueNamespace, RedisSettings};
use outbox_test_support::{HttpSink, SmtpSink};
use outbox_worker::{Group, WorkerConfig, handler_group};

use crate::services;
use observe::Watch;
use progress::{Bar, Progress};
use publish::Mix;
use report::say;
use stack::{Binaries, Profile, Worker};
use verdict::{Ledger, Setup};

/// Events published by default.
pub const DEFAULT_EVENTS: usize = 3_000;
/// The demo's database (a run of `cargo xtask test` appends its pid).
const DEMO_DB: &str = "outbox_demo";
/// The demo's Redis key prefix (a run of `cargo xtask test` adds its pid).
const DEMO_PREFIX: &str = "outbox-demo";
/// The share of handed-off events after which `worker-general` is killed.
const KILL_AT_PERCENT: u64 = 40;

/// Options of `cargo xtask demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// How many events to publish (about: transactions are not split).
    #[arg(long, default_value_t = DEFAULT_EVENTS)]
    pub events: usize,
    /// Do not kill worker-general mid-run.
    #[arg(long)]
    pub no_chaos: bool,
    /// Leave the workers, sinks, database and queues up after the summary
    /// and print where to look; Ctrl-C stops everything.
    #[arg(long)]
    pub keep_running: bool,
    /// Run the debug build of the binaries (what `cargo xtask test` has
    /// already built) instead of building the release build.
    #[arg(long, conflicts_with = "image")]
    pub debug: bool,
    /// Run the workers from this container image (`cargo xtask image`
    /// builds `outbox:local`) with podman, on the host's network, instead
    /// of building them; the database, Redis prefix and containers are
    /// named `outbox_demo_image`, `outbox-demo-image:` and
    /// `outbox-demo-image-<worker>`.
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Never install missing Postgres or Redis packages; print the command
    /// instead.
    #[arg(long)]
    pub no_install: bool,
    /// Appended to the database name and the Redis prefix (unique per run
    /// of `cargo xtask test`).
    #[arg(skip)]
    pub tag: String,
}

impl DemoArgs {
    /// The run of `cargo xtask test`: 300 events, the debug binaries, names
    /// unique to the process.
    pub fn for_tests() -> Self {
        Self {
            events: 300,
            no_chaos: false,
            keep_running: false,
            debug: true,
            image: None,
            no_install: true,
            tag: format!("_test{}", std::process::id()),
        }
    }
}

/// What the demo started and must stop.
struct Running {
    general: Option<Worker>,
    mail: Option<Worker>,
}

impl Running {
    /// Fails when a worker has exited.
    fn check_alive(&mut self) -> Result<()> {
        for worker in [&mut self.general, &mut self.mail].into_iter().flatten() {
            worker.check_alive()?;
        }
        Ok(())
    }

    async fn stop(&mut self) {
        for worker in [self.general.take(), self.mail.take()]
            .into_iter()
            .flatten()
        {
            let name = worker.name;
            if let Err(e) = worker.stop().await {
                eprintln!("demo: stopping {name}: {e:#}");
            }
        }
    }
}

/// Runs the demo; an error when the verdict fails or something broke.
pub async fn run(mut args: DemoArgs) -> Result<()> {
    // A run on the image keeps apart from a run on the host's build.
    if args.image.is_some() && args.tag.is_empty() {
        args.tag = "_image".to_owned();
    }
    init_tracing();
    let progress = Progress::new();
    let profile = if args.debug {
        Profile::Debug
    } else {
        Profile::Release
    };
    // Built before any server is started, so a failed build leaves nothing
    // running.
    let binaries = match &args.image {
        Some(image) => stack::image(image)?,
        None => stack::build(profile, &progress).await?,
    };
    let found = services::ensure_with(crate::install::Install::from_flag(args.no_install)).await?;
    let database = format!("{DEMO_DB}{}", args.tag);
    let prefix = format!("{DEMO_PREFIX}{}:", args.tag.replace('_', "-"));
    let scratch = crate::bench::kit::Scratch::create(&found.database_url, &database).await?;
    crate::bench::kit::clear_redis(&found.redis_url, &prefix).await?;
    say!("database  {}", scratch.url);
    say!("redis     {} (queues prefixed {prefix:?})", found.redis_url);
    say!("migrated  {} migration(s)", scratch.applied.len());
    let smtp = SmtpSink::start().await;
    let http = HttpSink::start().await;
    let mut running = Running {
        general: None,
        mail: None,
    };
    let stage = Stage {
        args: &args,
        url: scratch.url.clone(),
        redis_url: found.redis_url.clone(),
        prefix: prefix.clone(),
        binaries: &binaries,
        progress: &progress,
        smtp: &smtp,
        http: &http,
        logs: crate::cmd::target_dir().join(format!("demo{}", args.tag)),
    };
    let outcome = tokio::select! {
        outcome = stage.run(&mut running) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    if args.keep_running && outcome.is_ok() {
        stage.print_keep_running(&running);
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("demo: Ctrl-C: stopping everything it started");
    }
    // Best effort: one failing step does not keep the others from running.
    running.stop().await;
    let logs = stage.logs;
    drop((smtp, http));
    clean_up(&found, scratch, &prefix, &database).await;
    let passed = outcome?;
    if !passed {
        bail!(
            "the verdict failed; the workers' logs are in {}",
            logs.display()
        );
    }
    // The logs of a run that passed tell nothing new.
    if !args.keep_running {
        let _ = std::fs::remove_dir_all(&logs);
    }
    Ok(())
}

/// Logs on stderr, warnings and up.
fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        // The publisher logs the rolled-back transaction's refused event
        // type, which the demo provokes on purpose.
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "warn,apalis=error,apalis_core=error,outbox_publish=off",
        ))
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// Removes the run's Redis keys and database and stops the servers it
/// started; best effort, each failure reported and the rest still done.
async fn clean_up(
    found: &services::Services,
    scratch: crate::bench::kit::Scratch,
    prefix: &str,
    database: &str,
) {
    if let Err(e) = crate::bench::kit::clear_redis(&found.redis_url, prefix).await {
        eprintln!("demo: removing the Redis keys under {prefix:?}: {e:#}");
    }
    if let Err(e) = scratch.remove().await {
        eprintln!("demo: dropping the database {database}: {e:#}");
    }
    for server in &found.started {
        eprintln!("demo: stopping {}", server.name());
        if let Err(e) = server.stop() {
            eprintln!("demo: stopping {}: {e:#}", server.name());
        }
    }
}

/// One run against prepared services.
struct Stage<'a> {
    args: &'a DemoArgs,
    url: String,
    redis_url: String,
    prefix: String,
    binaries: &'a Binaries,
    progress: &'a Progress,
    smtp: &'a SmtpSink,
    http: &'a HttpSink,
    /// The workers' log files.
    logs: PathBuf,
}

impl Stage<'_> {
    /// The workers' environment.
    fn env(&self, group: Group) -> Vec<(String, String)> {
        let dispatcher = group == Group::General;
        [
            ("DATABASE_URL", self.url.clone()),
            ("REDIS_URL", self.redis_url.clone()),
            ("OUTBOX_QUEUE_PREFIX", self.prefix.clone()),
            ("OUTBOX_DISPATCHER_ENABLED", dispatcher.to_string()),
            ("OUTBOX_DISPATCH_INTERVAL_MS", "200".to_owned()),
            // A killed dispatcher's claimed rows come back after 5 s.
            ("OUTBOX_LOCK_TIMEOUT_MS", "5000".to_owned()),
            // The mix's unroutable event is dead-lettered at once (in
            // production it waits OUTBOX_UNROUTED_GRACE_SECONDS for a route).
            ("OUTBOX_UNROUTED_GRACE_SECONDS", "0".to_owned()),
            ("SMTP_URL", self.smtp.url()),
            ("MAIL_FROM", "shop@acme.test".to_owned()),
            // The sinks listen on loopback.
            ("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "true".to_owned()),
            ("WEBHOOK_TIMEOUT_MS", "5000".to_owned()),
            ("DELIVERY_LEASE_MS", "10000".to_owned()),
            // A killed worker's jobs are taken over after 4 s.
            ("WORKER_HEARTBEAT_MS", "1000".to_owned()),
            ("WORKER_SHUTDOWN_GRACE_MS", "3000".to_owned()),
            ("WORKER_POLL_INTERVAL_MS", "200".to_owned()),
            ("WORKER_GAUGE_INTERVAL_MS", "1000".to_owned()),
            ("DATABASE_POOL_SIZE", "5".to_owned()),
            (
                "RUST_LOG",
                "info,apalis=warn,apalis_core=warn,apalis_redis=warn".to_owned(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The queues the two workers consume, from their handler groups built
    /// as the binaries build them.
    async fn subscribed(&self) -> Result<Vec<String>> {
        let pool = outbox_pg::connect_pool(&self.url, 1).await?;
        let redis = outbox_queue::connect(&RedisSettings::new(&self.redis_url))?;
        let namespace = QueueNamespace::prefixed(self.prefix.clone());
        let mut queues = Vec::new();
        for group in [Group::General, Group::Mail] {
            let env: HashMap<String, String> = self.env(group).into_iter().collect();
            let config = WorkerConfig::from_lookup(group, &|name| env.get(name).cloned())?;
            let handlers = handler_group(group, &config, &pool, &redis, &namespace)?;
            queues.extend(handlers.queues().into_iter().map(str::to_owned));
        }
        Ok(queues)
    }

    /// Set-up, workers, the mix, the wait, the summary; true when the
    /// verdict passed.
    async fn run(&self, running: &mut Running) -> Result<bool> {
        let mut conn = outbox_pg::establish(&self.url).await?;
        let chaos = !self.args.no_chaos;
        let mut setup: Setup = publish::setup(&mut conn, self.http, chaos).await?;
        setup.subscribed = self.subscribed().await?.into_iter().collect();
        say!("tenants   acme, globex (webhook endpoints, sales inboxes), initech (neither)");
        say!(
            "acme      plugins on order.shipped and workflow.executed; workflows {:?} (live, \
             event trigger) and {:?} (waitForInput)",
            verdict::ORDER_WORKFLOW,
            verdict::APPROVAL_WORKFLOW
        );
        self.start_workers(running).await?;

        let published = Arc::new(AtomicUsize::new(0));
        let mix = Mix {
            url: self.url.clone(),
            events: self.args.events,
            published: published.clone(),
        };
        let publishing = tokio::spawn(async move { mix.run().await });
        let routed = outbox_catalog::Catalog::built_in().routed_queues();
        let watched: Vec<String> = setup
            .subscribed
            .iter()
            .filter(|q| routed.contains(&q.as_str()))
            .cloned()
            .collect();
        let redis = outbox_queue::connect(&RedisSettings::new(&self.redis_url))?;
        let namespace = QueueNamespace::prefixed(self.prefix.clone());
        let mut watch = Watch::new(
            outbox_pg::establish(&self.url).await?,
            redis.clone(),
            namespace.clone(),
            watched,
            self.smtp,
            self.http,
        );
        let started = Instant::now();
        let ledger = self
            .wait(running, &mut watch, publishing, &published, chaos)
            .await?;
        let seen = watch.observe(&ledger).await?;
        let verdict = verdict::judge(&setup, &ledger, &seen);
        say!(
            "\n== summary: {} events committed by the demo, {:.1} s ==",
            ledger.committed.len(),
            started.elapsed().as_secs_f64()
        );
        report::rows(&mut conn).await?;
        let mut redis = redis;
        report::queues(&mut redis, &namespace).await?;
        report::sinks(&seen);
        report::latencies(watch.latencies().await?);
        report::verdict(&verdict);
        Ok(verdict.passed())
    }

    /// The container name of the worker `name` (with `--image`).
    fn container(&self, name: &str) -> String {
        format!("{DEMO_PREFIX}{}-{name}", self.args.tag.replace('_', "-"))
    }

    /// Starts both workers, their logs under `self.logs`.
    async fn start_workers(&self, running: &mut Running) -> Result<()> {
        let logs = &self.logs;
        std::fs::create_dir_all(logs)?;
        let line = self
            .progress
            .spinner("starting worker-general and worker-mail");
        running.general = Some(
            Worker::start(
                "worker-general",
                self.binaries,
                self.env(Group::General),
                logs,
                self.container("worker-general"),
            )
            .await?,
        );
        running.mail = Some(
            Worker::start(
                "worker-mail",
                self.binaries,
                self.env(Group::Mail),
                logs,
                self.container("worker-mail"),
            )
            .await?,
        );
        line.finish(&format!("ready; logs in {}", logs.display()));
        Ok(())
    }

    /// Polls until everything settled (or the time limit): collects the
    /// publisher's ledger, answers the waiting run, kills worker-general
    /// once; returns the ledger.
    async fn wait(
        &self,
        running: &mut Running,
        watch: &mut Watch<'_>,
        publishing: tokio::task::JoinHandle<Result<Ledger>>,
        published: &AtomicUsize,
        chaos: bool,
    ) -> Result<Ledger> {
        let target = self.args.events as u64;
        let mut bars = [
            self.progress.bar("published", target),
            self.progress.bar("dispatched", target),
            self.progress.bar("handled", target),
        ];
        let mut tasks = Tasks {
            publishing,
            ledger: None,
            continuing: None,
        };
        let mut phase = Phase {
            published: false,
            continued: false,
            killed: !chaos,
        };
        let mut settled_polls = 0;
        let started = Instant::now();
        let limit = wait_limit(target);
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            running.check_alive()?;
            let now = watch.snapshot().await?;
            let count = published.load(Ordering::Relaxed) as u64;
            bars[0].set(count, target.max(count));
            bars[1].set(now.dispatched, now.due);
            bars[2].set(now.handled, now.to_subscribed);
            self.collect(&mut tasks, &mut phase, &mut bars[0]).await?;
            if kill_due(phase.killed, now.dispatched, target) {
                phase.killed = true;
                self.kill_general(running, now.dispatched, target).await?;
            }
            settled_polls = if phase.settled(&now) {
                settled_polls + 1
            } else {
                0
            };
            let finish = match after_poll(settled_polls, started.elapsed(), limit) {
                AfterPoll::Poll => continue,
                AfterPoll::Settled => "",
                AfterPoll::TimedOut => {
                    self.progress.note(&format!(
                        "demo: not settled after {} s: judging what is there",
                        limit.as_secs()
                    ));
                    "(timed out)"
                }
            };
            bars[1].finish(finish);
            bars[2].finish(finish);
            return tasks.ledger.context("the publisher did not finish in time");
        }
    }

    /// Takes in what finished since the last poll: the publisher's ledger
    /// (then starts answering the run it left waiting), and the answer's
    /// event.
    async fn collect(&self, tasks: &mut Tasks, phase: &mut Phase, bar: &mut Bar) -> Result<()> {
        if tasks.ledger.is_none() && tasks.publishing.is_finished() {
            let (done, answering) = self.answer_waiting_run(&mut tasks.publishing).await?;
            bar.finish("");
            tasks.continuing = Some(answering);
            tasks.ledger = Some(done);
            phase.published = true;
        }
        if let (Some(task), Some(ledger)) = (&mut tasks.continuing, &mut tasks.ledger)
            && task.is_finished()
        {
            let id = task.await.context("the continuation panicked")??;
            ledger.committed.insert(id);
            tasks.continuing = None;
            phase.continued = true;
            self.progress
                .note("demo: the run waiting for input was answered (approved)");
        }
        Ok(())
    }

    /// The finished publisher's ledger, and the task that answers the run
    /// it left waiting for input.
    async fn answer_waiting_run(
        &self,
        publishing: &mut tokio::task::JoinHandle<Result<Ledger>>,
    ) -> Result<(Ledger, tokio::task::JoinHandle<Result<uuid::Uuid>>)> {
        let done = publishing.await.context("the publisher panicked")??;
        let id = done.approval.context("no waiting run was requested")?;
        let url = self.url.clone();
        let answering = tokio::spawn(async move { publish::continue_waiting_run(&url, id).await });
        Ok((done, answering))
    }

    /// The chaos step: SIGKILL worker-general and start it again.
    async fn kill_general(
        &self,
        running: &mut Running,
        dispatched: u64,
        target: u64,
    ) -> Result<()> {
        let general = running.general.as_mut().context("worker-general")?;
        let which = general.which();
        let at = Instant::now();
        general.kill_and_restart().await?;
        self.progress.note(&format!(
            "demo: chaos: SIGKILL worker-general ({which}) with {dispatched} of about {target} \
             events dispatched; restarted as {} in {:.1} s",
            general.which(),
            at.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// Where to look while everything stays up.
    fn print_keep_running(&self, running: &Running) {
        say!("\neverything keeps running; Ctrl-C stops it all");
        for worker in [&running.general, &running.mail].into_iter().flatten() {
            say!(
                "  {:<15} http://{}/healthz  http://{}/readyz  http://{}/metrics  (log {})",
                worker.name,
                worker.addr,
                worker.addr,
                worker.addr,
                worker.log.display()
            );
        }
        let cli = format!(
            "{} --database-url {} --redis-url {} --queue-prefix {}",
            self.binaries.cli(),
            self.url,
            self.redis_url,
            self.prefix
        );
        say!("  try:");
        for command in [
            "stats",
            "health",
            "dead outbox.webhook",
            "workflow executions",
            "requeue --status failed --dry-run",
        ] {
            say!("    {cli} {command}");
        }
    }
}

/// The tasks the wait follows: the publisher, then the answer to the run
/// it left waiting for input.
struct Tasks {
    publishing: tokio::task::JoinHandle<Result<Ledger>>,
    /// The publisher's ledger, once it finished.
    ledger: Option<Ledger>,
    /// The answer to the waiting run, while it runs.
    continuing: Option<tokio::task::JoinHandle<Result<uuid::Uuid>>>,
}

/// What the wait has done so far.
struct Phase {
    /// The publisher finished and its ledger is in.
    published: bool,
    /// The run waiting for input was answered.
    continued: bool,
    /// worker-general was killed (or chaos is off).
    killed: bool,
}

impl Phase {
    /// Everything happened and the snapshot `now` shows nothing left to do.
    fn settled(&self, now: &observe::Snapshot) -> bool {
        self.published
            && self.continued
            && self.killed
            && now.open == 0
            && now.idle
            && now.running_executions == 0
    }
}

/// How long the wait goes on for `target` events before it judges what is
/// there: 3 minutes, and 40 ms an event.
fn wait_limit(target: u64) -> Duration {
    Duration::from_secs(180) + Duration::from_millis(40 * target)
}

/// What the wait does after a poll.
#[derive(Debug, PartialEq, Eq)]
enum AfterPoll {
    /// Polls again.
    Poll,
    /// Stops: two polls in a row found everything settled.
    Settled,
    /// Stops: the time limit passed first.
    TimedOut,
}

/// Decides after a poll, from how many polls in a row found everything
/// settled and how long the wait has run against its `limit`.
fn after_poll(settled_polls: u32, elapsed: Duration, limit: Duration) -> AfterPoll {
    if settled_polls >= 2 {
        AfterPoll::Settled
    } else if elapsed > limit {
        AfterPoll::TimedOut
    } else {
        AfterPoll::Poll
    }
}

/// Whether to kill worker-general now: once, when `KILL_AT_PERCENT` of the
/// `target` events are dispatched.
fn kill_due(killed: bool, dispatched: u64, target: u64) -> bool {
    !killed && dispatched * 100 >= target * KILL_AT_PERCENT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_general_is_killed_once_at_the_percentage() {
        assert!(!kill_due(false, 39, 100));
        assert!(kill_due(false, 40, 100));
        assert!(!kill_due(true, 90, 100));
    }

    #[test]
    fn the_wait_stops_after_two_settled_polls_or_past_its_limit() {
        let limit = wait_limit(100);
        assert_eq!(limit, Duration::from_secs(184));
        let within = Duration::from_secs(10);
        let past = limit + Duration::from_millis(1);
        assert_eq!(after_poll(0, within, limit), AfterPoll::Poll);
        assert_eq!(after_poll(1, within, limit), AfterPoll::Poll);
        assert_eq!(after_poll(2, within, limit), AfterPoll::Settled);
        assert_eq!(after_poll(1, past, limit), AfterPoll::TimedOut);
        assert_eq!(
            after_poll(2, past, limit),
            AfterPoll::Settled,
            "settled wins over late"
        );
    }
}
