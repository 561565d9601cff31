//! End-to-end tests of `ambit proxy` in shared (in-pod) mode: one proxy process per node, in the
//! node's netns, serving the pods a fake node agent hands it over ZDS; every pod has the in-pod
//! capture rules. Needs root; under `CI=true` a missing privilege fails the test instead.

mod common;
mod mesh;

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ambit_zds::WorkloadInfo;
use common::*;
use mesh::*;

const MARKER: &[u8] = b"AMBIT-PLAINTEXT-MARKER-5c21";

/// A mesh, a directory for ZDS sockets, and the first node's fake agent.
struct Setup {
    mesh: Mesh,
    sockets: tempfile::TempDir,
    agent: FakeAgent,
}

impl Setup {
    fn new() -> Setup {
        let mesh = Mesh::new();
        let sockets = tempfile::tempdir().expect("tempdir for ZDS sockets");
        let agent = FakeAgent::start(&sockets.path().join("node.sock"));
        Setup { mesh, sockets, agent }
    }

    fn node(&self) -> &Node {
        self.mesh.cluster.node()
    }

    /// Starts node 1's proxy (on the agent's socket) and waits for readiness.
    fn start_proxy(&self, env: &[(&str, &str)]) -> ChildGuard {
        self.mesh.start_node_proxy(self.node(), self.agent.path(), env)
    }
}

fn uid(p: &MeshPod) -> String {
    format!("uid-{}", p.workload)
}

fn info(p: &MeshPod) -> WorkloadInfo {
    WorkloadInfo { name: p.workload.clone(), namespace: "default".into(), service_account: p.sa.clone() }
}

/// Adds the pod over ZDS and checks the ack, then that its listeners exist right away (the ack
/// is only sent once they are bound).
fn enroll(agent: &FakeAgent, p: &MeshPod) {
    agent.add_pod(&uid(p), info(p), &p.pod.netns).unwrap_or_else(|e| panic!("add {}: NACK {e}", p.pod.name));
    let ports = listening(&p.pod);
    for port in [OUTBOUND_PORT, INBOUND_PLAINTEXT_PORT, INBOUND_HBONE_PORT] {
        assert!(
            ports.contains(&("tcp", port)),
            "pod {} acked without a listener on {port}: {ports:?}",
            p.pod.name
        );
    }
    assert!(
        ports.contains(&("udp", DNS_PORT)),
        "pod {} acked without the DNS listener: {ports:?}",
        p.pod.name
    );
}

/// Listening (protocol, port) pairs inside the pod's netns, from `ss`.
fn listening(pod: &Pod) -> BTreeSet<(&'static str, u16)> {
    let out = pod.run_cmd("ss", &["-H", "-l", "-n", "-t", "-u"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let proto = match *fields.first()? {
                "tcp" => "tcp",
                "udp" => "udp",
                _ => return None,
            };
            let port = fields.get(4)?.rsplit(':').next()?.parse().ok()?;
            Some((proto, port))
        })
        .collect()
}

fn proxy_ports(ports: &BTreeSet<(&'static str, u16)>) -> Vec<(&'static str, u16)> {
    ports
        .iter()
        .filter(|(_, port)| {
            [OUTBOUND_PORT, INBOUND_PLAINTEXT_PORT, INBOUND_HBONE_PORT, DNS_PORT].contains(port)
        })
        .copied()
        .collect()
}

/// Waits until the node proxy's config dump mentions `needle` (the local config was reloaded).
fn wait_config(node: &Node, needle: &str) {
    let seen = wait_for(
        || {
            node_http_get(node, 15000, "/config_dump")
                .is_ok_and(|(s, body)| s == 200 && body.contains(needle))
        },
        Duration::from_secs(10),
    );
    assert!(seen, "the node proxy's config dump never showed {needle}");
}

/// Pods on two nodes, each node with its own proxy: same-node and cross-node traffic is HBONE
/// (no plaintext on the bridge, TLS to 15008), the app sees the client's IP, and the policy of
/// the destination pod is applied to the source pod's identity.
#[test]
fn hbone_same_node_and_cross_node() {
    if !require_root() {
        return;
    }
    let s = Setup::new();
    let node2 = s.mesh.cluster.add_node("node2");
    let agent2 = FakeAgent::start(&s.sockets.path().join("node2.sock"));
    let a = s.mesh.pod("a", "client");
    let b = s.mesh.pod("b", "server").with_policies(&["default/only-client"]);
    let c = s.mesh.pod("c", "other");
    let d = s.mesh.pod_on(&node2, "d", "server");
    s.mesh.write_config(&[&a, &b, &c, &d], &[ONLY_CLIENT], &[]);
    let p1 = s.start_proxy(&[]);
    let p2 = s.mesh.start_node_proxy(&node2, agent2.path(), &[]);
    for p in [&a, &b, &c] {
        enroll(&s.agent, p);
    }
    enroll(&agent2, &d);
    let eb = b.pod.echo_server(8080);
    let ed = d.pod.echo_server(8080);

    let cap = s.node().tcpdump(None);
    for dst in [b.pod.addr4(8080), b.pod.addr6(8080), d.pod.addr4(8080), d.pod.addr6(8080)] {
        assert_echo(&a.pod, dst, &format!("a -> {dst}"));
    }
    let segments = pcap_payloads(&cap.stop());
    assert!(!segments.is_empty(), "the capture saw no traffic");
    for (src, dst, payload) in &segments {
        assert!(!contains(payload, MARKER), "plaintext seen on the wire: {src} -> {dst}");
    }
    for (pod, ip) in [("b", IpAddr::V4(b.pod.ip4)), ("d", IpAddr::V4(d.pod.ip4))] {
        let tls = segments
            .iter()
            .filter(|(_, dst, p)| {
                dst.ip() == ip && dst.port() == 15008 && matches!(p.first(), Some(0x16 | 0x17))
            })
            .count();
        assert!(tls >= 2, "expected TLS records to {pod}:15008, saw {tls}");
    }
    assert!(
        segments.iter().all(|(s, d, _)| s.port() == 15008 || d.port() == 15008),
        "mesh traffic crossed the bridge on a port other than 15008"
    );
    for (name, echo) in [("b", &eb), ("d", &ed)] {
        let peers = echo.peer_ips();
        assert!(peers.contains(&IpAddr::V4(a.pod.ip4)), "{name}'s app did not see a's IPv4: {peers:?}");
        assert!(peers.contains(&IpAddr::V6(a.pod.ip6)), "{name}'s app did not see a's IPv6: {peers:?}");
    }

    // Per-pod identity: b only admits service account `client` (pod a).
    let before = eb.peers().len();
    assert_denied(&c.pod, b.pod.addr4(8080), ProxyOf::Node(s.node()), "c (sa other) -> b (only-client)");
    assert_denied(
        &d.pod,
        b.pod.addr4(8080),
        ProxyOf::Node(s.node()),
        "d (sa server, other node) -> b (only-client)",
    );
    assert_eq!(eb.peers().len(), before, "a denied connection reached b's app");
    assert_echo(&c.pod, d.pod.addr4(8080), "c -> d (no policy): c is served, only b's policy blocks it");
    assert_eq!(ed.peer_ips().last(), Some(&IpAddr::V4(c.pod.ip4)), "d's app did not see c's IP");
    for (name, proxy) in [("node 1", &p1), ("node 2", &p2)] {
        let logged = wait_for(|| proxy.logs().contains("connection complete"), Duration::from_secs(5));
        assert!(logged, "{name} proxy logged no connection:\n{}", proxy.logs());
    }
}

/// Del closes the pod's listeners and connections within 1 s; the same uid added again with a
/// new netns (new IP) is served again.
#[test]
fn del_then_readd_with_new_netns() {
    if !require_root() {
        return;
    }
    let s = Setup::new();
    let a = s.mesh.pod("a", "client");
    let b = s.mesh.pod("b", "server").with_policies(&["default/only-client"]);
    let c = s.mesh.pod("c", "other");
    s.mesh.write_config(&[&a, &b, &c], &[ONLY_CLIENT], &[]);
    let proxy = s.start_proxy(&[]);
    for p in [&a, &b, &c] {
        enroll(&s.agent, p);
    }
    let _eb = b.pod.echo_server(8080);
    let mut held = a.pod.connect_tcp(b.pod.addr4(8080)).expect("connect a -> b");
    held.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    roundtrip(&mut held, b"before del");

    let a_ports = proxy_ports(&listening(&a.pod));
    assert_eq!(proxy_ports(&listening(&b.pod)), a_ports, "a and b should have the same proxy listeners");
    s.agent.del_pod(&uid(&b)).expect("del b acked");
    let t0 = Instant::now();
    let gone = wait_for(|| proxy_ports(&listening(&b.pod)).is_empty(), Duration::from_secs(1));
    assert!(gone, "b's proxy listeners still open 1 s after Del: {:?}", proxy_ports(&listening(&b.pod)));
    held.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let mut rest = Vec::new();
    let r = held.read_to_end(&mut rest);
    let closed_after = t0.elapsed();
    assert!(
        r.is_ok() || r.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::ConnectionReset),
        "open connection a -> b not closed after Del: {r:?}"
    );
    assert!(closed_after < Duration::from_secs(1), "open connection closed only after {closed_after:?}");
    assert_eq!(proxy_ports(&listening(&a.pod)), a_ports, "a lost listeners when b was deleted");
    let _ec = c.pod.echo_server(8080);
    assert_echo(&a.pod, c.pod.addr4(8080), "a -> c after b's Del");

    // The same pod uid comes back in a new netns with a new IP.
    let b2 = s.mesh.pod("b2", "server").named("b").with_policies(&["default/only-client"]);
    s.mesh.write_config(&[&a, &b2, &c], &[ONLY_CLIENT], &[]);
    wait_config(s.node(), &format!("\"{}\"", b2.pod.ip4));
    enroll(&s.agent, &b2);
    let eb2 = b2.pod.echo_server(8080);
    assert_echo(&a.pod, b2.pod.addr4(8080), "a -> re-added b");
    assert_eq!(eb2.peer_ips(), vec![IpAddr::V4(a.pod.ip4)], "re-added b's app must see a's IP");
    assert_denied(&c.pod, b2.pod.addr4(8080), ProxyOf::Node(s.node()), "c -> re-added b (only-client)");
    assert_eq!(eb2.peers().len(), 1, "a denied connection reached re-added b's app");
    let state = workload_state(s.node(), 15000);
    assert_eq!(state.len(), 3, "expected pods a, b, c in workloadState: {state:?}");
    assert_eq!(state.get("uid-b").map(String::as_str), Some("Up"), "{state:?}");
    assert!(
        proxy.wait_for_log("pod proxy stopped", Duration::from_secs(2)),
        "no log line for the Del:\n{}",
        proxy.logs()
    );
}

/// uid → state ("Up"/"Pending") from the node proxy's `/config_dump` (admin on `port`).
fn workload_state(node: &Node, port: u16) -> std::collections::BTreeMap<String, String> {
    let (status, body) = node_http_get(node, port, "/config_dump").expect("config dump");
    assert_eq!(status, 200, "{body}");
    let dump: serde_json::Value = serde_json::from_str(&body).expect("config dump is JSON");
    let Some(map) = dump.get("workloadState").and_then(|w| w.as_object()) else {
        panic!("config dump has no workloadState: {body}");
    };
    map.iter()
        .map(|(uid, w)| (uid.clone(), w.get("state").and_then(|s| s.as_str()).unwrap_or_default().to_owned()))
        .collect()
}

/// Outcome counts of the handoff client.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    refused: AtomicUsize,
    reset: AtomicUsize,
    other: AtomicUsize,
    errors: std::sync::Mutex<Vec<String>>,
}

/// One short echo connection from the current (pod) netns.
fn short_echo(dst: SocketAddr) -> io::Result<()> {
    let mut s = TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT)?;
    let reply = echo_roundtrip(&mut s, b"x")?;
    if reply == b"x" { Ok(()) } else { Err(io::Error::other(format!("echo returned {reply:?}"))) }
}

/// While a client opens 50 connections per second from a to b for 20 s, a second proxy starts
/// in the node and the first one is told to drain: no connection is refused or reset, and a
/// connection opened before the handoff keeps working during the old proxy's drain.
#[test]
fn handoff_to_a_new_proxy_process() {
    if !require_root() {
        return;
    }
    let s = Setup::new();
    let a = s.mesh.pod("a", "client");
    let b = s.mesh.pod("b", "server");
    s.mesh.write_config(&[&a, &b], &[], &[]);
    let mut old = s.start_proxy(&[("CONNECTION_TERMINATION_DEADLINE", "5s")]);
    for p in [&a, &b] {
        enroll(&s.agent, p);
    }
    let _eb = b.pod.echo_server(8080);
    let mut held = a.pod.connect_tcp(b.pod.addr4(8080)).expect("connect a -> b");
    held.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    roundtrip(&mut held, b"before the handoff");

    let tally = Arc::new(Tally::default());
    let client = {
        let (pod, dst, tally) = (a.pod.clone(), b.pod.addr4(8080), Arc::clone(&tally));
        std::thread::spawn(move || {
            pod.run(|| {
                let start = Instant::now();
                let interval = Duration::from_millis(20);
                let mut next = start;
                while start.elapsed() < Duration::from_secs(20) {
                    let counter = match short_echo(dst) {
                        Ok(()) => &tally.ok,
                        Err(e) => {
                            tally.errors.lock().unwrap_or_else(|p| p.into_inner()).push(format!("{e}"));
                            match e.kind() {
                                io::ErrorKind::ConnectionRefused => &tally.refused,
                                io::ErrorKind::ConnectionReset => &tally.reset,
                                _ => &tally.other,
                            }
                        }
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    next += interval;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
            })
        })
    };
    assert!(
        wait_for(|| tally.ok.load(Ordering::Relaxed) >= 100, Duration::from_secs(10)),
        "the client made no progress before the handoff"
    );
    let new = s.start_proxy(&[
        ("AMBIT_ADMIN_ADDR", "127.0.0.1:16000"),
        ("AMBIT_STATS_ADDR", "[::]:16020"),
        ("AMBIT_READINESS_ADDR", "[::]:16021"),
    ]);
    assert!(s.agent.wait_connections(2, Duration::from_secs(5)), "the new proxy got no snapshot");
    let snapshot: Vec<_> = s.agent.acks().into_iter().filter(|r| r.conn == 2).collect();
    assert_eq!(snapshot.len(), 3, "new proxy: expected 2 adds + SnapshotSent: {snapshot:?}");
    assert!(snapshot.iter().all(|r| r.result.is_ok()), "new proxy NACKed its snapshot: {snapshot:?}");
    assert_eq!(workload_state(s.node(), 16000).len(), 2, "the new proxy does not serve both pods");
    // Let the new proxy take a share of the connections before the old one leaves.
    let ok_before = tally.ok.load(Ordering::Relaxed);
    assert!(wait_for(|| tally.ok.load(Ordering::Relaxed) >= ok_before + 50, Duration::from_secs(5)));

    old.signal(nix::sys::signal::Signal::SIGTERM);
    let drain_start = Instant::now();
    assert!(
        wait_for(|| old.logs().contains("listener closed for drain"), Duration::from_secs(2)),
        "old proxy did not close its listeners at once:\n{}",
        old.logs()
    );
    // Midway through the 5 s deadline the held connection still works.
    let ok_at_drain = tally.ok.load(Ordering::Relaxed);
    assert!(wait_for(|| tally.ok.load(Ordering::Relaxed) >= ok_at_drain + 100, Duration::from_secs(5)));
    assert!(drain_start.elapsed() < Duration::from_secs(4), "drain check came too late to be meaningful");
    roundtrip(&mut held, b"during the drain");
    assert!(old.try_wait().is_none(), "old proxy exited before its deadline with a connection open");
    assert!(old.wait_timeout(Duration::from_secs(10)).is_some(), "old proxy did not exit after its deadline");
    client.join().expect("client thread");

    let (ok, refused, reset, other) = (
        tally.ok.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        tally.reset.load(Ordering::Relaxed),
        tally.other.load(Ordering::Relaxed),
    );
    let errors = tally.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        refused + reset + other == 0,
        "{refused} refused, {reset} reset, {other} other failures of {} connections: {errors:?}",
        ok + refused + reset + other
    );
    assert!(ok >= 900, "the client opened only {ok} connections in 20 s (expected ~1000)");
    let opened = counter(
        &node_http_get(s.node(), 16020, "/metrics").expect("new proxy metrics").1,
        "istio_tcp_connections_opened_total",
        "destination",
    );
    assert!(opened > 0, "the new proxy took no connection");
    assert_echo(&a.pod, b.pod.addr4(8080), "after the handoff");
    drop(new);
}

/// Bad ZDS input is NACKed with a clear error and logged; the proxy keeps serving its pods
/// (and reconnects, getting a fresh snapshot, where the spec says so).
#[test]
fn zds_bad_input_is_nacked() {
    if !require_root() {
        return;
    }
    let s = Setup::new();
    let a = s.mesh.pod("a", "client");
    let b = s.mesh.pod("b", "server");
    s.mesh.write_config(&[&a, &b], &[], &[]);
    let mut proxy = s.start_proxy(&[]);
    for p in [&a, &b] {
        enroll(&s.agent, p);
    }
    let _eb = b.pod.echo_server(8080);
    let mut held = a.pod.connect_tcp(b.pod.addr4(8080)).expect("connect a -> b");
    held.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    roundtrip(&mut held, b"before");
    assert_echo(&a.pod, b.pod.addr4(8080), "before any bad input");
    let info = WorkloadInfo { name: "x".into(), namespace: "default".into(), service_account: "x".into() };
    let netns_fd = || {
        std::os::fd::OwnedFd::from(
            ambit_netns::Netns::open(&Path::new("/var/run/netns").join(&a.pod.netns)).expect("netns fd"),
        )
    };
    let scratch = tempfile::tempdir().expect("tempdir");

    let cases = [
        BadInput::new("a packet longer than 1024 bytes", vec![0x0a; 1100], "truncated").reconnects(),
        BadInput::new(
            "an Add without fd",
            ambit_zds::encode_add("uid-nofd", &info).expect("encode"),
            "without a network namespace file descriptor",
        ),
        BadInput::new(
            "an Add without WorkloadInfo",
            // WorkloadRequest{add{uid:"uid-noinfo"}}, hand-encoded: the codec cannot produce it.
            [&[0x0a, 0x0c, 0x0a, 0x0a][..], b"uid-noinfo"].concat(),
            "no workload_info",
        )
        .with_fd(netns_fd()),
        BadInput::new("a second SnapshotSent", vec![0x1a, 0x00], "second SnapshotSent").reconnects(),
        BadInput::new(
            "an Add whose fd is a regular file",
            ambit_zds::encode_add("uid-file", &info).expect("encode"),
            "not a network namespace",
        )
        .with_fd(regular_file_fd(&scratch.path().join("not-a-netns"))),
    ];
    for BadInput { what, bytes, fd, expected, reconnects } in cases {
        let conns = s.agent.connections();
        let log_len = proxy.logs().len();
        let ack = s.agent.send_raw(&bytes, fd);
        let Err(nack) = ack else {
            panic!("{what}: acked as success");
        };
        assert!(nack.contains(expected), "{what}: NACK {nack:?} does not mention {expected:?}");
        assert!(
            wait_for(
                || proxy.logs().get(log_len..).is_some_and(|l| l.contains(expected)),
                Duration::from_secs(2)
            ),
            "{what}: not logged (expected {expected:?}):\n{}",
            proxy.logs()
        );
        if reconnects {
            assert!(
                s.agent.wait_connections(conns + 1, Duration::from_secs(5)),
                "{what}: the proxy did not reconnect and take a new snapshot"
            );
        }
        assert!(proxy.try_wait().is_none(), "{what}: the proxy exited:\n{}", proxy.logs());
        assert_echo(&a.pod, b.pod.addr4(8080), &format!("a -> b after {what}"));
    }
    let state = workload_state(s.node(), 15000);
    let expected: std::collections::BTreeMap<String, String> =
        [("uid-a".to_owned(), "Up".to_owned()), ("uid-b".to_owned(), "Up".to_owned())].into();
    assert_eq!(state, expected, "bad input changed the served pods");
    roundtrip(&mut held, b"after all bad input");
    // The proxy still takes well-formed requests on the current connection.
    let c = s.mesh.pod("c", "other");
    enroll(&s.agent, &c);
}

/// One bad ZDS record: what it is, its bytes and fd, the text its NACK and log line must carry,
/// and whether the proxy reconnects after it (protocol violations) or stays on the connection.
struct BadInput {
    what: &'static str,
    bytes: Vec<u8>,
    fd: Option<std::os::fd::OwnedFd>,
    expected: &'static str,
    reconnects: bool,
}

impl BadInput {
    fn new(what: &'static str, bytes: Vec<u8>, expected: &'static str) -> BadInput {
        BadInput { what, bytes, fd: None, expected, reconnects: false }
    }

    fn with_fd(mut self, fd: std::os::fd::OwnedFd) -> BadInput {
        self.fd = Some(fd);
        self
    }

    fn reconnects(mut self) -> BadInput {
        self.reconnects = true;
        self
    }
}

/// How many TCP sockets listen on `port` in the namespace `ss` runs in (with SO_REUSEPORT two
/// proxy instances each have their own).
fn listeners_on(ss: std::process::Output, port: u16) -> usize {
    assert!(ss.status.success(), "ss failed: {}", String::from_utf8_lossy(&ss.stderr));
    String::from_utf8_lossy(&ss.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(3).and_then(|a| a.rsplit(':').next()) == Some(&port.to_string()))
        .count()
}

/// `ss` listing the TCP listeners of a pod's netns.
fn pod_tcp_listeners(pod: &Pod) -> std::process::Output {
    pod.exec("ss", &["-H", "-l", "-n", "-t"]).output().expect("run ss in the pod")
}

/// The `(dev, inode)` id of a namespace, as the proxy names it in its NACKs.
fn netns_id(path: &Path) -> ambit_netns::NetnsId {
    ambit_netns::NetnsId::of_path(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
}

/// Connection counts by source principal of the node proxy's inbound connections to `workload`.
fn inbound_principals(node: &Node, workload: &str) -> std::collections::BTreeMap<String, u64> {
    let (status, body) = node_http_get(node, 15020, "/metrics").expect("node proxy metrics");
    assert_eq!(status, 200, "{body}");
    let mut out = std::collections::BTreeMap::new();
    for line in body.lines().filter(|l| {
        l.starts_with("istio_tcp_connections_opened_total{")
            && l.contains("reporter=\"destination\"")
            && l.contains(&format!("destination_workload=\"{workload}\""))
    }) {
        let principal = line
            .split("source_principal=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_default()
            .to_owned();
        let n: u64 = line.rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or_default();
        *out.entry(principal).or_default() += n;
    }
    out
}

/// A second pod uid for a network namespace that is already served is NACKed with the exact
/// reason; no second instance binds in that namespace, and every connection leaving the pod
/// keeps the first workload's identity (the destination proxy's metrics show only it).
#[test]
fn zds_second_uid_for_a_served_netns_is_nacked() {
    if !require_root() {
        return;
    }
    let s = Setup::new();
    let a = s.mesh.pod("a", "client");
    let b = s.mesh.pod("b", "server");
    let c = s.mesh.pod("c", "other");
    s.mesh.write_config(&[&a, &b, &c], &[], &[]);
    let proxy = s.start_proxy(&[]);
    for p in [&a, &b, &c] {
        enroll(&s.agent, p);
    }
    let _ec = c.pod.echo_server(8080);

    // The agent hands b's workload over again under a new uid, but with a's namespace.
    let ack = s.agent.add_pod("uid-intruder", info(&b), &a.pod.netns);
    let outbound_listeners = listeners_on(pod_tcp_listeners(&a.pod), OUTBOUND_PORT);
    for i in 0..16 {
        assert_echo(&a.pod, c.pod.addr4(8080), &format!("a -> c, connection {i}"));
    }
    let client = "spiffe://cluster.local/ns/default/sa/client".to_owned();
    let expected_principals: std::collections::BTreeMap<String, u64> = [(client, 16)].into();
    let mut principals = inbound_principals(s.node(), "c");
    wait_for(
        || {
            principals = inbound_principals(s.node(), "c");
            principals.values().sum::<u64>() >= 16
        },
        Duration::from_secs(5),
    );
    let state = workload_state(s.node(), 15000);
    let id = netns_id(&Path::new("/var/run/netns").join(&a.pod.netns));
    let expected = format!(
        "pod uid-intruder: network namespace {id} already belongs to pod uid-a (default/a); one network \
         namespace serves one workload, so this Add is refused (if uid-a was replaced, send \
         DelWorkload uid-a first)"
    );
    assert!(
        ack.as_ref().err() == Some(&expected) && outbound_listeners == 1 && principals == expected_principals,
        "the second uid for a's namespace: ack {ack:?} (want NACK {expected:?}); {outbound_listeners} \
         listener(s) on {OUTBOUND_PORT} in a (want 1); c's inbound connections by source principal \
         {principals:?} (want {expected_principals:?})"
    );
    assert!(!state.contains_key("uid-intruder"), "the refused pod is in workloadState: {state:?}");
    assert!(
        proxy.wait_for_log(&expected, Duration::from_secs(2)),
        "the refusal is not logged:\n{}",
        proxy.logs()
    );
    // The first owner is still served, and a Del of it frees the namespace for a new uid.
    assert_eq!(state.get("uid-a").map(String::as_str), Some("Up"), "{state:?}");
    s.agent.del_pod("uid-a").expect("del a");
    s.agent.add_pod("uid-a2", info(&a), &a.pod.netns).expect("a's namespace under a new uid after Del");
    assert_echo(&a.pod, c.pod.addr4(8080), "a -> c after the namespace changed hands");
}

/// After an agent restart, a snapshot that names a served network namespace under a new uid (and
/// not the old one) moves it: the old pod's instance stops before the new one binds, so the
/// namespace never has two instances.
#[test]
fn zds_snapshot_moves_a_netns_to_a_new_uid() {
    if !require_root() {
        return;
    }
    let Setup { mesh, sockets: _sockets, agent } = Setup::new();
    let a = mesh.pod("a", "client");
    let b = mesh.pod("b", "server");
    mesh.write_config(&[&a, &b], &[], &[]);
    let node = mesh.cluster.node();
    let proxy = mesh.start_node_proxy(node, agent.path(), &[]);
    for p in [&a, &b] {
        enroll(&agent, p);
    }
    let path = agent.path().to_owned();
    drop(agent);
    let agent = FakeAgent::start(&path);
    // No proxy is connected yet: the pods only go into the new agent's snapshot.
    for (uid, p) in [("uid-a-new", &a), ("uid-b", &b)] {
        assert!(agent.add_pod(uid, info(p), &p.pod.netns).is_err(), "no proxy should be connected yet");
    }
    assert!(
        agent.wait_connections(1, Duration::from_secs(10)),
        "the proxy did not reconnect:\n{}",
        proxy.logs()
    );
    let acks: Vec<_> = agent.acks().into_iter().map(|r| (r.what, r.result)).collect();
    let expected: Vec<(String, Result<(), String>)> = vec![
        ("add uid-a-new".into(), Ok(())),
        ("add uid-b".into(), Ok(())),
        ("snapshot_sent".into(), Ok(())),
    ];
    assert_eq!(acks, expected, "snapshot acks");
    let state = workload_state(node, 15000);
    let want: std::collections::BTreeMap<String, String> =
        [("uid-a-new".to_owned(), "Up".to_owned()), ("uid-b".to_owned(), "Up".to_owned())].into();
    assert_eq!(state, want);
    assert_eq!(listeners_on(pod_tcp_listeners(&a.pod), OUTBOUND_PORT), 1, "two instances in a's namespace");
    let _eb = b.pod.echo_server(8080);
    assert_echo(&a.pod, b.pod.addr4(8080), "a -> b under a's new uid");
}

/// The proxy's own network namespace and the host's (pid 1's) are NACKed with exact reasons,
/// and no pod listener opens there; the proxy keeps serving the real pods.
#[test]
fn zds_proxy_own_and_host_netns_are_nacked() {
    if !require_root() {
        return;
    }
    let s = Setup::new();
    let a = s.mesh.pod("a", "client");
    let b = s.mesh.pod("b", "server");
    s.mesh.write_config(&[&a, &b], &[], &[]);
    // The proxy's pid 1 is a shell in this test's namespace, which thereby plays the host.
    let proxy = s.mesh.start_node_proxy_in_pid_ns(s.node(), s.agent.path(), &[]);
    let node = s.node();
    let own = netns_id(&Path::new("/var/run/netns").join(&node.netns));
    let host = netns_id(Path::new("/proc/self/ns/net"));
    assert_ne!(own, host, "the node proxy must not run in the test's namespace");
    let node_ss = || node.exec("ss", &["-H", "-l", "-n", "-t"]).output().expect("run ss in the node");
    let host_ss =
        || std::process::Command::new("ss").args(["-H", "-l", "-n", "-t"]).output().expect("run ss");
    let host_before: Vec<usize> = [OUTBOUND_PORT, INBOUND_PLAINTEXT_PORT, INBOUND_HBONE_PORT]
        .map(|p| listeners_on(host_ss(), p))
        .into();

    let own_ack = s.agent.add_pod("uid-own", info(&a), &node.netns);
    let host_ack = s.agent.add_pod_at("uid-host", info(&a), Path::new("/proc/self/ns/net"));
    let node_listeners: Vec<usize> = [OUTBOUND_PORT, INBOUND_PLAINTEXT_PORT, INBOUND_HBONE_PORT]
        .map(|p| listeners_on(node_ss(), p))
        .into();
    let host_listeners: Vec<usize> = [OUTBOUND_PORT, INBOUND_PLAINTEXT_PORT, INBOUND_HBONE_PORT]
        .map(|p| listeners_on(host_ss(), p))
        .into();
    let own_reason = format!(
        "pod uid-own: network namespace {own} is the node proxy's own network namespace, not a pod's; \
         refusing to open pod listeners in it (is the node agent handing over the wrong namespace?)"
    );
    let host_reason = format!(
        "pod uid-host: network namespace {host} is the host's network namespace (that of pid 1), not a \
         pod's; refusing to open pod listeners in it (is the node agent handing over the wrong namespace?)"
    );
    assert!(
        own_ack.as_ref().err() == Some(&own_reason)
            && host_ack.as_ref().err() == Some(&host_reason)
            && node_listeners == [0, 0, 0]
            && host_listeners == host_before,
        "own namespace: {own_ack:?} (want NACK {own_reason:?}), listeners on 15001/15006/15008 there: \
         {node_listeners:?} (want none); host namespace: {host_ack:?} (want NACK {host_reason:?}), \
         listeners there: {host_listeners:?} (want {host_before:?}, as before the Add)"
    );
    let logged = [&own_reason, &host_reason].map(|r| proxy.wait_for_log(r, Duration::from_secs(2)));
    assert_eq!(logged, [true, true], "refusals not logged (own, host):\n{}", proxy.logs());
    let state = workload_state(node, 15000);
    assert!(state.is_empty(), "refused pods are in workloadState: {state:?}");
    for p in [&a, &b] {
        enroll(&s.agent, p);
    }
    let _eb = b.pod.echo_server(8080);
    assert_echo(&a.pod, b.pod.addr4(8080), "a -> b after the refusals");
}

/// Removes `/etc/netns/<name>` (the per-netns /etc overlay of `ip netns exec`) on drop, and
/// `/etc/netns` too if this guard created it and it is empty again.
struct EtcNetns {
    dir: PathBuf,
    created_parent: bool,
}

impl EtcNetns {
    fn resolv_conf(netns: &str, text: &str) -> EtcNetns {
        let parent = Path::new("/etc/netns");
        let created_parent = !parent.exists();
        let dir = parent.join(netns);
        std::fs::create_dir_all(&dir).expect("create /etc/netns/<node>");
        let guard = EtcNetns { dir, created_parent };
        std::fs::write(guard.dir.join("resolv.conf"), text).expect("write resolv.conf");
        guard
    }
}

impl Drop for EtcNetns {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        if self.created_parent {
            let _ = std::fs::remove_dir("/etc/netns");
        }
    }
}

/// The canned answer of the fake upstream resolver.
const UPSTREAM_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 55);

/// A tiny DNS server: answers every A query with [`UPSTREAM_ANSWER`] and records the names.
struct FakeResolver {
    names: Arc<std::sync::Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeResolver {
    fn start(pod: &Pod) -> FakeResolver {
        let socket = pod.run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 53))).expect("bind UDP 53");
        socket.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        let names = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (names, stop) = (Arc::clone(&names), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
                    let Some((name, qtype, question)) = parse_question(&buf[..n]) else { continue };
                    names.lock().unwrap_or_else(|p| p.into_inner()).push(name);
                    let answers = u16::from(qtype == 1);
                    let mut reply = Vec::new();
                    reply.extend_from_slice(&buf[..2]);
                    reply.extend_from_slice(&[0x81, 0x80, 0, 1]);
                    reply.extend_from_slice(&answers.to_be_bytes());
                    reply.extend_from_slice(&[0, 0, 0, 0]);
                    reply.extend_from_slice(question);
                    if qtype == 1 {
                        reply.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
                        reply.extend_from_slice(&UPSTREAM_ANSWER.octets());
                    }
                    let _ = socket.send_to(&reply, from);
                }
            })
        };
        FakeResolver { names, stop, thread: Some(thread) }
    }

    fn names(&self) -> Vec<String> {
        self.names.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for FakeResolver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The first question of a DNS message: (dotted name, qtype, the question's bytes).
fn parse_question(msg: &[u8]) -> Option<(String, u16, &[u8])> {
    let mut pos = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*msg.get(pos)?);
        pos += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(msg.get(pos..pos + len)?).into_owned());
        pos += len;
    }
    let qtype = u16::from_be_bytes([*msg.get(pos)?, *msg.get(pos + 1)?]);
    Some((labels.join("."), qtype, msg.get(12..pos + 4)?))
}

/// Query types the tests ask for.
const A: u16 = 1;
const AAAA: u16 = 28;

/// A recursive query of type `qtype` for `name`.
fn dns_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(u8::try_from(label.len()).expect("short label"));
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    q
}

/// Skips a (possibly compressed) name starting at `pos`; returns the position after it.
fn skip_name(msg: &[u8], mut pos: usize) -> Option<usize> {
    loop {
        let len = *msg.get(pos)?;
        if len & 0xc0 == 0xc0 {
            return Some(pos + 2);
        }
        pos += 1 + usize::from(len);
        if len == 0 {
            return Some(pos);
        }
    }
}

/// (rcode, addresses of the A and AAAA records) of a response to query `id`.
fn dns_answers(msg: &[u8], id: u16) -> Result<(u8, Vec<IpAddr>), String> {
    if msg.len() < 12 || msg[..2] != id.to_be_bytes() || msg[2] & 0x80 == 0 {
        return Err(format!("not a response to query {id}: {msg:02x?}"));
    }
    let rcode = msg[3] & 0x0f;
    let questions = u16::from_be_bytes([msg[4], msg[5]]);
    let answers = u16::from_be_bytes([msg[6], msg[7]]);
    let truncated = || format!("truncated response: {msg:02x?}");
    let mut pos = 12;
    for _ in 0..questions {
        pos = skip_name(msg, pos).ok_or_else(truncated)? + 4;
    }
    let mut ips = Vec::new();
    for _ in 0..answers {
        pos = skip_name(msg, pos).ok_or_else(truncated)?;
        let field = |at: usize| msg.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
        let rtype = field(pos).ok_or_else(truncated)?;
        let rdlen = usize::from(field(pos + 8).ok_or_else(truncated)?);
        let rdata = msg.get(pos + 10..pos + 10 + rdlen).ok_or_else(truncated)?;
        match (rtype, <[u8; 4]>::try_from(rdata), <[u8; 16]>::try_from(rdata)) {
            (A, Ok(v4), _) => ips.push(IpAddr::V4(v4.into())),
            (AAAA, _, Ok(v6)) => ips.push(IpAddr::V6(v6.into())),
            _ => {}
        }
        pos += 10 + rdlen;
    }
    Ok((rcode, ips))
}

/// Sends one UDP query from inside `pod` to `server` and waits up to 3 s for the answer.
fn resolve(pod: &Pod, server: SocketAddr, id: u16, name: &str) -> Result<(u8, Vec<IpAddr>), String> {
    resolve_udp(pod, server, id, name, A)
}

/// Like [`resolve`] for any query type.
fn resolve_udp(
    pod: &Pod,
    server: SocketAddr,
    id: u16,
    name: &str,
    qtype: u16,
) -> Result<(u8, Vec<IpAddr>), String> {
    let query = dns_query(id, name, qtype);
    pod.run(|| {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(|e| e.to_string())?;
        socket.set_read_timeout(Some(Duration::from_secs(3))).map_err(|e| e.to_string())?;
        socket.send_to(&query, server).map_err(|e| format!("send: {e}"))?;
        let mut buf = [0u8; 1500];
        let (n, from) = socket.recv_from(&mut buf).map_err(|e| format!("no answer for {name}: {e}"))?;
        if from != server {
            return Err(format!("answer came from {from}, not {server}"));
        }
        dns_answers(&buf[..n], id)
    })
}

/// One query over TCP (two-byte length prefix, RFC 1035 §4.2.2) from inside `pod`; 3 s bound.
fn resolve_tcp(
    pod: &Pod,
    server: SocketAddr,
    id: u16,
    name: &str,
    qtype: u16,
) -> Result<(u8, Vec<IpAddr>), String> {
    use std::io::Write;
    let query = dns_query(id, name, qtype);
    let mut s = pod.connect_tcp(server).map_err(|e| format!("connect {server}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(3))).map_err(|e| e.to_string())?;
    let len = u16::try_from(query.len()).map_err(|e| e.to_string())?;
    s.write_all(&[&len.to_be_bytes()[..], &query].concat()).map_err(|e| format!("send: {e}"))?;
    let mut head = [0u8; 2];
    s.read_exact(&mut head).map_err(|e| format!("no answer for {name} over TCP: {e}"))?;
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(head))];
    s.read_exact(&mut msg).map_err(|e| format!("short answer for {name} over TCP: {e}"))?;
    dns_answers(&msg, id)
}

/// The mesh service of the DNS tests: `echo.default.svc.cluster.local` with an IPv4 and an
/// IPv6 VIP, served by `b`.
fn dns_service(vip4: Ipv4Addr, vip6: std::net::Ipv6Addr) -> String {
    format!(
        "- name: echo\n  namespace: default\n  hostname: echo.default.svc.cluster.local\n  vips: [\"/{vip4}\", \"/{vip6}\"]\n  ports: {{80: 8080}}\n"
    )
}

/// DNS capture: a mesh service name resolves to its VIPs (A and AAAA, over UDP and TCP) through
/// the in-pod DNS proxy (15053), and a name outside the mesh is forwarded to the node's resolver.
#[test]
fn dns_mesh_name_and_forwarding() {
    if !require_root() {
        return;
    }
    let s = Setup::new();
    let a = s.mesh.pod("a", "client");
    let b = s.mesh.pod("b", "server").in_service("default/echo.default.svc.cluster.local", 80, 8080);
    let dns_pod = s.mesh.outside_pod("dns");
    let upstream = FakeResolver::start(&dns_pod);
    let _etc = EtcNetns::resolv_conf(&s.node().netns, &format!("nameserver {}\n", dns_pod.ip4));
    let vip = s.mesh.vip4(10);
    let vip6: std::net::Ipv6Addr = "fd00:96:77::10".parse().expect("IPv6 VIP");
    s.mesh.write_config(&[&a, &b], &[], &[&dns_service(vip, vip6)]);
    let proxy = s.start_proxy(&[]);
    for p in [&a, &b] {
        enroll(&s.agent, p);
    }
    // Any IP on port 53 is captured (the pod has no resolver of its own).
    let server = SocketAddr::new(Ipv4Addr::new(10, 96, 0, 10).into(), 53);
    let name = "echo.default.svc.cluster.local";

    let mut last = Err(String::new());
    let answered = wait_for(
        || {
            last = resolve(&a.pod, server, 0x1234, name);
            last.as_ref().is_ok_and(|(rcode, ips)| *rcode == 0 && ips == &[IpAddr::V4(vip)])
        },
        Duration::from_secs(5),
    );
    assert!(answered, "mesh name not answered with the VIP {vip}: {last:?}\n{}", proxy.logs());
    assert_eq!(
        resolve_udp(&a.pod, server, 0x1235, name, AAAA),
        Ok((0, vec![IpAddr::V6(vip6)])),
        "AAAA over UDP"
    );
    assert_eq!(resolve_tcp(&a.pod, server, 0x1236, name, A), Ok((0, vec![IpAddr::V4(vip)])), "A over TCP");
    assert_eq!(
        resolve_tcp(&a.pod, server, 0x1237, name, AAAA),
        Ok((0, vec![IpAddr::V6(vip6)])),
        "AAAA over TCP"
    );
    assert!(
        !upstream.names().iter().any(|n| n.starts_with("echo.default")),
        "the mesh name was forwarded upstream: {:?}",
        upstream.names()
    );

    let forwarded = resolve(&a.pod, server, 0x4321, "example.test");
    let upstream_answer = vec![IpAddr::V4(UPSTREAM_ANSWER)];
    assert_eq!(forwarded, Ok((0, upstream_answer.clone())), "non-mesh name not forwarded:\n{}", proxy.logs());
    assert!(upstream.names().contains(&"example.test".to_owned()), "upstream saw {:?}", upstream.names());
    // The pod without capture rules is not affected: its query to the fake resolver is direct.
    assert_eq!(
        resolve(&dns_pod, SocketAddr::new(dns_pod.ip4.into(), 53), 7, "direct.test"),
        Ok((0, upstream_answer))
    );
}

/// Local (ip, port) pairs of the sockets listening inside the pod's netns, by protocol.
fn listening_addrs(pod: &Pod) -> BTreeSet<(&'static str, String)> {
    let out = pod.run_cmd("ss", &["-H", "-l", "-n", "-t", "-u"]);
    assert!(out.status.success(), "ss failed in {}: {}", pod.name, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let proto = match *fields.first()? {
                "tcp" => "tcp",
                "udp" => "udp",
                _ => return None,
            };
            Some((proto, (*fields.get(4)?).to_owned()))
        })
        .collect()
}

/// `IPV6_ENABLED=false`, as documented: a pod's listeners bind `0.0.0.0` (not `[::]`), the DNS
/// proxy listens on 127.0.0.1 only, and a mesh name gets no AAAA answer (NOERROR, empty) while
/// its A answer and IPv4 traffic work. The same pod with IPv6 on binds `[::]` and `[::1]`.
#[test]
fn ipv6_disabled() {
    if !require_root() {
        return;
    }
    let s = Setup::new();
    let a = s.mesh.pod("a", "client");
    let b = s.mesh.pod("b", "server").in_service("default/echo.default.svc.cluster.local", 80, 8080);
    let dns_pod = s.mesh.outside_pod("dns");
    let upstream = FakeResolver::start(&dns_pod);
    let _etc = EtcNetns::resolv_conf(&s.node().netns, &format!("nameserver {}\n", dns_pod.ip4));
    let vip = s.mesh.vip4(10);
    let vip6: std::net::Ipv6Addr = "fd00:96:77::10".parse().expect("IPv6 VIP");
    s.mesh.write_config(&[&a, &b], &[], &[&dns_service(vip, vip6)]);
    let proxy = s.start_proxy(&[("IPV6_ENABLED", "false")]);
    for p in [&a, &b] {
        enroll(&s.agent, p);
    }
    let expected: BTreeSet<(&str, String)> = [
        ("tcp", "0.0.0.0:15001"),
        ("tcp", "0.0.0.0:15006"),
        ("tcp", "0.0.0.0:15008"),
        ("tcp", "127.0.0.1:15053"),
        ("udp", "127.0.0.1:15053"),
    ]
    .into_iter()
    .map(|(p, a)| (p, a.to_owned()))
    .collect();
    assert_eq!(listening_addrs(&a.pod), expected, "listeners of a with IPV6_ENABLED=false");

    let server = SocketAddr::new(Ipv4Addr::new(10, 96, 0, 10).into(), 53);
    let name = "echo.default.svc.cluster.local";
    assert_eq!(resolve_udp(&a.pod, server, 1, name, A), Ok((0, vec![IpAddr::V4(vip)])), "A over UDP");
    assert_eq!(resolve_udp(&a.pod, server, 2, name, AAAA), Ok((0, vec![])), "AAAA over UDP");
    assert_eq!(resolve_tcp(&a.pod, server, 3, name, AAAA), Ok((0, vec![])), "AAAA over TCP");
    assert!(upstream.names().is_empty(), "mesh queries went upstream: {:?}", upstream.names());
    let _eb = b.pod.echo_server(8080);
    assert_echo(&a.pod, b.pod.addr4(8080), "IPv4 through HBONE with IPv6 disabled");
    drop(proxy);

    // Control: the same pods under a proxy with IPv6 on bind dual-stack and [::1].
    let s2 = Setup::new();
    let c = s2.mesh.pod("c", "client");
    s2.mesh.write_config(&[&c], &[], &[]);
    let _p2 = s2.start_proxy(&[]);
    enroll(&s2.agent, &c);
    let dual = listening_addrs(&c.pod);
    for want in [("tcp", "*:15001"), ("tcp", "*:15006"), ("tcp", "*:15008"), ("udp", "[::1]:15053")] {
        assert!(dual.contains(&(want.0, want.1.to_owned())), "IPv6 on: {want:?} not in {dual:?}");
    }
}

/// The pod's link-local IPv6 address on eth0, with eth0's index as its scope.
fn link_local(pod: &Pod) -> std::net::SocketAddrV6 {
    let out = pod.run_cmd("ip", &["-6", "-o", "addr", "show", "dev", "eth0", "scope", "link"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let ip: std::net::Ipv6Addr = text
        .split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("no link-local address on {}'s eth0: {text}", pod.name));
    let index = pod.run(|| nix::net::if_::if_nametoindex("eth0")).expect("eth0 index");
    std::net::SocketAddrV6::new(ip, 0, 0, index)
}

/// IPv6 link-local destinations fail closed, with a clear error where the proxy sees them.
/// Inbound: a neighbour's connection to the pod's link-local address is refused by the proxy
/// with the exact reason and closed at once (it used to be dialed without its scope and fail with
/// EINVAL; with the scope it cannot work either, see `passthrough.rs`). Outbound: the in-pod
/// capture redirects the app's connection to 15001, but the kernel cannot route a socket bound
/// to eth0 to the loopback, so it never reaches the proxy nor the destination (connect timeout).
#[test]
fn ipv6_link_local_destinations_fail_closed() {
    if !require_root() {
        return;
    }
    let s = Setup::new();
    let a = s.mesh.pod("a", "client");
    let b = s.mesh.pod("b", "server");
    let outside = s.mesh.outside_pod("o");
    s.mesh.write_config(&[&a, &b], &[], &[]);
    let proxy = s.start_proxy(&[]);
    for p in [&a, &b] {
        enroll(&s.agent, p);
    }
    let eb = b.pod.echo_server(8080);
    let eo = outside.echo_server(8080);
    let (ll_a, ll_b, ll_o) = (link_local(&a.pod), link_local(&b.pod), link_local(&outside));

    // Inbound plaintext to b's link-local address, from o on the same link.
    let to_b = std::net::SocketAddrV6::new(*ll_b.ip(), 8080, 0, ll_o.scope_id());
    let mut conn = outside.connect_tcp(to_b.into()).expect("the capture accepts the connection");
    conn.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let t0 = Instant::now();
    let _ = conn.write_all(MARKER);
    let mut rest = Vec::new();
    let read = conn.read_to_end(&mut rest);
    let closed_after = t0.elapsed();
    assert!(
        matches!(&read, Ok(0)) || read.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::ConnectionReset),
        "o -> [{to_b}]: {read:?}"
    );
    assert!(closed_after < Duration::from_secs(2), "closed only after {closed_after:?}");
    let reason = format!(
        "link-local destination [{}%{}]:8080: the mesh serves pods on their routable addresses only (a \
         link-local address names a link, not a workload); connect to the pod's IP instead",
        ll_b.ip(),
        link_local_scope_in(&b.pod)
    );
    assert!(
        wait_for(|| proxy.logs().contains(&reason), Duration::from_secs(2)),
        "the refusal is not logged as {reason:?}:\n{}",
        proxy.logs()
    );
    assert!(eb.peers().is_empty(), "the link-local connection reached b's app: {:?}", eb.peers());

    // Outbound from a captured pod to a link-local neighbour: it fails, closed.
    let to_o = SocketAddr::V6(std::net::SocketAddrV6::new(*ll_o.ip(), 8080, 0, ll_a.scope_id()));
    let t0 = Instant::now();
    let r = a.pod.run(|| TcpStream::connect_timeout(&to_o, Duration::from_secs(2)));
    let err = r.err().map(|e| e.kind());
    assert_eq!(err, Some(io::ErrorKind::TimedOut), "a -> [{to_o}] (o's link-local) after {:?}", t0.elapsed());
    assert!(eo.peers().is_empty(), "a link-local connection left the captured pod: {:?}", eo.peers());
    // Routable addresses work as ever.
    assert_echo(&outside, b.pod.addr6(8080), "o -> b's routable IPv6");
}

/// eth0's index inside the pod (the scope the proxy sees on connections accepted there).
fn link_local_scope_in(pod: &Pod) -> u32 {
    link_local(pod).scope_id()
}
