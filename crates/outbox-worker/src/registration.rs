//! What a worker tells the operator CLI at start: its handlers' queues, the
//! routing rules it adds to the standard table and its application
//! subscribers' descriptions, written to `outbox_worker_registration`
//! (`outbox_catalog::registration`). `outbox health`, `outbox dead` and
//! `outbox reconcile` read it, so an application's own queues show there
//! without the CLI being told.

use outbox_catalog::registration::{self, Registration, Route, Subscriber};
use outbox_dispatch::Router;
use outbox_pg::PgPool;
use outbox_subscriber::SubscriberDescription;

/// What the worker runs: `handlers` (its queues), the rules of `router`
/// the standard table lacks, and the `added` descriptions.
pub(crate) fn describe(
    worker: &str,
    group: &str,
    handlers: &[&str],
    router: &Router,
    standard: &Router,
    added: &[SubscriberDescription],
) -> Registration {
    let standard = standard.rules();
    let mut handlers: Vec<String> = handlers.iter().map(|q| (*q).to_owned()).collect();
    handlers.sort_unstable();
    handlers.dedup();
    Registration {
        worker: worker.to_owned(),
        group: group.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        handlers,
        routes: router
            .rules()
            .into_iter()
            .filter(|(prefix, queue)| standard.get(prefix) != Some(queue))
            .map(|(prefix, queue)| Route {
                prefix: prefix.to_owned(),
                queue: queue.to_owned(),
            })
            .collect(),
        subscribers: added.iter().map(Subscriber::from).collect(),
        registered_at: None,
    }
}

/// Writes `registration` under `queue_prefix`. A failure is logged and
/// start-up goes on: the row only informs the CLI.
pub(crate) async fn record(pool: &PgPool, queue_prefix: &str, registration: &Registration) {
    let written = match pool.get().await {
        Ok(mut conn) => registration::record(&mut conn, queue_prefix, registration)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(format!("no connection: {e}")),
    };
    match written {
        Ok(()) => tracing::debug!(
            worker = %registration.worker,
            handlers = ?registration.handlers,
            "registration recorded"
        ),
        Err(e) => tracing::warn!(
            worker = %registration.worker,
            error = %e,
            "cannot record what this worker runs in outbox_worker_registration; \
             outbox health and outbox reconcile will not see its own queues"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_subscriber::ConsumedQueue;

    #[test]
    fn a_registration_holds_the_added_rules_and_descriptions_only() {
        const SEARCH: SubscriberDescription = SubscriberDescription {
            name: "app-search",
            consumes: &[ConsumedQueue {
                queue: "app.search-urgent",
                routes: &["search.index.urgent."],
                payload: "`id`",
            }],
            feeds: &[],
            dedup: &[],
        };
        let standard = outbox_catalog::standard_router().unwrap();
        let router = standard
            .clone()
            .with_rule("search.index.urgent.", "app.search-urgent")
            .unwrap();
        let registration = describe(
            "search-worker",
            "general",
            &["outbox.search-index", "app.search-urgent", "outbox.audit"],
            &router,
            &standard,
            &[SEARCH],
        );
        assert_eq!(
            registration.handlers,
            ["app.search-urgent", "outbox.audit", "outbox.search-index"]
        );
        assert_eq!(
            registration.routes,
            [Route {
                prefix: "search.index.urgent.".into(),
                queue: "app.search-urgent".into(),
            }]
        );
        assert_eq!(registration.subscribers.len(), 1);
        assert_eq!(
            registration.subscribers[0].consumes[0].queue,
            "app.search-urgent"
        );
    }
}
