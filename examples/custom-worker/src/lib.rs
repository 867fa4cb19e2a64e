//! An application's own worker, as an example of `outbox_worker::WorkerBuilder`:
//! the general worker (dispatcher, retention, the built-in general
//! handlers) plus one subscriber of the application's, registered with one
//! line ([`SearchIndexing`]): [`SearchIndexer`]s on `search.index.*` events,
//! and a routing rule of its own that sends `search.index.urgent.*` to a
//! queue of their own ([`URGENT_QUEUE`]), so that urgent reindexing never
//! waits behind a bulk backlog. The worker records the subscriber at start,
//! so `outbox health` and `outbox reconcile` show its queue too.
//!
//! The "index" is a directory of JSON documents, one per event, so that the
//! effect is easy to see; a real application would call its search engine
//! here. The binary (`src/main.rs`) is the few lines an application writes.

use std::path::{Path, PathBuf};

use outbox_queue::{OutboxJob, queues};
use outbox_subscriber::{
    ConsumedQueue, HandlerGroup, JobError, JobHandler, JobMeta, SubscriberDescription,
};
use outbox_worker::{ConfigError, Group, Resources, Subscriber, WorkerBuilder};

/// The variable naming the directory the index is written to.
pub const SEARCH_INDEX_DIR: &str = "SEARCH_INDEX_DIR";

/// The routing prefix of urgent reindexing.
pub const URGENT_PREFIX: &str = "search.index.urgent.";

/// The queue of urgent reindexing, fed by the rule for [`URGENT_PREFIX`].
pub const URGENT_QUEUE: &str = "app.search-urgent";

/// Writes one JSON document per event into a directory: the event's id,
/// tenant, type, the queue it came through and its payload. Idempotent: a
/// redelivery rewrites the same file (named by the delivery id) with the
/// same content.
#[derive(Debug, Clone)]
pub struct SearchIndexer {
    queue: &'static str,
    dir: PathBuf,
}

impl SearchIndexer {
    /// The handler of `queue`, writing into `dir`.
    #[must_use]
    pub fn new(queue: &'static str, dir: impl Into<PathBuf>) -> Self {
        Self {
            queue,
            dir: dir.into(),
        }
    }
}

impl JobHandler for SearchIndexer {
    type Job = OutboxJob;

    fn queue(&self) -> &str {
        self.queue
    }

    async fn handle(&self, job: OutboxJob, meta: &JobMeta) -> Result<(), JobError> {
        let payload = job
            .payload
            .value()
            .map_err(|e| JobError::permanent(format!("payload cannot be indexed: {e}")))?;
        let document = serde_json::json!({
            "event_id": job.outbox_event_id,
            "tenant_id": job.tenant_id,
            "event_type": job.event_type,
            "queue": meta.queue,
            "payload": payload,
        });
        let name = job.delivery_id().replace(':', "-");
        let (dir, text) = (self.dir.clone(), document.to_string());
        // A file system call blocks: off the runtime's threads.
        tokio::task::spawn_blocking(move || write_document(&dir, &name, &text))
            .await
            .map_err(|e| JobError::retry(format!("the write was interrupted: {e}")))?
            .map_err(|e| JobError::retry(format!("cannot write into {}: {e}", self.dir.display())))
    }
}

/// Writes `text` as `<dir>/<name>.json`: aside first, then renamed, so
/// that a reader never sees half a document.
fn write_document(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let partial = dir.join(format!(".{name}.partial"));
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, dir.join(format!("{name}.json")))
}

/// The index directory `SEARCH_INDEX_DIR` named (`dir`, read by the
/// binary): an existing directory, or the error that stops start-up with
/// exit code 2, naming the variable.
///
/// # Errors
///
/// When `dir` is missing or not a directory.
pub fn index_dir(dir: Option<&Path>) -> Result<PathBuf, ConfigError> {
    let problem = |value: String, problem: &str| ConfigError {
        variable: SEARCH_INDEX_DIR,
        value,
        problem: problem.to_owned(),
    };
    match dir {
        None => Err(problem(String::new(), "must name the index directory")),
        Some(dir) if !dir.is_dir() => Err(problem(dir.display().to_string(), "is not a directory")),
        Some(dir) => Ok(dir.to_owned()),
    }
}

/// What the application's search indexing adds to the worker: the
/// contract's `outbox.search-index` queue (routed by the standard table),
/// and its own [`URGENT_QUEUE`] with the rule for [`URGENT_PREFIX`].
pub const DESCRIPTION: SubscriberDescription = SubscriberDescription {
    name: "custom-worker search indexing",
    consumes: &[
        ConsumedQueue {
            queue: queues::SEARCH_INDEX,
            routes: &[],
            payload: "any object, written whole into the event's document",
        },
        ConsumedQueue {
            queue: URGENT_QUEUE,
            routes: &[URGENT_PREFIX],
            payload: "any object, written whole into the event's document",
        },
    ],
    feeds: &[],
    dedup: &[],
};

/// The application's subscriber: a [`SearchIndexer`] on each queue of
/// [`DESCRIPTION`], writing into the directory `SEARCH_INDEX_DIR` names
/// (checked at start by [`index_dir`], after `--help` had its say).
#[derive(Debug, Clone)]
pub struct SearchIndexing {
    dir: Option<PathBuf>,
}

impl SearchIndexing {
    /// Indexing into `dir` (the value of `SEARCH_INDEX_DIR`).
    #[must_use]
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir }
    }
}

impl Subscriber for SearchIndexing {
    fn description(&self) -> SubscriberDescription {
        DESCRIPTION
    }

    fn handlers(self, group: HandlerGroup, _: &Resources<'_>) -> anyhow::Result<HandlerGroup> {
        let dir = index_dir(self.dir.as_deref())?;
        let mut group = group;
        for consumed in DESCRIPTION.consumes {
            group = group.with(SearchIndexer::new(consumed.queue, dir.clone()))?;
        }
        Ok(group)
    }
}

/// The application's worker: the general group plus [`SearchIndexing`].
#[must_use]
pub fn worker(dir: Option<PathBuf>) -> WorkerBuilder {
    WorkerBuilder::new(Group::General)
        .name("custom-worker")
        .subscriber(SearchIndexing::new(dir))
}
