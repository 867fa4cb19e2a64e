//! What the overview shows, read through the store and `outbox health`'s
//! checks, and its live form (the numbers the page's script swaps in).

use std::collections::BTreeMap;

use outbox_model::OutboxStatus;
use outbox_operator::health::{QueueHealth, Thresholds, queue_health};
use outbox_store::{MaybeEstimated, PendingFigures, StatusQueueCount, UnroutedType};

use crate::{Console, ConsoleError};

/// The overview's figures at one moment.
pub(crate) struct Figures {
    pub pending: PendingFigures,
    /// Rows of every status but DONE, by status and queue: exact.
    pub counts: Vec<StatusQueueCount>,
    /// DONE rows over every queue: estimated once the table was analyzed.
    pub done: MaybeEstimated,
    pub unrouted: Vec<UnroutedType>,
    /// The queues' figures, when the console was given Redis.
    pub queues: Option<Vec<QueueHealth>>,
}

impl Figures {
    /// Reads every figure: the unfinished rows along their indexes, the
    /// DONE ones estimated (`outbox_store::overview_counts`).
    pub(crate) async fn read(console: &Console) -> Result<Self, ConsoleError> {
        let mut conn = console.conn().await?;
        let pending = outbox_store::pending_figures(&mut conn).await?;
        let counts = outbox_store::overview_counts(&mut conn).await?;
        let unrouted = outbox_store::unrouted_types(&mut conn).await?;
        drop(conn);
        let queues = match &console.inner.queues {
            Some(queues) => {
                let names: Vec<&str> = queues.names.iter().map(String::as_str).collect();
                let mut redis = queues.redis.clone();
                Some(
                    queue_health(
                        &mut redis,
                        &queues.namespace,
                        &names,
                        &Thresholds::default(),
                    )
                    .await?,
                )
            }
            None => None,
        };
        Ok(Self {
            pending,
            counts: counts.unfinished,
            done: counts.done,
            unrouted,
            queues,
        })
    }

    /// Rows of `status`, over every queue.
    pub(crate) fn total(&self, status: OutboxStatus) -> MaybeEstimated {
        if status == OutboxStatus::Done {
            return self.done;
        }
        MaybeEstimated {
            n: self
                .counts
                .iter()
                .filter(|c| c.status == status.as_str())
                .map(|c| c.n)
                .sum(),
            estimated: false,
        }
    }

    /// Dead jobs over every queue read.
    pub(crate) fn dead(&self) -> Option<u64> {
        self.queues
            .as_ref()
            .map(|queues| queues.iter().map(|q| q.stats.dead).sum())
    }

    /// Workers registered over every queue read.
    pub(crate) fn workers(&self) -> Option<u64> {
        self.queues
            .as_ref()
            .map(|queues| queues.iter().map(|q| q.stats.workers).sum())
    }

    /// The alerts the CLI raises for these figures: the pending alert of
    /// `outbox stats`, and each queue's and the events no route matches of
    /// `outbox health` (whose alerts on Redis' persistence and loss marker
    /// and on stuck workflow runs the console does not read).
    pub(crate) fn alerts(&self) -> Vec<String> {
        let mut alerts = Vec::new();
        if self.pending.alert() {
            alerts.push(format!(
                "{} event(s) due for over {} s (more than {})",
                self.pending.overdue,
                outbox_store::OVERDUE_AFTER_SECS,
                outbox_store::PENDING_ALERT_THRESHOLD
            ));
        }
        for queue in self.queues.iter().flatten() {
            for alert in &queue.alerts {
                alerts.push(format!("{}: {alert}", queue.queue));
            }
        }
        for unrouted in &self.unrouted {
            if unrouted.failed > 0 {
                alerts.push(format!(
                    "{}: {} event(s) FAILED without a route",
                    unrouted.event_type, unrouted.failed
                ));
            }
        }
        alerts
    }

    /// The numbers of the page by their `data-live` key, as shown.
    pub(crate) fn live(&self) -> BTreeMap<String, String> {
        let mut live = BTreeMap::new();
        live.insert("due".into(), grouped(self.pending.due));
        live.insert("overdue".into(), grouped(self.pending.overdue));
        live.insert("oldest".into(), age(self.pending.oldest_due_age_secs));
        live.insert("processing".into(), grouped(self.pending.processing));
        for status in OutboxStatus::ALL {
            live.insert(format!("total:{status}"), shown(self.total(status)));
        }
        for count in &self.counts {
            live.insert(
                format!("count:{}:{}", count.status, count.queue),
                grouped(count.n),
            );
        }
        if let Some(dead) = self.dead() {
            live.insert("dead".into(), grouped(dead));
        }
        if let Some(workers) = self.workers() {
            live.insert("workers".into(), grouped(workers));
        }
        live.insert("alerts".into(), self.alerts().len().to_string());
        live
    }
}

/// A count as the page shows it: `980,000`, or `about 980,000` when
/// estimated.
pub(crate) fn shown(count: MaybeEstimated) -> String {
    if count.estimated {
        format!("about {}", grouped(count.n))
    } else {
        grouped(count.n)
    }
}

/// A whole number with its digits grouped in threes, as the docs write
/// them: `10,000`, `-1,234`.
pub(crate) fn grouped(n: impl std::fmt::Display) -> String {
    let written = n.to_string();
    let (sign, digits) = match written.strip_prefix('-') {
        Some(digits) => ("-", digits),
        None => ("", written.as_str()),
    };
    let mut out = String::with_capacity(written.len() + digits.len() / 3);
    out.push_str(sign);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// An age in seconds as people read it: `-`, `42 s`, `3 min`, `5 h`, `2 d`.
pub(crate) fn age(secs: Option<f64>) -> String {
    let Some(secs) = secs else {
        return "-".to_owned();
    };
    let secs = secs.max(0.0).round() as u64;
    match secs {
        0..120 => format!("{secs} s"),
        120..7_200 => format!("{} min", secs / 60),
        7_200..172_800 => format!("{} h", secs / 3_600),
        _ => format!("{} d", secs / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::{age, grouped};

    #[test]
    fn counts_are_written_with_their_digits_grouped_in_threes() {
        assert_eq!(grouped(0u64), "0");
        assert_eq!(grouped(999u64), "999");
        assert_eq!(grouped(1_000u64), "1,000");
        assert_eq!(grouped(10_000u64), "10,000");
        assert_eq!(grouped(980_000i64), "980,000");
        assert_eq!(grouped(1_234_567i64), "1,234,567");
        assert_eq!(grouped(-1_234i64), "-1,234");
        assert_eq!(grouped(u64::MAX), "18,446,744,073,709,551,615");
        assert_eq!(grouped(i64::MIN), "-9,223,372,036,854,775,808");
    }

    #[test]
    fn ages_read_in_the_largest_whole_unit() {
        assert_eq!(age(None), "-");
        assert_eq!(age(Some(41.6)), "42 s");
        assert_eq!(age(Some(600.0)), "10 min");
        assert_eq!(age(Some(18_000.0)), "5 h");
        assert_eq!(age(Some(200_000.0)), "2 d");
    }
}
