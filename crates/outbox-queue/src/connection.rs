//! [`RedisConnection`]: one Redis server or a Redis Cluster, behind the one
//! connection type every crate of the workspace uses.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection to Redis: a reconnecting multiplexed connection to one
/// server, or a connection to a Redis Cluster that routes each command to
/// the primary of its key's hash slot (and follows `MOVED` after a
/// failover). Cheap to clone: clones share the underlying connections.
///
/// Made by [`crate::connect`] from a [`crate::RedisSettings`]: a `url` with
/// one address is a server, a comma-separated list of addresses (or one
/// address marked `?cluster=true`, [`crate::CLUSTER_MARKER`]) a cluster
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

    /// Sends `cmd` to every primary and returns each answer with the
    /// primary's address (`host:port`); on one server, its one answer with
    /// an empty address. A cluster's primaries are the nodes `CLUSTER
    /// NODES` calls `master` and does not suspect of failing, as one node
    /// sees them now (so a replica promoted after a failover is among
    /// them as soon as the cluster agrees on it).
    ///
    /// # Errors
    ///
    /// When a node does not answer, or `CLUSTER NODES` names no primary.
    pub async fn on_each_primary(
        &mut self,
        cmd: &Cmd,
    ) -> Result<Vec<(String, Value)>, redis::RedisError> {
        let conn = match self {
            Self::Server(conn) => return Ok(vec![(String::new(), cmd.query_async(conn).await?)]),
            Self::Cluster(conn) => conn,
        };
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(conn).await?;
        let primaries = primaries(&nodes);
        if primaries.is_empty() {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "CLUSTER NODES names no primary",
            )));
        }
        let mut answers = Vec::with_capacity(primaries.len());
        for (host, port) in primaries {
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port,
            });
            let answer = conn.route_command(cmd.clone(), routing).await?;
            answers.push((format!("{host}:{port}"), answer));
        }
        Ok(answers)
    }
}

/// The primaries of a `CLUSTER NODES` answer that no node suspects of
/// failing, as (host, port), sorted.
fn primaries(nodes: &str) -> Vec<(String, u16)> {
    let mut primaries: Vec<(String, u16)> = nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let address = fields.nth(1)?;
            let flags = fields.next()?;
            let is_primary = flags.split(',').any(|flag| flag == "master")
                && !flags
                    .split(',')
                    .any(|flag| flag == "fail" || flag == "fail?");
            let (host, port) = address.split(['@', ',']).next()?.rsplit_once(':')?;
            is_primary.then(|| Some((host.to_owned(), port.parse().ok()?)))?
        })
        .collect();
    primaries.sort();
    primaries
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primaries_are_the_masters_no_node_suspects() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master,fail - 0 0 2 connected
c3 127.0.0.1:7002@17002,node-c.example master - 0 0 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 0 1 connected
e5 10.0.0.5:7004@17004 master - 0 0 5 connected 5461-10922
f6 127.0.0.1:7005@17005 master,fail? - 0 0 6 connected
";
        assert_eq!(
            primaries(nodes),
            [
                ("10.0.0.5".to_owned(), 7004),
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7002),
            ]
        );
    }
}
