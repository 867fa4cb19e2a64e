//! An application that embeds the worker: its own router with the
//! worker's routes merged, served on one listener, and the worker running
//! in the test's runtime until the application's token is cancelled.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::future::IntoFuture;
use std::time::Duration;

use axum::Router;
use outbox_test_support::eventually;
use outbox_worker::{Group, WorkerBuilder, WorkerConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::common::Stack;

/// How long a test waits for an effect.
pub const WAIT: Duration = Duration::from_secs(60);

/// The application, serving on `addr`.
pub struct App {
    pub addr: String,
    stop: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    pub worker: JoinHandle<anyhow::Result<()>>,
}

impl App {
    /// Serves `own` with the routes of `worker` (a general-group worker on
    /// the stack) merged, runs `worker` without a listener of its own, and
    /// waits until `/readyz` (the worker's) answers 200 on the
    /// application's port.
    pub async fn start(stack: &Stack, worker: WorkerBuilder, own: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // The application's own address: a worker that bound it would fail.
        let mut env: HashMap<String, String> = stack.env().into_iter().collect();
        env.insert("WORKER_HTTP_ADDR".into(), addr.clone());
        let config =
            WorkerConfig::from_lookup(Group::General, &|name| env.get(name).cloned()).unwrap();

        let worker = worker.without_http_listener();
        let app = own.merge(worker.http_routes().unwrap());
        let stop = CancellationToken::new();
        let server = tokio::spawn(
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.clone().cancelled_owned())
                .into_future(),
        );
        let worker = tokio::spawn(worker.run_until(config, stop.clone().cancelled_owned()));
        let app = Self {
            addr,
            stop,
            server,
            worker,
        };
        eventually(
            "the worker's /readyz on the application's port",
            WAIT,
            async || app.get("/readyz").await.0 == 200,
        )
        .await;
        app
    }

    /// The status and body of `path` on the application's port (status 0
    /// when nothing answers).
    pub async fn get(&self, path: &str) -> (u16, String) {
        let Ok(response) = reqwest::get(format!("http://{}{path}", self.addr)).await else {
            return (0, String::new());
        };
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// Cancels the application's token; returns what `run_until` returned.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.server.await.unwrap().unwrap();
        self.worker.await.unwrap()
    }
}
