//! [`with_metrics_recorder`]: runs async test code with a metrics recorder
//! of its own, so that parallel tests do not see each other's counters.

/// Runs `body` on a current-thread runtime with `recorder` installed for
/// this thread only (the runtime keeps every task of `body` on it), and
/// returns what `body` returned.
///
/// # Panics
///
/// When the runtime cannot be built.
pub fn with_metrics_recorder<T>(
    recorder: &dyn metrics::Recorder,
    body: impl AsyncFnOnce() -> T,
) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a test runtime: {e}"));
    metrics::with_local_recorder(recorder, || runtime.block_on(body()))
}
