//! The batch loop of the actions by filter (requeue, cancel): take the
//! oldest rows still eligible, act on them in one statement or
//! transaction, and go on until the counted total is reached or nothing is
//! left. Acted-on rows drop out of the eligible selection, so each batch
//! takes the next ones.

use diesel_async::AsyncPgConnection;
use outbox_store::{Candidate, EventFilter, StoreError};
use uuid::Uuid;

/// What a batch does to its rows, with the text kept in each history row.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Act<'a> {
    /// [`crate::requeue::execute`] of the batch's plan.
    Requeue {
        reason: &'a str,
        requested_by: Option<&'a str>,
        replay: bool,
    },
    /// [`crate::cancel::execute`] of the batch's rows.
    Cancel {
        reason: &'a str,
        requested_by: Option<&'a str>,
    },
}

impl Act<'_> {
    /// Acts on `rows`; returns the rows changed and, of those, the DONE
    /// rows replayed.
    async fn on(
        self,
        conn: &mut AsyncPgConnection,
        rows: Vec<Candidate>,
    ) -> Result<(Vec<Uuid>, usize), StoreError> {
        match self {
            Act::Requeue {
                reason,
                requested_by,
                replay,
            } => {
                let batch = crate::requeue::plan(rows, replay);
                let executed =
                    crate::requeue::execute(conn, &batch, reason, requested_by, replay).await?;
                let replayed = batch
                    .requeue
                    .iter()
                    .filter(|row| row.replay && executed.requeued.contains(&row.id))
                    .count();
                Ok((executed.requeued, replayed))
            }
            Act::Cancel {
                reason,
                requested_by,
            } => {
                let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
                let cancelled = crate::cancel::execute(conn, &ids, reason, requested_by).await?;
                Ok((cancelled, 0))
            }
        }
    }
}

/// What [`run`] did so far.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Every row acted on, in the order of the batches.
    pub(crate) ids: Vec<Uuid>,
    /// Of those, DONE rows replayed.
    pub(crate) replayed: usize,
    /// Batches committed.
    pub(crate) batches: usize,
}

/// Does `act` to at most `total` rows of `eligible` created before the
/// run started, oldest first, `batch_size` at a time. Stops early
/// when a batch finds no row or changes none (another session changed them
/// meanwhile). On an error, returns what the committed batches did with it.
pub(crate) async fn run(
    conn: &mut AsyncPgConnection,
    eligible: &EventFilter,
    total: u64,
    batch_size: u64,
    act: Act<'_>,
) -> Result<Progress, (Progress, StoreError)> {
    let mut done = Progress::default();
    // Events created after the run started are not among those counted
    // and confirmed: an event published meanwhile never takes the place of
    // one that was handed off meanwhile.
    let started = match outbox_store::db_now(conn).await {
        Ok(now) => now,
        Err(e) => return Err((done, e)),
    };
    let eligible = &EventFilter {
        created_before: Some(
            eligible
                .created_before
                .map_or(started, |before| before.min(started)),
        ),
        ..eligible.clone()
    };
    let batch_size = batch_size.max(1);
    loop {
        let so_far = u64::try_from(done.ids.len()).unwrap_or(u64::MAX);
        let want = batch_size.min(total.saturating_sub(so_far));
        if want == 0 {
            break;
        }
        let limit = i64::try_from(want).unwrap_or(i64::MAX);
        let rows = match outbox_store::list_candidates(conn, eligible, limit).await {
            Ok(rows) if rows.is_empty() => break,
            Ok(rows) => rows,
            Err(e) => return Err((done, e)),
        };
        let (changed, replayed) = match act.on(conn, rows).await {
            Ok(acted) => acted,
            Err(e) => return Err((done, e)),
        };
        done.batches += 1;
        done.replayed += replayed;
        if changed.is_empty() {
            break;
        }
        done.ids.extend(changed);
    }
    Ok(done)
}
