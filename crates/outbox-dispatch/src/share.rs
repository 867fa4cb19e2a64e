//! Loops shared between the dispatchers of one database.
//!
//! Each dispatcher process runs up to [`DispatcherConfig::loops`] loops.
//! Under a backlog every loop claims back to back, and each claim walks
//! over the claim index entries of the rows the other claims hold locked,
//! so the index entries read per row handed off grow with the claims
//! running at once across the whole deployment, not per process: on two
//! cores, eight processes of four loops handed off at 0.76 to 0.90 of one
//! process's rate, and at 1.03 of it once they shared eight loops
//! (docs/scaling.md, "Loops shared across the deployment").
//!
//! So the dispatchers of one database share a budget of loops,
//! [`DispatcherConfig::loops_total`]: each counts the dispatchers listening
//! on the database (their listener connections, by
//! [`crate::LISTENER_APPLICATION_NAME`] in `pg_stat_activity`) every
//! [`RECOUNT`] and runs `ceil(loops_total / dispatchers)` of its loops,
//! at least one and at most its own `loops`. The loops beyond that park:
//! they claim nothing and hold no connection until the share grows again.
//!
//! [`DispatcherConfig::loops`]: crate::DispatcherConfig::loops
//! [`DispatcherConfig::loops_total`]: crate::DispatcherConfig::loops_total

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use outbox_pg::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{DispatchError, LISTENER_APPLICATION_NAME};

/// How often a dispatcher counts the dispatchers of its database.
pub const RECOUNT: Duration = Duration::from_secs(1);

/// The first count, this long after the dispatcher starts (its listener
/// has connected by then, so it counts itself).
const FIRST_COUNT: Duration = Duration::from_millis(100);

/// The dispatchers listening on the current database.
pub const LIVE_DISPATCHERS_SQL: &str = "SELECT count(*) AS dispatchers FROM pg_stat_activity \
     WHERE datname = current_database() AND application_name = $1";

/// The loops a dispatcher with `own` loops runs when `dispatchers`
/// dispatchers (itself included) share `total` loops: `total / dispatchers`
/// rounded up, at least 1, at most `own`. A `total` of 0 shares nothing:
/// every dispatcher runs its `own`. Zero dispatchers counted (the
/// listener has not connected yet) counts as one.
///
/// ```
/// use outbox_dispatch::loops_to_run;
///
/// assert_eq!(loops_to_run(4, 8, 1), 4);
/// assert_eq!(loops_to_run(4, 8, 4), 2);
/// assert_eq!(loops_to_run(4, 8, 3), 3);
/// assert_eq!(loops_to_run(4, 8, 16), 1);
/// assert_eq!(loops_to_run(4, 0, 16), 4);
/// ```
#[must_use]
pub fn loops_to_run(own: usize, total: usize, dispatchers: usize) -> usize {
    if total == 0 {
        return own;
    }
    total.div_ceil(dispatchers.max(1)).clamp(1, own.max(1))
}

#[derive(QueryableByName)]
struct Live {
    #[diesel(sql_type = BigInt)]
    dispatchers: i64,
}

/// How many dispatchers listen on the database `pool` connects to.
///
/// # Errors
///
/// When Postgres fails.
pub async fn live_dispatchers(pool: &PgPool) -> Result<usize, DispatchError> {
    let mut conn = pool.get().await?;
    let live: Live = diesel::sql_query(LIVE_DISPATCHERS_SQL)
        .bind::<Text, _>(LISTENER_APPLICATION_NAME)
        .get_result(&mut *conn)
        .await?;
    Ok(usize::try_from(live.dispatchers).unwrap_or(0))
}

/// Counts the dispatchers every [`RECOUNT`] until `shutdown` and sends
/// the loops this one runs into `share` (see [`loops_to_run`]). A count
/// that fails keeps the share as it is.
pub(crate) async fn run(
    pool: PgPool,
    own: usize,
    total: usize,
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
        match live_dispatchers(&pool).await {
            Ok(dispatchers) => {
                failing = false;
                let loops = loops_to_run(own, total, dispatchers);
                metrics::gauge!("outbox_dispatch_loops_running").set(loops as f64);
                let changed = share.send_if_modified(|running| {
                    let changed = *running != loops;
                    *running = loops;
                    changed
                });
                if changed {
                    tracing::info!(
                        dispatchers,
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

    #[test]
    fn eight_loops_shared_by_one_two_four_and_eight_dispatchers_of_four_loops() {
        let shares: Vec<_> = [1, 2, 4, 8]
            .iter()
            .map(|&n| loops_to_run(4, 8, n))
            .collect();
        assert_eq!(shares, [4, 4, 2, 1]);
    }

    #[test]
    fn a_share_rounds_up_and_never_falls_below_one_loop_or_rises_above_its_own() {
        assert_eq!(loops_to_run(4, 8, 3), 3, "8 / 3 rounded up");
        assert_eq!(loops_to_run(4, 8, 5), 2, "8 / 5 rounded up");
        assert_eq!(loops_to_run(4, 8, 100), 1, "at least one loop");
        assert_eq!(loops_to_run(2, 64, 1), 2, "never more than its own");
        assert_eq!(loops_to_run(4, 1, 1), 1, "a total of one");
    }

    #[test]
    fn no_total_or_no_dispatcher_counted_runs_every_own_loop() {
        assert_eq!(loops_to_run(4, 0, 8), 4, "sharing off");
        assert_eq!(
            loops_to_run(4, 8, 0),
            4,
            "the listener not yet counted: itself"
        );
    }
}
