//! The optional publish-time route check: refuse an event no queue would
//! receive, in the request that publishes it, instead of finding it FAILED
//! ("unrouted") after the dispatcher claimed it.

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
    event.check_route(routes)?;
    publish_outbox_event(tx, event).await
}
