//! Subscribers whose side effect is a row in this database:
//!
//! - [`AuditHandler`] consumes `outbox.audit` and appends one `audit_log`
//!   row per event (the table refuses updates and deletes);
//! - [`NotificationHandler`] consumes `outbox.notification` (`notification.*`,
//!   `tenant.subscription.*`, `billing.*`) and writes one in-app
//!   `notification` row per event.
//!
//! Both are idempotent by a unique constraint on the event id: a redelivered
//! job inserts nothing (`ON CONFLICT DO NOTHING`). Both store the payload as
//! the exact text the outbox row holds (numbers keep every digit). Database errors are
//! retried; nothing here talks to the outside world.
//!
//! Both write by group commit (see [`GROUP_COMMIT_MAX_ROWS`]): the rows of
//! the jobs in progress at the same time go into one multi-row insert, and
//! each job is acknowledged only once its row is committed. To give the
//! batches rows, both run at least [`GROUP_COMMIT_CONCURRENCY`] jobs at once
//! (waiting jobs hold no connection; the writer uses one).
//!
//! What these handlers consume, feed and deduplicate on is described
//! once, as plain data, in `outbox_catalog::built_in` (`AUDIT`, `NOTIFICATION`), which
//! the worker pairs with them.

mod batch;
mod db;

use outbox_pg::PgPool;
use outbox_queue::{OutboxJob, queues};
use outbox_subscriber::{JobError, JobHandler, JobMeta};
use serde_json::Value;

use crate::batch::{GroupCommit, Written};
use crate::db::{AuditRow, NotificationRow};

/// The first string field of `payload` among `names`.
fn text_field(payload: Option<&Value>, names: &[&str]) -> Option<String> {
    let payload = payload?;
    names
        .iter()
        .find_map(|name| payload.get(*name).and_then(Value::as_str))
        .map(str::to_owned)
}

/// The payload decoded for reading fields; `None` when `Value` cannot hold
/// it (a number outside `f64`, very deep nesting). The row still stores the
/// exact text.
fn fields(job: &OutboxJob) -> Option<Value> {
    job.payload.value().ok()
}

pub use batch::GROUP_COMMIT_MAX_ROWS;

/// The least number of jobs the audit and notification queues run at once,
/// whatever `WORKER_CONCURRENCY` says (a larger setting is kept): the jobs
/// in progress are what a group commit can write together, and a waiting job
/// costs no connection.
pub const GROUP_COMMIT_CONCURRENCY: usize = 100;

/// `outbox.audit`: appends the event to `audit_log`.
#[derive(Clone)]
pub struct AuditHandler {
    writer: GroupCommit<AuditRow>,
}

impl AuditHandler {
    /// A handler writing through `pool`. Its writer task starts with the
    /// first job (inside the runtime) and ends when the handler and its
    /// clones are dropped.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self {
            writer: GroupCommit::new(pool, queues::AUDIT),
        }
    }
}

impl JobHandler for AuditHandler {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        queues::AUDIT
    }

    fn concurrency(&self, configured: usize) -> usize {
        configured.max(GROUP_COMMIT_CONCURRENCY)
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let fields = fields(&job);
        let actor = text_field(fields.as_ref(), &["actor", "actorId", "userId", "user_id"]);
        if self.writer.write(AuditRow { job, actor }).await? == Written::AlreadyRecorded {
            tracing::info!("audit entry already recorded; nothing to do");
        }
        Ok(())
    }
}

/// `outbox.notification`: writes an in-app notification.
///
/// The title is the payload's `title` when present, else derived from the
/// event type (`billing.subscription.updated` → "Billing: subscription
/// updated"); the body is `body` or `message`; the recipient is `userId` /
/// `user_id` (none means every member of the tenant).
#[derive(Clone)]
pub struct NotificationHandler {
    writer: GroupCommit<NotificationRow>,
}

impl NotificationHandler {
    /// A handler writing through `pool`. Its writer task starts with the
    /// first job (inside the runtime) and ends when the handler and its
    /// clones are dropped.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self {
            writer: GroupCommit::new(pool, queues::NOTIFICATION),
        }
    }
}

/// "billing.subscription.updated" → "Billing: subscription updated".
fn default_title(event_type: &str) -> String {
    let mut segments = event_type.split('.');
    let domain = segments.next().unwrap_or_default();
    let rest: Vec<String> = segments.map(|s| s.replace('-', " ")).collect();
    let mut chars = domain.chars();
    let domain = chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect::<String>())
        .unwrap_or_default();
    format!("{domain}: {}", rest.join(" "))
}

impl JobHandler for NotificationHandler {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        queues::NOTIFICATION
    }

    fn concurrency(&self, configured: usize) -> usize {
        configured.max(GROUP_COMMIT_CONCURRENCY)
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let fields = fields(&job);
        let title = text_field(fields.as_ref(), &["title"])
            .unwrap_or_else(|| default_title(&job.event_type));
        let row = NotificationRow {
            user_id: text_field(fields.as_ref(), &["userId", "user_id"]),
            body: text_field(fields.as_ref(), &["body", "message"]),
            title,
            job,
        };
        if self.writer.write(row).await? == Written::AlreadyRecorded {
            tracing::info!("notification already written; nothing to do");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_are_derived_from_event_types() {
        assert_eq!(
            default_title("billing.subscription.updated"),
            "Billing: subscription updated"
        );
        assert_eq!(
            default_title("tenant.subscription.trial-ending"),
            "Tenant: subscription trial ending"
        );
    }
}
