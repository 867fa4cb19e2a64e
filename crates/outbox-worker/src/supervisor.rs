//! [`Supervisor`]: the named, long-running services of a process (the HTTP
//! server, the dispatcher, retention, the queue workers, ...), started in
//! the order they are registered, each restarted with backoff when it
//! fails or, when its failure must end the run, stopping every other one;
//! stopped when a shutdown future the caller owns resolves, within one
//! grace period. It installs no signal handler: the binaries pass one
//! ([`crate::shutdown_signal`]), an application running the worker in its
//! own runtime passes its own future.
//!
//! It is not a job runner: the queue workers restart their own queues
//! (`outbox_subscriber`); here they are one service.
//!
//! Stopping: every service is told to stop at once (its
//! [`CancellationToken`]), in reverse order of registration, and then
//! awaited in that order until the grace period ends. Told together, the
//! dispatcher gives back the rows it claimed while the queue workers finish
//! their jobs, both within the one grace period
//! (`WORKER_SHUTDOWN_GRACE_MS`). A service still running at the end of
//! the grace period is named in the log and in [`Stopped::overran`], and
//! aborted.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One run of a service, for a start function whose futures need a name.
pub(crate) type Run<E> = Pin<Box<dyn Future<Output = Result<(), E>> + Send>>;

/// What a service's run ends with.
type ServiceFuture = Run<anyhow::Error>;

/// Starts one run of a service, which ends when its token is cancelled.
type Start = Box<dyn FnMut(CancellationToken) -> ServiceFuture + Send>;

/// The pauses between restarts of a failing service: `first`, doubling up
/// to `max`; back to `first` after a run that lasted `max` or more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The pause after the first failure.
    pub first: Duration,
    /// The longest pause.
    pub max: Duration,
}

impl Backoff {
    /// 1 s, 2 s, 4 s, ... up to 30 s, as the queue workers restart a queue.
    pub const STANDARD: Self = Self {
        first: Duration::from_secs(1),
        max: Duration::from_secs(30),
    };

    /// The pause after `failures` failures in a row (at least 1).
    #[must_use]
    pub fn after(self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first.saturating_mul(1 << doublings).min(self.max)
    }
}

/// What a service's failure (an error, or a panic) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// Start it again after a [`Backoff`] pause; the others run on.
    Restart(Backoff),
    /// Stop every service; the run ends with this service's error.
    StopAll,
}

/// One registered service.
struct Service {
    name: &'static str,
    on_failure: OnFailure,
    start: Start,
}

/// How a run of [`Supervisor::run_until`] ended without a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// What asked for the stop: the shutdown future's answer.
    pub by: &'static str,
    /// The services in the order they were seen stopped (reverse order of
    /// registration), the ones that overran included.
    pub order: Vec<&'static str>,
    /// The services still running at the end of the grace period (aborted).
    pub overran: Vec<&'static str>,
}

/// The services of one process; see the module documentation.
pub(crate) struct Supervisor {
    grace: Duration,
    stopping: &'static str,
    services: Vec<Service>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("grace", &self.grace)
            .field(
                "services",
                &self.services.iter().map(|s| s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Supervisor {
    /// No services yet; stopping takes at most `grace`.
    #[must_use]
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            stopping: "stopping: no new work; finishing what is in hand",
            services: Vec::new(),
        }
    }

    /// What the log says when the stop begins, instead of "stopping: no new
    /// work; finishing what is in hand". (The bridge's, feature `workflow`.)
    #[cfg(feature = "workflow")]
    #[must_use]
    pub fn saying(mut self, stopping: &'static str) -> Self {
        self.stopping = stopping;
        self
    }

    /// Registers the service `name`: `start` makes one run of it from the
    /// token that tells it to stop; a run that fails is handled as
    /// `on_failure` says, a run that ends `Ok` before the stop is not
    /// started again.
    #[must_use]
    pub fn service<F, Fut, E>(
        mut self,
        name: &'static str,
        on_failure: OnFailure,
        mut start: F,
    ) -> Self
    where
        F: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<anyhow::Error>,
    {
        let start: Start = Box::new(move |token| {
            let run = start(token);
            Box::pin(async move { run.await.map_err(Into::into) })
        });
        self.services.push(Service {
            name,
            on_failure,
            start,
        });
        self
    }

    /// Starts every service, in order, and runs them until `shutdown`
    /// resolves (its answer, such as `SIGTERM`, goes to the log) or a
    /// service registered with [`OnFailure::StopAll`] fails; then stops
    /// them (see the module documentation).
    ///
    /// # Errors
    ///
    /// The error of the [`OnFailure::StopAll`] service that failed (the
    /// first one, when several did).
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = &'static str>,
    ) -> anyhow::Result<Stopped> {
        let failed = CancellationToken::new();
        let mut running = Vec::with_capacity(self.services.len());
        for service in self.services {
            let token = CancellationToken::new();
            let mut keeper = JoinSet::new();
            keeper.spawn(keep(
                service.name,
                service.on_failure,
                service.start,
                token.clone(),
                failed.clone(),
            ));
            running.push((service.name, token, keeper));
        }
        let by = tokio::select! {
            by = shutdown => by,
            () = failed.cancelled() => "a failing service",
        };
        tracing::info!(
            by,
            grace_ms = self.grace.as_millis() as u64,
            "{}",
            self.stopping
        );
        for (_, token, _) in running.iter().rev() {
            token.cancel();
        }
        let deadline = Instant::now() + self.grace;
        let mut stopped = Stopped {
            by,
            order: Vec::new(),
            overran: Vec::new(),
        };
        let mut first_error = None;
        for (name, _, mut keeper) in running.into_iter().rev() {
            stopped.order.push(name);
            match tokio::time::timeout_at(deadline, keeper.join_next()).await {
                Ok(Some(Ok(Err(e)))) => {
                    first_error.get_or_insert(e);
                }
                Ok(Some(Err(e))) => {
                    tracing::error!(service = name, error = %e, "service supervision panicked");
                }
                Ok(Some(Ok(Ok(()))) | None) => {}
                Err(_) => {
                    tracing::warn!(
                        service = name,
                        "still running at the end of the grace period"
                    );
                    stopped.overran.push(name);
                    keeper.abort_all();
                }
            }
        }
        first_error.map_or(Ok(stopped), Err)
    }
}

/// Runs the service `name` until `token` is cancelled: each run in a task
/// of its own (a panic is a failure too), restarted after a failure or, for
/// [`OnFailure::StopAll`], ending with its error after cancelling `failed`.
async fn keep(
    name: &'static str,
    on_failure: OnFailure,
    mut start: Start,
    token: CancellationToken,
    failed: CancellationToken,
) -> anyhow::Result<()> {
    let mut failures = 0;
    loop {
        let started = Instant::now();
        let mut run = JoinSet::new();
        run.spawn(start(token.clone()));
        let error = match run.join_next().await {
            Some(Ok(Ok(()))) | None => return Ok(()),
            Some(Ok(Err(e))) => e,
            Some(Err(e)) => panicked(name, e),
        };
        match on_failure {
            OnFailure::StopAll => {
                tracing::error!(service = name, error = %format!("{error:#}"), "service failed; stopping");
                failed.cancel();
                return Err(error);
            }
            OnFailure::Restart(_) if token.is_cancelled() => {
                tracing::warn!(service = name, error = %format!("{error:#}"), "service failed while stopping");
                return Ok(());
            }
            OnFailure::Restart(backoff) => {
                failures = if started.elapsed() >= backoff.max {
                    1
                } else {
                    failures + 1
                };
                let pause = backoff.after(failures);
                tracing::error!(
                    service = name,
                    error = %format!("{error:#}"),
                    restart_in_ms = pause.as_millis() as u64,
                    "service failed; restarting"
                );
                metrics::counter!("outbox_service_restarts_total", "service" => name).increment(1);
                tokio::select! {
                    () = token.cancelled() => return Ok(()),
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// A run's panic as its failure.
fn panicked(name: &'static str, e: JoinError) -> anyhow::Error {
    anyhow::anyhow!("{name} panicked: {e}")
}

#[cfg(test)]
#[path = "supervisor/tests.rs"]
mod tests;
