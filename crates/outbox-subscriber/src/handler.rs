//! Handlers: what a queue's jobs are turned into.

use std::future::Future;
use std::pin::Pin;

use serde::de::DeserializeOwned;

use crate::JobBody;

/// How a job failed, which decides what happens to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// Worth trying again (a peer answered 5xx, a timeout, a database blip):
    /// retried in process with exponential backoff, then rescheduled by the
    /// queue, up to its attempt limit.
    #[error("{0}")]
    Retry(String),
    /// Will never succeed (a body that does not parse, a peer that answers
    /// 4xx): the job goes to the queue's dead set at once, with this reason.
    #[error("{0}")]
    Permanent(String),
}

impl JobError {
    /// A retryable failure.
    pub fn retry(reason: impl std::fmt::Display) -> Self {
        Self::Retry(reason.to_string())
    }

    /// A permanent failure.
    pub fn permanent(reason: impl std::fmt::Display) -> Self {
        Self::Permanent(reason.to_string())
    }
}

/// What a handler knows about the job besides its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobMeta {
    /// The queue (without namespace prefix).
    pub queue: String,
    /// The apalis task id (`outbox:<event id>` for dispatched events).
    pub task_id: String,
    /// Which attempt this is, from 1.
    pub attempt: usize,
}

/// The handler of one queue. Handlers must be idempotent: delivery is
/// at-least-once.
pub trait JobHandler: Send + Sync + 'static {
    /// The job body type; a body that does not deserialize into it is a
    /// permanent failure.
    type Job: DeserializeOwned + Send + 'static;

    /// The queue this handler consumes.
    fn queue(&self) -> &str;

    /// Processes one job.
    fn handle(
        &self,
        job: Self::Job,
        meta: &JobMeta,
    ) -> impl Future<Output = Result<(), JobError>> + Send;
}

/// A boxed future, as the type-erased handler returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A [`JobHandler`] with its job type erased, so that handlers of different
/// job types can share one registry.
pub trait DynHandler: Send + Sync + 'static {
    /// The queue this handler consumes.
    fn queue(&self) -> &str;

    /// Parses the body and runs the handler.
    fn call<'a>(&'a self, body: JobBody, meta: &'a JobMeta) -> BoxFuture<'a, Result<(), JobError>>;
}

impl<H: JobHandler> DynHandler for H {
    fn queue(&self) -> &str {
        JobHandler::queue(self)
    }

    fn call<'a>(&'a self, body: JobBody, meta: &'a JobMeta) -> BoxFuture<'a, Result<(), JobError>> {
        Box::pin(async move {
            let job: H::Job = serde_json::from_slice(body.raw()).map_err(|e| {
                use serde_json::error::Category;
                match e.classify() {
                    Category::Data => JobError::permanent(format!(
                        "corrupt job body (not a {} job): {e}",
                        meta.queue
                    )),
                    Category::Syntax | Category::Eof | Category::Io => {
                        JobError::permanent(format!("corrupt job body (not JSON): {e}"))
                    }
                }
            })?;
            self.handle(job, meta).await
        })
    }
}
