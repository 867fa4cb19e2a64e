//! The optional publish-time route check: refuse an event no queue would
//! receive, in the request that publishes it, instead of finding it FAILED
//! ("unrouted") after the dispatcher claimed it.

use crate::event::drop_without_recursion;
use crate::{NewOutboxEvent, OutboxTx, PublishError, PublishOutcome, publish_outbox_event};

/// A routing table as the publisher sees it: which queue an event type
/// goes to, if any. `outbox_dispatch::Router` implements it; pass the
/// router the dispatcher runs with (the standard table plus the
/// application's rules), so that both agree.
pub trait EventRoutes {
    /// The queue `event_type` is routed to, or `None` when no rule matches.
    fn route(&self, event_type: &str) -> Option<&str>;
}

impl NewOutboxEvent {
    /// Checks that `routes` sends this event type to a queue. Runs no SQL.
    ///
    /// # Errors
    ///
    /// [`PublishError::Unrouted`] when no rule matches.
    pub fn check_route(&self, routes: &impl EventRoutes) -> Result<(), PublishError> {
        match routes.route(&self.event_type) {
            Some(_) => Ok(()),
            None => Err(PublishError::Unrouted {
                event_type: self.event_type.clone(),
            }),
        }
    }
}

/// `event` when `routes` sends its type to a queue; else
/// [`PublishError::Unrouted`], the event dropped as a refused payload is
/// (one container at a time, so that a value nested deeper than the
/// stack allows does not overflow it).
pub(crate) fn routed(
    event: NewOutboxEvent,
    routes: &impl EventRoutes,
) -> Result<NewOutboxEvent, PublishError> {
    match event.check_route(routes) {
        Ok(()) => Ok(event),
        Err(refused) => {
            drop_without_recursion(event.payload);
            Err(refused)
        }
    }
}

/// [`publish_outbox_event`] after [`NewOutboxEvent::check_route`]: an event
/// no rule of `routes` matches is refused before any SQL, so the caller's
/// transaction stays usable (roll back or go on, as the business logic
/// decides).
///
/// # Errors
///
/// [`PublishError::Unrouted`], or whatever [`publish_outbox_event`] returns.
pub async fn publish_routed_event(
    tx: &OutboxTx<'_>,
    routes: &impl EventRoutes,
    event: NewOutboxEvent,
) -> Result<PublishOutcome, PublishError> {
    publish_outbox_event(tx, routed(event, routes)?).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::{Value, json};

    use super::*;

    struct Only(&'static str);

    impl EventRoutes for Only {
        fn route(&self, event_type: &str) -> Option<&str> {
            event_type.starts_with(self.0).then_some("outbox.general")
        }
    }

    #[test]
    fn an_unrouted_event_too_deep_to_drop_recursively_is_refused_and_dropped() {
        // Deep enough that the default, recursive drop overflows the stack.
        let mut payload = Value::Array(Vec::new());
        for _ in 1..500_000 {
            payload = Value::Array(vec![payload]);
        }
        // Not `json!`, which would copy `payload` by serializing it.
        let payload = Value::Object(serde_json::Map::from_iter([("deep".to_owned(), payload)]));
        let event = NewOutboxEvent::new("t", "billing.invoice.paid", payload);
        assert!(matches!(
            routed(event, &Only("mail.")),
            Err(PublishError::Unrouted { event_type }) if event_type == "billing.invoice.paid"
        ));
        let event = NewOutboxEvent::new("t", "mail.user.welcome", json!({}));
        assert_eq!(
            routed(event, &Only("mail.")).unwrap().event_type,
            "mail.user.welcome"
        );
    }
}
