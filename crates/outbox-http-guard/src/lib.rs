//! The outbound-HTTP address guard: requests a tenant can aim (webhook and
//! plugin deliveries, workflow `httpRequest` blocks) must not reach the
//! deployment's internal services.
//!
//! - [`is_internal`]: the rule, loopback, private, link-local and other
//!   non-public ranges, IPv4 addresses embedded in IPv6 included.
//! - [`GuardedResolver`]: a resolver that drops internal addresses, but
//!   those of an [`AllowList`].
//! - [`GuardedClient`]: a `reqwest` client built so that the address
//!   checked is the address connected to. Its resolver is the
//!   [`GuardedResolver`] and is the only resolution a request makes, so a
//!   name cannot answer a public address to a check and an internal one to
//!   the connection (DNS rebinding). URLs whose host is an IP literal never
//!   reach a resolver; [`GuardedClient::request`] checks them with
//!   [`check_url`] before any request is built. The client ignores proxies
//!   from the environment (a proxy would resolve the target itself) and
//!   follows no redirects (a redirect would name a target nobody checked).
//!
//! [`AddressPolicy::AllowListed`] makes exceptions, an [`AllowList`] of
//! host names that may resolve to internal addresses and of IP ranges
//! whose internal addresses may be reached; every other internal address
//! stays refused. [`AddressPolicy::AllowInternal`] lifts the address
//! checks (tests, demos, trusted deployments). Under every policy proxies
//! and redirects stay off.
//!
//! Why the guard refused is a [`GuardError`]; [`GuardError::find`] finds it
//! in the error of a failed request (a refusal by the resolver).

mod address;
mod allow;
mod client;
mod error;
mod resolver;

pub use address::is_internal;
pub use allow::{ALLOW_LIST_VARIABLE, AllowList, AllowListError};
pub use client::{
    AddressPolicy, GuardedClient, OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS,
    WEBHOOK_ALLOW_PRIVATE_ADDRESSES, check_url,
};
pub use error::GuardError;
pub use resolver::GuardedResolver;
