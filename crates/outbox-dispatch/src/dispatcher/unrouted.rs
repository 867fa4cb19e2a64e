//! Events whose type no routing rule of this dispatcher matches.
//!
//! During a rolling deploy the old dispatcher claims events whose route only
//! the new version has. Such an event is not dead-lettered at once: it goes
//! back to `PENDING`, due again after [`DispatcherConfig::unrouted_recheck`],
//! for [`DispatcherConfig::unrouted_grace`] counted from the first time a
//! dispatcher found no route for it ([`for_want_of_a_route`], pure,
//! table-tested). After that it goes `FAILED (unrouted)`, and every
//! dispatcher that has a route for its type requeues it on its own
//! ([`revive_routable`], run every `unrouted_recheck` by [`watch`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel_async::AsyncPgConnection;
use outbox_model::{OutboxEvent, OutboxStatus};
use tokio_util::sync::CancellationToken;

use super::trace_id_of;
use crate::{DispatchError, DispatcherConfig, Router};
use outbox_store::{self as store, Change, Failure, Lease, WaitForRoute};

/// The most `FAILED (unrouted)` rows one look requeues; the next look takes
/// the rest.
const REVIVE_BATCH: i64 = 1000;

/// What becomes of a claimed event that no routing rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForWantOfARoute {
    /// Back to `PENDING`, due again after `delay`; it goes `FAILED` if it
    /// still has no route at `until`.
    Wait {
        /// Until it is due again.
        delay: Duration,
        /// The end of its grace period.
        until: DateTime<Utc>,
    },
    /// `FAILED (unrouted)`: its grace period is over.
    DeadLetter,
}

/// The decision for an event first found unrouted at `since` (`None`: now,
/// for the first time), at the database's `now`, under `config`'s grace
/// period and recheck interval.
///
/// ```
/// use std::time::Duration;
/// use chrono::{TimeDelta, Utc};
/// use outbox_dispatch::{DispatcherConfig, ForWantOfARoute, for_want_of_a_route};
///
/// let config = DispatcherConfig::default(); // 10 minutes' grace, rechecked every 30 s
/// let now = Utc::now();
/// assert_eq!(
///     for_want_of_a_route(None, now, &config),
///     ForWantOfARoute::Wait { delay: Duration::from_secs(30), until: now + TimeDelta::minutes(10) }
/// );
/// let long_ago = now - TimeDelta::minutes(11);
/// assert_eq!(for_want_of_a_route(Some(long_ago), now, &config), ForWantOfARoute::DeadLetter);
/// ```
#[must_use]
pub fn for_want_of_a_route(
    since: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    config: &DispatcherConfig,
) -> ForWantOfARoute {
    let grace = chrono::Duration::from_std(config.unrouted_grace).unwrap_or(chrono::Duration::MAX);
    let until = since
        .unwrap_or(now)
        .checked_add_signed(grace)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    match (until - now).to_std() {
        Ok(left) if !left.is_zero() => ForWantOfARoute::Wait {
            delay: left.min(config.unrouted_recheck),
            until,
        },
        _ => ForWantOfARoute::DeadLetter,
    }
}

/// Sorts a tick's unrouted events into those that wait for a route and
/// those dead-lettered, logging each. The database's clock is read from the
/// lease: a claim sets `locked_until` to its `now()` plus the lock timeout.
pub(super) fn sort(
    events: &[OutboxEvent],
    config: &DispatcherConfig,
) -> (Vec<WaitForRoute>, Vec<Failure>) {
    let mut waits = Vec::new();
    let mut failures = Vec::new();
    for event in events {
        let Some(lease) = Lease::of(event) else {
            continue;
        };
        let now = lease.locked_until
            - chrono::Duration::from_std(config.lock_timeout).unwrap_or(chrono::Duration::zero());
        let trace_id = trace_id_of(event);
        match for_want_of_a_route(event.unrouted_since, now, config) {
            ForWantOfARoute::Wait { delay, until } => {
                let error = format!(
                    "no routing rule matches event type {:?}; waiting for a route until {}",
                    event.event_type,
                    until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                );
                if event.unrouted_since.is_none() {
                    tracing::warn!(
                        event_id = %event.id, tenant_id = %event.tenant_id, trace_id = trace_id.as_deref(),
                        event_type = %event.event_type, until = %until,
                        "no routing rule matches the event type; the event waits for a route (a rolling deploy may be adding it)"
                    );
                }
                waits.push(WaitForRoute {
                    lease,
                    delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
                    error,
                });
            }
            ForWantOfARoute::DeadLetter => {
                tracing::error!(
                    event_id = %event.id, tenant_id = %event.tenant_id, trace_id = trace_id.as_deref(),
                    event_type = %event.event_type,
                    "no routing rule matches the event type; dead-lettering it (a dispatcher with a route for it requeues it)"
                );
                failures.push(Failure {
                    lease,
                    retry_increment: 0,
                    error: format!("no routing rule matches event type {:?}", event.event_type),
                    queue: None,
                    unrouted: true,
                });
            }
        }
    }
    (waits, failures)
}

/// Requeues the `FAILED (unrouted)` events whose type `router` now routes
/// (at most 1,000 a call), each with a history row (requested by
/// `dispatcher`), and sets the gauges of events waiting for a route and
/// dead-lettered for the lack of one. Returns how many it requeued.
///
/// A dispatcher runs it on its own (at start and every
/// `unrouted_recheck`); call it to hand such events off at once, for
/// example right after deploying a route:
///
/// ```no_run
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), outbox_dispatch::DispatchError> {
/// use outbox_dispatch::{Router, revive_routable};
///
/// let router = Router::empty().with_rule("reports.", "app.reports").unwrap();
/// let requeued = revive_routable(conn, &router).await?;
/// println!("{requeued} FAILED (unrouted) events requeued");
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// When Postgres fails.
pub async fn revive_routable(
    conn: &mut AsyncPgConnection,
    router: &Router,
) -> Result<usize, DispatchError> {
    let types = store::unrouted_types(conn).await?;
    let waiting: i64 = types.iter().map(|t| t.waiting).sum();
    let failed: i64 = types.iter().map(|t| t.failed).sum();
    metrics::gauge!("outbox_unrouted_waiting").set(waiting as f64);
    let routable: Vec<String> = types
        .into_iter()
        .filter(|t| t.failed > 0 && router.route(&t.event_type).is_some())
        .map(|t| t.event_type)
        .collect();
    if routable.is_empty() {
        metrics::gauge!("outbox_unrouted_failed").set(failed as f64);
        return Ok(0);
    }
    let ids = store::failed_unrouted_ids(conn, &routable, REVIVE_BATCH).await?;
    let requeued = store::requeue(
        conn,
        Change {
            ids: &ids,
            allowed: &[OutboxStatus::Failed],
            reason: "a routing rule now matches the event type",
            requested_by: Some("dispatcher"),
        },
    )
    .await?;
    let revived = requeued.ids.len();
    metrics::gauge!("outbox_unrouted_failed").set((failed - revived as i64).max(0) as f64);
    metrics::counter!("outbox_dispatch_unrouted_revived_total").increment(revived as u64);
    tracing::info!(
        revived,
        event_types = ?routable,
        "requeued FAILED (unrouted) events: a routing rule now matches their type"
    );
    Ok(revived)
}

/// Runs [`revive_routable`] at once and then every `unrouted_recheck`
/// until `shutdown`; a failed round is logged and retried at the next.
pub(super) async fn watch(
    pool: outbox_pg::PgPool,
    router: Router,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let round = async {
            let mut conn = pool.get().await.map_err(DispatchError::from)?;
            revive_routable(&mut conn, &router).await
        };
        if let Err(e) = round.await {
            tracing::warn!(error = %e, "cannot look for unrouted events a route now matches");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    #[test]
    fn an_unrouted_event_waits_out_its_grace_period_then_goes_failed() {
        let config = DispatcherConfig {
            unrouted_grace: Duration::from_secs(100),
            unrouted_recheck: Duration::from_secs(30),
            ..DispatcherConfig::default()
        };
        let now = Utc::now();
        let ago = |secs| Some(now - TimeDelta::seconds(secs));
        let wait = |delay, until_in| ForWantOfARoute::Wait {
            delay: Duration::from_secs(delay),
            until: now + TimeDelta::seconds(until_in),
        };
        let cases = [
            // (first found unrouted, expected)
            (None, wait(30, 100)),
            (ago(0), wait(30, 100)),
            (ago(50), wait(30, 50)),
            // The last wait is cut to what is left of the grace period.
            (ago(90), wait(10, 10)),
            (ago(100), ForWantOfARoute::DeadLetter),
            (ago(5000), ForWantOfARoute::DeadLetter),
        ];
        for (since, expected) in cases {
            assert_eq!(
                for_want_of_a_route(since, now, &config),
                expected,
                "since {since:?}"
            );
        }
    }

    #[test]
    fn a_zero_grace_period_dead_letters_an_unrouted_event_at_once() {
        let config = DispatcherConfig {
            unrouted_grace: Duration::ZERO,
            ..DispatcherConfig::default()
        };
        let now = Utc::now();
        assert_eq!(
            for_want_of_a_route(None, now, &config),
            ForWantOfARoute::DeadLetter
        );
    }
}
