//! Typed configuration of the dispatcher and of retention.

use std::time::Duration;

use outbox_env::{MAX_MILLIS, VariableError, Whole, hours, millis};

/// The seed's retry schedule: 1, 2, 4, 8, 16, 32 minutes.
pub const DEFAULT_BACKOFF: [Duration; 6] = [
    Duration::from_secs(60),
    Duration::from_secs(2 * 60),
    Duration::from_secs(4 * 60),
    Duration::from_secs(8 * 60),
    Duration::from_secs(16 * 60),
    Duration::from_secs(32 * 60),
];

/// The default of `OUTBOX_DISPATCH_BATCH_SIZE`: 500, where the contract
/// says 100. Measured with the release `worker-general` on a backlog of
/// 50,000 rows (`cargo xtask bench --only handoff`, docs/performance.md,
/// "Batch size"), one dispatcher hands off about 1.5 times as many events a
/// second at 500 as at 100, and 1000 adds little more while doubling the
/// rows a tick holds (and re-pushes after a crash).
pub const DEFAULT_BATCH_SIZE: u32 = 500;

/// The largest `OUTBOX_DISPATCH_BATCH_SIZE` accepted: rows one claim may
/// hold (and a crash may re-push).
pub const MAX_BATCH_SIZE: u32 = 10_000;

/// What [`DispatcherConfig::validate`] says of a batch over
/// [`MAX_BATCH_SIZE`] (a test holds the two together).
const MAX_BATCH_PROBLEM: &str = "must be at most 10000";

/// Default poll cadence of the dispatcher (`OUTBOX_DISPATCH_INTERVAL_MS`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(1000);
/// Default pushes in flight within a tick (`OUTBOX_DISPATCH_CONCURRENCY`).
pub const DEFAULT_CONCURRENCY: usize = 10;
/// Default of `OUTBOX_DISPATCH_LOOPS`: claim-and-hand-off loops a
/// dispatcher runs at once. One loop runs claim, push and `DONE` in
/// sequence and leaves the machine half idle; measured with the release
/// `worker-general` on two cores (`cargo xtask bench --only handoff`,
/// docs/performance.md, "Loops"), two loops hand off about 1.3 times as many
/// events a second as one, and four 1.14 to 1.20 times as many as two in
/// one process (the machine about 0.82 busy instead of 0.70), with no
/// change beside other processes. Only the first [`crate::WAKE_LOOPS`] answer wake-ups
/// and poll; the others join in only under a backlog (a claim that came
/// back full wakes one) and otherwise wait holding no connection, so a
/// steady load whose claims stay below a batch is claimed by the first
/// two only (docs/performance.md, "Four loops").
pub const DEFAULT_LOOPS: usize = 4;
/// The most loops a dispatcher runs (`OUTBOX_DISPATCH_LOOPS`).
pub const MAX_LOOPS: usize = 64;
/// Default of `OUTBOX_DISPATCH_LOOPS_TOTAL`: the loops all the dispatchers
/// of one database run between them, packed into the first ones (each at
/// most its own `OUTBOX_DISPATCH_LOOPS`; see [`crate::loops_to_run`]), so
/// with the defaults two processes run the loops and the others stand by
/// (one claim per poll interval each).
/// Measured with the release `worker-general` on two cores (`cargo xtask
/// bench --only scaling`, docs/scaling.md): one or two processes of four
/// loops hand off as fast as any number, while eight of four loops (32
/// claims at once) handed off at 0.76 to 0.90 of one process's rate, and
/// eight of one loop each at 0.94 to 0.96 of it.
pub const DEFAULT_LOOPS_TOTAL: usize = 8;
/// The largest `OUTBOX_DISPATCH_LOOPS_TOTAL` accepted.
pub const MAX_LOOPS_TOTAL: usize = 4096;
/// Default of `OUTBOX_DISPATCH_VACUUM_EVERY`: claimed rows between two
/// `VACUUM (SKIP_LOCKED) outbox_event` of a dispatcher. Until a vacuum, every
/// claim walks over the dead index entries of the rows handed off before it
/// (see [`crate::VACUUM_SQL`] and docs/performance.md, "Vacuum and the claim
/// index"). The first round comes sooner, and so do later ones while the
/// table is small ([`crate::FIRST_VACUUM_ROUND`]).
pub const DEFAULT_VACUUM_EVERY: u64 = 20_000;
/// Default failed hand-offs retried before FAILED (`OUTBOX_MAX_RETRIES`).
pub const DEFAULT_MAX_RETRIES: u32 = 6;
/// Default lease of a claimed row (`OUTBOX_LOCK_TIMEOUT_MS`).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(300_000);
/// How long an event whose type no routing rule matches waits for a route
/// (`OUTBOX_UNROUTED_GRACE_SECONDS`) before it goes `FAILED (unrouted)`:
/// long enough for a rolling deploy that adds the route to finish.
pub const DEFAULT_UNROUTED_GRACE: Duration = Duration::from_secs(600);
/// Longest accepted unrouted grace period: a week.
pub const MAX_UNROUTED_GRACE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often an event waiting for a route is claimed again, and how often a
/// dispatcher looks for `FAILED (unrouted)` events it now has a route for.
pub const UNROUTED_RECHECK: Duration = Duration::from_secs(30);
/// The shortest lease of a claimed row [`DispatcherConfig::validate`]
/// accepts.
pub const MIN_LOCK_TIMEOUT: Duration = Duration::from_secs(1);

/// `OUTBOX_DISPATCH_INTERVAL_MS`: [`DispatcherConfig::interval`].
pub const OUTBOX_DISPATCH_INTERVAL_MS: Whole = Whole {
    name: "OUTBOX_DISPATCH_INTERVAL_MS",
    default: millis(DEFAULT_INTERVAL),
    min: 1,
    max: MAX_MILLIS,
    meaning: "dispatcher poll cadence in ms (inserts also wake it through NOTIFY)",
};
/// `OUTBOX_DISPATCH_BATCH_SIZE`: [`DispatcherConfig::batch_size`].
pub const OUTBOX_DISPATCH_BATCH_SIZE: Whole = Whole {
    name: "OUTBOX_DISPATCH_BATCH_SIZE",
    default: DEFAULT_BATCH_SIZE as u64,
    min: 1,
    max: MAX_BATCH_SIZE as u64,
    meaning: "rows the dispatcher claims per tick",
};
/// `OUTBOX_DISPATCH_CONCURRENCY`: [`DispatcherConfig::concurrency`].
pub const OUTBOX_DISPATCH_CONCURRENCY: Whole = Whole {
    name: "OUTBOX_DISPATCH_CONCURRENCY",
    default: DEFAULT_CONCURRENCY as u64,
    min: 1,
    max: 1000,
    meaning: "queue pushes in flight within a tick",
};
/// `OUTBOX_DISPATCH_LOOPS`: [`DispatcherConfig::loops`].
pub const OUTBOX_DISPATCH_LOOPS: Whole = Whole {
    name: "OUTBOX_DISPATCH_LOOPS",
    default: DEFAULT_LOOPS as u64,
    min: 1,
    max: MAX_LOOPS as u64,
    meaning: "claim-and-hand-off loops the dispatcher runs at once (each uses one Postgres connection while it ticks)",
};
/// `OUTBOX_DISPATCH_LOOPS_TOTAL`: [`DispatcherConfig::loops_total`].
pub const OUTBOX_DISPATCH_LOOPS_TOTAL: Whole = Whole {
    name: "OUTBOX_DISPATCH_LOOPS_TOTAL",
    default: DEFAULT_LOOPS_TOTAL as u64,
    min: 0,
    max: MAX_LOOPS_TOTAL as u64,
    meaning: "claim-and-hand-off loops all the dispatchers listening on this database run between them, packed into the first ones: each runs what those before it left, at most OUTBOX_DISPATCH_LOOPS, and one left with none stands by (one claim per poll interval); 0 lets each run OUTBOX_DISPATCH_LOOPS whatever the others do",
};
/// `OUTBOX_DISPATCH_VACUUM_EVERY`: [`DispatcherConfig::vacuum_every`].
pub const OUTBOX_DISPATCH_VACUUM_EVERY: Whole = Whole {
    name: "OUTBOX_DISPATCH_VACUUM_EVERY",
    default: DEFAULT_VACUUM_EVERY,
    min: 0,
    max: 1_000_000_000,
    meaning: "the most claimed rows between two VACUUM (SKIP_LOCKED) outbox_event of the dispatcher (the first after 1,000, later ones after the table's row count while that is smaller), which keep dead entries out of the claim index and plans fresh; 0 leaves the table to autovacuum",
};
/// `OUTBOX_MAX_RETRIES`: [`DispatcherConfig::max_retries`].
pub const OUTBOX_MAX_RETRIES: Whole = Whole {
    name: "OUTBOX_MAX_RETRIES",
    default: DEFAULT_MAX_RETRIES as u64,
    min: 0,
    max: 1000,
    meaning: "failed hand-offs retried (1, 2, 4 … 32 min apart) before a row is FAILED",
};
/// `OUTBOX_LOCK_TIMEOUT_MS`: [`DispatcherConfig::lock_timeout`].
pub const OUTBOX_LOCK_TIMEOUT_MS: Whole = Whole {
    name: "OUTBOX_LOCK_TIMEOUT_MS",
    default: millis(DEFAULT_LOCK_TIMEOUT),
    min: millis(MIN_LOCK_TIMEOUT),
    max: MAX_MILLIS,
    meaning: "lease of a claimed row in ms; past it another dispatcher may claim it",
};
/// `OUTBOX_UNROUTED_GRACE_SECONDS`: [`DispatcherConfig::unrouted_grace`].
pub const OUTBOX_UNROUTED_GRACE_SECONDS: Whole = Whole {
    name: "OUTBOX_UNROUTED_GRACE_SECONDS",
    default: DEFAULT_UNROUTED_GRACE.as_secs(),
    min: 0,
    max: MAX_UNROUTED_GRACE.as_secs(),
    meaning: "seconds an event no routing rule matches waits for a route before it is FAILED (unrouted); 0 fails it at once",
};

/// How the dispatcher runs. Binaries fill it from the environment
/// (`OUTBOX_DISPATCH_*`, `OUTBOX_MAX_RETRIES`, `OUTBOX_LOCK_TIMEOUT_MS`,
/// `OUTBOX_UNROUTED_GRACE_SECONDS`);
/// [`Default`] is the contract's defaults, except [`DEFAULT_BATCH_SIZE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatcherConfig {
    /// Poll cadence: the fallback when no insert notification arrives.
    pub interval: Duration,
    /// Most rows claimed per tick ([`DEFAULT_BATCH_SIZE`] by default).
    pub batch_size: u32,
    /// Most queue pushes in flight at once within a tick.
    pub concurrency: usize,
    /// Claim-and-hand-off loops run at once ([`DEFAULT_LOOPS`]); each holds
    /// one pooled connection while it ticks. The first
    /// [`crate::WAKE_LOOPS`] answer wake-ups and the poll interval; a loop
    /// that claims a whole batch wakes an idle one, so a backlog keeps them
    /// all busy while a trickle keeps at most those first ones busy.
    pub loops: usize,
    /// Loops all the dispatchers listening on the database run between
    /// them ([`DEFAULT_LOOPS_TOTAL`]): every second this dispatcher counts
    /// those before it and runs [`crate::loops_to_run`] of its `loops`,
    /// what they left of the total; the rest wait holding no connection,
    /// and one left with none stands by (its first loop claims once per
    /// poll interval, leaving wake-ups to the others). 0 runs all of `loops`
    /// whatever the others do; so does a dispatcher without `listen` (it is
    /// not counted).
    ///
    /// ```
    /// use outbox_dispatch::{DispatcherConfig, loops_to_run};
    ///
    /// // A database server with more cores: sixteen loops between them.
    /// let get = |name: &str| (name == "OUTBOX_DISPATCH_LOOPS_TOTAL").then(|| "16".to_owned());
    /// let config = DispatcherConfig::from_lookup(&get)?;
    /// assert_eq!(config.loops_total, 16);
    /// // Each of four dispatchers then runs all of its four loops.
    /// assert_eq!(loops_to_run(config.loops, config.loops_total, 3), 4);
    /// # Ok::<(), outbox_env::VariableError>(())
    /// ```
    pub loops_total: usize,
    /// Failed hand-offs retried before a row is dead-lettered (FAILED).
    pub max_retries: u32,
    /// Lease of a claimed row; past it, another dispatcher may re-claim it.
    pub lock_timeout: Duration,
    /// Delay before retry n (1-based) is `backoff[min(n, len) - 1]`.
    pub backoff: Vec<Duration>,
    /// Wake on `NOTIFY outbox_event` (in addition to polling).
    pub listen: bool,
    /// The most claimed rows between two vacuums of `outbox_event` by this
    /// dispatcher ([`DEFAULT_VACUUM_EVERY`]; the first round comes after
    /// [`crate::FIRST_VACUUM_ROUND`]); 0 leaves the table to autovacuum.
    pub vacuum_every: u64,
    /// How long an event no routing rule matches waits for a route before
    /// it goes `FAILED (unrouted)` ([`DEFAULT_UNROUTED_GRACE`]); zero
    /// dead-letters it at once.
    pub unrouted_grace: Duration,
    /// How often a waiting event is claimed again and `FAILED (unrouted)`
    /// events are looked at for a new route ([`UNROUTED_RECHECK`]).
    pub unrouted_recheck: Duration,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_INTERVAL,
            batch_size: DEFAULT_BATCH_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            loops: DEFAULT_LOOPS,
            loops_total: DEFAULT_LOOPS_TOTAL,
            max_retries: DEFAULT_MAX_RETRIES,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            backoff: DEFAULT_BACKOFF.to_vec(),
            listen: true,
            vacuum_every: DEFAULT_VACUUM_EVERY,
            unrouted_grace: DEFAULT_UNROUTED_GRACE,
            unrouted_recheck: UNROUTED_RECHECK,
        }
    }
}

/// A configuration value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid dispatcher configuration: {field} {problem}")]
pub struct ConfigError {
    /// The field (named as its environment variable where there is one).
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl DispatcherConfig {
    /// The settings of the variables above read through `get` (the process
    /// environment in a binary), the rest as [`Default`]; each range is
    /// one [`DispatcherConfig::validate`] accepts.
    ///
    /// ```
    /// use outbox_dispatch::DispatcherConfig;
    ///
    /// let get = |name: &str| (name == "OUTBOX_DISPATCH_BATCH_SIZE").then(|| "100".to_owned());
    /// let config = DispatcherConfig::from_lookup(&get)?;
    /// assert_eq!(config.batch_size, 100);
    /// assert_eq!(config.interval, outbox_dispatch::DEFAULT_INTERVAL);
    /// # Ok::<(), outbox_env::VariableError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The first [`VariableError`], naming its variable.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, VariableError> {
        Ok(Self {
            interval: OUTBOX_DISPATCH_INTERVAL_MS.read_millis(get)?,
            batch_size: OUTBOX_DISPATCH_BATCH_SIZE.read_as(get)?,
            concurrency: OUTBOX_DISPATCH_CONCURRENCY.read_as(get)?,
            loops: OUTBOX_DISPATCH_LOOPS.read_as(get)?,
            loops_total: OUTBOX_DISPATCH_LOOPS_TOTAL.read_as(get)?,
            vacuum_every: OUTBOX_DISPATCH_VACUUM_EVERY.read(get)?,
            max_retries: OUTBOX_MAX_RETRIES.read_as(get)?,
            lock_timeout: OUTBOX_LOCK_TIMEOUT_MS.read_millis(get)?,
            unrouted_grace: Duration::from_secs(OUTBOX_UNROUTED_GRACE_SECONDS.read(get)?),
            ..Self::default()
        })
    }

    /// Checks that every value can work.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`] found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |field, problem| Err(ConfigError { field, problem });
        if self.interval.is_zero() {
            return fail("OUTBOX_DISPATCH_INTERVAL_MS", "must be greater than 0");
        }
        if self.batch_size == 0 {
            return fail("OUTBOX_DISPATCH_BATCH_SIZE", "must be greater than 0");
        }
        if self.batch_size > MAX_BATCH_SIZE {
            return fail("OUTBOX_DISPATCH_BATCH_SIZE", MAX_BATCH_PROBLEM);
        }
        if self.concurrency == 0 {
            return fail("OUTBOX_DISPATCH_CONCURRENCY", "must be greater than 0");
        }
        if self.loops == 0 {
            return fail("OUTBOX_DISPATCH_LOOPS", "must be greater than 0");
        }
        if self.loops > MAX_LOOPS {
            return fail("OUTBOX_DISPATCH_LOOPS", "must be at most 64");
        }
        if self.loops_total > MAX_LOOPS_TOTAL {
            return fail("OUTBOX_DISPATCH_LOOPS_TOTAL", "must be at most 4096");
        }
        if self.lock_timeout < MIN_LOCK_TIMEOUT {
            return fail("OUTBOX_LOCK_TIMEOUT_MS", "must be at least 1000");
        }
        if self.backoff.is_empty() {
            return fail("backoff", "must have at least one step");
        }
        if self.unrouted_grace > MAX_UNROUTED_GRACE {
            return fail(
                "OUTBOX_UNROUTED_GRACE_SECONDS",
                "must be at most 604800 (a week)",
            );
        }
        if self.unrouted_recheck.is_zero() {
            return fail("unrouted_recheck", "must be greater than 0");
        }
        Ok(())
    }

    /// The longest time after a first push in which this dispatcher may push
    /// the same event generation again: a lease that expires before the
    /// outcome is recorded (the row is claimed again), plus every retry of
    /// the ladder (a push reported failed may have landed). A finished job
    /// must stay in Redis at least this long for the second push to be a
    /// no-op.
    #[must_use]
    pub fn repush_window(&self) -> Duration {
        (1..=self.max_retries)
            .map(|retry| self.backoff_for(retry) + self.lock_timeout)
            .fold(self.lock_timeout, |total, step| total.saturating_add(step))
    }

    /// The delay before retry number `retry` (1-based).
    #[must_use]
    pub fn backoff_for(&self, retry: u32) -> Duration {
        let index = (retry.max(1) as usize - 1).min(self.backoff.len().saturating_sub(1));
        self.backoff
            .get(index)
            .copied()
            .unwrap_or(Duration::from_secs(60))
    }
}

/// The `outbox-done-retention` maintenance job's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionConfig {
    /// DONE rows processed longer ago than this are deleted.
    pub retention: Duration,
    /// Rows deleted per statement; clamped to 1..=10000.
    pub batch_size: u32,
    /// How far back the Redis guard may push `DONE` rows again at most
    /// (`QUEUE_DONE_RETENTION_HOURS`, 24 hours by default): retention
    /// keeps the rows the guard may still need, those handed off after
    /// the oldest safe point of any queue, but for no longer than this,
    /// even when `retention` is shorter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_dispatch::RetentionConfig;
    ///
    /// // One hour of DONE rows, with finished jobs kept 48 hours in Redis.
    /// let config = RetentionConfig {
    ///     guard_reach: Duration::from_secs(48 * 3600),
    ///     ..RetentionConfig::new(Duration::from_secs(3600), 1000)
    /// };
    /// assert_eq!(config.retention, Duration::from_secs(3600));
    /// ```
    pub guard_reach: Duration,
}

impl RetentionConfig {
    /// The largest batch accepted.
    pub const MAX_BATCH: u32 = 10_000;
    /// Default age after which DONE rows are deleted (720 hours).
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(720 * 3600);
    /// Default rows deleted per batch.
    pub const DEFAULT_BATCH: u32 = 1000;
    /// Default [`RetentionConfig::guard_reach`]: the default of
    /// `QUEUE_DONE_RETENTION_HOURS`.
    pub const DEFAULT_GUARD_REACH: Duration =
        Duration::from_secs(outbox_queue::DEFAULT_DONE_RETENTION_HOURS * 3600);

    /// The settings of `OUTBOX_DONE_RETENTION_HOURS`,
    /// `OUTBOX_DONE_RETENTION_BATCH_SIZE` and `QUEUE_DONE_RETENTION_HOURS`
    /// ([`RetentionConfig::guard_reach`]) read through `get`, the batch
    /// clamped as [`RetentionConfig::new`] does.
    ///
    /// # Errors
    ///
    /// The first [`VariableError`] (a non-number, say), naming its variable.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, VariableError> {
        Ok(Self {
            guard_reach: outbox_queue::QUEUE_DONE_RETENTION_HOURS.read_hours(get)?,
            ..Self::new(
                OUTBOX_DONE_RETENTION_HOURS.read_hours(get)?,
                // Out-of-range batch sizes are clamped, as the contract says.
                OUTBOX_DONE_RETENTION_BATCH_SIZE.read_as(get)?,
            )
        })
    }

    /// A configuration with `batch_size` clamped to 1..=10000 and the
    /// default [`RetentionConfig::guard_reach`] (24 hours).
    #[must_use]
    pub fn new(retention: Duration, batch_size: u32) -> Self {
        Self {
            retention,
            batch_size: batch_size.clamp(1, Self::MAX_BATCH),
            guard_reach: Self::DEFAULT_GUARD_REACH,
        }
    }
}

/// `OUTBOX_DONE_RETENTION_HOURS`: [`RetentionConfig::retention`].
pub const OUTBOX_DONE_RETENTION_HOURS: Whole = Whole {
    name: "OUTBOX_DONE_RETENTION_HOURS",
    default: hours(RetentionConfig::DEFAULT_RETENTION),
    min: 0,
    max: 1_000_000,
    meaning: "DONE rows are deleted after this many hours",
};
/// `OUTBOX_DONE_RETENTION_BATCH_SIZE`: [`RetentionConfig::batch_size`],
/// clamped rather than refused.
pub const OUTBOX_DONE_RETENTION_BATCH_SIZE: Whole = Whole {
    name: "OUTBOX_DONE_RETENTION_BATCH_SIZE",
    default: RetentionConfig::DEFAULT_BATCH as u64,
    min: 0,
    max: u32::MAX as u64,
    meaning: "rows deleted per retention batch (clamped to 1..=10000)",
};

impl Default for RetentionConfig {
    /// 720 hours, batches of 1000.
    fn default() -> Self {
        Self::new(Self::DEFAULT_RETENTION, Self::DEFAULT_BATCH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Break checked: `repush_window` answering 0 (a mutation run's shard 7)
    // fails here; the worker then accepted a queue retention shorter than
    // the time in which the same job may be pushed again.
    #[test]
    fn the_repush_window_is_a_lease_plus_every_retry_and_its_lease() {
        let config = DispatcherConfig {
            lock_timeout: Duration::from_secs(10),
            max_retries: 3,
            backoff: vec![Duration::from_secs(1), Duration::from_secs(4)],
            ..DispatcherConfig::default()
        };
        // 10 + (1 + 10) + (4 + 10) + (4 + 10): the last step repeats.
        assert_eq!(config.repush_window(), Duration::from_secs(49));
        let no_retries = DispatcherConfig {
            max_retries: 0,
            ..config
        };
        assert_eq!(no_retries.repush_window(), Duration::from_secs(10));
        // The defaults: a 5-minute lease and 1 + 2 + 4 + 8 + 16 + 32 minutes.
        assert_eq!(
            DispatcherConfig::default().repush_window(),
            Duration::from_secs(60 * (5 + 63 + 6 * 5))
        );
    }

    #[test]
    fn backoff_follows_the_schedule_and_stays_at_the_last_step() {
        let config = DispatcherConfig::default();
        let minutes: Vec<u64> = (1..=8)
            .map(|n| config.backoff_for(n).as_secs() / 60)
            .collect();
        assert_eq!(minutes, [1, 2, 4, 8, 16, 32, 32, 32]);
    }

    #[test]
    fn validation_names_the_variable() {
        let zero_batch = DispatcherConfig {
            batch_size: 0,
            ..DispatcherConfig::default()
        };
        assert_eq!(
            zero_batch.validate().unwrap_err().field,
            "OUTBOX_DISPATCH_BATCH_SIZE"
        );
        assert!(DispatcherConfig::default().validate().is_ok());
        let batch = |batch_size| DispatcherConfig {
            batch_size,
            ..DispatcherConfig::default()
        };
        assert!(batch(10_000).validate().is_ok(), "the largest batch");
        let too_large = batch(10_001).validate().unwrap_err();
        assert_eq!(too_large.field, "OUTBOX_DISPATCH_BATCH_SIZE");
        assert_eq!(too_large.problem, "must be at most 10000");
        assert_eq!(
            too_large.problem,
            format!("must be at most {MAX_BATCH_SIZE}"),
            "the message names the bound"
        );
        for loops in [0, MAX_LOOPS + 1] {
            let config = DispatcherConfig {
                loops,
                ..DispatcherConfig::default()
            };
            assert_eq!(
                config.validate().unwrap_err().field,
                "OUTBOX_DISPATCH_LOOPS",
                "{loops} loops"
            );
        }
        let most = DispatcherConfig {
            loops: MAX_LOOPS,
            ..DispatcherConfig::default()
        };
        assert!(most.validate().is_ok());
        let total = |loops_total| DispatcherConfig {
            loops_total,
            ..DispatcherConfig::default()
        };
        assert!(total(0).validate().is_ok(), "sharing off");
        assert!(total(MAX_LOOPS_TOTAL).validate().is_ok());
        let too_many = total(MAX_LOOPS_TOTAL + 1).validate().unwrap_err();
        assert_eq!(too_many.field, "OUTBOX_DISPATCH_LOOPS_TOTAL");
        assert_eq!(
            too_many.problem,
            format!("must be at most {MAX_LOOPS_TOTAL}"),
            "the message names the bound"
        );
    }

    // Break checked: the grace's `>` as `==` (a mutation run's shard 0)
    // let a grace of a week and a second through.
    #[test]
    fn each_rule_refuses_just_past_its_bound_and_accepts_the_bound() {
        let with = |change: &dyn Fn(&mut DispatcherConfig)| {
            let mut config = DispatcherConfig::default();
            change(&mut config);
            config.validate().map_err(|e| e.field)
        };
        // A week, as the variable's documentation says (not the constant
        // read back: `7 * 24 * 3600` as `7 + 24 * 3600`, a miss of a
        // mutation run, would pass then).
        let week = Duration::from_secs(604_800);
        assert_eq!(MAX_UNROUTED_GRACE, week);
        assert_eq!(with(&|c| c.unrouted_grace = week), Ok(()));
        assert_eq!(with(&|c| c.unrouted_grace = Duration::ZERO), Ok(()));
        for past in [week + Duration::from_secs(1), week * 2] {
            assert_eq!(
                with(&|c| c.unrouted_grace = past),
                Err("OUTBOX_UNROUTED_GRACE_SECONDS"),
                "{past:?}"
            );
        }
        assert_eq!(with(&|c| c.lock_timeout = MIN_LOCK_TIMEOUT), Ok(()));
        assert_eq!(
            with(&|c| c.lock_timeout = Duration::from_millis(999)),
            Err("OUTBOX_LOCK_TIMEOUT_MS")
        );
        assert_eq!(
            with(&|c| c.interval = Duration::ZERO),
            Err("OUTBOX_DISPATCH_INTERVAL_MS")
        );
        assert_eq!(
            with(&|c| c.concurrency = 0),
            Err("OUTBOX_DISPATCH_CONCURRENCY")
        );
        assert_eq!(with(&|c| c.backoff.clear()), Err("backoff"));
        assert_eq!(
            with(&|c| c.unrouted_recheck = Duration::ZERO),
            Err("unrouted_recheck")
        );
    }

    // Break checked: `RetentionConfig::from_lookup` answering the defaults
    // (a miss of the pinned dispatch shard 3) fails the first assertion.
    #[test]
    fn the_retention_variables_set_the_window_and_a_clamped_batch() {
        let with = |hours: &'static str, batch: &'static str| {
            RetentionConfig::from_lookup(&move |name: &str| match name {
                "OUTBOX_DONE_RETENTION_HOURS" => Some(hours.to_owned()),
                "OUTBOX_DONE_RETENTION_BATCH_SIZE" => Some(batch.to_owned()),
                _ => None,
            })
        };
        assert_eq!(
            with("48", "250").unwrap(),
            RetentionConfig {
                retention: Duration::from_secs(48 * 3600),
                batch_size: 250,
                guard_reach: RetentionConfig::DEFAULT_GUARD_REACH,
            }
        );
        assert_eq!(
            RetentionConfig::from_lookup(&|name: &str| {
                (name == "QUEUE_DONE_RETENTION_HOURS").then(|| "36".to_owned())
            })
            .unwrap()
            .guard_reach,
            Duration::from_secs(36 * 3600),
            "the Redis guard reaches back as far as finished jobs are kept"
        );
        assert_eq!(with("1", "0").unwrap().batch_size, 1, "clamped up");
        assert_eq!(
            with("1", "99999").unwrap().batch_size,
            RetentionConfig::MAX_BATCH,
            "clamped down"
        );
        assert_eq!(
            RetentionConfig::from_lookup(&|_| None).unwrap(),
            RetentionConfig::default()
        );
        let error = with("soon", "250").unwrap_err();
        assert!(
            error.to_string().contains("OUTBOX_DONE_RETENTION_HOURS"),
            "{error}"
        );
    }

    // Break checked: `from_lookup` without its `batch_size` line (the
    // default then, 500; a mutation run's shard 0) fails here.
    #[test]
    fn each_dispatcher_variable_sets_its_field_and_a_bad_one_is_named() {
        let set = [
            ("OUTBOX_DISPATCH_INTERVAL_MS", "250"),
            ("OUTBOX_DISPATCH_BATCH_SIZE", "100"),
            ("OUTBOX_DISPATCH_CONCURRENCY", "3"),
            ("OUTBOX_DISPATCH_LOOPS", "2"),
            ("OUTBOX_DISPATCH_LOOPS_TOTAL", "5"),
            ("OUTBOX_DISPATCH_VACUUM_EVERY", "7000"),
            ("OUTBOX_MAX_RETRIES", "9"),
            ("OUTBOX_LOCK_TIMEOUT_MS", "2000"),
            ("OUTBOX_UNROUTED_GRACE_SECONDS", "45"),
        ];
        let get = |name: &str| {
            set.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        };
        let config = DispatcherConfig::from_lookup(&get).unwrap();
        assert_eq!(
            config,
            DispatcherConfig {
                interval: Duration::from_millis(250),
                batch_size: 100,
                concurrency: 3,
                loops: 2,
                loops_total: 5,
                vacuum_every: 7000,
                max_retries: 9,
                lock_timeout: Duration::from_secs(2),
                unrouted_grace: Duration::from_secs(45),
                ..DispatcherConfig::default()
            }
        );
        assert_eq!(
            DispatcherConfig::from_lookup(&|_| None).unwrap(),
            DispatcherConfig::default(),
            "nothing set: the defaults"
        );
        for (name, _) in set {
            let bad = |key: &str| (key == name).then(|| "many".to_owned());
            let error = DispatcherConfig::from_lookup(&bad).unwrap_err();
            assert!(error.to_string().contains(name), "{name}: {error}");
        }
    }

    #[test]
    fn retention_batch_is_clamped() {
        assert_eq!(RetentionConfig::new(Duration::ZERO, 0).batch_size, 1);
        assert_eq!(
            RetentionConfig::new(Duration::ZERO, 50_000).batch_size,
            10_000
        );
        assert_eq!(RetentionConfig::default().batch_size, 1000);
    }
}
