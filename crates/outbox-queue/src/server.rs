//! What a Redis server says about itself (its run, its persistence), and
//! the marker the dispatchers keep in it to notice when it lost data.
//!
//! Once an outbox row is `DONE`, its job exists only in Redis. A Redis that
//! restarts without persistence, is flushed, or is replaced by a replica
//! that lagged forgets jobs without telling anyone. The marker is how the
//! dispatcher notices: one hash per queue namespace ([`marker_key`]) holding
//! an epoch id written once, and the server `run_id` it was last seen in.
//! A missing marker means the data is gone; another `run_id` means the
//! server restarted (or another server answers), and whether anything was
//! lost then depends on its [`Persistence`].

use std::collections::HashMap;
use std::time::Duration;

use crate::RedisConnection;
use uuid::Uuid;

use crate::{QueueError, QueueNamespace};

/// How a Redis server keeps its data across a restart, as `CONFIG GET` of
/// `appendonly`, `appendfsync` and `save` tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Persistence {
    /// `appendonly yes`: every write goes to the append-only file, flushed
    /// to disk as [`Fsync`] says.
    Aof {
        /// `appendfsync`.
        fsync: Fsync,
    },
    /// `appendonly no` with `save` points: RDB snapshots only; a crash
    /// loses everything since the last snapshot.
    Rdb {
        /// The `save` setting, e.g. `3600 1 300 100`.
        save: String,
    },
    /// `appendonly no` and no `save` points: a restart loses everything.
    None,
    /// `CONFIG` was refused (managed services often disable or rename it)
    /// or answered nothing usable.
    Unknown {
        /// Redis' answer.
        reason: String,
    },
}

/// `appendfsync`: when the append-only file reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// After every write: a crash loses nothing acknowledged.
    Always,
    /// Once a second: a crash loses up to about the last second (two in the
    /// worst case, when the disk is slow).
    Everysec,
    /// When the operating system decides (typically within 30 s).
    No,
}

impl Persistence {
    /// How much of what was written survives a restart, for choosing the
    /// weakest of a cluster's nodes: unknown and none lose everything, RDB
    /// loses since the last snapshot, AOF as its fsync says.
    fn strength(&self) -> u8 {
        match self {
            Self::Unknown { .. } => 0,
            Self::None => 1,
            Self::Rdb { .. } => 2,
            Self::Aof { fsync: Fsync::No } => 3,
            Self::Aof {
                fsync: Fsync::Everysec,
            } => 4,
            Self::Aof {
                fsync: Fsync::Always,
            } => 5,
        }
    }

    /// The label of the `outbox_redis_persistence{mode}` gauge and of the
    /// logs: `aof-always`, `aof-everysec`, `aof-no`, `rdb`, `none` or
    /// `unknown`.
    #[must_use]
    pub fn mode(&self) -> &'static str {
        match self {
            Self::Aof {
                fsync: Fsync::Always,
            } => "aof-always",
            Self::Aof {
                fsync: Fsync::Everysec,
            } => "aof-everysec",
            Self::Aof { fsync: Fsync::No } => "aof-no",
            Self::Rdb { .. } => "rdb",
            Self::None => "none",
            Self::Unknown { .. } => "unknown",
        }
    }

    /// Every mode [`Persistence::mode`] can name, for resetting the gauge.
    pub const MODES: [&'static str; 6] = [
        "aof-always",
        "aof-everysec",
        "aof-no",
        "rdb",
        "none",
        "unknown",
    ];

    /// True only for `appendonly yes` with `appendfsync always`: a restart
    /// of such a server loses nothing it acknowledged.
    #[must_use]
    pub fn keeps_every_write(&self) -> bool {
        matches!(
            self,
            Self::Aof {
                fsync: Fsync::Always
            }
        )
    }

    /// What is lost when the server crashes, in words, for logs and the CLI.
    #[must_use]
    pub fn loss_on_crash(&self) -> &'static str {
        match self {
            Self::Aof {
                fsync: Fsync::Always,
            } => "nothing acknowledged",
            Self::Aof {
                fsync: Fsync::Everysec,
            } => "up to about the last second of writes",
            Self::Aof { fsync: Fsync::No } => {
                "the writes the operating system had not flushed (up to about 30 s)"
            }
            Self::Rdb { .. } => "everything since the last snapshot",
            Self::None => "everything",
            Self::Unknown { .. } => "unknown (CONFIG is not allowed)",
        }
    }

    /// Reads the persistence from `CONFIG GET` answers (`appendonly`,
    /// `appendfsync`, `save`).
    #[must_use]
    pub fn from_config(config: &HashMap<String, String>) -> Self {
        let Some(appendonly) = config.get("appendonly") else {
            return Self::Unknown {
                reason: "CONFIG GET appendonly returned nothing".to_owned(),
            };
        };
        if appendonly.eq_ignore_ascii_case("yes") {
            let fsync = match config.get("appendfsync").map(|s| s.to_ascii_lowercase()) {
                Some(s) if s == "always" => Fsync::Always,
                Some(s) if s == "no" => Fsync::No,
                // Redis' default.
                _ => Fsync::Everysec,
            };
            return Self::Aof { fsync };
        }
        match config.get("save").map(|s| s.trim()) {
            Some(save) if !save.is_empty() => Self::Rdb {
                save: save.to_owned(),
            },
            _ => Self::None,
        }
    }
}

impl std::fmt::Display for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Aof { fsync } => {
                let fsync = match fsync {
                    Fsync::Always => "always",
                    Fsync::Everysec => "everysec",
                    Fsync::No => "no",
                };
                write!(f, "appendonly yes, appendfsync {fsync}")
            }
            Self::Rdb { save } => write!(f, "appendonly no, save {save:?}"),
            Self::None => f.write_str("appendonly no, save \"\""),
            Self::Unknown { reason } => write!(f, "unknown ({reason})"),
        }
    }
}

/// What a server says about itself: `INFO server` and, where allowed,
/// `CONFIG GET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `run_id`: random per server start. Another value means the server
    /// restarted or another server answers.
    pub run_id: String,
    /// `uptime_in_seconds`.
    pub uptime: Duration,
    /// The persistence as `CONFIG GET` reports it.
    pub persistence: Persistence,
}

/// Parses the `key:value` lines of an `INFO` answer.
#[must_use]
pub fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.trim_end().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Asks the server for [`ServerInfo`]: `INFO server`, then `CONFIG GET` of
/// `appendonly`, `appendfsync` and `save` (one command each, on every
/// primary of a cluster), whose refusal only makes the persistence
/// [`Persistence::Unknown`].
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis does not answer `INFO`, or
/// [`QueueError::Unexpected`] when the answer has no `run_id`.
pub async fn read_server_info(conn: &mut RedisConnection) -> Result<ServerInfo, QueueError> {
    let (run_id, server) = read_server_section(conn).await?;
    let persistence = read_persistence(conn).await;
    Ok(ServerInfo {
        run_id,
        uptime: Duration::from_secs(
            server
                .get("uptime_in_seconds")
                .and_then(|s| s.parse().ok())
                .unwrap_or_default(),
        ),
        persistence,
    })
}

/// The server's `run_id` alone (one `INFO server`): whether the same
/// server run still answers.
///
/// # Errors
///
/// As [`read_server_info`].
pub async fn read_run_id(conn: &mut RedisConnection) -> Result<String, QueueError> {
    Ok(read_server_section(conn).await?.0)
}

/// `INFO server`, parsed, with its `run_id`.
///
/// On a Redis Cluster, whose every node answers, the run is the cluster's
/// primaries' runs together (`<address>=<run_id>` of each primary, sorted
/// and separated by commas): a primary that restarts, or a replica that
/// takes over after a failover, makes it another run. Its uptime is the
/// shortest of the primaries'.
async fn read_server_section(
    conn: &mut RedisConnection,
) -> Result<(String, HashMap<String, String>), QueueError> {
    let answers = conn
        .on_each_primary(redis::cmd("INFO").arg("server"))
        .await?;
    let mut run_ids = Vec::with_capacity(answers.len());
    let mut first = None;
    let mut uptime = None::<u64>;
    for (node, answer) in answers {
        let text: String = redis::from_redis_value(answer)
            .map_err(|e| QueueError::Unexpected(format!("INFO server of {node:?}: {e}")))?;
        let info = parse_info(&text);
        let run_id = info.get("run_id").ok_or_else(|| {
            QueueError::Unexpected(format!("INFO server of {node:?} has no run_id"))
        })?;
        run_ids.push(if node.is_empty() {
            run_id.clone()
        } else {
            format!("{node}={run_id}")
        });
        if let Some(up) = info
            .get("uptime_in_seconds")
            .and_then(|s| s.parse::<u64>().ok())
        {
            uptime = Some(uptime.map_or(up, |u| u.min(up)));
        }
        first.get_or_insert(info);
    }
    let mut server =
        first.ok_or_else(|| QueueError::Unexpected("INFO found no primary".to_owned()))?;
    if let Some(uptime) = uptime {
        server.insert("uptime_in_seconds".to_owned(), uptime.to_string());
    }
    Ok((run_ids.join(","), server))
}

/// `CONFIG GET appendonly appendfsync save` as [`Persistence`]; a refusal
/// (or no answer) is [`Persistence::Unknown`] with Redis' reason. On a
/// Redis Cluster, the weakest of its primaries'.
pub async fn read_persistence(conn: &mut RedisConnection) -> Persistence {
    let mut configs: HashMap<String, HashMap<String, String>> = HashMap::new();
    for parameter in ["appendonly", "appendfsync", "save"] {
        let answers = match conn
            .on_each_primary(redis::cmd("CONFIG").arg("GET").arg(parameter))
            .await
        {
            Ok(answers) => answers,
            Err(e) => {
                return Persistence::Unknown {
                    reason: e.to_string(),
                };
            }
        };
        for (node, answer) in answers {
            match redis::from_redis_value::<HashMap<String, String>>(answer) {
                Ok(answer) => configs.entry(node).or_default().extend(answer),
                Err(e) => {
                    return Persistence::Unknown {
                        reason: e.to_string(),
                    };
                }
            }
        }
    }
    configs
        .values()
        .map(Persistence::from_config)
        .min_by_key(Persistence::strength)
        .unwrap_or(Persistence::Unknown {
            reason: "CONFIG GET answered nothing".to_owned(),
        })
}

/// The marker's key in `namespace`: `<prefix>outbox:redis-marker`.
#[must_use]
pub fn marker_key(namespace: &QueueNamespace) -> String {
    format!("{}outbox:redis-marker", namespace.prefix())
}

/// The key of the copy of the marker kept beside `queue`'s keys on a Redis
/// Cluster (`<prefix>{outbox.mail}:outbox:redis-marker`: in the queue's
/// hash slot, so on the primary that holds the queue).
#[must_use]
pub fn queue_marker_key(namespace: &QueueNamespace, queue: &str) -> String {
    format!("{}:outbox:redis-marker", namespace.queue(queue))
}

/// The keys that hold the marker of `namespace`: [`marker_key`], and on a
/// Redis Cluster (a namespace with hash tags) a copy beside each of
/// `queues` ([`queue_marker_key`]), so that a primary that loses its data
/// loses a copy too, whichever queues it holds.
fn marker_keys(namespace: &QueueNamespace, queues: &[&str]) -> Vec<String> {
    let mut keys = vec![marker_key(namespace)];
    if namespace.hash_tags() {
        keys.extend(
            queues
                .iter()
                .map(|queue| queue_marker_key(namespace, queue)),
        );
    }
    keys
}

/// The marker the dispatchers keep in each Redis they push to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// Written once when the marker is created; a new one after every loss.
    pub epoch: Uuid,
    /// The server run the marker was last confirmed in.
    pub run_id: String,
}

/// Reads the marker of `namespace`; `None` when it is missing (or has no
/// readable epoch, which counts the same). On a Redis Cluster the copies
/// beside `queues` must hold the same epoch, or the marker counts as
/// missing (a primary lost its data); on one server `queues` is unused.
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn read_marker(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queues: &[&str],
) -> Result<Option<Marker>, QueueError> {
    let mut marker: Option<Marker> = None;
    for key in marker_keys(namespace, queues) {
        let fields: HashMap<String, String> =
            redis::cmd("HGETALL").arg(&key).query_async(conn).await?;
        let Some(epoch) = fields.get("epoch").and_then(|e| e.parse().ok()) else {
            return Ok(None);
        };
        match &marker {
            None => {
                marker = Some(Marker {
                    epoch,
                    run_id: fields.get("run_id").cloned().unwrap_or_default(),
                });
            }
            Some(first) if first.epoch != epoch => return Ok(None),
            Some(_) => {}
        }
    }
    Ok(marker)
}

/// Writes a new marker (epoch and run), replacing any previous one, and on
/// a Redis Cluster its copies beside `queues`.
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn write_marker(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queues: &[&str],
    marker: &Marker,
) -> Result<(), QueueError> {
    let written_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
        .to_string();
    // The copies first, the main key last: a marker is complete once the
    // main key holds its epoch.
    for key in marker_keys(namespace, queues).iter().rev() {
        let () = redis::pipe()
            .atomic()
            .del(key)
            .hset_multiple(
                key,
                &[
                    ("epoch", marker.epoch.to_string()),
                    ("run_id", marker.run_id.clone()),
                    ("written_at", written_at.clone()),
                ],
            )
            .query_async(conn)
            .await?;
    }
    Ok(())
}

/// Records that the marker was confirmed in the server run `run_id` (after
/// a restart that lost nothing), in every copy.
///
/// # Errors
///
/// [`QueueError::Redis`] when Redis fails.
pub async fn confirm_marker_run(
    conn: &mut RedisConnection,
    namespace: &QueueNamespace,
    queues: &[&str],
    run_id: &str,
) -> Result<(), QueueError> {
    for key in marker_keys(namespace, queues) {
        let _: i64 = redis::cmd("HSET")
            .arg(key)
            .arg("run_id")
            .arg(run_id)
            .query_async(conn)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_lives_under_the_documented_key_of_its_namespace() {
        assert_eq!(marker_key(&QueueNamespace::root()), "outbox:redis-marker");
        assert_eq!(
            marker_key(&QueueNamespace::checked("adopt-app:").unwrap()),
            "adopt-app:outbox:redis-marker"
        );
    }

    fn config(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn persistence_is_read_from_the_config() {
        let aof = |fsync| {
            Persistence::from_config(&config(&[
                ("appendonly", "yes"),
                ("appendfsync", fsync),
                ("save", ""),
            ]))
        };
        assert_eq!(aof("always").mode(), "aof-always");
        assert!(aof("always").keeps_every_write());
        assert_eq!(aof("everysec").mode(), "aof-everysec");
        assert!(!aof("everysec").keeps_every_write());
        assert_eq!(aof("no").mode(), "aof-no");
        let rdb = Persistence::from_config(&config(&[
            ("appendonly", "no"),
            ("appendfsync", "everysec"),
            ("save", "3600 1 300 100"),
        ]));
        assert_eq!(rdb.mode(), "rdb");
        assert_eq!(rdb.to_string(), "appendonly no, save \"3600 1 300 100\"");
        let none = Persistence::from_config(&config(&[("appendonly", "no"), ("save", "")]));
        assert_eq!(none, Persistence::None);
        assert_eq!(none.loss_on_crash(), "everything");
        assert_eq!(Persistence::from_config(&config(&[])).mode(), "unknown");
        for mode in Persistence::MODES {
            assert!(!mode.is_empty());
        }
    }

    #[test]
    fn info_lines_are_parsed() {
        let info = parse_info(
            "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n",
        );
        assert_eq!(info.get("run_id").map(String::as_str), Some("abc123"));
        assert_eq!(
            info.get("uptime_in_seconds").map(String::as_str),
            Some("42")
        );
        assert!(!info.contains_key("# Server"));
    }
}
