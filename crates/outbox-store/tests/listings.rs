//! The operator's reads: listings by filter (`outbox list`, requeue by
//! filters) and the lookups of one row (`outbox show`, the probes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{database, insert, insert_due, insert_row, insert_with, new_row, now, sorted};
use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use outbox_store::{
    EventFilter, EventKey, candidate, count_events, count_events_up_to, delivery_state, event,
    list_candidates, list_events, statuses, summary,
};
use uuid::Uuid;

/// The ids `filter` lists, in the listing's order.
async fn listed(conn: &mut AsyncPgConnection, filter: &EventFilter, limit: i64) -> Vec<Uuid> {
    let rows = list_events(conn, filter, limit).await.unwrap();
    rows.iter().map(|e| e.id).collect()
}

#[tokio::test]
async fn a_listing_returns_the_oldest_matching_rows_up_to_its_limit() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 3).await;

    assert_eq!(
        listed(&mut conn, &EventFilter::default(), 2).await,
        ids[..2]
    );
    assert_eq!(
        count_events(&mut conn, &EventFilter::default())
            .await
            .unwrap(),
        3
    );
}

#[tokio::test]
async fn a_capped_count_gives_the_count_up_to_its_cap_and_none_past_it() {
    let (_db, mut conn) = database().await;
    insert_due(&mut conn, 5).await;
    insert(&mut conn, "mail.user.welcome").await;
    let all = EventFilter::default();
    let count = async |conn: &mut AsyncPgConnection, filter: &EventFilter, cap| {
        count_events_up_to(conn, filter, cap).await.unwrap()
    };
    assert_eq!(count(&mut conn, &all, 6).await, Some(6));
    assert_eq!(count(&mut conn, &all, 100).await, Some(6));
    assert_eq!(count(&mut conn, &all, 5).await, None);
    let mail = EventFilter {
        type_prefix: Some("mail.".to_owned()),
        ..EventFilter::default()
    };
    assert_eq!(count(&mut conn, &mail, 1).await, Some(1));
    assert_eq!(count(&mut conn, &mail, 0).await, None);
}

#[tokio::test]
async fn a_listing_filters_by_status_tenant_and_type_prefix() {
    let (_db, mut conn) = database().await;
    let mail = insert(&mut conn, "mail.user.welcome").await;
    let audit = insert(&mut conn, "audit.user.login").await;
    let failed = insert_with(&mut conn, "status = 'FAILED'").await;
    let other_tenant = insert_row(
        &mut conn,
        outbox_model::NewOutboxEventRow {
            tenant_id: "globex".to_owned(),
            ..new_row("mail.user.welcome")
        },
    )
    .await;

    let only = |f: fn(&mut EventFilter)| {
        let mut filter = EventFilter::default();
        f(&mut filter);
        filter
    };
    let by_status = only(|f| f.statuses = vec![OutboxStatus::Failed]);
    let by_tenant = only(|f| f.tenant = Some("globex".to_owned()));
    let by_type = only(|f| f.type_prefix = Some("mail.".to_owned()));
    assert_eq!(listed(&mut conn, &by_status, 10).await, [failed]);
    assert_eq!(listed(&mut conn, &by_tenant, 10).await, [other_tenant]);
    assert_eq!(
        sorted(listed(&mut conn, &by_type, 10).await),
        sorted(vec![mail, other_tenant])
    );
    assert_eq!(count_events(&mut conn, &by_type).await.unwrap(), 2);
    assert!(!listed(&mut conn, &by_type, 10).await.contains(&audit));
}

#[tokio::test]
async fn a_type_prefix_is_taken_literally_not_as_a_pattern() {
    let (_db, mut conn) = database().await;
    insert(&mut conn, "mail.users.welcome").await;

    for pattern in ["mail.user_", "%.welcome", "mail.users%"] {
        let filter = EventFilter {
            type_prefix: Some(pattern.to_owned()),
            ..EventFilter::default()
        };
        assert_eq!(
            count_events(&mut conn, &filter).await.unwrap(),
            0,
            "{pattern}"
        );
    }
}

#[tokio::test]
async fn a_listing_filters_by_creation_time_and_by_failure_time_only_failed_rows() {
    let (_db, mut conn) = database().await;
    let week_ago = insert_with(&mut conn, "created_at = now() - interval '7 days'").await;
    let recent = insert(&mut conn, "audit.user.login").await;
    let failed_yesterday = insert_with(
        &mut conn,
        "status = 'FAILED', failed_at = now() - interval '1 day', created_at = now() - interval '2 days'",
    )
    .await;
    // A requeue clears failed_at, so only FAILED rows carry one; a row of
    // another status with a stale failed_at is not a failure.
    insert_with(&mut conn, "failed_at = now() - interval '1 day'").await;
    let three_days_ago = now(&mut conn).await - chrono::TimeDelta::days(3);

    let created_since = EventFilter {
        created_after: Some(three_days_ago),
        ..EventFilter::default()
    };
    let created_before = EventFilter {
        created_before: Some(three_days_ago),
        ..EventFilter::default()
    };
    let failed_since = EventFilter {
        failed_after: Some(three_days_ago),
        ..EventFilter::default()
    };
    assert!(
        !listed(&mut conn, &created_since, 10)
            .await
            .contains(&week_ago)
    );
    assert!(
        listed(&mut conn, &created_since, 10)
            .await
            .contains(&recent)
    );
    assert_eq!(listed(&mut conn, &created_before, 10).await, [week_ago]);
    assert_eq!(
        listed(&mut conn, &failed_since, 10).await,
        [failed_yesterday]
    );
}

#[tokio::test]
async fn candidates_carry_the_columns_the_requeue_policy_reads() {
    let (_db, mut conn) = database().await;
    let id = insert_with(
        &mut conn,
        "status = 'FAILED', retries = 3, last_error = 'gone'",
    )
    .await;

    let one = candidate(&mut conn, id).await.unwrap().unwrap();
    let listed = list_candidates(&mut conn, &EventFilter::default(), 10)
        .await
        .unwrap();

    assert_eq!(listed, std::slice::from_ref(&one));
    assert_eq!(
        (one.id, one.tenant_id.as_str(), one.event_type.as_str()),
        (id, "acme", "audit.user.login")
    );
    assert_eq!(
        (one.status, one.retries, one.last_error.as_deref()),
        (OutboxStatus::Failed, 3, Some("gone"))
    );
}

#[tokio::test]
async fn a_row_is_found_by_its_id_or_its_dispatch_key() {
    let (_db, mut conn) = database().await;
    let id = insert_row(
        &mut conn,
        outbox_model::NewOutboxEventRow {
            dispatch_key: Some("order-42".to_owned()),
            ..new_row("mail.order.shipped")
        },
    )
    .await;
    common::set(
        &mut conn,
        id,
        "retries = 2, last_error = 'busy', target_queue = 'outbox.mail'",
    )
    .await;

    let by_id = summary(&mut conn, EventKey::Id(id)).await.unwrap().unwrap();
    let by_key = summary(&mut conn, EventKey::DispatchKey("order-42"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(by_id, by_key);
    assert_eq!(
        (by_id.id, by_id.event_type.as_str(), by_id.status),
        (id, "mail.order.shipped", OutboxStatus::Pending)
    );
    let state = delivery_state(&mut conn, EventKey::DispatchKey("order-42"))
        .await
        .unwrap()
        .unwrap();
    let stored = event(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(
        (
            state.status,
            state.retries,
            state.last_error,
            state.target_queue,
            state.scheduled_at
        ),
        (
            stored.status,
            2,
            Some("busy".to_owned()),
            Some("outbox.mail".to_owned()),
            stored.scheduled_at
        )
    );
}

#[tokio::test]
async fn lookups_of_a_row_that_does_not_exist_find_nothing() {
    let (_db, mut conn) = database().await;
    let missing = Uuid::now_v7();

    assert_eq!(event(&mut conn, missing).await.unwrap(), None);
    assert_eq!(candidate(&mut conn, missing).await.unwrap(), None);
    assert_eq!(
        summary(&mut conn, EventKey::Id(missing)).await.unwrap(),
        None
    );
    let by_key = EventKey::DispatchKey("no-such-key");
    assert_eq!(delivery_state(&mut conn, by_key).await.unwrap(), None);
    assert!(statuses(&mut conn, &[missing]).await.unwrap().is_empty());
}

#[tokio::test]
async fn statuses_reports_the_status_of_each_row_that_exists() {
    let (_db, mut conn) = database().await;
    let pending = insert(&mut conn, "audit.user.login").await;
    let done = insert_with(&mut conn, "status = 'DONE'").await;

    let mut found = statuses(&mut conn, &[pending, done, Uuid::now_v7()])
        .await
        .unwrap();
    found.sort_by_key(|(id, _)| *id);

    let mut expected = vec![(pending, OutboxStatus::Pending), (done, OutboxStatus::Done)];
    expected.sort_by_key(|(id, _)| *id);
    assert_eq!(found, expected);
}

#[tokio::test]
async fn a_listing_finds_one_row_by_id_by_dispatch_key_or_by_ordering_key() {
    let (_db, mut conn) = database().await;
    let keyed = insert_with(&mut conn, "dispatch_key = 'order-7'").await;
    let ordered = insert_with(&mut conn, "ordering_key = 'customer-3'").await;
    let other = insert(&mut conn, "audit.user.login").await;

    let by_id = EventFilter {
        id: Some(other),
        ..EventFilter::default()
    };
    let by_dispatch_key = EventFilter {
        dispatch_key: Some("order-7".into()),
        ..EventFilter::default()
    };
    let by_ordering_key = EventFilter {
        ordering_key: Some("customer-3".into()),
        ..EventFilter::default()
    };
    assert_eq!(listed(&mut conn, &by_id, 10).await, [other]);
    assert_eq!(listed(&mut conn, &by_dispatch_key, 10).await, [keyed]);
    assert_eq!(listed(&mut conn, &by_ordering_key, 10).await, [ordered]);
}
