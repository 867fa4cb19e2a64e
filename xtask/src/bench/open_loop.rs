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

/// The rate fields of a drain of `jobs` no-op jobs that took `seconds`
/// from the worker's start to the last handler call, whose first handler
/// call was at `first_us` and last at `last_us`, the worker started at
/// `started_us` (µs since the epoch). `per_second` counts from the first
/// handler call to the last (the jobs after the first over that span): the
/// rate at which the backlog is worked, without the start-up, which the
/// two sides do not time alike (River's client and pool exist before its
/// clock starts; this project's worker opens its pools inside it).
/// `from_start_per_second` and `first_call_ms` give the start-up's share.
pub fn drain_rates(
    jobs: usize,
    seconds: f64,
    first_us: i64,
    last_us: i64,
    started_us: i64,
) -> serde_json::Value {
    let span = (last_us - first_us) as f64 / 1e6;
    let per_second = if jobs > 1 && span > 0.0 {
        ((jobs - 1) as f64 / span).round()
    } else {
        (jobs as f64 / seconds).round()
    };
    json!({
        "per_second": per_second,
        "from_start_per_second": (jobs as f64 / seconds).round(),
        "first_call_ms": round2((first_us - started_us) as f64 / 1000.0),
    })
}

/// Adds `extra`'s fields to the object `out`.
pub fn merge(out: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(out), serde_json::Value::Object(extra)) = (out.as_object_mut(), extra) {
        out.extend(extra);
    }
}

#[cfg(test)]
mod tests {
    use super::drain_rates;

    #[test]
    fn the_drain_rate_counts_from_the_first_handler_call_to_the_last_and_the_start_up_apart() {
        // 1,001 jobs: the worker started at 0, its first call came 500 ms
        // later and its last 1 s after that.
        let rates = drain_rates(1_001, 1.5, 500_000, 1_500_000, 0);
        assert_eq!(rates["per_second"], 1_000.0);
        assert_eq!(rates["from_start_per_second"], 667.0);
        assert_eq!(rates["first_call_ms"], 500.0);
    }

    #[test]
    fn a_drain_of_one_job_falls_back_to_the_rate_from_the_start() {
        let rates = drain_rates(1, 0.25, 100_000, 100_000, 0);
        assert_eq!(rates["per_second"], 4.0);
    }
}
