//! What a tick does with the rows it pushed: the decision for a row whose
//! hand-off failed ([`after_failed_push`], pure, table-tested), and the
//! sorting of the push results into the outcomes the tick then records
//! ([`Outcomes`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{PushResult, TickReport, trace_id_of};
use crate::DispatcherConfig;
use outbox_store::{Failure, Lease, Retry, WaitForRoute};

/// What happens to a row whose hand-off to Redis failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailedPush {
    /// It becomes due again after `delay`, as retry number `attempt`.
    Retry {
        /// This retry's number, from 1.
        attempt: u32,
        /// The back-off before it.
        delay: Duration,
    },
    /// It goes `FAILED`: `attempt` would be past `OUTBOX_MAX_RETRIES`.
    DeadLetter {
        /// The attempt that would have been next.
        attempt: u32,
    },
}

/// The decision for a row that had `retries` retries before this failed
/// hand-off, under `config`'s `max_retries` and back-off.
///
/// ```
/// use std::time::Duration;
/// use outbox_dispatch::{AfterFailedPush, DispatcherConfig, after_failed_push};
///
/// let config = DispatcherConfig { max_retries: 2, ..DispatcherConfig::default() };
/// assert_eq!(
///     after_failed_push(0, &config),
///     AfterFailedPush::Retry { attempt: 1, delay: Duration::from_secs(60) }
/// );
/// assert_eq!(after_failed_push(2, &config), AfterFailedPush::DeadLetter { attempt: 3 });
/// ```
#[must_use]
pub fn after_failed_push(retries: i32, config: &DispatcherConfig) -> AfterFailedPush {
    let attempt = u32::try_from(retries).unwrap_or(0) + 1;
    if attempt > config.max_retries {
        AfterFailedPush::DeadLetter { attempt }
    } else {
        AfterFailedPush::Retry {
            attempt,
            delay: config.backoff_for(attempt),
        }
    }
}

/// The outcomes of one tick's pushes, to be recorded.
#[derive(Default)]
pub(super) struct Outcomes {
    /// Handed off: the lease and the queue.
    pub done: Vec<(Lease, String)>,
    /// To retry after a back-off.
    pub retries: Vec<Retry>,
    /// To mark `FAILED` (unroutable, oversized, out of retries).
    pub failures: Vec<Failure>,
    /// Never pushed (the tick was stopped): released as they were.
    pub released: Vec<Lease>,
    /// No route matches them yet: back to `PENDING` to wait for one.
    pub waits: Vec<WaitForRoute>,
    /// For the latency histogram: event, queue, and when it became due.
    pub latencies: Vec<(Uuid, String, DateTime<Utc>)>,
}

impl Outcomes {
    /// Starts from the rows already refused before any push.
    pub fn with_failures(failures: Vec<Failure>) -> Self {
        Self {
            failures,
            ..Self::default()
        }
    }

    /// Sorts each push result into its outcomes, logging each failed
    /// hand-off, and counts duplicates and dead-lettered rows in `report`.
    pub fn sort(
        &mut self,
        results: Vec<PushResult>,
        config: &DispatcherConfig,
        report: &mut TickReport,
    ) {
        for result in results {
            match result {
                PushResult::Pushed(unit, duplicates) => {
                    report.duplicates += duplicates;
                    for event in &unit.events {
                        if let Some(lease) = Lease::of(event) {
                            self.done.push((lease, unit.queue.clone()));
                            // Latency counts from when the row became due: a
                            // scheduled or retried row is not late for the
                            // time it had to wait.
                            self.latencies.push((
                                event.id,
                                unit.queue.clone(),
                                event.created_at.max(event.scheduled_at),
                            ));
                        }
                    }
                }
                PushResult::Failed(unit, error) => {
                    for event in &unit.events {
                        let Some(lease) = Lease::of(event) else {
                            continue;
                        };
                        let reason = format!("hand-off to {} failed: {error}", unit.queue);
                        match after_failed_push(event.retries, config) {
                            AfterFailedPush::DeadLetter { attempt } => {
                                tracing::error!(
                                    event_id = %event.id, tenant_id = %event.tenant_id, trace_id = trace_id_of(event).as_deref(), queue = %unit.queue,
                                    retries = attempt, error = %error, "hand-off failed for the last time; dead-lettering"
                                );
                                self.failures.push(Failure {
                                    lease,
                                    retry_increment: 1,
                                    error: reason,
                                    queue: Some(unit.queue.clone()),
                                    unrouted: false,
                                });
                                report.failed += 1;
                            }
                            AfterFailedPush::Retry { attempt, delay } => {
                                tracing::warn!(
                                    event_id = %event.id, tenant_id = %event.tenant_id, trace_id = trace_id_of(event).as_deref(), queue = %unit.queue,
                                    retry = attempt, delay_s = delay.as_secs(), error = %error, "hand-off failed; will retry"
                                );
                                self.retries.push(Retry {
                                    lease,
                                    delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
                                    error: reason,
                                    queue: unit.queue.clone(),
                                });
                            }
                        }
                    }
                }
                PushResult::NotStarted(unit) => {
                    self.released
                        .extend(unit.events.iter().filter_map(Lease::of));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Break checked: `>` turned into `>=` dead-letters the last retry.
    #[test]
    fn a_failed_hand_off_retries_with_its_back_off_until_the_retries_run_out() {
        let config = DispatcherConfig {
            max_retries: 3,
            ..DispatcherConfig::default()
        };
        let retry = |attempt| AfterFailedPush::Retry {
            attempt,
            delay: config.backoff_for(attempt),
        };
        let table = [
            (0, retry(1)),
            (1, retry(2)),
            (2, retry(3)),
            (3, AfterFailedPush::DeadLetter { attempt: 4 }),
            (9, AfterFailedPush::DeadLetter { attempt: 10 }),
            // A row whose count was written by hand below zero retries
            // from the first.
            (-5, retry(1)),
        ];
        for (retries, expected) in table {
            assert_eq!(
                after_failed_push(retries, &config),
                expected,
                "{retries} retries before"
            );
        }
        assert_eq!(config.backoff_for(1), Duration::from_secs(60));
    }

    #[test]
    fn with_no_retries_allowed_the_first_failure_dead_letters() {
        let config = DispatcherConfig {
            max_retries: 0,
            ..DispatcherConfig::default()
        };
        assert_eq!(
            after_failed_push(0, &config),
            AfterFailedPush::DeadLetter { attempt: 1 }
        );
    }
}
