//! The built-in subscribers, registered as an application registers its
//! own: each is a [`Subscriber`] ([`BuiltIn`]), its description from
//! `outbox_catalog::built_in` paired with the handlers it makes at start,
//! and a group is the list of them ([`built_in_subscribers`]), one entry
//! each. The handlers a group runs and what its `--help` says it consumes
//! ([`about`]) are read from that list.
//!
//! Each entry names its handler types by their full path and needs nothing
//! outside itself but the two helpers of the HTTP-delivering entries, so
//! that a cargo feature can take one subscriber out by gating its entry
//! (`#[cfg(feature = "…")]`), its crate becoming an optional dependency.

use std::sync::LazyLock;

#[cfg(any(feature = "mail", feature = "webhook", feature = "plugin"))]
use anyhow::Context;
use anyhow::Result;
use outbox_subscriber::{HandlerGroup, SubscriberDescription};
#[cfg(any(feature = "webhook", feature = "plugin"))]
use outbox_subscriber_webhook::{Deliverer, DeliverySettings, OnceSettings};

use crate::{Group, Resources, Subscriber};

/// A built-in subscriber: its description (`outbox_catalog::built_in`)
/// and the handlers it adds to its group.
#[derive(Clone, Copy)]
pub struct BuiltIn {
    description: SubscriberDescription,
    handlers: fn(HandlerGroup, &Resources<'_>) -> Result<HandlerGroup>,
}

impl std::fmt::Debug for BuiltIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltIn")
            .field("name", &self.description.name)
            .finish_non_exhaustive()
    }
}

impl BuiltIn {
    // Each entry of the lists is behind its feature: a build without the
    // defaults may have none.
    #[cfg_attr(not(feature = "default"), allow(dead_code))]
    const fn new(
        description: SubscriberDescription,
        handlers: fn(HandlerGroup, &Resources<'_>) -> Result<HandlerGroup>,
    ) -> Self {
        Self {
            description,
            handlers,
        }
    }
}

impl Subscriber for BuiltIn {
    fn description(&self) -> SubscriberDescription {
        self.description
    }

    fn handlers(self, group: HandlerGroup, resources: &Resources<'_>) -> Result<HandlerGroup> {
        (self.handlers)(group, resources)
    }
}

/// What `worker-general` runs besides the dispatcher and retention.
const GENERAL: &[BuiltIn] = &[
    #[cfg(feature = "audit")]
    BuiltIn::new(outbox_catalog::built_in::AUDIT, |group, r| {
        Ok(group.with(outbox_subscriber_audit::AuditHandler::new(r.pool.clone()))?)
    }),
    #[cfg(feature = "notification")]
    BuiltIn::new(outbox_catalog::built_in::NOTIFICATION, |group, r| {
        Ok(
            group.with(outbox_subscriber_audit::NotificationHandler::new(
                r.pool.clone(),
            ))?,
        )
    }),
    #[cfg(feature = "workflow")]
    BuiltIn::new(outbox_catalog::built_in::WORKFLOW, |group, r| {
        let executor = crate::workflow_executor(r.config)?;
        Ok(group.with(outbox_subscriber_workflow::WorkflowHandler::new(
            r.pool.clone(),
            executor,
        ))?)
    }),
    #[cfg(feature = "plugin")]
    BuiltIn::new(outbox_catalog::built_in::PLUGIN_HOOKS, |group, r| {
        use outbox_subscriber_webhook::{PluginHookHandler, PluginInvokeHandler};
        let hooks = PluginHookHandler::new(r.pool.clone(), r.redis.clone(), r.namespace.clone());
        let invocations =
            PluginInvokeHandler::new(r.pool.clone(), deliverer(r)?, r.idempotency(), once(r));
        Ok(group.with(hooks)?.with(invocations)?)
    }),
];

/// What `worker-mail` runs.
const MAIL: &[BuiltIn] = &[
    #[cfg(feature = "mail")]
    BuiltIn::new(outbox_catalog::built_in::MAIL, |group, r| {
        use outbox_subscriber_mail::{MailRequestHandler, SmtpHandler, SmtpSettings};
        let smtp_url = r
            .config
            .smtp_url
            .clone()
            .context("SMTP_URL is required for the mail group")?;
        let smtp = SmtpSettings {
            default_from: r.config.mail_from.clone(),
            lease: r.config.delivery_lease,
            ttl: r.config.delivery_record_ttl,
            ..SmtpSettings::new(smtp_url)
        };
        let requests =
            MailRequestHandler::new(r.templates.clone(), r.redis.clone(), r.namespace.clone());
        Ok(group
            .with(requests)?
            .with(SmtpHandler::new(smtp, r.idempotency())?)?)
    }),
    #[cfg(feature = "webhook")]
    BuiltIn::new(outbox_catalog::built_in::WEBHOOK, |group, r| {
        Ok(group.with(outbox_subscriber_webhook::WebhookHandler::new(
            r.pool.clone(),
            deliverer(r)?,
            r.idempotency(),
            once(r),
        ))?)
    }),
    #[cfg(feature = "mail")]
    BuiltIn::new(outbox_catalog::built_in::MARKETING, |group, r| {
        Ok(
            group.with(outbox_subscriber_mail::MarketingLeadHandler::new(
                r.pool.clone(),
                r.templates.clone(),
                r.redis.clone(),
                r.namespace.clone(),
            ))?,
        )
    }),
];

/// The built-in subscribers of `group`, as `worker-general` and
/// `worker-mail` run them.
///
/// ```
/// use outbox_worker::{Group, Subscriber, built_in_subscribers};
/// let names: Vec<&str> = built_in_subscribers(Group::Mail)
///     .iter()
///     .map(|s| s.description().name)
///     .collect();
/// assert_eq!(names, ["mail", "webhook", "marketing"]);
/// ```
#[must_use]
pub fn built_in_subscribers(group: Group) -> &'static [BuiltIn] {
    match group {
        Group::General => GENERAL,
        Group::Mail => MAIL,
    }
}

/// The handlers of the built-in `subscribers`, made from `resources`.
pub(crate) fn handlers(subscribers: &[BuiltIn], resources: &Resources<'_>) -> Result<HandlerGroup> {
    subscribers
        .iter()
        .try_fold(HandlerGroup::new(), |handlers, subscriber| {
            subscriber.handlers(handlers, resources)
        })
}

/// The HTTP client of webhook and plugin deliveries.
#[cfg(any(feature = "webhook", feature = "plugin"))]
fn deliverer(r: &Resources<'_>) -> Result<Deliverer> {
    Deliverer::new(DeliverySettings {
        timeout: r.config.webhook_timeout,
        address_policy: r.config.address_policy.clone(),
        ..DeliverySettings::default()
    })
    .context("cannot build the HTTP client")
}

/// How long a webhook or plugin delivery is leased and remembered.
#[cfg(any(feature = "webhook", feature = "plugin"))]
fn once(r: &Resources<'_>) -> OnceSettings {
    OnceSettings {
        lease: r.config.delivery_lease,
        ttl: r.config.delivery_record_ttl,
    }
}

/// What the binary of `group` is, as `--help` says it first: the group's
/// own work, and the queues its built-in subscribers consume (routed ones
/// first, in the list's order, then the downstream ones).
pub(crate) fn about(group: Group) -> &'static str {
    static GENERAL_ABOUT: LazyLock<String> =
        LazyLock::new(|| sentence(Group::General, built_in_subscribers(Group::General)));
    static MAIL_ABOUT: LazyLock<String> =
        LazyLock::new(|| sentence(Group::Mail, built_in_subscribers(Group::Mail)));
    match group {
        Group::General => &GENERAL_ABOUT,
        Group::Mail => &MAIL_ABOUT,
    }
}

/// What a worker of `group` running the built-in `subscribers` is (see
/// [`about`]).
pub(crate) fn sentence(group: Group, subscribers: &[BuiltIn]) -> String {
    let routed = subscribers
        .iter()
        .flat_map(|s| s.description.consumes.iter().map(|c| c.queue));
    let fed = subscribers
        .iter()
        .flat_map(|s| s.description.feeds.iter().map(|f| f.queue));
    let queues: Vec<&str> = routed.chain(fed).collect();
    let (worker, mut work) = match group {
        Group::General => (
            "general",
            vec![
                "the dispatcher (with OUTBOX_DISPATCHER_ENABLED=true)".to_owned(),
                "retention".to_owned(),
            ],
        ),
        Group::Mail => ("mail", Vec::new()),
    };
    if !queues.is_empty() {
        work.push(format!("the queues {}", queues.join(", ")));
    }
    let work = match work.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{}, and {last}", rest.join(", ")),
        Some((only, _)) => only.clone(),
        None => "nothing".to_owned(),
    };
    format!("The transactional outbox's {worker} worker: {work}.")
}

#[cfg(test)]
// The lists as the binaries run them: the default features.
#[cfg(feature = "default")]
mod tests {
    use super::*;

    /// Every built-in description but the contract's queues left to
    /// applications is run by exactly one group, and nothing else is.
    #[test]
    fn the_groups_run_every_built_in_description_once() {
        let mut run: Vec<&str> = [Group::General, Group::Mail]
            .into_iter()
            .flat_map(built_in_subscribers)
            .map(|s| s.description.name)
            .collect();
        run.sort_unstable();
        let mut described: Vec<&str> = outbox_catalog::BUILT_IN
            .iter()
            .filter(|d| **d != outbox_catalog::FOR_APPLICATIONS)
            .map(|d| d.name)
            .collect();
        described.sort_unstable();
        assert_eq!(run, described);
    }

    /// The help sentence of each group, made from its list.
    #[test]
    fn each_group_says_its_work_and_its_subscribers_queues() {
        assert_eq!(
            about(Group::General),
            "The transactional outbox's general worker: the dispatcher (with \
             OUTBOX_DISPATCHER_ENABLED=true), retention, and the queues outbox.audit, \
             outbox.notification, outbox.workflow, outbox.plugin-hook, toolctrl.plugin-invoke."
        );
        assert_eq!(
            about(Group::Mail),
            "The transactional outbox's mail worker: the queues outbox.mail, outbox.webhook, \
             outbox.marketing, toolctrl.email."
        );
    }
}
