//! [`TestRedis`]: a Redis key namespace per test.

use redis::aio::ConnectionManager;

use crate::url::redis_server_url;

/// A unique key prefix on the test Redis server; every key under it is
/// deleted when the value is dropped (also on panic).
pub struct TestRedis {
    url: String,
    prefix: String,
    client: redis::Client,
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
                 hint: run `cargo xtask services` and export the REDIS_URL it prints"
                )
            });
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("Redis at {url} does not answer PING: {e}"));
        let prefix = format!("outbox-test:{}:", uuid::Uuid::new_v4().simple());
        Self {
            url,
            prefix,
            client,
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
    pub async fn conn(&self) -> ConnectionManager {
        ConnectionManager::new(self.client.clone())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to Redis at {}: {e}", self.url))
    }

    /// Every key under this namespace, sorted.
    ///
    /// # Panics
    ///
    /// When Redis fails.
    pub async fn keys(&self) -> Vec<String> {
        let mut conn = self.conn().await;
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("KEYS failed: {e}"));
        keys.sort();
        keys
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let Ok(mut conn) = self.client.get_connection() else {
            return;
        };
        let pattern = format!("{}*", self.prefix);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query(&mut conn)
            .unwrap_or_default();
        for chunk in keys.chunks(500) {
            let _: Result<i64, _> = redis::cmd("DEL").arg(chunk).query(&mut conn);
        }
    }
}

impl std::fmt::Debug for TestRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestRedis")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
