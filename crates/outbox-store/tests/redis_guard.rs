//! The Redis guard's tables: the remembered marker, each queue's safe
//! point, the reconciliation a loss makes due, and its lease.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use chrono::{DateTime, TimeDelta, Utc};
use common::{database, now};
use diesel_async::AsyncPgConnection;
use outbox_store::{
    EpochRow, SafePointRow, advance_drained, advance_pending, ensure_safe_points, mark_pending,
    release_reconcile_lease, remembered_epoch, renew_reconcile_lease, safe_points, save_epoch,
    take_reconcile_lease,
};
use uuid::Uuid;

const NS: &str = "outbox";

/// A namespace whose marker `epoch` is remembered, with the safe point of
/// `outbox.mail` at `floor`.
async fn guarded(conn: &mut AsyncPgConnection, epoch: Uuid, floor: DateTime<Utc>) {
    save_epoch(conn, NS, epoch, "run-1").await.unwrap();
    ensure_safe_points(conn, NS, &["outbox.mail".to_owned()], floor)
        .await
        .unwrap();
}

/// A guarded namespace whose `outbox.mail` is due a reconciliation from
/// its safe point, now: that instant and the remembered epoch.
async fn reconciling(conn: &mut AsyncPgConnection) -> (DateTime<Utc>, Uuid) {
    let drained = now(conn).await;
    let epoch = Uuid::new_v4();
    guarded(conn, epoch, drained).await;
    mark_pending(conn, NS, drained).await.unwrap();
    (drained, epoch)
}

/// `advance_pending` of `outbox.mail`, with the epoch read before the batch.
async fn advance_mail(
    conn: &mut AsyncPgConnection,
    epoch: Uuid,
    from: (DateTime<Utc>, Option<Uuid>),
    to: Option<(DateTime<Utc>, Uuid)>,
) -> bool {
    advance_pending(conn, NS, "outbox.mail", epoch, from, to)
        .await
        .unwrap()
}

async fn mail_point(conn: &mut AsyncPgConnection) -> SafePointRow {
    let points = safe_points(conn, NS).await.unwrap();
    assert_eq!(points.len(), 1, "{points:?}");
    points[0].clone()
}

#[tokio::test]
async fn the_last_saved_epoch_of_a_namespace_is_remembered() {
    let (_db, mut conn) = database().await;
    let (first, second) = (Uuid::new_v4(), Uuid::new_v4());
    assert_eq!(remembered_epoch(&mut conn, NS).await.unwrap(), None);

    save_epoch(&mut conn, NS, first, "run-1").await.unwrap();
    save_epoch(&mut conn, NS, second, "run-2").await.unwrap();
    save_epoch(&mut conn, "other", first, "run-9")
        .await
        .unwrap();

    let EpochRow { epoch, run_id, .. } = remembered_epoch(&mut conn, NS).await.unwrap().unwrap();
    assert_eq!((epoch, run_id.as_str()), (second, "run-2"));
}

#[tokio::test]
async fn a_safe_point_is_created_once_at_its_floor() {
    let (_db, mut conn) = database().await;
    let floor = now(&mut conn).await;
    guarded(&mut conn, Uuid::new_v4(), floor).await;

    let later = floor + TimeDelta::hours(1);
    ensure_safe_points(&mut conn, NS, &["outbox.mail".to_owned()], later)
        .await
        .unwrap();

    let point = mail_point(&mut conn).await;
    assert_eq!(point.drained_before, floor);
    assert_eq!((point.pending_since, point.pending_after_id), (None, None));
}

#[tokio::test]
async fn a_safe_point_moves_only_forward_and_only_under_the_remembered_epoch() {
    let (_db, mut conn) = database().await;
    let (epoch, floor) = (Uuid::new_v4(), now(&mut conn).await);
    guarded(&mut conn, epoch, floor).await;
    let ahead = floor + TimeDelta::minutes(5);

    advance_drained(&mut conn, NS, "outbox.mail", epoch, ahead)
        .await
        .unwrap();
    assert_eq!(mail_point(&mut conn).await.drained_before, ahead);

    advance_drained(&mut conn, NS, "outbox.mail", epoch, floor)
        .await
        .unwrap();
    assert_eq!(
        mail_point(&mut conn).await.drained_before,
        ahead,
        "never back"
    );

    let further = ahead + TimeDelta::minutes(5);
    advance_drained(&mut conn, NS, "outbox.mail", Uuid::new_v4(), further)
        .await
        .unwrap();
    assert_eq!(
        mail_point(&mut conn).await.drained_before,
        ahead,
        "a newer marker"
    );
}

#[tokio::test]
async fn a_loss_makes_a_reconciliation_due_from_the_safe_point_and_holds_the_point() {
    let (_db, mut conn) = database().await;
    let (epoch, drained) = (Uuid::new_v4(), now(&mut conn).await);
    guarded(&mut conn, epoch, drained).await;

    let earlier_floor = drained - TimeDelta::hours(1);
    let due = mark_pending(&mut conn, NS, earlier_floor).await.unwrap();

    assert_eq!(due, [mail_point(&mut conn).await]);
    assert_eq!(
        (due[0].pending_since, due[0].pending_after_id),
        (Some(drained), None)
    );
    let ahead = drained + TimeDelta::minutes(5);
    advance_drained(&mut conn, NS, "outbox.mail", epoch, ahead)
        .await
        .unwrap();
    assert_eq!(
        mail_point(&mut conn).await.drained_before,
        drained,
        "held while the reconciliation is due"
    );
}

#[tokio::test]
async fn a_second_loss_restarts_a_reconciliation_from_the_safe_point() {
    let (_db, mut conn) = database().await;
    let (drained, epoch) = reconciling(&mut conn).await;
    let cursor = (drained + TimeDelta::seconds(1), Uuid::new_v4());
    let from = (drained, None);
    assert!(advance_mail(&mut conn, epoch, from, Some(cursor)).await);

    let again = mark_pending(&mut conn, NS, drained).await.unwrap();

    let restarted = (again[0].pending_since, again[0].pending_after_id);
    assert_eq!(restarted, (Some(drained), None));
}

// Break checked: keeping the cursor's id when its instant is the safe
// point's (as the statement did) leaves `pending_after_id` set, and the
// rows of that instant up to it, pushed again into the Redis that was
// just lost, would be skipped.
#[tokio::test]
async fn a_second_loss_while_the_cursor_is_within_the_safe_points_instant_restarts_that_instant() {
    let (_db, mut conn) = database().await;
    let (drained, epoch) = reconciling(&mut conn).await;
    // The first batch re-pushed the rows of one DONE statement, all with
    // `processed_at` at the safe point, up to this id.
    let cursor = (drained, Uuid::new_v4());
    assert!(advance_mail(&mut conn, epoch, (drained, None), Some(cursor)).await);

    let again = mark_pending(&mut conn, NS, drained).await.unwrap();

    let restarted = (again[0].pending_since, again[0].pending_after_id);
    assert_eq!(
        restarted,
        (Some(drained), None),
        "the rows re-pushed before the second loss are pushed again"
    );
}

// A first batch reads the window from its start, (drained, NULL). A second
// loss noticed while it pushes leaves the cursor exactly so (the window
// starts at the same safe point), yet the jobs the batch pushed went with
// that loss: the batch's advance must not move the cursor past them.
// Break checked: `advance_pending` without its epoch condition moves the
// cursor to the batch's end: the assertion fails.
#[tokio::test]
async fn a_loss_during_a_first_batch_keeps_the_cursor_at_the_windows_start() {
    let (_db, mut conn) = database().await;
    let (drained, epoch) = reconciling(&mut conn).await;
    // The batch reads its rows and pushes them; meanwhile a check notices
    // a second loss: a new epoch, the same window.
    save_epoch(&mut conn, NS, Uuid::new_v4(), "run-2")
        .await
        .unwrap();
    mark_pending(&mut conn, NS, drained).await.unwrap();

    let cursor = (drained + TimeDelta::seconds(1), Uuid::new_v4());
    assert!(
        !advance_mail(&mut conn, epoch, (drained, None), Some(cursor)).await,
        "the batch's advance moved the cursor past jobs the second loss took"
    );
    let point = mail_point(&mut conn).await;
    assert_eq!(
        (point.pending_since, point.pending_after_id),
        (Some(drained), None)
    );
}

#[tokio::test]
async fn a_reconciliation_cursor_moves_only_from_where_it_stands() {
    let (_db, mut conn) = database().await;
    let (drained, epoch) = reconciling(&mut conn).await;
    let cursor = (drained + TimeDelta::seconds(1), Uuid::new_v4());

    let stale = (drained - TimeDelta::seconds(1), None);
    assert!(!advance_mail(&mut conn, epoch, stale, Some(cursor)).await);
    assert!(advance_mail(&mut conn, epoch, (drained, None), Some(cursor)).await);
    let point = mail_point(&mut conn).await;
    assert_eq!(
        (point.pending_since, point.pending_after_id),
        (Some(cursor.0), Some(cursor.1))
    );

    let from = (cursor.0, Some(cursor.1));
    assert!(advance_mail(&mut conn, epoch, from, None).await);
    let point = mail_point(&mut conn).await;
    assert_eq!(
        (point.pending_since, point.pending_after_id),
        (None, None),
        "done"
    );
}

#[tokio::test]
async fn the_reconcile_lease_has_one_holder_until_it_is_given_back() {
    let (db, mut conn) = database().await;
    let floor = now(&mut conn).await;
    guarded(&mut conn, Uuid::new_v4(), floor).await;
    let mut other = db.conn().await;

    let held = take_reconcile_lease(&mut conn, NS, 60_000).await.unwrap();
    assert!(held.is_some());
    assert!(
        take_reconcile_lease(&mut other, NS, 60_000)
            .await
            .unwrap()
            .is_none()
    );

    release_reconcile_lease(&mut conn, NS, held.unwrap())
        .await
        .unwrap();
    assert!(
        take_reconcile_lease(&mut other, NS, 60_000)
            .await
            .unwrap()
            .is_some()
    );
}

// Break checked: with renew and release fenced by the namespace alone (as
// they were), the first holder's release frees the second's lease and a
// third takes it beside the second.
#[tokio::test]
async fn a_holder_whose_reconcile_lease_ran_out_neither_renews_nor_frees_the_next_holders() {
    let (db, mut conn) = database().await;
    let floor = now(&mut conn).await;
    guarded(&mut conn, Uuid::new_v4(), floor).await;
    let (mut second, mut third) = (db.conn().await, db.conn().await);

    let mut stale = take_reconcile_lease(&mut conn, NS, 1)
        .await
        .unwrap()
        .unwrap();
    // The second holder takes the lease once the first one's has run out.
    let mut taken = None;
    outbox_test_support::eventually(
        "the first lease to run out",
        std::time::Duration::from_secs(10),
        async || {
            taken = take_reconcile_lease(&mut second, NS, 60_000).await.unwrap();
            taken.is_some()
        },
    )
    .await;
    let mut next = taken.unwrap();

    assert!(
        !renew_reconcile_lease(&mut conn, NS, &mut stale, 60_000)
            .await
            .unwrap(),
        "the first holder learns it lost the lease"
    );
    release_reconcile_lease(&mut conn, NS, stale).await.unwrap();
    assert!(
        take_reconcile_lease(&mut third, NS, 60_000)
            .await
            .unwrap()
            .is_none(),
        "the second holder still holds it"
    );
    assert!(
        renew_reconcile_lease(&mut second, NS, &mut next, 60_000)
            .await
            .unwrap()
    );
}
