//! How a subscriber says what it adds to a worker: the queues it
//! consumes and what it reads there ([`ConsumedQueue`]), the downstream
//! queues its handlers feed ([`DownstreamQueue`]), and the keys each
//! handler deduplicates on ([`DedupKey`]), all in one
//! [`SubscriberDescription`], plain data.
//!
//! Each subscriber is described once, and the worker registers it by its
//! description (with the handlers it makes); the worker (which queues to
//! measure and trim), the operator CLI (which queues exist, which queue
//! derives a downstream job) and the README's routing table ask the
//! descriptions instead of keeping lists of their own. The built-in
//! subscribers' descriptions are in the `outbox-catalog` crate, apart from
//! their handlers, so that reading them compiles no handler.

pub use outbox_queue::DerivedTaskIds;

/// One queue a subscriber crate's handler consumes, the event types the
/// routing table sends there, and the payload fields that handler reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumedQueue {
    /// The queue name (`outbox.audit`).
    pub queue: &'static str,
    /// The routing prefixes whose events go to this queue (`audit.`; the
    /// longest matching prefix of all registered ones wins). The routing
    /// table is made of these: a queue is routed because a subscriber
    /// registered it.
    pub routes: &'static [&'static str],
    /// The payload fields the handler reads, in a few words for a table
    /// cell (Markdown).
    pub payload: &'static str,
}

/// A queue no routing rule targets: the subscriber's handlers push its
/// jobs, derived from the events of other queues, and a handler of the
/// same subscriber consumes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownstreamQueue {
    /// The queue name (`toolctrl.email`).
    pub queue: &'static str,
    /// The queues whose handlers push its jobs (`outbox.mail`).
    pub derived_from: &'static [&'static str],
    /// How the task id of a derived job, which is also its receiver's
    /// idempotency key, is formed (`email:<delivery id>`, one per
    /// delivery). Reconciliation after a Redis loss rebuilds them to find a
    /// derived job lost after its parent finished, and runs the parent
    /// again; [`DerivedTaskIds::unlisted`] says it cannot.
    pub task_id: DerivedTaskIds,
}

/// What a handler deduplicates on, so that a redelivered job does its work
/// once per delivery generation (see `outbox_queue::delivery_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupKey {
    /// The queue of the handler.
    pub queue: &'static str,
    /// The key, as a pattern (`webhook:<delivery id>:<endpoint id>`).
    pub key: &'static str,
    /// Where the key is recorded: `idempotency store` (Redis, see
    /// `outbox-idempotency`), or the table whose unique column holds it
    /// (`table.column`). `<table>.outbox_event_id` says the handler writes
    /// one row per event there, which reconciliation after a Redis loss
    /// reads to tell a finished job from a lost one.
    pub recorded_in: &'static str,
}

/// Everything a subscriber adds to a worker, as plain data: the built-in
/// ones are listed together once (the `outbox-catalog` crate), an
/// application's own is registered with its worker
/// (`outbox_worker::WorkerBuilder::subscriber`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriberDescription {
    /// Its name (`mail`, `custom-worker search indexing`).
    pub name: &'static str,
    /// The queues the routing table sends to its handlers.
    pub consumes: &'static [ConsumedQueue],
    /// The downstream queues its handlers feed (and consume).
    pub feeds: &'static [DownstreamQueue],
    /// The keys its handlers deduplicate on.
    pub dedup: &'static [DedupKey],
}

impl SubscriberDescription {
    /// Every queue its handlers consume: the routed ones, then the
    /// downstream ones.
    ///
    /// ```
    /// use outbox_subscriber::{
    ///     ConsumedQueue, DerivedTaskIds, DownstreamQueue, SubscriberDescription,
    /// };
    ///
    /// const SEARCH: SubscriberDescription = SubscriberDescription {
    ///     name: "app-search",
    ///     consumes: &[ConsumedQueue {
    ///         queue: "app.search-index",
    ///         routes: &["search.page."],
    ///         payload: "`id`",
    ///     }],
    ///     feeds: &[DownstreamQueue {
    ///         queue: "app.search-refresh",
    ///         derived_from: &["outbox.search-index"],
    ///         task_id: DerivedTaskIds::per_delivery("refresh:"),
    ///     }],
    ///     dedup: &[],
    /// };
    /// assert_eq!(SEARCH.queues(), ["app.search-index", "app.search-refresh"]);
    /// ```
    #[must_use]
    pub fn queues(&self) -> Vec<&'static str> {
        self.consumes
            .iter()
            .map(|c| c.queue)
            .chain(self.feeds.iter().map(|d| d.queue))
            .collect()
    }

    /// Its routing rules, as (prefix, queue) pairs in the order written.
    ///
    /// ```
    /// use outbox_subscriber::{ConsumedQueue, SubscriberDescription};
    ///
    /// const ORDERS: SubscriberDescription = SubscriberDescription {
    ///     name: "app-orders",
    ///     consumes: &[ConsumedQueue {
    ///         queue: "app.orders",
    ///         routes: &["order.", "refund."],
    ///         payload: "`order_id`",
    ///     }],
    ///     feeds: &[],
    ///     dedup: &[],
    /// };
    /// assert_eq!(ORDERS.routes(), [("order.", "app.orders"), ("refund.", "app.orders")]);
    /// ```
    #[must_use]
    pub fn routes(&self) -> Vec<(&'static str, &'static str)> {
        self.consumes
            .iter()
            .flat_map(|c| c.routes.iter().map(move |prefix| (*prefix, c.queue)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker measures and trims what `queues()` lists: every consumed
    /// queue and every fed one, none twice, none invented.
    #[test]
    fn a_description_lists_its_consumed_then_its_fed_queues() {
        const AUDIT_AND_FANOUT: SubscriberDescription = SubscriberDescription {
            name: "app-fanout",
            consumes: &[
                ConsumedQueue {
                    queue: "app.orders",
                    routes: &["order."],
                    payload: "`order_id`",
                },
                ConsumedQueue {
                    queue: "app.refunds",
                    routes: &["refund."],
                    payload: "`refund_id`",
                },
            ],
            feeds: &[DownstreamQueue {
                queue: "app.ledger",
                derived_from: &["app.orders", "app.refunds"],
                task_id: DerivedTaskIds::per_delivery("ledger:"),
            }],
            dedup: &[],
        };
        assert_eq!(
            AUDIT_AND_FANOUT.queues(),
            ["app.orders", "app.refunds", "app.ledger"]
        );
        let empty = SubscriberDescription {
            consumes: &[],
            feeds: &[],
            ..AUDIT_AND_FANOUT
        };
        assert!(empty.queues().is_empty());
    }

    /// The worker's routing table is built from `routes()`: every prefix of
    /// every consumed queue, to that queue, in the order written.
    #[test]
    fn a_description_routes_each_prefix_to_its_queue_in_order() {
        const TWO_QUEUES: SubscriberDescription = SubscriberDescription {
            name: "app-billing",
            consumes: &[
                ConsumedQueue {
                    queue: "app.orders",
                    routes: &["order.", "cart."],
                    payload: "`order_id`",
                },
                ConsumedQueue {
                    queue: "app.refunds",
                    routes: &["refund."],
                    payload: "`refund_id`",
                },
            ],
            feeds: &[],
            dedup: &[],
        };
        assert_eq!(
            TWO_QUEUES.routes(),
            [
                ("order.", "app.orders"),
                ("cart.", "app.orders"),
                ("refund.", "app.refunds")
            ]
        );
        let silent = SubscriberDescription {
            consumes: &[],
            ..TWO_QUEUES
        };
        assert!(silent.routes().is_empty());
    }
}
