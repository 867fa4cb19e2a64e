//! What can go wrong while a page is built, and the page that says so.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use outbox_operator::health::QueueReadError;
use outbox_store::StoreError;

/// Why the console could not answer. Its messages hide the secrets of URLs
/// (`outbox_queue::redact_urls_in`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsoleError {
    /// No Postgres connection could be had from the pool.
    #[error("no database connection: {0}")]
    Pool(String),
    /// A statement of the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A queue's figures could not be read from Redis.
    #[error(transparent)]
    Queues(#[from] QueueReadError),
    /// A batch of a requeue by filter failed; the batches before it stay
    /// committed, and the message says how many rows they held.
    #[error(transparent)]
    Batch(#[from] outbox_operator::requeue::bulk::BatchFailed),
    /// A batch of a cancel by filter failed; the batches before it stay
    /// committed, and the message says how many rows they held.
    #[error(transparent)]
    CancelBatch(#[from] outbox_operator::cancel::bulk::BatchFailed),
    /// A read of the workflow tables failed.
    #[error(transparent)]
    Workflows(#[from] outbox_workflow_store::StoreError),
    /// Answering a waiting run failed (not a refusal: those are answered
    /// with 409).
    #[error(transparent)]
    Answer(#[from] outbox_workflow_store::admin::AdminError),
    /// Cancelling a run failed (not a refusal: those are answered with 409).
    #[error(transparent)]
    Cancel(#[from] outbox_workflow_store::CancelError),
    /// Redis failed reading or putting back dead jobs.
    #[error("Redis: {0}")]
    Redis(String),
    /// Dead jobs went back on their queue but their history entries were
    /// not written; the message names them.
    #[error(transparent)]
    PutBack(outbox_operator::dead::PutBackError),
}

impl ConsoleError {
    /// The status a browser gets: 503 while a server is out of reach, else 500.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Pool(_) | Self::Queues(_) | Self::Redis(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store(_)
            | Self::Batch(_)
            | Self::CancelBatch(_)
            | Self::Workflows(_)
            | Self::Answer(_)
            | Self::Cancel(_)
            | Self::PutBack(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        // Pool and Redis errors may carry a connection URL: the log line
        // gets the same reduced text as the page.
        let message = outbox_queue::redact_urls_in(&self.to_string());
        tracing::warn!(error = %message, "console page failed");
        let page = maud::html! {
            (maud::DOCTYPE)
            html lang="en" {
                head { meta charset="utf-8"; title { "Outbox console: error" } }
                body { h1 { "The console could not answer" } p.error { (message) } }
            }
        };
        (self.status(), page).into_response()
    }
}
