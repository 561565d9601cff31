//! End-to-end test harness: pods as network namespaces on a bridged node, in-pod capture rules,
//! packet capture, and small blocking clients/servers used by the integration tests.
//!
//! Include it from an integration test with `mod common;`. Every helper panics with a clear
//! message when the *test setup* fails (that is a broken test environment, not a finding);
//! helpers that exercise the system under test return `io::Result` instead.
//!
//! ```text
//! if !common::require_root() { return; }
//! let cluster = Cluster::new();                 // node netns + bridge, random 10.x/24 + fdxx::/64
//! let (client, server) = (cluster.add_pod("client"), cluster.add_pod("server"));
//! let echo = server.echo_server(8080);          // records the source address of each connection
//! client.capture();                             // §2.8.1 rules + table 100 policy routing
//! let mut cmd = client.exec(env!("CARGO_BIN_EXE_ambit"), &["proxy"]);
//! cmd.env("SOME_SETTING", "value");
//! let _proxy = ChildGuard::spawn("client proxy", cmd);   // killed on drop, logs shown on panic
//! let pcap = cluster.node().tcpdump(None);      // on the bridge: sees all pod-to-pod frames
//! let mut s = client.connect_tcp(echo.addr4())?; // captured by the rules, goes via the proxy
//! let reply = echo_roundtrip(&mut s, b"marker")?;
//! let segments = pcap_payloads(&pcap.stop());
//! ```

// Each integration test binary uses a different subset of the harness.
#![allow(dead_code, unused_imports)]

mod agent;
mod bare;
mod capture;
mod churn;
mod echo;
pub mod images;
mod load;
mod netns;
mod nginx;
mod pcap;
mod process;
mod runtime;
mod sockets;
mod up;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use agent::*;
pub use bare::BareNamespaces;
pub use capture::{
    DNS_PORT, INBOUND_HBONE_PORT, INBOUND_PLAINTEXT_PORT, OUTBOUND_PORT, PROBE_SNAT_V4, PROBE_SNAT_V6,
    PROXY_MARK, TPROXY_MARK, iptables_v4_rules, iptables_v6_rules, nft_rules,
};
pub use churn::{ChurnRun, Until, churn, percentile};
pub use echo::{EchoServer, echo_roundtrip};
pub use load::{Load, Tally, short_echo};
pub use netns::{Cluster, Node, Pod};
pub use nginx::{nginx_conf, nginx_container};
pub use pcap::{Capture, Segment, contains, pcap_payloads};
pub use process::{ChildGuard, cpu_seconds, hard_nofile, rss_kib, status_kib};
pub use runtime::{CniFailure, CniRuntime, Sandbox, ambit_cni_path};
pub use sockets::{connect_tcp_in, listen_tcp_in, original_dst, run_in};
pub use up::{
    CLIENT, Counted, DENY_CLIENT, LocalCluster, OTHER, PLAIN, Ran, ambit_bin, app_echo, assert_mtls,
    assert_plaintext, cluster_tag, connect, counted, desired_files, enrolled, pod_status, ruleset,
    try_denied, wait_counted,
};

/// Timeout applied to every connect made by the harness.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub use ambit_cluster::testing::require_root;

/// Polls `cond` every 20 ms until it holds (true) or `timeout` passes (false).
pub fn wait_for(mut cond: impl FnMut() -> bool, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// HTTP/1.1 GET from the current network namespace; returns the status code and the body.
///
/// Use [`Pod::http_get`] for endpoints inside a pod namespace (proxy admin, metrics, readiness).
pub fn http_get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    http_get_on(stream, addr, path)
}

/// Sends a GET on an already connected stream (read timeout 10 s) and reads the whole response.
pub fn http_get_on(stream: TcpStream, addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    http_request_on(stream, addr, "GET", path)
}

/// Sends a body-less `method` request on a connected stream (read timeout 10 s) and reads the
/// whole response: (status, body).
pub fn http_request_on(
    mut stream: TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> io::Result<(u16, String)> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    // One write: the request head goes out in a single segment.
    let length = if method == "GET" { "" } else { "Content-Length: 0\r\n" };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: ambit-e2e\r\nAccept: */*\r\n{length}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad_data(format!("malformed HTTP status line {line:?}")))?;
    let mut content_length = None;
    let mut chunked = false;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(bad_data("connection closed inside HTTP headers".into()));
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                content_length = Some(
                    value.parse::<usize>().map_err(|_| bad_data(format!("bad Content-Length {value:?}")))?,
                );
            } else if name.eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
            {
                chunked = true;
            }
        }
    }
    let body = if chunked {
        read_chunked(&mut reader)?
    } else if let Some(len) = content_length {
        let mut body = vec![0; len];
        reader.read_exact(&mut body)?;
        body
    } else {
        let mut body = Vec::new();
        reader.read_to_end(&mut body)?;
        body
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn read_chunked(reader: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let size_text = line.trim_end().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size_text.trim(), 16)
            .map_err(|_| bad_data(format!("bad chunk size line {line:?}")))?;
        if size == 0 {
            // Trailers (if any) end with an empty line; with Connection: close we can stop here.
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        line.clear();
        reader.read_line(&mut line)?;
    }
}

fn bad_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Checks effective uid 0 and that a network namespace can really be created and deleted.
/// Accepts one connection, waiting at most `timeout`; `None` if nothing arrived.
pub fn accept_timeout(
    listener: &std::net::TcpListener,
    timeout: Duration,
) -> Option<(TcpStream, SocketAddr)> {
    listener.set_nonblocking(true).unwrap_or_else(|e| panic!("cannot make listener non-blocking: {e}"));
    let mut accepted = None;
    wait_for(
        || match listener.accept() {
            Ok(conn) => {
                accepted = Some(conn);
                true
            }
            Err(_) => false,
        },
        timeout,
    );
    let (stream, peer) = accepted?;
    stream.set_nonblocking(false).unwrap_or_else(|e| panic!("cannot make accepted socket blocking: {e}"));
    Some((stream, SocketAddr::new(peer.ip().to_canonical(), peer.port())))
}
