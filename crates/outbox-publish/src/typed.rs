//! Typed events: a payload struct that carries its event type
//! ([`TypedEvent`], usually derived with [`crate::OutboxEvent`]) is
//! serialized into a [`NewOutboxEvent`] and published like any other.

use outbox_model::TypedEvent;
use serde::Serialize;

use crate::{NewOutboxEvent, OutboxTx, PublishError, PublishOutcome, publish_outbox_event};

impl NewOutboxEvent {
    /// The event of `tenant_id` whose type is `E::EVENT_TYPE` and whose
    /// payload is `event` serialized, due now, without a dispatch key (add
    /// one with [`NewOutboxEvent::dispatch_key`]), with the type's priority
    /// ([`TypedEvent::PRIORITY`], the derive's `#[outbox(priority = N)]`)
    /// and its ordering key ([`TypedEvent::ordering_key`], the field marked
    /// `#[outbox(ordering_key)]`).
    /// Runs no SQL; the event is validated when published, as an untyped
    /// one is.
    ///
    /// # Errors
    ///
    /// [`PublishError::PayloadNotSerializable`] when serde cannot serialize
    /// `event` into JSON (a map with non-string keys, a failing `Serialize`
    /// impl), naming the event type.
    ///
    /// # Example
    ///
    /// ```
    /// use outbox_publish::{NewOutboxEvent, OutboxEvent, Priority};
    ///
    /// #[derive(serde::Serialize, OutboxEvent)]
    /// #[outbox(event_type = "orders.order.created", priority = 1)]
    /// struct OrderCreated {
    ///     #[outbox(ordering_key)]
    ///     order_id: u64,
    /// }
    ///
    /// let event = NewOutboxEvent::from_typed("tenant-1", &OrderCreated { order_id: 7 })?
    ///     .dispatch_key("order-7-created");
    /// assert_eq!(event.event_type, "orders.order.created");
    /// assert_eq!(event.payload, serde_json::json!({ "order_id": 7 }));
    /// assert_eq!(event.priority, Priority::HIGH);
    /// assert_eq!(event.ordering_key.as_deref(), Some("7"));
    /// event.validate()?;
    /// # Ok::<(), outbox_publish::PublishError>(())
    /// ```
    pub fn from_typed<E: TypedEvent + Serialize>(
        tenant_id: impl Into<String>,
        event: &E,
    ) -> Result<Self, PublishError> {
        let payload =
            serde_json::to_value(event).map_err(|source| PublishError::PayloadNotSerializable {
                event_type: E::EVENT_TYPE,
                source,
            })?;
        let typed = Self::new(tenant_id, E::EVENT_TYPE, payload).priority(E::PRIORITY);
        Ok(match event.ordering_key() {
            Some(key) => typed.ordering_key(key),
            None => typed,
        })
    }
}

/// Records the typed `event` of `tenant_id` in the caller's transaction:
/// [`publish_outbox_event`] with [`NewOutboxEvent::from_typed`], so the
/// same refusals before any SQL, the same trace context and the same
/// `outbox.publish` span. For a dispatch key or a later dispatch, build the
/// event with [`NewOutboxEvent::from_typed`] and publish that.
///
/// # Errors
///
/// [`PublishError::PayloadNotSerializable`] when `event` does not
/// serialize, and everything [`publish_outbox_event`] returns.
///
/// # Example
///
/// ```no_run
/// use diesel_async::{AsyncConnection, AsyncPgConnection};
/// use outbox_publish::{OutboxEvent, OutboxTx, PublishError, publish};
///
/// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
/// #[outbox(event_type = "orders.order.created")]
/// struct OrderCreated {
///     order_id: u64,
///     total_cents: i64,
/// }
///
/// # async fn demo(conn: &mut AsyncPgConnection) -> Result<(), PublishError> {
/// conn.transaction::<_, PublishError, _>(async |conn| {
///     // ... the business write, on `conn`.
///     let tx = OutboxTx::new(conn)?;
///     publish(&tx, "tenant-1", &OrderCreated { order_id: 7, total_cents: 1999 }).await?;
///     Ok(())
/// })
/// .await
/// # }
/// ```
pub async fn publish<E: TypedEvent + Serialize>(
    tx: &OutboxTx<'_>,
    tenant_id: impl Into<String>,
    event: &E,
) -> Result<PublishOutcome, PublishError> {
    publish_outbox_event(tx, NewOutboxEvent::from_typed(tenant_id, event)?).await
}
