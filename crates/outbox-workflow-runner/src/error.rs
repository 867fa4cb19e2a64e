//! [`RunError`]: why the runner could not advance an execution;
//! [`HttpRequestError`]: why an `httpRequest` block failed.

use outbox_http_guard::GuardError;
use uuid::Uuid;

use outbox_workflow_store::producers::ProducerError;
use outbox_workflow_store::{StoreError, UnknownValue};

/// Why [`Runner::run`](crate::Runner::run) or
/// [`Runner::resume`](crate::Runner::resume) could not advance an
/// execution. A block that fails is not a `RunError`: it ends the run in
/// `error`, recorded. A `RunError` leaves the execution where its last
/// committed block left it, so running it again resumes there.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// There is no such execution.
    #[error("no execution {execution_id}")]
    ExecutionNotFound {
        /// The id asked for.
        execution_id: Uuid,
    },
    /// A stored status is unknown to this version.
    #[error(transparent)]
    UnknownValue(#[from] UnknownValue),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A producer (row blocks, continuations, events) failed.
    #[error(transparent)]
    Producer(#[from] ProducerError),
    /// A value could not be turned into JSON.
    #[error("cannot serialize: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The database refused a statement or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] diesel::result::Error),
}

impl RunError {
    /// Whether running the execution again later may succeed (database
    /// trouble), as opposed to a state no retry changes.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Database(_) | Self::Store(StoreError::Database(_)) => true,
            Self::Producer(error) => {
                matches!(
                    error,
                    ProducerError::Database(_) | ProducerError::Store(StoreError::Database(_))
                ) || matches!(error, ProducerError::Publish(e) if !e.is_invalid_event())
            }
            _ => false,
        }
    }
}

impl From<outbox_publish::PublishError> for RunError {
    fn from(error: outbox_publish::PublishError) -> Self {
        Self::Producer(ProducerError::Publish(error))
    }
}

impl From<outbox_publish::NotInTransaction> for RunError {
    fn from(error: outbox_publish::NotInTransaction) -> Self {
        Self::Producer(error.into())
    }
}

/// Why an `httpRequest` block failed: the run ends in `error`, and the
/// execution's `error` is `block <id>: ` followed by this message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpRequestError {
    /// The run was started by an event a workflow's own row block caused
    /// (`allowExternalCallouts: false`): it makes no external calls.
    #[error("external callouts are disabled for runs started by a workflow's own row events")]
    CalloutsDisabled,
    /// The rendered URL does not parse.
    #[error("{url:?} is not a URL: {source}")]
    InvalidUrl {
        /// The rendered URL.
        url: String,
        /// Why it does not parse.
        source: url::ParseError,
    },
    /// The method is not an HTTP method.
    #[error("invalid HTTP method {method:?}")]
    InvalidMethod {
        /// The method as given.
        method: String,
    },
    /// The address guard refused the target: an internal address (unless
    /// the runner allows them), or a scheme other than `http` / `https`.
    #[error(transparent)]
    Refused(#[from] GuardError),
    /// The request failed: no connection, a timeout, a broken response.
    #[error("request failed: {0}")]
    Request(#[source] reqwest::Error),
    /// The response's body could not be read.
    #[error("reading the body: {0}")]
    Body(#[source] reqwest::Error),
    /// The response's body is longer than the runner records
    /// ([`crate::MAX_ANSWER_BYTES`]); the call was made, its answer is not
    /// kept.
    #[error(
        "the answer's body is over {limit} bytes, more than a run records; the call was made once and its answer dropped"
    )]
    AnswerTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
}
