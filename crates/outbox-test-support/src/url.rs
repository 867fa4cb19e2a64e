//! Where the servers of the workspace's own suites are.

use outbox_testkit::database_server_url;

/// The Postgres server of the workflow end-to-end suite:
/// `WORKFLOW_TRIGGER_E2E_DATABASE_URL`, else `OUTBOX_E2E_DATABASE_URL`,
/// else [`database_server_url`]. Only the server part matters; each test
/// gets its own database there.
#[must_use]
pub fn workflow_e2e_server_url() -> String {
    std::env::var("WORKFLOW_TRIGGER_E2E_DATABASE_URL")
        .or_else(|_| std::env::var("OUTBOX_E2E_DATABASE_URL"))
        .unwrap_or_else(|_| database_server_url())
}
