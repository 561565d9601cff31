//! Cluster topology: node namespaces with a bridge and pod namespaces on veths.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::EchoServer;
use super::pcap::Capture;
use super::process::ChildGuard;
use super::sockets::{connect_tcp_in, connect_with, listen_tcp_in, run_in};

pub(super) use ambit_cluster::ip::NETNS_DIR;
/// Highest host index handed out in the cluster subnet (.1 is the first node's bridge).
const MAX_HOST: u8 = 250;

/// A test cluster: a random IPv4 /24 and IPv6 /64 shared by its nodes' bridges; deletes every
/// namespace it created (and kills processes left inside them) when dropped, also on panic.
pub struct Cluster {
    inner: Arc<Inner>,
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
    inner: Arc<Inner>,
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

struct Inner {
    /// Prefix of every namespace name: `amb<pid>-<4 hex>`.
    tag: String,
    /// Random 4-hex suffix, also used in interface names.
    hex: String,
    v4: [u8; 3],
    v6: [u16; 3],
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Namespaces in creation order (deleted in reverse).
    namespaces: Vec<String>,
    next_host: u8,
    nodes: usize,
    gateway4: Option<Ipv4Addr>,
    gateway6: Option<Ipv6Addr>,
}

impl Cluster {
    /// Creates a cluster with one node named "node"; panics if the namespaces cannot be built.
    pub fn new() -> Cluster {
        remove_stale_namespaces();
        let inner = loop {
            let hex = format!("{:04x}", rand::random::<u16>());
            let tag = format!("amb{}-{hex}", std::process::id());
            let taken = std::fs::read_dir(NETNS_DIR).is_ok_and(|dir| {
                dir.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&format!("{tag}-")))
            });
            if !taken {
                // 10.96.0.0/12 is left free for made-up service VIPs.
                let v4 = [10, 128 + rand::random::<u8>() % 120, rand::random::<u8>()];
                let v6 = [0xfd00 | u16::from(rand::random::<u8>()), rand::random(), rand::random()];
                break Arc::new(Inner {
                    tag,
                    hex,
                    v4,
                    v6,
                    state: Mutex::new(State { next_host: 1, ..State::default() }),
                });
            }
        };
        let mut cluster = Cluster { first: Node::placeholder(Arc::clone(&inner)), inner };
        cluster.first = cluster.add_node("node");
        cluster
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
        check_name(name);
        let inner = &self.inner;
        let netns = inner.create_netns(name);
        let index = {
            let mut state = inner.lock();
            state.nodes += 1;
            state.nodes
        };
        let bridge = format!("br{}", inner.hex);
        let (ip4, ip6) = inner.allocate();
        sysctls(&netns, &[("net.ipv6.conf.all.accept_dad", "0")]);
        sysctls(&netns, &[("net.ipv6.conf.default.accept_dad", "0")]);
        ip(&netns, &["link", "set", "lo", "up"]);
        ip(&netns, &["link", "add", &bridge, "type", "bridge"]);
        ip(&netns, &["link", "set", &bridge, "type", "bridge", "forward_delay", "0"]);
        ip(&netns, &["link", "set", &bridge, "type", "bridge", "mcast_snooping", "0"]);
        ip(&netns, &["link", "set", &bridge, "up"]);
        ip(&netns, &["addr", "add", &format!("{ip4}/24"), "dev", &bridge]);
        ip(&netns, &["-6", "addr", "add", &format!("{ip6}/64"), "dev", &bridge, "nodad"]);
        if index > 1 {
            // Trunk between this node's bridge and the first node's bridge.
            let here = format!("v{}n{index}", inner.hex);
            let there = format!("v{}m{index}", inner.hex);
            let first = &self.first;
            host_ip(&[
                "link",
                "add",
                &here,
                "netns",
                &netns,
                "type",
                "veth",
                "peer",
                "name",
                &there,
                "netns",
                &first.netns,
            ]);
            ip(&netns, &["link", "set", &here, "master", &bridge, "up"]);
            ip(&first.netns, &["link", "set", &there, "master", &first.bridge, "up"]);
        } else {
            let mut state = inner.lock();
            state.gateway4 = Some(ip4);
            state.gateway6 = Some(ip6);
        }
        Node { name: name.to_owned(), netns, bridge, ip4, ip6, inner: Arc::clone(inner) }
    }

    /// Every namespace this cluster created, in creation order.
    pub fn namespaces(&self) -> Vec<String> {
        self.inner.lock().namespaces.clone()
    }

    /// The cluster's pod subnet, e.g. `10.171.4.0/24`.
    pub fn subnet4(&self) -> String {
        let [a, b, c] = self.inner.v4;
        format!("{a}.{b}.{c}.0/24")
    }

    /// The cluster's IPv6 pod subnet, e.g. `fd12:3456:789a::/64`.
    pub fn subnet6(&self) -> String {
        let [a, b, c] = self.inner.v6;
        format!("{a:x}:{b:x}:{c:x}::/64")
    }
}

impl Default for Cluster {
    fn default() -> Cluster {
        Cluster::new()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let namespaces = std::mem::take(&mut self.inner.lock().namespaces);
        for ns in namespaces.iter().rev() {
            kill_processes_in(ns);
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

impl Node {
    fn placeholder(inner: Arc<Inner>) -> Node {
        Node {
            name: String::new(),
            netns: String::new(),
            bridge: String::new(),
            ip4: Ipv4Addr::UNSPECIFIED,
            ip6: Ipv6Addr::UNSPECIFIED,
            inner,
        }
    }

    /// Creates a pod namespace attached to this node's bridge (lo up, v4+v6 addresses without
    /// DAD, default routes, `net.ipv4.tcp_migrate_req=1`).
    pub fn add_pod(&self, name: &str) -> Pod {
        check_name(name);
        let inner = &self.inner;
        let netns = inner.create_netns(name);
        let (ip4, ip6) = inner.allocate();
        let (gw4, gw6) = {
            let state = inner.lock();
            (state.gateway4, state.gateway6)
        };
        let gw4 = gw4.unwrap_or(self.ip4);
        let gw6 = gw6.unwrap_or(self.ip6);
        let host = ip4.octets()[3];
        let peer = format!("v{}p{host}", inner.hex);
        sysctls(
            &netns,
            &[
                ("net.ipv6.conf.all.accept_dad", "0"),
                ("net.ipv6.conf.default.accept_dad", "0"),
                ("net.ipv4.tcp_migrate_req", "1"),
            ],
        );
        host_ip(&[
            "link",
            "add",
            "eth0",
            "netns",
            &netns,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "netns",
            &self.netns,
        ]);
        ip(&self.netns, &["link", "set", &peer, "master", &self.bridge, "up"]);
        ip(&netns, &["link", "set", "lo", "up"]);
        ip(&netns, &["link", "set", "eth0", "up"]);
        ip(&netns, &["addr", "add", &format!("{ip4}/24"), "dev", "eth0"]);
        ip(&netns, &["-6", "addr", "add", &format!("{ip6}/64"), "dev", "eth0", "nodad"]);
        ip(&netns, &["route", "add", "default", "via", &gw4.to_string(), "dev", "eth0"]);
        ip(&netns, &["-6", "route", "add", "default", "via", &gw6.to_string(), "dev", "eth0"]);
        Pod { name: name.to_owned(), netns, ip4, ip6 }
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

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates `<tag>-<name>` and records it for cleanup before configuring anything.
    fn create_netns(&self, name: &str) -> String {
        let netns = format!("{}-{name}", self.tag);
        let mut state = self.lock();
        assert!(!state.namespaces.contains(&netns), "name {name:?} used twice in one cluster");
        host_ip(&["netns", "add", &netns]);
        state.namespaces.push(netns.clone());
        netns
    }

    fn allocate(&self) -> (Ipv4Addr, Ipv6Addr) {
        let mut state = self.lock();
        let host = state.next_host;
        assert!(host <= MAX_HOST, "cluster is full ({MAX_HOST} addresses)");
        state.next_host += 1;
        let [a, b, c] = self.v4;
        let [x, y, z] = self.v6;
        (Ipv4Addr::new(a, b, c, host), Ipv6Addr::new(x, y, z, 0, 0, 0, 0, u16::from(host)))
    }
}

/// `ip netns exec <netns> program args...`
fn exec_in(netns: &str, program: impl AsRef<Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]).arg(program.as_ref()).args(args);
    cmd
}

/// Runs `ip -n <netns> args...`; panics with stderr on failure.
fn ip(netns: &str, args: &[&str]) {
    let mut cmd = Command::new("ip");
    cmd.args(["-n", netns]).args(args);
    checked(cmd);
}

/// Runs `ip args...` from the test's own namespace; panics with stderr on failure.
fn host_ip(args: &[&str]) {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    checked(cmd);
}

fn sysctls(netns: &str, settings: &[(&str, &str)]) {
    let mut cmd = exec_in(netns, "sysctl", &["-q", "-w"]);
    for (key, value) in settings {
        cmd.arg(format!("{key}={value}"));
    }
    checked(cmd);
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

fn check_name(name: &str) {
    assert!(
        !name.is_empty()
            && name.len() <= 24
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "name {name:?} must be 1-24 chars of [a-z0-9-]"
    );
}

/// Kills (SIGKILL, by pid) processes still running inside one of our namespaces.
fn kill_processes_in(netns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", netns]).output() else {
        return;
    };
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
    if !out.stdout.is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Deletes `amb<pid>-*` namespaces whose creating test process no longer exists (left behind by
/// a test run that was killed before its guards could run).
fn remove_stale_namespaces() {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("amb")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            kill_processes_in(&name);
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
}
