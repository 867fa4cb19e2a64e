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
//!
//! What these handlers consume, feed and deduplicate on is described
//! once, as plain data, in `outbox_catalog::built_in` (`WEBHOOK`, `PLUGIN_HOOKS`), which
//! the worker pairs with them.

mod delivery;
mod once;
mod plugin;
mod signing;
mod webhook;

pub use delivery::{Deliverer, Delivery, DeliverySettings, WEBHOOK_TIMEOUT_MS, classify};
pub use once::{DELIVERY_LEASE_MS, Once, OnceSettings, deliver_once};
pub use outbox_http_guard::{AddressPolicy, AllowList};
pub use plugin::{
    HOOK_PREFIX, PluginHookHandler, PluginInvokeHandler, PluginInvokeJob, invoke_task_id,
};
pub use signing::{SecretError, secret_key, sign, verify};
pub use webhook::{WebhookBody, WebhookEndpoint, WebhookHandler, matches_filter};
