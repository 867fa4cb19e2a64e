//! The subscriber framework: one apalis-redis worker per queue, handlers
//! registered into groups, receiver retries with exponential backoff, and a
//! dead-letter path for jobs that will never succeed.
//!
//! A handler implements [`JobHandler`] for one queue and returns
//! [`JobError::Retry`] for transient failures (retried in process with
//! backoff, then rescheduled by the queue), [`JobError::RetryAfter`] for
//! one that should be tried again after a wait it names, or
//! [`JobError::Permanent`] for failures that will not heal (the job goes to
//! the queue's dead set with the reason). How often and how far apart a handler's jobs are retried is its
//! [`RetryPolicy`] ([`JobHandler::retry_policy`]; the workers' ladder by
//! default). A job body that does not parse is permanent by construction and
//! never stops the worker (see [`LenientRedis`]). Every job runs in a tracing
//! span (`outbox.job`) with its queue, task id, event id, tenant and attempt;
//! the span continues the trace context the job carries (its top-level
//! `trace_context` member) and names it in the field `trace_id`.
//!
//! [`TypedHandlers`] is the handler for events whose payload is an
//! application's struct (`outbox_model::TypedEvent`): it decodes the
//! payload and calls the application's function with it; a payload that
//! does not decode is dead-lettered at once with the decode error.
//!
//! This crate knows no concrete queue: the subscriber crates provide the
//! handlers and describe what they add ([`SubscriberDescription`]), the
//! worker assembles the groups.

mod body;
mod describe;
mod handler;
mod retry;
mod runner;
mod settings;
mod typed;
mod wake;

pub use body::{JobBody, JobOrdering, LenientCodec, LenientRedis};
pub use describe::{
    ConsumedQueue, DedupKey, DerivedTaskIds, DownstreamQueue, SubscriberDescription,
};
pub use handler::{BoxFuture, DynHandler, JobError, JobHandler, JobMeta};
pub use retry::{Backoff, RetryPolicy, RetryPolicyError};
pub use runner::{HandlerGroup, MAX_FETCH_BATCH, SubscriberError};
pub use settings::{
    WORKER_CONCURRENCY, WORKER_HEARTBEAT_MS, WORKER_POLL_INTERVAL_MS, WORKER_RETRIES,
    WorkerSettings,
};
pub use typed::{EventContext, TypedHandlers};
pub use wake::{QueueWakeups, WakeStream, listen_for_wakeups};
