//! Address networks a configuration names: "192.0.2.0/24", "2001:db8::/48", or one address.
//! An IPv4 peer seen through a dual-stack socket (::ffff:192.0.2.7) is its IPv4 address.

use std::fmt;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// "ADDRESS/PREFIX", or an address alone (the network of that one address). Bits of the
    /// address past the prefix must be zero: "10.1.2.3/8" is more likely a mistake than a
    /// way to write 10.0.0.0/8.
    pub fn parse(s: &str) -> Result<Network, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not an address or a network (192.0.2.0/24, 2001:db8::/48)"))?;
        let addr = canonical(addr);
        let width = bits(addr);
        let prefix = match p {
            None => width,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= width)
                .ok_or_else(|| format!("'{s}': the prefix length must be 0 to {width}"))?,
        };
        let n = Network { addr, prefix };
        if n.masked(addr) != value(addr) {
            return Err(format!(
                "'{s}' has bits set past its prefix; the network is {}",
                Network {
                    addr: from_value(addr, n.masked(addr)),
                    prefix
                }
            ));
        }
        Ok(n)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.addr.is_ipv4() && self.masked(ip) == value(self.addr)
    }

    fn masked(&self, ip: IpAddr) -> u128 {
        let width = bits(ip);
        let v = value(ip);
        match self.prefix {
            0 => 0,
            p => v & (u128::MAX << (width - p)) & (u128::MAX >> (128 - width)),
        }
    }
}

/// Whether `ip` is in one of `networks`; an empty list admits every address.
pub fn admits(networks: &[Network], ip: IpAddr) -> bool {
    networks.is_empty() || networks.iter().any(|n| n.contains(ip))
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn bits(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

fn value(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_value(like: IpAddr, v: u128) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4((v as u32).into()),
        IpAddr::V6(_) => IpAddr::V6(v.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_hold_the_addresses_under_their_prefix() {
        let n = Network::parse("192.0.2.0/24").unwrap();
        assert!(n.contains(ip("192.0.2.0")) && n.contains(ip("192.0.2.255")));
        assert!(!n.contains(ip("192.0.3.0")) && !n.contains(ip("192.0.1.255")));
        assert!(n.contains(ip("::ffff:192.0.2.9")), "seen through a dual-stack socket");
        assert!(!n.contains(ip("2001:db8::1")));
        let one = Network::parse("10.1.2.3").unwrap();
        assert!(one.contains(ip("10.1.2.3")) && !one.contains(ip("10.1.2.4")));
        let v6 = Network::parse("2001:db8:1::/48").unwrap();
        assert!(v6.contains(ip("2001:db8:1:ffff::1")) && !v6.contains(ip("2001:db8:2::1")));
        assert!(!v6.contains(ip("192.0.2.1")));
        let any4 = Network::parse("0.0.0.0/0").unwrap();
        assert!(any4.contains(ip("203.0.113.1")) && !any4.contains(ip("2001:db8::1")));
        let any6 = Network::parse("::/0").unwrap();
        assert!(any6.contains(ip("2001:db8::1")));
        assert!(Network::parse("10.0.0.0/31").unwrap().contains(ip("10.0.0.1")));
        assert!(!Network::parse("10.0.0.0/32").unwrap().contains(ip("10.0.0.1")));
        assert!(admits(&[], ip("198.51.100.1")));
        assert!(!admits(&[n, one], ip("198.51.100.1")));
        assert!(admits(&[n, one], ip("10.1.2.3")));
    }

    #[test]
    fn a_network_written_wrong_is_refused_with_the_reason() {
        for (s, says) in [
            ("10.0.0.0/33", "0 to 32"),
            ("2001:db8::/129", "0 to 128"),
            ("10.0.0/8", "not an address"),
            ("host.example", "not an address"),
            ("10.1.2.3/8", "the network is 10.0.0.0/8"),
            ("10.0.0.0/", "prefix"),
        ] {
            let e = Network::parse(s).unwrap_err();
            assert!(e.contains(says), "{s}: {e}");
        }
    }
}
