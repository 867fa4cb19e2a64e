//! [`RedisConnection`]: one Redis server or a Redis Cluster, behind the one
//! connection type every crate of the workspace uses.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection to Redis: a reconnecting multiplexed connection to one
/// server, or a connection to a Redis Cluster that routes each command to
/// the primary of its key's hash slot (and follows `MOVED` after a
/// failover). Cheap to clone: clones share the underlying connections.
///
/// Made by [`crate::connect`] from a [`crate::RedisSettings`]: a `url` with
/// one address is a server, a comma-separated list of addresses a cluster
/// ([`crate::REDIS_URL`]). Both connect lazily, on the first command.
///
/// On a cluster every key of one queue shares a hash slot, because the
/// queue's name is a hash tag there ([`crate::QueueNamespace::queue`]), so
/// the queue scripts, which touch several keys of their queue in one call,
/// run on the one primary that holds them.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server.
    Server(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// Whether this is a connection to a Redis Cluster.
    #[must_use]
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(conn: ConnectionManager) -> Self {
        Self::Server(conn)
    }
}

impl From<ClusterConnection> for RedisConnection {
    fn from(conn: ClusterConnection) -> Self {
        Self::Cluster(conn)
    }
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Server(_) => "RedisConnection::Server",
            Self::Cluster(_) => "RedisConnection::Cluster",
        })
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}
