//! The worker embedded in an application that installed a `metrics`
//! recorder of its own first: the worker's metrics go to that recorder,
//! the worker offers no `/metrics` of its own (the application's is the
//! one served) and says so in its log. A test binary of its own: a
//! process has one global recorder.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod embedded_support;

use axum::Router;
use axum::routing::get;
use common::Stack;
use embedded_support::{App, WAIT};
use metrics_exporter_prometheus::PrometheusBuilder;
use outbox_test_support::{LogCapture, eventually};
use outbox_worker::{Group, WorkerBuilder};

// One thread: the log capture sees the tasks of this runtime only.
#[tokio::test]
async fn with_the_applications_recorder_the_workers_metrics_go_to_it_and_its_metrics_route_is_the_applications()
 {
    let stack = Stack::new().await;
    let log = LogCapture::start();
    let recorder = PrometheusBuilder::new().install_recorder().unwrap();
    metrics::counter!("shop_orders_total").increment(1);
    let own = Router::new().route(
        "/metrics",
        get(move || {
            let body = recorder.render();
            async move { body }
        }),
    );

    // Merging would panic on two `/metrics` routes.
    let app = App::start(&stack, WorkerBuilder::new(Group::General), own).await;
    let mut metrics = String::new();
    eventually(
        "the worker's metrics in the application's /metrics",
        WAIT,
        async || {
            metrics = app.get("/metrics").await.1;
            metrics.contains("outbox_build_info{")
        },
    )
    .await;
    assert!(metrics.contains("shop_orders_total 1"), "{metrics}");
    assert!(metrics.contains("binary=\"worker-general\""), "{metrics}");
    assert!(
        log.text()
            .contains("metrics go to the application's own recorder"),
        "{}",
        log.text()
    );
    app.stop().await.unwrap();
}
