//! The open-loop load of the latency measurements and the figures of its
//! line: publisher connections take the next job in turn, job *i* due at
//! *i* / rate seconds, so that a slow worker does not slow the load down.
//!
//! Shared by the latency and peers stages and by the River peer
//! (`xtask/peers/river` includes this file with `#[path]`, having no other
//! way to share code with xtask): it uses std, tokio, futures, anyhow and
//! serde_json only.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

/// Publishing connections of a load.
pub const PUBLISHERS: usize = 32;

/// What a load's publishers did.
pub struct Load<T> {
    /// What each publish returned, by publisher (not in job order).
    pub results: Vec<T>,
    /// How late each job was published against its schedule, ms.
    pub late_ms: Vec<f64>,
    /// From the first job's due time to the last publish's end.
    pub elapsed: Duration,
}

/// Publishes jobs `0..total` at `rate` a second from `conns`, one
/// connection per publisher: `publish(conn, i)` once per job, at its due
/// time or as soon after it as its publisher is free.
///
/// # Errors
///
/// The first error of a publish; the load stops there.
pub async fn publish<C, T>(
    conns: Vec<C>,
    rate: u32,
    total: usize,
    publish: impl AsyncFn(&mut C, usize) -> anyhow::Result<T>,
) -> anyhow::Result<Load<T>> {
    let next = AtomicUsize::new(0);
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let (next, publish) = (&next, &publish);
    let publishers = conns.into_iter().map(|mut conn| async move {
        let (mut results, mut late) = (Vec::new(), Vec::new());
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= total {
                break;
            }
            let due = start + Duration::from_secs_f64(i as f64 / f64::from(rate));
            tokio::time::sleep_until(due).await;
            late.push(due.elapsed().as_secs_f64() * 1000.0);
            results.push(publish(&mut conn, i).await?);
        }
        anyhow::Ok((results, late))
    });
    let parts = futures::future::try_join_all(publishers).await?;
    let elapsed = start.elapsed();
    let (mut results, mut late_ms) = (Vec::with_capacity(total), Vec::with_capacity(total));
    for (r, l) in parts {
        results.extend(r);
        late_ms.extend(l);
    }
    Ok(Load {
        results,
        late_ms,
        elapsed,
    })
}

/// The wall clock, µs since the epoch.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Percentile (nearest rank) of sorted `values`; NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// `x` to two decimals.
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The fields every latency line has: the load offered and achieved, the
/// events, p50, p95, p99, max and min of `latencies_ms`, and the p99 of
/// how late the publishers were (`publish_late_p99_ms`).
pub fn latency_fields(
    offered: u32,
    mut latencies_ms: Vec<f64>,
    mut late_ms: Vec<f64>,
    elapsed: Duration,
) -> serde_json::Value {
    latencies_ms.sort_by(f64::total_cmp);
    late_ms.sort_by(f64::total_cmp);
    let events = latencies_ms.len();
    let at = |p| round2(percentile(&latencies_ms, p));
    json!({
        "offered_per_second": offered,
        "achieved_per_second": (events as f64 / elapsed.as_secs_f64()).round(),
        "events": events,
        "p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": at(1.0), "min": at(0.0),
        "publish_late_p99_ms": round2(percentile(&late_ms, 0.99)),
    })
}

/// Adds `extra`'s fields to the object `out`.
pub fn merge(out: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(out), serde_json::Value::Object(extra)) = (out.as_object_mut(), extra) {
        out.extend(extra);
    }
}
