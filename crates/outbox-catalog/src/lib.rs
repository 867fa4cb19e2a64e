//! The built-in subscribers, listed once: [`BUILT_IN`] holds the
//! [`SubscriberDescription`] each subscriber crate exports, and [`Catalog`]
//! answers the questions the worker and the operator CLI ask of them (which
//! queues are fed by subscribers rather than routed, which queue derives a
//! downstream job, what a queue's handler reads, and what it leaves behind
//! for reconciliation after a Redis loss to read: [`Catalog::receivers`]).
//!
//! A new built-in subscriber is its crate plus one line in [`BUILT_IN`]. An
//! application's own subscriber adds its description to the worker it
//! builds (`outbox_worker::WorkerBuilder::subscriber`). This crate holds no
//! handler and runs nothing: constructing handlers is the worker's job.

use outbox_dispatch::{Receiver, Receivers};
use outbox_subscriber::{ConsumedQueue, DownstreamQueue, SubscriberDescription};

/// Every built-in subscriber crate's description.
pub const BUILT_IN: &[SubscriberDescription] = &[
    outbox_subscriber_audit::DESCRIPTION,
    outbox_subscriber_workflow::DESCRIPTION,
    outbox_subscriber_webhook::DESCRIPTION,
    outbox_subscriber_mail::DESCRIPTION,
];

/// A set of subscriber descriptions: the built-in ones ([`Catalog::built_in`])
/// and any an application adds ([`Catalog::with`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    descriptions: Vec<SubscriberDescription>,
}

impl Default for Catalog {
    fn default() -> Self {
        Self::built_in()
    }
}

impl Catalog {
    /// The built-in subscribers ([`BUILT_IN`]).
    #[must_use]
    pub fn built_in() -> Self {
        Self {
            descriptions: BUILT_IN.to_vec(),
        }
    }

    /// This catalog plus `description`.
    #[must_use]
    pub fn with(mut self, description: SubscriberDescription) -> Self {
        self.descriptions.push(description);
        self
    }

    /// The descriptions, built-in ones first.
    #[must_use]
    pub fn descriptions(&self) -> &[SubscriberDescription] {
        &self.descriptions
    }

    /// Every queue fed by subscribers rather than by the routing table,
    /// sorted.
    ///
    /// ```
    /// let catalog = outbox_catalog::Catalog::built_in();
    /// assert_eq!(catalog.downstream_queues(), ["toolctrl.email", "toolctrl.plugin-invoke"]);
    /// ```
    #[must_use]
    pub fn downstream_queues(&self) -> Vec<&'static str> {
        let mut queues: Vec<&'static str> = self
            .descriptions
            .iter()
            .flat_map(|d| d.feeds.iter().map(|f| f.queue))
            .collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// The downstream queue `queue`, when a subscriber feeds it.
    #[must_use]
    pub fn downstream(&self, queue: &str) -> Option<&DownstreamQueue> {
        self.descriptions
            .iter()
            .flat_map(|d| d.feeds)
            .find(|f| f.queue == queue)
    }

    /// What each consumed queue's handler leaves behind, for reconciliation
    /// after a Redis loss (`outbox_dispatch::Reconciler`), read from the
    /// descriptions: a queue whose handler feeds a downstream queue
    /// reconciliation knows ([`Receiver::deriving`]) derives its jobs; a
    /// queue whose deduplication key is recorded in `<table>.outbox_event_id`
    /// writes one row per event there ([`Receiver::recorded_in`]); any other
    /// queue is plain (only its job tells).
    ///
    /// ```
    /// use outbox_dispatch::Receiver;
    /// let receivers = outbox_catalog::Catalog::built_in().receivers();
    /// assert_eq!(receivers.of("outbox.mail"), Receiver::Email);
    /// assert_eq!(receivers.of("outbox.webhook"), Receiver::Plain);
    /// ```
    #[must_use]
    pub fn receivers(&self) -> Receivers {
        let mut receivers = Receivers::new();
        for consumed in self.descriptions.iter().flat_map(|d| d.consumes) {
            let queue = consumed.queue;
            let derived = self
                .feeds_of(queue)
                .find_map(|feed| Receiver::deriving(feed.queue));
            let rows = || {
                self.descriptions
                    .iter()
                    .flat_map(|d| d.dedup)
                    .filter(|key| key.queue == queue)
                    .map(|key| Receiver::recorded_in(key.recorded_in))
                    .find(|receiver| *receiver != Receiver::Plain)
            };
            if let Some(receiver) = derived.or_else(rows) {
                receivers = receivers.with(queue, receiver);
            }
        }
        receivers
    }

    /// The downstream queues fed from a consumed queue whose derived jobs
    /// reconciliation cannot find ([`Receiver::deriving`] knows only the
    /// built-in ones): a job of such a queue that is lost after its parent
    /// finished goes unnoticed. The worker logs them at start.
    ///
    /// ```
    /// assert!(outbox_catalog::Catalog::built_in().unreconciled_feeds().is_empty());
    /// ```
    #[must_use]
    pub fn unreconciled_feeds(&self) -> Vec<&DownstreamQueue> {
        self.descriptions
            .iter()
            .flat_map(|d| d.feeds)
            .filter(|feed| Receiver::deriving(feed.queue).is_none())
            .collect()
    }

    fn feeds_of<'a>(&'a self, queue: &'a str) -> impl Iterator<Item = &'a DownstreamQueue> + 'a {
        self.descriptions
            .iter()
            .flat_map(|d| d.feeds)
            .filter(move |feed| feed.derived_from.contains(&queue))
    }

    /// What the handler of the routed queue `queue` reads, when a
    /// subscriber consumes it.
    #[must_use]
    pub fn consumed(&self, queue: &str) -> Option<&ConsumedQueue> {
        self.descriptions
            .iter()
            .flat_map(|d| d.consumes)
            .find(|c| c.queue == queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_queue::queues;

    #[test]
    fn each_queue_has_one_owner_and_every_downstream_queue_is_derived_from_a_consumed_one() {
        let catalog = Catalog::built_in();
        let mut all: Vec<&str> = BUILT_IN
            .iter()
            .flat_map(SubscriberDescription::queues)
            .collect();
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "a queue is described twice");
        for description in BUILT_IN {
            for feed in description.feeds {
                for parent in feed.derived_from {
                    assert!(catalog.consumed(parent).is_some(), "{parent}");
                }
            }
        }
        for queue in catalog.downstream_queues() {
            assert!(!queues::OUTBOX_QUEUES.contains(&queue), "{queue} is routed");
        }
    }

    /// Reconciliation reads what each built-in handler leaves behind from
    /// the descriptions alone; this pins what it reads for every routed
    /// queue.
    #[test]
    fn the_receivers_come_from_the_descriptions() {
        let receivers = Catalog::built_in().receivers();
        for queue in queues::OUTBOX_QUEUES {
            let expected = match queue {
                queues::MAIL | queues::MARKETING => "email",
                queues::PLUGIN_HOOK => "plugin hook",
                queues::AUDIT => "audit_log",
                queues::NOTIFICATION => "notification",
                _ => "plain",
            };
            let got = match receivers.of(queue) {
                Receiver::Email => "email",
                Receiver::PluginHook => "plugin hook",
                Receiver::Row(table) => table.table(),
                Receiver::Plain => "plain",
            };
            assert_eq!(got, expected, "{queue}");
        }
    }

    /// An application's subscriber that writes one row per event is
    /// reconciled by its row, and one that derives jobs reconciliation
    /// cannot find is named, from its description alone.
    #[test]
    fn an_added_subscriber_is_reconciled_from_its_description() {
        use outbox_subscriber::DedupKey;
        const SEARCH: SubscriberDescription = SubscriberDescription {
            name: "app-search",
            consumes: &[
                ConsumedQueue {
                    queue: "app.search-index",
                    payload: "`id`",
                },
                ConsumedQueue {
                    queue: "app.search-bulk",
                    payload: "`ids`",
                },
            ],
            feeds: &[DownstreamQueue {
                queue: "app.search-refresh",
                derived_from: &["app.search-bulk"],
                task_id: "refresh:<delivery id>",
            }],
            dedup: &[DedupKey {
                queue: "app.search-index",
                key: "<event id>",
                recorded_in: "search_document.outbox_event_id",
            }],
        };
        let catalog = Catalog::built_in().with(SEARCH);
        let receivers = catalog.receivers();
        match receivers.of("app.search-index") {
            Receiver::Row(table) => assert_eq!(table.table(), "search_document"),
            other => panic!("{other:?}"),
        }
        assert_eq!(receivers.of("app.search-bulk"), Receiver::Plain);
        assert_eq!(receivers.of(queues::MAIL), Receiver::Email);
        let unreconciled: Vec<&str> = catalog
            .unreconciled_feeds()
            .iter()
            .map(|feed| feed.queue)
            .collect();
        assert_eq!(unreconciled, ["app.search-refresh"]);
    }
}
