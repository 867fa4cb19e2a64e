//! The Redis guard: noticing that Redis lost handed-off jobs, and
//! reconciling.
//!
//! A `DONE` row means "handed to Redis". The guard keeps a marker in the
//! Redis the dispatcher pushes to ([`outbox_queue::marker_key`]: an epoch id
//! written once, and the server `run_id` it was seen in) and remembers it in
//! Postgres (`outbox_redis_epoch`). It checks it when it starts, whenever a
//! hand-off failed (Redis went away: the check runs again as soon as Redis
//! answers) and every `check_every` (that one taken in turn by the
//! dispatchers sharing the namespace: one check per interval among them,
//! [`RedisGuard::run`]). [`assess`] decides from what it finds:
//!
//! | found | verdict |
//! |---|---|
//! | marker and memory agree, same server run | intact |
//! | same marker, another run, `appendfsync always`, the server restarted | restarted, nothing lost |
//! | same marker, another run, any other persistence | **lost**: writes since the last flush may be gone |
//! | same marker, another run, the server has been up longer than since the last check | **lost**: another server answers (a failover; replication is asynchronous) |
//! | no marker, but a memory of one | **lost**: flushed, or restarted without persistence |
//! | a marker with another epoch | **lost**: another data set |
//! | no marker and no memory | first sight: the retention window is checked once |
//! | a marker and no memory | adopted |
//!
//! On a loss it logs an error naming the window, counts
//! `outbox_redis_loss_detected_total{reason}`, writes a new marker (a new
//! epoch) and records a reconciliation to do for every queue, which it then
//! runs ([`crate::Reconciler`]) in batches under a lease, resuming after a
//! crash from the recorded cursor.
//!
//! # The window
//!
//! Each queue has a *safe point* (`outbox_redis_safe_point.drained_before`):
//! every job of the queue handed off before it had finished (its job and
//! every job derived from it done or dead) when a check last looked. A loss
//! cannot take anything still to do from before the safe point, so the
//! reconciliation starts there, and never earlier than the trimming
//! retention allows ([`crate::retention_floor`]). With no history (first
//! sight, a new queue) the window is the retention. Jobs that finished
//! after the safe point and were lost are pushed again too: their receivers
//! may see them twice, which is the window `docs/reliability.md` states.
//!
//! Healthy checks move each safe point forward to the first job not
//! finished yet, in hand-off order, never closer to now than
//! [`SAFE_POINT_LAG`] (a row's `processed_at` is the start of the statement
//! that recorded it, which may commit a little later). Where that job is
//! comes from Redis' list of the queue's unfinished jobs when it is short
//! (the usual case: consumers keeping up), from a scan of the rows after
//! the safe point when the queue holds a backlog
//! ([`RedisGuard::advance_safe_points`]). The list lets a safe point pass
//! a job the scan would stop at in one case only: a job whose body
//! vanished while the marker stayed (a key deleted by hand), which the
//! list does not hold. Elsewhere it is the more cautious of the two (a
//! derived job still running whose receiver already recorded it holds it).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_pg::PgPool;
use outbox_queue::RedisConnection;
use outbox_queue::{
    Marker, Persistence, QueueNamespace, ServerInfo, confirm_marker_run, read_marker,
    read_server_info, write_marker,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{DispatchError, Receivers, Reconciler, retention_floor};
use outbox_store::{self as store, EpochRow, SafePointRow};

mod safe_point;
pub use safe_point::SafePointPass;

/// How close to now a safe point may come unless
/// [`RedisGuardSettings::safe_point_lag`] says otherwise.
pub const SAFE_POINT_LAG: Duration = Duration::from_secs(5);

/// How long a check waits before it tries again for the namespace's lock
/// that another dispatcher's check holds.
const NAMESPACE_BUSY_RETRY: Duration = Duration::from_millis(20);

/// How often a failing check (Redis or Postgres away) is tried again.
const RETRY_FAILED_CHECK: Duration = Duration::from_secs(1);

/// Slack when comparing the server's uptime with the time since the last
/// check (clocks, the check's own duration).
const UPTIME_SLACK: Duration = Duration::from_secs(30);

/// Most batches of a pending reconciliation per pass; the guard with the
/// turn checks the marker again between passes (see [`RedisGuard::run`]).
const BATCHES_PER_PASS: usize = 40;

/// The reconciliation lease; renewed after every batch.
const RECONCILE_LEASE: Duration = Duration::from_secs(120);

/// How the guard runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisGuardSettings {
    /// How often the marker is checked while all is well
    /// (`OUTBOX_REDIS_CHECK_INTERVAL_MS` in the workers).
    pub check_every: Duration,
    /// `QUEUE_DONE_RETENTION_HOURS`: finished jobs older than this are
    /// trimmed from Redis, so no window reaches further back.
    pub retention: Duration,
    /// Rows per reconciliation batch.
    pub batch_size: usize,
    /// How close to now a safe point may come ([`SAFE_POINT_LAG`]): a row's
    /// `processed_at` is the start of the statement that recorded it, which
    /// commits a little later, so the newest rows may still have company.
    pub safe_point_lag: Duration,
    /// Most unfinished jobs of a queue (its own and those derived from it)
    /// whose ids a healthy check reads from Redis to move the queue's safe
    /// point to the oldest of them ([`DEFAULT_UNFINISHED_LIMIT`]); a queue
    /// holding more is scanned row by row from its safe point instead. 0
    /// always scans.
    pub unfinished_limit: usize,
}

/// Most unfinished jobs per queue the guard reads at once by default
/// ([`RedisGuardSettings::unfinished_limit`]): a queue whose consumers keep
/// up holds a few dozen; one holding more has a backlog, whose first rows
/// after the safe point the scan finds unfinished at once.
pub const DEFAULT_UNFINISHED_LIMIT: usize = 2_000;

impl RedisGuardSettings {
    /// Default of `check_every` (`OUTBOX_REDIS_CHECK_INTERVAL_MS`).
    pub const DEFAULT_CHECK_EVERY: Duration = Duration::from_secs(10);
}

/// `OUTBOX_REDIS_CHECK_INTERVAL_MS`: [`RedisGuardSettings::check_every`].
pub const OUTBOX_REDIS_CHECK_INTERVAL_MS: outbox_env::Whole = outbox_env::Whole {
    name: "OUTBOX_REDIS_CHECK_INTERVAL_MS",
    default: outbox_env::millis(RedisGuardSettings::DEFAULT_CHECK_EVERY),
    min: 100,
    max: outbox_env::MAX_MILLIS,
    meaning: "how often the dispatcher checks that Redis kept its jobs, in ms",
};

impl Default for RedisGuardSettings {
    /// Every 10 s, 24 h retention, batches of 500, [`SAFE_POINT_LAG`],
    /// [`DEFAULT_UNFINISHED_LIMIT`].
    fn default() -> Self {
        Self {
            check_every: Self::DEFAULT_CHECK_EVERY,
            retention: Duration::from_secs(24 * 3600),
            batch_size: crate::DEFAULT_RECONCILE_BATCH,
            safe_point_lag: SAFE_POINT_LAG,
            unfinished_limit: DEFAULT_UNFINISHED_LIMIT,
        }
    }
}

/// Why the guard believes Redis lost jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossReason {
    /// The marker is gone although it was seen before: the data set was
    /// flushed, or the server restarted without persistence.
    MarkerMissing,
    /// The server restarted and its persistence does not keep every write.
    Restarted {
        /// What the server reports.
        persistence: Persistence,
    },
    /// Another server answers (its uptime is longer than the time since the
    /// last check): a failover to a replica, which may have lagged.
    ServerReplaced,
    /// The marker holds another epoch: another data set.
    EpochChanged {
        /// The epoch found.
        found: Uuid,
    },
}

impl LossReason {
    /// The `reason` label of `outbox_redis_loss_detected_total`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::MarkerMissing => "marker_missing",
            Self::Restarted { .. } => "restarted",
            Self::ServerReplaced => "server_replaced",
            Self::EpochChanged { .. } => "epoch_changed",
        }
    }
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MarkerMissing => f.write_str(
                "the marker is gone (Redis was flushed, or restarted without persistence)",
            ),
            Self::Restarted { persistence } => write!(
                f,
                "Redis restarted with persistence {} ({}), which loses {} on a crash",
                persistence.mode(),
                persistence,
                persistence.loss_on_crash()
            ),
            Self::ServerReplaced => {
                f.write_str("another Redis server answers (a failover: a replica may lag behind)")
            }
            Self::EpochChanged { found } => {
                write!(
                    f,
                    "the marker holds another epoch ({found}): another data set"
                )
            }
        }
    }
}

/// What a check concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assessment {
    /// Nothing remembered and no marker: a new Redis, or one that lost
    /// everything before the guard ran. The retention window is checked.
    FirstSight,
    /// A marker but nothing remembered: it is adopted.
    Adopt,
    /// Same marker, same server run.
    Intact,
    /// The server restarted and keeps every write (`appendfsync always`).
    RestartedSafely,
    /// Jobs may be lost.
    Lost(LossReason),
}

/// Decides what a check found: the `marker` in Redis, what Postgres
/// `remembered`, the `server` answering, and the time `since_last_check`
/// (since the remembered check).
#[must_use]
pub fn assess(
    marker: Option<&Marker>,
    remembered: Option<&EpochRow>,
    server: &ServerInfo,
    since_last_check: Duration,
) -> Assessment {
    match (marker, remembered) {
        (None, None) => Assessment::FirstSight,
        (None, Some(_)) => Assessment::Lost(LossReason::MarkerMissing),
        (Some(_), None) => Assessment::Adopt,
        (Some(marker), Some(remembered)) if marker.epoch != remembered.epoch => {
            Assessment::Lost(LossReason::EpochChanged {
                found: marker.epoch,
            })
        }
        (Some(marker), Some(_)) if marker.run_id == server.run_id => Assessment::Intact,
        (Some(_), Some(_)) if server.uptime > since_last_check + UPTIME_SLACK => {
            Assessment::Lost(LossReason::ServerReplaced)
        }
        (Some(_), Some(_)) if server.persistence.keeps_every_write() => Assessment::RestartedSafely,
        (Some(_), Some(_)) => Assessment::Lost(LossReason::Restarted {
            persistence: server.persistence.clone(),
        }),
    }
}

/// Where a queue's reconciliation starts after a loss: its safe point, or
/// the retention floor when that is later (or when there is no safe point).
///
/// ```
/// use chrono::DateTime;
/// let floor = DateTime::from_timestamp(1_000, 0).unwrap();
/// let safe = DateTime::from_timestamp(5_000, 0).unwrap();
/// assert_eq!(outbox_dispatch::window_start(Some(safe), floor), safe);
/// assert_eq!(outbox_dispatch::window_start(Some(floor - chrono::Duration::seconds(1)), floor), floor);
/// assert_eq!(outbox_dispatch::window_start(None, floor), floor);
/// ```
#[must_use]
pub fn window_start(safe_point: Option<DateTime<Utc>>, floor: DateTime<Utc>) -> DateTime<Utc> {
    safe_point.map_or(floor, |safe| safe.max(floor))
}

/// Where a queue's safe point can move, from what a scan saw: the
/// hand-off time of the first job not yet finished, or (when every job
/// scanned had finished and the scan reached the end) the scan's start;
/// never closer to `now` than `lag`.
///
/// ```
/// use chrono::{DateTime, Duration};
/// let now = DateTime::from_timestamp(10_000, 0).unwrap();
/// let lag = std::time::Duration::from_secs(5);
/// let first_unfinished = now - Duration::seconds(60);
/// assert_eq!(outbox_dispatch::next_safe_point(now, Some(first_unfinished), lag), first_unfinished);
/// assert_eq!(outbox_dispatch::next_safe_point(now, None, lag), now - Duration::seconds(5));
/// ```
#[must_use]
pub fn next_safe_point(
    now: DateTime<Utc>,
    first_unfinished: Option<DateTime<Utc>>,
    lag: Duration,
) -> DateTime<Utc> {
    let limit = now - chrono::Duration::from_std(lag).unwrap_or_default();
    first_unfinished.map_or(limit, |at| at.min(limit))
}

/// What one check did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// The verdict.
    pub assessment: Assessment,
    /// The server's persistence.
    pub persistence: Persistence,
    /// For a loss or a first sight: each queue and where its
    /// reconciliation starts.
    pub windows: Vec<(String, DateTime<Utc>)>,
}

/// What the guard knows of a namespace, for `outbox health`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardStatus {
    /// The marker in Redis.
    pub marker: Option<Marker>,
    /// What Postgres remembers.
    pub remembered: Option<EpochRow>,
    /// The queues' safe points and pending reconciliations.
    pub safe_points: Vec<SafePointRow>,
}

/// Reads what the guard knows of `namespace` without changing anything.
///
/// # Errors
///
/// When Redis or Postgres fails.
pub async fn guard_status(
    conn: &mut AsyncPgConnection,
    redis: &mut RedisConnection,
    namespace: &QueueNamespace,
) -> Result<GuardStatus, DispatchError> {
    Ok(GuardStatus {
        marker: read_marker(redis, namespace, &[]).await?,
        remembered: store::remembered_epoch(conn, namespace.prefix()).await?,
        safe_points: store::safe_points(conn, namespace.prefix()).await?,
    })
}

/// Watches the Redis the dispatcher pushes to (see the module docs).
pub struct RedisGuard {
    pool: PgPool,
    redis: RedisConnection,
    namespace: QueueNamespace,
    queues: Vec<String>,
    reconciler: Reconciler,
    settings: RedisGuardSettings,
    poke: Notify,
}

impl std::fmt::Debug for RedisGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisGuard")
            .field("namespace", &self.namespace)
            .field("queues", &self.queues)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The Redis key whose holder runs this interval's scheduled check of
/// `namespace` among the dispatchers guarding `queues`
/// (`<prefix>outbox:redis-guard:turn:<16 hex digits>`, a hash of the
/// queues in the order given; see [`RedisGuard::run`]).
///
/// ```
/// use outbox_queue::QueueNamespace;
///
/// let ns = QueueNamespace::prefixed("adopt-app:");
/// let key = outbox_dispatch::guard_turn_key(&ns, &["outbox.audit", "outbox.mail"]);
/// assert!(key.starts_with("adopt-app:outbox:redis-guard:turn:"));
/// // Another set of queues takes turns of its own.
/// assert_ne!(key, outbox_dispatch::guard_turn_key(&ns, &["outbox.audit"]));
/// ```
#[must_use]
pub fn guard_turn_key(namespace: &QueueNamespace, queues: &[&str]) -> String {
    // FNV-1a (64 bits): stable across builds and versions, unlike std's
    // hasher, so every process of one queue set names the same key.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for queue in queues {
        for byte in queue.bytes().chain(std::iter::once(b'\n')) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{}outbox:redis-guard:turn:{hash:016x}", namespace.prefix())
}

impl RedisGuard {
    /// A guard of the queues `queues` (the router's targets) of `namespace`,
    /// whose handlers leave behind what `receivers` says.
    #[must_use]
    pub fn new(
        pool: PgPool,
        redis: RedisConnection,
        namespace: QueueNamespace,
        queues: Vec<String>,
        receivers: Receivers,
        settings: RedisGuardSettings,
    ) -> Self {
        let reconciler = Reconciler::new(redis.clone(), namespace.clone(), receivers)
            .with_batch_size(settings.batch_size);
        Self {
            pool,
            redis,
            namespace,
            queues,
            reconciler,
            settings,
            poke: Notify::new(),
        }
    }

    /// Asks for a check as soon as possible (the dispatcher calls it when a
    /// hand-off failed: Redis may be back as a new, empty server).
    pub fn poke(&self) {
        self.poke.notify_one();
    }

    /// Checks now, then every `check_every` (every second while checks
    /// fail, so a Redis that comes back is checked at once) and whenever
    /// [`RedisGuard::poke`]d, until `shutdown`; runs any reconciliation that
    /// is due and moves the safe points. Failures are logged, never fatal.
    ///
    /// The rounds every `check_every` are taken in turn by the dispatchers
    /// sharing the namespace (see [`RedisGuard::turn_key`]): one of them
    /// checks and moves the safe points per interval, and the others only
    /// go on with a reconciliation that is due. The first round, a poked
    /// one and the retries of a failing one always check.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(
            namespace = %self.namespace.prefix(),
            check_every_ms = self.settings.check_every.as_millis() as u64,
            retention_h = self.settings.retention.as_secs() / 3600,
            "Redis guard started"
        );
        let mut failing = false;
        let mut scheduled = false;
        while !shutdown.is_cancelled() {
            let round = if !scheduled || self.take_turn().await {
                self.check_and_repair(&shutdown).await
            } else {
                self.reconcile_pending(&shutdown).await.map(|_| ())
            };
            match round {
                Ok(()) => {
                    if failing {
                        tracing::info!("Redis guard: checks succeed again");
                    }
                    failing = false;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "Redis guard: check failed; trying again every second");
                    }
                    failing = true;
                }
            }
            let wait = if failing {
                RETRY_FAILED_CHECK
            } else {
                self.settings.check_every
            };
            scheduled = tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.poke.notified() => false,
                () = tokio::time::sleep(wait) => !failing,
            };
        }
    }

    /// The key of this guard's turn ([`guard_turn_key`] of its namespace
    /// and the queues it guards).
    #[must_use]
    pub fn turn_key(&self) -> String {
        guard_turn_key(&self.namespace, &self.marker_queues())
    }

    /// Takes this interval's turn at the scheduled check among the
    /// dispatchers sharing the namespace and guarding the same queues: sets
    /// [`guard_turn_key`] in Redis unless another holds it, expiring after
    /// `check_every`. Checking is namespace-wide (the marker, the epoch
    /// Postgres remembers, the safe points), so one check per interval
    /// among N dispatchers does what N did (each of which wrote every
    /// queue's safe point every interval). Dispatchers guarding other
    /// queues (another routing table, during a rolling deploy) take turns
    /// of their own, so each queue's marker copy and safe point is still
    /// looked at every interval. A Redis flushed or restarted empty lost
    /// the key too, and the next dispatcher to wake checks; after a
    /// failover the key may have survived, and the loss is noticed within
    /// the interval. A Redis that cannot be asked: the turn is taken (the
    /// check then says what fails).
    async fn take_turn(&self) -> bool {
        let millis = u64::try_from(self.settings.check_every.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut redis = self.redis.clone();
        let taken: Result<Option<String>, _> = redis::cmd("SET")
            .arg(self.turn_key())
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(millis)
            .query_async(&mut redis)
            .await;
        let taken = match taken {
            Ok(set) => set.is_some(),
            Err(e) => {
                tracing::debug!(
                    namespace = %self.namespace.prefix(), error = %e,
                    "Redis guard: cannot take the turn; checking"
                );
                true
            }
        };
        if !taken {
            tracing::debug!(
                namespace = %self.namespace.prefix(),
                "Redis guard: another dispatcher checks this interval"
            );
        }
        taken
    }

    /// One round: [`RedisGuard::check`], then a pass of any reconciliation
    /// due, then (when none is due) the safe points move.
    ///
    /// # Errors
    ///
    /// When Redis or Postgres fails.
    pub async fn check_and_repair(&self, stop: &CancellationToken) -> Result<(), DispatchError> {
        self.check().await?;
        if !self.reconcile_pending(stop).await? {
            self.advance_safe_points(stop).await?;
        }
        Ok(())
    }

    /// Checks the marker and records the verdict (see the module docs).
    ///
    /// # Errors
    ///
    /// When Redis or Postgres fails; nothing is recorded in Postgres then,
    /// though the marker in Redis may already have been written again (the
    /// next check then finds it intact or lost, and acts on that).
    pub async fn check(&self) -> Result<CheckReport, DispatchError> {
        let mut redis = self.redis.clone();
        let server = read_server_info(&mut redis).await?;
        let prefix = self.namespace.prefix();
        loop {
            let mut conn = self.pool.get().await?;
            // The namespace's lock is tried, not waited for inside the
            // transaction: a waiting statement keeps its snapshot, which
            // keeps the claim index's dead entries alive for every claim
            // meanwhile (`outbox_store::try_lock_namespace`).
            let decided = conn
                .transaction::<_, DispatchError, _>(async |conn| {
                    if !store::try_lock_namespace(conn, prefix).await? {
                        return Ok(None);
                    }
                    self.decide(conn, &mut redis, &server).await.map(Some)
                })
                .await?;
            if let Some(report) = decided {
                return Ok(report);
            }
            drop(conn);
            tokio::time::sleep(NAMESPACE_BUSY_RETRY).await;
        }
    }

    /// The queues beside which a Redis Cluster keeps copies of the marker
    /// (the router's targets and the queues their handlers derive jobs
    /// on), sorted; on one server the marker has no copies.
    fn marker_queues(&self) -> Vec<&str> {
        let mut queues: Vec<&str> = self
            .queues
            .iter()
            .flat_map(|queue| {
                std::iter::once(queue.as_str())
                    .chain(self.reconciler.receiver_of(queue).derives_on())
            })
            .collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// The check inside its transaction, which holds the namespace's lock,
    /// so dispatchers decide one after the other.
    async fn decide(
        &self,
        conn: &mut AsyncPgConnection,
        redis: &mut RedisConnection,
        server: &ServerInfo,
    ) -> Result<CheckReport, DispatchError> {
        let namespace = &self.namespace;
        let prefix = namespace.prefix();
        let now = store::db_now(conn).await?;
        let floor = retention_floor(now, self.settings.retention);
        let remembered = store::remembered_epoch(conn, prefix).await?;
        let marked = self.marker_queues();
        let marker = read_marker(redis, namespace, &marked).await?;
        let since_last_check = remembered
            .as_ref()
            .and_then(|r| (now - r.checked_at).to_std().ok())
            .unwrap_or_default();
        let assessment = assess(
            marker.as_ref(),
            remembered.as_ref(),
            server,
            since_last_check,
        );
        let mut windows = Vec::new();
        // Every check makes sure each of this guard's queues has a safe
        // point (after the epoch row it belongs to): a queue added since (a
        // new route) is then marked for reconciliation by the next loss,
        // whichever dispatcher notices it.
        match &assessment {
            Assessment::Intact => {
                store::save_epoch(conn, prefix, epoch_of(&remembered), &server.run_id).await?;
                store::ensure_safe_points(conn, prefix, &self.queues, floor).await?;
            }
            Assessment::RestartedSafely => {
                confirm_marker_run(redis, namespace, &marked, &server.run_id).await?;
                store::save_epoch(conn, prefix, epoch_of(&remembered), &server.run_id).await?;
                store::ensure_safe_points(conn, prefix, &self.queues, floor).await?;
                tracing::info!(
                    namespace = %prefix, run_id = %server.run_id,
                    persistence = server.persistence.mode(),
                    "Redis restarted; its persistence (appendfsync always) keeps every write: nothing lost"
                );
            }
            Assessment::Adopt => {
                let epoch = marker.as_ref().map_or_else(Uuid::now_v7, |m| m.epoch);
                store::save_epoch(conn, prefix, epoch, &server.run_id).await?;
                store::ensure_safe_points(conn, prefix, &self.queues, floor).await?;
                tracing::info!(namespace = %prefix, %epoch, "Redis guard: adopted the marker found in Redis");
            }
            Assessment::FirstSight | Assessment::Lost(_) => {
                let epoch = Uuid::now_v7();
                store::save_epoch(conn, prefix, epoch, &server.run_id).await?;
                store::ensure_safe_points(conn, prefix, &self.queues, floor).await?;
                windows = store::mark_pending(conn, prefix, floor)
                    .await?
                    .into_iter()
                    .filter_map(|p| p.pending_since.map(|since| (p.queue, since)))
                    .collect();
                let marker = Marker {
                    epoch,
                    run_id: server.run_id.clone(),
                };
                write_marker(redis, namespace, &marked, &marker).await?;
                log_window(
                    prefix,
                    &assessment,
                    remembered.as_ref(),
                    &marker,
                    server,
                    &windows,
                );
            }
        }
        Ok(CheckReport {
            assessment,
            persistence: server.persistence.clone(),
            windows,
        })
    }

    /// Runs up to 40 batches of the reconciliations due
    /// in this namespace, under the namespace's lease (another dispatcher
    /// holding it: nothing to do here). Returns whether any is still due.
    ///
    /// # Errors
    ///
    /// When Redis or Postgres fails; the cursor keeps what was done.
    pub async fn reconcile_pending(&self, stop: &CancellationToken) -> Result<bool, DispatchError> {
        let prefix = self.namespace.prefix();
        let mut conn = self.pool.get().await?;
        // Read before the cursors: a loss noticed after this saves another
        // epoch, and no batch of this pass then moves a cursor.
        let Some(remembered) = store::remembered_epoch(&mut conn, prefix).await? else {
            return Ok(false);
        };
        let due: Vec<SafePointRow> = store::safe_points(&mut conn, prefix)
            .await?
            .into_iter()
            .filter(|p| p.pending_since.is_some())
            .collect();
        if due.is_empty() {
            return Ok(false);
        }
        let Some(mut lease) =
            store::take_reconcile_lease(&mut conn, prefix, millis(RECONCILE_LEASE)).await?
        else {
            return Ok(true);
        };
        let result = self
            .reconcile_due(&mut conn, remembered.epoch, due, &mut lease, stop)
            .await;
        let released = store::release_reconcile_lease(&mut conn, prefix, lease).await;
        let still_due = result?;
        released?;
        Ok(still_due)
    }

    async fn reconcile_due(
        &self,
        conn: &mut AsyncPgConnection,
        epoch: Uuid,
        due: Vec<SafePointRow>,
        lease: &mut store::ReconcileLease,
        stop: &CancellationToken,
    ) -> Result<bool, DispatchError> {
        let prefix = self.namespace.prefix();
        let mut batches = 0;
        for point in due {
            let Some(mut since) = point.pending_since else {
                continue;
            };
            let window = since;
            let mut after = point.pending_after_id;
            let queue = point.queue;
            let mut total = crate::QueueCounts::default();
            loop {
                if stop.is_cancelled() || batches >= BATCHES_PER_PASS {
                    return Ok(true);
                }
                let cursor = (since, after.unwrap_or_else(Uuid::nil));
                let rows =
                    store::done_rows_after(conn, &queue, cursor, self.reconciler.batch_size())
                        .await?;
                let outcome = self.reconciler.repair(conn, &queue, &rows, false).await?;
                batches += 1;
                total.add(outcome.counts);
                let next = rows
                    .last()
                    .filter(|_| rows.len() >= self.reconciler.batch_size())
                    .map(|last| (last.processed_at.unwrap_or(last.created_at), last.id));
                if let Some((up_to, _)) = next {
                    tracing::info!(
                        namespace = %prefix, queue = %queue, window_since = %window, up_to = %up_to,
                        checked = total.checked, missing = total.missing, repushed = total.repushed,
                        "reconciling: checking handed-off jobs against Redis"
                    );
                }
                let moved =
                    store::advance_pending(conn, prefix, &queue, epoch, (since, after), next)
                        .await?;
                if !store::renew_reconcile_lease(conn, prefix, lease, millis(RECONCILE_LEASE))
                    .await?
                {
                    // The lease ran out and another dispatcher took it: it
                    // goes on from the cursor.
                    tracing::warn!(namespace = %prefix, queue = %queue,
                        "reconciliation lease lost to another dispatcher; leaving the rest to it");
                    return Ok(true);
                }
                if !moved {
                    // A new loss set this queue back; the next pass starts it again.
                    break;
                }
                match next {
                    Some((at, id)) => {
                        since = at;
                        after = Some(id);
                    }
                    None => {
                        if total.checked > 0 {
                            if total.missing > 0 {
                                tracing::warn!(
                                    namespace = %prefix, queue = %queue, window_since = %window,
                                    checked = total.checked, found = total.found,
                                    missing = total.missing, repushed = total.repushed,
                                    "reconciliation finished: jobs Redis had lost were pushed again"
                                );
                            } else {
                                tracing::info!(
                                    namespace = %prefix, queue = %queue, window_since = %window,
                                    checked = total.checked, found = total.found,
                                    "reconciliation finished: nothing was missing"
                                );
                            }
                        }
                        break;
                    }
                }
            }
        }
        Ok(store::safe_points(conn, prefix)
            .await?
            .iter()
            .any(|p| p.pending_since.is_some()))
    }
}

fn epoch_of(remembered: &Option<EpochRow>) -> Uuid {
    remembered.as_ref().map_or_else(Uuid::nil, |r| r.epoch)
}

/// Logs a loss (an error, counted in `outbox_redis_loss_detected_total`)
/// or a first sight (a warning), naming the window.
fn log_window(
    prefix: &str,
    assessment: &Assessment,
    remembered: Option<&EpochRow>,
    marker: &Marker,
    server: &ServerInfo,
    windows: &[(String, DateTime<Utc>)],
) {
    let window = windows
        .iter()
        .map(|(_, since)| *since)
        .min()
        .map_or_else(|| "-".to_owned(), |since| since.to_rfc3339());
    let persistence = server.persistence.mode();
    match assessment {
        Assessment::Lost(reason) => {
            tracing::error!(
                namespace = %prefix, reason = reason.label(),
                previous_epoch = %remembered.map_or_else(Uuid::nil, |r| r.epoch),
                epoch = %marker.epoch,
                previous_run_id = %remembered.map_or("-", |r| r.run_id.as_str()),
                run_id = %server.run_id, persistence, window_since = %window,
                queues = windows.len(),
                "Redis lost data: {reason}; jobs handed off since {window} may be gone; reconciling"
            );
            metrics::counter!("outbox_redis_loss_detected_total", "reason" => reason.label())
                .increment(1);
        }
        _ => tracing::warn!(
            namespace = %prefix, epoch = %marker.epoch, run_id = %server.run_id, persistence,
            window_since = %window,
            "Redis guard: no marker and no record of this Redis; checking the hand-offs since {window} once"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_queue::Fsync;

    fn server(run_id: &str, uptime_s: u64, persistence: Persistence) -> ServerInfo {
        ServerInfo {
            run_id: run_id.to_owned(),
            uptime: Duration::from_secs(uptime_s),
            persistence,
        }
    }

    fn remembered(epoch: Uuid, run_id: &str) -> EpochRow {
        EpochRow {
            epoch,
            run_id: run_id.to_owned(),
            checked_at: DateTime::from_timestamp(0, 0).unwrap_or_default(),
        }
    }

    // The reconciliation's lease is taken and renewed for this many
    // milliseconds. Break checked: `millis` answering 1 (a lease of a
    // millisecond, a miss of the pinned dispatch shard 3) fails here.
    #[test]
    fn the_reconcile_lease_is_given_to_postgres_in_whole_milliseconds() {
        assert_eq!(millis(RECONCILE_LEASE), RECONCILE_LEASE.as_millis() as i64);
        assert!(millis(RECONCILE_LEASE) >= 1000, "{RECONCILE_LEASE:?}");
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), i64::MAX, "saturates");
    }

    #[test]
    fn the_verdicts() {
        let epoch = Uuid::now_v7();
        let marker = Marker {
            epoch,
            run_id: "run-1".into(),
        };
        let memory = remembered(epoch, "run-1");
        let minute = Duration::from_secs(60);
        let always = Persistence::Aof {
            fsync: Fsync::Always,
        };
        let everysec = Persistence::Aof {
            fsync: Fsync::Everysec,
        };

        assert_eq!(
            assess(None, None, &server("run-1", 5, Persistence::None), minute),
            Assessment::FirstSight
        );
        assert_eq!(
            assess(
                Some(&marker),
                None,
                &server("run-1", 5, Persistence::None),
                minute
            ),
            Assessment::Adopt
        );
        assert_eq!(
            assess(
                Some(&marker),
                Some(&memory),
                &server("run-1", 5000, Persistence::None),
                minute
            ),
            Assessment::Intact
        );
        assert_eq!(
            assess(
                None,
                Some(&memory),
                &server("run-2", 5, always.clone()),
                minute
            ),
            Assessment::Lost(LossReason::MarkerMissing),
            "a missing marker is a loss whatever the persistence"
        );
        assert_eq!(
            assess(
                Some(&marker),
                Some(&memory),
                &server("run-2", 5, always),
                minute
            ),
            Assessment::RestartedSafely
        );
        assert_eq!(
            assess(
                Some(&marker),
                Some(&memory),
                &server("run-2", 5, everysec.clone()),
                minute
            ),
            Assessment::Lost(LossReason::Restarted {
                persistence: everysec.clone()
            })
        );
        assert_eq!(
            assess(
                Some(&marker),
                Some(&memory),
                &server(
                    "run-2",
                    5,
                    Persistence::Rdb {
                        save: "60 1".into()
                    }
                ),
                minute
            ),
            Assessment::Lost(LossReason::Restarted {
                persistence: Persistence::Rdb {
                    save: "60 1".into()
                }
            })
        );
        assert_eq!(
            assess(
                Some(&marker),
                Some(&memory),
                &server(
                    "run-3",
                    7200,
                    Persistence::Aof {
                        fsync: Fsync::Always
                    }
                ),
                minute
            ),
            Assessment::Lost(LossReason::ServerReplaced),
            "a server up for longer than since the last check is another server"
        );
        // The bound: up exactly as long as since the last check plus the
        // slack is still the restarted server, a second more another one.
        // Break checked: `>` as `>=` in `assess` (a miss of the pinned
        // dispatch shard 3) fails the first of these.
        let always = || Persistence::Aof {
            fsync: Fsync::Always,
        };
        let at_bound = (minute + UPTIME_SLACK).as_secs();
        assert_eq!(
            assess(
                Some(&marker),
                Some(&memory),
                &server("run-4", at_bound, always()),
                minute
            ),
            Assessment::RestartedSafely
        );
        assert_eq!(
            assess(
                Some(&marker),
                Some(&memory),
                &server("run-4", at_bound + 1, always()),
                minute
            ),
            Assessment::Lost(LossReason::ServerReplaced)
        );
        let other = Marker {
            epoch: Uuid::now_v7(),
            run_id: "run-1".into(),
        };
        assert_eq!(
            assess(
                Some(&other),
                Some(&memory),
                &server("run-1", 5000, everysec),
                minute
            ),
            Assessment::Lost(LossReason::EpochChanged { found: other.epoch })
        );
    }

    #[test]
    fn the_window_starts_at_the_safe_point_but_never_before_the_retention_floor() {
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap_or_default();
        let floor = retention_floor(now, Duration::from_secs(24 * 3600));
        assert_eq!(
            (now - floor).num_seconds(),
            24 * 3600 - 600,
            "ten minutes short of the retention"
        );
        let safe = now - chrono::Duration::minutes(3);
        assert_eq!(window_start(Some(safe), floor), safe);
        assert_eq!(
            window_start(Some(now - chrono::Duration::days(3)), floor),
            floor
        );
        assert_eq!(window_start(None, floor), floor);
        // A tiny retention still leaves a window.
        let tiny = retention_floor(now, Duration::from_secs(60));
        assert!(tiny < now);
    }

    #[test]
    fn the_safe_point_stops_at_the_first_unfinished_job_and_lags_behind_now() {
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap_or_default();
        let lag = chrono::Duration::from_std(SAFE_POINT_LAG).unwrap_or_default();
        assert_eq!(next_safe_point(now, None, SAFE_POINT_LAG), now - lag);
        let older = now - chrono::Duration::minutes(10);
        assert_eq!(next_safe_point(now, Some(older), SAFE_POINT_LAG), older);
        assert_eq!(next_safe_point(now, Some(now), Duration::ZERO), now);
        assert_eq!(
            next_safe_point(now, Some(now), SAFE_POINT_LAG),
            now - lag,
            "a row recorded just now may still have company committing"
        );
    }

    #[test]
    fn loss_reasons_have_labels_and_say_what_happened() {
        let restarted = LossReason::Restarted {
            persistence: Persistence::Aof {
                fsync: Fsync::Everysec,
            },
        };
        assert_eq!(restarted.label(), "restarted");
        assert!(
            restarted.to_string().contains("aof-everysec"),
            "{restarted}"
        );
        assert!(restarted.to_string().contains("last second"), "{restarted}");
        assert_eq!(LossReason::MarkerMissing.label(), "marker_missing");
    }
}
