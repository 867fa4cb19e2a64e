//! Retry policies: how often a failing job is tried and how long it waits
//! between tries, and the pure decision of what follows a failed attempt.

use std::time::Duration;

use outbox_queue::MAX_RETRY_ROUNDS;

use crate::WorkerSettings;

/// How long a job waits after a failed attempt before the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Backoff {
    /// The workers' ladder, the default: a failed job is retried in
    /// process [`WorkerSettings::retries`] times (`WORKER_RETRIES`, 200 ms
    /// doubling up to 10 s between tries); then a copy goes back on the
    /// queue, due after the next of [`WorkerSettings::requeue_delays`]
    /// (30 s, 1, 2, 5, 10, 20, 30 min, 1, 2, 4 h), and the next round of
    /// tries starts there; past the last delay the job is dead.
    #[default]
    Ladder,
    /// Every retry goes back on the queue, due this long after the
    /// failure.
    Fixed(Duration),
    /// Every retry goes back on the queue, due `first` after the first
    /// failed attempt, twice as long after each further one, never more
    /// than `max`.
    Exponential {
        /// The wait after the first failed attempt.
        first: Duration,
        /// The longest wait.
        max: Duration,
    },
}

impl Backoff {
    /// The wait after failed attempt `attempt` (from 1), for the backoffs
    /// that put every retry back on the queue; `None` for
    /// [`Backoff::Ladder`], whose waits come from the [`WorkerSettings`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_subscriber::Backoff;
    ///
    /// let secs = Duration::from_secs;
    /// let backoff = Backoff::Exponential { first: secs(10), max: secs(60) };
    /// let waits: Vec<_> = (1..=5).filter_map(|n| backoff.delay(n)).collect();
    /// assert_eq!(waits, [secs(10), secs(20), secs(40), secs(60), secs(60)]);
    /// assert_eq!(Backoff::Ladder.delay(1), None);
    /// ```
    #[must_use]
    pub fn delay(&self, attempt: usize) -> Option<Duration> {
        match *self {
            Self::Ladder => None,
            Self::Fixed(delay) => Some(delay),
            Self::Exponential { first, max } => {
                let doublings = u32::try_from(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
                let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
                Some(first.saturating_mul(factor).min(max))
            }
        }
    }
}

/// How a handler's failing jobs are retried: the [`Backoff`] between
/// attempts and at most how many attempts in all. A handler declares it
/// with [`crate::JobHandler::retry_policy`]; the default is the workers'
/// ladder with no limit of its own, so a handler that declares nothing is
/// retried as every built-in one.
///
/// Every failed attempt counts, [`crate::JobError::retry_after`] ones
/// included; the job goes to the queue's dead set after its last attempt
/// with the reason `gave up after <n> attempts: <last reason>`. A queue
/// carries at most [`outbox_queue::MAX_RETRY_ROUNDS`] copies of a job, so a
/// policy whose every retry goes back on the queue makes at most
/// [`RetryPolicy::MAX_QUEUED_ATTEMPTS`] attempts.
///
/// ```
/// use std::time::Duration;
/// use outbox_subscriber::{Backoff, RetryPolicy};
///
/// // Two tries a minute apart, then the dead set.
/// let policy = RetryPolicy::fixed(Duration::from_secs(60)).with_max_attempts(2);
/// assert_eq!(policy.backoff(), Backoff::Fixed(Duration::from_secs(60)));
/// assert_eq!(policy.max_attempts(), Some(2));
/// assert_eq!(RetryPolicy::default(), RetryPolicy::ladder());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryPolicy {
    backoff: Backoff,
    max_attempts: Option<usize>,
}

impl RetryPolicy {
    /// The most attempts of a policy whose every retry goes back on the
    /// queue: the first delivery and [`outbox_queue::MAX_RETRY_ROUNDS`]
    /// copies.
    pub const MAX_QUEUED_ATTEMPTS: usize = MAX_RETRY_ROUNDS + 1;

    /// The workers' ladder ([`Backoff::Ladder`]), the default.
    #[must_use]
    pub const fn ladder() -> Self {
        Self {
            backoff: Backoff::Ladder,
            max_attempts: None,
        }
    }

    /// Every retry back on the queue, due `delay` after the failure
    /// ([`Backoff::Fixed`]).
    #[must_use]
    pub const fn fixed(delay: Duration) -> Self {
        Self {
            backoff: Backoff::Fixed(delay),
            max_attempts: None,
        }
    }

    /// Every retry back on the queue, due `first` after the first failure
    /// and doubling up to `max` ([`Backoff::Exponential`]).
    #[must_use]
    pub const fn exponential(first: Duration, max: Duration) -> Self {
        Self {
            backoff: Backoff::Exponential { first, max },
            max_attempts: None,
        }
    }

    /// The same backoff with at most `max_attempts` attempts (at least 1;
    /// at most [`RetryPolicy::MAX_QUEUED_ATTEMPTS`] unless the backoff is
    /// the ladder, whose rounds end it anyway). A handler group refuses a
    /// policy out of these bounds
    /// ([`crate::SubscriberError::RetryPolicy`]).
    #[must_use]
    pub const fn with_max_attempts(self, max_attempts: usize) -> Self {
        Self {
            max_attempts: Some(max_attempts),
            ..self
        }
    }

    /// The wait between attempts.
    #[must_use]
    pub const fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The most attempts, when the policy sets a number of its own
    /// (without one, the ladder's rounds or
    /// [`RetryPolicy::MAX_QUEUED_ATTEMPTS`] end the retries).
    #[must_use]
    pub const fn max_attempts(&self) -> Option<usize> {
        self.max_attempts
    }

    /// Whether the policy can work.
    ///
    /// # Errors
    ///
    /// [`RetryPolicyError`] naming the bound `max_attempts` is out of.
    pub fn check(&self) -> Result<(), RetryPolicyError> {
        match (self.max_attempts, self.backoff) {
            (Some(0), _) => Err(RetryPolicyError::NoAttempt),
            (Some(max_attempts), Backoff::Fixed(_) | Backoff::Exponential { .. })
                if max_attempts > Self::MAX_QUEUED_ATTEMPTS =>
            {
                Err(RetryPolicyError::TooManyAttempts { max_attempts })
            }
            _ => Ok(()),
        }
    }

    /// In-process tries per round: the ladder's `retries + 1`, else one
    /// (every retry goes back on the queue).
    fn tries_per_round(&self, settings: &WorkerSettings) -> usize {
        match self.backoff {
            Backoff::Ladder => settings.retries + 1,
            Backoff::Fixed(_) | Backoff::Exponential { .. } => 1,
        }
    }

    /// The attempt number (from 1) of in-process try `try_no` (from 0) of
    /// retry round `round` (0 for the first delivery).
    pub(crate) fn attempt_number(
        &self,
        settings: &WorkerSettings,
        round: usize,
        try_no: usize,
    ) -> usize {
        round * self.tries_per_round(settings) + try_no + 1
    }
}

/// Why a [`RetryPolicy`] cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryPolicyError {
    /// `with_max_attempts(0)`: a job must be tried at least once.
    #[error("max attempts is 0; a job is tried at least once")]
    NoAttempt,
    /// More attempts than copies of a job the queue can carry.
    #[error(
        "max attempts is {max_attempts}, but a policy that puts every retry back on the queue makes at most {} attempts",
        RetryPolicy::MAX_QUEUED_ATTEMPTS
    )]
    TooManyAttempts {
        /// The number asked for.
        max_attempts: usize,
    },
}

/// A failed attempt, as the decision sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Failure<'a> {
    /// The retry round of the copy that ran (0 for the first delivery).
    pub round: usize,
    /// The in-process try of the round that failed, from 0.
    pub try_no: usize,
    /// The handler's reason.
    pub reason: &'a str,
    /// The wait the handler asked for ([`crate::JobError::RetryAfter`]).
    pub after: Option<Duration>,
}

/// What follows a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Try again in process after in-process retry `try_no`'s wait.
    RetryInProcess,
    /// This copy is finished.
    Settle(Settled),
}

/// How a job's copy ends after its last try in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settled {
    /// Push a copy with this task id, due after `delay`.
    Requeue { next: String, delay: Duration },
    /// Move it to the dead set with this reason.
    GiveUp(String),
}

/// The decision for the failed attempts of one job copy: its handler's
/// policy, the worker's settings (the ladder) and the first delivery's
/// task id (which retry copies are named after).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decision<'a> {
    pub policy: &'a RetryPolicy,
    pub settings: &'a WorkerSettings,
    pub base_id: &'a str,
}

impl Decision<'_> {
    /// The attempt number of `failure`.
    pub fn attempt(&self, failure: &Failure<'_>) -> usize {
        self.policy
            .attempt_number(self.settings, failure.round, failure.try_no)
    }

    /// What follows `failure`: another try in process while the ladder's
    /// round has tries left and no wait was asked for, else as
    /// [`Decision::settle`] says.
    pub fn after_failure(&self, failure: &Failure<'_>) -> Next {
        let attempts_left =
            (self.policy.max_attempts).is_none_or(|max| self.attempt(failure) < max);
        let round_has_tries = failure.try_no + 1 < self.policy.tries_per_round(self.settings);
        if attempts_left && round_has_tries && failure.after.is_none() {
            Next::RetryInProcess
        } else {
            Next::Settle(self.settle(failure))
        }
    }

    /// How the copy that made the failed attempt `failure` ends, with no
    /// further try in process (its round is over, or the worker stops): a
    /// copy due after the handler's or the backoff's delay while attempts
    /// and rounds remain, else the dead set.
    pub fn settle(&self, failure: &Failure<'_>) -> Settled {
        let attempt = self.attempt(failure);
        let give_up = || {
            Settled::GiveUp(format!(
                "gave up after {attempt} attempts: {}",
                failure.reason
            ))
        };
        let at_most = self.policy.max_attempts.unwrap_or(usize::MAX);
        if attempt >= at_most || failure.round >= MAX_RETRY_ROUNDS {
            return give_up();
        }
        let delay = match self.policy.backoff {
            // The ladder ends after its last delay, whoever chose the wait.
            Backoff::Ladder => self
                .settings
                .requeue_delays
                .get(failure.round)
                .map(|ladder| failure.after.unwrap_or(*ladder)),
            backoff => failure.after.or_else(|| backoff.delay(attempt)),
        };
        match delay {
            Some(delay) => Settled::Requeue {
                next: outbox_queue::retry_task_id(self.base_id, failure.round + 1),
                delay,
            },
            None => give_up(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn requeue(round: usize, delay: Duration) -> Next {
        Next::Settle(Settled::Requeue {
            next: outbox_queue::retry_task_id("outbox:e", round),
            delay,
        })
    }

    fn give_up(attempts: usize) -> Next {
        Next::Settle(Settled::GiveUp(format!(
            "gave up after {attempts} attempts: 503"
        )))
    }

    /// Each row: a policy, where the failure happened (round, try), the
    /// wait the handler asked for, whether the worker stops (the round
    /// ends at once), and what follows. With two in-process retries and
    /// two ladder delays.
    #[test]
    fn a_failed_attempt_is_retried_requeued_or_given_up_by_its_policy() {
        let settings = WorkerSettings {
            retries: 2,
            requeue_delays: vec![secs(30), secs(60)],
            ..WorkerSettings::default()
        };
        let ladder = RetryPolicy::ladder();
        let fixed = RetryPolicy::fixed(secs(5));
        let exponential = RetryPolicy::exponential(secs(10), secs(25));
        let table = [
            // The ladder: tries in process, then the rounds, then dead.
            (ladder, (0, 0), None, false, Next::RetryInProcess),
            (ladder, (0, 1), None, false, Next::RetryInProcess),
            (ladder, (0, 2), None, false, requeue(1, secs(30))),
            (ladder, (1, 2), None, false, requeue(2, secs(60))),
            (ladder, (2, 2), None, false, give_up(9)),
            // Stopping hands the job to the queue at once.
            (ladder, (0, 0), None, true, requeue(1, secs(30))),
            (ladder, (2, 0), None, true, give_up(7)),
            // A wait asked for ends the round, bounded by the rounds.
            (ladder, (0, 0), Some(120), false, requeue(1, secs(120))),
            (ladder, (2, 0), Some(120), false, give_up(7)),
            // Max attempts counts every try, in process or not.
            (
                ladder.with_max_attempts(2),
                (0, 0),
                None,
                false,
                Next::RetryInProcess,
            ),
            (ladder.with_max_attempts(2), (0, 1), None, false, give_up(2)),
            (
                ladder.with_max_attempts(4),
                (1, 0),
                Some(1),
                false,
                give_up(4),
            ),
            // Queue-only backoffs: each retry is a copy due after its delay.
            (fixed, (0, 0), None, false, requeue(1, secs(5))),
            (fixed, (7, 0), Some(90), false, requeue(8, secs(90))),
            (fixed.with_max_attempts(3), (2, 0), None, false, give_up(3)),
            (
                fixed,
                (MAX_RETRY_ROUNDS, 0),
                None,
                false,
                give_up(MAX_RETRY_ROUNDS + 1),
            ),
            (exponential, (0, 0), None, false, requeue(1, secs(10))),
            (exponential, (1, 0), None, false, requeue(2, secs(20))),
            (exponential, (2, 0), None, false, requeue(3, secs(25))),
        ];
        for (policy, (round, try_no), after, stopping, expected) in table {
            let failure = Failure {
                round,
                try_no,
                reason: "503",
                after: after.map(secs),
            };
            let decision = Decision {
                policy: &policy,
                settings: &settings,
                base_id: "outbox:e",
            };
            let next = if stopping {
                Next::Settle(decision.settle(&failure))
            } else {
                decision.after_failure(&failure)
            };
            assert_eq!(
                next, expected,
                "{policy:?} at round {round}, try {try_no}, after {after:?}, stopping {stopping}"
            );
        }
    }

    /// The ladder numbers attempts across its rounds of in-process tries;
    /// a queue-only backoff makes one attempt per copy.
    #[test]
    fn attempts_are_numbered_across_rounds_from_one() {
        let settings = WorkerSettings {
            retries: 3,
            ..WorkerSettings::default()
        };
        let ladder = RetryPolicy::ladder();
        assert_eq!(ladder.attempt_number(&settings, 0, 0), 1);
        assert_eq!(ladder.attempt_number(&settings, 0, 3), 4);
        assert_eq!(ladder.attempt_number(&settings, 2, 1), 10);
        let fixed = RetryPolicy::fixed(secs(1));
        assert_eq!(fixed.attempt_number(&settings, 0, 0), 1);
        assert_eq!(fixed.attempt_number(&settings, 5, 0), 6);
    }

    #[test]
    fn a_policy_without_an_attempt_or_with_more_than_the_queue_carries_is_refused() {
        assert_eq!(
            RetryPolicy::ladder().with_max_attempts(0).check(),
            Err(RetryPolicyError::NoAttempt)
        );
        let limit = RetryPolicy::MAX_QUEUED_ATTEMPTS;
        assert_eq!(
            RetryPolicy::fixed(secs(1)).with_max_attempts(limit).check(),
            Ok(())
        );
        let too_many = RetryPolicy::fixed(secs(1))
            .with_max_attempts(limit + 1)
            .check();
        assert_eq!(
            too_many,
            Err(RetryPolicyError::TooManyAttempts {
                max_attempts: limit + 1
            })
        );
        assert_eq!(
            too_many.unwrap_err().to_string(),
            format!(
                "max attempts is {}, but a policy that puts every retry back on the queue makes at most {limit} attempts",
                limit + 1
            )
        );
        assert_eq!(RetryPolicy::ladder().with_max_attempts(500).check(), Ok(()));
    }

    /// A policy that puts every retry back on the queue makes the first
    /// delivery and 16 copies (`~retry1` to `~retry16`), then gives up
    /// after 17 attempts; a policy asking for exactly that many passes its
    /// check, one more is refused.
    #[test]
    fn a_policy_that_requeues_every_retry_makes_at_most_17_attempts() {
        let settings = WorkerSettings::default();
        let policy = RetryPolicy::fixed(secs(1));
        let decision = Decision {
            policy: &policy,
            settings: &settings,
            base_id: "outbox:e",
        };
        let mut copies = Vec::new();
        let mut round = 0;
        let given_up = loop {
            let failure = Failure {
                round,
                try_no: 0,
                reason: "503",
                after: None,
            };
            match decision.after_failure(&failure) {
                Next::Settle(Settled::Requeue { next, .. }) => copies.push(next),
                other => break other,
            }
            round += 1;
        };
        let expected: Vec<String> = (1..=16).map(|n| format!("outbox:e~retry{n}")).collect();
        assert_eq!(copies, expected);
        assert_eq!(given_up, give_up(17));
        assert_eq!(RetryPolicy::MAX_QUEUED_ATTEMPTS, 17);
        assert_eq!(policy.with_max_attempts(17).check(), Ok(()));
        assert!(policy.with_max_attempts(18).check().is_err());
    }

    #[test]
    fn a_policy_reports_the_attempts_it_was_given_and_none_without() {
        assert_eq!(RetryPolicy::ladder().max_attempts(), None);
        assert_eq!(RetryPolicy::fixed(secs(1)).max_attempts(), None);
        assert_eq!(
            RetryPolicy::fixed(secs(1))
                .with_max_attempts(3)
                .max_attempts(),
            Some(3)
        );
    }
}
