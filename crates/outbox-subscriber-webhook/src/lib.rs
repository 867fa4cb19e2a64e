//! Signed HTTP delivery to tenants' endpoints and to plugins.
//!
//! - [`WebhookHandler`] (`outbox.webhook`): each `webhook.*` event goes to
//!   every enabled `webhook_endpoint` of its tenant whose filter matches.
//! - [`PluginHookHandler`] (`outbox.plugin-hook`): a `plugin.hook.<hook>`
//!   event becomes one `toolctrl.plugin-invoke` job per subscribed plugin,
//!   with the deterministic id `plugin-invoke:<event id>:<subscription id>`.
//! - [`PluginInvokeHandler`] (`toolctrl.plugin-invoke`): one delivery.
//!
//! Deliveries are signed in the Standard Webhooks form ([`sign`]): headers
//! `webhook-id` (the event id), `webhook-timestamp` and `webhook-signature`
//! (`v1,<base64 HMAC-SHA256>`), plus the W3C `traceparent` (and
//! `tracestate`) of the delivery's span, so the receiver can continue the
//! event's trace. 2xx succeeds; 408, 429, 5xx, timeouts and
//! connection failures are retried; other 4xx and redirects are permanent
//! (the job goes to the dead set with the reason). Loopback, private and
//! link-local targets are refused by the address guard of
//! [`outbox_http_guard`] unless the [`AddressPolicy`] of
//! [`DeliverySettings`] allows them (an [`AllowList`] of hosts and ranges,
//! or every internal address).
//! Each (event, endpoint) pair is delivered at most once successfully,
//! remembered in the idempotency store, so a retry after a partial failure
//! only sends to the endpoints that have not answered yet.

mod delivery;
mod once;
mod plugin;
mod signing;
mod webhook;

use outbox_queue::queues;
use outbox_subscriber::{ConsumedQueue, DedupKey, DownstreamQueue, SubscriberDescription};

/// The queues this crate's handlers consume from the routing table and what
/// they read there (`toolctrl.plugin-invoke` is fed by them, not routed to).
pub const CONSUMES: &[ConsumedQueue] = &[
    ConsumedQueue {
        queue: queues::WEBHOOK,
        routes: &["webhook."],
        payload: "any object, delivered as the body's `data` to every matching `webhook_endpoint` of the tenant",
    },
    ConsumedQueue {
        queue: queues::PLUGIN_HOOK,
        routes: &["plugin.hook."],
        payload: "any object, delivered to every plugin subscribed to the hook (`plugin.hook.<hook>`)",
    },
];

/// What this crate adds to a worker: webhooks delivered once per
/// endpoint, and plugin hooks fanned out into one `toolctrl.plugin-invoke`
/// job per subscription, each delivered once.
pub const DESCRIPTION: SubscriberDescription = SubscriberDescription {
    name: "outbox-subscriber-webhook",
    consumes: CONSUMES,
    feeds: &[DownstreamQueue {
        queue: queues::TOOLCTRL_PLUGIN_INVOKE,
        derived_from: &[queues::PLUGIN_HOOK],
        task_id: "plugin-invoke:<delivery id>:<subscription id>",
    }],
    dedup: &[
        DedupKey {
            queue: queues::WEBHOOK,
            key: "webhook:<delivery id>:<endpoint id>",
            recorded_in: "idempotency store",
        },
        DedupKey {
            queue: queues::TOOLCTRL_PLUGIN_INVOKE,
            key: "plugin-invoke:<delivery id>:<subscription id>",
            recorded_in: "idempotency store",
        },
    ],
};

pub use delivery::{Deliverer, Delivery, DeliverySettings, WEBHOOK_TIMEOUT_MS, classify};
pub use once::{DELIVERY_LEASE_MS, Once, OnceSettings, deliver_once};
pub use outbox_http_guard::{AddressPolicy, AllowList};
pub use plugin::{
    HOOK_PREFIX, PluginHookHandler, PluginInvokeHandler, PluginInvokeJob, invoke_task_id,
};
pub use signing::{SecretError, secret_key, sign, verify};
pub use webhook::{WebhookBody, WebhookEndpoint, WebhookHandler, matches_filter};
