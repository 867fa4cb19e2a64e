//! [`TestRedis`]: a Redis key namespace per test, and
//! [`sweep_abandoned_namespaces`] for the namespaces of test processes that
//! were killed before they could clean up.

use std::sync::mpsc;
use std::time::Duration;

use outbox_queue::RedisConnection;

use crate::url::redis_server_url;

/// Every test namespace's prefix starts with this.
const NAMESPACE_ROOT: &str = "outbox-test:";
/// A live namespace `outbox-test:<id>:` keeps the key `outbox-test-alive:<id>`.
const ALIVE_ROOT: &str = "outbox-test-alive:";
/// How long the liveness key lasts without being renewed: a test process
/// killed (a timeout, a mutation run cancelling the rest of a suite, a
/// Ctrl-C) stops renewing it, and its namespace counts as abandoned after
/// this.
const ALIVE_FOR: Duration = Duration::from_secs(120);
/// How often a live namespace renews its liveness key.
const RENEW_EVERY: Duration = Duration::from_secs(30);
/// Held while one test process sweeps: at most one sweep this often, across
/// every process using the server.
const SWEEP_LOCK: &str = "outbox-test-sweep";
/// See [`SWEEP_LOCK`].
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A unique key prefix on the test Redis server; every key under it is
/// deleted when the value is dropped (also on panic). While it lives it
/// renews a liveness key, so that [`sweep_abandoned_namespaces`] can tell
/// its keys from those of a test process that was killed.
pub struct TestRedis {
    url: String,
    prefix: String,
    client: redis::Client,
    /// Dropping it stops the renewal thread.
    _alive: mpsc::Sender<()>,
}

impl TestRedis {
    /// A new namespace `outbox-test:<uuid>:` on the test server.
    ///
    /// # Panics
    ///
    /// When Redis cannot be reached.
    pub async fn new() -> Self {
        let url = redis_server_url();
        let client = redis::Client::open(url.as_str())
            .unwrap_or_else(|e| panic!("invalid Redis URL {url}: {e}"));
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot connect to Redis at {url}: {e}\n\
                 hint: set OUTBOX_TEST_REDIS_URL \
                 (in the outbox workspace, `cargo xtask services` starts one and prints its URL)"
                )
            });
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("Redis at {url} does not answer PING: {e}"));
        let id = uuid::Uuid::new_v4().simple().to_string();
        let alive_key = format!("{ALIVE_ROOT}{id}");
        // The liveness key exists before any key of the namespace does.
        let _: () = redis::cmd("SET")
            .arg(&alive_key)
            .arg(1)
            .arg("EX")
            .arg(ALIVE_FOR.as_secs())
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("Redis at {url}: cannot mark the namespace alive: {e}"));
        // At most once a minute across all test processes, one of them
        // removes what killed ones left (a mutation run kills suites all the
        // time), in the background: the test does not wait for it.
        let sweep: Option<String> = redis::cmd("SET")
            .arg(SWEEP_LOCK)
            .arg(1)
            .arg("NX")
            .arg("EX")
            .arg(SWEEP_EVERY.as_secs())
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        if sweep.is_some() {
            let url = url.clone();
            std::thread::spawn(move || {
                if let Err(e) = sweep_abandoned_namespaces(&url) {
                    eprintln!("outbox-testkit: sweeping abandoned test keys failed: {e}");
                }
            });
        }
        let (alive, stopped) = mpsc::channel::<()>();
        let renew = client.clone();
        std::thread::spawn(move || {
            // Renews until the namespace is dropped (the sender goes away),
            // then removes the key; a killed process just stops renewing.
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(RENEW_EVERY) {
                if let Ok(mut conn) = renew.get_connection() {
                    let _: Result<bool, _> = redis::cmd("EXPIRE")
                        .arg(&alive_key)
                        .arg(ALIVE_FOR.as_secs())
                        .query(&mut conn);
                }
            }
            if let Ok(mut conn) = renew.get_connection() {
                let _: Result<i64, _> = redis::cmd("DEL").arg(&alive_key).query(&mut conn);
            }
        });
        Self {
            url,
            prefix: format!("{NAMESPACE_ROOT}{id}:"),
            client,
            _alive: alive,
        }
    }

    /// The server URL.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The key prefix of this test, ending in `:`.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `name` inside this test's namespace.
    #[must_use]
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// A connection manager (reconnecting, multiplexed) to the server.
    ///
    /// # Panics
    ///
    /// When Redis cannot be reached.
    pub async fn conn(&self) -> RedisConnection {
        redis::aio::ConnectionManager::new(self.client.clone())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to Redis at {}: {e}", self.url))
            .into()
    }

    /// Every key under this namespace, sorted.
    ///
    /// # Panics
    ///
    /// When Redis fails.
    pub async fn keys(&self) -> Vec<String> {
        let mut conn = self
            .client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to Redis at {}: {e}", self.url));
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}*", self.prefix))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("SCAN failed: {e}"));
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        keys
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let Ok(mut conn) = self.client.get_connection() else {
            return;
        };
        let _ = unlink_matching(&mut conn, &format!("{}*", self.prefix));
    }
}

/// Deletes every key matching `pattern`, scanning (never `KEYS`, which
/// blocks the server for the whole keyspace); returns how many.
fn unlink_matching(conn: &mut redis::Connection, pattern: &str) -> redis::RedisResult<u64> {
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000)
        .clone()
        .iter(conn)?
        .collect::<redis::RedisResult<_>>()?;
    let mut removed = 0;
    for chunk in keys.chunks(500) {
        removed += redis::cmd("UNLINK").arg(chunk).query::<u64>(conn)?;
    }
    Ok(removed)
}

/// What [`sweep_abandoned_namespaces`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Namespaces whose test process is gone.
    pub namespaces: usize,
    /// Keys deleted with them.
    pub keys: u64,
}

/// Deletes the keys of test namespaces whose [`TestRedis`] stopped renewing
/// its liveness key more than two minutes ago: those of test processes that
/// were killed before their clean-up ran. [`TestRedis::new`] runs it in the
/// background at most once a minute per server, and `cargo xtask test`
/// before the suite. A suite that leaves them behind
/// (one interrupted backlog test leaves 100,000 jobs) slows every later
/// test's Redis calls. Namespaces in use, by this or another suite on the
/// same server, are left alone.
///
/// # Errors
///
/// When Redis fails.
pub fn sweep_abandoned_namespaces(url: &str) -> redis::RedisResult<Swept> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection()?;
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(format!("{NAMESPACE_ROOT}*"))
        .arg("COUNT")
        .arg(1000)
        .clone()
        .iter(&mut conn)?
        .collect::<redis::RedisResult<_>>()?;
    let mut ids: Vec<String> = keys
        .iter()
        .filter_map(|key| key.strip_prefix(NAMESPACE_ROOT)?.split(':').next())
        .map(str::to_owned)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut swept = Swept::default();
    for id in ids {
        let alive: bool = redis::cmd("EXISTS")
            .arg(format!("{ALIVE_ROOT}{id}"))
            .query(&mut conn)?;
        if !alive {
            swept.keys += unlink_matching(&mut conn, &format!("{NAMESPACE_ROOT}{id}:*"))?;
            swept.namespaces += 1;
        }
    }
    Ok(swept)
}

impl std::fmt::Debug for TestRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestRedis")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
