//! [`TypedHandlers`]: a queue's handler that decodes each event's payload
//! into the application's struct ([`TypedEvent`]) and calls the
//! application's function for its event type.

use std::collections::BTreeMap;
use std::future::Future;

use chrono::{DateTime, Utc};
use outbox_model::{RawJson, TypedEvent};
use outbox_queue::OutboxJob;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::{BoxFuture, JobError, JobHandler, JobMeta, RetryPolicy, SubscriberError};

/// What a typed handler's function learns about the event besides its
/// payload.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventContext {
    /// The outbox row's id.
    pub event_id: Uuid,
    /// The tenant the event belongs to.
    pub tenant_id: String,
    /// The key of this delivery: the event id, with the generation after an
    /// operator replay (see `outbox_queue::delivery_id`). Key the
    /// function's effect on it: delivery is at least once.
    pub delivery_id: String,
    /// The producer's dispatch key, if any.
    pub dispatch_key: Option<String>,
    /// When the event was recorded.
    pub created_at: DateTime<Utc>,
    /// Which attempt this is, from 1.
    pub attempt: usize,
}

/// One event type's function, with the decoding of its payload.
type Call =
    Box<dyn Fn(&RawJson, EventContext) -> BoxFuture<'static, Result<(), JobError>> + Send + Sync>;

/// The handler of one queue whose events are typed: for each event type
/// it takes ([`TypedHandlers::on`]), the payload is decoded into that
/// [`TypedEvent`] struct and the application's function is called with it.
///
/// A payload that does not decode into the struct is a permanent failure:
/// the job goes to the queue's dead set at once, with the decode error as
/// the reason, and is not retried. So is an event of a type the handler
/// does not take. What the function returns decides the rest, as for any
/// [`JobHandler`]: [`JobError::Retry`] is retried, [`JobError::Permanent`]
/// dead-lettered.
///
/// Register it like any handler (`HandlerGroup::with`, or the worker
/// builder's `typed`, which also routes the event types it declares, see
/// [`TypedHandlers::event_types`]; the builder's `handler` does not route
/// them).
///
/// # Example
///
/// ```
/// use outbox_model::TypedEvent;
/// use outbox_subscriber::{EventContext, HandlerGroup, JobError, TypedHandlers};
///
/// #[derive(serde::Deserialize)]
/// struct OrderCreated {
///     order_id: u64,
/// }
///
/// // `#[derive(OutboxEvent)]` of outbox-publish writes this.
/// impl TypedEvent for OrderCreated {
///     const EVENT_TYPE: &'static str = "orders.order.created";
/// }
///
/// async fn order_created(event: OrderCreated, cx: EventContext) -> Result<(), JobError> {
///     println!("order {} of {} (delivery {})", event.order_id, cx.tenant_id, cx.delivery_id);
///     Ok(())
/// }
///
/// let orders = TypedHandlers::new("app.orders").on(order_created)?;
/// assert_eq!(orders.event_types(), ["orders.order.created"]);
/// let group = HandlerGroup::new().with(orders)?;
/// assert_eq!(group.queues(), ["app.orders"]);
/// # Ok::<(), outbox_subscriber::SubscriberError>(())
/// ```
pub struct TypedHandlers {
    queue: String,
    calls: BTreeMap<&'static str, Call>,
    retry: RetryPolicy,
}

impl std::fmt::Debug for TypedHandlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedHandlers")
            .field("queue", &self.queue)
            .field("event_types", &self.event_types())
            .field("retry", &self.retry)
            .finish()
    }
}

impl TypedHandlers {
    /// A handler of `queue` that takes no event type yet.
    #[must_use]
    pub fn new(queue: impl Into<String>) -> Self {
        Self {
            queue: queue.into(),
            calls: BTreeMap::new(),
            retry: RetryPolicy::default(),
        }
    }

    /// Retries the queue's failed events under `policy` instead of the
    /// default ladder (see [`RetryPolicy`]); checked when the handlers join
    /// a [`HandlerGroup`](crate::HandlerGroup).
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_subscriber::{RetryPolicy, TypedHandlers};
    ///
    /// let orders = TypedHandlers::new("app.orders")
    ///     .with_retry_policy(RetryPolicy::fixed(Duration::from_secs(10)).with_max_attempts(5));
    /// # let _ = orders;
    /// ```
    #[must_use]
    pub fn with_retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Takes events of type `E::EVENT_TYPE`: decodes each payload into `E`
    /// and calls `handle` with it.
    ///
    /// # Errors
    ///
    /// [`SubscriberError::DuplicateEventType`] when the handler already
    /// takes that event type (two structs declaring the same type).
    pub fn on<E, F, Fut>(mut self, handle: F) -> Result<Self, SubscriberError>
    where
        E: TypedEvent + DeserializeOwned + 'static,
        F: Fn(E, EventContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        if self.calls.contains_key(E::EVENT_TYPE) {
            return Err(SubscriberError::DuplicateEventType {
                queue: self.queue,
                event_type: E::EVENT_TYPE.to_owned(),
            });
        }
        let call: Call = Box::new(move |payload, context| match payload.parse::<E>() {
            Ok(event) => Box::pin(handle(event, context)),
            Err(e) => Box::pin(std::future::ready(Err(JobError::permanent(format!(
                "the payload of event type {} does not decode: {e}",
                E::EVENT_TYPE
            ))))),
        });
        self.calls.insert(E::EVENT_TYPE, call);
        Ok(self)
    }

    /// The event types it takes, sorted: what the application declares
    /// this queue consumes.
    #[must_use]
    pub fn event_types(&self) -> Vec<&'static str> {
        self.calls.keys().copied().collect()
    }
}

impl JobHandler for TypedHandlers {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        &self.queue
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    async fn handle(&self, job: OutboxJob, meta: &JobMeta) -> Result<(), JobError> {
        let Some(call) = self.calls.get(job.event_type.as_str()) else {
            return Err(JobError::permanent(format!(
                "no typed handler on {} takes event type {:?}; it takes {}",
                self.queue,
                job.event_type,
                self.event_types().join(", ")
            )));
        };
        let context = EventContext {
            event_id: job.outbox_event_id,
            delivery_id: job.delivery_id(),
            tenant_id: job.tenant_id,
            dispatch_key: job.dispatch_key,
            created_at: job.created_at,
            attempt: meta.attempt,
        };
        call(&job.payload, context).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct OrderCreated {
        order_id: u64,
    }

    impl TypedEvent for OrderCreated {
        const EVENT_TYPE: &'static str = "orders.order.created";
    }

    async fn accept(event: OrderCreated, _: EventContext) -> Result<(), JobError> {
        match event.order_id {
            0 => Err(JobError::retry("order 0 is not there yet")),
            _ => Ok(()),
        }
    }

    fn job(event_type: &str, payload: &str) -> OutboxJob {
        OutboxJob {
            outbox_event_id: Uuid::nil(),
            tenant_id: "acme".into(),
            event_type: event_type.into(),
            payload: RawJson::from_text(payload).unwrap(),
            dispatch_key: None,
            created_at: Utc::now(),
            generation: 0,
            trace_context: None,
            priority: outbox_model::Priority::NORMAL,
            ordering_key: None,
            ordering_position: None,
        }
    }

    #[test]
    fn each_job_is_decoded_for_its_event_type_or_refused_for_good() {
        let handlers = TypedHandlers::new("app.orders").on(accept).unwrap();
        let meta = JobMeta {
            queue: "app.orders".into(),
            task_id: "outbox:1".into(),
            attempt: 1,
        };
        let run = |event_type: &str, payload: &str| {
            futures::executor::block_on(handlers.handle(job(event_type, payload), &meta))
        };
        assert_eq!(run("orders.order.created", r#"{"order_id": 7}"#), Ok(()));
        assert_eq!(
            run("orders.order.created", r#"{"order_id": 0}"#),
            Err(JobError::Retry("order 0 is not there yet".into())),
            "the function's own answer stands"
        );
        assert!(matches!(
            run("orders.order.created", r#"{"id": 7}"#),
            Err(JobError::Permanent(reason))
                if reason.starts_with("the payload of event type orders.order.created does not decode: missing field `order_id`")
        ));
        assert_eq!(
            run("orders.order.shipped", r#"{"order_id": 7}"#),
            Err(JobError::Permanent(
                "no typed handler on app.orders takes event type \"orders.order.shipped\"; it takes orders.order.created".into()
            ))
        );
    }

    #[test]
    fn an_event_type_given_twice_is_refused() {
        let twice = TypedHandlers::new("app.orders")
            .on(accept)
            .and_then(|h| h.on(accept));
        assert!(matches!(
            twice,
            Err(SubscriberError::DuplicateEventType { queue, event_type })
                if queue == "app.orders" && event_type == "orders.order.created"
        ));
    }

    #[test]
    fn typed_handlers_keep_the_ladder_unless_given_a_policy_and_a_group_refuses_one_that_cannot_work()
     {
        let plain = TypedHandlers::new("app.orders").on(accept).unwrap();
        assert_eq!(JobHandler::retry_policy(&plain), RetryPolicy::default());
        let fixed = RetryPolicy::fixed(std::time::Duration::from_secs(10)).with_max_attempts(3);
        let tuned = TypedHandlers::new("app.orders")
            .on(accept)
            .unwrap()
            .with_retry_policy(fixed);
        assert_eq!(JobHandler::retry_policy(&tuned), fixed);
        let none = TypedHandlers::new("app.orders")
            .with_retry_policy(RetryPolicy::default().with_max_attempts(0));
        let refused = crate::HandlerGroup::new().with(none).unwrap_err();
        assert!(refused.to_string().contains("app.orders"), "{refused}");
    }

    /// The worker logs its handlers with `{:?}`: a typed handler names its
    /// queue, the event types it takes and its retry policy.
    #[test]
    fn typed_handlers_in_a_log_line_name_their_queue_event_types_and_policy() {
        let handlers = TypedHandlers::new("app.orders").on(accept).unwrap();
        assert_eq!(
            format!("{handlers:?}"),
            format!(
                r#"TypedHandlers {{ queue: "app.orders", event_types: ["orders.order.created"], retry: {:?} }}"#,
                RetryPolicy::ladder()
            )
        );
    }
}
