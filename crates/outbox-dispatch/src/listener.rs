//! The wake-up listener: `LISTEN outbox_event` on a dedicated connection
//! (opened like the pool's, with the URL's `sslmode`), which also holds the
//! wake gate while the dispatch loops wait.
//!
//! # The wake gate
//!
//! `NOTIFY` makes every committing transaction that sent one take a
//! database-wide lock and hold it through its commit, so publishers that
//! notify commit one after another. The insert trigger therefore notifies
//! only while a dispatcher waits: a dispatcher that has nothing to do holds
//! the advisory lock [`outbox_model::WAKE_GATE_LOCK`] on this connection,
//! and the trigger notifies when it cannot take that lock shared. When it
//! can (no dispatcher waits), the inserting transaction keeps the shared
//! lock until it ends.
//!
//! A loop that found nothing to claim asks to wait ([`WakeGate::ask_to_wait`]):
//! - [`Gate::Taken`]: this connection has just taken the lock. A transaction
//!   that inserted without notifying held it shared and has ended, so its
//!   rows are committed: the loop claims once more before it waits.
//! - [`Gate::Held`] (this process already held it) or [`Gate::Others`]
//!   (another dispatcher holds it): inserts notify; the loop waits.
//! - [`Gate::Contended`]: transactions that inserted without notifying are
//!   still open; the loop claims again after a short pause.
//! - [`Gate::Unavailable`]: no listening connection; the loop waits for the
//!   poll interval, as before the gate.
//!
//! A loop that claims more than one row is busy: it releases the lock
//! ([`WakeGate::release`]), so that publishers stop notifying, and ticks
//! back to back until a claim comes back empty. A lost connection releases
//! the lock with it; the reconnect wakes a loop to catch up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel::sql_types::{Integer, Text};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures::StreamExt;
use outbox_model::{NOTIFY_CHANNEL, WAKE_GATE_LOCK, prepared};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// The `application_name` of the listening connection (visible in
/// `pg_stat_activity`).
pub const LISTENER_APPLICATION_NAME: &str = "outbox-dispatcher-listener";

/// What a loop that found nothing to claim learns from [`WakeGate::ask_to_wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// This process has just taken the lock: claim once more, then wait.
    Taken,
    /// This process already holds the lock: inserts notify, wait.
    Held,
    /// Another dispatcher holds the lock: inserts notify, wait.
    Others,
    /// Transactions that inserted without notifying are still open: claim
    /// again after a short pause.
    Contended,
    /// No listening connection: wait for a wake-up or the poll.
    Unavailable,
}

/// A loop's request to the listening connection.
#[derive(Debug)]
pub(crate) enum Request {
    /// Take the lock if this process does not hold it; answer what happened.
    Wait(oneshot::Sender<Gate>),
    /// Let go of the lock.
    Release,
}

/// The dispatch loops' handle on the wake gate, which the listener task
/// holds (see the module documentation).
#[derive(Debug)]
pub(crate) struct WakeGate {
    requests: mpsc::Sender<Request>,
    held: Arc<AtomicBool>,
}

impl WakeGate {
    /// A gate and the receiving end for [`listen`].
    pub(crate) fn new() -> (Self, GateInbox) {
        let (requests, inbox) = mpsc::channel(64);
        let held = Arc::new(AtomicBool::new(false));
        (
            Self {
                requests,
                held: held.clone(),
            },
            GateInbox { inbox, held },
        )
    }

    /// Whether this process holds the lock (inserts notify).
    #[must_use]
    pub(crate) fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Asks to wait: takes the lock unless this process holds it already.
    pub(crate) async fn ask_to_wait(&self) -> Gate {
        if self.held() {
            return Gate::Held;
        }
        let (answer, answered) = oneshot::channel();
        if self.requests.send(Request::Wait(answer)).await.is_err() {
            return Gate::Unavailable;
        }
        answered.await.unwrap_or(Gate::Unavailable)
    }

    /// Lets go of the lock, if this process holds it: publishers stop
    /// notifying until a loop asks to wait again.
    pub(crate) fn release(&self) {
        if self.held() {
            // A full inbox already holds requests that decide the state;
            // a release lost there only means notifications go on.
            let _ = self.requests.try_send(Request::Release);
        }
    }
}

/// The listener's end of a [`WakeGate`].
#[derive(Debug)]
pub(crate) struct GateInbox {
    pub(crate) inbox: mpsc::Receiver<Request>,
    pub(crate) held: Arc<AtomicBool>,
}

/// Listens until `shutdown`, waking `wake` on every notification and
/// answering the loops' requests in `gate`. When the connection drops it
/// reconnects with backoff (100 ms doubling to 5 s), and after every
/// (re)connect it wakes the dispatcher once to catch up on anything
/// inserted while nobody listened. While no connection is up, requests are
/// answered [`Gate::Unavailable`]. The poll interval stays the safety net
/// throughout.
pub(crate) async fn listen(
    database_url: String,
    wake: Arc<Notify>,
    mut gate: GateInbox,
    shutdown: CancellationToken,
) {
    let mut delay = Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        match connect(&database_url).await {
            Ok(mut conn) => {
                tracing::info!(channel = NOTIFY_CHANNEL, "dispatcher listening for inserts");
                delay = Duration::from_millis(100);
                wake.notify_one();
                if serve(&mut conn, &wake, &mut gate, &shutdown).await {
                    return;
                }
                gate.held.store(false, Ordering::Release);
                metrics::counter!("outbox_dispatch_listener_reconnects_total").increment(1);
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot LISTEN; polling only until it works")
            }
        }
        let pause = tokio::time::sleep(delay);
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = &mut pause => break,
                request = gate.inbox.recv() => match request {
                    Some(Request::Wait(answer)) => {
                        let _ = answer.send(Gate::Unavailable);
                    }
                    Some(Request::Release) => {}
                    None => return,
                },
            }
        }
        delay = next_delay(delay);
    }
}

/// What woke the listener.
enum Event {
    Notified,
    Request(Request),
    Lost(String),
    Stop,
}

/// Serves one connection until it fails (returns `false`) or `shutdown`
/// (or every loop is gone: returns `true`).
async fn serve(
    conn: &mut AsyncPgConnection,
    wake: &Notify,
    gate: &mut GateInbox,
    shutdown: &CancellationToken,
) -> bool {
    loop {
        let event = {
            let mut notifications = std::pin::pin!(conn.notifications_stream());
            tokio::select! {
                () = shutdown.cancelled() => Event::Stop,
                next = notifications.next() => match next {
                    Some(Ok(_)) => Event::Notified,
                    Some(Err(e)) => Event::Lost(e.to_string()),
                    None => Event::Lost("connection closed".to_owned()),
                },
                request = gate.inbox.recv() => request.map_or(Event::Stop, Event::Request),
            }
        };
        match event {
            Event::Notified => wake.notify_one(),
            Event::Stop => return true,
            Event::Lost(reason) => {
                tracing::warn!(error = %reason, "listener connection failed; reconnecting");
                return false;
            }
            Event::Request(Request::Wait(answer)) => {
                let outcome = if gate.held.load(Ordering::Acquire) {
                    Ok(Gate::Held)
                } else {
                    take(conn).await
                };
                match outcome {
                    Ok(outcome) => {
                        if outcome == Gate::Taken {
                            gate.held.store(true, Ordering::Release);
                        }
                        tracing::debug!(?outcome, "wake gate");
                        let _ = answer.send(outcome);
                    }
                    Err(e) => {
                        let _ = answer.send(Gate::Unavailable);
                        tracing::warn!(error = %e, "listener connection failed; reconnecting");
                        return false;
                    }
                }
            }
            Event::Request(Request::Release) => {
                if gate.held.load(Ordering::Acquire) {
                    if let Err(e) = conn.batch_execute(RELEASE_SQL).await {
                        tracing::warn!(error = %e, "listener connection failed; reconnecting");
                        return false;
                    }
                    gate.held.store(false, Ordering::Release);
                    tracing::debug!("wake gate released");
                }
            }
        }
    }
}

/// Takes the gate's lock if it is free; otherwise says whether another
/// dispatcher holds it (exclusive) or inserting transactions do (shared).
/// Binds: the two keys of [`WAKE_GATE_LOCK`].
const TAKE_SQL: &str = "SELECT CASE
    WHEN pg_try_advisory_lock($1, $2) THEN 'taken'
    WHEN EXISTS (
        SELECT 1 FROM pg_locks
         WHERE locktype = 'advisory'
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND classid = $1::oid AND objid = $2::oid AND objsubid = 2
           AND mode = 'ExclusiveLock' AND granted
           AND pid <> pg_backend_pid()
    ) THEN 'others'
    ELSE 'contended'
END AS outcome";

/// Lets go of the gate's lock (the only advisory lock this connection takes).
const RELEASE_SQL: &str = "SELECT pg_advisory_unlock_all()";

#[derive(diesel::QueryableByName)]
struct TakeRow {
    #[diesel(sql_type = Text)]
    outcome: String,
}

async fn take(conn: &mut AsyncPgConnection) -> Result<Gate, diesel::result::Error> {
    use diesel_async::RunQueryDsl;

    let row: TakeRow = prepared(TAKE_SQL)
        .bind::<Integer, _>(WAKE_GATE_LOCK.0)
        .bind::<Integer, _>(WAKE_GATE_LOCK.1)
        .get_result(conn)
        .await?;
    Ok(match row.outcome.as_str() {
        "taken" => Gate::Taken,
        "others" => Gate::Others,
        _ => Gate::Contended,
    })
}

/// The wait before the next attempt to LISTEN after one that failed (or a
/// connection that was lost) after waiting `delay`: twice as long, at most
/// five seconds.
fn next_delay(delay: Duration) -> Duration {
    (delay * 2).min(Duration::from_secs(5))
}

async fn connect(database_url: &str) -> Result<AsyncPgConnection, String> {
    let mut conn = outbox_model::establish(database_url)
        .await
        .map_err(|e| e.to_string())?;
    conn.batch_execute(&format!(
        "SET application_name = '{LISTENER_APPLICATION_NAME}'; LISTEN {NOTIFY_CHANNEL}"
    ))
    .await
    .map_err(|e| e.to_string())?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::next_delay;

    #[test]
    fn reconnect_attempts_back_off_doubling_up_to_five_seconds() {
        let ms = Duration::from_millis;
        for (before, after) in [
            (ms(100), ms(200)),
            (ms(200), ms(400)),
            (ms(1600), ms(3200)),
            (ms(3200), ms(5000)),
            (ms(5000), ms(5000)),
        ] {
            assert_eq!(next_delay(before), after, "after {before:?}");
        }
    }
}
