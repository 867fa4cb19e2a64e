//! Cancel and reschedule from code, in the caller's transaction: what the
//! table and the history hold afterwards, and the typed refusals.

use chrono::{DateTime, TimeDelta, Utc};
use diesel_async::SimpleAsyncConnection;
use outbox_model::OutboxStatus;
use outbox_publish::{ChangeError, EventRef, NewOutboxEvent, PublishOutcome};
use outbox_test_support::TestDatabase;
use serde_json::json;
use uuid::Uuid;

use crate::cases::{events, setup, single};
use crate::driver::{Change, Driver, End, Step};

/// Publishes `event` and commits; its id.
pub async fn published<D: Driver>(driver: &mut D, event: NewOutboxEvent) -> Uuid {
    let results = driver
        .transaction(vec![Step::One(event)], End::Commit)
        .await;
    match single(&results[0]) {
        PublishOutcome::Published(id) => id,
        other => panic!("expected a new event, got {other:?}"),
    }
}

/// Sets columns of the row `id` by plain SQL (what a dispatcher or time
/// would have done).
pub async fn set(db: &TestDatabase, id: Uuid, assignments: &str) {
    db.conn()
        .await
        .batch_execute(&format!(
            "UPDATE outbox_event SET {assignments} WHERE id = '{id}'"
        ))
        .await
        .unwrap();
}

fn reminder(key: &str) -> NewOutboxEvent {
    NewOutboxEvent::new("tenant-1", "mail.cart.reminder", json!({ "cart": 7 })).dispatch_key(key)
}

async fn status_of(db: &TestDatabase, id: Uuid) -> OutboxStatus {
    events(db)
        .await
        .into_iter()
        .find(|row| row.id == id)
        .unwrap()
        .status
}

/// Cancel by id and by dispatch key: the event goes CANCELLED and its
/// history gets one `cancel` entry with the reason and what the row was
/// (a FAILED row keeps its retries and last error in the entry; every
/// entry its due time).
pub async fn cancel_by_id_or_key_cancels_and_records_history<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let by_id = published(&mut driver, reminder("cart-1").scheduled_at(far_future())).await;
    let by_key = published(&mut driver, reminder("cart-2")).await;
    set(
        &db,
        by_key,
        "status = 'FAILED', retries = 5, last_error = 'smtp refused', failed_at = now()",
    )
    .await;

    let results = driver
        .changes(
            vec![
                Change::Cancel(EventRef::Id(by_id), "order paid"),
                Change::Cancel(EventRef::DispatchKey("cart-2".into()), "cart emptied"),
            ],
            End::Commit,
        )
        .await;

    assert_eq!(
        results.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        [by_id, by_key]
    );
    assert_eq!(status_of(&db, by_id).await, OutboxStatus::Cancelled);
    assert_eq!(status_of(&db, by_key).await, OutboxStatus::Cancelled);
    let mut conn = db.conn().await;
    let first = outbox_store::history(&mut conn, by_id).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(
        (
            first[0].action.as_str(),
            first[0].reason.as_str(),
            first[0].previous_status.as_str(),
            first[0].requested_by.as_deref()
        ),
        ("cancel", "order paid", "PENDING", None)
    );
    assert_eq!(first[0].previous_scheduled_at, Some(far_future()));
    let second = outbox_store::history(&mut conn, by_key).await.unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(
        (
            second[0].previous_status.as_str(),
            second[0].previous_retries,
            second[0].previous_last_error.as_deref()
        ),
        ("FAILED", 5, Some("smtp refused"))
    );
}

/// A cancel and a reschedule in a transaction that rolls back leave the
/// row as it was, with no history entry.
pub async fn a_rolled_back_cancel_or_reschedule_leaves_the_row_untouched<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let cancelled = published(&mut driver, reminder("cart-1")).await;
    let moved = published(&mut driver, reminder("cart-2")).await;
    let before = events(&db).await;

    let results = driver
        .changes(
            vec![
                Change::Cancel(EventRef::Id(cancelled), "order paid"),
                Change::Reschedule(EventRef::Id(moved), far_future(), "later"),
            ],
            End::Rollback,
        )
        .await;

    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(events(&db).await, before);
    let mut conn = db.conn().await;
    for id in [cancelled, moved] {
        assert!(
            outbox_store::history(&mut conn, id)
                .await
                .unwrap()
                .is_empty()
        );
    }
}

/// An instant far ahead, with microseconds.
pub fn far_future() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2031-05-06T07:08:09.123456Z")
        .unwrap()
        .with_timezone(&Utc)
}

/// Cancel refuses an event that is PROCESSING, DONE or CANCELLED with its
/// id and status, an unknown id or key with what was looked for, and a key
/// or reason with NUL before any SQL; none of them aborts the transaction
/// (a cancel after them in the same transaction commits), and no refused
/// row changes.
pub async fn cancel_refusals_are_typed_and_leave_the_transaction_usable<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let processing = published(&mut driver, reminder("cart-1")).await;
    set(
        &db,
        processing,
        "status = 'PROCESSING', locked_until = now() + interval '5 minutes'",
    )
    .await;
    let done = published(&mut driver, reminder("cart-2")).await;
    set(&db, done, "status = 'DONE', processed_at = now()").await;
    let pending = published(&mut driver, reminder("cart-3")).await;
    let unknown = Uuid::now_v7();

    let results = driver
        .changes(
            vec![
                Change::Cancel(EventRef::Id(processing), "r"),
                Change::Cancel(EventRef::DispatchKey("cart-2".into()), "r"),
                Change::Cancel(EventRef::Id(unknown), "r"),
                Change::Cancel(EventRef::DispatchKey("nope".into()), "r"),
                Change::Cancel(EventRef::DispatchKey("a\0b".into()), "r"),
                Change::Cancel(EventRef::Id(pending), "bad \0 reason"),
                Change::Cancel(EventRef::Id(pending), "order paid"),
                Change::Cancel(EventRef::Id(pending), "twice"),
            ],
            End::Commit,
        )
        .await;

    let mut results = results.into_iter();
    let mut next = || results.next().unwrap();
    assert!(matches!(
        next(),
        Err(ChangeError::NotCancellable { event: EventRef::Id(e), id, status: OutboxStatus::Processing })
            if e == processing && id == processing
    ));
    assert!(matches!(
        next(),
        Err(ChangeError::NotCancellable { event: EventRef::DispatchKey(k), id, status: OutboxStatus::Done })
            if k == "cart-2" && id == done
    ));
    assert!(matches!(
        next(),
        Err(ChangeError::NotFound { event: EventRef::Id(e) }) if e == unknown
    ));
    let not_found = next().unwrap_err();
    assert_eq!(
        not_found.to_string(),
        "no outbox event found: the event with dispatch key \"nope\""
    );
    assert!(matches!(
        next(),
        Err(ChangeError::DispatchKeyContainsNul { position: 1 })
    ));
    assert!(matches!(
        next(),
        Err(ChangeError::ReasonContainsNul { position: 4 })
    ));
    assert_eq!(next().unwrap(), pending);
    assert!(matches!(
        next(),
        Err(ChangeError::NotCancellable {
            status: OutboxStatus::Cancelled,
            ..
        })
    ));
    assert_eq!(status_of(&db, processing).await, OutboxStatus::Processing);
    assert_eq!(status_of(&db, done).await, OutboxStatus::Done);
    assert_eq!(status_of(&db, pending).await, OutboxStatus::Cancelled);
}

/// Reschedule by id and by key moves a PENDING event's `scheduled_at`,
/// earlier or later; a PROCESSING event is refused with its status, keeps
/// its schedule and lease and gets no history entry; an unknown one is not
/// found; a reason with NUL is refused before any SQL; none of the refusals
/// aborts the transaction.
pub async fn reschedule_moves_a_pending_event_and_refuses_a_processing_one<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let later = published(&mut driver, reminder("cart-1")).await;
    let sooner = published(&mut driver, reminder("cart-2").scheduled_at(far_future())).await;
    let processing = published(&mut driver, reminder("cart-3")).await;
    set(
        &db,
        processing,
        "status = 'PROCESSING', locked_until = now() + interval '5 minutes'",
    )
    .await;
    let before = events(&db).await;
    let now = Utc::now();

    let results = driver
        .changes(
            vec![
                Change::Reschedule(EventRef::Id(processing), far_future(), "r"),
                Change::Reschedule(EventRef::DispatchKey("nope".into()), far_future(), "r"),
                Change::Reschedule(EventRef::Id(later), far_future(), "bad \0 reason"),
                Change::Reschedule(EventRef::Id(later), far_future(), "r"),
                Change::Reschedule(
                    EventRef::DispatchKey("cart-2".into()),
                    now - TimeDelta::minutes(1),
                    "r",
                ),
            ],
            End::Commit,
        )
        .await;

    let mut results = results.into_iter();
    assert!(matches!(
        results.next().unwrap(),
        Err(ChangeError::NotReschedulable { id, status: OutboxStatus::Processing, .. })
            if id == processing
    ));
    assert!(matches!(
        results.next().unwrap(),
        Err(ChangeError::NotFound { .. })
    ));
    assert!(matches!(
        results.next().unwrap(),
        Err(ChangeError::ReasonContainsNul { position: 4 })
    ));
    assert_eq!(results.next().unwrap().unwrap(), later);
    assert_eq!(results.next().unwrap().unwrap(), sooner);
    let after = events(&db).await;
    let row = |id: Uuid| after.iter().find(|r| r.id == id).unwrap();
    assert_eq!(row(later).scheduled_at, far_future());
    assert_eq!(
        row(sooner).scheduled_at.timestamp_micros(),
        (now - TimeDelta::minutes(1)).timestamp_micros()
    );
    let was = before.iter().find(|r| r.id == processing).unwrap();
    assert_eq!(row(processing), was, "the PROCESSING event is untouched");
    let mut conn = db.conn().await;
    assert!(
        outbox_store::history(&mut conn, processing)
            .await
            .unwrap()
            .is_empty(),
        "a refused reschedule writes no history entry"
    );
}

/// Each reschedule writes one history entry (action `reschedule`) with its
/// reason, no `requested_by`, and what the row was: PENDING, its retries
/// and last error, and the due time it had before (so two reschedules
/// read as a chain: the second entry holds the time the first one set).
pub async fn reschedule_writes_a_history_entry_with_the_reason_and_the_previous_due_time<
    D: Driver,
>() {
    let (db, mut driver) = setup::<D>().await;
    let first_due = far_future() - TimeDelta::days(30);
    let id = published(&mut driver, reminder("cart-1").scheduled_at(first_due)).await;
    set(&db, id, "retries = 2, last_error = 'smtp timeout'").await;

    for (at, reason) in [
        (far_future(), "customer on holiday"),
        (far_future() + TimeDelta::hours(2), "evening slot"),
    ] {
        let moved = driver
            .changes(
                vec![Change::Reschedule(
                    EventRef::DispatchKey("cart-1".into()),
                    at,
                    reason,
                )],
                End::Commit,
            )
            .await;
        assert_eq!(moved[0].as_ref().unwrap(), &id);
    }

    let mut conn = db.conn().await;
    let entries = outbox_store::history(&mut conn, id).await.unwrap();
    let seen: Vec<_> = entries
        .iter()
        .map(|e| {
            (
                e.action.as_str(),
                e.reason.as_str(),
                e.requested_by.as_deref(),
                e.previous_status.as_str(),
                e.previous_retries,
                e.previous_last_error.as_deref(),
                e.previous_scheduled_at,
            )
        })
        .collect();
    // Action, reason, requested by, then what the row was.
    let entry = |reason, due| {
        (
            "reschedule",
            reason,
            None,
            "PENDING",
            2,
            Some("smtp timeout"),
            Some(due),
        )
    };
    assert_eq!(
        seen,
        [
            entry("customer on holiday", first_due),
            entry("evening slot", far_future()),
        ]
    );
    let row = events(&db).await.remove(0);
    assert_eq!(row.scheduled_at, far_future() + TimeDelta::hours(2));
}

/// A reschedule in a transaction that rolls back leaves the event due when
/// it was, and its history empty.
pub async fn a_rolled_back_reschedule_leaves_neither_the_new_time_nor_a_history_entry<D: Driver>() {
    let (db, mut driver) = setup::<D>().await;
    let id = published(&mut driver, reminder("cart-1")).await;
    let before = events(&db).await.remove(0).scheduled_at;

    let results = driver
        .changes(
            vec![Change::Reschedule(EventRef::Id(id), far_future(), "later")],
            End::Rollback,
        )
        .await;

    assert_eq!(
        results[0].as_ref().unwrap(),
        &id,
        "it was moved, then rolled back"
    );
    assert_eq!(events(&db).await.remove(0).scheduled_at, before);
    let mut conn = db.conn().await;
    assert!(
        outbox_store::history(&mut conn, id)
            .await
            .unwrap()
            .is_empty()
    );
}
