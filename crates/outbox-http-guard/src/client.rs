//! [`GuardedClient`]: a `reqwest` client whose requests pass the guard, and
//! [`check_url`], the check of a URL before any request.

use std::net::IpAddr;
use std::sync::Arc;

use outbox_env::{Flag, Text, VariableError};
use reqwest::{ClientBuilder, Method, RequestBuilder};
use url::{Host, Url};

use crate::{ALLOW_LIST_VARIABLE, AllowList, GuardError, GuardedResolver, is_internal};

/// `WEBHOOK_ALLOW_PRIVATE_ADDRESSES`: [`AddressPolicy::AllowInternal`]
/// when true.
pub const WEBHOOK_ALLOW_PRIVATE_ADDRESSES: Flag = Flag {
    name: "WEBHOOK_ALLOW_PRIVATE_ADDRESSES",
    default: false,
    meaning: "allow loopback, private and link-local targets of webhooks, plugins and workflow HTTP blocks (tests, demos)",
};

/// `OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS` ([`ALLOW_LIST_VARIABLE`]): the
/// [`AllowList`] of [`AddressPolicy::AllowListed`].
pub const OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS: Text = Text {
    name: ALLOW_LIST_VARIABLE,
    default: "unset (no internal target allowed)",
    form: "comma-separated host names, IP addresses and CIDR ranges: crm.internal,10.20.0.0/16,fd00::/8",
    meaning: "internal targets webhooks, plugins and workflow HTTP blocks may reach: a listed name may resolve to internal addresses, an internal address in a listed range may be reached; every other internal address stays refused",
};

/// Which internal addresses the guard lets requests reach.
///
/// ```
/// use outbox_http_guard::{AddressPolicy, AllowList};
///
/// // The settings of a deployment: no blanket switch, two exceptions.
/// let listed: AllowList = "crm.internal,10.20.0.0/16".parse()?;
/// let policy = AddressPolicy::from_settings(false, listed);
/// assert!(policy.allows_address("10.20.0.9".parse()?));
/// assert!(!policy.allows_address("10.30.0.9".parse()?));
/// assert!(policy.allows_address("93.184.216.34".parse()?)); // public
///
/// // Nothing listed is the production default.
/// assert_eq!(
///     AddressPolicy::from_settings(false, AllowList::default()),
///     AddressPolicy::PublicOnly
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum AddressPolicy {
    /// Internal addresses are refused (production).
    #[default]
    PublicOnly,
    /// Internal addresses are refused except those the list allows: the
    /// names it lists may resolve to internal addresses, and internal
    /// addresses in its ranges may be reached (see [`AllowList`]).
    AllowListed(AllowList),
    /// Internal addresses may be reached: the address checks are lifted
    /// (tests, demos, trusted deployments). Proxies from the environment
    /// and redirects stay off.
    AllowInternal,
}

impl AddressPolicy {
    /// [`AllowInternal`](Self::AllowInternal) when `allow`, else
    /// [`PublicOnly`](Self::PublicOnly): the policy of a setting such as
    /// `WEBHOOK_ALLOW_PRIVATE_ADDRESSES`.
    #[must_use]
    pub const fn allow_internal(allow: bool) -> Self {
        if allow {
            Self::AllowInternal
        } else {
            Self::PublicOnly
        }
    }

    /// The policy of the two settings:
    /// [`AllowInternal`](Self::AllowInternal) when `allow_all`
    /// (`WEBHOOK_ALLOW_PRIVATE_ADDRESSES`), else
    /// [`AllowListed`](Self::AllowListed) with `listed` (the list of
    /// [`ALLOW_LIST_VARIABLE`](crate::ALLOW_LIST_VARIABLE)), or
    /// [`PublicOnly`](Self::PublicOnly) when it is empty.
    #[must_use]
    pub fn from_settings(allow_all: bool, listed: AllowList) -> Self {
        if allow_all {
            Self::AllowInternal
        } else if listed.is_empty() {
            Self::PublicOnly
        } else {
            Self::AllowListed(listed)
        }
    }

    /// The policy of [`WEBHOOK_ALLOW_PRIVATE_ADDRESSES`] and
    /// [`OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS`] read through `get`, as
    /// [`AddressPolicy::from_settings`] makes it. The list is read even
    /// when the switch is on, so that a malformed one stops start-up either
    /// way.
    ///
    /// ```
    /// use outbox_http_guard::AddressPolicy;
    ///
    /// let get = |name: &str| match name {
    ///     "OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS" => Some("crm.internal,10.0.0.0/33".to_owned()),
    ///     _ => None,
    /// };
    /// let error = AddressPolicy::from_lookup(&get).unwrap_err();
    /// assert_eq!(error.variable, "OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS");
    /// assert_eq!(AddressPolicy::from_lookup(&|_| None)?, AddressPolicy::PublicOnly);
    /// # Ok::<(), outbox_env::VariableError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`VariableError`] naming the variable: a switch that is not true
    /// or false, or a list item that is refused (the message names it).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, VariableError> {
        let allow_all = WEBHOOK_ALLOW_PRIVATE_ADDRESSES.read(get)?;
        let listed = match OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS.read(get) {
            None => AllowList::default(),
            Some(value) => value.parse().map_err(|e: crate::AllowListError| {
                OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS.refuse(value.clone(), e.to_string())
            })?,
        };
        Ok(Self::from_settings(allow_all, listed))
    }

    /// Whether every internal address may be reached.
    #[must_use]
    pub const fn allows_internal(&self) -> bool {
        matches!(self, Self::AllowInternal)
    }

    /// Whether a request may connect to `ip`: a public address, or an
    /// internal one the policy allows.
    #[must_use]
    pub fn allows_address(&self, ip: IpAddr) -> bool {
        !is_internal(ip)
            || match self {
                Self::PublicOnly => false,
                Self::AllowListed(listed) => listed.allows_address(ip),
                Self::AllowInternal => true,
            }
    }
}

/// Checks what can be checked of `url` before a request: the scheme is
/// `http` or `https`, there is a host, and a host that is an IP literal
/// (which no resolver sees) is an address `policy` allows
/// ([`AddressPolicy::allows_address`]). IPv4 literals in any form the URL
/// standard accepts (`127.1`, `0x7f.0.0.1`, `2130706433`) and IPv6
/// literals embedding an IPv4 address (`[::ffff:127.0.0.1]`) are covered.
/// A host name is checked when it is resolved, by the [`GuardedResolver`].
///
/// # Errors
///
/// [`GuardError::UnsupportedScheme`], [`GuardError::NoHost`],
/// [`GuardError::InternalAddress`].
pub fn check_url(url: &Url, policy: &AddressPolicy) -> Result<(), GuardError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(GuardError::UnsupportedScheme {
            scheme: url.scheme().to_owned(),
        });
    }
    let ip = match url.host().ok_or(GuardError::NoHost)? {
        Host::Domain(_) => return Ok(()),
        Host::Ipv4(v4) => v4.into(),
        Host::Ipv6(v6) => v6.into(),
    };
    if !policy.allows_address(ip) {
        return Err(GuardError::InternalAddress { ip });
    }
    Ok(())
}

/// A `reqwest` client behind the address guard. Cheap to clone (the
/// connection pool is shared).
///
/// Unless its policy is [`AddressPolicy::AllowInternal`], its resolver is
/// the [`GuardedResolver`] (with the policy's [`AllowList`]), the only
/// resolution its requests make, and [`request`](Self::request) refuses
/// internal IP literals the policy does not allow with [`check_url`].
/// Under every policy it uses no proxy and follows no redirects (a 3xx is
/// the response).
#[derive(Debug, Clone)]
pub struct GuardedClient {
    client: reqwest::Client,
    policy: AddressPolicy,
}

impl GuardedClient {
    /// A client with `reqwest`'s defaults and the guard.
    ///
    /// # Errors
    ///
    /// When the client cannot be built (TLS initialisation).
    pub fn new(policy: AddressPolicy) -> Result<Self, reqwest::Error> {
        Self::with_builder(policy, |builder| builder)
    }

    /// A client configured by `configure` (timeouts, user agent…), then
    /// guarded: the guard's settings (resolver, no proxy, no redirects) are
    /// applied after `configure`, so it cannot lift them. `configure` must
    /// not add `resolve` overrides, which `reqwest` applies on top of any
    /// resolver.
    ///
    /// # Errors
    ///
    /// When the client cannot be built (TLS initialisation).
    pub fn with_builder(
        policy: AddressPolicy,
        configure: impl FnOnce(ClientBuilder) -> ClientBuilder,
    ) -> Result<Self, reqwest::Error> {
        Self::build(policy, GuardedResolver::new(), configure)
    }

    fn build(
        policy: AddressPolicy,
        resolver: GuardedResolver,
        configure: impl FnOnce(ClientBuilder) -> ClientBuilder,
    ) -> Result<Self, reqwest::Error> {
        let mut builder = configure(reqwest::Client::builder())
            // A proxy would resolve the target itself, past the resolver.
            .no_proxy()
            // A redirect would lead to a target nobody checked.
            .redirect(reqwest::redirect::Policy::none());
        match &policy {
            AddressPolicy::AllowInternal => {}
            AddressPolicy::PublicOnly => builder = builder.dns_resolver(Arc::new(resolver)),
            AddressPolicy::AllowListed(listed) => {
                builder = builder.dns_resolver(Arc::new(resolver.allowing(listed.clone())));
            }
        }
        Ok(Self {
            client: builder.build()?,
            policy,
        })
    }

    /// The policy the client was built with.
    #[must_use]
    pub fn policy(&self) -> &AddressPolicy {
        &self.policy
    }

    /// A `method` request to `url`, once `url` passed [`check_url`]. A host
    /// name resolving only to internal addresses fails when the request is
    /// sent; [`GuardError::find`] finds the refusal in that error.
    ///
    /// # Errors
    ///
    /// The refusal of [`check_url`]; nothing was sent.
    pub fn request(&self, method: Method, url: Url) -> Result<RequestBuilder, GuardError> {
        check_url(&url, &self.policy)?;
        Ok(self.client.request(method, url))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::net::{IpAddr, SocketAddr};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use outbox_test_support::HttpSink;
    use reqwest::dns::{Addrs, Name, Resolve, Resolving};

    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    /// The guard's refusal of a GET of `target`, which passes
    /// [`check_url`] and fails when sent.
    async fn refusal_on_send(client: &GuardedClient, target: Url) -> GuardError {
        let error = client
            .request(Method::GET, target)
            .unwrap()
            .send()
            .await
            .unwrap_err();
        GuardError::find(&error)
            .unwrap_or_else(|| panic!("not a refusal: {error:?}"))
            .clone()
    }

    #[test]
    fn literal_internal_addresses_are_refused_in_every_spelling() {
        for (text, ip) in [
            ("http://127.0.0.1:9/hook", "127.0.0.1"),
            ("http://127.1/", "127.0.0.1"),
            ("http://2130706433/", "127.0.0.1"),
            ("http://0x7f.0.0.1/", "127.0.0.1"),
            ("https://10.0.0.7/", "10.0.0.7"),
            ("http://169.254.169.254/latest/meta-data", "169.254.169.254"),
            ("http://[::1]:8080/", "::1"),
            ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
            ("http://[fd00::1]/", "fd00::1"),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(
                check_url(&url(text), &AddressPolicy::PublicOnly),
                Err(GuardError::InternalAddress { ip }),
                "{text}"
            );
            assert_eq!(check_url(&url(text), &AddressPolicy::AllowInternal), Ok(()));
        }
        for public in [
            "https://hooks.example.com/x?token=t",
            "http://93.184.216.34/",
            "http://[2606:4700::1111]/",
            "http://localhost/",
        ] {
            assert_eq!(check_url(&url(public), &AddressPolicy::PublicOnly), Ok(()));
        }
        for policy in [AddressPolicy::PublicOnly, AddressPolicy::AllowInternal] {
            assert_eq!(
                check_url(&url("ftp://example.com/x"), &policy),
                Err(GuardError::UnsupportedScheme {
                    scheme: "ftp".into()
                })
            );
            assert_eq!(
                check_url(&url("file:///etc/passwd"), &policy),
                Err(GuardError::UnsupportedScheme {
                    scheme: "file".into()
                })
            );
        }
    }

    #[tokio::test]
    async fn a_literal_internal_url_gets_no_request() {
        let sink = HttpSink::start().await;
        let client = GuardedClient::new(AddressPolicy::PublicOnly).unwrap();
        for target in [
            sink.url_for("/hook"),
            format!("http://[::ffff:127.0.0.1]:{}/hook", sink.port()),
        ] {
            let refused = client.request(Method::POST, url(&target)).unwrap_err();
            assert!(
                matches!(refused, GuardError::InternalAddress { .. }),
                "{refused}"
            );
        }
        assert!(sink.requests().is_empty());
    }

    #[tokio::test]
    async fn a_name_of_an_internal_address_is_refused_unless_allowed() {
        let sink = HttpSink::start().await;
        let target = url(&format!("http://localhost:{}/hook", sink.port()));

        let guarded = GuardedClient::new(AddressPolicy::PublicOnly).unwrap();
        assert_eq!(
            refusal_on_send(&guarded, target.clone()).await,
            GuardError::OnlyInternalAddresses {
                host: "localhost".into()
            }
        );
        assert!(sink.requests().is_empty());

        let open = GuardedClient::new(AddressPolicy::AllowInternal).unwrap();
        let response = open
            .request(Method::GET, target)
            .unwrap()
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(sink.requests_to("/hook").len(), 1);
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let sink = HttpSink::start().await;
        sink.respond("/moved", vec![302]);
        let client = GuardedClient::new(AddressPolicy::AllowInternal).unwrap();
        let response = client
            .request(Method::GET, url(&sink.url_for("/moved")))
            .unwrap()
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 302);
        assert_eq!(sink.requests().len(), 1);
    }

    /// DNS under an attacker's control: the first answer for any name is a
    /// public address, every later one the loopback address (DNS
    /// rebinding, with a zero TTL).
    #[derive(Default)]
    struct Rebinding {
        answers: AtomicUsize,
    }

    impl Resolve for Rebinding {
        fn resolve(&self, _name: Name) -> Resolving {
            let ip: IpAddr = if self.answers.fetch_add(1, Ordering::SeqCst) == 0 {
                [93, 184, 216, 34].into()
            } else {
                [127, 0, 0, 1].into()
            };
            Box::pin(async move { Ok(Box::new(std::iter::once(SocketAddr::new(ip, 0))) as Addrs) })
        }
    }

    async fn first_answer(dns: &Rebinding, host: &str) -> IpAddr {
        let mut addrs = dns.resolve(host.parse().unwrap()).await.unwrap();
        addrs.next().unwrap().ip()
    }

    #[tokio::test]
    async fn the_address_checked_is_the_address_connected_to() {
        let sink = HttpSink::start().await;
        let target = url(&format!("http://rebind.test:{}/hook", sink.port()));

        // Checking a name, then letting the client resolve it again, is
        // fooled: the check sees a public address, the connection goes to
        // the loopback sink.
        let dns = Arc::new(Rebinding::default());
        assert!(!is_internal(first_answer(&dns, "rebind.test").await));
        let unguarded = reqwest::Client::builder()
            .no_proxy()
            .dns_resolver(Arc::clone(&dns))
            .build()
            .unwrap();
        let response = unguarded.get(target.clone()).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(sink.requests_to("/hook").len(), 1);

        // The guarded client checks the answer its connection uses.
        let dns = Arc::new(Rebinding::default());
        assert!(!is_internal(first_answer(&dns, "rebind.test").await));
        let guarded = GuardedClient::build(
            AddressPolicy::PublicOnly,
            GuardedResolver::over(dns),
            |builder| builder,
        )
        .unwrap();
        assert_eq!(
            refusal_on_send(&guarded, target).await,
            GuardError::OnlyInternalAddresses {
                host: "rebind.test".into()
            }
        );
        assert_eq!(sink.requests_to("/hook").len(), 1, "no second request");
    }

    #[tokio::test]
    async fn an_allow_listed_name_opens_nothing_for_other_names() {
        let sink = HttpSink::start().await;
        let target = url(&format!("http://rebind.test:{}/hook", sink.port()));
        let listed: AllowList = "crm.internal,10.0.0.0/8".parse().unwrap();
        let dns = Arc::new(Rebinding::default());
        assert!(!is_internal(first_answer(&dns, "rebind.test").await));
        let guarded = GuardedClient::build(
            AddressPolicy::from_settings(false, listed),
            GuardedResolver::over(dns),
            |builder| builder,
        )
        .unwrap();
        assert_eq!(
            refusal_on_send(&guarded, target).await,
            GuardError::OnlyInternalAddresses {
                host: "rebind.test".into()
            }
        );
        assert!(sink.requests().is_empty());
    }

    #[test]
    fn the_policy_follows_the_settings() {
        assert_eq!(
            AddressPolicy::allow_internal(false),
            AddressPolicy::PublicOnly
        );
        assert_eq!(
            AddressPolicy::allow_internal(true),
            AddressPolicy::AllowInternal
        );
        assert_eq!(AddressPolicy::default(), AddressPolicy::PublicOnly);
        let listed: AllowList = "10.0.0.0/8".parse().unwrap();
        for (allow_all, list, expected) in [
            (false, AllowList::default(), AddressPolicy::PublicOnly),
            (
                false,
                listed.clone(),
                AddressPolicy::AllowListed(listed.clone()),
            ),
            (true, listed.clone(), AddressPolicy::AllowInternal),
            (true, AllowList::default(), AddressPolicy::AllowInternal),
        ] {
            assert_eq!(
                AddressPolicy::from_settings(allow_all, list),
                expected,
                "{allow_all}"
            );
        }
    }

    #[test]
    fn literal_addresses_pass_when_public_or_allowed() {
        let policy = AddressPolicy::from_settings(false, "10.20.0.0/16,fd00::/8".parse().unwrap());
        for (text, allowed) in [
            ("http://10.20.0.7/", true),
            ("http://[::ffff:10.20.0.7]/", true),
            ("http://[fd00::7]/", true),
            ("http://93.184.216.34/", true),
            ("http://10.21.0.7/", false),
            ("http://127.0.0.1/", false),
            ("http://[fe80::1]/", false),
        ] {
            let checked = check_url(&url(text), &policy);
            assert_eq!(checked.is_ok(), allowed, "{text}: {checked:?}");
        }
    }
}
