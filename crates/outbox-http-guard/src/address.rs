//! [`is_internal`]: which addresses the guard refuses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// True for addresses a tenant's request must not reach: loopback, private,
/// link-local, shared (CGNAT), benchmarking, documentation, reserved,
/// multicast and unspecified ranges, and IPv6 addresses that embed an IPv4
/// address (mapped, compatible, NAT64, 6to4) whose IPv4 part is internal.
#[must_use]
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || a >= 240 // reserved
                || (a == 100 && (64..=127).contains(&b)) // shared address space (CGNAT)
                || (a == 198 && (b == 18 || b == 19)) // benchmarking
                || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_ipv4(v6) {
                return is_internal(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local
                || (first & 0xffc0) == 0xfe80 // link local
                || (first & 0xffc0) == 0xfec0 // site local (deprecated)
                || first == 0x2001 && v6.segments()[1] == 0x0db8 // documentation
        }
    }
}

/// The IPv4 address an IPv6 address carries, for the forms that route to it:
/// IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64
/// (`64:ff9b::/96`, `64:ff9b:1::/48`) and 6to4 (`2002::/16`).
fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let from =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1) {
        return Some(from(s[6], s[7])); // IPv4-compatible (not :: or ::1)
    }
    if s[0] == 0x0064 && s[1] == 0xff9b {
        return Some(from(s[6], s[7])); // NAT64
    }
    if s[0] == 0x2002 {
        return Some(from(s[1], s[2])); // 6to4
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn internal_addresses_are_recognised() {
        for internal in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fc00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::1",
        ] {
            assert!(is_internal(internal.parse().unwrap()), "{internal}");
        }
        for public in [
            "93.184.216.34",
            "2606:4700::1111",
            "8.8.8.8",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(!is_internal(public.parse().unwrap()), "{public}");
        }
    }
}
