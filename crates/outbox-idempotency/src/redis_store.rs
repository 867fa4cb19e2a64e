//! [`RedisIdempotencyStore`]: the store on Redis, one key per idempotency
//! key, each operation one Lua script.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::{ConnectionLike, ConnectionManager};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::instrument;

use crate::store::{Claim, ClaimToken, IdempotencyStore, StoreError, duration_millis};

/// An [`IdempotencyStore`] on Redis.
///
/// Each idempotency key `k` is one string key `<prefix>k` holding a JSON
/// record, and the key's own expiry is the lease or the TTL:
///
/// | state | value | expiry |
/// |---|---|---|
/// | in progress | `{"state":"in_progress","token":"<uuid>"}` | the lease |
/// | completed | `{"state":"completed","result":<handler result>}` | the TTL |
///
/// A lease that runs out is simply a key that disappears, so the next claim
/// finds the key free. Every operation is one Lua script on one key, hence
/// atomic, and it works on Redis Cluster too. The result is stored as the
/// JSON text `serde_json` wrote and handed back byte for byte (the scripts
/// never re-encode it), so large integers and empty arrays survive.
///
/// Cloning is cheap and shares the connection. `C` is the connection: a
/// `ConnectionManager` by default, or any other cloneable async
/// connection (a cluster connection, or the workspace's
/// `outbox_queue::RedisConnection`, which is either).
#[derive(Clone)]
pub struct RedisIdempotencyStore<C = ConnectionManager> {
    conn: C,
    prefix: String,
}

impl<C> RedisIdempotencyStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The key prefix unless [`with_prefix`](Self::with_prefix) sets
    /// another.
    pub const DEFAULT_PREFIX: &'static str = "outbox:idempotency:";

    /// A store on `conn` with keys under [`Self::DEFAULT_PREFIX`].
    #[must_use]
    pub fn new(conn: C) -> Self {
        Self {
            conn,
            prefix: Self::DEFAULT_PREFIX.to_owned(),
        }
    }

    /// Puts every key under `prefix` instead, e.g. one prefix per
    /// subscriber when several handlers process the same events, or a
    /// unique prefix per test.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key that holds the record of idempotency key `key`, for
    /// operators who need to inspect or delete it.
    #[must_use]
    pub fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Which of `keys` hold a completed record, in the same order, without
    /// changing anything (one `MGET` per 500 keys). A free key, a key in
    /// progress and a record that does not decode all read as not
    /// completed. Reconciliation after a Redis loss uses it to tell a job
    /// whose receiver already did its work from a lost one.
    ///
    /// # Errors
    ///
    /// [`StoreError::Redis`] when Redis fails.
    pub async fn completed(&self, keys: &[String]) -> Result<Vec<bool>, StoreError> {
        let mut conn = self.conn.clone();
        let mut completed = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(500) {
            let redis_keys: Vec<String> = chunk.iter().map(|k| self.redis_key(k)).collect();
            let values: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
                .arg(&redis_keys)
                .query_async(&mut conn)
                .await?;
            completed.extend(values.into_iter().map(|value| {
                value.is_some_and(|bytes| {
                    matches!(
                        serde_json::from_slice::<Record>(&bytes),
                        Ok(Record::Completed { .. })
                    )
                })
            }));
        }
        Ok(completed)
    }
}

impl<C> fmt::Debug for RedisIdempotencyStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisIdempotencyStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The record as written.
#[derive(Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum RecordRef<'a> {
    InProgress { token: &'a str },
    Completed { result: &'a Value },
}

/// The record as read.
#[derive(Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Record {
    InProgress {
        #[allow(dead_code)]
        token: String,
    },
    Completed {
        result: Value,
    },
}

/// KEYS[1] the record; ARGV[1] the in-progress record to write; ARGV[2] the
/// lease in ms. Returns the current record if there is one (in progress or
/// completed), else claims and returns nil. An expired lease is an absent
/// key, so it is claimed like a new one.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if current then
  return current
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
",
    )
});

/// Lua: true when KEYS[1] holds an in-progress record owned by token
/// ARGV[1]. A record that does not decode is owned by nobody.
const OWNED_BY_TOKEN: &str = r"
local function owned_by_token()
  local current = redis.call('GET', KEYS[1])
  if not current then
    return false
  end
  local ok, record = pcall(cjson.decode, current)
  return ok and type(record) == 'table'
    and record.state == 'in_progress' and record.token == ARGV[1]
end
";

/// KEYS[1] the record; ARGV[1] the token; ARGV[2] the completed record;
/// ARGV[3] the TTL in ms. Returns 1 if it stored the result, else 0.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{OWNED_BY_TOKEN}
if not owned_by_token() then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"
    ))
});

/// KEYS[1] the record; ARGV[1] the token. Returns 1 if it deleted the
/// in-progress record, else 0.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{OWNED_BY_TOKEN}
if not owned_by_token() then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"
    ))
});

fn encode(record: &RecordRef<'_>) -> Result<String, StoreError> {
    // Serializing a `Value` or a `&str` cannot fail; map it all the same.
    serde_json::to_string(record)
        .map_err(|e| StoreError::Internal(format!("cannot encode the record: {e}")))
}

fn flag(reply: i64) -> Result<bool, StoreError> {
    match reply {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(StoreError::Internal(format!(
            "script returned {other}, expected 0 or 1"
        ))),
    }
}

impl<C> IdempotencyStore for RedisIdempotencyStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    #[instrument(level = "debug", skip(self), fields(prefix = %self.prefix), err)]
    async fn claim(&self, key: &str, lease: Duration) -> Result<Claim, StoreError> {
        let lease_ms = duration_millis("lease", lease)?;
        let token = ClaimToken::generate();
        let record = encode(&RecordRef::InProgress {
            token: token.as_str(),
        })?;
        let redis_key = self.redis_key(key);
        let mut conn = self.conn.clone();
        let current: Option<Vec<u8>> = CLAIM
            .key(&redis_key)
            .arg(record)
            .arg(lease_ms)
            .invoke_async(&mut conn)
            .await?;
        let Some(current) = current else {
            return Ok(Claim::Acquired(token));
        };
        match serde_json::from_slice::<Record>(&current) {
            Ok(Record::InProgress { .. }) => Ok(Claim::InProgress),
            Ok(Record::Completed { result }) => Ok(Claim::Completed(result)),
            Err(source) => Err(StoreError::Corrupt {
                key: redis_key,
                source,
            }),
        }
    }

    #[instrument(level = "debug", skip(self, token, result), fields(prefix = %self.prefix), err)]
    async fn complete(
        &self,
        key: &str,
        token: &ClaimToken,
        result: &Value,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let ttl_ms = duration_millis("ttl", ttl)?;
        let record = encode(&RecordRef::Completed { result })?;
        let mut conn = self.conn.clone();
        let reply: i64 = COMPLETE
            .key(self.redis_key(key))
            .arg(token.as_str())
            .arg(record)
            .arg(ttl_ms)
            .invoke_async(&mut conn)
            .await?;
        flag(reply)
    }

    #[instrument(level = "debug", skip(self, token), fields(prefix = %self.prefix), err)]
    async fn release(&self, key: &str, token: &ClaimToken) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let reply: i64 = RELEASE
            .key(self.redis_key(key))
            .arg(token.as_str())
            .invoke_async(&mut conn)
            .await?;
        flag(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_have_the_documented_shape() -> Result<(), serde_json::Error> {
        let in_progress = serde_json::to_string(&RecordRef::InProgress { token: "t-1" })?;
        assert_eq!(in_progress, r#"{"state":"in_progress","token":"t-1"}"#);
        let result = serde_json::json!({ "sent": true, "ids": [] });
        let completed = serde_json::to_string(&RecordRef::Completed { result: &result })?;
        assert_eq!(
            completed,
            r#"{"state":"completed","result":{"ids":[],"sent":true}}"#
        );
        assert!(matches!(
            serde_json::from_str::<Record>(&completed)?,
            Record::Completed { result: r } if r == result
        ));
        assert!(serde_json::from_str::<Record>(r#"{"state":"done"}"#).is_err());
        Ok(())
    }
}
