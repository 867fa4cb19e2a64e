//! The wake-up listener: `LISTEN outbox_event` on a dedicated connection
//! (opened like the pool's, with the URL's `sslmode`).

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures::StreamExt;
use outbox_model::NOTIFY_CHANNEL;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The `application_name` of the listening connection (visible in
/// `pg_stat_activity`).
pub const LISTENER_APPLICATION_NAME: &str = "outbox-dispatcher-listener";

/// Listens until `shutdown`, waking `wake` on every notification. When the
/// connection drops it reconnects with backoff (100 ms doubling to 5 s), and
/// after every (re)connect it wakes the dispatcher once to catch up on
/// anything inserted while nobody listened. The poll interval stays the
/// safety net throughout. `pid` holds the listening backend's process id
/// while connected (0 when unknown), by which the dispatchers of a
/// database rank themselves (`crate::share`).
pub async fn listen(
    database_url: String,
    wake: Arc<Notify>,
    pid: Arc<AtomicI32>,
    shutdown: CancellationToken,
) {
    let mut delay = Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        match connect(&database_url).await {
            Ok((mut conn, backend)) => {
                pid.store(backend, Ordering::Release);
                tracing::info!(channel = NOTIFY_CHANNEL, "dispatcher listening for inserts");
                delay = Duration::from_millis(100);
                wake.notify_one();
                let mut notifications = std::pin::pin!(conn.notifications_stream());
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        next = notifications.next() => match next {
                            Some(Ok(_)) => wake.notify_one(),
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "listener connection failed; reconnecting");
                                break;
                            }
                            None => {
                                tracing::warn!("listener connection closed; reconnecting");
                                break;
                            }
                        }
                    }
                }
                pid.store(0, Ordering::Release);
                metrics::counter!("outbox_dispatch_listener_reconnects_total").increment(1);
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot LISTEN; polling only until it works")
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = next_delay(delay);
    }
}

/// The wait before the next attempt to LISTEN (or to open the wake gate's
/// connection) after one that failed (or a connection that was lost) after
/// waiting `delay`: twice as long, at most five seconds.
pub(crate) fn next_delay(delay: Duration) -> Duration {
    (delay * 2).min(Duration::from_secs(5))
}

/// The process id of `conn`'s backend; 0 when it cannot be read.
async fn backend_pid(conn: &mut AsyncPgConnection) -> i32 {
    #[derive(diesel::QueryableByName)]
    struct Pid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
    }
    diesel_async::RunQueryDsl::get_result::<Pid>(
        diesel::sql_query("SELECT pg_backend_pid() AS pid"),
        conn,
    )
    .await
    .map_or(0, |row| row.pid)
}

/// The listening connection and its backend's process id. `LISTEN` comes
/// last, so that `pg_stat_activity` shows it as the connection's query.
async fn connect(database_url: &str) -> Result<(AsyncPgConnection, i32), String> {
    let mut conn = dedicated(
        database_url,
        &format!("SET application_name = '{LISTENER_APPLICATION_NAME}'"),
    )
    .await?;
    let backend = backend_pid(&mut conn).await;
    conn.batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}"))
        .await
        .map_err(|e| e.to_string())?;
    Ok((conn, backend))
}

/// A connection of its own outside the pool (opened like the pool's, with
/// the URL's `sslmode`), set up by running `setup`.
pub(crate) async fn dedicated(
    database_url: &str,
    setup: &str,
) -> Result<AsyncPgConnection, String> {
    let mut conn = outbox_pg::establish(database_url)
        .await
        .map_err(|e| e.to_string())?;
    conn.batch_execute(setup).await.map_err(|e| e.to_string())?;
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
