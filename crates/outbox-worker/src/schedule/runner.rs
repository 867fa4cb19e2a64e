//! The schedule runner: one task per schedule, in the worker's
//! `schedules` service. At start it settles the past (the schedule's row
//! and [`Schedule::plan_start`]), then sleeps until each tick in the
//! schedule's zone and publishes it in one transaction: the row advances
//! to the tick only if it is older, and only then is the event inserted.
//! Several workers race harmlessly; the one whose transaction advanced the
//! row published the tick, the others count it as `taken`.
//!
//! A running worker publishes every tick: a tick whose publication fails
//! (Postgres unreachable) is tried again, 1 s to 30 s apart, and the ticks
//! that passed meanwhile follow, in order.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use chrono::{DateTime, SecondsFormat, Utc};
use diesel_async::AsyncConnection;
use outbox_pg::PgPool;
use outbox_publish::{OutboxTx, PublishOutcome, publish_outbox_event};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::Schedule;
use crate::supervisor::Backoff;

/// The counter of ticks, by schedule and outcome.
pub(crate) const TICKS_METRIC: &str = "outbox_schedule_ticks_total";

/// Where the runner reads the time and how it waits for a tick: the wall
/// clock in a worker, a clock the test moves in unit tests.
pub(crate) trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
    /// Resolves once [`Clock::now`] has reached `at`.
    fn sleep_until(&self, at: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn sleep_until(&self, at: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            // Again after waking: the wall clock may have been set back.
            while let Ok(left) = (at - Utc::now()).to_std() {
                if left.is_zero() {
                    break;
                }
                tokio::time::sleep(left).await;
            }
        })
    }
}

/// What became of a tick this worker tried to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// This worker advanced the schedule's row and inserted the event.
    Published,
    /// The row was at the tick already: another worker published it.
    Taken,
}

impl Outcome {
    /// The `outcome` label of [`TICKS_METRIC`].
    const fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Taken => "taken",
        }
    }
}

/// The `schedules` service: every schedule's runner, until `token` is
/// cancelled.
pub(crate) async fn run_schedules(
    pool: PgPool,
    schedules: Vec<Schedule>,
    clock: Arc<dyn Clock>,
    token: CancellationToken,
) {
    let mut runners = JoinSet::new();
    for schedule in schedules {
        runners.spawn(run_schedule(
            pool.clone(),
            schedule,
            clock.clone(),
            token.clone(),
        ));
    }
    while let Some(ended) = runners.join_next().await {
        if let Err(e) = ended {
            tracing::error!(error = %e, "a schedule's runner panicked");
        }
    }
}

/// One schedule's runner: settles the past, then publishes each tick.
pub(crate) async fn run_schedule(
    pool: PgPool,
    schedule: Schedule,
    clock: Arc<dyn Clock>,
    token: CancellationToken,
) {
    let span = tracing::info_span!("schedule", schedule = %schedule.name());
    async {
        let Some(mut cursor) = retrying(&token, || start(&pool, &schedule, clock.as_ref())).await
        else {
            return;
        };
        while let Some(tick) = schedule.next_after(cursor) {
            tokio::select! {
                () = token.cancelled() => return,
                () = clock.sleep_until(tick) => {}
            }
            if retrying(&token, || publish_tick(&pool, &schedule, tick))
                .await
                .is_none()
            {
                return;
            }
            cursor = tick;
        }
        tracing::warn!(cron = schedule.cron(), "the schedule has no more ticks");
    }
    .instrument(span)
    .await;
}

/// Settles what happened before this start ([`Schedule::plan_start`]) and
/// returns the time from which ticks are this run's.
async fn start(pool: &PgPool, schedule: &Schedule, clock: &dyn Clock) -> Result<DateTime<Utc>> {
    let now = clock.now();
    let mut conn = pool.get().await?;
    let row = outbox_store::schedule_row(&mut conn, schedule.name()).await?;
    let plan = schedule.plan_start(row.map(|row| row.last_tick), now);
    if plan.anchor {
        outbox_store::anchor_schedule(&mut conn, schedule.name(), now).await?;
        tracing::info!(
            cron = schedule.cron(),
            zone = schedule.zone(),
            "schedule started for the first time; nothing before now is due"
        );
    }
    drop(conn);
    if let Some(tick) = plan.publish {
        publish_tick(pool, schedule, tick).await?;
    }
    // Counted once the start succeeded: a start tried again counts once.
    if plan.skipped > 0 {
        count(schedule, "skipped", plan.skipped);
        tracing::info!(
            missed = schedule.missed_ticks().as_str(),
            skipped = plan.skipped,
            "ticks missed while no worker ran are skipped"
        );
    }
    Ok(now)
}

/// Publishes `tick` unless another worker did: one transaction that
/// advances the schedule's row and, only if it advanced, inserts the event.
pub(crate) async fn publish_tick(
    pool: &PgPool,
    schedule: &Schedule,
    tick: DateTime<Utc>,
) -> Result<Outcome> {
    let at = tick.to_rfc3339_opts(SecondsFormat::AutoSi, true);
    let span = tracing::debug_span!(
        "outbox.schedule.tick",
        tick = %at,
        tenant = %schedule.event().tenant_id,
        event_id = tracing::field::Empty,
    );
    let mut conn = pool.get().await?;
    let published = conn
        .transaction::<_, anyhow::Error, _>(async |conn| {
            if !outbox_store::advance_schedule(conn, schedule.name(), tick).await? {
                return Ok(None);
            }
            let tx = OutboxTx::new(conn)?;
            Ok(Some(
                publish_outbox_event(&tx, schedule.event_at(tick)).await?,
            ))
        })
        .instrument(span.clone())
        .await?;
    let outcome = match published {
        Some(PublishOutcome::Published(id)) => {
            span.record("event_id", tracing::field::display(id));
            tracing::info!(tick = %at, event_id = %id, "schedule tick published");
            Outcome::Published
        }
        // The row advanced but the event was there: a row reset by hand. (A
        // schedule's event never asks for replace mode, so nothing else
        // comes back.)
        Some(other) => {
            let id = other.id();
            tracing::info!(tick = %at, event_id = %id, "schedule tick was published before");
            Outcome::Taken
        }
        None => {
            tracing::debug!(tick = %at, "schedule tick published by another worker");
            Outcome::Taken
        }
    };
    count(schedule, outcome.as_str(), 1);
    Ok(outcome)
}

/// Adds `n` to [`TICKS_METRIC`] of `schedule` and `outcome`.
fn count(schedule: &Schedule, outcome: &'static str, n: u64) {
    metrics::counter!(TICKS_METRIC, "schedule" => schedule.name().to_owned(), "outcome" => outcome)
        .increment(n);
}

/// Runs `attempt` until it succeeds (`Some`) or `token` is cancelled
/// (`None`), pausing after each failure as [`Backoff::STANDARD`] says.
async fn retrying<T, F, Fut>(token: &CancellationToken, mut attempt: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut failures = 0;
    loop {
        // An attempt in progress is not cut short (a transaction would be
        // left open): it is one short transaction.
        if token.is_cancelled() {
            return None;
        }
        let error = match attempt().await {
            Ok(value) => return Some(value),
            Err(e) => e,
        };
        failures += 1;
        let pause: Duration = Backoff::STANDARD.after(failures);
        tracing::warn!(
            error = %format!("{error:#}"),
            retry_in_ms = pause.as_millis() as u64,
            "schedule step failed; trying again"
        );
        tokio::select! {
            () = token.cancelled() => return None,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
