//! The dispatcher: claim, route, hand off, record.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicI32;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use futures::StreamExt;
use outbox_model::{MAX_PAYLOAD_BYTES, OutboxEvent};
use outbox_pg::PgPool;
use outbox_queue::RedisConnection;
use outbox_queue::{OutboxJob, QueueNamespace, push_jobs};
use outbox_trace::{TraceContext, continue_trace};
use tokio::sync::{Mutex, Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, instrument};
use uuid::Uuid;

mod outcome;
mod unrouted;

pub use self::outcome::{AfterFailedPush, after_failed_push};
pub use self::unrouted::{ForWantOfARoute, for_want_of_a_route, revive_routable};

use self::outcome::Outcomes;
use crate::draining::Draining;
use crate::gate::WakeGate;
use crate::vacuum::Upkeep;
use crate::{DispatchError, DispatcherConfig, Receivers, RedisGuard, RedisGuardSettings, Router};
use outbox_store::{self as store, Failure, Lease};

/// Most jobs sent to Redis in one push call.
const MAX_JOBS_PER_PUSH: usize = 500;

/// How often the pending gauge is refreshed at most.
const GAUGE_REFRESH: Duration = Duration::from_secs(5);
/// The loops of a dispatcher that answer wake-ups (insert notifications,
/// the wake gate, [`Dispatcher::wake`]) and the poll interval. Loops beyond
/// these only help drain a backlog: one is woken when a loop's claim comes
/// back full (at the claim, so that it claims while that loop pushes), it
/// ticks back to back while its own batches come back full, and waits
/// again after the first that does not. Without this, every loop polled
/// and then kept ticking back to back on a few rows a claim under a steady
/// load, so four loops at 500 events/s kept the machine busier than two
/// and raised the latency (docs/performance.md, "Four loops").
pub const WAKE_LOOPS: usize = 2;

/// What one tick did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows handed off and marked DONE.
    pub dispatched: usize,
    /// Of those, jobs that already existed in Redis (a re-claim after a crash).
    pub duplicates: usize,
    /// Rows put back with backoff.
    pub retried: usize,
    /// Rows dead-lettered after their last retry.
    pub failed: usize,
    /// Rows dead-lettered for want of a route (their grace period is over).
    pub unrouted: usize,
    /// Rows no route matches, put back to wait for one (within their grace
    /// period).
    pub waiting_for_route: usize,
    /// Rows dead-lettered because their payload exceeds
    /// [`outbox_model::MAX_PAYLOAD_BYTES`] (written by plain SQL).
    pub oversized: usize,
    /// Rows released unhanded because the dispatcher is stopping.
    pub released: usize,
    /// Rows whose lease expired and was taken over before the outcome was recorded.
    pub lost_leases: usize,
}

impl TickReport {
    /// Whether a push to Redis failed in this tick (rows put back, or
    /// dead-lettered after their last retry): Redis may come back as a new,
    /// empty server, so the Redis guard checks as soon as it answers.
    #[must_use]
    pub fn handoff_failed(&self) -> bool {
        self.retried + self.failed > 0
    }

    /// Whether the tick claimed a whole batch of `batch_size`: more rows
    /// are probably due, so the next tick starts at once instead of waiting.
    #[must_use]
    pub fn was_full(&self, batch_size: u32) -> bool {
        self.claimed >= batch_size as usize
    }
}

/// Moves committed outbox rows onto their queues. Cheap to share: run one
/// per process, as many processes as you like; `SKIP LOCKED` keeps them apart.
pub struct Dispatcher {
    pool: PgPool,
    database_url: String,
    redis: RedisConnection,
    namespace: QueueNamespace,
    router: Router,
    config: DispatcherConfig,
    wake: Arc<Notify>,
    /// Wakes a loop beyond the first [`WAKE_LOOPS`] (a claim came back full).
    more: Arc<Notify>,
    gauge_refreshed: Mutex<Option<Instant>>,
    guard: Option<Arc<RedisGuard>>,
    upkeep: Arc<Upkeep>,
    draining: Draining,
    /// Whether the ticks refresh `outbox_pending_due` themselves.
    pending_gauge: bool,
    /// How many of the loops run: all of `config.loops` until the
    /// dispatchers of the database are counted (see `crate::share`).
    share: watch::Sender<usize>,
}

/// One batch of jobs for one queue.
struct PushUnit {
    queue: String,
    events: Vec<OutboxEvent>,
}

enum PushResult {
    Pushed(PushUnit, usize),
    Failed(PushUnit, String),
    NotStarted(PushUnit),
}

impl Dispatcher {
    /// A dispatcher over `pool` (Postgres) and `redis`, pushing into
    /// `namespace`. `database_url` opens the dedicated listening connection.
    ///
    /// # Errors
    ///
    /// [`DispatchError::Config`] when `config` cannot work.
    pub fn new(
        pool: PgPool,
        database_url: impl Into<String>,
        redis: RedisConnection,
        namespace: QueueNamespace,
        router: Router,
        config: DispatcherConfig,
    ) -> Result<Self, DispatchError> {
        config.validate()?;
        // A dispatcher that shares its loops stands by until its first
        // count ranks it (see `crate::share`); one that does not runs them
        // all.
        let share = watch::Sender::new(if config.listen && config.loops_total > 0 {
            0
        } else {
            config.loops
        });
        Ok(Self {
            pool,
            database_url: database_url.into(),
            redis,
            namespace,
            router,
            upkeep: Arc::new(Upkeep::new(config.vacuum_every)),
            config,
            wake: Arc::new(Notify::new()),
            more: Arc::new(Notify::new()),
            gauge_refreshed: Mutex::new(None),
            guard: None,
            draining: Draining::default(),
            pending_gauge: true,
            share,
        })
    }

    /// Whether this dispatcher's loops drain a backlog (ticking back to
    /// back on full batches), for work that should yield to them: the
    /// workers give it to [`crate::run_retention`].
    #[must_use]
    pub fn draining(&self) -> Draining {
        self.draining.clone()
    }

    /// Runs a [`RedisGuard`] with [`Dispatcher::run`]: it keeps a marker in
    /// Redis, checks it at start, every `settings.check_every` and after
    /// every failed hand-off, and when Redis lost data pushes the lost jobs
    /// again (see `docs/reliability.md`). The workers switch it on; without
    /// it a Redis that forgets jobs goes unnoticed. `receivers` says what
    /// each queue's handler leaves behind (`outbox_catalog::Catalog::receivers`).
    #[must_use]
    pub fn with_redis_guard(mut self, settings: RedisGuardSettings, receivers: Receivers) -> Self {
        let queues = self
            .router
            .queues()
            .into_iter()
            .map(str::to_owned)
            .collect();
        self.guard = Some(Arc::new(RedisGuard::new(
            self.pool.clone(),
            self.redis.clone(),
            self.namespace.clone(),
            queues,
            receivers,
            settings,
        )));
        self
    }

    /// Leaves the gauge `outbox_pending_due` to the process's gauge task.
    /// By default a dispatcher's ticks count the due rows for it every 5 s,
    /// in every process; the count reads every due row through the claim
    /// index, so under a backlog N processes read it N times per interval,
    /// on the side that saturates first. The workers' gauge task counts
    /// once per interval for all the processes of a namespace
    /// ([`crate::stats::shared_pending_figures`]) and sets the same gauge:
    /// `worker-general` calls this (docs/scaling.md, "More processes
    /// against one").
    #[must_use]
    pub fn without_pending_gauge(mut self) -> Self {
        self.pending_gauge = false;
        self
    }

    /// The Redis guard, when [`Dispatcher::with_redis_guard`] set one.
    #[must_use]
    pub fn redis_guard(&self) -> Option<&Arc<RedisGuard>> {
        self.guard.as_ref()
    }

    /// The routing table in use.
    #[must_use]
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The configuration in use.
    #[must_use]
    pub fn config(&self) -> &DispatcherConfig {
        &self.config
    }

    /// How many of its [`DispatcherConfig::loops`] loops this dispatcher
    /// runs now: its share of [`DispatcherConfig::loops_total`] among the
    /// dispatchers listening on its database, counted every
    /// [`crate::SHARE_RECOUNT`] while [`Dispatcher::run`] runs (see
    /// [`crate::loops_to_run`]). The other loops wait, holding no
    /// connection. 0: it stands by (the dispatchers before it have the
    /// whole total, or it has not been counted yet): its first loop claims
    /// once per poll interval, without answering wake-ups or taking part
    /// in the wake gate.
    #[must_use]
    pub fn loops_running(&self) -> usize {
        *self.share.borrow()
    }

    /// Wakes the run loop now (as an insert notification would).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Runs until `shutdown` is cancelled, in `config.loops` loops at once
    /// (or its share of `config.loops_total`, [`Dispatcher::loops_running`]):
    /// a loop ticks on an insert notification (when `config.listen`), every
    /// `config.interval`, and back to back while full batches keep coming,
    /// waking an idle loop each time. On shutdown each loop claims nothing more,
    /// finishes the pushes already started, releases the rest of its claim
    /// back to `PENDING`, and returns.
    ///
    /// # Errors
    ///
    /// None so far: tick errors are logged and retried at the next tick.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), DispatchError> {
        // The listener's backend, by which the dispatchers of the database
        // rank themselves when they share their loops.
        let listener_pid = Arc::new(AtomicI32::new(0));
        let listener = self.config.listen.then(|| {
            tokio::spawn(crate::listener::listen(
                self.database_url.clone(),
                self.wake.clone(),
                listener_pid.clone(),
                shutdown.child_token(),
            ))
        });
        let gate = self.config.listen.then(|| Arc::new(WakeGate::default()));
        let gate_task = gate.clone().map(|gate| {
            tokio::spawn(crate::gate::run(
                self.database_url.clone(),
                gate,
                self.wake.clone(),
                shutdown.child_token(),
            ))
        });
        let guard = self
            .guard
            .clone()
            .map(|guard| tokio::spawn(guard.run(shutdown.child_token())));
        let upkeep = tokio::spawn(
            self.upkeep
                .clone()
                .run(self.pool.clone(), shutdown.child_token()),
        );
        let share = (self.config.listen && self.config.loops_total > 0).then(|| {
            tokio::spawn(crate::share::run(
                self.pool.clone(),
                self.config.loops,
                self.config.loops_total,
                listener_pid.clone(),
                self.share.clone(),
                shutdown.child_token(),
            ))
        });
        let unrouted_watch = tokio::spawn(unrouted::watch(
            self.pool.clone(),
            self.router.clone(),
            self.config.unrouted_recheck,
            shutdown.child_token(),
        ));
        tracing::info!(
            batch_size = self.config.batch_size,
            concurrency = self.config.concurrency,
            loops = self.config.loops,
            loops_total = self.config.loops_total,
            vacuum_every = self.config.vacuum_every,
            interval_ms = self.config.interval.as_millis() as u64,
            namespace = self.namespace.prefix(),
            redis_guard = guard.is_some(),
            "dispatcher started"
        );
        metrics::gauge!("outbox_dispatch_loops_running").set(self.loops_running() as f64);
        let loops: Vec<_> = (0..self.config.loops)
            .map(|n| {
                let role = if n < WAKE_LOOPS {
                    LoopRole::Answering(gate.clone())
                } else {
                    LoopRole::Helping
                };
                tokio::spawn(self.clone().run_loop(shutdown.clone(), role, n))
            })
            .collect();
        for (n, handle) in loops.into_iter().enumerate() {
            if let Err(e) = handle.await {
                tracing::error!(error = %e, dispatch_loop = n, "a dispatch loop stopped abnormally");
            }
        }
        if let Some(listener) = listener {
            listener.abort();
        }
        if let Some(gate_task) = gate_task {
            gate_task.abort();
        }
        // Shutdown does not wait for a vacuum round under way (a large table
        // takes a while); the server finishes or abandons it on its own.
        upkeep.abort();
        unrouted_watch.abort();
        if let Some(share) = share {
            share.abort();
        }
        if let Some(guard) = guard {
            let _ = guard.await;
        }
        tracing::info!("dispatcher stopped");
        Ok(())
    }

    /// One of the [`DispatcherConfig::loops`] loops of [`Dispatcher::run`],
    /// the `n`th from 0: ticks back to back while its batches come back
    /// full (waking an idle sibling each time, since more rows are probably
    /// due), otherwise waits: an answering loop for a wake-up or the poll
    /// interval, a helping one for a full claim of another loop
    /// (`tick_until` wakes it). With wake-ups on, what an answering loop
    /// does after a tick that was not full follows the wake gate
    /// ([`Next::after`]); a helping one leaves the gate alone. While `n` is
    /// not below [`Dispatcher::loops_running`] the loop is parked: it
    /// claims nothing until the share grows. With a share of 0 the
    /// dispatcher stands by: its first loop claims once per poll interval
    /// and leaves wake-ups and the wake gate to the dispatchers that run
    /// loops, so that a dead dispatcher still counted (its host gone
    /// without closing its connections) does not stop the hand-off, while
    /// the claims stay with the dispatchers the total was packed into.
    async fn run_loop(self: Arc<Self>, shutdown: CancellationToken, role: LoopRole, n: usize) {
        let helping = matches!(role, LoopRole::Helping);
        let gate = match role {
            LoopRole::Answering(gate) => gate,
            LoopRole::Helping => None,
        };
        let mut share = self.share.subscribe();
        // Whether the gate counts this loop as ticking back to back.
        let mut counted_busy = false;
        // Whether `draining` counts this loop's last tick as full.
        let mut counted_full = false;
        // A helping loop waits for a full claim of another loop before it
        // ticks.
        let mut wait_for_more = helping;
        while !shutdown.is_cancelled() {
            let running = *share.borrow_and_update();
            if n >= running.max(1) {
                // Parked: what it counted as busy or full no longer holds. A
                // loop that found nothing while this one ticked back to back
                // left the gate to it: the last busy loop to park asks for
                // it, as it would after an empty claim (unless the process
                // now stands by and leaves the gate to the others).
                self.draining.record(&mut counted_full, false);
                if let Some(gate) = &gate
                    && counted_busy
                    && !gate.idle_while_another_is_busy(&mut counted_busy)
                    && running > 0
                {
                    gate.want();
                }
                // Unparked, a helping loop waits for a full claim again.
                wait_for_more = helping;
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = share.changed() => {}
                }
                continue;
            }
            if wait_for_more {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = self.more.notified() => wait_for_more = false,
                    // Parked meanwhile, or not: look again.
                    _ = share.changed() => continue,
                }
            }
            let standby = running == 0;
            if standby && let Some(gate) = &gate {
                // A standby leaves the gate to the dispatchers that run
                // loops: it neither asks for it nor counts as busy.
                if counted_busy {
                    gate.idle_while_another_is_busy(&mut counted_busy);
                }
                gate.release();
            }
            let (claimed, full) = match self.tick_until(&shutdown).await {
                Ok(report) => {
                    self.upkeep.count(report.claimed);
                    if report.handoff_failed()
                        && let Some(guard) = &self.guard
                    {
                        guard.poke();
                    }
                    (
                        Some(report.claimed),
                        report.was_full(self.config.batch_size),
                    )
                }
                Err(e) => {
                    tracing::error!(error = %e, "dispatcher tick failed; claimed rows are re-claimed after their lease");
                    (None, false)
                }
            };
            if claimed.is_some_and(|n| n >= BUSY_CLAIM)
                && let Some(gate) = &gate
            {
                gate.release();
            }
            self.draining.record(&mut counted_full, full);
            if full && self.loops_running() > 1 {
                self.wake.notify_one();
            }
            let gate_of_loop = if standby { None } else { gate.as_deref() };
            let next = Next::after(
                claimed,
                full,
                gate_of_loop.map(|gate| (gate, &mut counted_busy)),
            );
            if standby {
                // Once per poll interval, whatever the claim found.
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(self.config.interval) => {}
                    _ = share.changed() => {}
                }
                continue;
            }
            if next == Next::TickAtOnce {
                continue;
            }
            if helping {
                wait_for_more = true;
                continue;
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(self.config.interval) => {}
                // Parked now, or not: look again (a tick too many at worst).
                _ = share.changed() => {}
            }
        }
        self.draining.record(&mut counted_full, false);
    }

    /// Spawns [`Dispatcher::run`] on the current runtime.
    pub fn spawn(
        self: Arc<Self>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<Result<(), DispatchError>> {
        tokio::spawn(self.run(shutdown))
    }

    /// One claim-and-hand-off round.
    ///
    /// # Errors
    ///
    /// When Postgres fails. Redis failures are not errors: they are recorded
    /// as retries on the rows.
    pub async fn tick(&self) -> Result<TickReport, DispatchError> {
        self.tick_until(&CancellationToken::new()).await
    }

    /// One round that stops handing off when `stop` fires: pushes already
    /// started finish and are recorded; the rest of the claim is released
    /// back to `PENDING` (what a graceful shutdown does mid-tick).
    ///
    /// # Errors
    ///
    /// As [`Dispatcher::tick`].
    #[instrument(
        name = "outbox.dispatch.tick",
        skip_all,
        fields(claimed, dispatched, retried, failed, unrouted)
    )]
    pub async fn tick_until(&self, stop: &CancellationToken) -> Result<TickReport, DispatchError> {
        let mut conn = self.pool.get().await?;
        self.refresh_pending_gauge(&mut conn).await;
        let lease_ms = i64::try_from(self.config.lock_timeout.as_millis()).unwrap_or(i64::MAX);
        let claimed = store::claim(&mut conn, self.config.batch_size, lease_ms).await?;
        let mut report = TickReport {
            claimed: claimed.len(),
            ..TickReport::default()
        };
        if claimed.is_empty() {
            return Ok(report);
        }
        metrics::counter!("outbox_dispatch_claimed_total").increment(claimed.len() as u64);
        if report.was_full(self.config.batch_size) && self.loops_running() > WAKE_LOOPS {
            // More rows are probably due: a helping loop claims them while
            // this tick pushes.
            self.more.notify_one();
        }

        let (claimed, mut failures) = refuse_oversized(claimed);
        report.oversized = failures.len();
        let (units, unrouted) = self.route(claimed);
        let (waits, unrouted_failures) = unrouted::sort(&unrouted, &self.config);
        report.unrouted = unrouted_failures.len();
        failures.extend(unrouted_failures);

        let results = self.push_all(units, stop).await;
        let mut outcomes = Outcomes::with_failures(failures);
        outcomes.waits = waits;
        outcomes.sort(results, &self.config, &mut report);
        self.record(&mut conn, &outcomes, &mut report).await?;
        Ok(report)
    }

    /// Records a tick's outcomes, each statement fenced by the rows' leases,
    /// then its metrics and its span's fields.
    async fn record(
        &self,
        conn: &mut AsyncPgConnection,
        outcomes: &Outcomes,
        report: &mut TickReport,
    ) -> Result<(), DispatchError> {
        let Outcomes {
            done,
            retries,
            failures,
            released,
            waits,
            latencies,
        } = outcomes;
        let done_ids = store::mark_done(conn, done).await?;
        let waiting_ids = store::mark_waiting_for_route(conn, waits).await?;
        let retried_ids = store::mark_retry(conn, retries).await?;
        let failed_ids = store::mark_failed(conn, failures).await?;
        let released_ids = store::release(conn, released).await?;
        report.dispatched = done_ids.len();
        report.retried = retried_ids.len();
        report.released = released_ids.len();
        report.waiting_for_route = waiting_ids.len();
        report.lost_leases = lost_leases(&[
            (waits.len(), waiting_ids.len()),
            (done.len(), done_ids.len()),
            (retries.len(), retried_ids.len()),
            (failures.len(), failed_ids.len()),
            (released.len(), released_ids.len()),
        ]);
        if report.lost_leases > 0 {
            tracing::warn!(
                lost = report.lost_leases,
                "leases expired before the outcome was recorded; another dispatcher owns those rows now"
            );
        }
        self.record_metrics(report, latencies, &done_ids);
        let span = tracing::Span::current();
        span.record("claimed", report.claimed);
        span.record("dispatched", report.dispatched);
        span.record("retried", report.retried);
        span.record("failed", report.failed);
        span.record("unrouted", report.unrouted);
        Ok(())
    }

    /// Groups claimed rows by queue in push-sized units; returns the unrouted apart.
    fn route(&self, claimed: Vec<OutboxEvent>) -> (Vec<PushUnit>, Vec<OutboxEvent>) {
        let mut by_queue: BTreeMap<String, Vec<OutboxEvent>> = BTreeMap::new();
        let mut unrouted = Vec::new();
        for event in claimed {
            match self.router.route(&event.event_type) {
                Some(queue) => by_queue.entry(queue.to_owned()).or_default().push(event),
                None => unrouted.push(event),
            }
        }
        let mut units = Vec::new();
        for (queue, events) in by_queue {
            let mut events = events.into_iter().peekable();
            while events.peek().is_some() {
                units.push(PushUnit {
                    queue: queue.clone(),
                    events: events.by_ref().take(MAX_JOBS_PER_PUSH).collect(),
                });
            }
        }
        (units, unrouted)
    }

    /// Pushes every unit, at most `concurrency` at once; units not started
    /// when `stop` fires are returned as such.
    async fn push_all(&self, units: Vec<PushUnit>, stop: &CancellationToken) -> Vec<PushResult> {
        futures::stream::iter(units)
            .map(|unit| {
                let mut redis = self.redis.clone();
                let namespace = &self.namespace;
                let span = tracing::info_span!("outbox.dispatch.push", queue = %unit.queue, jobs = unit.events.len());
                async move {
                    if stop.is_cancelled() {
                        return PushResult::NotStarted(unit);
                    }
                    let (jobs, handoffs) = jobs_of(&unit);
                    let result = push_jobs(&mut redis, namespace, &unit.queue, &jobs).await;
                    if let Err(e) = &result {
                        for span in &handoffs {
                            span.record("error", tracing::field::display(e));
                            span.record("otel.status_code", "ERROR");
                        }
                    }
                    // The hand-off spans end here, with the push.
                    drop(handoffs);
                    match result {
                        Ok(report) => PushResult::Pushed(unit, report.duplicates),
                        Err(e) => PushResult::Failed(unit, e.to_string()),
                    }
                }
                .instrument(span)
            })
            .buffer_unordered(self.config.concurrency)
            .collect()
            .await
    }

    fn record_metrics(
        &self,
        report: &TickReport,
        handed_off: &[(Uuid, String, DateTime<Utc>)],
        done_ids: &[Uuid],
    ) {
        let now = Utc::now();
        let done: std::collections::HashSet<&Uuid> = done_ids.iter().collect();
        let mut per_queue: BTreeMap<&str, u64> = BTreeMap::new();
        for (_, queue, due_at) in handed_off.iter().filter(|(id, _, _)| done.contains(id)) {
            *per_queue.entry(queue.as_str()).or_default() += 1;
            let latency = (now - *due_at).num_milliseconds().max(0) as f64 / 1000.0;
            metrics::histogram!("outbox_dispatch_handoff_latency_seconds", "queue" => queue.clone()).record(latency);
        }
        for (queue, n) in per_queue {
            metrics::counter!("outbox_dispatch_dispatched_total", "queue" => queue.to_owned())
                .increment(n);
        }
        metrics::counter!("outbox_dispatch_duplicates_total").increment(report.duplicates as u64);
        metrics::counter!("outbox_dispatch_retried_total").increment(report.retried as u64);
        metrics::counter!("outbox_dispatch_failed_total", "reason" => "retries_exhausted")
            .increment(report.failed as u64);
        metrics::counter!("outbox_dispatch_failed_total", "reason" => "unrouted")
            .increment(report.unrouted as u64);
        metrics::counter!("outbox_dispatch_failed_total", "reason" => "oversized")
            .increment(report.oversized as u64);
        metrics::counter!("outbox_dispatch_unrouted_total").increment(report.unrouted as u64);
        metrics::counter!("outbox_dispatch_waiting_for_route_total")
            .increment(report.waiting_for_route as u64);
        metrics::counter!("outbox_dispatch_released_total").increment(report.released as u64);
        metrics::counter!("outbox_dispatch_lost_leases_total").increment(report.lost_leases as u64);
    }

    async fn refresh_pending_gauge(&self, conn: &mut diesel_async::AsyncPgConnection) {
        if !self.pending_gauge {
            return;
        }
        // Another loop counting right now refreshes it for both: this tick
        // goes on instead of waiting for that count.
        let Ok(mut refreshed) = self.gauge_refreshed.try_lock() else {
            return;
        };
        if refreshed.is_some_and(|at| at.elapsed() < GAUGE_REFRESH) {
            return;
        }
        match store::due_pending_count(conn).await {
            Ok(n) => metrics::gauge!("outbox_pending_due").set(n as f64),
            Err(e) => tracing::warn!(error = %e, "cannot count pending rows"),
        }
        *refreshed = Some(Instant::now());
    }
}

/// A tick that claims at least this many rows finds the dispatcher busy
/// (publishers commit faster than a tick takes): it gives the wake gate
/// back so that publishers stop sending `NOTIFY`, and ticks back to back
/// until a claim comes back empty.
const BUSY_CLAIM: usize = 2;

/// What wakes a dispatch loop (see [`WAKE_LOOPS`]).
enum LoopRole {
    /// Wake-ups and the poll interval, with the process's wake gate when
    /// wake-ups are on.
    Answering(Option<Arc<WakeGate>>),
    /// Only a full batch of another loop.
    Helping,
}

/// What a dispatch loop does after a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Tick again at once.
    TickAtOnce,
    /// Wait for a wake-up or the poll interval.
    Wait,
}

impl Next {
    /// After a tick that claimed `claimed` rows (`None`: it failed),
    /// `full` when that was a whole batch. Without a gate (wake-ups off) a
    /// loop ticks again at once only after a full batch. With one, a loop
    /// waits only while inserts notify (see `gate`):
    /// - after a full batch, a busy claim (at least [`BUSY_CLAIM`] rows,
    ///   which gave the gate back), or any claim of rows while this process
    ///   neither holds nor queues for the gate: at once;
    /// - after an empty claim it asks for the gate and waits (the gate
    ///   wakes a loop to claim once more when it is granted), unless
    ///   another loop of the process still ticks back to back: that one
    ///   finds what comes, and asks for the gate when it finds nothing;
    /// - after a failed tick: it asks for the gate and waits.
    ///
    /// `gate` comes with whether it counts this loop as ticking back to
    /// back, which is updated with the answer.
    fn after(claimed: Option<usize>, full: bool, gate: Option<(&WakeGate, &mut bool)>) -> Self {
        let Some((gate, counted_busy)) = gate else {
            return if full { Self::TickAtOnce } else { Self::Wait };
        };
        let next = match claimed {
            _ if full => Self::TickAtOnce,
            // A failed tick (Postgres down, say) asks for the gate so that
            // inserts notify meanwhile.
            None => {
                gate.want();
                Self::Wait
            }
            Some(0) => {
                if !gate.idle_while_another_is_busy(counted_busy) {
                    gate.want();
                }
                return Self::Wait;
            }
            // A busy tick has just given the gate back; `covered` may not
            // say so yet.
            Some(claimed) if claimed < BUSY_CLAIM && gate.covered() => Self::Wait,
            Some(_) => Self::TickAtOnce,
        };
        gate.busy(counted_busy, next == Self::TickAtOnce);
        next
    }
}

/// The jobs of a unit, and the hand-off span of each event when this process
/// traces with OpenTelemetry (called inside the unit's push span).
///
/// An event's hand-off span continues the trace stored with its row (the
/// producer's `outbox.publish` span, or what a plain-SQL producer wrote) and
/// starts a new trace when there is none; either way it links to the push
/// span of the batch it went out in. The job carries the hand-off span's
/// context, so the subscriber's span becomes its child. A process without an
/// OpenTelemetry layer makes no spans here and passes the stored context on
/// unchanged.
fn jobs_of(unit: &PushUnit) -> (Vec<OutboxJob>, Vec<tracing::Span>) {
    let mut jobs: Vec<OutboxJob> = unit.events.iter().map(OutboxJob::from_event).collect();
    let Some(push) = TraceContext::of_span(&tracing::Span::current()) else {
        return (jobs, Vec::new());
    };
    let handoffs = jobs
        .iter_mut()
        .map(|job| {
            let span = tracing::info_span!(
                parent: None,
                "outbox.dispatch.handoff",
                otel.kind = "producer",
                event_id = %job.outbox_event_id,
                tenant_id = %job.tenant_id,
                event_type = %job.event_type,
                queue = %unit.queue,
                trace_id = tracing::field::Empty,
                error = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
            );
            push.link_from(&span);
            job.trace_context = continue_trace(&span, job.trace_context.as_ref());
            if let Some(cx) = &job.trace_context {
                span.record("trace_id", cx.trace_id());
            }
            span
        })
        .collect();
    (jobs, handoffs)
}

/// The trace id of the producer's span stored with `event`, for the log
/// lines (and error reports) about the row.
fn trace_id_of(event: &OutboxEvent) -> Option<String> {
    outbox_queue::stored_trace_context(event).map(|cx| cx.trace_id().to_owned())
}

/// Separates rows whose payload is too large to hand off (plain-SQL
/// producers bypass the publisher's limit): each fails alone, with its size
/// in the reason, and the rest of the claim proceeds.
fn refuse_oversized(claimed: Vec<OutboxEvent>) -> (Vec<OutboxEvent>, Vec<Failure>) {
    let mut failures = Vec::new();
    let mut kept = Vec::with_capacity(claimed.len());
    for event in claimed {
        let size = event.payload.get().len();
        if size <= MAX_PAYLOAD_BYTES {
            kept.push(event);
            continue;
        }
        tracing::error!(
            event_id = %event.id, tenant_id = %event.tenant_id, trace_id = trace_id_of(&event).as_deref(), event_type = %event.event_type,
            payload_bytes = size, limit = MAX_PAYLOAD_BYTES,
            "payload too large to hand off; dead-lettering the event"
        );
        if let Some(lease) = Lease::of(&event) {
            failures.push(Failure {
                lease,
                retry_increment: 0,
                error: format!(
                    "payload of {size} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit; not handed off"
                ),
                queue: None,
                unrouted: false,
            });
        }
    }
    (kept, failures)
}

/// The rows of a tick whose outcome statement did not update them, from
/// `(rows given, rows updated)` per statement: their lease had expired and
/// another dispatcher had claimed them in the meantime.
fn lost_leases(outcomes: &[(usize, usize)]) -> usize {
    outcomes
        .iter()
        .map(|(given, updated)| given.saturating_sub(*updated))
        .sum()
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("namespace", &self.namespace)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::{TickReport, lost_leases};

    #[test]
    fn every_outcome_statement_that_missed_rows_counts_them_as_lost_leases() {
        assert_eq!(lost_leases(&[]), 0);
        assert_eq!(lost_leases(&[(5, 5), (2, 2), (1, 1), (0, 0)]), 0);
        // done, retried, failed, released: each statement's misses count.
        assert_eq!(lost_leases(&[(3, 1), (2, 2), (4, 0), (1, 0)]), 7);
        assert_eq!(lost_leases(&[(0, 0), (0, 0), (2, 1), (0, 0)]), 1);
    }

    #[test]
    fn a_tick_with_a_failed_push_asks_the_redis_guard_to_check() {
        let cases = [
            (TickReport::default(), false),
            (
                TickReport {
                    claimed: 5,
                    dispatched: 5,
                    duplicates: 2,
                    unrouted: 1,
                    oversized: 1,
                    released: 1,
                    lost_leases: 1,
                    ..TickReport::default()
                },
                false,
            ),
            (
                TickReport {
                    retried: 1,
                    ..TickReport::default()
                },
                true,
            ),
            (
                TickReport {
                    failed: 1,
                    ..TickReport::default()
                },
                true,
            ),
        ];
        for (report, expected) in cases {
            assert_eq!(report.handoff_failed(), expected, "{report:?}");
        }
    }

    #[test]
    fn only_a_whole_batch_makes_the_next_tick_start_at_once() {
        let claimed = |claimed| TickReport {
            claimed,
            ..TickReport::default()
        };
        assert!(!claimed(0).was_full(500));
        assert!(!claimed(499).was_full(500));
        assert!(claimed(500).was_full(500));
        assert!(claimed(1).was_full(1));
    }

    /// What a loop does after each kind of tick: the table of `Next::after`.
    #[test]
    fn a_loop_waits_only_while_inserts_notify() {
        use super::Next::{self, TickAtOnce, Wait};
        use super::WakeGate;

        let covered = || {
            let gate = WakeGate::default();
            gate.want();
            gate
        };
        // One loop: whether the gate counts it busy before and after.
        let after = |claimed, full, gate: &WakeGate| {
            let mut busy = false;
            let next = Next::after(claimed, full, Some((gate, &mut busy)));
            (next, busy)
        };
        // Wake-ups off: only a full batch ticks again at once.
        assert_eq!(Next::after(Some(100), true, None), TickAtOnce);
        assert_eq!(Next::after(Some(99), false, None), Wait);
        assert_eq!(Next::after(Some(0), false, None), Wait);
        // A failed tick waits and asks for the gate.
        let gate = WakeGate::default();
        assert_eq!(after(None, false, &gate), (Wait, false));
        assert!(gate.covered(), "a failed tick did not ask for the gate");
        // A full batch, also one smaller than a busy claim (a small
        // `OUTBOX_DISPATCH_BATCH_SIZE`) while this process holds the gate.
        // Break checked: the `full` guard left out (a miss of the pinned
        // mutation shard 5) waits after the batch of one.
        assert_eq!(after(Some(100), true, &covered()), (TickAtOnce, true));
        assert_eq!(after(Some(1), true, &covered()), (TickAtOnce, true));
        // One row while this process holds or queues for the gate: wait.
        assert_eq!(after(Some(1), false, &covered()), (Wait, false));
        // One row without it: publishers may not notify, tick again.
        assert_eq!(
            after(Some(1), false, &WakeGate::default()),
            (TickAtOnce, true)
        );
        // A busy claim has just given the gate back, whatever `covered` says.
        assert_eq!(after(Some(2), false, &covered()), (TickAtOnce, true));
        // Nothing claimed: ask for the gate (inserts notify from now) and wait.
        let gate = WakeGate::default();
        assert_eq!(after(Some(0), false, &gate), (Wait, false));
        assert!(gate.covered(), "an empty claim did not ask for the gate");
    }

    /// Two loops of one process: the first to find nothing while the other
    /// ticks back to back waits without asking for the gate; the other asks
    /// when it finds nothing in turn.
    // Break checked: asking for the gate on every empty claim (the check
    // of the other loop dropped) fails the first `covered` assertion; a
    // loop that does not take itself out of the count before it looks
    // (its own busy tick taken for another's) fails the second.
    #[test]
    fn of_two_loops_only_the_last_to_find_nothing_asks_for_the_gate() {
        use super::Next::{self, TickAtOnce, Wait};
        use super::WakeGate;

        let gate = WakeGate::default();
        let (mut first, mut second) = (false, false);
        assert_eq!(
            Next::after(Some(3), false, Some((&gate, &mut first))),
            TickAtOnce
        );
        assert_eq!(
            Next::after(Some(2), false, Some((&gate, &mut second))),
            TickAtOnce
        );
        assert!(first && second);

        assert_eq!(Next::after(Some(0), false, Some((&gate, &mut first))), Wait);
        assert!(!first);
        assert!(
            !gate.covered(),
            "asked for the gate while the other loop was busy"
        );
        // The second finds rows again, then nothing.
        assert_eq!(
            Next::after(Some(4), false, Some((&gate, &mut second))),
            TickAtOnce
        );
        assert_eq!(
            Next::after(Some(0), false, Some((&gate, &mut second))),
            Wait
        );
        assert!(!second);
        assert!(
            gate.covered(),
            "the last loop to find nothing did not ask for the gate"
        );
        // The first, woken (say, by the granted gate), finds nothing again:
        // no loop is busy, it asks as well.
        let gate = WakeGate::default();
        let mut idle = false;
        assert_eq!(Next::after(Some(0), false, Some((&gate, &mut idle))), Wait);
        assert!(gate.covered());
    }
}
