//! Events whose type no routing rule matches, during a rolling deploy: an
//! old dispatcher (no route for the type) and a new one (with the route)
//! on the same table. The event waits for a route during its grace period
//! and the new dispatcher hands it off; once dead-lettered, the new one
//! requeues it without an operator.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, quick_config};
use outbox_dispatch::{DispatcherConfig, Router, revive_routable};
use outbox_model::OutboxStatus;
use tokio_util::sync::CancellationToken;

/// The event type only the new version routes.
const NEW_TYPE: &str = "reports.report.generated";

/// The old version's routes: the standard table.
fn old_routes() -> Router {
    outbox_catalog::standard_router().unwrap()
}

/// The new version's routes: the standard table plus `reports.` to the
/// audit queue.
fn new_routes() -> Router {
    outbox_catalog::standard_router()
        .unwrap()
        .with_rule("reports.", "outbox.audit")
        .unwrap()
}

/// Each claim of a waiting event comes due again at once, so that the test
/// need not wait out the recheck interval.
fn rechecking_at_once(grace: Duration) -> DispatcherConfig {
    DispatcherConfig {
        unrouted_grace: grace,
        unrouted_recheck: Duration::from_millis(1),
        ..quick_config()
    }
}

#[tokio::test]
async fn an_unrouted_event_waits_pending_through_its_grace_period_and_the_dispatcher_with_the_route_hands_it_off()
 {
    let h = Harness::new().await;
    let id = h.publish_one(NEW_TYPE).await;
    let config = rechecking_at_once(Duration::from_secs(600));
    let old = h.dispatcher_with(old_routes(), config.clone());
    let new = h.dispatcher_with(new_routes(), config);

    let before = h.db_now().await;
    let report = old.tick().await.unwrap();
    assert_eq!(
        (
            report.claimed,
            report.waiting_for_route,
            report.unrouted,
            report.lost_leases
        ),
        (1, 1, 0, 0),
        "{report:?}"
    );
    let waiting = h.row(id).await;
    assert_eq!(waiting.status, OutboxStatus::Pending, "not dead-lettered");
    assert_eq!(waiting.retries, 0, "waiting for a route is not an attempt");
    let since = waiting.unrouted_since.expect("the first wait is stamped");
    assert!(since >= before, "{since} < {before}");
    let error = waiting.last_error.as_deref().unwrap();
    assert!(
        error.contains("no routing rule")
            && error.contains(NEW_TYPE)
            && error.contains("waiting for a route until"),
        "{error}"
    );

    // Claimed again by the old version: still waiting, from the same start.
    h.wait_for(
        "the waiting event to come due",
        Duration::from_secs(10),
        async || old.tick().await.unwrap().waiting_for_route == 1,
    )
    .await;
    assert_eq!(
        h.row(id).await.unrouted_since,
        Some(since),
        "the grace period does not restart"
    );
    assert!(
        h.task_ids("outbox.audit").await.is_empty(),
        "nothing was pushed"
    );

    // The new version has the route.
    h.wait_for(
        "the new dispatcher to hand it off",
        Duration::from_secs(10),
        async || new.tick().await.unwrap().dispatched == 1,
    )
    .await;
    let done = h.row(id).await;
    assert_eq!(done.status, OutboxStatus::Done);
    assert_eq!(done.target_queue.as_deref(), Some("outbox.audit"));
    assert_eq!(
        done.unrouted_since, None,
        "a routed event is no longer counted as unrouted"
    );
    assert_eq!(h.task_ids("outbox.audit").await.len(), 1);
}

#[tokio::test]
async fn after_its_grace_period_an_unrouted_event_is_failed_and_the_dispatcher_with_the_route_requeues_it_without_an_operator()
 {
    let h = Harness::new().await;
    let id = h.publish_one(NEW_TYPE).await;
    let old = h.dispatcher_with(old_routes(), rechecking_at_once(Duration::ZERO));
    let new = h.dispatcher_with(new_routes(), rechecking_at_once(Duration::ZERO));

    let report = old.tick().await.unwrap();
    assert_eq!(
        (report.unrouted, report.waiting_for_route),
        (1, 0),
        "{report:?}"
    );
    let failed = h.row(id).await;
    assert_eq!(failed.status, OutboxStatus::Failed);
    assert!(failed.unrouted_since.is_some(), "marked FAILED (unrouted)");

    let mut conn = h.conn().await;
    assert_eq!(
        revive_routable(&mut conn, old.router()).await.unwrap(),
        0,
        "the old version has no route: the event stays FAILED"
    );
    assert_eq!(h.row(id).await.status, OutboxStatus::Failed);

    assert_eq!(revive_routable(&mut conn, new.router()).await.unwrap(), 1);
    let requeued = h.row(id).await;
    assert_eq!(requeued.status, OutboxStatus::Pending);
    assert_eq!((requeued.failed_at, requeued.unrouted_since), (None, None));
    let history = outbox_store::history(&mut conn, id).await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].previous_status, "FAILED");
    assert_eq!(history[0].requested_by.as_deref(), Some("dispatcher"));
    assert!(
        history[0].reason.contains("routing rule now matches"),
        "{history:?}"
    );

    assert_eq!(new.tick().await.unwrap().dispatched, 1);
    assert_eq!(h.row(id).await.status, OutboxStatus::Done);
    assert_eq!(h.task_ids("outbox.audit").await.len(), 1);
}

#[tokio::test]
async fn a_running_dispatcher_with_the_route_hands_off_failed_unrouted_events_on_its_own() {
    let h = Harness::new().await;
    let id = h.publish_one(NEW_TYPE).await;
    let other_failure = h.publish_one("legacy.report.generated").await;
    let old = h.dispatcher_with(old_routes(), rechecking_at_once(Duration::ZERO));
    assert_eq!(old.tick().await.unwrap().unrouted, 2);

    let new = h.dispatcher_with(new_routes(), rechecking_at_once(Duration::ZERO));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(new.clone().run(shutdown.clone()));
    h.wait_for(
        "the new dispatcher to hand the event off",
        Duration::from_secs(30),
        async || h.row(id).await.status == OutboxStatus::Done,
    )
    .await;
    shutdown.cancel();
    running.await.unwrap().unwrap();

    assert_eq!(h.task_ids("outbox.audit").await.len(), 1);
    assert_eq!(
        h.row(other_failure).await.status,
        OutboxStatus::Failed,
        "an event no route of the new version matches stays FAILED"
    );
}

#[tokio::test]
async fn an_operator_requeue_of_a_waiting_event_clears_its_unrouted_mark() {
    let h = Harness::new().await;
    let id = h.publish_one(NEW_TYPE).await;
    let old = h.dispatcher_with(old_routes(), rechecking_at_once(Duration::ZERO));
    old.tick().await.unwrap();
    let mut conn = h.conn().await;
    let requeued = outbox_store::requeue(
        &mut conn,
        outbox_store::Change {
            ids: &[id],
            allowed: &[OutboxStatus::Failed],
            reason: "route added by hand",
            requested_by: Some("ops"),
        },
    )
    .await
    .unwrap();
    assert_eq!(requeued.ids, vec![id]);
    let row = h.row(id).await;
    assert_eq!(
        (row.status, row.unrouted_since),
        (OutboxStatus::Pending, None)
    );
    let types = outbox_store::unrouted_types(&mut conn).await.unwrap();
    assert!(types.is_empty(), "{types:?}");
}
