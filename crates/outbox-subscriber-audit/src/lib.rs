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

use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use outbox_model::PgPool;
use outbox_model::schema::{audit_log, notification};
use outbox_queue::{OutboxJob, queues};
use outbox_subscriber::{
    ConsumedQueue, DedupKey, JobError, JobHandler, JobMeta, SubscriberDescription,
};
use serde_json::Value;

/// The queues this crate's handlers consume and what they read there.
pub const CONSUMES: &[ConsumedQueue] = &[
    ConsumedQueue {
        queue: queues::AUDIT,
        payload: "any object, stored whole; `actor` / `actorId` / `userId` / `user_id` (optional) becomes the entry's actor",
    },
    ConsumedQueue {
        queue: queues::NOTIFICATION,
        payload: "any object, stored whole; optional `title`, `body` / `message`, `userId` / `user_id` (none: every member of the tenant)",
    },
];

/// What this crate adds to a worker: the audit and notification queues,
/// deduplicated by the event id in their tables.
pub const DESCRIPTION: SubscriberDescription = SubscriberDescription {
    name: "outbox-subscriber-audit",
    consumes: CONSUMES,
    feeds: &[],
    dedup: &[
        DedupKey {
            queue: queues::AUDIT,
            key: "<event id>",
            recorded_in: "audit_log.outbox_event_id",
        },
        DedupKey {
            queue: queues::NOTIFICATION,
            key: "<event id>",
            recorded_in: "notification.outbox_event_id",
        },
    ],
};

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

fn db_error(e: impl std::fmt::Display) -> JobError {
    JobError::retry(format!("database error: {e}"))
}

/// `outbox.audit`: appends the event to `audit_log`.
#[derive(Clone)]
pub struct AuditHandler {
    pool: PgPool,
}

impl AuditHandler {
    /// A handler writing through `pool`.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

impl JobHandler for AuditHandler {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        queues::AUDIT
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let mut conn = self.pool.get().await.map_err(db_error)?;
        let fields = fields(&job);
        let actor = text_field(fields.as_ref(), &["actor", "actorId", "userId", "user_id"]);
        let inserted = diesel::insert_into(audit_log::table)
            .values((
                audit_log::outbox_event_id.eq(job.outbox_event_id),
                audit_log::tenant_id.eq(&job.tenant_id),
                audit_log::event_type.eq(&job.event_type),
                audit_log::actor.eq(actor),
                audit_log::payload.eq(&job.payload),
                audit_log::occurred_at.eq(job.created_at),
            ))
            .on_conflict(audit_log::outbox_event_id)
            .do_nothing()
            .execute(&mut conn)
            .await
            .map_err(db_error)?;
        if inserted == 0 {
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
    pool: PgPool,
}

impl NotificationHandler {
    /// A handler writing through `pool`.
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
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

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let mut conn = self.pool.get().await.map_err(db_error)?;
        let fields = fields(&job);
        let title = text_field(fields.as_ref(), &["title"])
            .unwrap_or_else(|| default_title(&job.event_type));
        diesel::insert_into(notification::table)
            .values((
                notification::outbox_event_id.eq(job.outbox_event_id),
                notification::tenant_id.eq(&job.tenant_id),
                notification::user_id.eq(text_field(fields.as_ref(), &["userId", "user_id"])),
                notification::kind.eq(&job.event_type),
                notification::title.eq(title),
                notification::body.eq(text_field(fields.as_ref(), &["body", "message"])),
                notification::data.eq(&job.payload),
            ))
            .on_conflict(notification::outbox_event_id)
            .do_nothing()
            .execute(&mut conn)
            .await
            .map_err(db_error)?;
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
