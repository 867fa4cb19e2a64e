//! The claim: which rows it takes, which it leaves, and the lease it sets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;

use chrono::TimeDelta;
use common::{database, holding, insert, insert_due, now, row, set, sorted};
use diesel_async::AsyncPgConnection;
use outbox_model::OutboxStatus;
use outbox_store::{claim, due_pending_count};
use uuid::Uuid;

const LEASE_MS: i64 = 60_000;

#[tokio::test]
async fn a_claim_takes_the_oldest_due_rows_up_to_its_limit() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 3).await;

    let claimed = claim(&mut conn, 2, LEASE_MS).await.unwrap();

    let claimed_ids: Vec<Uuid> = claimed.iter().map(|e| e.id).collect();
    assert_eq!(claimed_ids, ids[..2]);
    assert!(claimed.iter().all(|e| e.status == OutboxStatus::Processing));
    assert_eq!(row(&mut conn, ids[2]).await.status, OutboxStatus::Pending);
}

#[tokio::test]
async fn a_claim_skips_rows_not_yet_due() {
    let (_db, mut conn) = database().await;
    let later = insert(&mut conn, "audit.user.login").await;
    set(&mut conn, later, "scheduled_at = now() + interval '1 hour'").await;

    assert!(claim(&mut conn, 10, LEASE_MS).await.unwrap().is_empty());
    assert_eq!(row(&mut conn, later).await.status, OutboxStatus::Pending);
}

#[tokio::test]
async fn a_claim_skips_rows_another_transaction_holds_instead_of_waiting() {
    let (db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 2).await;
    let holder = holding(&db, &ids[..1]).await;

    let claimed = claim(&mut conn, 10, LEASE_MS).await.unwrap();

    assert_eq!(claimed.iter().map(|e| e.id).collect::<Vec<_>>(), [ids[1]]);
    drop(holder);
    assert_eq!(row(&mut conn, ids[0]).await.status, OutboxStatus::Pending);
}

#[tokio::test]
async fn a_claim_takes_back_a_processing_row_whose_lease_expired_and_no_other() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 2).await;
    set(
        &mut conn,
        ids[0],
        "status = 'PROCESSING', locked_until = now() - interval '1 second'",
    )
    .await;
    set(
        &mut conn,
        ids[1],
        "status = 'PROCESSING', locked_until = now() + interval '1 hour'",
    )
    .await;
    let before = now(&mut conn).await;

    let claimed = claim(&mut conn, 10, LEASE_MS).await.unwrap();

    assert_eq!(claimed.iter().map(|e| e.id).collect::<Vec<_>>(), [ids[0]]);
    assert!(claimed[0].locked_until.unwrap() > before, "a fresh lease");
}

#[tokio::test]
async fn a_claim_never_takes_done_failed_or_cancelled_rows() {
    let (_db, mut conn) = database().await;
    for status in ["DONE", "FAILED", "CANCELLED"] {
        let id = insert(&mut conn, "audit.user.login").await;
        set(&mut conn, id, &format!("status = '{status}'")).await;
    }

    assert!(claim(&mut conn, 10, LEASE_MS).await.unwrap().is_empty());
}

#[tokio::test]
async fn every_row_of_a_claim_gets_one_lease_of_lease_ms_from_the_claim() {
    let (_db, mut conn) = database().await;
    insert_due(&mut conn, 3).await;

    let before = now(&mut conn).await;
    let claimed = claim(&mut conn, 10, LEASE_MS).await.unwrap();
    let after = now(&mut conn).await;

    let leases: HashSet<_> = claimed.iter().map(|e| e.locked_until).collect();
    assert_eq!(leases.len(), 1, "one lease for the whole claim");
    let lease = claimed[0].locked_until.unwrap();
    let length = TimeDelta::milliseconds(LEASE_MS);
    assert!(
        before + length <= lease && lease <= after + length,
        "{lease} not {LEASE_MS} ms after the claim ({before} .. {after})"
    );
}

#[tokio::test]
async fn concurrent_claims_hand_each_row_to_one_claimer() {
    let (db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 40).await;
    let mut claimers = Vec::new();
    for _ in 0..4 {
        claimers.push(db.conn().await);
    }

    let claims = futures::future::join_all(claimers.iter_mut().map(claim_until_empty)).await;

    let all: Vec<Uuid> = claims.into_iter().flatten().collect();
    assert_eq!(sorted(all), sorted(ids), "every row once, none twice");
}

#[tokio::test]
async fn due_pending_count_counts_only_pending_rows_that_are_due() {
    let (_db, mut conn) = database().await;
    let ids = insert_due(&mut conn, 5).await;
    set(
        &mut conn,
        ids[2],
        "scheduled_at = now() + interval '1 hour'",
    )
    .await;
    set(
        &mut conn,
        ids[3],
        "status = 'PROCESSING', locked_until = now() - interval '1 second'",
    )
    .await;
    set(&mut conn, ids[4], "status = 'DONE'").await;

    assert_eq!(due_pending_count(&mut conn).await.unwrap(), 2);
}

/// Claims 3 rows at a time until a claim comes back empty; every id claimed.
async fn claim_until_empty(conn: &mut AsyncPgConnection) -> Vec<Uuid> {
    let mut ids = Vec::new();
    loop {
        let claimed = claim(conn, 3, LEASE_MS).await.unwrap();
        if claimed.is_empty() {
            return ids;
        }
        ids.extend(claimed.iter().map(|e| e.id));
    }
}
