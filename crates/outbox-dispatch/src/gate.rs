//! The wake gate: `NOTIFY` only while a dispatcher waits.
//!
//! `NOTIFY` makes every committing transaction that sent one take a
//! database-wide lock and hold it through its commit, so publishers that
//! notify commit one after another. The insert trigger therefore notifies
//! only while a dispatcher waits: it tries to take the advisory lock
//! [`outbox_model::WAKE_GATE_LOCK`] shared and notifies when it cannot,
//! that is while a dispatcher holds the lock or queues for it (Postgres
//! refuses a new shared request behind a queued exclusive one). When it
//! can, the inserting transaction keeps the shared lock until it ends.
//!
//! A dispatch loop that found nothing to claim asks for the gate
//! ([`WakeGate::want`]). A task of its own, on a dedicated connection
//! ([`GATE_APPLICATION_NAME`]), then queues for the lock exclusively: from
//! that moment every insert notifies. Postgres grants the lock once every
//! transaction that inserted without notifying has ended, so their rows are
//! committed: the task then wakes one loop, which claims once more before
//! it waits. A loop that claims two or more rows is busy: it gives the gate
//! back ([`WakeGate::release`]), publishers stop notifying, and it ticks
//! back to back until a claim comes back empty. Of the loops of one
//! process, only the last to find nothing asks for the gate: while another
//! still ticks back to back it will find the rows that come, and asking
//! meanwhile would make every insert notify for nothing (under a steady
//! load the loops of a process took turns finding nothing: at 2,000
//! inserts a second, over 22 times a second the gate's lock waited 3 ms or
//! more to be granted, and the inserts notified until it was given back).
//! A lost gate connection loses the lock with it; the task reconnects and wakes a loop to catch
//! up, and the poll interval stays the backstop throughout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use diesel::sql_types::Integer;
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use outbox_model::{WAKE_GATE_LOCK, prepared};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::draining::LoopCount;

/// The `application_name` of the gate's connection (visible in
/// `pg_stat_activity`, waiting on a `Lock` while other transactions hold
/// the gate).
pub const GATE_APPLICATION_NAME: &str = "outbox-dispatcher-gate";

/// Where this process stands with the lock.
const FREE: u8 = 0;
/// Asked for, not yet granted: inserts notify already.
const QUEUED: u8 = 1;
/// Granted: inserts notify.
const HELD: u8 = 2;

/// The dispatch loops' side of the wake gate (see the module
/// documentation); [`run`] is the task that holds the lock.
#[derive(Debug, Default)]
pub(crate) struct WakeGate {
    state: AtomicU8,
    wanted: AtomicBool,
    changed: Notify,
    /// Loops of this process that tick again at once after their last
    /// tick (see [`WakeGate::busy`]).
    busy_loops: LoopCount,
}

impl WakeGate {
    /// Whether inserts notify because of this process: it holds the lock
    /// or queues for it.
    pub(crate) fn covered(&self) -> bool {
        self.state.load(Ordering::Acquire) != FREE
    }

    /// Asks for the lock: a loop found nothing to claim and will wait. The
    /// lock is queued for at once; when it is granted, a loop is woken to
    /// claim once more.
    pub(crate) fn want(&self) {
        self.wanted.store(true, Ordering::Release);
        if self
            .state
            .compare_exchange(FREE, QUEUED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.changed.notify_one();
        }
    }

    /// Gives the lock back (once granted, if it is still queued): a loop is
    /// busy, publishers may stop notifying.
    pub(crate) fn release(&self) {
        if self.wanted.swap(false, Ordering::AcqRel) {
            self.changed.notify_one();
        }
    }

    /// Records whether a loop ticks again at once (`busy`) or waits, given
    /// what it recorded last (`counted`, updated).
    pub(crate) fn busy(&self, counted: &mut bool, busy: bool) {
        self.busy_loops.record(counted, busy);
    }

    /// A loop found nothing to claim and will wait: records it as waiting
    /// (`counted`, updated) and says whether another loop of this process
    /// still ticks back to back. Of loops finding nothing at the same time,
    /// the last to record itself sees none busy, so one of them always
    /// asks for the gate.
    pub(crate) fn idle_while_another_is_busy(&self, counted: &mut bool) -> bool {
        self.busy_loops.leave(counted) > 0
    }
}

/// Holds the lock for `gate` until `shutdown`: queues for it while a loop
/// wants it, wakes `wake` when it is granted, lets it go when no loop wants
/// it any more. A failed connection frees it; the task reconnects with
/// backoff (100 ms doubling to 5 s) and wakes `wake` once to catch up.
pub(crate) async fn run(
    database_url: String,
    gate: Arc<WakeGate>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut delay = Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        match connect(&database_url).await {
            Ok(mut conn) => {
                delay = Duration::from_millis(100);
                match serve(&mut conn, &gate, &wake, &shutdown).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "wake gate connection failed; reconnecting")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot open the wake gate connection; inserts notify only while another dispatcher waits")
            }
        }
        // The lock went with the connection; a loop may be waiting on it.
        gate.state.store(FREE, Ordering::Release);
        wake.notify_one();
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = crate::listener::next_delay(delay);
    }
}

/// Serves the gate on one connection until `shutdown` (`Ok`) or an error.
async fn serve(
    conn: &mut AsyncPgConnection,
    gate: &WakeGate,
    wake: &Notify,
    shutdown: &CancellationToken,
) -> Result<(), diesel::result::Error> {
    loop {
        // Until a loop wants the gate.
        while !gate.wanted.load(Ordering::Acquire) {
            gate.state.store(FREE, Ordering::Release);
            // A `want` between the store above and this check set QUEUED
            // and notified; the stored permit ends the wait below at once.
            if gate.wanted.load(Ordering::Acquire) {
                break;
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = gate.changed.notified() => {}
            }
        }
        gate.state.store(QUEUED, Ordering::Release);
        // Queues behind every transaction that holds the gate shared (and
        // behind a dispatcher that holds it); meanwhile inserts notify.
        let lock = lock(conn);
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            granted = lock => { granted?; }
        }
        gate.state.store(HELD, Ordering::Release);
        tracing::debug!("wake gate held");
        // Rows of transactions that inserted without notifying are
        // committed now: one more claim before the loops wait.
        wake.notify_one();
        while gate.wanted.load(Ordering::Acquire) {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = gate.changed.notified() => {}
            }
        }
        conn.batch_execute(UNLOCK_SQL).await?;
        tracing::debug!("wake gate released");
    }
}

/// Queues for the gate's lock exclusively and returns once it is granted.
/// Binds: the two keys of [`WAKE_GATE_LOCK`].
const LOCK_SQL: &str = "SELECT pg_advisory_lock($1, $2)";

/// Lets go of the gate's lock (the only advisory lock this connection takes).
const UNLOCK_SQL: &str = "SELECT pg_advisory_unlock_all()";

/// Returns once this connection holds the gate's lock.
async fn lock(conn: &mut AsyncPgConnection) -> Result<(), diesel::result::Error> {
    use diesel_async::RunQueryDsl;

    prepared(LOCK_SQL)
        .bind::<Integer, _>(WAKE_GATE_LOCK.0)
        .bind::<Integer, _>(WAKE_GATE_LOCK.1)
        .execute(conn)
        .await
        .map(drop)
}

async fn connect(database_url: &str) -> Result<AsyncPgConnection, String> {
    crate::listener::dedicated(
        database_url,
        &format!("SET application_name = '{GATE_APPLICATION_NAME}'"),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::{FREE, HELD, QUEUED, WakeGate};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// One grant per request: the task takes the lock when a loop wants
    /// it, wakes one loop, and once no loop wants it any more lets it go
    /// and stays away from it (no further grant, no further wake-up).
    // Break checked: inverting the task's wait for a wanting loop makes it
    // take and drop the lock over and over (waking a loop each time); the
    // gate is then not seen let go and the test fails at that deadline.
    #[tokio::test]
    async fn the_task_takes_the_lock_once_per_request_and_lets_it_go() {
        let db = outbox_test_support::TestDatabase::new().await;
        let gate = Arc::new(WakeGate::default());
        let wake = Arc::new(tokio::sync::Notify::new());
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(super::run(
            db.url().to_owned(),
            gate.clone(),
            wake.clone(),
            shutdown.clone(),
        ));
        let limit = Duration::from_secs(20);

        gate.want();
        tokio::time::timeout(limit, wake.notified())
            .await
            .expect("the granted gate wakes a loop");
        assert_eq!(gate.state.load(Ordering::Acquire), HELD);

        gate.release();
        outbox_test_support::eventually("the gate to be let go", limit, async || {
            gate.state.load(Ordering::Acquire) == FREE
        })
        .await;
        let again = tokio::time::timeout(Duration::from_millis(300), wake.notified()).await;
        assert!(again.is_err(), "the task took the lock again unasked");

        shutdown.cancel();
        task.await.unwrap();
    }

    /// Whether a publishing transaction could take the gate shared (and
    /// would then send no `NOTIFY`).
    async fn publisher_skips_notify(url: &str) -> bool {
        use diesel_async::{AsyncConnection, RunQueryDsl};
        #[derive(diesel::QueryableByName)]
        struct Taken {
            #[diesel(sql_type = diesel::sql_types::Bool)]
            taken: bool,
        }
        let mut conn = outbox_pg::establish(url).await.unwrap();
        conn.transaction::<_, diesel::result::Error, _>(async |conn| {
            let (key1, key2) = outbox_model::WAKE_GATE_LOCK;
            diesel::sql_query("SELECT pg_try_advisory_xact_lock_shared($1, $2) AS taken")
                .bind::<diesel::sql_types::Integer, _>(key1)
                .bind::<diesel::sql_types::Integer, _>(key2)
                .get_result::<Taken>(conn)
                .await
                .map(|row| row.taken)
        })
        .await
        .unwrap()
    }

    /// Two dispatchers: the second queues behind the first, inserts notify
    /// while either holds or queues, the second gets the gate when the
    /// first gives it back, and inserts skip `NOTIFY` only once neither
    /// wants it.
    // Break checked: `release` not telling the task leaves the first
    // holding the gate, and the second never gets it (fails at that deadline).
    #[tokio::test]
    async fn a_second_dispatcher_queues_behind_the_first_and_inserts_notify_until_both_are_busy() {
        let db = outbox_test_support::TestDatabase::new().await;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let start = || {
            let gate = Arc::new(WakeGate::default());
            let wake = Arc::new(tokio::sync::Notify::new());
            let task = tokio::spawn(super::run(
                db.url().to_owned(),
                gate.clone(),
                wake.clone(),
                shutdown.clone(),
            ));
            (gate, wake, task)
        };
        let limit = Duration::from_secs(20);
        let (first, first_wake, first_task) = start();
        let (second, second_wake, second_task) = start();
        assert!(
            publisher_skips_notify(db.url()).await,
            "nobody wants the gate yet"
        );

        first.want();
        tokio::time::timeout(limit, first_wake.notified())
            .await
            .expect("the first dispatcher gets the gate");
        second.want();
        outbox_test_support::eventually("the second dispatcher to queue", limit, async || {
            let mut conn = db.conn().await;
            diesel_async::RunQueryDsl::get_result::<Queued>(
                diesel::sql_query(
                    "SELECT count(*) AS queued FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = $1
                       AND wait_event_type = 'Lock'",
                )
                .bind::<diesel::sql_types::Text, _>(super::GATE_APPLICATION_NAME),
                &mut conn,
            )
            .await
            .unwrap()
            .queued
                == 1
        })
        .await;
        assert!(
            !publisher_skips_notify(db.url()).await,
            "the first holds it"
        );

        first.release();
        tokio::time::timeout(limit, second_wake.notified())
            .await
            .expect("the second dispatcher gets the gate once the first gives it back");
        assert_eq!(second.state.load(Ordering::Acquire), HELD);
        assert!(
            !publisher_skips_notify(db.url()).await,
            "the second holds it"
        );

        second.release();
        outbox_test_support::eventually("inserts to skip NOTIFY", limit, async || {
            publisher_skips_notify(db.url()).await
        })
        .await;

        shutdown.cancel();
        first_task.await.unwrap();
        second_task.await.unwrap();
    }

    #[derive(diesel::QueryableByName)]
    struct Queued {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        queued: i64,
    }

    #[test]
    fn wanting_queues_at_once_and_releasing_leaves_the_state_to_the_task() {
        let gate = WakeGate::default();
        assert!(!gate.covered());
        gate.want();
        assert_eq!(gate.state.load(Ordering::Acquire), QUEUED);
        assert!(gate.covered(), "inserts notify from the moment a loop asks");
        gate.release();
        assert!(!gate.wanted.load(Ordering::Acquire));
        // The task gives the lock back; until then inserts still notify.
        assert!(gate.covered());
        gate.state.store(FREE, Ordering::Release);
        assert!(!gate.covered());
    }
}
