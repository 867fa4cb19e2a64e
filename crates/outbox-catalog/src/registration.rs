//! What each worker process runs, recorded in Postgres
//! (`outbox_worker_registration`) so that the operator CLI follows an
//! application's own subscribers too: a worker writes its
//! [`Registration`] at start ([`record`]); `outbox health`, `outbox dead`
//! and `outbox reconcile` read them all ([`registered`]) and add their
//! queues, routes and receivers to the built-in ones
//! ([`Registrations`]).
//!
//! One row per worker name and queue prefix: replicas of one worker write
//! the same row, and each start writes it again, so the row says what the
//! latest start ran.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::upsert::excluded;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_dispatch::{Receiver, Receivers};
use outbox_model::schema::outbox_worker_registration as reg;
use outbox_subscriber::{DerivedTaskIds, SubscriberDescription};
use serde::{Deserialize, Serialize};

use crate::Catalog;

/// One routing rule a worker adds to the standard table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The event-type prefix (`search.index.urgent.`).
    pub prefix: String,
    /// The queue it routes to (`app.search-urgent`).
    pub queue: String,
}

/// A consumed queue of a recorded description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consumed {
    /// The queue.
    pub queue: String,
    /// The routing prefixes of the description that send events there.
    pub routes: Vec<String>,
}

/// A downstream queue of a recorded description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fed {
    /// The queue.
    pub queue: String,
    /// The queues whose handlers push its jobs.
    pub derived_from: Vec<String>,
    /// How its jobs' task ids are formed; `None` in a row written by a
    /// version that did not record it (read as not listed).
    #[serde(default)]
    pub task_id: Option<DerivedTaskIds>,
}

/// A deduplication key of a recorded description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dedup {
    /// The queue of the handler.
    pub queue: String,
    /// Where the key is recorded (`search_document.outbox_event_id`).
    pub recorded_in: String,
}

/// A [`SubscriberDescription`] as a worker records it: what the CLI needs
/// of it (queues, routes, fed queues and where keys are recorded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscriber {
    /// The description's name (`custom-worker search`).
    pub name: String,
    /// The queues its handlers consume.
    pub consumes: Vec<Consumed>,
    /// The downstream queues its handlers feed.
    pub feeds: Vec<Fed>,
    /// Its deduplication keys.
    pub dedup: Vec<Dedup>,
}

impl From<&SubscriberDescription> for Subscriber {
    fn from(description: &SubscriberDescription) -> Self {
        let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect();
        Self {
            name: description.name.to_owned(),
            consumes: description
                .consumes
                .iter()
                .map(|c| Consumed {
                    queue: c.queue.to_owned(),
                    routes: strings(c.routes),
                })
                .collect(),
            feeds: description
                .feeds
                .iter()
                .map(|f| Fed {
                    queue: f.queue.to_owned(),
                    derived_from: strings(f.derived_from),
                    task_id: Some(f.task_id.clone()),
                })
                .collect(),
            dedup: description
                .dedup
                .iter()
                .map(|d| Dedup {
                    queue: d.queue.to_owned(),
                    recorded_in: d.recorded_in.to_owned(),
                })
                .collect(),
        }
    }
}

/// What one worker process runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The process's name (`worker-general`, `custom-worker`).
    pub worker: String,
    /// Its group (`general`, `mail`).
    pub group: String,
    /// Its version.
    pub version: String,
    /// The queues its handlers consume, sorted.
    pub handlers: Vec<String>,
    /// Its routing rules beyond the standard table.
    pub routes: Vec<Route>,
    /// The descriptions of the subscribers it added to the built-in ones.
    pub subscribers: Vec<Subscriber>,
    /// When it was written (set by the database; ignored by [`record`]).
    pub registered_at: Option<DateTime<Utc>>,
}

/// Why a registration could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// The database refused the statement or the connection failed.
    #[error("the worker registrations in outbox_worker_registration: {0}")]
    Database(#[from] diesel::result::Error),
    /// A row holds JSON of another shape (written by another version).
    #[error("the registration of worker {worker:?} cannot be read: {source}")]
    Malformed {
        /// The worker of the row.
        worker: String,
        /// What was wrong.
        source: serde_json::Error,
    },
}

#[derive(Queryable)]
struct Row {
    worker: String,
    worker_group: String,
    version: String,
    handlers: Vec<String>,
    routes: serde_json::Value,
    subscribers: serde_json::Value,
    registered_at: DateTime<Utc>,
}

/// Writes `registration` as the row of its worker under `queue_prefix`,
/// replacing what an earlier start wrote.
///
/// # Errors
///
/// [`RegistrationError::Database`] when the write fails.
#[tracing::instrument(skip(conn, registration), fields(worker = %registration.worker, queue_prefix), err)]
pub async fn record(
    conn: &mut AsyncPgConnection,
    queue_prefix: &str,
    registration: &Registration,
) -> Result<(), RegistrationError> {
    let json = |value: serde_json::Result<serde_json::Value>| {
        value.map_err(|source| RegistrationError::Malformed {
            worker: registration.worker.clone(),
            source,
        })
    };
    let routes = json(serde_json::to_value(&registration.routes))?;
    let subscribers = json(serde_json::to_value(&registration.subscribers))?;
    diesel::insert_into(reg::table)
        .values((
            reg::queue_prefix.eq(queue_prefix),
            reg::worker.eq(&registration.worker),
            reg::worker_group.eq(&registration.group),
            reg::version.eq(&registration.version),
            reg::handlers.eq(&registration.handlers),
            reg::routes.eq(&routes),
            reg::subscribers.eq(&subscribers),
            reg::registered_at.eq(diesel::dsl::now),
        ))
        .on_conflict((reg::queue_prefix, reg::worker))
        .do_update()
        .set((
            reg::worker_group.eq(excluded(reg::worker_group)),
            reg::version.eq(excluded(reg::version)),
            reg::handlers.eq(excluded(reg::handlers)),
            reg::routes.eq(excluded(reg::routes)),
            reg::subscribers.eq(excluded(reg::subscribers)),
            reg::registered_at.eq(excluded(reg::registered_at)),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// Every registration under `queue_prefix`, by worker name.
///
/// # Errors
///
/// [`RegistrationError::Database`] when the read fails,
/// [`RegistrationError::Malformed`] for a row this version cannot read.
#[tracing::instrument(skip(conn), err)]
pub async fn registered(
    conn: &mut AsyncPgConnection,
    queue_prefix: &str,
) -> Result<Registrations, RegistrationError> {
    let rows: Vec<Row> = reg::table
        .filter(reg::queue_prefix.eq(queue_prefix))
        .order(reg::worker.asc())
        .select((
            reg::worker,
            reg::worker_group,
            reg::version,
            reg::handlers,
            reg::routes,
            reg::subscribers,
            reg::registered_at,
        ))
        .load(conn)
        .await?;
    rows.into_iter()
        .map(|row| {
            let malformed = |source| RegistrationError::Malformed {
                worker: row.worker.clone(),
                source,
            };
            Ok(Registration {
                routes: serde_json::from_value(row.routes.clone()).map_err(malformed)?,
                subscribers: serde_json::from_value(row.subscribers.clone()).map_err(malformed)?,
                worker: row.worker,
                group: row.worker_group,
                version: row.version,
                handlers: row.handlers,
                registered_at: Some(row.registered_at),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Registrations)
}

/// The registrations of every worker: what the CLI adds to the built-in
/// catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registrations(pub Vec<Registration>);

impl Registrations {
    /// Every routing rule the workers added, as (prefix, queue), sorted
    /// and once each.
    #[must_use]
    pub fn routes(&self) -> Vec<(&str, &str)> {
        let mut routes: Vec<(&str, &str)> = self
            .0
            .iter()
            .flat_map(|r| &r.routes)
            .map(|route| (route.prefix.as_str(), route.queue.as_str()))
            .collect();
        routes.sort_unstable();
        routes.dedup();
        routes
    }

    /// Every queue a worker consumes or routes to that is not downstream
    /// (fed by a subscriber): the queues whose rows `outbox reconcile`
    /// follows, sorted.
    #[must_use]
    pub fn routed_queues(&self) -> Vec<&str> {
        let fed = self.fed_queues();
        let mut queues: Vec<&str> = self
            .0
            .iter()
            .flat_map(|r| r.handlers.iter().map(String::as_str))
            .chain(self.routes().into_iter().map(|(_, queue)| queue))
            .filter(|queue| !fed.contains(queue))
            .collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// Every downstream queue the workers' subscribers feed, sorted.
    #[must_use]
    pub fn fed_queues(&self) -> Vec<&str> {
        let mut queues: Vec<&str> = self
            .subscribers()
            .flat_map(|s| &s.feeds)
            .map(|f| f.queue.as_str())
            .collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// The queues deriving the jobs of the downstream queue `queue`, when a
    /// registered subscriber feeds it.
    #[must_use]
    pub fn derived_from(&self, queue: &str) -> Option<Vec<String>> {
        self.subscribers()
            .flat_map(|s| &s.feeds)
            .find(|feed| feed.queue == queue)
            .map(|feed| feed.derived_from.clone())
    }

    fn subscribers(&self) -> impl Iterator<Item = &Subscriber> {
        self.0.iter().flat_map(|r| &r.subscribers)
    }

    /// `receivers` plus what the registered subscribers' handlers leave
    /// behind, by the rules of [`Catalog::receivers`]: a queue whose key is
    /// recorded in `<table>.outbox_event_id` is reconciled by that row; a
    /// queue deriving jobs whose task ids its description lists is
    /// reconciled by them; others by their job alone. A queue the built-in
    /// catalog already describes keeps the built-in receiver.
    #[must_use]
    pub fn receivers(&self, catalog: &Catalog, receivers: Receivers) -> Receivers {
        let subscribers: Vec<Subscriber> = self.subscribers().cloned().collect();
        add_receivers(&subscribers, &catalog.queues(), receivers)
    }
}

/// `receivers` plus what the handlers of each queue `subscribers` consume
/// leave behind (see [`Catalog::receivers`]), but for the queues of
/// `skip`.
pub(crate) fn add_receivers(
    subscribers: &[Subscriber],
    skip: &[&str],
    mut receivers: Receivers,
) -> Receivers {
    let feeds = || subscribers.iter().flat_map(|s| &s.feeds);
    let dedup = || subscribers.iter().flat_map(|s| &s.dedup);
    for consumed in subscribers.iter().flat_map(|s| &s.consumes) {
        let queue = consumed.queue.as_str();
        if skip.contains(&queue) {
            continue;
        }
        let derived = feeds()
            .filter(|feed| feed.derived_from.iter().any(|q| q == queue))
            .find_map(|feed| {
                let task_ids = feed.task_id.as_ref()?;
                Receiver::deriving(feed.queue.clone(), task_ids)
            });
        let rows = || {
            dedup()
                .filter(|key| key.queue == queue)
                .map(|key| Receiver::recorded_in(key.recorded_in.clone()))
                .find(|receiver| *receiver != Receiver::Plain)
        };
        if let Some(receiver) = derived.or_else(rows) {
            receivers = receivers.with(queue, receiver);
        }
    }
    receivers
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_subscriber::DownstreamQueue;

    const REFRESH: &[DownstreamQueue] = &[DownstreamQueue {
        queue: "app.search-refresh",
        derived_from: &["app.search-bulk"],
        task_id: DerivedTaskIds::per_delivery("refresh:"),
    }];
    const SEARCH: SubscriberDescription = crate::tests::search(REFRESH);

    /// The registration as the CLI reads it back from its row (JSON).
    fn read_back(subscriber: &Subscriber) -> Registrations {
        let registration = Registration {
            worker: "search-worker".into(),
            group: "general".into(),
            version: "0".into(),
            handlers: vec!["app.search-bulk".into(), "app.search-index".into()],
            routes: Vec::new(),
            subscribers: vec![subscriber.clone()],
            registered_at: None,
        };
        let json = serde_json::to_value(&registration).unwrap();
        Registrations(vec![serde_json::from_value(json).unwrap()])
    }

    /// What the CLI reconciles of an application's subscriber comes from
    /// the registration alone: its row table and the jobs it derives, as
    /// the worker's own catalog would, and the built-in receivers stay.
    #[test]
    fn a_registered_subscriber_is_reconciled_by_its_rows_and_derived_jobs() {
        let catalog = Catalog::built_in();
        let receivers =
            read_back(&Subscriber::from(&SEARCH)).receivers(&catalog, catalog.receivers());
        match receivers.of("app.search-index") {
            Receiver::Row(table) => assert_eq!(table.table(), "search_document"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            receivers.of("app.search-bulk"),
            &Receiver::deriving(
                "app.search-refresh",
                &DerivedTaskIds::per_delivery("refresh:")
            )
            .unwrap()
        );
        assert_eq!(
            receivers.of("outbox.mail"),
            catalog.receivers().of("outbox.mail")
        );
        assert_eq!(
            catalog.with(SEARCH).receivers().of("app.search-bulk"),
            receivers.of("app.search-bulk")
        );
    }

    /// A row written before the task ids were recorded reads as a feed
    /// reconciliation cannot list: its parent queue is plain.
    #[test]
    fn a_feed_recorded_without_task_ids_leaves_its_parent_plain() {
        let mut subscriber = Subscriber::from(&SEARCH);
        let mut json = serde_json::to_value(&subscriber.feeds[0]).unwrap();
        json.as_object_mut().unwrap().remove("task_id");
        subscriber.feeds[0] = serde_json::from_value(json).unwrap();
        assert_eq!(subscriber.feeds[0].task_id, None);
        let catalog = Catalog::built_in();
        let receivers = read_back(&subscriber).receivers(&catalog, Receivers::new());
        assert_eq!(receivers.of("app.search-bulk"), &Receiver::Plain);
    }
}
