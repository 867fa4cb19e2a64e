//! [`WorkerSettings`], how each queue's worker runs, and the variables
//! that set it.

use std::time::Duration;

use outbox_env::{MAX_MILLIS, VariableError, Whole, millis};

/// How each queue's worker runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Jobs of one queue processed at once (a handler may ask for more, see
    /// [`crate::JobHandler::concurrency`]).
    pub concurrency: usize,
    /// In-process retries of a failed job (quick blips) before it is put
    /// back on the queue for later, under the ladder
    /// ([`crate::RetryPolicy::ladder`], every handler's unless it declares
    /// another policy).
    pub retries: usize,
    /// First in-process retry delay (doubling from there).
    pub min_backoff: Duration,
    /// Largest in-process retry delay.
    pub max_backoff: Duration,
    /// Delays of the ladder's later rounds: after the in-process retries, a job that
    /// still fails is pushed again (as `<task id>~retry<n>`) due after the
    /// next delay; past the last one (at most
    /// [`outbox_queue::MAX_RETRY_ROUNDS`]) it goes to the dead set. The
    /// default, 30 s to 4 h, spans about 8 hours of outage (8 h 8 min of delays).
    pub requeue_delays: Vec<Duration>,
    /// Worker heartbeat; a worker silent for `heartbeat * missed_heartbeats`
    /// is presumed dead and its in-flight jobs are redelivered.
    pub heartbeat: Duration,
    /// See `heartbeat`.
    pub missed_heartbeats: usize,
    /// Jobs fetched per Redis round trip, at least; a queue whose worker
    /// runs more jobs at once fetches as many as it runs, up to
    /// [`MAX_FETCH_BATCH`](crate::MAX_FETCH_BATCH).
    pub fetch_batch: usize,
    /// How often an idle worker looks for due jobs (retries rescheduled by
    /// the queue, and pushes whose wake-up was missed).
    pub poll_interval: Duration,
}

impl WorkerSettings {
    /// Default of `concurrency` (`WORKER_CONCURRENCY`).
    pub const DEFAULT_CONCURRENCY: usize = 10;
    /// Default of `retries` (`WORKER_RETRIES`).
    pub const DEFAULT_RETRIES: usize = 3;
    /// Default of `heartbeat` (`WORKER_HEARTBEAT_MS`).
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);
    /// Default of `poll_interval` (`WORKER_POLL_INTERVAL_MS`).
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
    /// The shortest `heartbeat` (`WORKER_HEARTBEAT_MS`): apalis-redis
    /// counts the orphan window in whole seconds, so below 1 s it rounds
    /// to zero and workers would steal each other's jobs.
    pub const MIN_HEARTBEAT: Duration = Duration::from_secs(1);

    /// The settings of the variables below read through `get` (the
    /// process environment in a binary), the rest as [`Default`].
    ///
    /// ```
    /// use outbox_subscriber::WorkerSettings;
    ///
    /// let get = |name: &str| (name == "WORKER_CONCURRENCY").then(|| "32".to_owned());
    /// let settings = WorkerSettings::from_lookup(&get)?;
    /// assert_eq!(settings.concurrency, 32);
    /// assert_eq!(settings.retries, WorkerSettings::DEFAULT_RETRIES);
    /// # Ok::<(), outbox_env::VariableError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The first [`VariableError`], naming its variable.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, VariableError> {
        Ok(Self {
            concurrency: WORKER_CONCURRENCY.read_as(get)?,
            retries: WORKER_RETRIES.read_as(get)?,
            heartbeat: WORKER_HEARTBEAT_MS.read_millis(get)?,
            poll_interval: WORKER_POLL_INTERVAL_MS.read_millis(get)?,
            ..Self::default()
        })
    }
}

/// `WORKER_CONCURRENCY`: [`WorkerSettings::concurrency`].
pub const WORKER_CONCURRENCY: Whole = Whole {
    name: "WORKER_CONCURRENCY",
    default: WorkerSettings::DEFAULT_CONCURRENCY as u64,
    min: 1,
    max: 1000,
    meaning: "jobs per queue in parallel (the audit and notification queues run at least 100); a job of a database-using queue holds a pooled connection, so a value above DATABASE_POOL_SIZE is warned about at start",
};
/// `WORKER_RETRIES`: [`WorkerSettings::retries`].
pub const WORKER_RETRIES: Whole = Whole {
    name: "WORKER_RETRIES",
    default: WorkerSettings::DEFAULT_RETRIES as u64,
    min: 0,
    max: 100,
    meaning: "quick in-process retries of a failing job before it goes back on the queue for later",
};
/// `WORKER_HEARTBEAT_MS`: [`WorkerSettings::heartbeat`].
pub const WORKER_HEARTBEAT_MS: Whole = Whole {
    name: "WORKER_HEARTBEAT_MS",
    default: millis(WorkerSettings::DEFAULT_HEARTBEAT),
    min: millis(WorkerSettings::MIN_HEARTBEAT),
    max: MAX_MILLIS,
    meaning: "queue-worker heartbeat in ms; silent for 4 beats = presumed dead, its jobs redelivered",
};
/// `WORKER_POLL_INTERVAL_MS`: [`WorkerSettings::poll_interval`].
pub const WORKER_POLL_INTERVAL_MS: Whole = Whole {
    name: "WORKER_POLL_INTERVAL_MS",
    default: millis(WorkerSettings::DEFAULT_POLL_INTERVAL),
    min: 10,
    max: MAX_MILLIS,
    meaning: "how often an idle queue worker looks for due jobs, in ms",
};

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            concurrency: Self::DEFAULT_CONCURRENCY,
            retries: Self::DEFAULT_RETRIES,
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            requeue_delays: [30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14_400]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            heartbeat: Self::DEFAULT_HEARTBEAT,
            missed_heartbeats: 4,
            fetch_batch: 10,
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each of the four variables sets its field; the rest keep their
    /// defaults; a value out of range is refused naming its variable.
    #[test]
    fn each_worker_variable_sets_its_field_and_a_bad_one_is_named() {
        let vars = [
            ("WORKER_CONCURRENCY", "32"),
            ("WORKER_RETRIES", "0"),
            ("WORKER_HEARTBEAT_MS", "5000"),
            ("WORKER_POLL_INTERVAL_MS", "250"),
        ];
        let get = |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        };
        assert_eq!(
            WorkerSettings::from_lookup(&get),
            Ok(WorkerSettings {
                concurrency: 32,
                retries: 0,
                heartbeat: Duration::from_secs(5),
                poll_interval: Duration::from_millis(250),
                ..WorkerSettings::default()
            })
        );
        assert_eq!(
            WorkerSettings::from_lookup(&|_: &str| None),
            Ok(WorkerSettings::default())
        );
        let slow_heartbeat = |name: &str| (name == "WORKER_HEARTBEAT_MS").then(|| "500".to_owned());
        let refused = WorkerSettings::from_lookup(&slow_heartbeat).unwrap_err();
        assert_eq!(refused.variable, "WORKER_HEARTBEAT_MS");
        assert_eq!(refused.value, "500");
    }
}
