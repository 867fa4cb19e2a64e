//! Handlers: what a queue's jobs are turned into.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::{JobBody, RetryPolicy};

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
    /// Worth trying again, but not before `delay` (a peer answered 429
    /// with `Retry-After`, a rate limit resets at a known time): the job
    /// goes back on the queue at once, due after `delay`, instead of the
    /// handler's backoff. It counts as an attempt and is bounded like any
    /// by the handler's [`RetryPolicy`]; under the ladder it also ends the
    /// round (its in-process tries left are skipped and counted).
    #[error("{reason}")]
    RetryAfter {
        /// How long the job waits on the queue (Redis keeps due times in
        /// whole seconds).
        delay: Duration,
        /// Why, as for [`JobError::Retry`].
        reason: String,
    },
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

    /// A retryable failure to be tried again not before `delay`
    /// ([`JobError::RetryAfter`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_subscriber::JobError;
    ///
    /// let error = JobError::retry_after(Duration::from_secs(120), "peer answered 429");
    /// assert_eq!(error.to_string(), "peer answered 429");
    /// ```
    pub fn retry_after(delay: Duration, reason: impl std::fmt::Display) -> Self {
        Self::RetryAfter {
            delay,
            reason: reason.to_string(),
        }
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

    /// How many jobs of this queue run at once, given the configured
    /// figure (`WORKER_CONCURRENCY`, [`crate::WorkerSettings::concurrency`]).
    /// By default the configured figure; a handler whose jobs gain from
    /// running together (a group commit) may ask for more.
    fn concurrency(&self, configured: usize) -> usize {
        configured
    }

    /// How this queue's failing jobs are retried. By default the workers'
    /// ladder ([`RetryPolicy::ladder`]: `WORKER_RETRIES` quick retries in
    /// process, then back on the queue after 30 s, 1, 2, 5, 10, 20, 30 min,
    /// 1, 2, 4 h).
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_subscriber::{JobError, JobHandler, JobMeta, RetryPolicy};
    ///
    /// /// Pings a peer that is either up within minutes or not worth waiting for.
    /// struct Ping;
    ///
    /// impl JobHandler for Ping {
    ///     type Job = ();
    ///
    ///     fn queue(&self) -> &str {
    ///         "app.ping"
    ///     }
    ///
    ///     fn retry_policy(&self) -> RetryPolicy {
    ///         // Due again after 10 s, 20 s, 40 s; dead after the fourth attempt.
    ///         RetryPolicy::exponential(Duration::from_secs(10), Duration::from_secs(60))
    ///             .with_max_attempts(4)
    ///     }
    ///
    ///     async fn handle(&self, (): (), _meta: &JobMeta) -> Result<(), JobError> {
    ///         Ok(())
    ///     }
    /// }
    /// ```
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::default()
    }

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

    /// See [`JobHandler::concurrency`].
    fn concurrency(&self, configured: usize) -> usize;

    /// See [`JobHandler::retry_policy`].
    fn retry_policy(&self) -> RetryPolicy;

    /// Parses the body and runs the handler.
    fn call<'a>(&'a self, body: JobBody, meta: &'a JobMeta) -> BoxFuture<'a, Result<(), JobError>>;

    /// Called once when a job of this queue goes to the dead set (a
    /// permanent failure, or its retry policy gave up), with the reason,
    /// before the dead set takes it. Nothing by default; the worker's
    /// ordering layer holds the job's ordering key here.
    fn dead<'a>(&'a self, body: &'a JobBody, reason: &'a str) -> BoxFuture<'a, ()> {
        let _ = (body, reason);
        Box::pin(async {})
    }
}

impl<H: JobHandler> DynHandler for H {
    fn queue(&self) -> &str {
        JobHandler::queue(self)
    }

    fn concurrency(&self, configured: usize) -> usize {
        JobHandler::concurrency(self, configured)
    }

    fn retry_policy(&self) -> RetryPolicy {
        JobHandler::retry_policy(self)
    }

    fn call<'a>(&'a self, body: JobBody, meta: &'a JobMeta) -> BoxFuture<'a, Result<(), JobError>> {
        Box::pin(async move {
            let job: H::Job = serde_json::from_slice(body.raw()).map_err(|e| {
                use serde_json::error::Category;
                // serde_json also reports valid JSON it cannot hold as a
                // syntax error (`1e400`: "number out of range"), so the text
                // itself decides whether the body is JSON.
                let not_json = match e.classify() {
                    Category::Data => false,
                    Category::Syntax | Category::Eof | Category::Io => !is_json(body.raw()),
                };
                if not_json {
                    JobError::permanent(format!("corrupt job body (not JSON): {e}"))
                } else {
                    JobError::permanent(format!("corrupt job body (not a {} job): {e}", meta.queue))
                }
            })?;
            self.handle(job, meta).await
        })
    }
}

/// Whether `raw` is one JSON value (UTF-8 text; any number, any nesting).
fn is_json(raw: &[u8]) -> bool {
    // `from_slice` does not check the UTF-8 of strings it skips.
    std::str::from_utf8(raw)
        .is_ok_and(|text| serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_text_that_is_not_json_is_called_so() {
        for json in ["1e400", "[1E310]", r#"{"a": -1e999}"#, "\"x\"", "[[[[]]]]"] {
            assert!(is_json(json.as_bytes()), "{json}");
        }
        for not_json in ["", "{", "[1,]", "1e", "\"\\ud800", "nul"] {
            assert!(!is_json(not_json.as_bytes()), "{not_json}");
        }
        assert!(!is_json(b"\"\xff\""));
        let deep = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
        assert!(is_json(deep.as_bytes()));
    }

    struct Unit;

    impl JobHandler for Unit {
        type Job = ();

        fn queue(&self) -> &str {
            "test.unit"
        }

        async fn handle(&self, (): (), _meta: &JobMeta) -> Result<(), JobError> {
            Ok(())
        }
    }

    struct Batching;

    impl JobHandler for Batching {
        type Job = ();

        fn queue(&self) -> &str {
            "test.batching"
        }

        fn concurrency(&self, configured: usize) -> usize {
            configured.max(100)
        }

        async fn handle(&self, (): (), _meta: &JobMeta) -> Result<(), JobError> {
            Ok(())
        }
    }

    struct Patient;

    impl JobHandler for Patient {
        type Job = ();

        fn queue(&self) -> &str {
            "test.patient"
        }

        fn retry_policy(&self) -> RetryPolicy {
            RetryPolicy::fixed(std::time::Duration::from_secs(60)).with_max_attempts(2)
        }

        async fn handle(&self, (): (), _meta: &JobMeta) -> Result<(), JobError> {
            Ok(())
        }
    }

    /// The worker reads a handler's retry policy through the type-erased
    /// handler: one that sets none retries on the ladder, one that sets its
    /// own gets it.
    #[test]
    fn a_handler_retries_by_its_own_policy_or_else_the_ladder() {
        assert_eq!(DynHandler::retry_policy(&Unit), RetryPolicy::ladder());
        assert_eq!(
            DynHandler::retry_policy(&Patient),
            RetryPolicy::fixed(std::time::Duration::from_secs(60)).with_max_attempts(2)
        );
    }

    /// The worker asks the type-erased handler how many jobs to run at
    /// once: a group-committing handler's wish must reach it, and a plain
    /// handler runs the configured figure.
    #[test]
    fn a_handler_that_asks_for_more_concurrency_gets_it_through_the_registry() {
        let handlers: [&dyn DynHandler; 2] = [&Unit, &Batching];
        let asked: Vec<usize> = handlers.iter().map(|h| h.concurrency(8)).collect();
        assert_eq!(asked, [8, 100]);
        assert_eq!(DynHandler::concurrency(&Batching, 250), 250);
    }

    #[test]
    fn corrupt_bodies_are_permanent_failures_named_by_what_they_are() {
        let meta = JobMeta {
            queue: "test.unit".into(),
            task_id: "t".into(),
            attempt: 1,
        };
        let call = |raw: &str| {
            futures::executor::block_on(DynHandler::call(
                &Unit,
                JobBody::from_bytes(raw.as_bytes().to_vec()),
                &meta,
            ))
        };
        assert_eq!(call("null"), Ok(()));
        let reason = |raw: &str| match call(raw) {
            Err(JobError::Permanent(reason)) => reason,
            other => panic!("{raw}: {other:?}"),
        };
        // Valid JSON serde_json cannot hold is reported as a syntax error.
        assert!(reason("1e400").starts_with("corrupt job body (not a test.unit job): "));
        assert!(reason("[1]").starts_with("corrupt job body (not a test.unit job): "));
        assert!(reason("nul").starts_with("corrupt job body (not JSON): "));
    }
}
