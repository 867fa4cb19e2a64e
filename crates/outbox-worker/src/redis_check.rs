//! The start-up check that Redis keeps what it is given.
//!
//! Queued jobs and idempotency keys live only in Redis. A server whose
//! `maxmemory-policy` evicts keys drops some of them, without an error to
//! anyone, once it reaches `maxmemory`: jobs vanish (a mail or webhook never
//! goes out although its outbox row is `DONE`) and idempotency keys vanish
//! (a redelivery repeats a side effect). So a worker refuses to start
//! against such a server unless told otherwise.

use std::collections::HashMap;
use std::time::Duration;

use outbox_queue::Persistence;
use outbox_queue::RedisConnection;

/// The only `maxmemory-policy` that never drops keys.
pub const NO_EVICTION: &str = "noeviction";

/// How long the start-up check waits for Redis before it gives up (and the
/// worker starts without the check, as it starts with Redis down).
pub const EVICTION_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The environment variable that lets a worker start against a Redis that
/// may evict keys.
pub const ALLOW_EVICTION_VARIABLE: &str = "OUTBOX_ALLOW_REDIS_EVICTION";

/// What `CONFIG GET maxmemory-policy` told at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// `noeviction`: Redis refuses writes when full instead of dropping keys.
    NoEviction,
    /// Any other policy (`allkeys-lru`, `volatile-ttl`, …): Redis drops keys
    /// when full.
    Evicts {
        /// The policy as Redis reported it.
        policy: String,
        /// On a Redis Cluster, the primary (`host:port`) that reported it,
        /// the first in address order of those that evict; empty on one
        /// server.
        node: String,
    },
    /// Redis answered, but not with the policy: `CONFIG` is refused (managed
    /// services often disable or rename it) or reports nothing.
    NotReported {
        /// Redis' answer.
        reason: String,
    },
    /// Redis did not answer (down, unreachable, refusing the credentials,
    /// or slower than [`EVICTION_CHECK_TIMEOUT`]).
    Unreachable {
        /// Why.
        reason: String,
    },
}

/// Redis may evict keys, and [`ALLOW_EVICTION_VARIABLE`] does not allow it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Redis may evict keys: its maxmemory-policy is {policy:?}{}, not \"noeviction\". \
     Under memory pressure it would silently drop queued jobs and idempotency keys \
     (mails and webhooks never sent, or sent twice). Set `maxmemory-policy noeviction` \
     on the Redis server, or set {variable}=true to start anyway",
    on_node(node),
    variable = ALLOW_EVICTION_VARIABLE
)]
pub struct RedisMayEvict {
    /// The policy Redis reported.
    pub policy: String,
    /// The cluster primary that reported it (empty on one server).
    pub node: String,
}

/// `" on the cluster primary <node>"`, or nothing for one server.
fn on_node(node: &str) -> String {
    if node.is_empty() {
        String::new()
    } else {
        format!(" on the cluster primary {node}")
    }
}

/// Asks Redis for its `maxmemory-policy` (`CONFIG GET`) within
/// [`EVICTION_CHECK_TIMEOUT`]: the one server, or every primary of a Redis
/// Cluster (a cluster evicts when any of its primaries does, since each
/// holds some queues' keys). Never fails: what it could not find out is in
/// the answer.
pub async fn read_eviction_policy(redis: &RedisConnection) -> EvictionPolicy {
    let mut conn = redis.clone();
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    match tokio::time::timeout(EVICTION_CHECK_TIMEOUT, conn.on_each_primary(&cmd)).await {
        Err(_) => EvictionPolicy::Unreachable {
            reason: format!("no answer within {EVICTION_CHECK_TIMEOUT:?}"),
        },
        Ok(Err(e))
            if matches!(
                e.kind(),
                redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
            ) =>
        {
            EvictionPolicy::NotReported {
                reason: e.to_string(),
            }
        }
        Ok(Err(e)) => EvictionPolicy::Unreachable {
            reason: e.to_string(),
        },
        Ok(Ok(answers)) => policy_of(answers),
    }
}

/// What the primaries' answers to `CONFIG GET maxmemory-policy` say
/// together: [`EvictionPolicy::Evicts`] when one primary evicts (the first
/// in address order), else [`EvictionPolicy::NotReported`] when one did not
/// report its policy, else [`EvictionPolicy::NoEviction`].
fn policy_of(mut answers: Vec<(String, redis::Value)>) -> EvictionPolicy {
    answers.sort_by(|a, b| a.0.cmp(&b.0));
    let mut not_reported = None;
    for (node, answer) in answers {
        let on = on_node(&node);
        match redis::from_redis_value::<HashMap<String, String>>(answer) {
            Ok(config) => match config.get("maxmemory-policy") {
                Some(policy) if policy.eq_ignore_ascii_case(NO_EVICTION) => {}
                Some(policy) => {
                    return EvictionPolicy::Evicts {
                        policy: policy.clone(),
                        node,
                    };
                }
                None => {
                    not_reported.get_or_insert_with(|| {
                        format!("CONFIG GET maxmemory-policy returned nothing{on}")
                    });
                }
            },
            Err(e) => {
                not_reported.get_or_insert_with(|| format!("{e}{on}"));
            }
        }
    }
    not_reported.map_or(EvictionPolicy::NoEviction, |reason| {
        EvictionPolicy::NotReported { reason }
    })
}

/// Decides whether a worker may start with what [`read_eviction_policy`]
/// found, and logs a warning for every case it lets through unchecked or
/// allowed by `allow_eviction` ([`ALLOW_EVICTION_VARIABLE`]).
///
/// # Errors
///
/// [`RedisMayEvict`] when Redis evicts and `allow_eviction` is false.
pub fn enforce_eviction_policy(
    found: &EvictionPolicy,
    allow_eviction: bool,
) -> Result<(), RedisMayEvict> {
    match found {
        EvictionPolicy::NoEviction => {
            tracing::info!(policy = NO_EVICTION, "Redis keeps what it is given");
            Ok(())
        }
        EvictionPolicy::Evicts { policy, node } if allow_eviction => {
            tracing::warn!(
                policy = %policy,
                node = %node,
                "Redis may evict keys (maxmemory-policy {policy:?}); starting anyway because \
                 {ALLOW_EVICTION_VARIABLE}=true: under memory pressure queued jobs and \
                 idempotency keys can be silently lost"
            );
            Ok(())
        }
        EvictionPolicy::Evicts { policy, node } => Err(RedisMayEvict {
            policy: policy.clone(),
            node: node.clone(),
        }),
        EvictionPolicy::NotReported { reason } => {
            tracing::warn!(
                reason = %reason,
                "Redis' maxmemory-policy could not be checked (CONFIG GET was refused); \
                 starting anyway. Make sure the server runs with maxmemory-policy noeviction, \
                 or queued jobs and idempotency keys can be silently lost"
            );
            Ok(())
        }
        EvictionPolicy::Unreachable { reason } => {
            tracing::warn!(
                reason = %reason,
                "Redis' maxmemory-policy could not be checked (Redis does not answer at start); \
                 starting anyway. Make sure the server runs with maxmemory-policy noeviction, \
                 or queued jobs and idempotency keys can be silently lost"
            );
            Ok(())
        }
    }
}

/// Reads Redis' persistence (`CONFIG GET appendonly appendfsync save`)
/// within [`EVICTION_CHECK_TIMEOUT`]; [`Persistence::Unknown`] when
/// `CONFIG` is refused or Redis does not answer.
pub async fn read_persistence(redis: &RedisConnection) -> Persistence {
    let mut conn = redis.clone();
    tokio::time::timeout(
        EVICTION_CHECK_TIMEOUT,
        outbox_queue::read_persistence(&mut conn),
    )
    .await
    .unwrap_or_else(|_| Persistence::Unknown {
        reason: format!("no answer within {EVICTION_CHECK_TIMEOUT:?}"),
    })
}

/// Sets the gauge `outbox_redis_persistence{mode}`: 1 for the mode found, 0
/// for every other, so that a change of configuration shows as one series
/// going to 0 and another to 1.
pub fn set_persistence_gauge(persistence: &Persistence) {
    for mode in Persistence::MODES {
        let value = if mode == persistence.mode() { 1.0 } else { 0.0 };
        metrics::gauge!("outbox_redis_persistence", "mode" => mode).set(value);
    }
}

/// Logs what Redis' persistence means for jobs handed off (at start), and
/// sets the gauge. Without an append-only file (or with one not fsync'd on
/// every write) a crash loses recent jobs; the dispatcher's Redis guard
/// notices and pushes them again, which `docs/operations.md` explains.
pub fn report_persistence(persistence: &Persistence) {
    set_persistence_gauge(persistence);
    let mode = persistence.mode();
    let loses = persistence.loss_on_crash();
    match persistence {
        Persistence::Aof { .. } if persistence.keeps_every_write() => tracing::info!(
            persistence = mode, config = %persistence,
            "Redis persistence: a crash loses {loses}"
        ),
        Persistence::Aof { .. } => tracing::info!(
            persistence = mode, config = %persistence,
            "Redis persistence: a crash loses {loses}; the dispatcher notices the restart and pushes what was lost again"
        ),
        Persistence::Rdb { .. } | Persistence::None => tracing::warn!(
            persistence = mode, config = %persistence,
            "Redis persistence: no append-only file, a crash or restart loses {loses}: jobs handed off and idempotency records; \
             the dispatcher notices and pushes the lost jobs again, but receivers may see some twice (see docs/operations.md, \"Redis must keep what it is given\")"
        ),
        Persistence::Unknown { reason } => tracing::warn!(
            persistence = mode, reason = %reason,
            "Redis persistence could not be read (CONFIG is not allowed); check appendonly/appendfsync in the provider's console"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_evicting_redis_stops_start_up_and_the_override_lets_it_start() {
        let evicts = EvictionPolicy::Evicts {
            policy: "allkeys-lru".into(),
            node: String::new(),
        };
        let err = enforce_eviction_policy(&evicts, false).unwrap_err();
        let message = err.to_string();
        for expected in [
            "\"allkeys-lru\"",
            "queued jobs and idempotency keys",
            "noeviction",
            "OUTBOX_ALLOW_REDIS_EVICTION=true",
        ] {
            assert!(message.contains(expected), "{expected:?} in {message}");
        }
        assert!(message.contains(ALLOW_EVICTION_VARIABLE));
        enforce_eviction_policy(&evicts, true).unwrap();
        for unchecked in [
            EvictionPolicy::NoEviction,
            EvictionPolicy::NotReported {
                reason: "NOPERM".into(),
            },
            EvictionPolicy::Unreachable {
                reason: "connection refused".into(),
            },
        ] {
            enforce_eviction_policy(&unchecked, false).unwrap();
        }
    }

    fn config(policy: &str) -> redis::Value {
        redis::Value::Array(vec![
            redis::Value::BulkString(b"maxmemory-policy".to_vec()),
            redis::Value::BulkString(policy.as_bytes().to_vec()),
        ])
    }

    #[test]
    fn a_cluster_evicts_when_any_primary_does_and_the_answer_names_that_primary() {
        let answers = vec![
            ("10.0.0.3:7002".to_owned(), config("volatile-lru")),
            ("10.0.0.1:7000".to_owned(), config("noeviction")),
            ("10.0.0.2:7001".to_owned(), config("allkeys-lru")),
        ];
        assert_eq!(
            policy_of(answers),
            EvictionPolicy::Evicts {
                policy: "allkeys-lru".into(),
                node: "10.0.0.2:7001".into(),
            }
        );
        let err = enforce_eviction_policy(
            &policy_of(vec![("10.0.0.2:7001".to_owned(), config("allkeys-lru"))]),
            false,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("\"allkeys-lru\" on the cluster primary 10.0.0.2:7001, not"),
            "{err}"
        );
        assert_eq!(
            policy_of(vec![
                ("10.0.0.1:7000".to_owned(), config("noeviction")),
                ("10.0.0.2:7001".to_owned(), config("NOEVICTION")),
            ]),
            EvictionPolicy::NoEviction
        );
        assert!(matches!(
            policy_of(vec![
                ("10.0.0.1:7000".to_owned(), config("noeviction")),
                ("10.0.0.2:7001".to_owned(), redis::Value::Array(vec![])),
            ]),
            EvictionPolicy::NotReported { reason } if reason.contains("10.0.0.2:7001")
        ));
        assert_eq!(
            policy_of(vec![(String::new(), config("allkeys-lru"))]),
            EvictionPolicy::Evicts {
                policy: "allkeys-lru".into(),
                node: String::new(),
            }
        );
    }
}
