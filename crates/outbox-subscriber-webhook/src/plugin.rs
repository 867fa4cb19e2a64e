//! Plugin hooks: `outbox.plugin-hook` fans a `plugin.hook.<hook>` event out
//! into one `toolctrl.plugin-invoke` job per subscribed plugin;
//! `toolctrl.plugin-invoke` delivers each, signed like a webhook.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use outbox_idempotency::RedisIdempotencyStore;
use outbox_model::schema::plugin_hook_subscription;
use outbox_pg::PgPool;
use outbox_queue::RedisConnection;
use outbox_queue::{OutboxJob, QueueNamespace, endpoint_origin, push_raw, queues};
use outbox_subscriber::{JobError, JobHandler, JobMeta};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{Deliverer, Delivery, Once, OnceSettings, deliver_once};

/// The prefix of plugin hook event types.
pub const HOOK_PREFIX: &str = "plugin.hook.";

/// The body of a `toolctrl.plugin-invoke` job. The endpoint and secret are
/// read from the subscription at delivery time (never stored in Redis), so a
/// rotated secret or a disabled subscription takes effect at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginInvokeJob {
    /// The originating outbox event.
    pub outbox_event_id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The subscription to deliver to.
    pub subscription_id: Uuid,
    /// The plugin's name.
    pub plugin: String,
    /// The hook (`workflow.executed` for `plugin.hook.workflow.executed`).
    pub hook: String,
    /// The full event type.
    pub event_type: String,
    /// The event payload, as the exact text of the outbox row.
    pub payload: outbox_model::RawJson,
    /// When the event was recorded.
    pub created_at: DateTime<Utc>,
    /// The event's delivery generation (see [`outbox_queue::delivery_id`]).
    #[serde(default)]
    pub generation: u32,
    /// The trace context of the fan-out job's span, which the invocation's
    /// span continues (see [`outbox_queue::OutboxJob::trace_context`]).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "outbox_trace::deserialize_lenient"
    )]
    pub trace_context: Option<outbox_trace::TraceContext>,
}

impl PluginInvokeJob {
    /// The id of this delivery generation of the event.
    #[must_use]
    pub fn delivery_id(&self) -> String {
        outbox_queue::delivery_id(self.outbox_event_id, self.generation)
    }
}

/// The deterministic task id (and idempotency key) of one plugin
/// invocation: `plugin-invoke:<delivery id>:<subscription id>`, where the
/// delivery id is the event id for generation 0 (see
/// [`outbox_queue::delivery_id`]); [`outbox_queue::plugin_invoke_task_id`],
/// which reconciliation after a Redis loss also uses.
#[must_use]
pub fn invoke_task_id(delivery_id: &str, subscription_id: Uuid) -> String {
    outbox_queue::plugin_invoke_task_id(delivery_id, subscription_id)
}

fn db(e: impl std::fmt::Display) -> JobError {
    JobError::retry(format!("database: {e}"))
}

/// `outbox.plugin-hook`: the fan-out.
#[derive(Clone)]
pub struct PluginHookHandler {
    pool: PgPool,
    redis: RedisConnection,
    namespace: QueueNamespace,
}

impl PluginHookHandler {
    /// A handler reading subscriptions through `pool` and pushing into `namespace`.
    #[must_use]
    pub fn new(pool: PgPool, redis: RedisConnection, namespace: QueueNamespace) -> Self {
        Self {
            pool,
            redis,
            namespace,
        }
    }
}

impl JobHandler for PluginHookHandler {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        queues::PLUGIN_HOOK
    }

    async fn handle(&self, job: OutboxJob, _meta: &JobMeta) -> Result<(), JobError> {
        let Some(hook) = job.event_type.strip_prefix(HOOK_PREFIX) else {
            return Err(JobError::permanent(format!(
                "{} is not a plugin.hook.* event",
                job.event_type
            )));
        };
        let subscriptions: Vec<(Uuid, String)> = {
            let mut conn = self.pool.get().await.map_err(db)?;
            plugin_hook_subscription::table
                .filter(plugin_hook_subscription::tenant_id.eq(&job.tenant_id))
                .filter(plugin_hook_subscription::hook.eq(hook))
                .filter(plugin_hook_subscription::enabled.eq(true))
                .select((
                    plugin_hook_subscription::id,
                    plugin_hook_subscription::plugin,
                ))
                .load(&mut conn)
                .await
                .map_err(db)?
        };
        let trace_context = outbox_trace::TraceContext::current();
        let jobs = subscriptions
            .into_iter()
            .map(|(subscription_id, plugin)| {
                let invoke = PluginInvokeJob {
                    outbox_event_id: job.outbox_event_id,
                    tenant_id: job.tenant_id.clone(),
                    subscription_id,
                    plugin,
                    hook: hook.to_owned(),
                    event_type: job.event_type.clone(),
                    payload: job.payload.clone(),
                    created_at: job.created_at,
                    generation: job.generation,
                    trace_context: trace_context.clone(),
                };
                serde_json::to_vec(&invoke)
                    .map(|body| (invoke_task_id(&job.delivery_id(), subscription_id), body))
                    .map_err(|e| JobError::permanent(format!("cannot encode invocation: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut redis = self.redis.clone();
        let report = push_raw(
            &mut redis,
            &self.namespace,
            queues::TOOLCTRL_PLUGIN_INVOKE,
            &jobs,
        )
        .await
        .map_err(|e| JobError::retry(format!("cannot enqueue plugin invocations: {e}")))?;
        tracing::info!(
            hook,
            subscriptions = jobs.len(),
            new = report.new,
            "plugin hook fanned out"
        );
        Ok(())
    }
}

/// The body plugins receive.
#[derive(Debug, Serialize)]
struct PluginBody<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    hook: &'a str,
    plugin: &'a str,
    tenant_id: &'a str,
    timestamp: DateTime<Utc>,
    data: &'a outbox_model::RawJson,
}

/// `toolctrl.plugin-invoke`: one signed delivery to one subscribed plugin.
#[derive(Clone)]
pub struct PluginInvokeHandler {
    pool: PgPool,
    deliverer: Deliverer,
    store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
    once: OnceSettings,
}

impl PluginInvokeHandler {
    /// A handler reading subscriptions through `pool`.
    #[must_use]
    pub fn new(
        pool: PgPool,
        deliverer: Deliverer,
        store: RedisIdempotencyStore<outbox_queue::RedisConnection>,
        once: OnceSettings,
    ) -> Self {
        Self {
            pool,
            deliverer,
            store,
            once,
        }
    }
}

impl JobHandler for PluginInvokeHandler {
    type Job = PluginInvokeJob;

    fn queue(&self) -> &str {
        queues::TOOLCTRL_PLUGIN_INVOKE
    }

    async fn handle(&self, job: PluginInvokeJob, _meta: &JobMeta) -> Result<(), JobError> {
        let target: Option<(String, String, bool)> = {
            let mut conn = self.pool.get().await.map_err(db)?;
            plugin_hook_subscription::table
                .find(job.subscription_id)
                .select((
                    plugin_hook_subscription::endpoint,
                    plugin_hook_subscription::secret,
                    plugin_hook_subscription::enabled,
                ))
                .first(&mut conn)
                .await
                .optional()
                .map_err(db)?
        };
        let Some((endpoint, secret, true)) = target else {
            tracing::info!(subscription_id = %job.subscription_id, "subscription removed or disabled; not invoking");
            return Ok(());
        };
        let body = PluginBody {
            kind: &job.event_type,
            hook: &job.hook,
            plugin: &job.plugin,
            tenant_id: &job.tenant_id,
            timestamp: job.created_at,
            data: &job.payload,
        };
        let message_id = job.delivery_id();
        let key = invoke_task_id(&message_id, job.subscription_id);
        // The endpoint's path and query may hold a token: show its origin only.
        let shown = endpoint_origin(&endpoint);
        match deliver_once(&self.store, &key, self.once, async || {
            self.deliverer
                .deliver(&endpoint, &secret, &message_id, &body)
                .await
        })
        .await?
        {
            Once::Delivered => {
                tracing::info!(plugin = %job.plugin, hook = %job.hook, endpoint = %shown, "plugin invoked");
                Ok(())
            }
            Once::AlreadyDelivered => Ok(()),
            Once::Failed(Delivery::Retry(reason)) => {
                Err(JobError::retry(format!("{shown}: {reason}")))
            }
            Once::Failed(Delivery::Permanent(reason)) => {
                Err(JobError::permanent(format!("{shown}: {reason}")))
            }
            Once::Failed(Delivery::Delivered { .. }) => Ok(()),
        }
    }
}
