//! [`AllowList`]: the internal hosts and ranges a deployment lets requests
//! reach, and [`AllowListError`], why a list was refused.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// The environment variable the worker binaries read an [`AllowList`]
/// from. The guard's refusals name it as the way to allow a target.
pub const ALLOW_LIST_VARIABLE: &str = "OUTBOX_HTTP_ALLOW_INTERNAL_HOSTS";

/// Exceptions to the guard: host names whose addresses may be internal,
/// and IP ranges whose internal addresses may be reached. Every other
/// internal address stays refused.
///
/// Written as a comma-separated list, each item one of:
///
/// - a host name (`crm.internal`): requests to this exact name may
///   connect to whatever it resolves to, internal addresses included.
///   Matching ignores case and a trailing dot; there are no wildcards
///   (`*.internal` is refused), and a sub-domain is another name.
/// - an IP address (`192.168.1.7`, `fd00::1`): that address.
/// - a CIDR range (`10.20.0.0/16`, `fd00::/8`): every address in it. The
///   bits after the prefix must be zero (`10.20.1.0/16` is refused as a
///   likely typo).
///
/// An IPv4-mapped IPv6 address (`::ffff:10.20.0.5`) matches as the IPv4
/// address it carries, and an IPv4-mapped range as its IPv4 range. Other
/// IPv6 forms that embed an IPv4 address (NAT64, 6to4) match IPv6 items
/// only.
///
/// A listed name never widens what other names may reach: the address a
/// request connects to is still the one the guard's resolver checked (see
/// [`GuardedResolver`](crate::GuardedResolver)).
///
/// # Example
///
/// ```
/// use outbox_http_guard::AllowList;
///
/// let list: AllowList = "CRM.internal, 10.20.0.0/16, fd00::/8".parse()?;
/// assert!(list.allows_name("crm.internal"));
/// assert!(!list.allows_name("api.crm.internal"));
/// assert!(list.allows_address("10.20.3.4".parse()?));
/// assert!(list.allows_address("::ffff:10.20.3.4".parse()?));
/// assert!(!list.allows_address("10.21.0.1".parse()?));
/// assert_eq!(list.to_string(), "crm.internal,10.20.0.0/16,fd00::/8");
///
/// assert!("10.0.0.0/33".parse::<AllowList>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct AllowList {
    /// Lower case, without a trailing dot.
    names: Vec<String>,
    ranges: Vec<IpRange>,
}

/// Why an [`AllowList`] was refused; each names the item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllowListError {
    /// An item is empty: two commas in a row, or one at either end.
    #[error("item {position} is empty (two commas in a row, or a comma at either end)")]
    EmptyItem {
        /// Its position in the list, from 1.
        position: usize,
    },
    /// An item with a `/` is not a CIDR range.
    #[error("{item:?} is not a CIDR range: {problem}")]
    InvalidRange {
        /// The item.
        item: String,
        /// What is wrong with it.
        problem: String,
    },
    /// An item is not a host name or an IP address (a URL, a host with a
    /// port, a wildcard…).
    #[error("{item:?} is not a host name, an IP address or a CIDR range: {problem}")]
    NotAHost {
        /// The item.
        item: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl AllowList {
    /// Whether `host` (a URL's host name) is a listed name: exact,
    /// ignoring case and a trailing dot.
    #[must_use]
    pub fn allows_name(&self, host: &str) -> bool {
        let host = host.strip_suffix('.').unwrap_or(host);
        self.names
            .iter()
            .any(|name| name.eq_ignore_ascii_case(host))
    }

    /// Whether `ip` is a listed address or in a listed range.
    #[must_use]
    pub fn allows_address(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|range| range.contains(ip))
    }

    /// Whether the list allows nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.ranges.is_empty()
    }
}

impl FromStr for AllowList {
    type Err = AllowListError;

    /// Reads a comma-separated list; spaces around items are ignored, and
    /// a text of spaces only is the empty list.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut list = Self::default();
        if text.trim().is_empty() {
            return Ok(list);
        }
        for (index, item) in text.split(',').enumerate() {
            match parse_item(item.trim(), index + 1)? {
                Item::Name(name) => list.names.push(name),
                Item::Range(range) => list.ranges.push(range),
            }
        }
        Ok(list)
    }
}

impl fmt::Display for AllowList {
    /// The list as it is read back: names, then ranges (`10.20.0.0/16`;
    /// a single address as itself), comma-separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names.iter().map(|name| name as &dyn fmt::Display);
        let ranges = self.ranges.iter().map(|range| range as &dyn fmt::Display);
        for (index, item) in names.chain(ranges).enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}

enum Item {
    Name(String),
    Range(IpRange),
}

fn parse_item(item: &str, position: usize) -> Result<Item, AllowListError> {
    let not_a_host = |problem: &str| AllowListError::NotAHost {
        item: item.to_owned(),
        problem: problem.to_owned(),
    };
    if item.is_empty() {
        return Err(AllowListError::EmptyItem { position });
    }
    if item.contains("://") {
        return Err(not_a_host("a URL; give its host name only"));
    }
    if let Some((address, prefix)) = item.split_once('/') {
        let Ok(network) = address.parse::<IpAddr>() else {
            return Err(not_a_host(
                "a CIDR range starts with an IP address, and a host name has no path",
            ));
        };
        return IpRange::new(network, prefix)
            .map(Item::Range)
            .map_err(|problem| AllowListError::InvalidRange {
                item: item.to_owned(),
                problem,
            });
    }
    let bare = item
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or(item);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(Item::Range(IpRange::single(ip)));
    }
    if item.contains('*') {
        return Err(not_a_host("wildcards are not supported; list each name"));
    }
    if item.contains(':') {
        return Err(not_a_host("a host name without a port"));
    }
    // The URL parser's reading of a host, so that a name is compared in
    // the form a URL's host takes (lower case, IDNA), and a spelling it
    // reads as an IPv4 address (`127.1`) is that address.
    match url::Host::parse(item) {
        Ok(url::Host::Domain(name)) => {
            let name = name.strip_suffix('.').unwrap_or(&name);
            if name.is_empty() || name.contains("..") {
                return Err(not_a_host("an empty label"));
            }
            Ok(Item::Name(name.to_owned()))
        }
        Ok(url::Host::Ipv4(v4)) => Ok(Item::Range(IpRange::single(v4.into()))),
        Ok(url::Host::Ipv6(v6)) => Ok(Item::Range(IpRange::single(v6.into()))),
        Err(e) => Err(not_a_host(&e.to_string())),
    }
}

/// An IP network: the addresses whose first `prefix` bits are
/// `network`'s. IPv4-mapped IPv6 networks are kept as IPv4 ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct IpRange {
    network: IpAddr,
    prefix: u8,
}

impl IpRange {
    fn single(ip: IpAddr) -> Self {
        let network = canonical(ip);
        Self {
            network,
            prefix: width(network),
        }
    }

    /// The range `network/prefix`, or what is wrong with it.
    fn new(network: IpAddr, prefix: &str) -> Result<Self, String> {
        let max = width(network);
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("the prefix length must be a number from 0 to {max}"))?;
        let (network, prefix) = match network {
            IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), prefix - 96),
                None => (network, prefix),
            },
            _ => (network, prefix),
        };
        let range = Self { network, prefix };
        if bits(network) & !range.mask() != 0 {
            let first = range.first();
            return Err(format!(
                "bits after the prefix are set; the range is {first}/{prefix}"
            ));
        }
        Ok(range)
    }

    /// The mask of the prefix, in the low `width` bits.
    fn mask(self) -> u128 {
        let width = u32::from(width(self.network));
        let ones = if width == 128 {
            u128::MAX
        } else {
            (1u128 << width) - 1
        };
        ones & !(ones.checked_shr(u32::from(self.prefix)).unwrap_or(0))
    }

    /// The first address of the range (the network with the bits after the
    /// prefix cleared).
    fn first(self) -> IpAddr {
        let first = bits(self.network) & self.mask();
        match self.network {
            IpAddr::V4(_) => IpAddr::V4((first as u32).into()),
            IpAddr::V6(_) => IpAddr::V6(first.into()),
        }
    }

    fn contains(self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.network.is_ipv4() && (bits(ip) ^ bits(self.network)) & self.mask() == 0
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix == width(self.network) {
            write!(f, "{}", self.network)
        } else {
            write!(f, "{}/{}", self.network, self.prefix)
        }
    }
}

/// `ip`, with an IPv4-mapped IPv6 address as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

fn width(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn list(text: &str) -> AllowList {
        text.parse().unwrap()
    }

    #[test]
    fn a_name_matches_itself_in_any_case_and_nothing_beside_it() {
        let allowed = list("crm.internal, Billing.Corp.");
        for (host, expected) in [
            ("crm.internal", true),
            ("CRM.Internal", true),
            ("crm.internal.", true),
            ("billing.corp", true),
            ("BILLING.CORP.", true),
            ("api.crm.internal", false),
            ("crm.internal.evil.example", false),
            ("xcrm.internal", false),
            ("crm", false),
            ("internal", false),
            ("corp", false),
        ] {
            assert_eq!(allowed.allows_name(host), expected, "{host}");
        }
        // A name allows no address, an address no name.
        assert!(!allowed.allows_address("10.0.0.1".parse().unwrap()));
        assert!(!list("10.0.0.1").allows_name("10.0.0.1.example"));
    }

    #[test]
    fn addresses_match_the_listed_ranges_and_their_neighbours_do_not() {
        let allowed =
            list("10.20.0.0/16, 192.168.1.7, fd00::/8, ::ffff:172.16.0.0/108, 2001:db8::1");
        for (ip, expected) in [
            // IPv4 range: first, last, and the neighbours on either side.
            ("10.20.0.0", true),
            ("10.20.255.255", true),
            ("10.19.255.255", false),
            ("10.21.0.0", false),
            // One address, and the next one.
            ("192.168.1.7", true),
            ("192.168.1.8", false),
            ("192.168.1.6", false),
            // IPv6 range.
            ("fd00::1", true),
            ("fdff:ffff::1", true),
            ("fc00::1", false),
            ("fe80::1", false),
            // One IPv6 address.
            ("2001:db8::1", true),
            ("2001:db8::2", false),
            // IPv4-mapped IPv6 addresses match as IPv4 ones.
            ("::ffff:10.20.3.4", true),
            ("::ffff:10.21.3.4", false),
            ("::ffff:192.168.1.7", true),
            // An IPv4-mapped range is the IPv4 range 172.16.0.0/12.
            ("172.16.0.1", true),
            ("172.31.255.255", true),
            ("172.32.0.0", false),
            ("::ffff:172.20.0.1", true),
            // Other embeddings of an IPv4 address match IPv6 items only.
            ("64:ff9b::a14:304", false),
            ("2002:a14:304::1", false),
        ] {
            assert_eq!(
                allowed.allows_address(ip.parse().unwrap()),
                expected,
                "{ip}"
            );
        }
    }

    #[test]
    fn prefixes_from_zero_to_the_full_length_match_as_written() {
        assert!(list("0.0.0.0/0").allows_address("127.0.0.1".parse().unwrap()));
        assert!(!list("0.0.0.0/0").allows_address("::1".parse().unwrap()));
        assert!(list("::/0").allows_address("::1".parse().unwrap()));
        assert!(list("128.0.0.0/1").allows_address("255.0.0.1".parse().unwrap()));
        assert!(!list("128.0.0.0/1").allows_address("127.0.0.1".parse().unwrap()));
        assert!(list("127.0.0.2/32").allows_address("127.0.0.2".parse().unwrap()));
        assert!(!list("127.0.0.2/32").allows_address("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn a_list_reads_back_in_its_canonical_form() {
        assert_eq!(
            list(" Crm.Internal ,10.20.0.0/16, [fd00::1],::ffff:10.0.0.0/104, 127.1 ").to_string(),
            "crm.internal,10.20.0.0/16,fd00::1,10.0.0.0/8,127.0.0.1"
        );
        assert!(list("").is_empty());
        assert!(list("  ").is_empty());
        assert!(!list("a.internal").is_empty());
    }

    #[test]
    fn malformed_items_are_refused_naming_the_item() {
        for (text, expected) in [
            (
                "10.0.0.0/33",
                "\"10.0.0.0/33\" is not a CIDR range: the prefix length must be a number from 0 to 32",
            ),
            (
                "fd00::/129",
                "\"fd00::/129\" is not a CIDR range: the prefix length must be a number from 0 to 128",
            ),
            (
                "10.0.0.0/x",
                "\"10.0.0.0/x\" is not a CIDR range: the prefix length must be a number from 0 to 32",
            ),
            (
                "10.20.1.0/16",
                "\"10.20.1.0/16\" is not a CIDR range: bits after the prefix are set; the range is 10.20.0.0/16",
            ),
            ("a.internal,,b.internal", "item 2 is empty"),
            ("a.internal,", "item 2 is empty"),
            (
                "https://crm.internal/api",
                "\"https://crm.internal/api\" is not a host name, an IP address or a CIDR range: a URL; give its host name only",
            ),
            (
                "crm.internal:8080",
                "\"crm.internal:8080\" is not a host name, an IP address or a CIDR range: a host name without a port",
            ),
            (
                "*.internal",
                "\"*.internal\" is not a host name, an IP address or a CIDR range: wildcards are not supported; list each name",
            ),
            (
                "crm.internal/16",
                "\"crm.internal/16\" is not a host name, an IP address or a CIDR range: a CIDR range starts with an IP address, and a host name has no path",
            ),
            ("a b", "\"a b\" is not a host name"),
        ] {
            let error = text.parse::<AllowList>().unwrap_err().to_string();
            assert!(error.starts_with(expected), "{text}: {error}");
        }
    }
}
