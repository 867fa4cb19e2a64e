//! [`RedisCluster`]: a private Redis Cluster of `redis-server` processes.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use crate::RedisProcess;

/// A Redis Cluster on 127.0.0.1: `primaries` primaries with `replicas`
/// replicas each, every node a `redis-server` child process with cluster
/// mode on, joined with `redis-cli --cluster create`. Killed on drop.
///
/// [`RedisCluster::url`] is the cluster form of `REDIS_URL` (every node's
/// URL, separated by commas).
pub struct RedisCluster {
    nodes: Vec<RedisProcess>,
    dir: PathBuf,
}

/// How long a node may be unreachable before the cluster fails it over
/// (`cluster-node-timeout`), in milliseconds: short, so that a test's
/// failover takes about a second.
pub const NODE_TIMEOUT_MS: u64 = 1_000;

impl RedisCluster {
    /// Starts `primaries * (1 + replicas)` nodes, creates the cluster and
    /// waits until every node reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// When `redis-server` or `redis-cli` is missing, no free ports are
    /// found, or the cluster does not form within 30 s.
    pub async fn start(primaries: usize, replicas: usize) -> Self {
        assert!(primaries >= 3, "a Redis Cluster needs at least 3 primaries");
        let count = primaries * (1 + replicas);
        let dir = std::env::temp_dir().join(format!(
            "outbox-redis-cluster-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let mut nodes = Vec::with_capacity(count);
        for port in free_cluster_ports(count) {
            let node_dir = dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", node_dir.display()));
            let node_dir = node_dir.display().to_string();
            let timeout = NODE_TIMEOUT_MS.to_string();
            let args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &timeout,
                "--dir",
                &node_dir,
                "--maxmemory-policy",
                "noeviction",
                // A replica's first sync at once, not after Redis' 5 s.
                "--repl-diskless-sync-delay",
                "0",
            ];
            nodes.push(RedisProcess::start_on(port, &args).await);
        }
        let cluster = Self { nodes, dir };
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let output = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli (install redis-tools): {e}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait_until_ok(Duration::from_secs(30)).await;
        cluster
            .wait_until_replicas_synced(Duration::from_secs(30))
            .await;
        cluster
    }

    /// Waits until every live replica has finished its sync with its
    /// primary (`master_link_status:up`): before that a replica cannot take
    /// over its primary's slots.
    ///
    /// # Panics
    ///
    /// When that takes longer than `within`.
    pub async fn wait_until_replicas_synced(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let mut synced = true;
            for node in self.nodes.iter().filter(|node| node.is_running()) {
                let info = node_command(node, "INFO", "replication")
                    .await
                    .unwrap_or_default();
                if info.contains("role:slave") && !info.contains("master_link_status:up") {
                    synced = false;
                }
            }
            if synced {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the Redis cluster's replicas did not sync within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `REDIS_URL` for the cluster: every live node's URL, separated by
    /// commas.
    #[must_use]
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .filter(|node| node.is_running())
            .map(RedisProcess::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes, in the order they were started.
    #[must_use]
    pub fn nodes(&self) -> &[RedisProcess] {
        &self.nodes
    }

    /// The ports of the nodes that are primaries now, as `CLUSTER NODES`
    /// on a live node reports them (sorted).
    ///
    /// # Panics
    ///
    /// When no live node answers.
    pub async fn primary_ports(&self) -> Vec<u16> {
        let nodes = self.cluster_nodes().await;
        let mut ports: Vec<u16> = nodes
            .lines()
            .filter(|line| {
                let flags = line.split(' ').nth(2).unwrap_or_default();
                flags.contains("master") && !flags.contains("fail")
            })
            .filter_map(|line| {
                let address = line.split(' ').nth(1)?;
                let port = address.split('@').next()?.rsplit(':').next()?;
                port.parse().ok()
            })
            .collect();
        ports.sort_unstable();
        ports
    }

    /// Kills the node on `port` (`SIGKILL`): its replica takes over its
    /// slots after [`NODE_TIMEOUT_MS`] and an election.
    ///
    /// # Panics
    ///
    /// When no node of the cluster listens on `port`.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.port() == port)
            .unwrap_or_else(|| panic!("no node of the cluster on port {port}"));
        node.stop();
    }

    /// Waits until every live node reports `cluster_state:ok` (all slots
    /// served), as after a failover.
    ///
    /// # Panics
    ///
    /// When that takes longer than `within`.
    pub async fn wait_until_ok(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let mut all_ok = true;
            for node in self.nodes.iter().filter(|node| node.is_running()) {
                let info = node_command(node, "CLUSTER", "INFO").await;
                all_ok &= info.is_some_and(|info| info.contains("cluster_state:ok"));
            }
            if all_ok {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the Redis cluster did not reach cluster_state:ok within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn cluster_nodes(&self) -> String {
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            if let Some(nodes) = node_command(node, "CLUSTER", "NODES").await {
                return nodes;
            }
        }
        panic!("no node of the Redis cluster answers");
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCluster")
            .field(
                "ports",
                &self
                    .nodes
                    .iter()
                    .map(RedisProcess::port)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

async fn node_command(node: &RedisProcess, command: &str, arg: &str) -> Option<String> {
    let mut conn = node
        .client()
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    redis::cmd(command)
        .arg(arg)
        .query_async::<String>(&mut conn)
        .await
        .ok()
}

/// `count` ports whose cluster bus port (`port + 10000`) is free too. They
/// are taken below 30000, away from the kernel's ephemeral range, so that
/// the bus port exists and no outgoing connection takes either meanwhile.
fn free_cluster_ports(count: usize) -> Vec<u16> {
    // Each process starts at its own place, and each cluster of a process
    // further on, so that clusters started at once do not race for ports.
    static STARTED: AtomicU16 = AtomicU16::new(0);
    let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
    let nth = STARTED.fetch_add(1, Ordering::Relaxed);
    let start = 20_000 + ((std::process::id() % 400) as u16 * 24 + nth * 8) % 10_000;
    let mut ports = Vec::with_capacity(count);
    let mut port = start;
    while ports.len() < count {
        if port >= 30_000 {
            port = 20_000;
        }
        if free(port) && free(port + 10_000) {
            ports.push(port);
        }
        port += 1;
        assert!(
            port != start,
            "no free ports for a Redis cluster between 20000 and 30000"
        );
    }
    ports
}
