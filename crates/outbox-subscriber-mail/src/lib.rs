//! Mail subscribers.
//!
//! - [`MailRequestHandler`] (`outbox.mail`): validates a `mail.*` payload
//!   (`to`, `subject` + `text`/`html`, or a named `template` with `vars`),
//!   renders it, and enqueues one `toolctrl.email` job with the
//!   deterministic id `email:<event id>`. Invalid requests are permanent
//!   failures with the reason.
//! - [`MarketingLeadHandler`] (`outbox.marketing`): `marketing.lead.*`
//!   events become a mail to the tenant's sales inbox through the same path.
//! - [`SmtpHandler`] (`toolctrl.email`): sends over SMTP with lettre, once
//!   per event (idempotency store); permanent SMTP refusals (5xx) are
//!   dead-lettered, transient ones (4xx, connection) retried. Every mail
//!   carries the stable `Message-ID` [`message_id`] derives from the event
//!   id, so a duplicate send is recognisably the same message.
//!
//! Rendering is split from sending so that a slow or failing SMTP server
//! never blocks validation, and a mail is rendered exactly once.

mod handlers;
mod render;

use outbox_queue::queues;
use outbox_subscriber::{ConsumedQueue, DedupKey, DownstreamQueue, SubscriberDescription};

/// The queues this crate's handlers consume from the routing table and what
/// they read there (`toolctrl.email` is fed by them, not routed to).
pub const CONSUMES: &[ConsumedQueue] = &[
    ConsumedQueue {
        queue: queues::MAIL,
        routes: &["mail."],
        payload: "`to` (string or array; required), optional `cc`, `from`, `replyTo`; then `subject` with `text` and/or `html`, or `template` with `vars` (an object)",
    },
    ConsumedQueue {
        queue: queues::MARKETING,
        routes: &["marketing.lead."],
        payload: "`name`, `email`, `company`, `message` (all optional); mailed to the tenant's sales inbox",
    },
];

/// What this crate adds to a worker: mail requests and marketing leads
/// are rendered into `toolctrl.email` jobs, which are sent once each.
pub const DESCRIPTION: SubscriberDescription = SubscriberDescription {
    name: "outbox-subscriber-mail",
    consumes: CONSUMES,
    feeds: &[DownstreamQueue {
        queue: queues::TOOLCTRL_EMAIL,
        derived_from: &[queues::MAIL, queues::MARKETING],
        task_id: "email:<delivery id>",
    }],
    dedup: &[DedupKey {
        queue: queues::TOOLCTRL_EMAIL,
        key: "email:<delivery id>",
        recorded_in: "idempotency store",
    }],
};

pub use handlers::{
    MAIL_FROM, MailRequestHandler, MarketingLeadHandler, SMTP_URL, SmtpConfigError, SmtpHandler,
    SmtpSettings,
};
pub use render::{
    EmailJob, MESSAGE_ID_FALLBACK_DOMAIN, MailError, Template, Templates, email_task_id,
    message_id, render_request,
};
