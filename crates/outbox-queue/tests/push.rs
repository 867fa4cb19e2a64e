//! What a push tells the queue's workers: a wake-up on the queue's own
//! channel with the number of jobs it added, and none when every job was
//! already there (a push again after a lost acknowledgement, a
//! reconciliation); the same for dead jobs put back on the queue.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use futures::StreamExt;
use outbox_queue::{push_raw, wake_channel};

const QUEUE: &str = "q.push";

// Break checked: `new > 0` turned into `>= 0` in `push_raw_at` (every push
// publishes, also one that added nothing) fails with "the push of
// duplicates woke no worker ... left: \"0\" right: \"1\""; `wake_channel`
// answering `""` (one channel for every queue) fails with "the first
// wake-up is this queue's push".
/// The wake-ups published on `queue`'s channel from now on.
async fn wakeups(
    url: &str,
    namespace: &outbox_queue::QueueNamespace,
    queue: &str,
) -> impl futures::Stream<Item = redis::Msg> {
    let client = redis::Client::open(url).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub
        .subscribe(wake_channel(namespace, queue))
        .await
        .unwrap();
    pubsub.into_on_message()
}

/// The count the next wake-up carries.
async fn next(wakeups: &mut (impl futures::Stream<Item = redis::Msg> + Unpin)) -> String {
    let message = tokio::time::timeout(Duration::from_secs(30), wakeups.next())
        .await
        .expect("a wake-up within 30 s")
        .expect("the subscription stays open");
    message.get_payload().unwrap()
}

/// Pushes jobs with empty bodies under `ids` to `queue`.
async fn push(
    conn: &mut outbox_queue::RedisConnection,
    namespace: &outbox_queue::QueueNamespace,
    queue: &str,
    ids: &[&str],
) -> outbox_queue::PushReport {
    let jobs: Vec<(String, Vec<u8>)> = ids
        .iter()
        .map(|id| ((*id).to_owned(), b"{}".to_vec()))
        .collect();
    push_raw(conn, namespace, queue, &jobs).await.unwrap()
}

#[tokio::test]
async fn a_push_wakes_the_workers_with_its_count_and_a_push_of_duplicates_wakes_none() {
    let (redis, namespace, mut conn) = common::redis_queue().await;
    let mut wakeups = Box::pin(wakeups(redis.url(), &namespace, QUEUE).await);

    // A push to another queue wakes that queue's workers, not these.
    let other = push(&mut conn, &namespace, "q.other", &["x"]).await;
    assert_eq!(other.new, 1);
    let first = push(&mut conn, &namespace, QUEUE, &["a", "b"]).await;
    assert_eq!(first.new, 2);
    assert_eq!(
        next(&mut wakeups).await,
        "2",
        "the first wake-up is this queue's push, naming the jobs it added"
    );

    let again = push(&mut conn, &namespace, QUEUE, &["a", "b"]).await;
    assert_eq!((again.new, again.duplicates), (0, 2));
    // The next message is the one of the next push that adds a job: the
    // push of duplicates published nothing in between.
    let last = push(&mut conn, &namespace, QUEUE, &["a", "c"]).await;
    assert_eq!(last.new, 1);
    assert_eq!(
        next(&mut wakeups).await,
        "1",
        "the push of duplicates woke no worker"
    );
}

// Break checked: `total > 0` turned into `==` in `put_back` (a wake-up only
// for a call that put nothing back) fails with "the dead job put back
// wakes the workers ... left: \"0\" right: \"1\"".
#[tokio::test]
async fn a_dead_job_put_back_wakes_the_workers_and_a_call_that_puts_none_back_wakes_none() {
    let (redis, namespace, mut conn) = common::redis_queue().await;
    let mut wakeups = Box::pin(wakeups(redis.url(), &namespace, QUEUE).await);
    push(&mut conn, &namespace, QUEUE, &["d"]).await;
    assert_eq!(next(&mut wakeups).await, "1");
    // The job ran out of attempts: out of the schedule, in the dead set.
    let config = outbox_queue::apalis_config(&namespace, QUEUE);
    let () = redis::pipe()
        .zrem(config.scheduled_jobs_set(), "d")
        .ignore()
        .sadd(config.dead_jobs_set(), "d")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();

    let none = outbox_queue::retry_dead(&mut conn, &namespace, QUEUE, &["gone".to_owned()])
        .await
        .unwrap();
    assert!(
        none.is_empty(),
        "an id that is not dead is left alone: {none:?}"
    );
    let back = outbox_queue::retry_dead(&mut conn, &namespace, QUEUE, &["d".to_owned()])
        .await
        .unwrap();
    assert_eq!(back, ["d"], "the call returns the ids it put back");
    assert_eq!(
        next(&mut wakeups).await,
        "1",
        "the dead job put back wakes the workers, the call that put none back woke none"
    );
}
