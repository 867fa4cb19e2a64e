//! The built-in subscribers, listed once: [`BUILT_IN`] holds the
//! [`SubscriberDescription`] of each built-in subscriber ([`built_in`], plain
//! data, so that reading them compiles no handler; plus
//! [`FOR_APPLICATIONS`], the contract's queues that an application's own
//! handlers consume), and [`Catalog`] answers the questions the dispatcher,
//! the worker and the operator CLI ask of them: the routing table
//! ([`Catalog::router`], made of the descriptions' routes), which queues
//! are routed and which are fed by subscribers, which queue derives a
//! downstream job, what a queue's handler reads, and what it leaves behind
//! for reconciliation after a Redis loss to read ([`Catalog::receivers`]).
//! Workers record the descriptions they run in Postgres
//! ([`registration`]), so that the operator CLI also knows an
//! application's own subscribers.
//!
//! A new built-in subscriber is its handlers' crate, its description in
//! [`built_in`] with one line in [`BUILT_IN`], and one line in the list of
//! the worker group that runs it (`outbox-worker`). An application's own
//! subscriber adds its description to the worker it builds
//! (`outbox_worker::WorkerBuilder::subscriber`). This crate holds no
//! handler, depends on no subscriber crate and runs nothing: constructing
//! handlers is the worker's job.

pub mod built_in;
pub mod registration;

use outbox_dispatch::{Receivers, RouteError, Router};
use outbox_queue::queues;
use outbox_subscriber::{ConsumedQueue, DownstreamQueue, SubscriberDescription};

/// Every built-in subscriber's description ([`built_in`]), and the
/// contract's queues left to applications ([`FOR_APPLICATIONS`]).
pub const BUILT_IN: &[SubscriberDescription] = &[
    built_in::AUDIT,
    built_in::NOTIFICATION,
    built_in::WORKFLOW,
    built_in::PLUGIN_HOOKS,
    built_in::WEBHOOK,
    built_in::MAIL,
    built_in::MARKETING,
    FOR_APPLICATIONS,
];

/// What an application's handler of these queues reads.
const APPLICATION_PAYLOAD: &str = "whatever the application's own handler reads";

/// The queues the contract routes events to that no built-in handler
/// consumes: an application runs its own handler on them
/// (`outbox_worker::WorkerBuilder::handler`); until it does, their jobs
/// wait in Redis.
pub const FOR_APPLICATIONS: SubscriberDescription = SubscriberDescription {
    name: "application handlers",
    consumes: &[
        ConsumedQueue {
            queue: queues::SEARCH_INDEX,
            routes: &["search.index."],
            payload: APPLICATION_PAYLOAD,
        },
        ConsumedQueue {
            queue: queues::RAG_INDEX,
            routes: &["rag.index."],
            payload: APPLICATION_PAYLOAD,
        },
        ConsumedQueue {
            queue: queues::AI_COST,
            routes: &["ai.cost."],
            payload: APPLICATION_PAYLOAD,
        },
        ConsumedQueue {
            queue: queues::FORM_SUBMISSION_ROUTE,
            routes: &["form.submission."],
            payload: APPLICATION_PAYLOAD,
        },
        ConsumedQueue {
            queue: queues::PLUGIN_CAPABILITY_USE,
            routes: &["plugin.capability-use."],
            payload: APPLICATION_PAYLOAD,
        },
    ],
    feeds: &[],
    dedup: &[],
};

/// The standard routing table: the routes of every description of
/// [`BUILT_IN`] (longest prefix wins).
///
/// ```
/// let router = outbox_catalog::standard_router().unwrap();
/// assert_eq!(router.route("mail.user.welcome"), Some("outbox.mail"));
/// assert_eq!(router.route("billing.invoice.paid"), Some("outbox.notification"));
/// assert_eq!(router.route("legacy.report.generated"), None);
/// ```
///
/// # Errors
///
/// Never for the built-in descriptions (a test checks them); the type is
/// [`Catalog::router`]'s.
pub fn standard_router() -> Result<Router, RouteError> {
    Catalog::built_in().router()
}

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

    /// No subscriber: the catalog of a bare worker, which knows only the
    /// descriptions its application adds ([`Catalog::with`]).
    ///
    /// ```
    /// assert!(outbox_catalog::Catalog::empty().queues().is_empty());
    /// ```
    #[must_use]
    pub fn empty() -> Self {
        Self {
            descriptions: Vec::new(),
        }
    }

    /// This catalog plus `description`.
    #[must_use]
    pub fn with(mut self, description: SubscriberDescription) -> Self {
        self.descriptions.push(description);
        self
    }

    /// The routing table made of every description's routes, built-in ones
    /// first.
    ///
    /// # Errors
    ///
    /// The first refused rule: a malformed prefix or queue, or a prefix two
    /// descriptions claim ([`RouteError`]).
    pub fn router(&self) -> Result<Router, RouteError> {
        self.descriptions
            .iter()
            .flat_map(SubscriberDescription::routes)
            .try_fold(Router::empty(), |router, (prefix, queue)| {
                router.with_rule(prefix, queue)
            })
    }

    /// Every queue a description routes events to, sorted.
    ///
    /// ```
    /// let routed = outbox_catalog::Catalog::built_in().routed_queues();
    /// assert_eq!(routed.len(), 12);
    /// assert!(routed.contains(&"outbox.mail") && !routed.contains(&"toolctrl.email"));
    /// ```
    #[must_use]
    pub fn routed_queues(&self) -> Vec<&'static str> {
        let mut queues: Vec<&'static str> = self
            .descriptions
            .iter()
            .flat_map(|d| d.consumes)
            .filter(|c| !c.routes.is_empty())
            .map(|c| c.queue)
            .collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// Every queue of the catalog: the routed ones ([`Catalog::routed_queues`])
    /// then the downstream ones ([`Catalog::downstream_queues`]).
    ///
    /// ```
    /// let all = outbox_catalog::Catalog::built_in().queues();
    /// assert_eq!(all.len(), 14);
    /// assert_eq!(all.last(), Some(&"toolctrl.plugin-invoke"));
    /// ```
    #[must_use]
    pub fn queues(&self) -> Vec<&'static str> {
        let mut queues = self.routed_queues();
        queues.extend(self.downstream_queues());
        queues
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
    /// descriptions: a queue whose handler feeds a downstream queue whose
    /// task ids its description lists ([`outbox_dispatch::Receiver::deriving`]) is
    /// reconciled by those jobs; a queue whose deduplication key is
    /// recorded in `<table>.outbox_event_id` writes one row per event there
    /// ([`outbox_dispatch::Receiver::recorded_in`]); any other queue is plain (only its job
    /// tells).
    ///
    /// ```
    /// use outbox_dispatch::Receiver;
    /// let receivers = outbox_catalog::Catalog::built_in().receivers();
    /// assert_eq!(receivers.of("outbox.mail").derives_on(), Some("toolctrl.email"));
    /// assert_eq!(receivers.of("outbox.webhook"), &Receiver::Plain);
    /// ```
    #[must_use]
    pub fn receivers(&self) -> Receivers {
        let subscribers: Vec<registration::Subscriber> = self
            .descriptions
            .iter()
            .map(registration::Subscriber::from)
            .collect();
        registration::add_receivers(&subscribers, &[], Receivers::new())
    }

    /// The downstream queues whose derived jobs reconciliation cannot find
    /// (their description says their task ids cannot be listed,
    /// [`outbox_subscriber::DerivedTaskIds::Unlisted`]): a job of such a
    /// queue that is lost after its parent finished goes unnoticed. The
    /// worker logs them at start.
    ///
    /// ```
    /// assert!(outbox_catalog::Catalog::built_in().unreconciled_feeds().is_empty());
    /// ```
    #[must_use]
    pub fn unreconciled_feeds(&self) -> Vec<&DownstreamQueue> {
        self.descriptions
            .iter()
            .flat_map(|d| d.feeds)
            .filter(|feed| !feed.task_id.is_listed())
            .collect()
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
    use outbox_dispatch::Receiver;
    use outbox_queue::queues;

    /// The routing table the descriptions make is the contract's.
    #[test]
    fn standard_table_routes_as_the_contract_says() {
        let router = standard_router().unwrap();
        let cases = [
            ("tenant.subscription.renewed", Some("outbox.notification")),
            ("tenant.member.invited", None),
            ("mail.user.welcome", Some("outbox.mail")),
            ("webhook.order.created", Some("outbox.webhook")),
            ("notification.user.mentioned", Some("outbox.notification")),
            ("audit.user.login", Some("outbox.audit")),
            ("workflow.trigger.event", Some("outbox.workflow")),
            ("search.index.product.updated", Some("outbox.search-index")),
            ("search.query.logged", None),
            ("rag.index.doc.updated", Some("outbox.rag-index")),
            ("ai.cost.tokens.used", Some("outbox.ai-cost")),
            ("marketing.lead.created", Some("outbox.marketing")),
            (
                "form.submission.received",
                Some("outbox.form-submission-route"),
            ),
            ("billing.subscription.updated", Some("outbox.notification")),
            ("plugin.hook.workflow.executed", Some("outbox.plugin-hook")),
            (
                "plugin.capability-use.ai.call",
                Some("outbox.plugin-capability-use"),
            ),
            ("plugin.installed.now", None),
            ("mailbox.user.created", None),
        ];
        for (event_type, queue) in cases {
            assert_eq!(router.route(event_type), queue, "{event_type}");
        }
        assert_eq!(router.rules().len(), 14);
        assert_eq!(router.queues(), Catalog::built_in().routed_queues());
    }

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
            assert!(
                !catalog.routed_queues().contains(&queue),
                "{queue} is routed"
            );
        }
    }

    /// Reconciliation reads what each built-in handler leaves behind from
    /// the descriptions alone; this pins what it reads for every routed
    /// queue.
    #[test]
    fn the_receivers_come_from_the_descriptions() {
        let receivers = Catalog::built_in().receivers();
        let email = Receiver::deriving(queues::TOOLCTRL_EMAIL, &outbox_queue::EMAIL_TASK_IDS);
        let hook = Receiver::deriving(
            queues::TOOLCTRL_PLUGIN_INVOKE,
            &outbox_queue::PLUGIN_INVOKE_TASK_IDS,
        );
        for queue in Catalog::built_in().routed_queues() {
            let expected = match queue {
                queues::MAIL | queues::MARKETING => "email",
                queues::PLUGIN_HOOK => "plugin hook",
                queues::AUDIT => "audit_log",
                queues::NOTIFICATION => "notification",
                _ => "plain",
            };
            let got = match receivers.of(queue) {
                receiver if Some(receiver) == email.as_ref() => "email",
                receiver if Some(receiver) == hook.as_ref() => "plugin hook",
                Receiver::Derives { queue, .. } => panic!("derives on {queue}"),
                Receiver::Row(table) => table.table(),
                Receiver::Plain => "plain",
            };
            assert_eq!(got, expected, "{queue}");
        }
    }

    /// An application's search subscriber: `app.search-index`, whose
    /// handler writes one `search_document` row per event, and
    /// `app.search-bulk`, whose handler feeds `feeds`.
    pub(crate) const fn search(feeds: &'static [DownstreamQueue]) -> SubscriberDescription {
        SubscriberDescription {
            name: "app-search",
            consumes: &[
                ConsumedQueue {
                    queue: "app.search-index",
                    routes: &["search.page."],
                    payload: "`id`",
                },
                ConsumedQueue {
                    queue: "app.search-bulk",
                    routes: &["search.bulk."],
                    payload: "`ids`",
                },
            ],
            feeds,
            dedup: &[outbox_subscriber::DedupKey {
                queue: "app.search-index",
                key: "<event id>",
                recorded_in: "search_document.outbox_event_id",
            }],
        }
    }

    /// An application's subscriber that writes one row per event is
    /// reconciled by its row, and one that derives jobs reconciliation
    /// cannot find is named, from its description alone.
    #[test]
    fn an_added_subscriber_is_reconciled_from_its_description() {
        use outbox_subscriber::DerivedTaskIds;
        const REFRESH: &[DownstreamQueue] = &[DownstreamQueue {
            queue: "app.search-refresh",
            derived_from: &["app.search-bulk"],
            task_id: DerivedTaskIds::unlisted("refresh:<delivery id>"),
        }];
        const SEARCH: SubscriberDescription = search(REFRESH);
        let catalog = Catalog::built_in().with(SEARCH);
        let receivers = catalog.receivers();
        match receivers.of("app.search-index") {
            Receiver::Row(table) => assert_eq!(table.table(), "search_document"),
            other => panic!("{other:?}"),
        }
        assert_eq!(receivers.of("app.search-bulk"), &Receiver::Plain);
        assert_eq!(
            receivers.of(queues::MAIL).derives_on(),
            Some(queues::TOOLCTRL_EMAIL)
        );
        let unreconciled: Vec<&str> = catalog
            .unreconciled_feeds()
            .iter()
            .map(|feed| feed.queue)
            .collect();
        assert_eq!(unreconciled, ["app.search-refresh"]);
    }
}
