//! Looking into the cluster's namespaces from outside: TCP connections made inside a namespace
//! (the socket is created there, then used from any thread), a plain HTTP GET on a component's
//! monitoring port, and the TCP ports a namespace listens on.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ambit_netns::Netns;

use crate::ip;

/// Largest HTTP response read by [`http_get`].
pub const MAX_RESPONSE: u64 = 8 << 20;

/// Opens a TCP connection to `addr` from inside namespace `netns` (`ip netns` name).
pub fn connect(netns: &str, addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let ns = Netns::open(&ip::netns_path(netns)).map_err(std::io::Error::other)?;
    ns.run_in_thread(|| TcpStream::connect_timeout(&addr, timeout)).map_err(std::io::Error::other)?
}

/// `GET path` on `127.0.0.1:port` inside `netns`: the status code and the body.
pub fn http_get(netns: &str, port: u16, path: &str) -> std::io::Result<(u16, String)> {
    request(Some(netns), SocketAddr::from(([127, 0, 0, 1], port)), "GET", path)
}

/// An HTTP/1.0 request without a body (`GET`, or a `POST` such as `/logging?level=debug`) to
/// `addr`, from inside `netns` when given, else from here: the status code and the body (at most
/// [`MAX_RESPONSE`] bytes; 2 s per step).
pub fn request(
    netns: Option<&str>,
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> std::io::Result<(u16, String)> {
    let timeout = Duration::from_secs(2);
    let mut s = match netns {
        Some(ns) => connect(ns, addr, timeout)?,
        None => TcpStream::connect_timeout(&addr, timeout)?,
    };
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(s, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut buf = Vec::new();
    s.take(MAX_RESPONSE).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response"))?;
    Ok((status, body.to_owned()))
}

/// Whether `GET path` on `port` inside `netns` answers 200.
pub fn ready(netns: &str, port: u16, path: &str) -> bool {
    http_get(netns, port, path).is_ok_and(|(s, _)| s == 200)
}

/// The TCP ports listened on in the network namespace of process `pid` (IPv4 and IPv6).
pub fn listening_ports(pid: u32) -> BTreeSet<u16> {
    listening(pid, None)
}

/// The TCP ports process `pid` itself listens on (its own sockets, not its namespace's: two
/// processes sharing a port with SO_REUSEPORT are told apart).
pub fn own_listening_ports(pid: u32) -> BTreeSet<u16> {
    let mut inodes = BTreeSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        let text = target.to_string_lossy();
        if let Some(inode) = text.strip_prefix("socket:[").and_then(|t| t.strip_suffix(']')) {
            inodes.insert(inode.to_owned());
        }
    }
    listening(pid, Some(&inodes))
}

fn listening(pid: u32, inodes: Option<&BTreeSet<String>>) -> BTreeSet<u16> {
    let mut ports = BTreeSet::new();
    for file in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{file}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1).unwrap_or_default();
            let state = fields.nth(1).unwrap_or_default();
            if state != "0A" {
                continue;
            }
            // Then tx:rx, tr:when, retrnsmt, uid, timeout, inode.
            if let Some(own) = inodes
                && fields.nth(5).is_none_or(|inode| !own.contains(inode))
            {
                continue;
            }
            if let Some((_, port)) = local.rsplit_once(':')
                && let Ok(p) = u16::from_str_radix(port, 16)
            {
                ports.insert(p);
            }
        }
    }
    ports
}

/// The destination-reported connection counters (`istio_tcp_connections_opened_total`,
/// `istio_tcp_connections_failed_total`) of every node proxy of the cluster: `node|series` →
/// value. What a destination proxy counted names the source's identity, the security policy
/// (`mutual_tls` or `none`) and, for a denial, `response_flags="DENY"`.
pub fn destination_counters(state: &crate::state::ClusterState) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for n in &state.network.nodes {
        let Ok((200, body)) = http_get(&n.netns, state.proxy(&n.name).stats, "/metrics") else { continue };
        for l in body.lines() {
            if (l.starts_with("istio_tcp_connections_opened_total{")
                || l.starts_with("istio_tcp_connections_failed_total{"))
                && l.contains("reporter=\"destination\"")
                && let Some((series, v)) = l.rsplit_once(' ')
                && let Ok(v) = v.parse::<f64>()
            {
                out.insert(format!("{}|{series}", n.name), v);
            }
        }
    }
    out
}

/// The series that grew from `before` to `after`, with how much.
pub fn growth(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or_default();
            (d > 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The value of label `name` in a Prometheus series (`metric{a="b",…}`), empty when absent.
pub fn label(series: &str, name: &str) -> String {
    let key = format!("{name}=\"");
    let Some(rest) = series.split_once('{').map(|(_, r)| r) else { return String::new() };
    // At the start of the label set or after a comma, so `source_principal` is not matched
    // inside `destination_principal`-like names.
    let found = rest.strip_prefix(&key).or_else(|| rest.split_once(&format!(",{key}")).map(|(_, r)| r));
    found.and_then(|r| r.split_once('"').map(|(v, _)| v.to_owned())).unwrap_or_default()
}

/// The sum of the samples of `metric` (a Prometheus text body) whose labels include every
/// `name="value"` of `labels`.
pub fn metric_sum(body: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| l.strip_prefix(metric).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_match_the_name_exactly_and_every_label() {
        let body = "# TYPE x counter\nx_total{a=\"1\",b=\"2\"} 3\nx_total{a=\"1\",b=\"3\"} 4\nx_total_more{a=\"1\"} 9\nx_total 1\n";
        assert_eq!(metric_sum(body, "x_total", &[("a", "1")]), 7.0);
        assert_eq!(metric_sum(body, "x_total", &[("b", "3")]), 4.0);
        assert_eq!(metric_sum(body, "x_total", &[]), 8.0);
    }

    #[test]
    fn labels_are_read_whole_and_growth_keeps_what_grew() {
        let s = r#"x_total{source_principal="a",principal="b",x="1"}"#;
        assert_eq!(label(s, "source_principal"), "a");
        assert_eq!(label(s, "principal"), "b");
        assert_eq!(label(s, "missing"), "");
        let before = BTreeMap::from([("a".to_owned(), 1.0), ("b".to_owned(), 2.0)]);
        let after = BTreeMap::from([("a".to_owned(), 1.0), ("b".to_owned(), 5.0), ("c".to_owned(), 1.0)]);
        assert_eq!(growth(&before, &after), BTreeMap::from([("b".to_owned(), 3.0), ("c".to_owned(), 1.0)]));
    }

    #[test]
    fn a_listening_socket_of_ours_is_seen() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        assert!(listening_ports(std::process::id()).contains(&port));
    }
}
