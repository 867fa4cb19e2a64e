//! Waking idle queue workers.
//!
//! apalis-redis' storage parks an idle worker until its next heartbeat (30 s
//! by default), and jobs pushed through the batch script land in the
//! scheduled set without a wake-up. So each worker here polls on a short
//! interval, and is woken at once by a Redis pub/sub message on
//! `<queue>:wake`, which [`outbox_queue::push_raw`] publishes after every
//! push that added jobs.
//!
//! Two things make sure no wake-up is lost. apalis polls the wake-up stream
//! once per look at the backend and ignores what it yields, so a wake-up
//! taken in that poll leaves the stream not listening for the next one:
//! [`WakeStream`] therefore drains its sources until they are pending, and
//! is always listening when it returns. And a wake-up can arrive while a
//! fetch is on its way: its push reached Redis just after the fetch script
//! ran, the fetch comes back empty, and the worker, having taken the
//! wake-up already, would park until its next poll; so every message also
//! counts on [`QueueWakeups::count`], and a fetch that found nothing while
//! the count moved is made again
//! ([`outbox_queue::WorkerStore::with_wake_count`]). Without the two, jobs
//! waited up to a poll interval (1 s by default) a few times a minute at
//! 500 jobs a second.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One queue's wake-ups: the listener signals them, the queue's worker (and
/// every restart of it) waits on them. Cheap to clone.
#[derive(Debug, Clone)]
pub struct QueueWakeups {
    count: Arc<AtomicU64>,
    sender: mpsc::Sender<()>,
    receiver: Arc<Mutex<mpsc::Receiver<()>>>,
}

impl Default for QueueWakeups {
    fn default() -> Self {
        // One pending wake-up is as good as many.
        let (sender, receiver) = mpsc::channel(1);
        Self {
            count: Arc::new(AtomicU64::new(0)),
            sender,
            receiver: Arc::new(Mutex::new(receiver)),
        }
    }
}

impl QueueWakeups {
    /// Records a wake-up: counts it, then wakes the worker if it waits.
    pub fn signal(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
        // A full channel already holds a pending wake-up.
        let _ = self.sender.try_send(());
    }

    /// How many wake-ups arrived so far (for the worker's fetches).
    #[must_use]
    pub fn count(&self) -> Arc<AtomicU64> {
        self.count.clone()
    }

    /// A stream ticking every `every` and on each wake-up.
    #[must_use]
    pub fn stream(&self, every: Duration) -> WakeStream {
        WakeStream::new(every, self.receiver.clone())
    }
}

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

    /// Takes every tick and wake-up that is due and yields once for all of
    /// them; returns only when both sources are pending again, so that the
    /// task is woken by the next one even when this item is ignored.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<()>> {
        let mut due = false;
        while self.interval.poll_tick(cx).is_ready() {
            due = true;
        }
        let mut wakeups = self.wakeups.lock().unwrap_or_else(PoisonError::into_inner);
        // Closed (no more wake-ups) counts as pending: the interval goes on.
        while let Poll::Ready(Some(())) = wakeups.poll_recv(cx) {
            due = true;
        }
        if due {
            Poll::Ready(Some(()))
        } else {
            Poll::Pending
        }
    }
}

/// The wait before the first attempt to subscribe again.
const FIRST_RECONNECT_DELAY: Duration = Duration::from_millis(100);

/// The wait after `delay` when subscribing failed again: twice as long, at
/// most 5 s (the poll interval keeps the workers going meanwhile).
fn next_reconnect_delay(delay: Duration) -> Duration {
    (delay * 2).min(Duration::from_secs(5))
}

/// Listens on the `<queue>:wake` channels and signals each message to the
/// matching queue's wake-ups until `shutdown`; when the subscription cannot
/// be made or drops, subscribes again with backoff (the poll interval
/// covers the gap), through the next of `clients` (on a cluster, the next
/// node: a node that died is not tried again before the others).
pub async fn listen_for_wakeups(
    clients: impl Into<outbox_queue::PubSubClients>,
    senders: HashMap<String, QueueWakeups>,
    shutdown: CancellationToken,
) {
    let clients = clients.into();
    let nodes = clients.nodes();
    if nodes.is_empty() {
        return;
    }
    let mut delay = FIRST_RECONNECT_DELAY;
    for client in nodes.iter().cycle() {
        if shutdown.is_cancelled() {
            return;
        }
        let node = client.get_connection_info().addr().to_string();
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => {
                let mut subscribed = true;
                for channel in senders.keys() {
                    if let Err(e) = pubsub.subscribe(channel).await {
                        tracing::warn!(channel, node, error = %e, "cannot subscribe to wake-ups");
                        subscribed = false;
                        break;
                    }
                }
                if subscribed {
                    delay = FIRST_RECONNECT_DELAY;
                    let mut messages = pubsub.on_message();
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            message = messages.next() => match message {
                                Some(message) => {
                                    if let Some(wakeups) = senders.get(message.get_channel_name()) {
                                        wakeups.signal();
                                    }
                                }
                                None => break,
                            }
                        }
                    }
                    tracing::warn!(
                        node,
                        "wake-up subscription closed; subscribing again (polling meanwhile)"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(node, error = %e, "cannot subscribe to wake-ups; polling only")
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = next_reconnect_delay(delay);
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    use futures::{Stream, StreamExt};

    use super::{FIRST_RECONNECT_DELAY, QueueWakeups, next_reconnect_delay};

    #[test]
    fn subscribing_again_backs_off_doubling_from_a_tenth_of_a_second_to_five_seconds() {
        let mut delay = FIRST_RECONNECT_DELAY;
        let mut waits = Vec::new();
        for _ in 0..8 {
            waits.push(delay.as_millis());
            delay = next_reconnect_delay(delay);
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }

    #[derive(Default)]
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    // Break checked: taking one wake-up and returning at once (the stream
    // as it was) leaves the second signal waking nobody, and this fails.
    #[tokio::test]
    async fn after_yielding_for_a_wake_up_the_stream_is_woken_by_the_next_one() {
        let wakeups = QueueWakeups::default();
        let mut stream = wakeups.stream(Duration::from_secs(3600));
        let counter = Arc::new(CountingWaker::default());
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        // The interval's first tick is due at once.
        assert_eq!(stream.next().await, Some(()));
        assert_eq!(Pin::new(&mut stream).poll_next(&mut cx), Poll::Pending);

        wakeups.signal();
        assert_eq!(
            counter.0.load(Ordering::SeqCst),
            1,
            "the first wake-up woke the task"
        );
        // apalis polls the stream once and ignores the item.
        assert_eq!(
            Pin::new(&mut stream).poll_next(&mut cx),
            Poll::Ready(Some(()))
        );

        wakeups.signal();
        assert_eq!(
            counter.0.load(Ordering::SeqCst),
            2,
            "the second wake-up must wake the task although the stream was not polled since"
        );
        assert_eq!(wakeups.count().load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn wake_ups_that_pile_up_make_one_item() {
        let wakeups = QueueWakeups::default();
        let mut stream = wakeups.stream(Duration::from_secs(3600));
        let waker = Waker::from(Arc::new(CountingWaker::default()));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(stream.next().await, Some(()), "the interval's first tick");
        for _ in 0..5 {
            wakeups.signal();
        }
        assert_eq!(
            Pin::new(&mut stream).poll_next(&mut cx),
            Poll::Ready(Some(()))
        );
        assert_eq!(Pin::new(&mut stream).poll_next(&mut cx), Poll::Pending);
        assert_eq!(
            wakeups.count().load(Ordering::SeqCst),
            5,
            "every wake-up is counted"
        );
    }
}
