//! What a push tells the queue's workers: a wake-up on the queue's own
//! channel with the number of jobs it added, and none when every job was
//! already there (a push again after a lost acknowledgement, a
//! reconciliation).

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
#[tokio::test]
async fn a_push_wakes_the_workers_with_its_count_and_a_push_of_duplicates_wakes_none() {
    let (redis, namespace, mut conn) = common::redis_queue().await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub
        .subscribe(wake_channel(&namespace, QUEUE))
        .await
        .unwrap();
    let mut wakeups = pubsub.on_message();
    let mut next = async || -> String {
        let message = tokio::time::timeout(Duration::from_secs(30), wakeups.next())
            .await
            .expect("a wake-up within 30 s")
            .expect("the subscription stays open");
        message.get_payload().unwrap()
    };
    let job = |id: &str| (id.to_owned(), b"{}".to_vec());

    // A push to another queue wakes that queue's workers, not these.
    let other = push_raw(&mut conn, &namespace, "q.other", &[job("x")])
        .await
        .unwrap();
    assert_eq!(other.new, 1);
    let first = push_raw(&mut conn, &namespace, QUEUE, &[job("a"), job("b")])
        .await
        .unwrap();
    assert_eq!(first.new, 2);
    assert_eq!(
        next().await,
        "2",
        "the first wake-up is this queue's push, naming the jobs it added"
    );

    let again = push_raw(&mut conn, &namespace, QUEUE, &[job("a"), job("b")])
        .await
        .unwrap();
    assert_eq!((again.new, again.duplicates), (0, 2));
    // The next message is the one of the next push that adds a job: the
    // push of duplicates published nothing in between.
    let last = push_raw(&mut conn, &namespace, QUEUE, &[job("a"), job("c")])
        .await
        .unwrap();
    assert_eq!(last.new, 1);
    assert_eq!(next().await, "1", "the push of duplicates woke no worker");
}
