//! Client address allow-list: networks in CIDR notation, checked when a
//! TCP connection is accepted (Unix socket clients are always allowed:
//! the socket file's mode guards them). Nothing here does I/O.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IP network: an address and a prefix length (`10.0.0.0/8`,
/// `::1/128`; a bare address means just that host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Whether `ip` lies in this network. An IPv4-mapped IPv6 address
    /// (`::ffff:a.b.c.d`, what a dual-stack listener reports) is checked
    /// as the IPv4 address it carries.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                prefix_eq(&net.octets(), &a.octets(), u32::from(self.prefix))
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                prefix_eq(&net.octets(), &a.octets(), u32::from(self.prefix))
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u32) -> bool {
    let full = (bits / 8) as usize;
    if a[..full] != b[..full] {
        return false;
    }
    let rest = bits % 8;
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    a[full] & mask == b[full] & mask
}

impl FromStr for IpNet {
    type Err = String;
    fn from_str(s: &str) -> Result<IpNet, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{s:?}: not an IP address or network (a.b.c.d/len)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: prefix length must be 0..={max}"))?,
        };
        Ok(IpNet { addr, prefix })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_match_by_prefix() {
        assert!(net("127.0.0.1").contains(ip("127.0.0.1")));
        assert!(!net("127.0.0.1").contains(ip("127.0.0.2")));
        assert!(net("10.0.0.0/8").contains(ip("10.255.1.2")));
        assert!(!net("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(net("192.168.4.0/22").contains(ip("192.168.7.255")));
        assert!(!net("192.168.4.0/22").contains(ip("192.168.8.0")));
        assert!(net("0.0.0.0/0").contains(ip("8.8.8.8")));
        assert!(!net("0.0.0.0/0").contains(ip("::1")));
        assert!(net("::1").contains(ip("::1")));
        assert!(net("fd00::/8").contains(ip("fd12:3456::1")));
        assert!(!net("fd00::/8").contains(ip("fe80::1")));
        // Dual-stack listeners report IPv4 clients as mapped addresses.
        assert!(net("127.0.0.0/8").contains(ip("::ffff:127.0.0.5")));
        assert_eq!(net("10.1.2.3/8").to_string(), "10.1.2.3/8");
    }

    #[test]
    fn bad_networks_are_refused() {
        for s in ["", "10.0.0.0/33", "::/129", "10.0.0/8", "host", "1.2.3.4/x"] {
            assert!(s.parse::<IpNet>().is_err(), "{s}");
        }
    }
}
