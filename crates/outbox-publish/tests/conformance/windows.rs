//! Dedupe windows and replace mode: when a second event with a dispatch
//! key is a duplicate, when it is written, and when it replaces the
//! payload of the first. Time is moved by setting the holder's
//! `created_at` (or status) by plain SQL, never by waiting.

use std::time::Duration;

use outbox_publish::{Dedupe, NewOutboxEvent, PublishOutcome};
use serde_json::json;

use crate::cases::{events, setup, single};
use crate::changes::{far_future, published, set};
use crate::driver::{Driver, End, Step};

fn nudge(key: &str, n: i64) -> NewOutboxEvent {
    NewOutboxEvent::new("tenant-1", "mail.cart.reminder", json!({ "n": n })).dispatch_key(key)
}

/// Publishes `event` in a transaction of its own; its outcome.
async fn publish<D: Driver>(driver: &mut D, event: NewOutboxEvent) -> PublishOutcome {
    single(
        &driver
            .transaction(vec![Step::One(event)], End::Commit)
            .await[0],
    )
}

/// `WhilePending`: while the holder is PENDING or PROCESSING a second
/// event is a duplicate; once it is DONE, FAILED or CANCELLED the next one
/// is written and takes the key, and the old row keeps it in
/// `released_dispatch_key`.
pub async fn while_pending_frees_the_key_once_the_holder_leaves_pending<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let window = Dedupe::WhilePending;
    for (n, leave) in [
        "status = 'DONE', processed_at = now()",
        "status = 'FAILED', failed_at = now()",
        "status = 'CANCELLED'",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("cart-{n}");
        let holder = published(&mut driver, nudge(&key, 1).dedupe(window)).await;
        assert_eq!(
            publish(&mut driver, nudge(&key, 2).dedupe(window)).await,
            PublishOutcome::Duplicate(holder),
            "PENDING holds the key"
        );
        set(
            &db,
            holder,
            "status = 'PROCESSING', locked_until = now() + interval '1 minute'",
        )
        .await;
        assert_eq!(
            publish(&mut driver, nudge(&key, 3).dedupe(window)).await,
            PublishOutcome::Duplicate(holder),
            "PROCESSING holds the key"
        );
        set(&db, holder, &format!("locked_until = NULL, {leave}")).await;

        let next = publish(&mut driver, nudge(&key, 4).dedupe(window)).await;

        let PublishOutcome::Published(next) = next else {
            panic!("after {leave:?} the key is free, got {next:?}");
        };
        let rows = events(&db).await;
        let old = rows.iter().find(|r| r.id == holder).unwrap();
        let new = rows.iter().find(|r| r.id == next).unwrap();
        assert_eq!(
            (
                old.dispatch_key.as_deref(),
                old.released_dispatch_key.as_deref()
            ),
            (None, Some(key.as_str()))
        );
        assert_eq!(new.dispatch_key.as_deref(), Some(key.as_str()));
        assert_eq!(new.payload.value().unwrap(), json!({ "n": 4 }));
    }
}

/// `For(d)`: within `d` of the holder's `created_at` a second event is a
/// duplicate, whatever the holder's status; after it, the next one is
/// written, even while the holder is still PENDING.
pub async fn a_timed_window_frees_the_key_once_it_has_passed<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let hour = Dedupe::For(Duration::from_secs(3600));
    let holder = published(&mut driver, nudge("cart-1", 1).dedupe(hour)).await;
    set(&db, holder, "status = 'DONE', processed_at = now()").await;
    assert_eq!(
        publish(&mut driver, nudge("cart-1", 2).dedupe(hour)).await,
        PublishOutcome::Duplicate(holder),
        "within the hour, even handed off"
    );
    set(
        &db,
        holder,
        "status = 'PENDING', processed_at = NULL, \
         created_at = now() - interval '59 minutes 59 seconds'",
    )
    .await;
    assert_eq!(
        publish(&mut driver, nudge("cart-1", 3).dedupe(hour)).await,
        PublishOutcome::Duplicate(holder),
        "a second before the hour has passed"
    );
    set(&db, holder, "created_at = now() - interval '1 hour'").await;

    let next = publish(&mut driver, nudge("cart-1", 4).dedupe(hour)).await;

    assert!(
        matches!(next, PublishOutcome::Published(id) if id != holder),
        "{next:?}"
    );
    let rows = events(&db).await;
    assert_eq!(rows.len(), 2);
    let old = rows.iter().find(|r| r.id == holder).unwrap();
    assert_eq!(old.released_dispatch_key.as_deref(), Some("cart-1"));
    assert_eq!(
        old.status,
        outbox_model::OutboxStatus::Pending,
        "the old event is still dispatched"
    );
}

/// `UntilDeleted` (the default): a DONE holder, however old, keeps its key.
pub async fn without_a_window_the_key_is_held_until_the_row_is_deleted<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let holder = published(&mut driver, nudge("cart-1", 1)).await;
    set(
        &db,
        holder,
        "status = 'DONE', processed_at = now(), created_at = now() - interval '10 years'",
    )
    .await;
    assert_eq!(
        publish(&mut driver, nudge("cart-1", 2).dedupe(Dedupe::UntilDeleted)).await,
        PublishOutcome::Duplicate(holder)
    );
    // A window is the holder's: the newcomer's own window does not free it.
    assert_eq!(
        publish(&mut driver, nudge("cart-1", 3).dedupe(Dedupe::WhilePending)).await,
        PublishOutcome::Duplicate(holder)
    );
}

/// Replace mode: a PENDING holder of the same tenant and type takes the
/// new payload (and the schedule, when given) and the outcome is
/// `Replaced` with its id; a DONE holder, or one of another type, is left
/// alone (`Duplicate`); without a holder the event is written.
pub async fn replace_updates_a_pending_holder_and_not_a_done_one<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let fresh = publish(&mut driver, nudge("cart-1", 1).replace_pending()).await;
    let PublishOutcome::Published(holder) = fresh else {
        panic!("without a holder the event is written, got {fresh:?}");
    };
    let scheduled = events(&db).await[0].scheduled_at;

    assert_eq!(
        publish(&mut driver, nudge("cart-1", 2).replace_pending()).await,
        PublishOutcome::Replaced(holder)
    );
    let row = events(&db).await.remove(0);
    assert_eq!(row.payload.value().unwrap(), json!({ "n": 2 }));
    assert_eq!(row.scheduled_at, scheduled, "no schedule given: kept");

    assert_eq!(
        publish(
            &mut driver,
            nudge("cart-1", 3)
                .scheduled_at(far_future())
                .replace_pending()
        )
        .await,
        PublishOutcome::Replaced(holder)
    );
    let rows = events(&db).await;
    assert_eq!(rows.len(), 1, "replacing writes no row");
    assert_eq!(rows[0].payload.value().unwrap(), json!({ "n": 3 }));
    assert_eq!(rows[0].scheduled_at, far_future());

    let other_type = NewOutboxEvent::new("tenant-1", "mail.cart.abandoned", json!({ "n": 9 }))
        .dispatch_key("cart-1")
        .replace_pending();
    assert_eq!(
        publish(&mut driver, other_type).await,
        PublishOutcome::Duplicate(holder)
    );
    set(&db, holder, "status = 'DONE', processed_at = now()").await;
    assert_eq!(
        publish(&mut driver, nudge("cart-1", 4).replace_pending()).await,
        PublishOutcome::Duplicate(holder)
    );
    let rows = events(&db).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].payload.value().unwrap(),
        json!({ "n": 3 }),
        "a DONE holder keeps its payload"
    );
}

/// Replace mode with `WhilePending`: once the holder is handed off, the
/// next event is written rather than a duplicate, and replaces no more.
pub async fn replace_with_while_pending_writes_a_new_event_after_hand_off<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let event = |n| {
        nudge("idx-7", n)
            .dedupe(Dedupe::WhilePending)
            .replace_pending()
    };
    let holder = published(&mut driver, event(1)).await;
    set(&db, holder, "status = 'DONE', processed_at = now()").await;

    let next = publish(&mut driver, event(2)).await;

    assert!(
        matches!(next, PublishOutcome::Published(id) if id != holder),
        "{next:?}"
    );
}

/// A batch with replace events: each event meets the ones before it in
/// the batch, in order (the first is written, the next replaces it), and
/// plain events of the batch get their usual outcomes.
pub async fn a_batch_with_replace_events_replaces_in_order<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let results = driver
        .transaction(
            vec![Step::Batch(vec![
                nudge("idx-1", 1).replace_pending(),
                nudge("idx-1", 2).replace_pending(),
                nudge("idx-2", 3),
                nudge("idx-2", 4),
            ])],
            End::Commit,
        )
        .await;

    let outcomes = results[0].as_ref().unwrap();
    let PublishOutcome::Published(first) = outcomes[0] else {
        panic!("{outcomes:?}");
    };
    let PublishOutcome::Published(plain) = outcomes[2] else {
        panic!("{outcomes:?}");
    };
    assert_eq!(
        outcomes[1..],
        [
            PublishOutcome::Replaced(first),
            PublishOutcome::Published(plain),
            PublishOutcome::Duplicate(plain)
        ]
    );
    let rows = events(&db).await;
    assert_eq!(rows.len(), 2);
    let first = rows.iter().find(|r| r.id == first).unwrap();
    assert_eq!(first.payload.value().unwrap(), json!({ "n": 2 }));
}
