//! Loops shared between the dispatchers of one database.
//!
//! Each dispatcher process runs up to [`DispatcherConfig::loops`] loops.
//! Under a backlog every loop claims back to back, and each claim walks
//! over the claim index entries of the rows the other claims hold locked,
//! so the index entries read per row handed off grow with the claims
//! running at once across the whole deployment, not per process: on two
//! cores, eight processes of four loops handed off at 0.76 to 0.90 of one
//! process's rate, and at 0.94 to 0.96 of it once they shared eight loops
//! (two and four processes within 3 % of one; docs/scaling.md, "Loops
//! shared across the deployment").
//!
//! So the dispatchers of one database share a budget of loops,
//! [`DispatcherConfig::loops_total`]: each counts the dispatchers listening
//! on the database (their listener connections, by
//! [`crate::LISTENER_APPLICATION_NAME`] in `pg_stat_activity`) every
//! [`RECOUNT`] and runs its share of `loops_total` (see [`loops_to_run`]),
//! at least one and at most its own `loops`. The loops beyond that park:
//! they claim nothing and hold no connection until the share grows again.
//!
//! [`DispatcherConfig::loops`]: crate::DispatcherConfig::loops
//! [`DispatcherConfig::loops_total`]: crate::DispatcherConfig::loops_total

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::RunQueryDsl;
use outbox_pg::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{DispatchError, LISTENER_APPLICATION_NAME};

/// How often a dispatcher counts the dispatchers of its database.
pub const RECOUNT: Duration = Duration::from_secs(1);

/// The first count, this long after the dispatcher starts (its listener
/// has usually connected by then; the next count sees it if not).
const FIRST_COUNT: Duration = Duration::from_millis(100);

/// The dispatchers listening on the current database, and how many of
/// them listen on a backend with a lower process id than `$2` (this
/// dispatcher's rank among them).
pub(crate) const LIVE_DISPATCHERS_SQL: &str = "SELECT count(*) AS dispatchers, \
     count(*) FILTER (WHERE pid < $2) AS before \
     FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1";

/// The loops a dispatcher with `own` loops runs when `dispatchers`
/// dispatchers (itself included) share `total` loops and `rank` of them
/// come before it (by their listener's backend process id): `total`
/// divided between them, the remainder one loop each to the first ones,
/// so that their shares add up to `total`; at least 1 and at most `own`.
/// A `total` of 0 shares nothing: every dispatcher runs its `own`. Zero
/// dispatchers counted (the listener has not connected yet) counts as one.
///
/// ```
/// use outbox_dispatch::loops_to_run;
///
/// assert_eq!(loops_to_run(4, 8, 1, 0), 4);
/// assert_eq!(loops_to_run(4, 8, 4, 3), 2);
/// // Three dispatchers share 8 loops as 3, 3 and 2.
/// let shares: Vec<_> = (0..3).map(|rank| loops_to_run(4, 8, 3, rank)).collect();
/// assert_eq!(shares, [3, 3, 2]);
/// assert_eq!(loops_to_run(4, 8, 16, 15), 1);
/// assert_eq!(loops_to_run(4, 0, 16, 0), 4);
/// ```
#[must_use]
pub fn loops_to_run(own: usize, total: usize, dispatchers: usize, rank: usize) -> usize {
    if total == 0 {
        return own;
    }
    let dispatchers = dispatchers.max(1);
    let extra = usize::from(rank < total % dispatchers);
    (total / dispatchers + extra).clamp(1, own.max(1))
}

#[derive(QueryableByName)]
struct Live {
    #[diesel(sql_type = BigInt)]
    dispatchers: i64,
    #[diesel(sql_type = BigInt)]
    before: i64,
}

/// How many dispatchers listen on the database `pool` connects to, and
/// how many of them on a backend whose process id is below `pid` (0: none).
///
/// # Errors
///
/// When Postgres fails.
pub(crate) async fn live_dispatchers(
    pool: &PgPool,
    pid: i32,
) -> Result<(usize, usize), DispatchError> {
    let mut conn = pool.get().await?;
    let live: Live = diesel::sql_query(LIVE_DISPATCHERS_SQL)
        .bind::<Text, _>(LISTENER_APPLICATION_NAME)
        .bind::<Integer, _>(pid)
        .get_result(&mut *conn)
        .await?;
    Ok((
        usize::try_from(live.dispatchers).unwrap_or(0),
        usize::try_from(live.before).unwrap_or(0),
    ))
}

/// Counts the dispatchers every [`RECOUNT`] until `shutdown` and sends
/// the loops this one runs into `share` (see [`loops_to_run`]); `pid` is
/// this dispatcher's listener backend (0 while it has none). A count that
/// fails keeps the share as it is.
pub(crate) async fn run(
    pool: PgPool,
    own: usize,
    total: usize,
    pid: Arc<AtomicI32>,
    share: watch::Sender<usize>,
    shutdown: CancellationToken,
) {
    let mut wait = FIRST_COUNT;
    let mut failing = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        wait = RECOUNT;
        match live_dispatchers(&pool, AtomicI32::load(&pid, Ordering::Acquire)).await {
            Ok((dispatchers, rank)) => {
                failing = false;
                let loops = loops_to_run(own, total, dispatchers, rank);
                metrics::gauge!("outbox_dispatch_loops_running").set(loops as f64);
                let changed = share.send_if_modified(|running| {
                    let changed = *running != loops;
                    *running = loops;
                    changed
                });
                if changed {
                    tracing::info!(
                        dispatchers,
                        rank,
                        loops,
                        loops_total = total,
                        own_loops = own,
                        "dispatch loops shared with the other dispatchers of this database"
                    );
                }
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot count the dispatchers of this database; the loops stay as they are");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::loops_to_run;

    /// The shares of `dispatchers` dispatchers of `own` loops each.
    fn shares(own: usize, total: usize, dispatchers: usize) -> Vec<usize> {
        (0..dispatchers)
            .map(|rank| loops_to_run(own, total, dispatchers, rank))
            .collect()
    }

    #[test]
    fn eight_loops_shared_by_one_two_four_and_eight_dispatchers_of_four_loops() {
        assert_eq!(shares(4, 8, 1), [4]);
        assert_eq!(shares(4, 8, 2), [4, 4]);
        assert_eq!(shares(4, 8, 4), [2, 2, 2, 2]);
        assert_eq!(shares(4, 8, 8), [1; 8]);
    }

    #[test]
    fn shares_add_up_to_the_total_whatever_the_number_of_dispatchers() {
        for dispatchers in 1..=8 {
            let shares = shares(8, 8, dispatchers);
            assert_eq!(shares.iter().sum::<usize>(), 8, "{dispatchers}: {shares:?}");
            assert!(
                shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1,
                "{dispatchers}: {shares:?}"
            );
        }
        assert_eq!(
            shares(4, 8, 3),
            [3, 3, 2],
            "the first ones get the remainder"
        );
        assert_eq!(shares(4, 8, 7), [2, 1, 1, 1, 1, 1, 1]);
    }

    #[test]
    fn a_share_never_falls_below_one_loop_or_rises_above_its_own() {
        assert_eq!(shares(4, 8, 10), [1; 10], "at least one loop each");
        assert_eq!(shares(2, 64, 1), [2], "never more than its own");
        assert_eq!(shares(4, 1, 1), [1], "a total of one");
    }

    #[test]
    fn no_total_or_no_dispatcher_counted_runs_every_own_loop() {
        assert_eq!(loops_to_run(4, 0, 8, 3), 4, "sharing off");
        assert_eq!(
            loops_to_run(4, 8, 0, 0),
            4,
            "the listener not yet counted: itself"
        );
    }
}
