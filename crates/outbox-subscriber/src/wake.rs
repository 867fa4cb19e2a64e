//! Waking idle queue workers.
//!
//! apalis-redis' storage parks an idle worker until its next heartbeat (30 s
//! by default), and jobs pushed through the batch script land in the
//! scheduled set without a wake-up. So each worker here polls on a short
//! interval, and is woken at once by a Redis pub/sub message on
//! `<queue>:wake`, which [`outbox_queue::push_raw`] publishes after every
//! push that added jobs.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Yields whenever the worker should look for jobs: every poll interval, and
/// on every wake-up message.
/// The wake-up receiver is shared so that a restarted worker keeps
/// receiving the same queue's wake-ups.
#[derive(Debug)]
pub struct WakeStream {
    interval: tokio::time::Interval,
    wakeups: Arc<Mutex<mpsc::Receiver<()>>>,
}

impl WakeStream {
    /// A stream ticking every `every` and on each message of `wakeups`.
    #[must_use]
    pub fn new(every: Duration, wakeups: Arc<Mutex<mpsc::Receiver<()>>>) -> Self {
        let mut interval = tokio::time::interval(every.max(Duration::from_millis(10)));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { interval, wakeups }
    }
}

impl Stream for WakeStream {
    type Item = ();

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<()>> {
        if self.interval.poll_tick(cx).is_ready() {
            return Poll::Ready(Some(()));
        }
        let mut wakeups = self.wakeups.lock().unwrap_or_else(PoisonError::into_inner);
        match wakeups.poll_recv(cx) {
            Poll::Ready(Some(())) => Poll::Ready(Some(())),
            // No more wake-ups (listener gone): the interval keeps us going.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

/// Listens on the `<queue>:wake` channels and forwards each message to the
/// matching worker until `shutdown`; reconnects with backoff when the
/// subscription drops (the poll interval covers the gap).
pub async fn listen_for_wakeups(
    client: redis::Client,
    senders: HashMap<String, mpsc::Sender<()>>,
    shutdown: CancellationToken,
) {
    let mut delay = Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => {
                let mut subscribed = true;
                for channel in senders.keys() {
                    if let Err(e) = pubsub.subscribe(channel).await {
                        tracing::warn!(channel, error = %e, "cannot subscribe to wake-ups");
                        subscribed = false;
                        break;
                    }
                }
                if subscribed {
                    delay = Duration::from_millis(100);
                    let mut messages = pubsub.on_message();
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            message = messages.next() => match message {
                                Some(message) => {
                                    if let Some(sender) = senders.get(message.get_channel_name()) {
                                        // A full channel already holds a pending wake-up.
                                        let _ = sender.try_send(());
                                    }
                                }
                                None => break,
                            }
                        }
                    }
                    tracing::warn!("wake-up subscription closed; reconnecting (polling meanwhile)");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot subscribe to wake-ups; polling only"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
