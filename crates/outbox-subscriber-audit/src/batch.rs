//! Group commit: the rows of jobs running at the same time are written by
//! one statement.
//!
//! Each job hands its row to the queue's writer task and waits for the
//! answer; the writer takes every row waiting (at most
//! [`GROUP_COMMIT_MAX_ROWS`]), inserts them in one statement — one
//! transaction, one WAL flush — and answers each job once the statement has
//! committed. A job is therefore acknowledged only after its row is durable,
//! exactly as with one insert per job. There is no timer: an idle writer
//! writes a row the moment it arrives, and only rows that came in while the
//! previous statement ran are grouped.
//!
//! When the statement fails, [`after_failure`] decides what the error means:
//! the database or the connection failing fails every job of the batch (each
//! is retried as before), while any other error may be one row's own (a
//! payload Postgres refuses), so the rows are then written one by one and
//! each job gets its own row's result.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use outbox_pg::PgPool;
use outbox_subscriber::JobError;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::db::Row;

/// The most rows one statement carries.
pub const GROUP_COMMIT_MAX_ROWS: usize = 500;

/// What happened to a job's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// The row is new and committed.
    Inserted,
    /// A row for this event was already there (a redelivery); nothing was
    /// written.
    AlreadyRecorded,
}

/// Why a statement failed.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// No connection could be had.
    Pool(String),
    /// The statement failed.
    Query(DieselError),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pool(e) => write!(f, "database error: {e}"),
            Self::Query(e) => write!(f, "database error: {e}"),
        }
    }
}

/// What a failed batch statement means for its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// The database or the connection failed: every job of the batch gets
    /// the error (and is retried).
    FailAll,
    /// One row may be the cause: write the rows one by one, each job getting
    /// its own row's result.
    OneByOne,
}

/// What the failure of a statement carrying `rows` rows means.
pub(crate) fn after_failure(error: &WriteError, rows: usize) -> AfterFailure {
    if rows <= 1 {
        return AfterFailure::FailAll;
    }
    match error {
        WriteError::Pool(_) => AfterFailure::FailAll,
        WriteError::Query(DieselError::DatabaseError(kind, _)) => match kind {
            DatabaseErrorKind::ClosedConnection
            | DatabaseErrorKind::UnableToSendCommand
            | DatabaseErrorKind::SerializationFailure
            | DatabaseErrorKind::ReadOnlyTransaction => AfterFailure::FailAll,
            // A constraint, a value Postgres refuses (`\u0000` in jsonb),
            // anything else the server said about the rows.
            _ => AfterFailure::OneByOne,
        },
        // A value that could not be sent.
        WriteError::Query(
            DieselError::SerializationError(_) | DieselError::QueryBuilderError(_),
        ) => AfterFailure::OneByOne,
        WriteError::Query(_) => AfterFailure::FailAll,
    }
}

/// A row and the job waiting for it.
struct Pending<R> {
    row: R,
    reply: oneshot::Sender<Result<Written, JobError>>,
}

/// The group-commit writer of one queue: cheap to clone; the writer task is
/// started by the first row and stops when the last clone is dropped.
pub(crate) struct GroupCommit<R: Row> {
    inner: Arc<Inner<R>>,
}

impl<R: Row> Clone for GroupCommit<R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<R> {
    pool: PgPool,
    queue: &'static str,
    /// The writer task's inbox; `None` until the first row. Unbounded: each
    /// waiting row belongs to a job in progress, so the queue's concurrency
    /// bounds it.
    sender: Mutex<Option<mpsc::UnboundedSender<Pending<R>>>>,
}

impl<R: Row> GroupCommit<R> {
    /// A writer for `queue` through `pool`.
    pub(crate) fn new(pool: PgPool, queue: &'static str) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                queue,
                sender: Mutex::new(None),
            }),
        }
    }

    /// Writes `row` with whatever other rows are waiting; returns once it is
    /// committed (or with the error that prevented it).
    pub(crate) async fn write(&self, row: R) -> Result<Written, JobError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Pending { row, reply });
        answer.await.unwrap_or_else(|_| {
            Err(JobError::retry(
                "the row writer stopped before answering; retrying",
            ))
        })
    }

    /// Hands `pending` to the writer task, starting one when there is none
    /// (the first row, or the previous task ended abnormally).
    fn submit(&self, mut pending: Pending<R>) {
        let mut sender = self
            .inner
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(live) = sender.as_ref() {
            match live.send(pending) {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => pending = back,
            }
        }
        let (new_sender, inbox) = mpsc::unbounded_channel();
        tokio::spawn(run_writer(self.inner.pool.clone(), self.inner.queue, inbox));
        // The new task holds the receiver, so this cannot fail; if it did,
        // the dropped reply makes the job fail and be retried.
        let _ = new_sender.send(pending);
        *sender = Some(new_sender);
    }
}

/// The writer task: each round takes every row waiting (at most
/// [`GROUP_COMMIT_MAX_ROWS`]) and writes them together; ends when every
/// sender is gone.
async fn run_writer<R: Row>(
    pool: PgPool,
    queue: &'static str,
    mut inbox: mpsc::UnboundedReceiver<Pending<R>>,
) {
    let mut batch = Vec::with_capacity(GROUP_COMMIT_MAX_ROWS);
    while inbox.recv_many(&mut batch, GROUP_COMMIT_MAX_ROWS).await > 0 {
        let span = tracing::info_span!("outbox.group_commit", queue, rows = batch.len());
        write_batch(&pool, std::mem::take(&mut batch))
            .instrument(span)
            .await;
    }
}

/// Writes `batch` and answers each of its jobs.
async fn write_batch<R: Row>(pool: &PgPool, batch: Vec<Pending<R>>) {
    let (rows, replies): (Vec<R>, Vec<_>) = batch.into_iter().map(|p| (p.row, p.reply)).unzip();
    let results = match insert(pool, &rows).await {
        Ok(inserted) => outcomes(&rows, &inserted),
        Err(error) => match after_failure(&error, rows.len()) {
            AfterFailure::FailAll => {
                tracing::warn!(%error, "writing the batch failed; every job of it is retried");
                let error = JobError::retry(error);
                rows.iter().map(|_| Err(error.clone())).collect()
            }
            AfterFailure::OneByOne => {
                tracing::warn!(%error, "writing the batch failed; writing its rows one by one");
                let mut results = Vec::with_capacity(rows.len());
                for row in rows.chunks(1) {
                    results.push(match insert(pool, row).await {
                        Ok(inserted) => outcomes(row, &inserted).remove(0),
                        Err(error) => Err(JobError::retry(error)),
                    });
                }
                results
            }
        },
    };
    for (reply, result) in replies.into_iter().zip(results) {
        // A job that stopped waiting is retried by its queue; its row, if
        // written, makes the retry a no-op.
        let _ = reply.send(result);
    }
}

/// Each row's outcome, given the event ids the statement inserted. Two rows
/// of the same event in one batch: the first is counted as the insert.
fn outcomes<R: Row>(rows: &[R], inserted: &[uuid::Uuid]) -> Vec<Result<Written, JobError>> {
    let mut new: HashSet<uuid::Uuid> = inserted.iter().copied().collect();
    rows.iter()
        .map(|row| {
            Ok(if new.remove(&row.event_id()) {
                Written::Inserted
            } else {
                Written::AlreadyRecorded
            })
        })
        .collect()
}

/// One statement inserting `rows`.
async fn insert<R: Row>(pool: &PgPool, rows: &[R]) -> Result<Vec<uuid::Uuid>, WriteError> {
    let mut conn = pool
        .get()
        .await
        .map_err(|e| WriteError::Pool(e.to_string()))?;
    R::insert_all(&mut conn, rows)
        .await
        .map_err(WriteError::Query)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(kind: DatabaseErrorKind) -> WriteError {
        WriteError::Query(DieselError::DatabaseError(
            kind,
            Box::new("message".to_owned()),
        ))
    }

    fn job(id: uuid::Uuid) -> outbox_queue::OutboxJob {
        serde_json::from_value(serde_json::json!({
            "outbox_event_id": id,
            "tenant_id": "acme",
            "event_type": "audit.user.login",
            "payload": {},
            "dispatch_key": null,
            "created_at": "2026-11-30T12:00:00Z",
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// When the last handler clone is gone, the writer task ends rather
    /// than spinning on its closed inbox. Its pool points nowhere: a task
    /// that went on would try to write empty batches through it forever.
    // Break checked: `recv_many(..) > 0` turned into `>= 0` never ends and
    // fails here at the deadline.
    #[tokio::test]
    async fn the_writer_task_ends_once_every_sender_is_gone() {
        use diesel_async::AsyncPgConnection;
        use diesel_async::pooled_connection::AsyncDieselConnectionManager;
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(
            "postgres://nobody@127.0.0.1:1/nowhere",
        );
        let pool = bb8::Pool::builder()
            .connection_timeout(std::time::Duration::from_millis(50))
            .build_unchecked(manager);
        let (sender, inbox) = mpsc::unbounded_channel::<Pending<crate::db::AuditRow>>();
        drop(sender);
        let ended = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            run_writer(pool, "outbox.audit", inbox),
        )
        .await;
        assert!(
            ended.is_ok(),
            "the writer task still runs with its inbox closed"
        );
    }

    /// Whether a job logs "already recorded" depends on the statement's
    /// `RETURNING` list matching the row's own event: a new event's row is
    /// an insert, a redelivered one (not returned) is not, for both tables.
    #[test]
    fn a_row_counts_as_inserted_only_when_the_statement_returned_its_event() {
        use crate::db::{AuditRow, NotificationRow};
        let (new, old) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let audit = [
            AuditRow {
                job: job(new),
                actor: None,
            },
            AuditRow {
                job: job(old),
                actor: None,
            },
        ];
        let expected = [Written::Inserted, Written::AlreadyRecorded];
        let got: Vec<Written> = outcomes(&audit, &[new])
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(got, expected);
        let notification = [old, new].map(|id| NotificationRow {
            job: job(id),
            user_id: None,
            title: "t".to_owned(),
            body: None,
        });
        let got: Vec<Written> = outcomes(&notification, &[new])
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert_eq!(got, [Written::AlreadyRecorded, Written::Inserted]);
    }

    #[test]
    fn a_failed_batch_is_split_only_when_a_row_may_be_the_cause() {
        use AfterFailure::{FailAll, OneByOne};
        let cases: Vec<(&str, WriteError, usize, AfterFailure)> = vec![
            (
                "no connection",
                WriteError::Pool("timed out".into()),
                50,
                FailAll,
            ),
            (
                "connection closed",
                database(DatabaseErrorKind::ClosedConnection),
                50,
                FailAll,
            ),
            (
                "cannot send",
                database(DatabaseErrorKind::UnableToSendCommand),
                50,
                FailAll,
            ),
            (
                "serialization",
                database(DatabaseErrorKind::SerializationFailure),
                50,
                FailAll,
            ),
            (
                "read-only server",
                database(DatabaseErrorKind::ReadOnlyTransaction),
                50,
                FailAll,
            ),
            (
                "not null",
                database(DatabaseErrorKind::NotNullViolation),
                50,
                OneByOne,
            ),
            (
                "check",
                database(DatabaseErrorKind::CheckViolation),
                50,
                OneByOne,
            ),
            (
                "other unique",
                database(DatabaseErrorKind::UniqueViolation),
                50,
                OneByOne,
            ),
            (
                "refused value",
                database(DatabaseErrorKind::Unknown),
                50,
                OneByOne,
            ),
            (
                "value not sent",
                WriteError::Query(DieselError::SerializationError("bad".into())),
                50,
                OneByOne,
            ),
            (
                "broken transaction",
                WriteError::Query(DieselError::BrokenTransactionManager),
                50,
                FailAll,
            ),
            (
                "one row: nothing to split",
                database(DatabaseErrorKind::Unknown),
                1,
                FailAll,
            ),
        ];
        for (what, error, rows, expected) in cases {
            assert_eq!(after_failure(&error, rows), expected, "{what}");
        }
    }
}
