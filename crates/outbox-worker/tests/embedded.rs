//! The worker embedded in an application: run in the application's own
//! runtime until the application's token is cancelled, its `/healthz`,
//! `/readyz` and `/metrics` merged into the application's router and
//! served on the application's one listener, no signal handler of its
//! own, and run a second time in the same process after the first run
//! returned.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod embedded_support;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::get;
use common::Stack;
use embedded_support::{App, WAIT};
use outbox_publish::{NewOutboxEvent, OutboxEvent};
use outbox_subscriber::{EventContext, JobError, TypedHandlers};
use outbox_test_support::eventually;
use outbox_worker::{Group, WorkerBuilder};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, OutboxEvent)]
#[outbox(event_type = "shop.order.paid")]
struct OrderPaid {
    order_id: u64,
}

/// The order ids the application's handler was called with.
type Paid = Arc<Mutex<Vec<u64>>>;

/// The application: a route of its own, and a worker with a handler of
/// its own.
async fn start_app(stack: &Stack, paid: &Paid) -> App {
    let own = Router::new().route("/hello", get(|| async { "hello from the application" }));
    let worker = WorkerBuilder::new(Group::General).typed(orders_handler(paid));
    App::start(stack, worker, own).await
}

/// The application's own handler: records the order ids it is called with.
fn orders_handler(paid: &Paid) -> TypedHandlers {
    let paid = paid.clone();
    TypedHandlers::new("app.shop")
        .on(move |event: OrderPaid, _: EventContext| {
            let paid = paid.clone();
            async move {
                paid.lock().unwrap().push(event.order_id);
                Ok::<(), JobError>(())
            }
        })
        .unwrap()
}

/// Publishes `OrderPaid { order_id }` in a transaction and waits until the
/// application's handler has it.
async fn pay_and_wait(stack: &Stack, paid: &Paid, order_id: u64) {
    stack
        .publish(NewOutboxEvent::from_typed("acme", &OrderPaid { order_id }).unwrap())
        .await;
    eventually(
        &format!("order {order_id} at the application's handler"),
        WAIT,
        async || paid.lock().unwrap().contains(&order_id),
    )
    .await;
}

/// Whether this process has a handler of its own for signal `number`
/// (`SigCgt` of `/proc/self/status`).
#[cfg(target_os = "linux")]
fn catches_signal(number: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let caught = status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .expect("a SigCgt line");
    let mask = u64::from_str_radix(caught.trim(), 16).unwrap();
    mask & (1 << (number - 1)) != 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_serves_on_the_applications_router_stops_with_its_token_and_runs_again() {
    let stack = Stack::new().await;
    let paid = Paid::default();

    let app = start_app(&stack, &paid).await;
    assert_eq!(
        app.get("/hello").await,
        (200, "hello from the application".to_owned())
    );
    assert_eq!(app.get("/healthz").await, (200, "ok\n".to_owned()));
    pay_and_wait(&stack, &paid, 1).await;
    let mut metrics = String::new();
    eventually("the handled job in /metrics", WAIT, async || {
        let (status, body) = app.get("/metrics").await;
        metrics = body;
        status == 200
            && metrics.lines().any(|line| {
                line.starts_with("outbox_subscriber_jobs_total{")
                    && line.contains("queue=\"app.shop\"")
            })
    })
    .await;
    assert!(
        metrics.contains("outbox_build_info{") && metrics.contains("binary=\"worker-general\""),
        "{metrics}"
    );
    #[cfg(target_os = "linux")]
    {
        const SIGINT: u32 = 2;
        const SIGTERM: u32 = 15;
        assert!(!catches_signal(SIGINT), "run_until caught SIGINT");
        assert!(!catches_signal(SIGTERM), "run_until caught SIGTERM");
    }
    assert!(
        !app.worker.is_finished(),
        "runs until the token is cancelled"
    );
    app.stop().await.unwrap();

    // The same process, a second run: the recorder of the first is kept.
    let app = start_app(&stack, &paid).await;
    pay_and_wait(&stack, &paid, 2).await;
    let (status, metrics) = app.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("outbox_build_info{"), "{metrics}");
    app.stop().await.unwrap();
}
