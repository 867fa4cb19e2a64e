//! The routing table: event type → queue, longest matching prefix wins; a
//! rule may also name one whole event type (an application's typed event).
//! Which rules it holds, the subscribers say: the standard table is made of
//! the built-in subscribers' descriptions (`outbox_catalog::standard_router`).

use std::collections::BTreeMap;

/// Maps event types to queues by prefix; the longest matching prefix wins.
///
/// A rule's key is a prefix (segments followed by a dot, `billing.`) or
/// one whole event type (`orders.order.created`, no trailing dot), which
/// matches that event type only. A whole event type is longer than any
/// prefix of it, so it wins over every prefix rule that also matches: an
/// application routes its own typed event without taking the rest of a
/// prefix's events.
///
/// The contract's table is made of the subscribers' descriptions
/// (`outbox_catalog::standard_router`). Rules are added with
/// [`Router::with_rule`]; a rule whose prefix is already taken, or whose
/// prefix or queue is malformed, is rejected there, at construction, never at
/// dispatch time.
///
/// # Example
///
/// ```
/// use outbox_dispatch::Router;
///
/// let router = Router::empty()
///     .with_rule("billing.", "outbox.notification")?
///     .with_rule("billing.invoice.", "outbox.billing-docs")?;
/// assert_eq!(router.route("billing.subscription.renewed"), Some("outbox.notification"));
/// assert_eq!(router.route("billing.invoice.paid"), Some("outbox.billing-docs"));
/// assert_eq!(router.route("legacy.report.generated"), None);
/// assert!(router.clone().with_rule("billing.", "outbox.other").is_err());
///
/// let router = router.with_rule("billing.invoice.disputed", "app.disputes")?;
/// assert_eq!(router.route("billing.invoice.disputed"), Some("app.disputes"));
/// assert_eq!(router.route("billing.invoice.disputed.again"), Some("outbox.billing-docs"));
/// # Ok::<(), outbox_dispatch::RouteError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Router {
    /// Rules sorted by descending prefix length, so the first match is the longest.
    rules: Vec<(String, String)>,
}

/// Why a routing rule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The prefix is not one or more event-type segments followed by a
    /// dot, nor a whole event type.
    #[error(
        "invalid routing prefix {0:?}: expected lowercase segments of [a-z0-9-] each starting with a letter, ending in '.' (like \"billing.\"), or a whole event type (like \"orders.order.created\")"
    )]
    InvalidPrefix(String),
    /// The queue name is malformed.
    #[error(
        "invalid queue name {0:?}: expected two or more dot-separated lowercase segments of [a-z0-9-] (like \"outbox.mail\")"
    )]
    InvalidQueue(String),
    /// Another rule already has this prefix.
    #[error(
        "routing prefix {prefix:?} already routes to {existing:?}; refusing to also route it to {queue:?}"
    )]
    Collision {
        /// The contested prefix.
        prefix: String,
        /// Where it routes now.
        existing: String,
        /// Where the new rule wanted it.
        queue: String,
    },
}

fn is_segment(segment: &str) -> bool {
    let mut chars = segment.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-'))
}

fn valid_prefix(prefix: &str) -> bool {
    match prefix.strip_suffix('.') {
        Some(body) => body.split('.').all(is_segment),
        None => outbox_model::EventType::parse(prefix).is_ok(),
    }
}

/// Whether the rule keyed `key` matches `event_type`: a prefix (ending in
/// a dot) starts it, a whole event type equals it.
fn matches(key: &str, event_type: &str) -> bool {
    if key.ends_with('.') {
        event_type.starts_with(key)
    } else {
        event_type == key
    }
}

fn valid_queue(queue: &str) -> bool {
    queue.split('.').count() >= 2 && queue.split('.').all(is_segment) && queue.len() <= 200
}

impl Router {
    /// A table with no rules: every event is unroutable.
    #[must_use]
    pub fn empty() -> Self {
        Self { rules: Vec::new() }
    }

    /// Adds a rule: `prefix` → `queue`, where `prefix` is segments followed
    /// by a dot or one whole event type.
    ///
    /// # Errors
    ///
    /// [`RouteError::InvalidPrefix`], [`RouteError::InvalidQueue`], or
    /// [`RouteError::Collision`] when the prefix already has a rule.
    pub fn with_rule(mut self, prefix: &str, queue: &str) -> Result<Self, RouteError> {
        if !valid_prefix(prefix) {
            return Err(RouteError::InvalidPrefix(prefix.to_owned()));
        }
        if !valid_queue(queue) {
            return Err(RouteError::InvalidQueue(queue.to_owned()));
        }
        if let Some((_, existing)) = self.rules.iter().find(|(p, _)| p == prefix) {
            return Err(RouteError::Collision {
                prefix: prefix.to_owned(),
                existing: existing.clone(),
                queue: queue.to_owned(),
            });
        }
        self.insert(prefix, queue);
        Ok(self)
    }

    fn insert(&mut self, prefix: &str, queue: &str) {
        self.rules.push((prefix.to_owned(), queue.to_owned()));
        self.rules
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    /// The queue for `event_type`, or `None` when no rule matches.
    #[must_use]
    pub fn route(&self, event_type: &str) -> Option<&str> {
        self.rules
            .iter()
            .find(|(key, _)| matches(key, event_type))
            .map(|(_, queue)| queue.as_str())
    }

    /// Every distinct queue the table can target, sorted.
    #[must_use]
    pub fn queues(&self) -> Vec<&str> {
        let mut queues: Vec<&str> = self.rules.iter().map(|(_, q)| q.as_str()).collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// The rules as prefix → queue, sorted by prefix.
    #[must_use]
    pub fn rules(&self) -> BTreeMap<&str, &str> {
        self.rules
            .iter()
            .map(|(p, q)| (p.as_str(), q.as_str()))
            .collect()
    }
}

/// The publish-time check of `outbox-publish`
/// ([`outbox_publish::publish_routed_event`]) against this table.
impl outbox_publish::EventRoutes for Router {
    fn route(&self, event_type: &str) -> Option<&str> {
        Router::route(self, event_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table like the contract's: several prefixes to one queue, nested
    /// prefixes to different queues.
    fn table() -> Router {
        [
            ("billing.", "outbox.notification"),
            ("tenant.subscription.", "outbox.notification"),
            ("search.index.", "outbox.search-index"),
            ("mail.", "outbox.mail"),
        ]
        .into_iter()
        .try_fold(Router::empty(), |router, (prefix, queue)| {
            router.with_rule(prefix, queue)
        })
        .unwrap()
    }

    #[test]
    fn a_table_routes_by_prefix_and_lists_each_queue_once() {
        let router = table();
        assert_eq!(
            router.route("tenant.subscription.renewed"),
            Some("outbox.notification")
        );
        assert_eq!(router.route("tenant.member.invited"), None);
        assert_eq!(router.route("mailbox.user.created"), None);
        assert_eq!(
            router.queues(),
            ["outbox.mail", "outbox.notification", "outbox.search-index"]
        );
        assert_eq!(Router::empty().route("mail.user.welcome"), None);
    }

    #[test]
    fn longest_prefix_wins() {
        let router = table()
            .with_rule("billing.invoice.", "outbox.billing-docs")
            .unwrap();
        assert_eq!(
            router.route("billing.invoice.paid"),
            Some("outbox.billing-docs")
        );
        assert_eq!(
            router.route("billing.subscription.updated"),
            Some("outbox.notification")
        );
    }

    #[test]
    fn a_whole_event_type_routes_that_type_only_and_wins_over_prefixes() {
        let router = table()
            .with_rule("billing.invoice.disputed", "app.disputes")
            .unwrap();
        assert_eq!(
            router.route("billing.invoice.disputed"),
            Some("app.disputes")
        );
        for other in [
            "billing.invoice.disputed.again",
            "billing.invoice.disputed-2",
            "billing.invoice.paid",
        ] {
            assert_eq!(router.route(other), Some("outbox.notification"), "{other}");
        }
        assert!(matches!(
            router.with_rule("billing.invoice.disputed", "app.other"),
            Err(RouteError::Collision { .. })
        ));
    }

    #[test]
    fn bad_rules_are_rejected_at_construction() {
        let base = table;
        assert!(matches!(
            base().with_rule("mail.", "outbox.mail"),
            Err(RouteError::Collision { .. })
        ));
        for prefix in [
            "mail",
            "Mail.",
            ".mail.",
            "mail..",
            "",
            "1mail.",
            "ma_il.",
            "mail.user",
            "mail.User.welcome",
        ] {
            assert_eq!(
                base().with_rule(prefix, "outbox.x"),
                Err(RouteError::InvalidPrefix(prefix.to_owned())),
                "{prefix:?}"
            );
        }
        for queue in [
            "",
            "outbox",
            "outbox.",
            "Outbox.mail",
            "outbox mail.x",
            "outbox..x",
        ] {
            assert_eq!(
                base().with_rule("custom.", queue),
                Err(RouteError::InvalidQueue(queue.to_owned())),
                "{queue:?}"
            );
        }
    }
}
