//! Dedupe windows as the table enforces them, for any producer: plain-SQL
//! inserts that set the window columns themselves, and the release of an
//! expired holder's key by the insert trigger.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{database, row, set};
use diesel::sql_types::{Text, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AnsiTransactionManager, AsyncPgConnection, RunQueryDsl, TransactionManager};
use outbox_model::NewOutboxEventRow;
use outbox_store::ErrorKind;
use uuid::Uuid;

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// A plain-SQL producer's insert of a keyed event with `window` (SQL of
/// the window columns), skipping on a held key as the publisher does.
async fn plain_insert(
    conn: &mut AsyncPgConnection,
    key: &str,
    window: Option<&str>,
) -> Option<Uuid> {
    let (columns, values) = window.map_or(("", ""), |w| (", dedupe_for, dedupe_while_pending", w));
    diesel::sql_query(format!(
        "INSERT INTO outbox_event (tenant_id, event_type, payload, dispatch_key{columns}) \
         VALUES ('acme', 'mail.cart.reminder', '{{}}', $1{values}) \
         ON CONFLICT DO NOTHING RETURNING id"
    ))
    .bind::<Text, _>(key)
    .get_result::<Id>(conn)
    .await
    .optional()
    .unwrap()
    .map(|row| row.id)
}

/// A handed-off (DONE) row holding `key` with a `WhilePending` window,
/// inserted by plain SQL: its window has passed.
async fn expired_holder(conn: &mut AsyncPgConnection, key: &str) -> Uuid {
    let holder = plain_insert(conn, key, Some(", NULL, true")).await.unwrap();
    set(conn, holder, "status = 'DONE', processed_at = now()").await;
    holder
}

/// Each window a plain-SQL producer sets: a second insert is skipped
/// while the window lasts; once it has passed (the holder handed off, or
/// its `created_at` moved back by the window), the next insert is written
/// and takes the key, the old row keeping it in `released_dispatch_key`.
#[tokio::test]
async fn a_plain_sql_insert_honours_the_window_it_sets() {
    let (_db, mut conn) = database().await;
    let cases = [
        (
            "while pending",
            ", NULL, true",
            "status = 'DONE', processed_at = now()",
        ),
        (
            "for 10 minutes",
            ", interval '10 minutes', false",
            "created_at = now() - interval '10 minutes'",
        ),
    ];
    for (name, window, expire) in cases {
        let key = format!("cart-{name}");
        let holder = plain_insert(&mut conn, &key, Some(window)).await.unwrap();
        assert_eq!(
            plain_insert(&mut conn, &key, Some(window)).await,
            None,
            "{name}"
        );
        set(&mut conn, holder, expire).await;

        let next = plain_insert(&mut conn, &key, None).await.unwrap();

        let old = row(&mut conn, holder).await;
        assert_eq!(
            (old.dispatch_key, old.released_dispatch_key.as_deref()),
            (None, Some(key.as_str())),
            "{name}"
        );
        assert_eq!(
            row(&mut conn, next).await.dispatch_key.as_deref(),
            Some(key.as_str()),
            "{name}"
        );
    }
}

/// Without ON CONFLICT a held key is a unique violation, as before the
/// windows; a released one is not.
#[tokio::test]
async fn a_plain_insert_without_on_conflict_fails_or_is_skipped_only_while_the_key_is_held() {
    let (_db, mut conn) = database().await;
    let holder = plain_insert(&mut conn, "cart-1", Some(", NULL, true"))
        .await
        .unwrap();
    let insert = "INSERT INTO outbox_event (tenant_id, event_type, payload, dispatch_key) \
                  VALUES ('acme', 'mail.cart.reminder', '{}', 'cart-1')";
    let held = diesel::sql_query(insert).execute(&mut conn).await;
    if outbox_store::partitioning(&mut conn)
        .await
        .unwrap()
        .is_some()
    {
        // A partitioned table skips the row (its key trigger cannot tell
        // whether the statement says ON CONFLICT).
        assert_eq!(held.unwrap(), 0, "the row is skipped");
    } else {
        assert_eq!(
            outbox_store::StoreError::from(held.unwrap_err()).kind(),
            ErrorKind::UniqueViolation
        );
    }
    set(&mut conn, holder, "status = 'CANCELLED'").await;

    diesel::sql_query(insert).execute(&mut conn).await.unwrap();
}

/// Retention frees the key of a DONE row it deletes, whatever its window
/// (the row and its key are gone), and a window that has not passed does
/// not keep the row from retention.
#[tokio::test]
async fn retention_deleting_a_done_holder_frees_its_key_within_its_window() {
    let (_db, mut conn) = database().await;
    let holder = plain_insert(&mut conn, "cart-1", Some(", interval '1 day', false"))
        .await
        .unwrap();
    set(
        &mut conn,
        holder,
        "status = 'DONE', processed_at = now() - interval '2 hours'",
    )
    .await;
    assert_eq!(plain_insert(&mut conn, "cart-1", None).await, None);

    let purged = outbox_store::purge_done_batch(&mut conn, 3600.0, 100, None)
        .await
        .unwrap();

    assert_eq!(purged.deleted, 1);
    assert!(plain_insert(&mut conn, "cart-1", None).await.is_some());
}

/// An unkeyed insert releases nothing, even beside expired holders.
#[tokio::test]
async fn an_unkeyed_insert_leaves_expired_holders_alone() {
    let (_db, mut conn) = database().await;
    let holder = expired_holder(&mut conn, "cart-1").await;

    diesel::sql_query(
        "INSERT INTO outbox_event (tenant_id, event_type, payload) \
         VALUES ('acme', 'mail.cart.reminder', '{}')",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    let holder = row(&mut conn, holder).await;
    assert_eq!(
        (
            holder.dispatch_key.as_deref(),
            holder.released_dispatch_key.as_deref()
        ),
        (Some("cart-1"), None)
    );
}

/// Two transactions that insert the same released key at once: the
/// second waits on the holder's row, then finds the key taken by the
/// first one's row and skips (no error, one holder of the key).
#[tokio::test]
async fn two_inserts_racing_for_a_released_key_leave_one_holder() {
    let (db, mut conn) = database().await;
    let holder = expired_holder(&mut conn, "cart-1").await;
    let mut first = db.conn().await;
    AnsiTransactionManager::begin_transaction(&mut first)
        .await
        .unwrap();
    let taken = plain_insert(&mut first, "cart-1", None).await.unwrap();

    let second = tokio::spawn({
        let mut conn = db.conn().await;
        async move { plain_insert(&mut conn, "cart-1", None).await }
    });
    outbox_test_support::eventually("the second insert waits on a lock", WAIT, async || {
        waiting_on_locks(&mut conn).await > 0
    })
    .await;
    AnsiTransactionManager::commit_transaction(&mut first)
        .await
        .unwrap();

    assert_eq!(second.await.unwrap(), None);
    assert_eq!(
        row(&mut conn, taken).await.dispatch_key.as_deref(),
        Some("cart-1")
    );
    assert_eq!(
        row(&mut conn, holder)
            .await
            .released_dispatch_key
            .as_deref(),
        Some("cart-1")
    );
}

const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Sessions of this database waiting on a lock.
async fn waiting_on_locks(conn: &mut AsyncPgConnection) -> i64 {
    diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .get_result::<Count>(conn)
    .await
    .unwrap()
    .n
}

/// A replace-mode insert that meets a PROCESSING holder leaves it alone
/// (the holder's id comes back as existing) and does not lock it: the
/// dispatcher's hand-off record of the holder lands while the publishing
/// transaction is still open.
#[tokio::test]
async fn a_replace_meeting_a_processing_holder_leaves_it_alone_and_its_hand_off_lands_meanwhile() {
    let (db, mut conn) = database().await;
    let keyed = |payload| NewOutboxEventRow {
        id: Uuid::now_v7(),
        dispatch_key: Some("idx-7".to_owned()),
        payload,
        replace_pending: true,
        ..common::new_row("search.product.updated")
    };
    let holder = common::insert_row(&mut conn, keyed(serde_json::json!({ "v": 1 }))).await;
    let claimed = outbox_store::claim(&mut conn, 10, 60_000).await.unwrap();
    let lease = outbox_store::Lease::of(&claimed[0]).unwrap();
    let mut publisher = db.conn().await;
    AnsiTransactionManager::begin_transaction(&mut publisher)
        .await
        .unwrap();
    let replaced = outbox_store::insert_event(&publisher, &keyed(serde_json::json!({ "v": 2 })))
        .await
        .unwrap();
    assert_eq!(replaced, outbox_store::Inserted::Existing(holder));

    let done = outbox_store::mark_done(&mut conn, &[(lease, "search".to_owned())])
        .await
        .unwrap();
    assert_eq!(
        done,
        [holder],
        "recorded while the publisher's transaction is open"
    );
    AnsiTransactionManager::commit_transaction(&mut publisher)
        .await
        .unwrap();
    let row = row(&mut conn, holder).await;
    assert_eq!(row.status, outbox_model::OutboxStatus::Done);
    assert_eq!(row.payload.value().unwrap(), serde_json::json!({ "v": 1 }));
}
