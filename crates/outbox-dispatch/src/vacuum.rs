//! Upkeep of the claim index: the dispatcher vacuums `outbox_event` itself
//! after every so many claimed rows (fewer while the table is small).
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
//! The first round comes sooner, after [`FIRST_VACUUM_ROUND`] claimed rows,
//! and while the table is small the next one comes once the rows claimed
//! since match the rows the table held after the last round (so about
//! when it has doubled): the gap is that row count, at least
//! [`FIRST_VACUUM_ROUND`] and at most `vacuum_every`. A `VACUUM`
//! also makes every session plan its prepared statements on the table again
//! (it updates the table's size in the catalog), and a plan made while the
//! table was nearly empty is a sequential scan that stays in use while the
//! table grows: the claim's `UPDATE` read the whole table for each claim
//! (2.8 ms a claim at 16,000 rows, 45 ms for a claim of 500 at 20,000)
//! until the first round came 20,000 rows later. Autovacuum's `ANALYZE` does
//! the same on a server that runs it, at a tenth of the table's growth; a
//! server with autovacuum off has only these rounds (docs/performance.md,
//! "Plans that go stale").
//!
//! A role that does not own the table cannot vacuum it (Postgres would
//! skip it with a warning): the first round checks, logs a warning and
//! stops the upkeep for this process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use outbox_store::{may_vacuum, table_rows};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use outbox_pg::PgPool;

/// Claimed rows before a dispatcher's first vacuum round (or `vacuum_every`
/// when that is smaller), and the smallest gap between two rounds; a later
/// gap is the table's row count after the round before, up to
/// `vacuum_every`.
pub const FIRST_VACUUM_ROUND: u64 = 1_000;

/// Counts claimed rows and runs the vacuum rounds they call for.
#[derive(Debug)]
pub(crate) struct Upkeep {
    every: u64,
    /// Claimed rows that make the next round due: [`FIRST_VACUUM_ROUND`],
    /// then the table's size after each round, at most `every`.
    gap: AtomicU64,
    since: AtomicU64,
    due: Notify,
}

impl Upkeep {
    /// Upkeep after every `every` claimed rows (0: never), the first round
    /// sooner (see [`FIRST_VACUUM_ROUND`]).
    pub(crate) fn new(every: u64) -> Self {
        Self {
            every,
            gap: AtomicU64::new(FIRST_VACUUM_ROUND.min(every)),
            since: AtomicU64::new(0),
            due: Notify::new(),
        }
    }

    /// Counts `rows` claimed rows; returns whether they made a round due
    /// (and wakes the round).
    pub(crate) fn count(&self, rows: usize) -> bool {
        // With `every` 0 the gap is 0 and no count is below it, so no round
        // is ever due.
        let rows = rows as u64;
        let gap = AtomicU64::load(&self.gap, Ordering::Relaxed);
        let before = self.since.fetch_add(rows, Ordering::Relaxed);
        let due = before < gap && before.saturating_add(rows) >= gap;
        if due {
            self.due.notify_one();
        }
        due
    }

    /// Starts a round: the count goes back to zero. Returns the rows
    /// counted since the last round.
    fn start_round(&self) -> u64 {
        self.since.swap(0, Ordering::Relaxed)
    }

    /// Sets the gap to the next round from the rows the table holds after
    /// this one (`reltuples`; negative when Postgres has no count): the
    /// table's size, at least [`FIRST_VACUUM_ROUND`], at most `every`.
    /// Rows claimed while the round ran were counted against the old gap;
    /// when they already reach the new, smaller one, the next round is due
    /// now (otherwise no later count would ever cross it).
    fn next_gap(&self, table_rows: f64) -> u64 {
        // `as` saturates: a negative count is 0, a huge one u64::MAX.
        let rows = table_rows as u64;
        let gap = rows.clamp(FIRST_VACUUM_ROUND.min(self.every), self.every);
        self.gap.store(gap, Ordering::Relaxed);
        if AtomicU64::load(&self.since, Ordering::Relaxed) >= gap {
            self.due.notify_one();
        }
        gap
    }

    /// Whether a round has been made due and not yet started (tests).
    #[cfg(test)]
    async fn is_due(&self) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(10), self.due.notified())
            .await
            .is_ok()
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
            let rows = self.start_round();
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
            match outbox_store::vacuum(&mut conn).await {
                Ok(()) => {
                    metrics::counter!("outbox_dispatch_vacuums_total").increment(1);
                    // Without a count the gap stays as it was.
                    let next = match table_rows(&mut conn).await {
                        Ok(n) => self.next_gap(n),
                        Err(e) => {
                            tracing::debug!(error = %e, "no row count of outbox_event; the gap stays");
                            AtomicU64::load(&self.gap, Ordering::Relaxed)
                        }
                    };
                    tracing::debug!(
                        rows_since_last = rows,
                        next_round_after = next,
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
        assert_eq!(upkeep.start_round(), 600);
        assert!(!upkeep.count(99));
        assert!(upkeep.count(1));
    }

    /// Claimed rows, one at a time, until a round is due (at most a
    /// million, so that a count that never makes one due fails the test).
    fn rows_to_next_round(upkeep: &Upkeep) -> u64 {
        let mut rows = 1;
        while !upkeep.count(1) {
            rows += 1;
            assert!(rows <= 1_000_000, "no round is ever due");
        }
        upkeep.start_round();
        rows
    }

    // Break checked: without the check in `next_gap`, no round is due and
    // no later count makes one.
    #[tokio::test]
    async fn rows_claimed_during_a_round_past_a_smaller_new_gap_make_the_next_round_due() {
        let upkeep = Upkeep::new(20_000);
        upkeep.next_gap(1e9);
        assert_eq!(rows_to_next_round(&upkeep), 20_000);
        assert!(upkeep.is_due().await, "the round itself");
        // 5,000 rows claimed while the round ran (retention had emptied
        // the table, which now holds 4,000).
        assert!(!upkeep.count(5_000));
        upkeep.next_gap(4_000.0);
        assert!(
            upkeep.is_due().await,
            "5,000 rows already reach the gap of 4,000"
        );
        assert!(!upkeep.count(1), "no second crossing to wait for");
    }

    #[test]
    fn the_first_round_comes_soon_and_later_gaps_follow_the_tables_size_up_to_the_setting() {
        let upkeep = Upkeep::new(20_000);
        assert_eq!(rows_to_next_round(&upkeep), 1_000);
        let mut gaps = Vec::new();
        // Table sizes after each round: never counted, tiny, growing,
        // beyond the setting, then small again (retention emptied it).
        for table_rows in [-1.0, 10.0, 2_500.0, 9_000.7, 20_001.0, 3.5e9, 4_000.0] {
            upkeep.next_gap(table_rows);
            gaps.push(rows_to_next_round(&upkeep));
        }
        assert_eq!(gaps, [1_000, 1_000, 2_500, 9_000, 20_000, 20_000, 4_000]);
    }

    #[test]
    fn a_setting_below_the_first_round_is_every_gap() {
        let upkeep = Upkeep::new(50);
        assert_eq!(rows_to_next_round(&upkeep), 50);
        upkeep.next_gap(1e6);
        assert_eq!(rows_to_next_round(&upkeep), 50);
        upkeep.next_gap(-1.0);
        assert_eq!(rows_to_next_round(&upkeep), 50);
    }

    #[test]
    fn no_round_is_ever_due_when_upkeep_is_off() {
        let upkeep = Upkeep::new(0);
        assert!(!upkeep.count(1_000_000));
        assert!(!upkeep.count(usize::MAX / 2));
    }
}
