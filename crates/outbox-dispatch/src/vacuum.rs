//! Upkeep of the claim index: the dispatcher vacuums `outbox_event` itself
//! after every so many claimed rows.
//!
//! Every claimed row is updated twice (to `PROCESSING`, then to `DONE` or
//! back), and each update leaves the row's previous version dead, with its
//! entry in the claim index. Those entries sit at the head of the index,
//! where every claim starts: until a `VACUUM` removes them, each claim walks
//! over all of them, so a claim costs more with every row handed off since
//! the table's last vacuum (an empty claim read 212 index pages after
//! 246,000 rows, one page after a `VACUUM`; docs/performance.md, "Vacuum and
//! the claim index"). Autovacuum does it on a server that runs it, but only
//! once the dead rows reach a fifth of the table (by default), and a server
//! with autovacuum off never does. So the dispatcher runs `VACUUM
//! (SKIP_LOCKED) outbox_event` in the background after every
//! [`crate::DispatcherConfig::vacuum_every`] rows it claimed: `SKIP_LOCKED`
//! skips the round when another vacuum of the table (autovacuum, another
//! dispatcher) is under way instead of queuing behind it.
//!
//! A role that does not own the table cannot vacuum it (Postgres would
//! skip it with a warning): the first round checks, logs a warning and
//! stops the upkeep for this process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use diesel::QueryableByName;
use diesel::sql_types::Bool;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use outbox_model::PgPool;

/// The statement of one round.
pub const VACUUM_SQL: &str = "VACUUM (SKIP_LOCKED) outbox_event";

/// Counts claimed rows and runs the vacuum rounds they call for.
#[derive(Debug)]
pub(crate) struct Upkeep {
    every: u64,
    since: AtomicU64,
    due: Notify,
}

impl Upkeep {
    /// Upkeep after every `every` claimed rows (0: never).
    pub(crate) fn new(every: u64) -> Self {
        Self {
            every,
            since: AtomicU64::new(0),
            due: Notify::new(),
        }
    }

    /// Counts `rows` claimed rows; returns whether they made a round due
    /// (and wakes the round).
    pub(crate) fn count(&self, rows: usize) -> bool {
        // With `every` 0 no count is below it, so no round is ever due.
        let rows = rows as u64;
        let before = self.since.fetch_add(rows, Ordering::Relaxed);
        let due = before < self.every && before.saturating_add(rows) >= self.every;
        if due {
            self.due.notify_one();
        }
        due
    }

    /// Runs a round each time [`Upkeep::count`] makes one due, until
    /// `shutdown`, or until the role turns out not to be allowed to vacuum.
    pub(crate) async fn run(self: Arc<Self>, pool: PgPool, shutdown: CancellationToken) {
        if self.every == 0 {
            return;
        }
        let mut checked = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.due.notified() => {}
            }
            let rows = self.since.swap(0, Ordering::Relaxed);
            let mut conn = match pool.get().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "no connection to vacuum outbox_event; trying again after the next rows");
                    continue;
                }
            };
            if !checked {
                match may_vacuum(&mut conn).await {
                    Ok(true) => checked = true,
                    Ok(false) => {
                        tracing::warn!(
                            "this role does not own outbox_event, so the dispatcher cannot vacuum it; \
                             dead rows stay in the claim index until autovacuum removes them"
                        );
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot check whether this role may vacuum outbox_event");
                        continue;
                    }
                }
            }
            let started = Instant::now();
            match conn.batch_execute(VACUUM_SQL).await {
                Ok(()) => {
                    metrics::counter!("outbox_dispatch_vacuums_total").increment(1);
                    tracing::debug!(
                        rows_since_last = rows,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "vacuumed outbox_event"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "VACUUM outbox_event failed; trying again after the next rows")
                }
            }
        }
    }
}

#[derive(QueryableByName)]
struct Allowed {
    #[diesel(sql_type = Bool)]
    allowed: bool,
}

/// Whether the session's role may vacuum `outbox_event`: a superuser, or a
/// member of the table's owner role.
async fn may_vacuum(conn: &mut AsyncPgConnection) -> diesel::QueryResult<bool> {
    let row: Allowed = diesel::sql_query(
        "SELECT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
                OR pg_has_role(current_user, c.relowner, 'MEMBER') AS allowed
         FROM pg_class c WHERE c.oid = 'outbox_event'::regclass",
    )
    .get_result(conn)
    .await?;
    Ok(row.allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_is_due_once_each_time_the_count_reaches_the_threshold() {
        let upkeep = Upkeep::new(100);
        assert!(!upkeep.count(60));
        assert!(upkeep.count(40), "60 + 40 reaches 100");
        assert!(!upkeep.count(500), "already due: one round, not two");
        // The round takes the count back to zero.
        upkeep.since.swap(0, Ordering::Relaxed);
        assert!(!upkeep.count(99));
        assert!(upkeep.count(1));
    }

    #[test]
    fn no_round_is_ever_due_when_upkeep_is_off() {
        let upkeep = Upkeep::new(0);
        assert!(!upkeep.count(1_000_000));
        assert!(!upkeep.count(usize::MAX / 2));
    }
}
