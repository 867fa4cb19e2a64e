//! Running a handler on an event in-process: [`dispatched`] (the job a
//! dispatch makes of an event), [`run_handler`] and what came of it
//! ([`HandlerOutcome`]).

use std::time::Duration;

use chrono::Utc;
use outbox_model::{RawJson, TypedEvent};
use outbox_queue::OutboxJob;
use outbox_subscriber::{DynHandler, JobBody, JobError, JobMeta};
use serde::Serialize;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer};
use uuid::Uuid;

use crate::event::{Published, PublishedEvent};
use crate::guard::{CACHED, Verdicts};

/// What came of one run of a handler on a job, as the worker would act on
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerOutcome {
    /// The handler succeeded: the worker acknowledges the job.
    Done,
    /// The handler succeeded without doing the work again: its idempotency
    /// guard (`outbox_idempotency::with_outbox_idempotency`) found the
    /// delivery handled before and returned the recorded result, and
    /// recorded nothing new.
    Duplicate,
    /// The handler failed in a way worth trying again
    /// (`JobError::Retry`, or `JobError::RetryAfter` with its wait).
    Retry {
        /// Why, as the handler said.
        reason: String,
        /// The wait the handler asked for (`JobError::retry_after`);
        /// `None` leaves the wait to the handler's retry policy, which
        /// the kit does not play out.
        after: Option<Duration>,
    },
    /// The handler said no attempt will ever succeed (`JobError::Permanent`,
    /// a payload that does not decode into a typed handler's struct, an
    /// event type it does not take): the worker moves the job to the
    /// queue's dead set with this reason.
    DeadLettered {
        /// The reason the dead set shows.
        reason: String,
    },
}

/// The job a dispatch makes of a typed event of `tenant_id`, as if it had
/// just been published: a new event id (UUIDv7), no dispatch key, the
/// first delivery (generation 0). Its task id (`job.task_id()`) and
/// delivery id (`job.delivery_id()`, what handlers key their effects on)
/// are derived as in production; run the same job twice to deliver the
/// same event twice.
///
/// # Panics
///
/// When serde cannot turn `event` into JSON.
#[must_use]
pub fn dispatched<E>(tenant_id: &str, event: &E) -> OutboxJob
where
    E: TypedEvent + Serialize,
{
    let payload = serde_json::to_string(event)
        .and_then(RawJson::from_text)
        .unwrap_or_else(|e| panic!("{} does not serialize: {e}", E::EVENT_TYPE));
    job(
        Uuid::now_v7(),
        tenant_id,
        E::EVENT_TYPE,
        payload,
        None,
        Utc::now(),
    )
}

impl PublishedEvent {
    /// The job a dispatch makes of this event (its first delivery), with
    /// the same task and delivery ids; it carries no priority, ordering
    /// key or trace context, which a real dispatch copies from the row.
    #[must_use]
    pub fn dispatched(&self) -> OutboxJob {
        job(
            self.id,
            &self.tenant_id,
            &self.event_type,
            self.raw.clone(),
            self.dispatch_key.clone(),
            self.created_at,
        )
    }
}

impl<E: TypedEvent> Published<E> {
    /// The job a dispatch makes of this event (its first delivery), with
    /// the same task and delivery ids; it carries no priority, ordering
    /// key or trace context, which a real dispatch copies from the row.
    #[must_use]
    pub fn dispatched(&self) -> OutboxJob {
        job(
            self.id,
            &self.tenant_id,
            E::EVENT_TYPE,
            self.raw.clone(),
            self.dispatch_key.clone(),
            self.created_at,
        )
    }
}

fn job(
    id: Uuid,
    tenant_id: &str,
    event_type: &str,
    payload: RawJson,
    dispatch_key: Option<String>,
    created_at: chrono::DateTime<Utc>,
) -> OutboxJob {
    OutboxJob {
        outbox_event_id: id,
        tenant_id: tenant_id.to_owned(),
        event_type: event_type.to_owned(),
        payload,
        dispatch_key,
        created_at,
        generation: 0,
        trace_context: None,
        priority: outbox_model::Priority::NORMAL,
        ordering_key: None,
        ordering_position: None,
    }
}

/// Runs `handler` once on `job`, in this task, as its queue's worker runs a
/// first attempt: the job's JSON body decoded into the handler's job type,
/// the job's task id and attempt 1 in its `JobMeta`. Whatever the handler
/// uses for idempotency (a Redis idempotency store, a unique row) is the
/// one it uses in production, so running the same job again is a
/// redelivery.
///
/// A panic in the handler fails the test (a worker dead-letters such a
/// job). While the handler runs, its log lines go to the test's output
/// (`RUST_LOG`, `info` by default), shown for failing tests.
pub async fn run_handler<H>(handler: &H, job: &OutboxJob) -> HandlerOutcome
where
    H: DynHandler + ?Sized,
{
    run_handler_attempt(handler, job, 1).await
}

/// [`run_handler`] as attempt `attempt` (from 1), for a handler whose
/// behaviour depends on it (`JobMeta::attempt`, `EventContext::attempt`).
///
/// # Panics
///
/// When the job does not serialize (it always does), or as the handler
/// does.
pub async fn run_handler_attempt<H>(handler: &H, job: &OutboxJob, attempt: usize) -> HandlerOutcome
where
    H: DynHandler + ?Sized,
{
    let body = serde_json::to_vec(job)
        .map(JobBody::from_bytes)
        .unwrap_or_else(|e| panic!("the job does not serialize: {e}"));
    let meta = JobMeta {
        queue: handler.queue().to_owned(),
        task_id: job.task_id(),
        attempt,
    };
    let verdicts = Verdicts::default();
    let logs = tracing_subscriber::fmt::layer()
        .with_test_writer()
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")));
    let watched = tracing_subscriber::registry()
        .with(verdicts.clone())
        .with(logs);
    let result = handler.call(body, &meta).with_subscriber(watched).await;
    classify(result, &verdicts.recorded())
}

/// The outcome of a run that returned `result`, the idempotency guard
/// having recorded `verdicts` meanwhile.
fn classify(result: Result<(), JobError>, verdicts: &[String]) -> HandlerOutcome {
    match result {
        Ok(()) if !verdicts.is_empty() && verdicts.iter().all(|v| v == CACHED) => {
            HandlerOutcome::Duplicate
        }
        Ok(()) => HandlerOutcome::Done,
        Err(JobError::Permanent(reason)) => HandlerOutcome::DeadLettered { reason },
        Err(JobError::RetryAfter { delay, reason }) => HandlerOutcome::Retry {
            reason,
            after: Some(delay),
        },
        Err(JobError::Retry(reason)) => HandlerOutcome::Retry {
            reason,
            after: None,
        },
        Err(other) => HandlerOutcome::Retry {
            reason: other.to_string(),
            after: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_a_duplicate_only_when_every_guard_found_it_handled_before() {
        let verdicts = |list: &[&str]| list.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>();
        let secs = Duration::from_secs;
        for (result, recorded, outcome) in [
            (Ok(()), verdicts(&[]), HandlerOutcome::Done),
            (Ok(()), verdicts(&["ran"]), HandlerOutcome::Done),
            (Ok(()), verdicts(&["cached"]), HandlerOutcome::Duplicate),
            (
                Ok(()),
                verdicts(&["cached", "cached"]),
                HandlerOutcome::Duplicate,
            ),
            (Ok(()), verdicts(&["cached", "ran"]), HandlerOutcome::Done),
            (
                Err(JobError::retry("503")),
                verdicts(&["handler_failed"]),
                HandlerOutcome::Retry {
                    reason: "503".into(),
                    after: None,
                },
            ),
            (
                Err(JobError::retry_after(secs(30), "429")),
                verdicts(&[]),
                HandlerOutcome::Retry {
                    reason: "429".into(),
                    after: Some(secs(30)),
                },
            ),
            (
                Err(JobError::permanent("410")),
                verdicts(&["cached"]),
                HandlerOutcome::DeadLettered {
                    reason: "410".into(),
                },
            ),
        ] {
            assert_eq!(
                classify(result.clone(), &recorded),
                outcome,
                "{result:?} {recorded:?}"
            );
        }
    }
}
