//! The task ids of the jobs a handler derives from an event's job on a
//! downstream queue ([`DerivedTaskIds`]): how a subscriber describes them,
//! so that reconciliation after a Redis loss can look for each one, and
//! the two of the built-in subscribers ([`EMAIL_TASK_IDS`],
//! [`PLUGIN_INVOKE_TASK_IDS`]).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// How the task ids of the jobs a handler derives from one delivery of an
/// event are formed (each is also the idempotency key its receiver
/// records once the job did its work), and so how many there are.
///
/// ```
/// use outbox_queue::DerivedTaskIds;
/// let refresh = DerivedTaskIds::per_delivery("refresh:");
/// assert_eq!(refresh.pattern(), "refresh:<delivery id>");
/// assert_eq!(refresh.of_delivery("e1:g2"), Some("refresh:e1:g2".to_owned()));
/// assert!(DerivedTaskIds::unlisted("refresh:<page>").of_delivery("e1").is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "prefix", rename_all = "kebab-case")]
pub enum DerivedTaskIds {
    /// One job per delivery of the event: the prefix, then the delivery id
    /// (`email:<delivery id>`, see [`crate::delivery_id`]).
    PerDelivery(Cow<'static, str>),
    /// One job per enabled plugin-hook subscription of the event's tenant
    /// to the hook its type names (`plugin.hook.<hook>`), made before the
    /// event's job finished: the prefix, the delivery id, `:` and the
    /// subscription's id.
    PerHookSubscription(Cow<'static, str>),
    /// Formed some other way (the pattern, for readers): reconciliation
    /// cannot list these jobs, so one lost after its parent finished goes
    /// unnoticed.
    Unlisted(Cow<'static, str>),
}

impl DerivedTaskIds {
    /// [`DerivedTaskIds::PerDelivery`] with `prefix`, for a description's
    /// constant.
    #[must_use]
    pub const fn per_delivery(prefix: &'static str) -> Self {
        Self::PerDelivery(Cow::Borrowed(prefix))
    }

    /// [`DerivedTaskIds::PerHookSubscription`] with `prefix`.
    #[must_use]
    pub const fn per_hook_subscription(prefix: &'static str) -> Self {
        Self::PerHookSubscription(Cow::Borrowed(prefix))
    }

    /// [`DerivedTaskIds::Unlisted`] with `pattern`.
    #[must_use]
    pub const fn unlisted(pattern: &'static str) -> Self {
        Self::Unlisted(Cow::Borrowed(pattern))
    }

    /// The task ids as a pattern for readers (`email:<delivery id>`).
    #[must_use]
    pub fn pattern(&self) -> String {
        match self {
            Self::PerDelivery(prefix) => format!("{prefix}<delivery id>"),
            Self::PerHookSubscription(prefix) => {
                format!("{prefix}<delivery id>:<subscription id>")
            }
            Self::Unlisted(pattern) => pattern.clone().into_owned(),
        }
    }

    /// Whether reconciliation can list these jobs (all but
    /// [`DerivedTaskIds::Unlisted`]).
    #[must_use]
    pub fn is_listed(&self) -> bool {
        !matches!(self, Self::Unlisted(_))
    }

    /// The task id of the one job derived from the delivery `delivery_id`,
    /// for [`DerivedTaskIds::PerDelivery`].
    #[must_use]
    pub fn of_delivery(&self, delivery_id: &str) -> Option<String> {
        match self {
            Self::PerDelivery(prefix) => Some(format!("{prefix}{delivery_id}")),
            _ => None,
        }
    }

    /// The task id of the job derived from the delivery `delivery_id` for
    /// the subscription `subscription`, for
    /// [`DerivedTaskIds::PerHookSubscription`].
    #[must_use]
    pub fn of_subscription(&self, delivery_id: &str, subscription: Uuid) -> Option<String> {
        match self {
            Self::PerHookSubscription(prefix) => {
                Some(format!("{prefix}{delivery_id}:{subscription}"))
            }
            _ => None,
        }
    }
}

/// The send jobs the `outbox.mail` and `outbox.marketing` handlers derive
/// on `toolctrl.email`: one per delivery, `email:<delivery id>`.
pub const EMAIL_TASK_IDS: DerivedTaskIds = DerivedTaskIds::per_delivery(EMAIL_TASK_PREFIX);

/// How the task id of a mail's send job begins.
pub(crate) const EMAIL_TASK_PREFIX: &str = "email:";

/// The invocations the `outbox.plugin-hook` handler derives on
/// `toolctrl.plugin-invoke`: one per subscription,
/// `plugin-invoke:<delivery id>:<subscription id>`.
pub const PLUGIN_INVOKE_TASK_IDS: DerivedTaskIds =
    DerivedTaskIds::per_hook_subscription(PLUGIN_INVOKE_TASK_PREFIX);

/// How the task id of a plugin invocation begins.
pub(crate) const PLUGIN_INVOKE_TASK_PREFIX: &str = "plugin-invoke:";

/// The task id (and receiver idempotency key) of the mail a `mail.*` or
/// `marketing.lead.*` event's handler derives on `toolctrl.email`:
/// `email:<delivery id>` ([`EMAIL_TASK_IDS`]).
///
/// ```
/// assert_eq!(outbox_queue::email_task_id("e1:g2"), "email:e1:g2");
/// ```
#[must_use]
pub fn email_task_id(delivery_id: &str) -> String {
    format!("{EMAIL_TASK_PREFIX}{delivery_id}")
}

/// The task id (and receiver idempotency key) of one plugin invocation a
/// `plugin.hook.*` event's handler derives on `toolctrl.plugin-invoke`:
/// `plugin-invoke:<delivery id>:<subscription id>`
/// ([`PLUGIN_INVOKE_TASK_IDS`]).
///
/// ```
/// let sub = uuid::Uuid::nil();
/// assert_eq!(
///     outbox_queue::plugin_invoke_task_id("e1", sub),
///     "plugin-invoke:e1:00000000-0000-0000-0000-000000000000"
/// );
/// ```
#[must_use]
pub fn plugin_invoke_task_id(delivery_id: &str, subscription_id: Uuid) -> String {
    format!("{PLUGIN_INVOKE_TASK_PREFIX}{delivery_id}:{subscription_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Descriptions travel as JSON in the workers' registrations: each kind
    /// comes back as it was written, and as the CLI reads it.
    #[test]
    fn task_ids_survive_json_and_form_the_receivers_keys() {
        let sub = Uuid::nil();
        for ids in [
            EMAIL_TASK_IDS,
            PLUGIN_INVOKE_TASK_IDS,
            DerivedTaskIds::unlisted("refresh:<page>"),
        ] {
            let json = serde_json::to_value(&ids).unwrap();
            assert_eq!(serde_json::from_value::<DerivedTaskIds>(json).unwrap(), ids);
        }
        assert_eq!(
            serde_json::to_value(EMAIL_TASK_IDS).unwrap(),
            serde_json::json!({ "kind": "per-delivery", "prefix": "email:" })
        );
        assert_eq!(email_task_id("e"), "email:e");
        assert_eq!(
            plugin_invoke_task_id("e", sub),
            format!("plugin-invoke:e:{sub}")
        );
        assert_eq!(EMAIL_TASK_IDS.of_subscription("e", sub), None);
        assert_eq!(PLUGIN_INVOKE_TASK_IDS.of_delivery("e"), None);
        assert_eq!(
            PLUGIN_INVOKE_TASK_IDS.pattern(),
            "plugin-invoke:<delivery id>:<subscription id>"
        );
        assert!(EMAIL_TASK_IDS.is_listed());
        assert!(!DerivedTaskIds::unlisted("x").is_listed());
    }
}
