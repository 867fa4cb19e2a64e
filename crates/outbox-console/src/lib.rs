//! The operator console: a few server-rendered pages that show what the
//! outbox holds and let an operator act on it, as an axum [`Router`] that
//! `worker-general` serves (`OUTBOX_CONSOLE_ADDR`) or an application mounts
//! under a path of its choice. Operators look before they type: the
//! overview (events by status and queue, the oldest due event, dead jobs,
//! workers and the alerts of `outbox health`, updated live), the events
//! with the CLI's filters, one event with its masked payload and history,
//! the requeue, replay or cancel of one event, the requeue of the events a
//! filter selects and the retry of a queue's dead jobs (a dry run first,
//! then a confirmation); the workflows with their versions, their
//! executions, one execution as a timeline of its blocks (followed live
//! while it runs), the answer to a waiting run and the cancel of one.
//!
//! It is not a second owner of the tables: every read and change goes
//! through the typed operations of `outbox-store` and
//! `outbox-workflow-store`, and the requeue policy and
//! the queue alerts are those the CLI uses (`outbox-operator`), so the
//! console and `outbox requeue` refuse and record the same things. It reads no environment: the binary parses
//! `OUTBOX_CONSOLE_TOKENS` with [`Tokens::parse`], an application hands in
//! its own [`Authorize`] hook.
//!
//! # Access
//!
//! Every page needs an [`Identity`] with a [`Role`]: a token of
//! [`Tokens`] (typed into the login form, which sets a session cookie, or
//! sent as `Authorization: Bearer <token>`), or what the application's
//! [`Authorize`] hook makes of the request. Readers see every page;
//! operators may also act. Every action is a POST that carries the
//! session's CSRF token in a hidden field (the cookie is also
//! `SameSite=Strict`); a request without a valid one is refused with 403.
//!
//! # Example
//!
//! ```no_run
//! # async fn run(pool: outbox_pg::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_console::{Console, Tokens};
//!
//! let tokens = Tokens::parse("ana=operator:0123456789abcdef0123,reader:fedcba9876543210fedc")?;
//! let app = axum::Router::new()
//!     .route("/", axum::routing::get(|| async { "the application" }))
//!     .nest("/ops/outbox", Console::new(pool).with_tokens(tokens).router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

mod access;
mod assets;
mod error;
mod figures;
mod pages;
mod session;

use std::sync::Arc;

use axum::Router;
use outbox_pg::PgPool;
use outbox_queue::QueueNamespace;
use outbox_queue::RedisConnection;
use tokio_util::sync::CancellationToken;

pub use access::{Authorize, Identity, MIN_TOKEN_LEN, Role, TokenError, Tokens};
pub use error::ConsoleError;
pub use pages::overview::LIVE_EVERY;

/// The console: its connections and who may use it. Cheap to clone.
#[derive(Clone)]
pub struct Console {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    pool: PgPool,
    queues: Option<Queues>,
    tokens: Tokens,
    authorize: Option<Arc<dyn Authorize>>,
    sessions: session::Sessions,
    /// Ends the live streams (which never end on their own), so that a
    /// graceful shutdown of the server does not wait for open browsers.
    stop: CancellationToken,
    /// The overview's live figures of the last read, shared by every open
    /// overview (see `pages::overview::live`).
    live: pages::overview::LiveCache,
}

/// The Redis queues the overview reads (backlog, dead jobs, workers).
#[derive(Clone)]
struct Queues {
    redis: RedisConnection,
    namespace: QueueNamespace,
    names: Vec<String>,
}

impl Console {
    /// A console on `pool` that lets nobody in until given
    /// [`Console::with_tokens`] or [`Console::with_authorizer`].
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                queues: None,
                tokens: Tokens::default(),
                authorize: None,
                sessions: session::Sessions::new(),
                stop: CancellationToken::new(),
                live: Arc::default(),
            }),
        }
    }

    fn with(self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        change(&mut inner);
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Lets in whoever presents one of `tokens` (login form or bearer header).
    #[must_use]
    pub fn with_tokens(self, tokens: Tokens) -> Self {
        self.with(|inner| inner.tokens = tokens)
    }

    /// Lets in whom `authorize` names: the embedding application's own
    /// authentication decides (tried before the tokens).
    #[must_use]
    pub fn with_authorizer(self, authorize: impl Authorize) -> Self {
        let authorize: Arc<dyn Authorize> = Arc::new(authorize);
        self.with(|inner| inner.authorize = Some(authorize))
    }

    /// Shows the figures of these Redis queues on the overview (backlog,
    /// dead jobs, workers, and the alerts `outbox health` raises for them).
    #[must_use]
    pub fn with_queues(
        self,
        redis: RedisConnection,
        namespace: QueueNamespace,
        names: Vec<String>,
    ) -> Self {
        self.with(|inner| {
            inner.queues = Some(Queues {
                redis,
                namespace,
                names,
            });
        })
    }

    /// Ends the overview's live streams when `stop` is cancelled: give it
    /// the token that stops the server, whose graceful shutdown waits for
    /// every response to end (the live one would not).
    #[must_use]
    pub fn with_shutdown(self, stop: CancellationToken) -> Self {
        self.with(|inner| inner.stop = stop)
    }

    /// A pooled connection.
    async fn conn(&self) -> Result<outbox_pg::PooledPg<'_>, ConsoleError> {
        self.inner
            .pool
            .get()
            .await
            .map_err(|e| ConsoleError::Pool(e.to_string()))
    }

    /// The console's routes, to serve or to `nest` under any path: every
    /// link and form is relative to where it is mounted.
    pub fn router(&self) -> Router {
        pages::routes(self.clone())
    }
}

/// The console's guide (`docs/console.md`), whose examples compile as
/// doctests of this crate.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/console.md")]
pub struct ConsoleGuide;
