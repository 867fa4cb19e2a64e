//! [`GuardedResolver`]: name resolution that drops internal addresses.

use std::net::SocketAddr;
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::{AllowList, GuardError, is_internal};

/// A `reqwest` resolver that resolves with the system resolver and drops
/// internal addresses ([`is_internal`]) but those its [`AllowList`]
/// allows; a name with no address left fails with
/// [`GuardError::OnlyInternalAddresses`]. A name the list names keeps
/// every address it resolved to. Installed as a client's resolver it is
/// the resolution the connection uses, so what it let through is what is
/// connected to.
#[derive(Clone, Default)]
pub struct GuardedResolver {
    /// Resolves instead of the system resolver (tests of the guard).
    inner: Option<Arc<dyn Resolve>>,
    /// The exceptions (none by default).
    allowed: Arc<AllowList>,
}

impl GuardedResolver {
    /// The guard over the system resolver, with no exceptions.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// This guard, letting through the names and addresses `allowed`
    /// allows.
    #[must_use]
    pub fn allowing(self, allowed: AllowList) -> Self {
        Self {
            allowed: Arc::new(allowed),
            ..self
        }
    }

    /// The guard over `inner` (a resolver whose answers the tests choose).
    #[cfg(test)]
    pub(crate) fn over(inner: Arc<dyn Resolve>) -> Self {
        Self {
            inner: Some(inner),
            ..Self::default()
        }
    }
}

impl std::fmt::Debug for GuardedResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedResolver").finish_non_exhaustive()
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let inner = self.inner.clone();
        let allowed = Arc::clone(&self.allowed);
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = match inner {
                Some(inner) => inner.resolve(name).await?.collect(),
                None => tokio::net::lookup_host((host.as_str(), 0)).await?.collect(),
            };
            if addrs.is_empty() {
                return Err(format!("{host} has no address").into());
            }
            if allowed.allows_name(&host) {
                return Ok(Box::new(addrs.into_iter()) as Addrs);
            }
            let reachable: Vec<SocketAddr> = addrs
                .into_iter()
                .filter(|a| !is_internal(a.ip()) || allowed.allows_address(a.ip()))
                .collect();
            if reachable.is_empty() {
                return Err(GuardError::OnlyInternalAddresses { host }.into());
            }
            Ok(Box::new(reachable.into_iter()) as Addrs)
        })
    }
}
