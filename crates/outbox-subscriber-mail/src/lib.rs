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
//!
//! What these handlers consume, feed and deduplicate on is described
//! once, as plain data, in `outbox_catalog::built_in` (`MAIL`, `MARKETING`), which
//! the worker pairs with them.

mod handlers;
mod render;

pub use handlers::{
    MAIL_FROM, MailRequestHandler, MarketingLeadHandler, SMTP_URL, SmtpConfigError, SmtpHandler,
    SmtpSettings,
};
pub use render::{
    EmailJob, MESSAGE_ID_FALLBACK_DOMAIN, MailError, Template, Templates, email_task_id,
    message_id, render_request,
};
