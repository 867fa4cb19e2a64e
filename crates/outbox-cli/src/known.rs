//! The queues, routes and receivers the CLI follows: the built-in
//! subscribers' ([`outbox_catalog::Catalog`]), the rules of
//! `--routes-file`, and what the workers recorded at start in
//! `outbox_worker_registration` (an application's own subscribers and
//! routing rules), so that `outbox health`, `outbox dead` and `outbox
//! reconcile` show an application's queues without being told.

use anyhow::Context;
use diesel_async::AsyncPgConnection;
use outbox_catalog::Catalog;
use outbox_catalog::registration::{self, Registrations};
use outbox_dispatch::{Receivers, Router};

use crate::Cli;

/// What the CLI knows of the queues.
#[derive(Debug)]
pub(crate) struct Known {
    /// The standard table, `--routes-file`'s rules and the registered
    /// workers' rules (a prefix already taken keeps its first queue).
    pub(crate) router: Router,
    catalog: Catalog,
    registrations: Registrations,
}

impl Known {
    /// The built-in catalog and `--routes-file` with the registrations
    /// read over `conn`.
    pub(crate) async fn read(cli: &Cli, conn: &mut AsyncPgConnection) -> anyhow::Result<Self> {
        let registrations = registration::registered(conn, &cli.queue_prefix)
            .await
            .context("cannot read what the workers registered")?;
        Self::with(cli, registrations)
    }

    /// As [`Known::read`], when the CLI has a database; without one, or
    /// when it cannot be read, the built-in catalog and `--routes-file`
    /// alone (for commands that otherwise need only Redis).
    pub(crate) async fn read_if_possible(cli: &Cli) -> anyhow::Result<Self> {
        let mut registrations = Registrations::default();
        if cli.database_url.is_some()
            && let Ok(mut conn) = crate::connect(cli).await
        {
            registrations = registration::registered(&mut conn, &cli.queue_prefix)
                .await
                .unwrap_or_default();
        }
        Self::with(cli, registrations)
    }

    pub(crate) fn with(cli: &Cli, registrations: Registrations) -> anyhow::Result<Self> {
        let mut router = crate::router(cli)?;
        for (prefix, queue) in registrations.routes() {
            if !router.rules().contains_key(prefix) {
                router = router.with_rule(prefix, queue).with_context(|| {
                    format!("a routing rule a worker registered ({prefix} -> {queue})")
                })?;
            }
        }
        Ok(Self {
            router,
            catalog: Catalog::built_in(),
            registrations,
        })
    }

    /// Every queue events are routed to: the router's and the ones
    /// registered workers consume, without the downstream ones, sorted.
    pub(crate) fn routed_queues(&self) -> Vec<&str> {
        let downstream = self.downstream_queues();
        let mut queues: Vec<&str> = self
            .router
            .queues()
            .into_iter()
            .chain(self.registrations.routed_queues())
            .filter(|queue| !downstream.contains(queue))
            .collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// Every downstream queue, built-in and registered, sorted.
    pub(crate) fn downstream_queues(&self) -> Vec<&str> {
        let mut queues: Vec<&str> = self.catalog.downstream_queues();
        queues.extend(self.registrations.fed_queues());
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// Every queue: the routed ones, then the downstream ones.
    pub(crate) fn queues(&self) -> Vec<&str> {
        let mut queues = self.routed_queues();
        queues.extend(self.downstream_queues());
        queues
    }

    /// The downstream queue `queue` and the queues deriving its jobs, when
    /// a built-in or registered subscriber feeds it.
    pub(crate) fn derived_from(&self, queue: &str) -> Option<Vec<String>> {
        if let Some(feed) = self.catalog.downstream(queue) {
            return Some(feed.derived_from.iter().map(|q| (*q).to_owned()).collect());
        }
        self.registrations.derived_from(queue)
    }

    /// What each queue's handler leaves behind, for reconciliation.
    pub(crate) fn receivers(&self) -> Receivers {
        self.registrations
            .receivers(&self.catalog, self.catalog.receivers())
    }
}
