//! What a worker's handlers are made from ([`Resources`]) and how a
//! subscriber joins a worker with one line ([`Subscriber`]); the handler
//! group of a group's built-in subscribers ([`handler_group`]).

use anyhow::Result;
use outbox_idempotency::RedisIdempotencyStore;
use outbox_pg::PgPool;
use outbox_queue::QueueNamespace;
use outbox_queue::RedisConnection;
use outbox_subscriber::{HandlerGroup, SubscriberDescription};
#[cfg(feature = "mail")]
use outbox_subscriber_mail::Templates;

#[cfg(doc)]
use crate::WorkerBuilder;
use crate::{Group, WorkerConfig};

/// What a handler added with [`WorkerBuilder::handler_with`] may use: the
/// worker's configuration and its connections, made at start.
#[derive(Clone, Copy)]
pub struct Resources<'a> {
    /// The configuration read at start.
    pub config: &'a WorkerConfig,
    /// The Postgres pool (`DATABASE_URL`, `DATABASE_POOL_SIZE`).
    pub pool: &'a PgPool,
    /// The Redis connection (`REDIS_URL`).
    pub redis: &'a RedisConnection,
    /// The queues' namespace (`OUTBOX_QUEUE_PREFIX`).
    pub namespace: &'a QueueNamespace,
    /// The mail templates ([`WorkerBuilder::template`]; feature `mail`).
    #[cfg(feature = "mail")]
    pub templates: &'a Templates,
}

impl Resources<'_> {
    /// The receivers' idempotency store on the worker's Redis, under the
    /// namespace's prefix (where the built-in handlers record their keys
    /// and reconciliation reads them).
    #[must_use]
    pub fn idempotency(&self) -> RedisIdempotencyStore<outbox_queue::RedisConnection> {
        RedisIdempotencyStore::new(self.redis.clone())
            .with_prefix(outbox_queue::idempotency_prefix(self.namespace))
    }
}

/// A subscriber a worker runs, registered with one line
/// ([`WorkerBuilder::subscriber`]): its description (the queues it
/// consumes and the routing prefixes that feed them, the downstream queues
/// it feeds, the keys it deduplicates on) and the handlers it adds at
/// start. Everything else follows from the description: the routing
/// table, `--help`, the queues measured and trimmed, reconciliation after
/// a Redis loss, and what the worker records for `outbox health` and
/// `outbox reconcile`.
///
/// A description alone is a subscriber without handlers (its queues are
/// then consumed elsewhere, or its handlers added with
/// [`WorkerBuilder::handler`]).
pub trait Subscriber: Send + 'static {
    /// What it adds to a worker, as plain data.
    fn description(&self) -> SubscriberDescription;

    /// Adds its handlers to `group`, made from the worker's [`Resources`].
    ///
    /// # Errors
    ///
    /// When a handler cannot be made (stops start-up; exit code 2 for a
    /// [`crate::ConfigError`]) or its queue already has one.
    fn handlers(self, group: HandlerGroup, resources: &Resources<'_>) -> Result<HandlerGroup>;
}

impl Subscriber for SubscriberDescription {
    fn description(&self) -> SubscriberDescription {
        *self
    }

    fn handlers(self, group: HandlerGroup, _: &Resources<'_>) -> Result<HandlerGroup> {
        Ok(group)
    }
}

/// The handlers of `group`'s built-in subscribers
/// ([`crate::built_in_subscribers`]), as `worker-general` and `worker-mail`
/// run them (with the standard mail templates and the ordering step, its
/// policy [`crate::OrderingPolicy::Hold`]).
///
/// # Errors
///
/// When a handler cannot be built (an invalid `SMTP_URL`, TLS set-up).
pub fn handler_group(
    group: Group,
    config: &WorkerConfig,
    pool: &PgPool,
    redis: &RedisConnection,
    namespace: &QueueNamespace,
) -> Result<HandlerGroup> {
    #[cfg(feature = "mail")]
    let templates = Templates::standard();
    let resources = Resources {
        config,
        pool,
        redis,
        namespace,
        #[cfg(feature = "mail")]
        templates: &templates,
    };
    let handlers = crate::built_in::handlers(crate::built_in_subscribers(group), &resources)?;
    Ok(crate::ordering::layer(
        handlers,
        pool,
        crate::OrderingPolicy::default(),
    ))
}
