//! Reconciliation: finding the handed-off jobs a Redis lost, and pushing
//! them again.
//!
//! A `DONE` row says its job was handed to Redis. For each such row in a
//! window, [`Reconciler`] asks whether the job is still there (waiting,
//! scheduled, running, done or dead: its body is in the queue) or whether its
//! receiver recorded the work as done, and pushes the missing ones again
//! with their own task ids (`outbox:<event id>`, `…:g<n>` after a replay),
//! which the queue deduplicates, so running it twice, or while the
//! dispatcher works, changes nothing more.
//!
//! What counts as the receiver's record depends on the queue ([`Receiver`]),
//! as the subscribers describe their handlers (the `outbox-catalog` crate
//! turns the descriptions into [`Receivers`]); for the built-in
//! subscribers:
//!
//! | queue | the receiver's record | jobs it derives |
//! |---|---|---|
//! | `outbox.mail`, `outbox.marketing` | the mail's idempotency record `email:<delivery id>` | one `toolctrl.email` job `email:<delivery id>` |
//! | `outbox.plugin-hook` | each invocation's record `plugin-invoke:<delivery id>:<subscription>` | one `toolctrl.plugin-invoke` job per enabled subscription to the hook |
//! | `outbox.audit` | its `audit_log` row | none |
//! | `outbox.notification` | its `notification` row | none |
//! | every other queue | none: a missing job is pushed again | none |
//!
//! Nothing above is particular to the built-in subscribers: an
//! application's handler is read the same way from its description alone.
//! One that writes one row per event in a table with a unique
//! `outbox_event_id` column is read as the audit handler is. One that
//! derives jobs on a downstream queue is read as the mail handler is when
//! its description says how their task ids are formed
//! ([`outbox_queue::DerivedTaskIds`]: one per delivery,
//! `<prefix><delivery id>`, or one per plugin-hook subscription); when it
//! says they cannot be listed, its queue is reconciled as a plain one: its
//! lost job is pushed again, but a derived job lost after its parent
//! finished is not noticed.
//!
//! Derived jobs are not pushed by reconciliation: it cannot build them (the
//! mail is rendered by the mail handler, the subscriptions are read at
//! fan-out time). They are recreated by running their parent again:
//!
//! - a parent job that is **missing** is pushed again, and its handler
//!   derives the downstream jobs again (with the same task ids, so one that
//!   survived is not doubled); a parent whose job is missing but whose every
//!   derived job is still there or recorded completed has done its work and
//!   is left alone;
//! - a parent job that is **done** while one of its derived jobs is missing
//!   and not recorded completed is **run again** ([`outbox_queue::rerun_finished`]:
//!   the finished job goes back on its queue, body unchanged): the derived
//!   job was lost after its parent finished, and the parent is the only
//!   thing that can make it. Only subscriptions created before the parent
//!   finished count for a plugin hook (a later subscription was never part
//!   of its fan-out).
//!
//! Receivers stay idempotent throughout: a re-run parent or a re-pushed job
//! whose effect did happen is recognised by its idempotency key, as long as
//! that record survived.
//!
//! The window must not reach past `QUEUE_DONE_RETENTION_HOURS`: jobs
//! finished longer ago are trimmed from Redis on purpose and would look
//! lost ([`retention_floor`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use outbox_idempotency::RedisIdempotencyStore;
use outbox_model::OutboxEvent;
use outbox_queue::RedisConnection;
use outbox_queue::{
    DerivedTaskIds, JobState, JobStateKind, OutboxJob, QueueNamespace, generation_task_id,
    idempotency_prefix, job_states, push_jobs, rerun_finished,
};
use serde::Serialize;
use uuid::Uuid;

use crate::DispatchError;
use crate::db::{self, RowTable};

/// Rows examined per batch unless [`Reconciler::with_batch_size`] says
/// otherwise.
pub const DEFAULT_RECONCILE_BATCH: usize = 500;

/// Kept off the trimming retention: a window starts at least this much
/// later than `now - QUEUE_DONE_RETENTION_HOURS`, so clock differences
/// between the Redis and Postgres hosts cannot make a trimmed job look lost.
pub const RETENTION_MARGIN: Duration = Duration::from_secs(10 * 60);

/// The earliest hand-off a window may reach back to at `now`: finished jobs
/// older than the trimming retention (less [`RETENTION_MARGIN`]) are gone
/// from Redis by design, not lost.
///
/// ```
/// use std::time::Duration;
/// let now = chrono::DateTime::from_timestamp(100_000, 0).unwrap();
/// let floor = outbox_dispatch::retention_floor(now, Duration::from_secs(24 * 3600));
/// assert_eq!((now - floor).num_minutes(), 24 * 60 - 10);
/// ```
#[must_use]
pub fn retention_floor(now: DateTime<Utc>, retention: Duration) -> DateTime<Utc> {
    let reach = retention
        .saturating_sub(RETENTION_MARGIN)
        .max(RETENTION_MARGIN);
    now - chrono::Duration::from_std(reach).unwrap_or(chrono::Duration::MAX)
}

/// What a queue's handler leaves behind once it has done its work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Receiver {
    /// Derives jobs on the downstream queue `queue`, whose task ids (also
    /// their receivers' idempotency keys) `task_ids` lists: `outbox.mail`
    /// and `outbox.marketing` one `toolctrl.email` job per delivery,
    /// `outbox.plugin-hook` one `toolctrl.plugin-invoke` job per
    /// subscription.
    Derives {
        /// The downstream queue.
        queue: Cow<'static, str>,
        /// How the derived jobs' task ids are formed (never
        /// [`DerivedTaskIds::Unlisted`]).
        task_ids: DerivedTaskIds,
    },
    /// Writes one row per event in a table (`outbox.audit`,
    /// `outbox.notification`).
    Row(RowTable),
    /// Leaves nothing reconciliation can read: only the job tells.
    Plain,
}

impl Receiver {
    /// The receiver of a queue whose handler derives jobs on the
    /// downstream queue `downstream` with task ids formed as `task_ids`
    /// says, when reconciliation can list them (not
    /// [`DerivedTaskIds::Unlisted`]).
    ///
    /// ```
    /// use outbox_dispatch::Receiver;
    /// use outbox_queue::{DerivedTaskIds, EMAIL_TASK_IDS};
    /// let mail = Receiver::deriving("toolctrl.email", &EMAIL_TASK_IDS).unwrap();
    /// assert_eq!(mail.derives_on(), Some("toolctrl.email"));
    /// let refresh = DerivedTaskIds::per_delivery("refresh:");
    /// assert!(Receiver::deriving("app.search-refresh", &refresh).is_some());
    /// let pages = DerivedTaskIds::unlisted("refresh:<page>");
    /// assert_eq!(Receiver::deriving("app.search-refresh", &pages), None);
    /// ```
    #[must_use]
    pub fn deriving(
        downstream: impl Into<Cow<'static, str>>,
        task_ids: &DerivedTaskIds,
    ) -> Option<Self> {
        task_ids.is_listed().then(|| Self::Derives {
            queue: downstream.into(),
            task_ids: task_ids.clone(),
        })
    }

    /// The queue this receiver's handler derives jobs on, if any.
    ///
    /// ```
    /// use outbox_dispatch::Receiver;
    /// assert_eq!(Receiver::Plain.derives_on(), None);
    /// ```
    #[must_use]
    pub fn derives_on(&self) -> Option<&str> {
        match self {
            Self::Derives { queue, .. } => Some(queue),
            Self::Row(_) | Self::Plain => None,
        }
    }

    /// The receiver of a queue whose handler records its work where
    /// `recorded_in` says (a subscriber description's words): a row per
    /// event for `<table>.outbox_event_id`, nothing readable otherwise.
    ///
    /// ```
    /// use outbox_dispatch::Receiver;
    /// assert!(matches!(Receiver::recorded_in("audit_log.outbox_event_id"), Receiver::Row(_)));
    /// assert_eq!(Receiver::recorded_in("idempotency store"), Receiver::Plain);
    /// ```
    #[must_use]
    pub fn recorded_in(recorded_in: impl Into<Cow<'static, str>>) -> Self {
        RowTable::parse(recorded_in).map_or(Self::Plain, Self::Row)
    }
}

/// Each queue's [`Receiver`], as the subscriber descriptions say (the
/// `outbox-catalog` crate builds it from them); a queue not listed is
/// [`Receiver::Plain`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receivers {
    by_queue: HashMap<String, Receiver>,
}

impl Receivers {
    /// No queue listed: every queue is [`Receiver::Plain`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// These receivers, with `queue`'s set to `receiver`.
    #[must_use]
    pub fn with(mut self, queue: impl Into<String>, receiver: Receiver) -> Self {
        self.by_queue.insert(queue.into(), receiver);
        self
    }

    /// The receiver of `queue`.
    ///
    /// ```
    /// use outbox_dispatch::{Receiver, Receivers};
    /// let audit = Receiver::recorded_in("audit_log.outbox_event_id");
    /// let receivers = Receivers::new().with("outbox.audit", audit.clone());
    /// assert_eq!(receivers.of("outbox.audit"), &audit);
    /// assert_eq!(receivers.of("outbox.webhook"), &Receiver::Plain);
    /// ```
    #[must_use]
    pub fn of(&self, queue: &str) -> &Receiver {
        self.by_queue.get(queue).unwrap_or(&Receiver::Plain)
    }
}

/// A job a handler derives from its event's job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DerivedJob {
    /// Its queue (`toolctrl.email`, `toolctrl.plugin-invoke`).
    pub queue: Cow<'static, str>,
    /// Its task id, which is also its receiver's idempotency key.
    pub task_id: String,
}

/// Where one handed-off event stands in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Its job is there, or its receiver recorded the work as done, and so
    /// is everything derived from it.
    Present {
        /// Nothing of it remains to run: its job (and every derived job) is
        /// done or dead, or recorded completed.
        finished: bool,
    },
    /// Its job is gone and no receiver recorded it: lost.
    Missing,
    /// Its job finished, but jobs it derived are gone and not recorded
    /// completed.
    DerivedMissing {
        /// The task id of the parent's latest copy: the job to run again.
        parent: String,
        /// The derived jobs that are gone.
        derived: Vec<DerivedJob>,
    },
}

impl Standing {
    /// Present and finished: nothing of it can be lost any more.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        matches!(self, Self::Present { finished: true })
    }
}

/// A job reconciliation found missing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MissingJob {
    /// The outbox event.
    pub event_id: Uuid,
    /// Its tenant.
    pub tenant_id: String,
    /// Its type.
    pub event_type: String,
    /// When it was handed off (`processed_at`).
    pub handed_off_at: DateTime<Utc>,
    /// The queue of the missing job.
    pub queue: String,
    /// The missing job's task id.
    pub task_id: String,
    /// For a derived job: the parent job that is run again to derive it
    /// (its task id; the parent is on the event's queue).
    pub derived_from: Option<String>,
}

/// One queue's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueCounts {
    /// DONE rows examined.
    pub checked: u64,
    /// Of those, jobs still there (or recorded done by their receiver).
    pub found: u64,
    /// Rows whose job, or a job derived from it, is gone.
    pub missing: u64,
    /// Jobs pushed again or parents run again (0 in a dry run).
    pub repushed: u64,
}

impl QueueCounts {
    pub(crate) fn add(&mut self, other: Self) {
        self.checked += other.checked;
        self.found += other.found;
        self.missing += other.missing;
        self.repushed += other.repushed;
    }
}

/// What one reconciliation found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    /// The window's start: rows handed off from then on were examined.
    pub since: DateTime<Utc>,
    /// Nothing was changed.
    pub dry_run: bool,
    /// Figures per queue (every queue asked about, also with no rows).
    pub queues: BTreeMap<String, QueueCounts>,
    /// Every missing job, in hand-off order per queue.
    pub missing: Vec<MissingJob>,
}

impl ReconcileReport {
    /// Rows whose job (or a derived job) was missing, over all queues.
    #[must_use]
    pub fn missing_total(&self) -> u64 {
        self.queues.values().map(|q| q.missing).sum()
    }

    /// Jobs pushed again or run again, over all queues.
    #[must_use]
    pub fn repushed_total(&self) -> u64 {
        self.queues.values().map(|q| q.repushed).sum()
    }
}

/// Which rows [`Reconciler::reconcile`] examines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileOptions {
    /// DONE rows handed off (`processed_at`) from then on.
    pub since: DateTime<Utc>,
    /// The queues (the rows' `target_queue`).
    pub queues: Vec<String>,
    /// Only report; push nothing.
    pub dry_run: bool,
}

/// What one batch found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// The figures.
    pub counts: QueueCounts,
    /// The missing jobs.
    pub missing: Vec<MissingJob>,
}

/// Checks handed-off rows against Redis and pushes the lost jobs again.
/// Shared by the dispatcher's Redis guard ([`crate::RedisGuard`]) and the
/// CLI's `outbox reconcile`.
#[derive(Clone)]
pub struct Reconciler {
    redis: RedisConnection,
    namespace: QueueNamespace,
    records: RedisIdempotencyStore<RedisConnection>,
    receivers: Receivers,
    batch_size: usize,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("namespace", &self.namespace)
            .field("receivers", &self.receivers)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

fn generation(row: &OutboxEvent) -> u32 {
    u32::try_from(row.generation).unwrap_or(0)
}

fn task_id_of(row: &OutboxEvent) -> String {
    generation_task_id(row.id, generation(row))
}

fn delivery_id_of(row: &OutboxEvent) -> String {
    outbox_queue::delivery_id(row.id, generation(row))
}

/// The lower bound of a cursor: every row handed off at `since` or later.
pub(crate) fn cursor_from(since: DateTime<Utc>) -> (DateTime<Utc>, Uuid) {
    (since, Uuid::nil())
}

impl Reconciler {
    /// A reconciler of the queues of `namespace` on `redis`, reading the
    /// receivers' records under [`idempotency_prefix`], and telling what
    /// each queue's handler leaves behind from `receivers`.
    #[must_use]
    pub fn new(redis: RedisConnection, namespace: QueueNamespace, receivers: Receivers) -> Self {
        let records =
            RedisIdempotencyStore::new(redis.clone()).with_prefix(idempotency_prefix(&namespace));
        Self {
            redis,
            namespace,
            records,
            receivers,
            batch_size: DEFAULT_RECONCILE_BATCH,
        }
    }

    /// Examines `batch_size` rows per batch (at least 1).
    #[must_use]
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    /// Rows per batch.
    #[must_use]
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// What `queue`'s handler leaves behind.
    #[must_use]
    pub fn receiver_of(&self, queue: &str) -> &Receiver {
        self.receivers.of(queue)
    }

    /// Where each of `rows` (DONE rows of `queue`) stands, in order.
    ///
    /// # Errors
    ///
    /// When Redis or Postgres fails.
    pub async fn classify(
        &self,
        conn: &mut AsyncPgConnection,
        queue: &str,
        rows: &[OutboxEvent],
    ) -> Result<Vec<Standing>, DispatchError> {
        let mut redis = self.redis.clone();
        let task_ids: Vec<String> = rows.iter().map(task_id_of).collect();
        let states = job_states(&mut redis, &self.namespace, queue, &task_ids).await?;
        let receiver = self.receivers.of(queue);
        let expected = self.expected_derived(conn, receiver, rows, &states).await?;
        let derived = self.derived_states(&expected).await?;
        let written = rows_written(conn, receiver, rows, &states).await?;
        Ok(rows
            .iter()
            .zip(&states)
            .zip(&expected)
            .map(|((row, state), expected)| {
                standing(
                    state,
                    expected,
                    receiver,
                    written.contains(&row.id),
                    &derived,
                )
            })
            .collect())
    }

    /// The state in Redis of each derived job, and whether its receiver
    /// recorded it done.
    async fn derived_states(
        &self,
        expected: &[Vec<DerivedJob>],
    ) -> Result<DerivedStates, DispatchError> {
        let mut redis = self.redis.clone();
        let mut by_queue: BTreeMap<&Cow<'static, str>, Vec<String>> = BTreeMap::new();
        for job in expected.iter().flatten() {
            by_queue
                .entry(&job.queue)
                .or_default()
                .push(job.task_id.clone());
        }
        let mut derived = DerivedStates::new();
        for (derived_queue, ids) in by_queue {
            let found = job_states(&mut redis, &self.namespace, derived_queue, &ids).await?;
            let completed = self.records.completed(&ids).await?;
            for ((task_id, state), completed) in ids.into_iter().zip(found).zip(completed) {
                derived.insert(
                    DerivedJob {
                        queue: derived_queue.clone(),
                        task_id,
                    },
                    (state, completed),
                );
            }
        }
        Ok(derived)
    }

    /// The jobs each row's handler derives (for rows whose job is done or
    /// missing; a waiting or dead job derives nothing more).
    async fn expected_derived(
        &self,
        conn: &mut AsyncPgConnection,
        receiver: &Receiver,
        rows: &[OutboxEvent],
        states: &[JobState],
    ) -> Result<Vec<Vec<DerivedJob>>, DispatchError> {
        let relevant =
            |state: &JobState| matches!(state.kind, JobStateKind::Done | JobStateKind::Missing);
        let Receiver::Derives { queue, task_ids } = receiver else {
            return Ok(vec![Vec::new(); rows.len()]);
        };
        let job = |task_id| DerivedJob {
            queue: queue.clone(),
            task_id,
        };
        match task_ids {
            DerivedTaskIds::PerDelivery(_) => Ok(rows
                .iter()
                .zip(states)
                .map(
                    |(row, state)| match task_ids.of_delivery(&delivery_id_of(row)) {
                        Some(task_id) if relevant(state) => vec![job(task_id)],
                        _ => Vec::new(),
                    },
                )
                .collect()),
            DerivedTaskIds::PerHookSubscription(_) => {
                let mut tenants: Vec<String> = rows
                    .iter()
                    .zip(states)
                    .filter(|(_, state)| relevant(state))
                    .map(|(row, _)| row.tenant_id.clone())
                    .collect();
                tenants.sort();
                tenants.dedup();
                let subscriptions = db::hook_subscriptions(conn, &tenants).await?;
                Ok(rows
                    .iter()
                    .zip(states)
                    .map(|(row, state)| {
                        let Some(hook) = row.event_type.strip_prefix("plugin.hook.") else {
                            return Vec::new();
                        };
                        if !relevant(state) {
                            return Vec::new();
                        }
                        // A subscription made after the fan-out was never part
                        // of it (done_at has whole seconds: one second of slack).
                        let cutoff = state
                            .finished_at
                            .and_then(|at| DateTime::from_timestamp(at as i64 + 1, 0));
                        let delivery_id = delivery_id_of(row);
                        subscriptions
                            .iter()
                            .filter(|s| s.tenant_id == row.tenant_id && s.hook == hook)
                            .filter(|s| cutoff.is_none_or(|cutoff| s.created_at <= cutoff))
                            .filter_map(|s| task_ids.of_subscription(&delivery_id, s.id))
                            .map(job)
                            .collect()
                    })
                    .collect())
            }
            DerivedTaskIds::Unlisted(_) => Ok(vec![Vec::new(); rows.len()]),
        }
    }

    /// Classifies `rows` (DONE rows of `queue`) and, unless `dry_run`,
    /// pushes the missing jobs again and runs again the finished parents of
    /// missing derived jobs.
    ///
    /// # Errors
    ///
    /// When Redis or Postgres fails; jobs already pushed stay pushed, and
    /// running the batch again is safe.
    pub async fn repair(
        &self,
        conn: &mut AsyncPgConnection,
        queue: &str,
        rows: &[OutboxEvent],
        dry_run: bool,
    ) -> Result<BatchOutcome, DispatchError> {
        let standings = self.classify(conn, queue, rows).await?;
        let mut outcome = BatchOutcome {
            counts: QueueCounts {
                checked: rows.len() as u64,
                ..QueueCounts::default()
            },
            missing: Vec::new(),
        };
        let mut to_push = Vec::new();
        let mut to_rerun = Vec::new();
        for (row, standing) in rows.iter().zip(standings) {
            let missing = |queue: &str, task_id: String, derived_from: Option<String>| MissingJob {
                event_id: row.id,
                tenant_id: row.tenant_id.clone(),
                event_type: row.event_type.clone(),
                handed_off_at: row.processed_at.unwrap_or(row.created_at),
                queue: queue.to_owned(),
                task_id,
                derived_from,
            };
            match standing {
                Standing::Present { .. } => outcome.counts.found += 1,
                Standing::Missing => {
                    outcome.counts.missing += 1;
                    outcome.missing.push(missing(queue, task_id_of(row), None));
                    to_push.push(OutboxJob::from_event(row));
                }
                Standing::DerivedMissing { parent, derived } => {
                    outcome.counts.missing += 1;
                    for job in derived {
                        outcome.missing.push(missing(
                            &job.queue,
                            job.task_id,
                            Some(parent.clone()),
                        ));
                    }
                    to_rerun.push(parent);
                }
            }
        }
        if dry_run {
            return Ok(outcome);
        }
        let mut redis = self.redis.clone();
        for chunk in to_push.chunks(DEFAULT_RECONCILE_BATCH) {
            let pushed = push_jobs(&mut redis, &self.namespace, queue, chunk).await?;
            outcome.counts.repushed += pushed.new as u64;
        }
        if !to_rerun.is_empty() {
            let rerun = rerun_finished(&mut redis, &self.namespace, queue, &to_rerun).await?;
            outcome.counts.repushed += rerun as u64;
        }
        for job in &outcome.missing {
            tracing::info!(
                event_id = %job.event_id, tenant_id = %job.tenant_id, queue = %job.queue,
                task_id = %job.task_id, derived_from = job.derived_from.as_deref().unwrap_or("-"),
                "{}",
                if job.derived_from.is_some() {
                    "a derived job Redis lost: its parent runs again"
                } else {
                    "a job Redis lost: pushed again"
                }
            );
        }
        let label = queue.to_owned();
        metrics::counter!("outbox_reconcile_checked_total", "queue" => label.clone())
            .increment(outcome.counts.checked);
        metrics::counter!("outbox_reconcile_missing_total", "queue" => label.clone())
            .increment(outcome.counts.missing);
        metrics::counter!("outbox_reconcile_repushed_total", "queue" => label)
            .increment(outcome.counts.repushed);
        Ok(outcome)
    }

    /// Examines every DONE row of `options.queues` handed off since
    /// `options.since`, batch by batch in hand-off order, and repairs what
    /// is missing (unless a dry run), logging progress per batch.
    ///
    /// # Errors
    ///
    /// When Redis or Postgres fails; batches done so far stay done, and
    /// running it again is safe.
    pub async fn reconcile(
        &self,
        conn: &mut AsyncPgConnection,
        options: &ReconcileOptions,
    ) -> Result<ReconcileReport, DispatchError> {
        let mut report = ReconcileReport {
            since: options.since,
            dry_run: options.dry_run,
            queues: BTreeMap::new(),
            missing: Vec::new(),
        };
        for queue in &options.queues {
            let mut counts = QueueCounts::default();
            let mut cursor = cursor_from(options.since);
            loop {
                let rows =
                    outbox_store::done_rows_after(conn, queue, cursor, self.batch_size).await?;
                let Some(last) = rows.last() else { break };
                cursor = (last.processed_at.unwrap_or(last.created_at), last.id);
                let batch = self.repair(conn, queue, &rows, options.dry_run).await?;
                counts.add(batch.counts);
                report.missing.extend(batch.missing);
                tracing::info!(
                    queue = %queue, checked = counts.checked, missing = counts.missing,
                    repushed = counts.repushed, up_to = %cursor.0, dry_run = options.dry_run,
                    "reconciling"
                );
                if rows.len() < self.batch_size {
                    break;
                }
            }
            report.queues.insert(queue.clone(), counts);
        }
        Ok(report)
    }
}

/// Each derived job's state in Redis and whether its receiver recorded it
/// done.
type DerivedStates = HashMap<DerivedJob, (JobState, bool)>;

/// The events among `rows` whose job is gone but whose handler wrote its
/// row (for a receiver that writes one row per event).
async fn rows_written(
    conn: &mut AsyncPgConnection,
    receiver: &Receiver,
    rows: &[OutboxEvent],
    states: &[JobState],
) -> Result<HashSet<Uuid>, DispatchError> {
    let Receiver::Row(table) = receiver else {
        return Ok(HashSet::new());
    };
    let gone: Vec<Uuid> = rows
        .iter()
        .zip(states)
        .filter(|(_, s)| s.kind == JobStateKind::Missing)
        .map(|(row, _)| row.id)
        .collect();
    Ok(db::events_with_rows(conn, table, &gone)
        .await?
        .into_iter()
        .collect())
}

/// Where one handed-off event stands: its job's `state`, the jobs its
/// handler should have derived (`expected`) and their states, and whether
/// its handler's row is `written`.
fn standing(
    state: &JobState,
    expected: &[DerivedJob],
    receiver: &Receiver,
    written: bool,
    derived: &DerivedStates,
) -> Standing {
    let there = |job: &DerivedJob| derived.get(job).is_some_and(|(s, c)| s.is_present() || *c);
    let finished = |job: &DerivedJob| derived.get(job).is_some_and(|(s, c)| s.is_finished() || *c);
    match state.kind {
        JobStateKind::Waiting => Standing::Present { finished: false },
        JobStateKind::Dead => Standing::Present { finished: true },
        JobStateKind::Done => {
            let lost: Vec<DerivedJob> =
                expected.iter().filter(|job| !there(job)).cloned().collect();
            if lost.is_empty() {
                Standing::Present {
                    finished: expected.iter().all(finished),
                }
            } else {
                Standing::DerivedMissing {
                    parent: state.latest.clone(),
                    derived: lost,
                }
            }
        }
        JobStateKind::Missing => match receiver {
            Receiver::Derives { .. } if !expected.is_empty() && expected.iter().all(there) => {
                Standing::Present {
                    finished: expected.iter().all(finished),
                }
            }
            Receiver::Row(_) if written => Standing::Present { finished: true },
            _ => Standing::Missing,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(kind: JobStateKind) -> JobState {
        JobState {
            kind,
            latest: "outbox:e".into(),
            finished_at: None,
        }
    }

    /// What reconciliation concludes of one event, from its job's state,
    /// its derived jobs and its handler's row: only a job gone without a
    /// trace of its work counts as missing.
    #[test]
    fn an_event_is_missing_only_when_neither_its_job_nor_its_work_is_there() {
        let mail = DerivedJob {
            queue: outbox_queue::queues::TOOLCTRL_EMAIL.into(),
            task_id: "email:e".into(),
        };
        let email = Receiver::deriving(
            outbox_queue::queues::TOOLCTRL_EMAIL,
            &outbox_queue::EMAIL_TASK_IDS,
        )
        .unwrap();
        let sent: DerivedStates =
            HashMap::from([(mail.clone(), (state(JobStateKind::Done), false))]);
        let none = DerivedStates::new();
        let audit = Receiver::Row(RowTable::parse("audit_log.outbox_event_id").unwrap());
        let expected = std::slice::from_ref(&mail);
        let present = |finished| Standing::Present { finished };
        let cases = [
            (
                JobStateKind::Waiting,
                Receiver::Plain,
                &[][..],
                false,
                &none,
                present(false),
            ),
            (
                JobStateKind::Dead,
                Receiver::Plain,
                &[][..],
                false,
                &none,
                present(true),
            ),
            (
                JobStateKind::Done,
                email.clone(),
                expected,
                false,
                &sent,
                present(true),
            ),
            (
                JobStateKind::Done,
                email.clone(),
                expected,
                false,
                &none,
                Standing::DerivedMissing {
                    parent: "outbox:e".into(),
                    derived: vec![mail.clone()],
                },
            ),
            (
                JobStateKind::Missing,
                email.clone(),
                expected,
                false,
                &sent,
                present(true),
            ),
            (
                JobStateKind::Missing,
                email.clone(),
                expected,
                false,
                &none,
                Standing::Missing,
            ),
            (
                JobStateKind::Missing,
                audit.clone(),
                &[][..],
                true,
                &none,
                present(true),
            ),
            (
                JobStateKind::Missing,
                audit,
                &[][..],
                false,
                &none,
                Standing::Missing,
            ),
            (
                JobStateKind::Missing,
                Receiver::Plain,
                &[][..],
                true,
                &none,
                Standing::Missing,
            ),
        ];
        for (kind, receiver, expected, written, derived, standing_is) in cases {
            assert_eq!(
                standing(&state(kind), expected, &receiver, written, derived),
                standing_is,
                "{kind:?} {receiver:?} written {written}"
            );
        }
    }
}
