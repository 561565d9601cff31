//! The local addresses of a process's network namespace, read from `/proc/<pid>/net` (no need
//! to enter the namespace): IPv4 from `fib_trie` (`/32 host LOCAL` entries), IPv6 from
//! `if_inet6`.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// Local addresses of the namespace `proc_pid_dir` (e.g. `/proc/1234`) is in.
pub fn local_addresses(proc_pid_dir: &Path) -> BTreeSet<IpAddr> {
    let mut out = BTreeSet::new();
    if let Ok(t) = std::fs::read_to_string(proc_pid_dir.join("net/fib_trie")) {
        out.extend(parse_fib_trie(&t).into_iter().map(IpAddr::V4));
    }
    if let Ok(t) = std::fs::read_to_string(proc_pid_dir.join("net/if_inet6")) {
        out.extend(parse_if_inet6(&t).into_iter().map(IpAddr::V6));
    }
    out
}

/// IPv4 addresses listed as `/32 host LOCAL` in a `fib_trie` dump.
pub fn parse_fib_trie(text: &str) -> BTreeSet<Ipv4Addr> {
    let mut out = BTreeSet::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(ip) = t.strip_prefix("|-- ") {
            last = ip.trim().parse().ok();
        } else if t.starts_with("/32 host LOCAL")
            && let Some(ip) = last
        {
            out.insert(ip);
        }
    }
    out
}

/// Addresses of an `if_inet6` table (first column, 32 hex digits).
pub fn parse_if_inet6(text: &str) -> BTreeSet<Ipv6Addr> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|hex| u128::from_str_radix(hex, 16).ok().filter(|_| hex.len() == 32))
        .map(Ipv6Addr::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fib_trie_and_if_inet6() {
        let fib = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.0.0.0\n        /24 link UNICAST\n     |-- 10.0.0.5\n        /32 host LOCAL\n     |-- 10.0.0.255\n        /32 link BROADCAST\n     |-- 127.0.0.1\n        /32 host LOCAL\n";
        let v4 = parse_fib_trie(fib);
        assert_eq!(v4, ["10.0.0.5", "127.0.0.1"].iter().map(|s| s.parse().expect("ip")).collect());
        let v6 = parse_if_inet6(
            "00000000000000000000000000000001 01 80 10 80 lo\nfd000000000000000000000000000002 04 40 00 82 eth0\nzz 1\n",
        );
        assert!(v6.contains(&"fd00::2".parse::<Ipv6Addr>().expect("ip")));
        assert_eq!(v6.len(), 2);
    }

    #[test]
    fn own_namespace_has_loopback() {
        let addrs = local_addresses(Path::new("/proc/self"));
        assert!(addrs.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{addrs:?}");
    }
}
