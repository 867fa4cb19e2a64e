//! [`GuardError`]: why the guard refused a target.

use std::net::IpAddr;

/// Why the guard refused a target. A refusal is permanent: retrying the
/// same URL is refused again. The messages name the host or address, never
/// the URL's path or query (which may hold a token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// Only `http` and `https` URLs are requested.
    #[error("unsupported URL scheme {scheme:?}")]
    UnsupportedScheme {
        /// The URL's scheme.
        scheme: String,
    },
    /// The URL has no host to connect to.
    #[error("the URL has no host")]
    NoHost,
    /// The URL's host is an internal IP literal the policy does not allow.
    #[error(
        "{ip} is an internal address; refused (list it or its range in {} to allow it)",
        crate::ALLOW_LIST_VARIABLE
    )]
    InternalAddress {
        /// The address, as the URL gave it.
        ip: IpAddr,
    },
    /// Every address the host resolved to is internal, and neither the
    /// name nor those addresses are allowed.
    #[error(
        "{host} resolves only to internal addresses; refused (list the name in {} to allow it)",
        crate::ALLOW_LIST_VARIABLE
    )]
    OnlyInternalAddresses {
        /// The host name.
        host: String,
    },
}

impl GuardError {
    /// The refusal in `error` or its chain of sources: how a request that
    /// failed because the [`GuardedResolver`](crate::GuardedResolver)
    /// refused its host is told apart from a network failure.
    #[must_use]
    pub fn find<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut current = Some(error);
        while let Some(error) = current {
            if let Some(refusal) = error.downcast_ref::<Self>() {
                return Some(refusal);
            }
            current = error.source();
        }
        None
    }
}
