//! Addressing, connecting to and pushing onto apalis-redis queues.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use apalis_core::task::builder::TaskBuilder;
use apalis_core::task::task_id::TaskId;
use apalis_redis::{Config, ConnectionManager, RedisStorage};

use crate::RedisConnection;
use outbox_env::{Text, VariableError};
use outbox_model::Priority;
use redis::aio::ConnectionManagerConfig;
use tracing::instrument;

use crate::OutboxJob;
use crate::levels::{push_raw_at_priority, wake};

/// `OUTBOX_QUEUE_PREFIX`: the [`QueueNamespace`] of a process
/// ([`QueueNamespace::from_lookup`]).
pub const OUTBOX_QUEUE_PREFIX: Text = Text {
    name: "OUTBOX_QUEUE_PREFIX",
    default: "empty",
    form: "empty, or ending with ':' (adopt-app:)",
    meaning: "key prefix of every queue, for several environments on one Redis",
};

/// A key prefix put in front of every queue name. Production uses
/// [`QueueNamespace::root`] (no prefix, so keys are `outbox.mail:…` as in
/// the contract); tests use a unique prefix each, so that parallel tests
/// share one Redis without seeing each other's jobs.
///
/// On a Redis Cluster the queue name in each key is a hash tag
/// ([`QueueNamespace::with_hash_tags`]): `{outbox.mail}:active`, so that
/// every key of a queue lands in one hash slot, and the queues spread over
/// the primaries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueNamespace {
    prefix: String,
    hash_tags: bool,
}

impl QueueNamespace {
    /// No prefix: queue `outbox.mail` lives under keys `outbox.mail:*`.
    #[must_use]
    pub fn root() -> Self {
        Self::default()
    }

    /// Every queue name gets `prefix` in front of it.
    #[must_use]
    pub fn prefixed(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            hash_tags: false,
        }
    }

    /// `prefix`'s namespace for the Redis of `redis_url`: with hash tags
    /// ([`QueueNamespace::with_hash_tags`]) when the URL is a cluster's
    /// ([`cluster_nodes`]), without on one server.
    ///
    /// ```
    /// use outbox_queue::{QueueNamespace, apalis_config, queues};
    ///
    /// let server = QueueNamespace::for_redis("app:", "redis://10.0.0.1:6379");
    /// assert_eq!(server.queue(queues::MAIL), "app:outbox.mail");
    ///
    /// let cluster =
    ///     QueueNamespace::for_redis("app:", "redis://10.0.0.1:6379,redis://10.0.0.2:6379");
    /// assert_eq!(cluster.queue(queues::MAIL), "app:{outbox.mail}");
    /// assert_eq!(
    ///     apalis_config(&cluster, queues::MAIL).active_jobs_list(),
    ///     "app:{outbox.mail}:active"
    /// );
    /// ```
    #[must_use]
    pub fn for_redis(prefix: impl Into<String>, redis_url: &str) -> Self {
        Self::prefixed(prefix).with_hash_tags(cluster_nodes(redis_url).is_some())
    }

    /// With `on`, each queue's name in its keys is a Redis hash tag
    /// (`<prefix>{outbox.mail}:active` instead of `<prefix>outbox.mail:active`),
    /// so that a Redis Cluster keeps every key of a queue in one hash slot:
    /// the queue scripts touch several of them in one call. Needed on a
    /// cluster; on one server it only renames the keys.
    #[must_use]
    pub fn with_hash_tags(mut self, on: bool) -> Self {
        self.hash_tags = on;
        self
    }

    /// Whether queue names are hash tags ([`QueueNamespace::with_hash_tags`]).
    #[must_use]
    pub fn hash_tags(&self) -> bool {
        self.hash_tags
    }

    /// The namespace an operator asked for with `OUTBOX_QUEUE_PREFIX`:
    /// empty for the root namespace, else a prefix that ends with
    /// [`QUEUE_PREFIX_SEPARATOR`] (`adopt-app:` gives keys
    /// `adopt-app:outbox.audit:*`). The separator is required rather than
    /// added, so that a prefix never silently moves a running deployment's
    /// keys.
    ///
    /// # Errors
    ///
    /// [`InvalidQueuePrefix`] when the prefix does not end with the
    /// separator, has nothing before it, or contains whitespace or a
    /// control character.
    pub fn checked(prefix: &str) -> Result<Self, InvalidQueuePrefix> {
        if prefix.is_empty() {
            return Ok(Self::root());
        }
        let problem = if prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            "must not contain whitespace or control characters"
        } else if !prefix.ends_with(QUEUE_PREFIX_SEPARATOR) {
            "must end with ':' (like \"adopt-app:\"), or keys run into the queue name"
        } else if prefix.len() == QUEUE_PREFIX_SEPARATOR.len_utf8() {
            "must have a name before the ':'"
        } else {
            return Ok(Self::prefixed(prefix));
        };
        Err(InvalidQueuePrefix {
            prefix: prefix.to_owned(),
            problem,
        })
    }

    /// The namespace of [`OUTBOX_QUEUE_PREFIX`] read through `get`, as
    /// [`QueueNamespace::checked`] accepts it; the root when unset. With
    /// hash tags when [`REDIS_URL`] is a cluster's.
    ///
    /// # Errors
    ///
    /// A [`VariableError`] naming the variable, with the problem of
    /// [`InvalidQueuePrefix`].
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, VariableError> {
        let prefix = OUTBOX_QUEUE_PREFIX.read(get).unwrap_or_default();
        let cluster = REDIS_URL
            .read(get)
            .is_some_and(|url| cluster_nodes(&url).is_some());
        Self::checked(&prefix)
            .map(|namespace| namespace.with_hash_tags(cluster))
            .map_err(|e| OUTBOX_QUEUE_PREFIX.refuse(prefix.clone(), e.problem))
    }

    /// The prefix (empty for the root namespace).
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The apalis queue name of `queue` in this namespace.
    #[must_use]
    pub fn queue(&self, queue: &str) -> String {
        if self.hash_tags {
            format!("{}{{{queue}}}", self.prefix)
        } else {
            format!("{}{queue}", self.prefix)
        }
    }
}

/// What ends a non-empty queue prefix, between it and the queue name.
pub const QUEUE_PREFIX_SEPARATOR: char = ':';

/// A queue prefix [`QueueNamespace::checked`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid queue prefix {prefix:?}: {problem}")]
pub struct InvalidQueuePrefix {
    /// The prefix as given.
    pub prefix: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Connection settings for Redis. The defaults follow the dependency notes:
/// a response timeout of 5 s (apalis' own 500 ms turns load into fatal
/// stream errors), a connect timeout of 2 s, and few quick reconnect retries
/// so that an unreachable Redis fails a push promptly instead of stalling.
/// Its `Debug` output shows the URL without its password.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://host:port[/db]`.
    pub url: String,
    /// How long one command may take.
    pub response_timeout: Duration,
    /// How long connecting may take.
    pub connection_timeout: Duration,
    /// Reconnect attempts per failed command before it fails.
    pub reconnect_retries: usize,
    /// A PEM file of CA certificates to trust for a `rediss://` URL in
    /// place of the system's roots (`REDIS_CA_CERT`); `None` trusts the
    /// system's.
    pub ca_cert: Option<PathBuf>,
}

impl RedisSettings {
    /// Defaults for `url`.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            response_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(2),
            reconnect_retries: 2,
            ca_cert: None,
        }
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &crate::redact_url(&self.url))
            .field("response_timeout", &self.response_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("reconnect_retries", &self.reconnect_retries)
            .field("ca_cert", &self.ca_cert)
            .finish()
    }
}

/// Why a queue operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The Redis URL does not parse.
    #[error("invalid Redis URL {url:?}: {source}")]
    InvalidUrl {
        /// The URL as given, with its password hidden ([`crate::redact_url`]).
        url: String,
        /// The parser's reason.
        source: redis::RedisError,
    },
    /// The CA file for a `rediss://` URL cannot be read, or holds no
    /// certificate the TLS settings take.
    #[error("cannot read the Redis CA certificate {}: {source}", .path.display())]
    CaCert {
        /// The path as given.
        path: PathBuf,
        /// The reading error.
        source: std::io::Error,
    },
    /// Redis refused or did not answer.
    #[error("Redis error: {0}")]
    Redis(#[from] redis::RedisError),
    /// The apalis-redis backend failed.
    #[error("apalis-redis error: {0}")]
    Backend(#[from] apalis_redis::Error),
    /// A job could not be encoded.
    #[error("cannot encode job: {0}")]
    Encode(#[from] serde_json::Error),
    /// Redis answered something this crate does not understand.
    #[error("unexpected answer from Redis: {0}")]
    Unexpected(String),
}

/// A connection to the Redis of `settings`: to one server when its `url`
/// names one, to a Redis Cluster when it lists several nodes separated by
/// commas ([`cluster_nodes`]). Either connects lazily: it returns at once
/// even when Redis is down, and each command (re)connects as needed, so a
/// process can start before Redis and survive its restarts (and, on a
/// cluster, a primary's failover: commands follow the slot to its new
/// primary). Call it inside a tokio runtime (it spawns the connection's
/// driver task).
///
/// # Errors
///
/// [`QueueError::InvalidUrl`] when the URL (or one of a cluster's) does not
/// parse, [`QueueError::CaCert`] when `ca_cert` cannot be read (or, for a
/// single server, holds no certificate the TLS settings take).
pub fn connect(settings: &RedisSettings) -> Result<RedisConnection, QueueError> {
    if let Some(nodes) = cluster_nodes(&settings.url) {
        return connect_cluster(settings, &nodes);
    }
    let client = redis_client(&settings.url, settings.ca_cert.as_deref())?;
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(settings.response_timeout))
        .set_connection_timeout(Some(settings.connection_timeout))
        .set_number_of_retries(settings.reconnect_retries)
        .set_min_delay(Duration::from_millis(100))
        .set_max_delay(Duration::from_secs(1));
    Ok(ConnectionManager::new_lazy_with_config(client, config)?.into())
}

/// The query parameter that marks the URL of one address as a Redis
/// Cluster's: a managed cluster's configuration endpoint
/// (`rediss://clustercfg.example.cache.amazonaws.com:6379?cluster=true`).
pub const CLUSTER_MARKER: &str = "cluster=true";

/// The nodes of a cluster URL, each as a URL of its own: `Some` when `url`
/// lists two or more separated by commas
/// (`redis://10.0.0.1:6379,redis://10.0.0.2:6379`), or one address marked
/// with [`CLUSTER_MARKER`] (`redis://cfg.example:6379?cluster=true`, the
/// marker left out of the node's URL); `None` for the URL of one server.
/// Any nodes of the cluster will do: the client asks them for the others
/// and for who holds which slots.
///
/// ```
/// use outbox_queue::cluster_nodes;
///
/// assert_eq!(cluster_nodes("redis://10.0.0.1:6379"), None);
/// assert_eq!(
///     cluster_nodes("redis://10.0.0.1:6379, redis://10.0.0.2:6379"),
///     Some(vec!["redis://10.0.0.1:6379".to_owned(), "redis://10.0.0.2:6379".to_owned()])
/// );
/// assert_eq!(
///     cluster_nodes("rediss://cfg.example:6379?cluster=true"),
///     Some(vec!["rediss://cfg.example:6379".to_owned()])
/// );
/// ```
#[must_use]
pub fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let marked = |node: &str| without_cluster_marker(node);
    if url.contains(',') {
        return Some(
            url.split(',')
                .map(str::trim)
                .filter(|node| !node.is_empty())
                .map(|node| marked(node).unwrap_or_else(|| node.to_owned()))
                .collect(),
        );
    }
    marked(url.trim()).map(|node| vec![node])
}

/// `url` without its [`CLUSTER_MARKER`] parameter, when it has one.
fn without_cluster_marker(url: &str) -> Option<String> {
    let (base, query) = url.split_once('?')?;
    let params: Vec<&str> = query.split('&').collect();
    if !params.contains(&CLUSTER_MARKER) {
        return None;
    }
    let rest: Vec<&str> = params
        .into_iter()
        .filter(|param| *param != CLUSTER_MARKER && !param.is_empty())
        .collect();
    Some(if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    })
}

fn connect_cluster(
    settings: &RedisSettings,
    nodes: &[String],
) -> Result<RedisConnection, QueueError> {
    let invalid = |source| QueueError::InvalidUrl {
        url: crate::redact_url(&settings.url),
        source,
    };
    if nodes.iter().any(|node| node.starts_with("rediss://")) {
        // As in redis_client: name the crypto provider the workspace uses.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
    let mut builder = redis::cluster::ClusterClient::builder(nodes.iter().cloned())
        .connection_timeout(settings.connection_timeout)
        .response_timeout(settings.response_timeout)
        .retries(u32::try_from(settings.reconnect_retries.max(1)).unwrap_or(u32::MAX));
    if let Some(path) = settings.ca_cert.as_deref() {
        let pem = std::fs::read(path).map_err(|source| QueueError::CaCert {
            path: path.to_owned(),
            source,
        })?;
        builder = builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        });
    }
    let client = builder.build().map_err(invalid)?;
    let config = redis::cluster::ClusterConfig::new()
        .set_connection_timeout(settings.connection_timeout)
        .set_response_timeout(settings.response_timeout);
    Ok(client
        .get_pending_async_connection_with_config(config)
        .into())
}

/// `REDIS_URL`: the `url` of [`redis_client`].
pub const REDIS_URL: Text = Text {
    name: "REDIS_URL",
    default: "required",
    form: "redis://host:port[/db], or rediss:// for TLS; for a Redis Cluster, node URLs separated by commas, or one address with ?cluster=true (a configuration endpoint)",
    meaning: "Redis: one server, or a Redis Cluster's nodes (maxmemory-policy noeviction)",
};

/// `REDIS_CA_CERT`: the `ca_cert` of [`redis_client`].
pub const REDIS_CA_CERT: Text = Text {
    name: "REDIS_CA_CERT",
    default: "unset (the system's trusted roots)",
    form: "a path to a PEM file of CA certificates",
    meaning: "the CA a rediss:// server's certificate must chain to",
};

/// [`REDIS_URL`] (required) and [`REDIS_CA_CERT`] read through `get`,
/// checked by making a client with them ([`redis_client`]); nothing is
/// connected.
///
/// # Errors
///
/// A [`VariableError`] naming the variable at fault, with the URL's
/// password hidden.
pub fn redis_from_lookup(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, Option<PathBuf>), VariableError> {
    let url = REDIS_URL.required(get)?;
    let ca_cert = REDIS_CA_CERT.read(get).map(PathBuf::from);
    let invalid_url = |problem: String| REDIS_URL.refuse(crate::redact_url(&url), problem);
    match redis_client(&url, ca_cert.as_deref()) {
        Ok(_) => Ok((url, ca_cert)),
        Err(e @ QueueError::CaCert { .. }) => Err(REDIS_CA_CERT.refuse(
            ca_cert.map(|p| p.display().to_string()).unwrap_or_default(),
            e.to_string(),
        )),
        Err(QueueError::InvalidUrl { source, .. }) => {
            Err(invalid_url(format!("is not a Redis URL: {source}")))
        }
        Err(e) => Err(invalid_url(e.to_string())),
    }
}

/// A Redis client for `url`: `redis://` in plain text, `rediss://` over TLS
/// (rustls), verified against `ca_cert` (a PEM file of CA certificates)
/// when given, else against the system's roots. Every Redis connection of
/// the workspace is opened through a client made here or by [`connect`].
///
/// For a cluster's URL ([`cluster_nodes`]) every node's URL is checked and
/// the client is one of the first node, not a client for keys (use
/// [`connect`]); a pub/sub listener takes [`pubsub_clients`], which goes
/// on with the next node when one fails.
///
/// # Errors
///
/// [`QueueError::InvalidUrl`] when the URL does not parse (or `ca_cert` is
/// given with a URL that is not `rediss://`), [`QueueError::CaCert`] when
/// `ca_cert` cannot be read or holds no certificate the TLS settings take.
pub fn redis_client(url: &str, ca_cert: Option<&Path>) -> Result<redis::Client, QueueError> {
    let Some(nodes) = cluster_nodes(url) else {
        return server_client(url, ca_cert);
    };
    let mut clients = nodes
        .iter()
        .map(|node| server_client(node, ca_cert))
        .collect::<Result<Vec<_>, _>>()?;
    if clients.is_empty() {
        return Err(QueueError::InvalidUrl {
            url: crate::redact_url(url),
            source: redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a cluster URL lists no nodes",
            )),
        });
    }
    Ok(clients.swap_remove(0))
}

/// The clients a pub/sub listener subscribes through: the one server, or
/// every node of a cluster. A cluster forwards each `PUBLISH` to every
/// node, so one subscription on any live node hears them all; a listener
/// that loses its node goes on with the next one
/// (`outbox_subscriber::listen_for_wakeups`).
#[derive(Debug, Clone)]
pub struct PubSubClients(Vec<redis::Client>);

impl PubSubClients {
    /// The clients, in the order of the URL.
    #[must_use]
    pub fn nodes(&self) -> &[redis::Client] {
        &self.0
    }
}

impl From<redis::Client> for PubSubClients {
    fn from(client: redis::Client) -> Self {
        Self(vec![client])
    }
}

/// The [`PubSubClients`] of `url`: one client for a server, one per node
/// for a cluster's URL ([`cluster_nodes`]), each checked as
/// [`redis_client`] checks its URL.
///
/// ```
/// let one = outbox_queue::pubsub_clients("redis://127.0.0.1:6379", None).unwrap();
/// assert_eq!(one.nodes().len(), 1);
/// let cluster =
///     outbox_queue::pubsub_clients("redis://10.0.0.1:7000,redis://10.0.0.2:7000", None).unwrap();
/// assert_eq!(cluster.nodes().len(), 2);
/// ```
///
/// # Errors
///
/// As [`redis_client`].
pub fn pubsub_clients(url: &str, ca_cert: Option<&Path>) -> Result<PubSubClients, QueueError> {
    match cluster_nodes(url) {
        None => Ok(PubSubClients(vec![server_client(url, ca_cert)?])),
        Some(nodes) => {
            // Checks the URL (and refuses one that lists no nodes).
            redis_client(url, ca_cert)?;
            nodes
                .iter()
                .map(|node| server_client(node, ca_cert))
                .collect::<Result<Vec<_>, _>>()
                .map(PubSubClients)
        }
    }
}

/// The line that opens a certificate in a PEM file.
const CERTIFICATE_BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";

fn server_client(url: &str, ca_cert: Option<&Path>) -> Result<redis::Client, QueueError> {
    let invalid = |source| QueueError::InvalidUrl {
        url: crate::redact_url(url),
        source,
    };
    if url.starts_with("rediss://") {
        // The redis crate builds its TLS settings on rustls' process-wide
        // crypto provider. This build links two (aws-lc-rs and ring), so
        // rustls picks none by itself: install the one the workspace uses.
        // An error means one is installed already, which is as good.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
    let Some(path) = ca_cert else {
        return redis::Client::open(url).map_err(invalid);
    };
    let pem = std::fs::read(path).map_err(|source| QueueError::CaCert {
        path: path.to_owned(),
        source,
    })?;
    // The URL on its own first, so that what the TLS settings refuse below
    // is the certificate, and the error names the file, not the URL.
    redis::Client::open(url).map_err(invalid)?;
    let not_pem = |problem: String| QueueError::CaCert {
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, problem),
    };
    if url.starts_with("rediss://")
        && !pem
            .windows(CERTIFICATE_BEGIN.len())
            .any(|w| w == CERTIFICATE_BEGIN)
    {
        // Taken as an empty set of roots, it would fail only at the first
        // connection, as a server certificate no root vouches for.
        return Err(not_pem(
            "holds no PEM certificate (no -----BEGIN CERTIFICATE----- line)".to_owned(),
        ));
    }
    redis::Client::build_with_tls(
        url,
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        },
    )
    .map_err(|e| {
        if url.starts_with("rediss://") {
            not_pem(format!("not a PEM certificate: {e}"))
        } else {
            // A CA file given for a plain-text URL.
            invalid(e)
        }
    })
}

/// The apalis-redis configuration of `queue` in `namespace`. The queue name
/// is always set explicitly (apalis' default is the Rust type name, which
/// would silently change on a rename).
#[must_use]
pub fn apalis_config(namespace: &QueueNamespace, queue: &str) -> Config {
    Config::default().queue(namespace.queue(queue))
}

/// An apalis-redis storage for jobs of type `T` on `queue`, for workers.
#[must_use]
pub fn storage<T>(
    conn: RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
) -> RedisStorage<T, RedisConnection> {
    RedisStorage::new(conn).with_config(apalis_config(namespace, queue))
}

/// What one push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PushReport {
    /// Jobs that were new.
    pub new: usize,
    /// Jobs whose task id already existed: nothing was written for them.
    pub duplicates: usize,
}

/// Pushes `jobs` onto `queue`, each with its deterministic task id
/// `outbox:<delivery id>` (`outbox:<event id>`, `…:g<n>` after the n-th
/// replay): the normal ones with one Redis round trip (apalis-redis' batch
/// push script), and those of another priority with one more round trip per
/// level ([`push_raw_at_priority`]), onto their level's list; then a
/// wake-up `PUBLISH` for the queue's workers when a job was new. A job
/// whose id is already on the queue is skipped and counted as a duplicate.
///
/// # Errors
///
/// [`QueueError::Redis`] / [`QueueError::Backend`] when Redis fails; then
/// none, some or all of the jobs may have been written, and pushing again is
/// safe.
#[instrument(name = "outbox.queue.push", skip(conn, jobs), fields(queue = %namespace.queue(queue), jobs = jobs.len()), err)]
pub async fn push_jobs(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    jobs: &[OutboxJob],
) -> Result<PushReport, QueueError> {
    let mut by_level: BTreeMap<Reverse<Priority>, Vec<(String, Vec<u8>)>> = BTreeMap::new();
    for job in jobs {
        by_level
            .entry(Reverse(job.priority))
            .or_default()
            .push((job.task_id(), serde_json::to_vec(job)?));
    }
    let mut report = PushReport::default();
    // The highest level first, so that its jobs are on their list before
    // the workers are woken for the normal ones.
    for (Reverse(priority), bodies) in by_level {
        let pushed = push_raw_at_priority(conn, namespace, queue, &bodies, None, priority).await?;
        report.new += pushed.new;
        report.duplicates += pushed.duplicates;
    }
    Ok(report)
}

/// Pushes pre-encoded job bodies with the given task ids in one round trip
/// (and a wake-up `PUBLISH` when a job was new); an id already on the queue
/// is skipped (counted as a duplicate). Used for
/// downstream jobs (`toolctrl.*`) whose ids derive from the event id too.
///
/// # Errors
///
/// As [`push_jobs`].
pub async fn push_raw(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    jobs: &[(String, Vec<u8>)],
) -> Result<PushReport, QueueError> {
    push_raw_at(conn, namespace, queue, jobs, None).await
}

/// [`push_raw`] with the jobs due at `run_at` instead of now (delayed retries).
///
/// # Errors
///
/// As [`push_jobs`].
pub async fn push_raw_at(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queue: &str,
    jobs: &[(String, Vec<u8>)],
    run_at: Option<std::time::SystemTime>,
) -> Result<PushReport, QueueError> {
    if jobs.is_empty() {
        return Ok(PushReport::default());
    }
    let config = apalis_config(namespace, queue);
    let tasks: Vec<_> = jobs
        .iter()
        .map(|(task_id, body)| {
            let builder =
                TaskBuilder::new(body.clone()).task_id(TaskId::from_string(task_id.clone()));
            match run_at {
                Some(at) => builder.run_at_time(at),
                None => builder,
            }
            .build()
        })
        .collect();
    let (enqueued, scheduled) = apalis_redis::queries::push_tasks(conn, &config, &tasks).await?;
    let new = (enqueued + scheduled) as usize;
    wake(conn, namespace, queue, new).await;
    Ok(PushReport {
        new,
        duplicates: jobs.len().saturating_sub(new),
    })
}

/// The pub/sub channel that wakes the workers of `queue` after a push.
#[must_use]
pub fn wake_channel(namespace: &QueueNamespace, queue: &str) -> String {
    format!("{}:wake", namespace.queue(queue))
}

/// The key prefix of the receivers' idempotency records in `namespace`
/// (shared by the workers and the CLI's replay).
#[must_use]
pub fn idempotency_prefix(namespace: &QueueNamespace) -> String {
    format!("{}outbox:idempotency:", namespace.prefix())
}

/// Most retry rounds a job goes through before the dead set; the receivers'
/// retry copies are `<task id>~retry1` up to `~retry16`.
pub const MAX_RETRY_ROUNDS: usize = 16;

/// The task id of retry round `round` (from 1) of the job `task_id`.
#[must_use]
pub fn retry_task_id(task_id: &str, round: usize) -> String {
    format!("{task_id}~retry{round}")
}

/// Splits a task id into the first delivery's id and its retry round (0 for
/// the first delivery).
#[must_use]
pub fn retry_round(task_id: &str) -> (&str, usize) {
    match task_id.rsplit_once("~retry") {
        Some((base, n)) => n.parse().map_or((task_id, 0), |n| (base, n)),
        None => (task_id, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Break checked: any other prefix (the writers and readers would still
    // agree) fails here; docs/adopting.md names these keys for operators
    // who remove a namespace, and records written by an earlier version
    // must still be found.
    #[test]
    fn idempotency_records_live_under_the_documented_keys() {
        assert_eq!(
            idempotency_prefix(&QueueNamespace::root()),
            "outbox:idempotency:"
        );
        assert_eq!(
            idempotency_prefix(&QueueNamespace::checked("adopt-app:").unwrap()),
            "adopt-app:outbox:idempotency:"
        );
    }

    #[test]
    fn a_queue_prefix_must_end_with_the_separator() {
        assert_eq!(QueueNamespace::checked(""), Ok(QueueNamespace::root()));
        let ns = QueueNamespace::checked("adopt-app:").unwrap();
        assert_eq!(ns.queue("outbox.audit"), "adopt-app:outbox.audit");
        for bad in ["adopt-app", ":", "adopt app:", "adopt-app:\n", "a\tb:"] {
            let err = QueueNamespace::checked(bad).unwrap_err();
            assert_eq!(err.prefix, bad);
        }
        assert!(
            QueueNamespace::checked("adopt-app")
                .unwrap_err()
                .to_string()
                .contains("must end with ':'")
        );
    }

    // Break checked: with the certificate's refusal mapped to `InvalidUrl`
    // (as before) the error names REDIS_URL and this fails.
    #[test]
    fn a_ca_file_that_holds_no_certificate_is_named_as_such_not_as_the_url() {
        let dir = std::env::temp_dir().join(format!("outbox-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broken.pem");
        std::fs::write(
            &path,
            "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let path_text = path.display().to_string();
        // The refusal of REDIS_URL = `url` with REDIS_CA_CERT = the file.
        let refusal = |url: &str| {
            let get = |name: &str| match name {
                "REDIS_URL" => Some(url.to_owned()),
                "REDIS_CA_CERT" => Some(path_text.clone()),
                _ => None,
            };
            redis_from_lookup(&get).unwrap_err().to_string()
        };
        let error = refusal("rediss://cache.internal:6380");
        assert!(error.contains("REDIS_CA_CERT"), "{error}");
        assert!(!error.contains("REDIS_URL"), "{error}");
        assert!(error.contains("not a PEM certificate"), "{error}");
        // A file without any certificate in it.
        std::fs::write(&path, "hello\n").unwrap();
        let error = refusal("rediss://cache.internal:6380");
        assert!(error.contains("REDIS_CA_CERT"), "{error}");
        assert!(error.contains("holds no PEM certificate"), "{error}");
        // A CA file for a plain-text URL is the URL's fault.
        let error = refusal("redis://cache.internal:6379");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(error.contains("REDIS_URL"), "{error}");
    }

    #[test]
    fn an_invalid_url_error_and_the_settings_hide_the_password() {
        let settings = RedisSettings::new("redis://:s3cr3t-redis@cache:notaport/0");
        let Err(error) = connect(&settings) else {
            panic!("the URL should not parse");
        };
        for shown in [
            error.to_string(),
            format!("{error:?}"),
            format!("{settings:?}"),
        ] {
            assert!(!shown.contains("s3cr3t-redis"), "{shown}");
            assert!(shown.contains("redis://:***@cache:notaport/0"), "{shown}");
        }
    }
}
