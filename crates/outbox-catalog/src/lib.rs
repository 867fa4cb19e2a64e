//! The built-in subscribers, listed once: [`BUILT_IN`] holds the
//! [`SubscriberDescription`] each subscriber crate exports, and [`Catalog`]
//! answers the questions the worker and the operator CLI ask of them (which
//! queues are fed by subscribers rather than routed, which queue derives a
//! downstream job, what a queue's handler reads).
//!
//! A new built-in subscriber is its crate plus one line in [`BUILT_IN`]. An
//! application's own subscriber adds its description to the worker it
//! builds (`outbox_worker::WorkerBuilder::subscriber`). This crate holds no
//! handler and runs nothing: constructing handlers is the worker's job.

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

    /// Reconciliation after a Redis loss (`outbox_dispatch::Receiver`) still
    /// keeps its own table of what each queue's handler leaves behind; until
    /// it reads the descriptions, this fails when the two disagree, so a
    /// subscriber that derives jobs or writes rows cannot be added without
    /// the reconciler learning it.
    #[test]
    fn the_reconciler_agrees_with_the_descriptions() {
        use outbox_dispatch::Receiver;
        let catalog = Catalog::built_in();
        let derives = |queue: &str| {
            BUILT_IN
                .iter()
                .flat_map(|d| d.feeds)
                .any(|f| f.derived_from.contains(&queue))
        };
        let writes_rows = |queue: &str| {
            BUILT_IN
                .iter()
                .flat_map(|d| d.dedup)
                .any(|k| k.queue == queue && k.recorded_in.ends_with(".outbox_event_id"))
        };
        for queue in queues::OUTBOX_QUEUES {
            let expected = match Receiver::of(queue) {
                Receiver::Email | Receiver::PluginHook => (true, false),
                Receiver::Row(_) => (false, true),
                Receiver::Plain => (false, false),
            };
            assert_eq!(
                (derives(queue), writes_rows(queue)),
                expected,
                "{queue}: the reconciler and the descriptions disagree"
            );
            if expected != (false, false) {
                assert!(catalog.consumed(queue).is_some(), "{queue}");
            }
        }
    }
}
