//! The proxy tests' cluster: `ambit_cluster::segment` (node namespaces with a bridge, pod
//! namespaces on veths, static dual-stack addresses), with what the tests do in it (exec,
//! connect, listen, echo servers, packet capture).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use super::EchoServer;
use super::pcap::Capture;
use super::process::ChildGuard;
use super::sockets::{connect_tcp_in, connect_with, listen_tcp_in, run_in};

pub(super) use ambit_cluster::ip::NETNS_DIR;
use ambit_cluster::segment::{Segment, SegmentNode};

/// A test cluster on `ambit_cluster::segment`: a random IPv4 /24 and IPv6 /64 shared by its
/// nodes' bridges; deletes every namespace it created (and kills processes left inside them)
/// when dropped, also on panic.
pub struct Cluster {
    inner: Arc<Segment>,
    first: Node,
}

/// A node: a network namespace holding a Linux bridge that the pods' veths attach to.
#[derive(Clone)]
pub struct Node {
    /// Short name given by the test.
    pub name: String,
    /// The node's network namespace (`ip netns` name).
    pub netns: String,
    /// Name of the bridge inside the node namespace.
    pub bridge: String,
    /// The bridge's IPv4 address (the first node's is the pods' default gateway).
    pub ip4: Ipv4Addr,
    /// The bridge's IPv6 address.
    pub ip6: Ipv6Addr,
    seg: SegmentNode,
    inner: Arc<Segment>,
}

/// A pod: a network namespace with `eth0` on a node bridge, IPv4 and IPv6 addresses and default
/// routes through the first node's bridge.
#[derive(Clone, Debug)]
pub struct Pod {
    /// Short name given by the test.
    pub name: String,
    /// The pod's network namespace (`ip netns` name).
    pub netns: String,
    /// The pod's IPv4 address.
    pub ip4: Ipv4Addr,
    /// The pod's IPv6 address.
    pub ip6: Ipv6Addr,
}

impl Cluster {
    /// Creates a cluster with one node named "node"; panics if the namespaces cannot be built.
    pub fn new() -> Cluster {
        ambit_cluster::segment::remove_stale("amb");
        let inner = loop {
            let hex = format!("{:04x}", rand::random::<u16>());
            let tag = format!("amb{}-{hex}", std::process::id());
            let taken = !ambit_cluster::ip::netns_with_prefix(&format!("{tag}-")).is_empty();
            if !taken {
                // 10.96.0.0/12 is left free for made-up service VIPs.
                let v4 = [10, 128 + rand::random::<u8>() % 120, rand::random::<u8>()];
                let v6 = [0xfd00 | u16::from(rand::random::<u8>()), rand::random(), rand::random()];
                break Arc::new(Segment::new(&tag, &hex, v4, v6));
            }
        };
        let first = Cluster::node_of(&inner, "node");
        Cluster { first, inner }
    }

    fn node_of(inner: &Arc<Segment>, name: &str) -> Node {
        let seg = inner.add_node(name).unwrap_or_else(|e| panic!("node {name}: {e}"));
        Node {
            name: seg.name.clone(),
            netns: seg.netns.clone(),
            bridge: seg.bridge.clone(),
            ip4: seg.ip4,
            ip6: seg.ip6,
            seg,
            inner: Arc::clone(inner),
        }
    }

    /// The first node (its bridge holds the .1 / ::1 gateway addresses).
    pub fn node(&self) -> &Node {
        &self.first
    }

    /// Adds a pod on the first node.
    pub fn add_pod(&self, name: &str) -> Pod {
        self.first.add_pod(name)
    }

    /// Adds another node whose bridge is joined to the first node's bridge (one L2 segment).
    pub fn add_node(&self, name: &str) -> Node {
        Cluster::node_of(&self.inner, name)
    }

    /// Every namespace this cluster created, in creation order.
    pub fn namespaces(&self) -> Vec<String> {
        self.inner.namespaces()
    }

    /// The cluster's pod subnet, e.g. `10.171.4.0/24`.
    pub fn subnet4(&self) -> String {
        self.inner.subnet4()
    }

    /// The cluster's IPv6 pod subnet, e.g. `fd12:3456:789a::/64`.
    pub fn subnet6(&self) -> String {
        self.inner.subnet6()
    }
}

impl Default for Cluster {
    fn default() -> Cluster {
        Cluster::new()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.inner.teardown();
    }
}

impl Node {
    /// Creates a pod namespace attached to this node's bridge (lo up, v4+v6 addresses without
    /// DAD, default routes, `net.ipv4.tcp_migrate_req=1`).
    pub fn add_pod(&self, name: &str) -> Pod {
        let p = self.inner.add_pod(&self.seg, name).unwrap_or_else(|e| panic!("pod {name}: {e}"));
        Pod { name: p.name, netns: p.netns, ip4: p.ip4, ip6: p.ip6 }
    }

    /// Starts tcpdump inside the node namespace on `iface` (`None` = this node's bridge, which
    /// sees all bridged pod traffic; `Some("any")` for every interface).
    pub fn tcpdump(&self, iface: Option<&str>) -> Capture {
        Capture::start(&self.netns, iface.unwrap_or(&self.bridge))
    }

    /// A command that runs `program args` inside the node namespace.
    pub fn exec(&self, program: impl AsRef<Path>, args: &[&str]) -> Command {
        exec_in(&self.netns, program, args)
    }

    /// Runs `f` on a fresh thread that has entered the node namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in(&self.netns, f)
    }
}

impl Pod {
    /// A command that runs `program args` inside the pod namespace (`ip netns exec`).
    pub fn exec(&self, program: impl AsRef<Path>, args: &[&str]) -> Command {
        exec_in(&self.netns, program, args)
    }

    /// Spawns `program args` in the pod namespace; the process is killed when the guard drops.
    pub fn spawn(&self, program: impl AsRef<Path>, args: &[&str]) -> ChildGuard {
        let label = format!("{} in {}", program.as_ref().display(), self.name);
        ChildGuard::spawn(&label, self.exec(program, args))
    }

    /// Runs `program args` in the pod namespace to completion; panics unless it succeeds.
    pub fn run_cmd(&self, program: impl AsRef<Path>, args: &[&str]) -> Output {
        checked(self.exec(program, args))
    }

    /// Runs `f` on a fresh thread that has entered the pod namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in(&self.netns, f)
    }

    /// Binds a TCP listener inside the pod namespace; panics if the bind fails.
    pub fn listen_tcp(&self, addr: SocketAddr) -> TcpListener {
        listen_tcp_in(&self.netns, addr)
            .unwrap_or_else(|e| panic!("cannot listen on {addr} in pod {}: {e}", self.name))
    }

    /// Connects from inside the pod namespace (5 s connect timeout).
    pub fn connect_tcp(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        connect_tcp_in(&self.netns, addr, None)
    }

    /// Connects from inside the pod namespace with `SO_MARK` set before connecting.
    pub fn connect_tcp_marked(&self, addr: SocketAddr, mark: u32) -> io::Result<TcpStream> {
        connect_tcp_in(&self.netns, addr, Some(mark))
    }

    /// Connects from inside the pod like the proxy's inbound side: `SO_MARK` `mark` and a
    /// transparent bind to `source` (an address the pod does not own, e.g. the client's IP).
    pub fn connect_tcp_spoofed(&self, source: IpAddr, addr: SocketAddr, mark: u32) -> io::Result<TcpStream> {
        run_in(&self.netns, || connect_with(addr, mark, Some(source)))
    }

    /// Starts an echo server on `[::]:port` (dual-stack) inside the pod namespace.
    pub fn echo_server(&self, port: u16) -> EchoServer {
        let listener = self.listen_tcp(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port));
        EchoServer::start(listener, self.ip4, self.ip6)
    }

    /// HTTP/1.1 GET from inside the pod namespace (e.g. the proxy's admin on 127.0.0.1:15000).
    pub fn http_get(&self, addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
        let stream = self.connect_tcp(addr)?;
        super::http_get_on(stream, addr, path)
    }

    /// The pod's IPv4 address with `port`.
    pub fn addr4(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip4.into(), port)
    }

    /// The pod's IPv6 address with `port`.
    pub fn addr6(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip6.into(), port)
    }
}

/// `ip netns exec <netns> program args...`
fn exec_in(netns: &str, program: impl AsRef<Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]).arg(program.as_ref()).args(args);
    cmd
}

/// Runs `cmd` to completion; panics with its stderr unless it exits successfully.
pub(super) fn checked(mut cmd: Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out
}
