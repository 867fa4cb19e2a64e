//! Helpers shared by the bridge's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

/// The secret the bridge tests sign with.
pub const SECRET: &str = "a-test-secret-of-at-least-32-bytes!!";

/// Serves the bridge router for `pool` on a free loopback port with
/// `runner`, accepting `secrets`; its base URL. The server lives until the
/// test's runtime ends.
pub async fn serve_bridge(
    pool: outbox_pg::PgPool,
    runner: outbox_workflow_runner::Runner,
    secrets: &[&str],
) -> String {
    use outbox_workflow_bridge::{BridgeSecret, BridgeState, router};
    let secrets = secrets
        .iter()
        .map(|s| BridgeSecret::new(s).unwrap())
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(BridgeState::new(pool, runner, secrets));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// A client of the bridge at `url` signing with `secret`.
pub fn client(url: &str, secret: &str) -> outbox_workflow_bridge::BridgeClient {
    use outbox_workflow_bridge::{BridgeClient, BridgeSecret};
    BridgeClient::new(url, BridgeSecret::new(secret).unwrap()).unwrap()
}
