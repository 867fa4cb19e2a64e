//! Loops shared between the dispatchers of one database.
//!
//! Each dispatcher process runs up to [`DispatcherConfig::loops`] loops.
//! Under a backlog every loop claims back to back, and each claim walks
//! over the claim index entries of the rows the other claims hold locked,
//! so the index entries read per row handed off grow with the claims
//! running at once across the whole deployment, not per process: on two
//! cores, eight processes of four loops handed off at 0.76 to 0.90 of one
//! process's rate. The same claims spread over more processes cost more
//! too: eight processes of one loop each handed off at 0.94 to 0.96 of
//! one process's rate, two of four loops each as fast as one
//! (docs/scaling.md).
//!
//! So the dispatchers of one database share a budget of loops,
//! [`DispatcherConfig::loops_total`], packed into the fewest of them: each
//! counts the dispatchers listening on the database before it (their
//! listener connections, by [`crate::LISTENER_APPLICATION_NAME`] in
//! `pg_stat_activity`, ranked by backend process id) every [`RECOUNT`]
//! and runs what the ones before it left of `loops_total`, at most its
//! own `loops` (see [`loops_to_run`]). The loops beyond that park: they
//! claim nothing and hold no connection until the share grows again. A
//! dispatcher left with none stands by: it keeps its listener (so it is
//! counted and ranked), its first loop claims once per poll interval (so
//! that the hand-off goes on while a dispatcher whose host died is still
//! counted), and it leaves wake-ups and the wake gate to the dispatchers
//! that run loops; when a dispatcher before it goes (its listener's
//! connection closes), the next count gives it loops. A dispatcher stands
//! by from its start until its first count, and ranks last while its
//! listener is not connected. The packing assumes every dispatcher has
//! the same `loops`: each reckons what those before it took with its own.
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

/// The loops a dispatcher with `own` loops runs when the dispatchers of
/// its database share `total` loops and `rank` of them come before it (by
/// their listener's backend process id): the total is
/// packed into the first dispatchers, each running all of its `own` loops
/// until the total is spent, so that the shares add up to `total` (when
/// every dispatcher has the same `own`) and the fewest processes claim;
/// the dispatchers past the total run none and stand by, taking loops
/// back at the next count when one before them goes. A `total` of 0
/// shares nothing: every dispatcher runs its `own`. The dispatchers before
/// it are reckoned to run `own` loops each, as it does.
///
/// Why packed rather than spread evenly: on two cores, eight processes of
/// one loop each handed off at 0.94 to 0.96 of one process's rate (below
/// it in each of 7 rounds), two of four loops each as fast as one
/// (docs/scaling.md).
///
/// ```
/// use outbox_dispatch::loops_to_run;
///
/// // Three dispatchers of four loops share 8 loops as 4, 4 and 0.
/// let shares: Vec<_> = (0..3).map(|rank| loops_to_run(4, 8, rank)).collect();
/// assert_eq!(shares, [4, 4, 0]);
/// // A total of 10: 4, 4 and 2.
/// assert_eq!(loops_to_run(4, 10, 2), 2);
/// // No total: each runs its own.
/// assert_eq!(loops_to_run(4, 0, 15), 4);
/// ```
#[must_use]
pub fn loops_to_run(own: usize, total: usize, rank: usize) -> usize {
    if total == 0 {
        return own;
    }
    total.saturating_sub(rank.saturating_mul(own)).min(own)
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
        let listener = AtomicI32::load(&pid, Ordering::Acquire);
        match live_dispatchers(&pool, listener).await {
            Ok((dispatchers, before)) => {
                failing = false;
                // Without a listener (connecting, or LISTEN failing) this
                // dispatcher is not counted: it ranks after every one that
                // is, and runs what they leave.
                let rank = if listener == 0 { dispatchers } else { before };
                let loops = loops_to_run(own, total, rank);
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
            .map(|rank| loops_to_run(own, total, rank))
            .collect()
    }

    #[test]
    fn eight_loops_are_packed_into_the_first_two_dispatchers_of_four_loops() {
        assert_eq!(shares(4, 8, 1), [4]);
        assert_eq!(shares(4, 8, 2), [4, 4]);
        assert_eq!(shares(4, 8, 4), [4, 4, 0, 0]);
        assert_eq!(shares(4, 8, 8), [4, 4, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn shares_add_up_to_the_total_when_the_dispatchers_can_run_it() {
        for own in 1..=8 {
            for dispatchers in 1..=8 {
                let shares = shares(own, 8, dispatchers);
                let sum: usize = shares.iter().sum();
                assert_eq!(
                    sum,
                    8.min(own * dispatchers),
                    "{own}, {dispatchers}: {shares:?}"
                );
                // Packed: only the last dispatcher with loops may run fewer
                // than its own.
                let partial = shares.iter().filter(|&&n| n > 0 && n < own).count();
                assert!(partial <= 1, "{own}, {dispatchers}: {shares:?}");
                assert!(shares.windows(2).all(|w| w[0] >= w[1]), "{shares:?}");
            }
        }
        assert_eq!(shares(4, 10, 3), [4, 4, 2], "the last one gets the rest");
        assert_eq!(shares(3, 8, 4), [3, 3, 2, 0]);
    }

    #[test]
    fn a_share_never_rises_above_its_own() {
        assert_eq!(shares(2, 64, 1), [2], "never more than its own");
        assert_eq!(shares(4, 1, 3), [1, 0, 0], "a total of one");
        assert_eq!(loops_to_run(4, 8, usize::MAX), 0, "no overflow");
    }

    #[test]
    fn no_total_runs_every_own_loop() {
        assert_eq!(loops_to_run(4, 0, 3), 4, "sharing off");
        assert_eq!(loops_to_run(4, 0, 0), 4);
    }
}
