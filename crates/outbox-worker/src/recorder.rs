//! The `metrics` recorder the worker's metrics go to: its own Prometheus
//! recorder, installed by the first run of the process when no recorder is
//! installed yet (and then kept by every later run, since a process has one
//! global recorder for its whole life), or the application's own, when the
//! application installed one first. Only the worker's own can be rendered
//! for `/metrics`.

use std::convert::Infallible;
use std::sync::OnceLock;

use anyhow::{Context, Result};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::supervisor::Run;

/// How often the Prometheus recorder drains its histogram samples when
/// nobody scrapes `/metrics`.
pub const METRICS_UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// What the first call of [`prometheus`] found: the worker's recorder, or
/// `None` when another one was installed before it.
static INSTALLED: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The worker's Prometheus recorder, installed as the process's global
/// recorder by the first call when none is installed; `None` when the
/// application installed its own first (the worker's metrics then go to
/// it). Every later call answers the same.
///
/// # Errors
///
/// When the recorder cannot be configured (its histogram buckets).
pub(crate) fn prometheus() -> Result<Option<PrometheusHandle>> {
    if let Some(installed) = INSTALLED.get() {
        return Ok(installed.clone());
    }
    let recorder = crate::catalog::builder()
        .context("cannot configure the Prometheus recorder")?
        .build_recorder();
    let handle = recorder.handle();
    // Calls racing here are serialized by the cell: only the one whose
    // recorder was installed can have found none installed.
    let installed = INSTALLED.get_or_init(|| {
        metrics::set_global_recorder(recorder)
            .is_ok()
            .then_some(handle)
    });
    Ok(installed.clone())
}

/// The recorder of one run, with the metrics' help texts and
/// `outbox_build_info` of `binary` registered in it, and its start logged
/// when it is the application's.
///
/// # Errors
///
/// As [`prometheus`].
pub(crate) fn for_run(binary: &'static str) -> Result<Option<PrometheusHandle>> {
    let handle = prometheus()?;
    if handle.is_none() {
        tracing::info!(
            "metrics go to the application's own recorder, installed before the worker's; \
             the worker offers no /metrics route"
        );
    }
    crate::catalog::describe(binary);
    Ok(handle)
}

/// The upkeep of the worker's recorder, as a service of one run: without
/// it the samples of every histogram pile up until a scrape renders them,
/// so a process nobody scrapes grows without bound (about 40 bytes per
/// event). It drains them every [`METRICS_UPKEEP_EVERY`] until its token
/// is cancelled.
pub(crate) fn upkeep(
    handle: PrometheusHandle,
) -> impl FnMut(CancellationToken) -> Run<Infallible> + Send + 'static {
    move |token| {
        let handle = handle.clone();
        Box::pin(async move {
            let mut every = tokio::time::interval(METRICS_UPKEEP_EVERY);
            loop {
                tokio::select! {
                    () = token.cancelled() => return Ok(()),
                    _ = every.tick() => handle.run_upkeep(),
                }
            }
        })
    }
}
