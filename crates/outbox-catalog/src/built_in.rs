//! The built-in subscribers' descriptions, one constant each, as plain
//! data: what each handler set of the `outbox-subscriber-*` crates
//! consumes, feeds and deduplicates on. They live here rather than beside
//! their handlers so that reading them (the operator CLI, the routing
//! table) compiles no handler: the workflow subscriber's crate alone
//! brings the workflow runner, the bridge and their network stack.
//!
//! One description is one unit a worker runs or not: `outbox-worker` pairs
//! each with the handlers it makes, and a group is the list of those.

use outbox_queue::queues;
use outbox_subscriber::{ConsumedQueue, DedupKey, DownstreamQueue, SubscriberDescription};

/// `outbox.audit` (`outbox-subscriber-audit`'s `AuditHandler`): one
/// `audit_log` row per event, keyed by the event id.
pub const AUDIT: SubscriberDescription = SubscriberDescription {
    name: "audit",
    consumes: &[ConsumedQueue {
        queue: queues::AUDIT,
        routes: &["audit."],
        payload: "any object, stored whole; `actor` / `actorId` / `userId` / `user_id` (optional) becomes the entry's actor",
    }],
    feeds: &[],
    dedup: &[DedupKey {
        queue: queues::AUDIT,
        key: "<event id>",
        recorded_in: "audit_log.outbox_event_id",
    }],
};

/// `outbox.notification` (`outbox-subscriber-audit`'s
/// `NotificationHandler`): one in-app `notification` row per event, keyed
/// by the event id.
pub const NOTIFICATION: SubscriberDescription = SubscriberDescription {
    name: "notification",
    consumes: &[ConsumedQueue {
        queue: queues::NOTIFICATION,
        routes: &["tenant.subscription.", "notification.", "billing."],
        payload: "any object, stored whole; optional `title`, `body` / `message`, `userId` / `user_id` (none: every member of the tenant)",
    }],
    feeds: &[],
    dedup: &[DedupKey {
        queue: queues::NOTIFICATION,
        key: "<event id>",
        recorded_in: "notification.outbox_event_id",
    }],
};

/// `outbox.workflow` (`outbox-subscriber-workflow`'s `WorkflowHandler`):
/// workflow triggers, runs and continuations; a trigger's executions are
/// keyed by the event id.
pub const WORKFLOW: SubscriberDescription = SubscriberDescription {
    name: "workflow",
    consumes: &[ConsumedQueue {
        queue: queues::WORKFLOW,
        routes: &["workflow."],
        payload: "`workflow.trigger.event`: `tenantId`, `entity`, `event`, `row`, `applicationEventId`, `allowExternalCallouts`; `workflow.execution.requested`: `executionId`, `tenantId`, `workflowId`; `workflow.execution.continue.requested`: `executionId`, `tenantId`, `waitingBlock`, `input`, `kind` (published by `outbox-workflow-store`'s producers)",
    }],
    feeds: &[],
    dedup: &[DedupKey {
        queue: queues::WORKFLOW,
        key: "<workflow id>, <event id> (a trigger's executions)",
        recorded_in: "workflow_execution.trigger_event_id",
    }],
};

/// `outbox.plugin-hook` and `toolctrl.plugin-invoke`
/// (`outbox-subscriber-webhook`'s `PluginHookHandler` and
/// `PluginInvokeHandler`): a hook fanned out into one invocation job per
/// subscription, each delivered once.
pub const PLUGIN_HOOKS: SubscriberDescription = SubscriberDescription {
    name: "plugin hooks",
    consumes: &[ConsumedQueue {
        queue: queues::PLUGIN_HOOK,
        routes: &["plugin.hook."],
        payload: "any object, delivered to every plugin subscribed to the hook (`plugin.hook.<hook>`)",
    }],
    feeds: &[DownstreamQueue {
        queue: queues::TOOLCTRL_PLUGIN_INVOKE,
        derived_from: &[queues::PLUGIN_HOOK],
        task_id: outbox_queue::PLUGIN_INVOKE_TASK_IDS,
    }],
    dedup: &[DedupKey {
        queue: queues::TOOLCTRL_PLUGIN_INVOKE,
        key: "plugin-invoke:<delivery id>:<subscription id>",
        recorded_in: "idempotency store",
    }],
};

/// `outbox.webhook` (`outbox-subscriber-webhook`'s `WebhookHandler`):
/// signed deliveries, once per endpoint.
pub const WEBHOOK: SubscriberDescription = SubscriberDescription {
    name: "webhook",
    consumes: &[ConsumedQueue {
        queue: queues::WEBHOOK,
        routes: &["webhook."],
        payload: "any object, delivered as the body's `data` to every matching `webhook_endpoint` of the tenant",
    }],
    feeds: &[],
    dedup: &[DedupKey {
        queue: queues::WEBHOOK,
        key: "webhook:<delivery id>:<endpoint id>",
        recorded_in: "idempotency store",
    }],
};

/// `outbox.mail` and `toolctrl.email` (`outbox-subscriber-mail`'s
/// `MailRequestHandler` and `SmtpHandler`): a mail request rendered into
/// one `toolctrl.email` job, sent once. [`MARKETING`]'s leads are mailed
/// through the same `toolctrl.email` queue.
pub const MAIL: SubscriberDescription = SubscriberDescription {
    name: "mail",
    consumes: &[ConsumedQueue {
        queue: queues::MAIL,
        routes: &["mail."],
        payload: "`to` (string or array; required), optional `cc`, `from`, `replyTo`; then `subject` with `text` and/or `html`, or `template` with `vars` (an object)",
    }],
    feeds: &[DownstreamQueue {
        queue: queues::TOOLCTRL_EMAIL,
        derived_from: &[queues::MAIL, queues::MARKETING],
        task_id: outbox_queue::EMAIL_TASK_IDS,
    }],
    dedup: &[DedupKey {
        queue: queues::TOOLCTRL_EMAIL,
        key: "email:<delivery id>",
        recorded_in: "idempotency store",
    }],
};

/// `outbox.marketing` (`outbox-subscriber-mail`'s `MarketingLeadHandler`):
/// a lead mailed to the tenant's sales inbox, through [`MAIL`]'s
/// `toolctrl.email` queue.
pub const MARKETING: SubscriberDescription = SubscriberDescription {
    name: "marketing",
    consumes: &[ConsumedQueue {
        queue: queues::MARKETING,
        routes: &["marketing.lead."],
        payload: "`name`, `email`, `company`, `message` (all optional); mailed to the tenant's sales inbox",
    }],
    feeds: &[],
    dedup: &[],
};
