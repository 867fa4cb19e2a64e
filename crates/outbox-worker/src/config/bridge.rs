//! [`BridgeConfig`]: what the `workflow-bridge` process reads, composed of
//! the libraries' definitions (the bridge crate's address and secrets, the
//! pool, the address guard) and the worker's shutdown grace.

use std::net::SocketAddr;
use std::time::Duration;

use outbox_http_guard::AddressPolicy;
use outbox_queue::redact_url;
use outbox_workflow_bridge::{
    BridgeSecret, WORKFLOW_BRIDGE_ADDR, WORKFLOW_BRIDGE_PREVIOUS_SECRET, WORKFLOW_BRIDGE_SECRET,
};

use super::{ConfigError, WORKER_SHUTDOWN_GRACE_MS, database_url};

/// Everything the `workflow-bridge` process needs.
#[derive(Clone)]
pub struct BridgeConfig {
    /// `DATABASE_URL`.
    pub database_url: String,
    /// `WORKFLOW_BRIDGE_ADDR` ([`crate::DEFAULT_BRIDGE_ADDR`]): the bridge
    /// and its `/healthz`, `/readyz`, `/metrics`.
    pub addr: SocketAddr,
    /// `WORKFLOW_BRIDGE_SECRET`, then `WORKFLOW_BRIDGE_PREVIOUS_SECRET` when
    /// set (accepted during a key rotation).
    pub secrets: Vec<BridgeSecret>,
    /// `DATABASE_POOL_SIZE`.
    pub pool_size: u32,
    /// Which internal addresses `httpRequest` blocks may call
    /// (`WEBHOOK_ALLOW_PRIVATE_ADDRESSES`, `OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS`,
    /// as [`crate::WorkerConfig::address_policy`]).
    pub address_policy: AddressPolicy,
    /// `WORKER_SHUTDOWN_GRACE_MS`: how long requests in progress may take
    /// after SIGTERM.
    pub shutdown_grace: Duration,
    /// `WORKFLOW_RUN_LEASE_MS`: the lease the bridge's runner holds runs
    /// with (as the workers').
    pub workflow_lease: Duration,
}

impl std::fmt::Debug for BridgeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeConfig")
            .field("database_url", &redact_url(&self.database_url))
            .field("addr", &self.addr)
            .field("secrets", &self.secrets.len())
            .field("pool_size", &self.pool_size)
            .field("address_policy", &self.address_policy)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("workflow_lease", &self.workflow_lease)
            .finish()
    }
}

impl BridgeConfig {
    /// Reads the process environment.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`].
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads variables through `get`.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`].
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let database_url = database_url(get)?;
        let addr_text = WORKFLOW_BRIDGE_ADDR
            .read(get)
            .unwrap_or_else(|| WORKFLOW_BRIDGE_ADDR.default.to_owned());
        let addr = addr_text.trim().parse().map_err(|_| {
            WORKFLOW_BRIDGE_ADDR.refuse(
                addr_text.clone(),
                format!("is not an address like {}", WORKFLOW_BRIDGE_ADDR.default),
            )
        })?;
        // Required here, unlike in the workers.
        WORKFLOW_BRIDGE_SECRET.required(get)?;
        let secrets = BridgeSecret::from_lookup(&WORKFLOW_BRIDGE_SECRET, get)?
            .into_iter()
            .chain(BridgeSecret::from_lookup(
                &WORKFLOW_BRIDGE_PREVIOUS_SECRET,
                get,
            )?)
            .collect();
        Ok(Self {
            database_url,
            addr,
            secrets,
            pool_size: outbox_pg::DATABASE_POOL_SIZE.read_as(get)?,
            address_policy: AddressPolicy::from_lookup(get)?,
            shutdown_grace: WORKER_SHUTDOWN_GRACE_MS.read_millis(get)?,
            workflow_lease: outbox_workflow_store::sweep::WORKFLOW_RUN_LEASE_MS.read_millis(get)?,
        })
    }
}
