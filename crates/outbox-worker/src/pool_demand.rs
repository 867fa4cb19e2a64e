//! [`pool_shortfall`]: whether the jobs of one queue can ask for more
//! Postgres connections than the worker's pool holds, said at start-up.
//!
//! The worker warns rather than sizing the pool itself: every replica's
//! pool counts against the server's `max_connections`, which only the
//! operator can weigh.

use std::fmt;

use outbox_pg::CHECKOUT_TIMEOUT;
use outbox_queue::queues;

/// The built-in queues whose handler takes a connection of the pool for
/// each job it runs (`builder.rs` hands them the pool): `outbox.workflow`
/// holds it for the whole run, `httpRequest` calls included; the others for
/// one query. `outbox.audit` and `outbox.notification` are not among them:
/// their jobs wait on one writer per queue, which holds one connection.
pub(crate) const CONNECTION_PER_JOB: &[&str] = &[
    queues::WORKFLOW,
    queues::PLUGIN_HOOK,
    queues::TOOLCTRL_PLUGIN_INVOKE,
    queues::WEBHOOK,
    queues::MARKETING,
];

/// A worker whose `WORKER_CONCURRENCY` lets the jobs of one queue that
/// takes a connection per job outnumber `DATABASE_POOL_SIZE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PoolShortfall {
    /// The group's name (`general`, `mail`).
    pub group: &'static str,
    /// `WORKER_CONCURRENCY`: the jobs each of those queues runs at once.
    pub concurrency: usize,
    /// The queues of the worker that take a connection per job.
    pub queues: Vec<String>,
    /// `DATABASE_POOL_SIZE`.
    pub pool_size: u32,
    /// The dispatcher's loops, each of which holds a connection while it
    /// ticks (0 without a dispatcher).
    pub dispatch_loops: usize,
}

impl PoolShortfall {
    /// The jobs of those queues that may hold a connection at once.
    pub(crate) fn jobs(&self) -> usize {
        self.concurrency * self.queues.len()
    }
}

/// The shortfall of a worker running `running` queues with `concurrency`
/// jobs each, a pool of `pool_size` and `dispatch_loops` dispatch loops, or
/// `None` when no queue that takes a connection per job runs more jobs at
/// once than the pool holds. Below that line jobs of several queues and
/// the loops still share the pool, and short waits for a connection are
/// normal; past it the jobs of one queue alone outnumber the connections.
pub(crate) fn pool_shortfall(
    group: &'static str,
    concurrency: usize,
    running: &[&str],
    pool_size: u32,
    dispatch_loops: usize,
) -> Option<PoolShortfall> {
    let queues: Vec<String> = running
        .iter()
        .filter(|queue| CONNECTION_PER_JOB.contains(queue))
        .map(|queue| (*queue).to_owned())
        .collect();
    if queues.is_empty() || concurrency <= pool_size as usize {
        return None;
    }
    Some(PoolShortfall {
        group,
        concurrency,
        queues,
        pool_size,
        dispatch_loops,
    })
}

impl fmt::Display for PoolShortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WORKER_CONCURRENCY={} lets up to {} jobs of the {} group's database-using queues \
             ({}) hold a Postgres connection at once, {} of one queue alone, but \
             DATABASE_POOL_SIZE={}",
            self.concurrency,
            self.jobs(),
            self.group,
            self.queues.join(", "),
            self.concurrency,
            self.pool_size,
        )?;
        if self.dispatch_loops > 0 {
            write!(
                f,
                ", and the dispatcher's {} loops also take one each under a backlog",
                self.dispatch_loops
            )?;
        }
        write!(
            f,
            ": jobs past the pool wait for a connection, and one that waits {} s fails \
             (\"Timed out in bb8\") and is retried later; keep WORKER_CONCURRENCY at or below \
             DATABASE_POOL_SIZE, or raise the pool (within the server's max_connections)",
            CHECKOUT_TIMEOUT.as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GENERAL: &[&str] = &[
        queues::AUDIT,
        queues::WORKFLOW,
        queues::NOTIFICATION,
        queues::PLUGIN_HOOK,
        queues::TOOLCTRL_PLUGIN_INVOKE,
    ];
    const MAIL: &[&str] = &[
        queues::MAIL,
        queues::WEBHOOK,
        queues::MARKETING,
        queues::TOOLCTRL_EMAIL,
    ];

    #[test]
    fn only_a_concurrency_above_the_pool_is_a_shortfall() {
        for (running, concurrency, pool, short) in [
            // The defaults, and a pool exactly as large as one queue's jobs.
            (GENERAL, 10, 10, false),
            (MAIL, 10, 10, false),
            (GENERAL, 300, 300, false),
            // One job more than the pool, and the reported collapse.
            (GENERAL, 11, 10, true),
            (MAIL, 11, 10, true),
            (GENERAL, 300, 10, true),
            // Queues that take no connection per job (group commit, Redis
            // only) never are.
            (
                &[queues::AUDIT, queues::NOTIFICATION, queues::MAIL][..],
                300,
                10,
                false,
            ),
            (&[][..], 300, 10, false),
        ] {
            assert_eq!(
                pool_shortfall("general", concurrency, running, pool, 4).is_some(),
                short,
                "{running:?} {concurrency} {pool}"
            );
        }
    }

    #[test]
    fn the_warning_names_the_numbers_queues_and_loops() {
        let general = pool_shortfall("general", 300, GENERAL, 10, 4).unwrap();
        assert_eq!(general.jobs(), 900);
        assert_eq!(
            general.to_string(),
            "WORKER_CONCURRENCY=300 lets up to 900 jobs of the general group's database-using \
             queues (outbox.workflow, outbox.plugin-hook, toolctrl.plugin-invoke) hold a Postgres \
             connection at once, 300 of one queue alone, but DATABASE_POOL_SIZE=10, and the \
             dispatcher's 4 loops also take one each under a backlog: jobs past the pool wait for a \
             connection, and one that waits 10 s fails (\"Timed out in bb8\") and is retried \
             later; keep WORKER_CONCURRENCY at or below DATABASE_POOL_SIZE, or raise the pool \
             (within the server's max_connections)"
        );
        let mail = pool_shortfall("mail", 50, MAIL, 20, 0).unwrap();
        let text = mail.to_string();
        assert!(
            text.starts_with(
                "WORKER_CONCURRENCY=50 lets up to 100 jobs of the mail group's database-using \
                 queues (outbox.webhook, outbox.marketing) hold a Postgres connection at once, \
                 50 of one queue alone, but DATABASE_POOL_SIZE=20: jobs past the pool wait"
            ),
            "{text}"
        );
    }
}
