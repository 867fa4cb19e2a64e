//! The ordering step around every handler of the worker: a job of an
//! ordered event (one whose envelope carries `ordering_key` and
//! `ordering_position`) records its completion in Postgres, which lets the
//! next event of its key be claimed; a duplicate delivery of an event its
//! key is past is acknowledged without running the handler; a job that
//! goes to the dead set holds its key (or skips it, by policy).
//!
//! Unordered jobs pass straight through to the handler.

use std::sync::Arc;
use std::time::Duration;

use outbox_pg::PgPool;
use outbox_subscriber::{BoxFuture, DynHandler, JobBody, JobError, JobMeta, JobOrdering};
use outbox_subscriber::{HandlerGroup, RetryPolicy};
use uuid::Uuid;

/// What happens to an ordering key when the job of its head event goes to
/// the dead set (its retries ran out, or it failed permanently).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OrderingPolicy {
    /// The key is held on the event: its later events wait until the event
    /// is retried successfully or an operator releases the key (`outbox
    /// ordering release`). The default: nothing is handled out of order.
    #[default]
    Hold,
    /// The key moves past the dead event at once, as if it had succeeded:
    /// later events keep flowing, and the dead job stays in the dead set.
    Skip,
}

/// How many times recording a finished ordered event is tried before the
/// job is handed back to the queue (its handler then runs again).
const ADVANCE_TRIES: u32 = 5;

/// The first pause between those tries; it doubles.
const ADVANCE_FIRST_PAUSE: Duration = Duration::from_millis(100);

/// Wraps every handler of `group` with the ordering step.
pub(crate) fn layer(group: HandlerGroup, pool: &PgPool, policy: OrderingPolicy) -> HandlerGroup {
    group.layer(|inner| {
        Arc::new(Ordered {
            inner,
            pool: pool.clone(),
            policy,
        })
    })
}

/// A handler with the ordering step around it.
struct Ordered {
    inner: Arc<dyn DynHandler>,
    pool: PgPool,
    policy: OrderingPolicy,
}

impl Ordered {
    /// Whether the key is past this job's event already. A replay
    /// (generation above 0) always runs: the operator asked for it.
    async fn finished(&self, ordering: &JobOrdering) -> Result<bool, JobError> {
        if ordering.generation > 0 {
            return Ok(false);
        }
        let mut conn = self.pool.get().await.map_err(|e| {
            JobError::retry(format!(
                "no Postgres connection to check the ordering key: {e}"
            ))
        })?;
        outbox_store::is_finished(&mut conn, &ordering.key, ordering.position)
            .await
            .map_err(|e| JobError::retry(format!("cannot check the ordering key: {e}")))
    }

    /// Records that the handler of this job's event succeeded, trying a few
    /// times: a failure hands the job back and its handler runs again.
    async fn advance(&self, ordering: &JobOrdering) -> Result<(), JobError> {
        let moved = self
            .write(ordering, KeyWrite::Advance)
            .await
            .map_err(|last_error| {
                JobError::retry(format!(
                    "the handler succeeded but the ordering key's progress was not recorded: {last_error}"
                ))
            })?;
        tracing::debug!(ordering_key = %ordering.key, position = ordering.position,
            moved, "ordered event finished");
        Ok(())
    }

    /// Makes one write to the key of `ordering`, up to [`ADVANCE_TRIES`]
    /// times with a pause that doubles from [`ADVANCE_FIRST_PAUSE`] after
    /// each failure (a pool that has no connection for a moment, a Postgres
    /// restarting). The last error when every try failed.
    async fn write(&self, ordering: &JobOrdering, write: KeyWrite<'_>) -> Result<bool, String> {
        let mut pause = ADVANCE_FIRST_PAUSE;
        let mut last_error = String::new();
        for attempt in 1..=ADVANCE_TRIES {
            let written = match self.pool.get().await {
                Ok(mut conn) => match write {
                    KeyWrite::Advance => {
                        outbox_store::advance(&mut conn, &ordering.key, ordering.position).await
                    }
                    KeyWrite::Hold { event_id, reason } => {
                        outbox_store::hold(
                            &mut conn,
                            &ordering.key,
                            ordering.position,
                            event_id,
                            reason,
                        )
                        .await
                    }
                }
                .map_err(|e| e.to_string()),
                Err(e) => Err(format!("no connection: {e}")),
            };
            match written {
                Ok(done) => return Ok(done),
                Err(e) => last_error = e,
            }
            if attempt < ADVANCE_TRIES {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
        Err(last_error)
    }

    /// Holds or skips the key of a dead job, by policy, trying a few times
    /// as [`Ordered::advance`] does: unrecorded, the key would stay stopped
    /// without showing in `outbox ordering list`.
    async fn settle_dead(&self, body: &JobBody, ordering: &JobOrdering, reason: &str) {
        let event_id = body.ids().0.and_then(|id| Uuid::parse_str(&id).ok());
        let write = match (self.policy, event_id) {
            (OrderingPolicy::Skip, _) => KeyWrite::Advance,
            (OrderingPolicy::Hold, Some(event_id)) => KeyWrite::Hold { event_id, reason },
            (OrderingPolicy::Hold, None) => {
                tracing::error!(ordering_key = %ordering.key, position = ordering.position,
                    "a dead ordered job carries no event id, so its key cannot be held; the key stays stopped: put the job back with `outbox retry-dead`");
                return;
            }
        };
        match self.write(ordering, write).await {
            Ok(_) => tracing::warn!(ordering_key = %ordering.key, position = ordering.position,
                policy = ?self.policy, "ordered job dead; its key is {}",
                if self.policy == OrderingPolicy::Skip { "moved past it" } else { "held" }),
            Err(e) => tracing::error!(ordering_key = %ordering.key, position = ordering.position,
                event_id = event_id.map(|id| id.to_string()).as_deref().unwrap_or("-"),
                error = %e, tries = ADVANCE_TRIES,
                "a dead ordered job's key could not be recorded; the key stays stopped and `outbox ordering list` does not show it: put the job back with `outbox retry-dead`"),
        }
    }
}

/// What the ordering step writes to a key.
#[derive(Clone, Copy)]
enum KeyWrite<'a> {
    /// The key moves past the job's position.
    Advance,
    /// The key is held on the job's event.
    Hold { event_id: Uuid, reason: &'a str },
}

impl DynHandler for Ordered {
    fn queue(&self) -> &str {
        self.inner.queue()
    }

    fn concurrency(&self, configured: usize) -> usize {
        self.inner.concurrency(configured)
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.inner.retry_policy()
    }

    fn call<'a>(&'a self, body: JobBody, meta: &'a JobMeta) -> BoxFuture<'a, Result<(), JobError>> {
        Box::pin(async move {
            let Some(ordering) = body.ordering() else {
                return self.inner.call(body, meta).await;
            };
            if self.finished(&ordering).await? {
                let (event_id, _) = body.ids();
                tracing::info!(
                    event_id = event_id.as_deref().unwrap_or("-"),
                    task_id = %meta.task_id,
                    ordering_key = %ordering.key,
                    position = ordering.position,
                    "duplicate delivery of a finished ordered event; acknowledged without running the handler"
                );
                metrics::counter!("outbox_ordering_duplicates_skipped_total", "queue" => meta.queue.clone())
                    .increment(1);
                return Ok(());
            }
            self.inner.call(body, meta).await?;
            self.advance(&ordering).await
        })
    }

    fn dead<'a>(&'a self, body: &'a JobBody, reason: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.inner.dead(body, reason).await;
            if let Some(ordering) = body.ordering() {
                self.settle_dead(body, &ordering, reason).await;
            }
        })
    }
}
