//! A flat dual-stack segment: the topology of the proxy's own end-to-end tests, where a test
//! chooses every pod and address itself and no CNI runs. Node namespaces each hold a Linux
//! bridge; the first node's bridge carries the segment's gateway addresses (.1 and ::1) and every
//! other node's bridge is trunked to it with a veth, so all nodes and pods share one L2 segment
//! with a random IPv4 /24 and IPv6 /64. A pod is a namespace whose `eth0` is a veth on its node's
//! bridge, with static addresses from the segment and default routes through the gateway.
//!
//! [`crate::topology`] is the other topology, the one `ambit up` builds: routed nodes with a pod
//! CIDR each and pods made by the CNI chain. Both live here so that the tests, the benchmarks and
//! `ambit up` share one implementation of each.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::ip::{self, CommandError};

/// Highest host index handed out (.1 is the first node's bridge).
pub const MAX_HOST: u8 = 250;
/// Longest node or pod name.
pub const MAX_NAME: usize = 24;

/// Why a segment member could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// A name is malformed.
    #[error("name {0:?} must be 1-{MAX_NAME} characters of [a-z0-9-]")]
    Name(String),
    /// A name is taken.
    #[error("name {0:?} is used twice in one segment")]
    Duplicate(String),
    /// Every address is handed out.
    #[error("the segment is full ({MAX_HOST} addresses)")]
    Full,
    /// A command failed.
    #[error(transparent)]
    Command(#[from] CommandError),
}

/// A node: a namespace with a bridge that its pods' veths attach to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentNode {
    /// The name given.
    pub name: String,
    /// Its namespace.
    pub netns: String,
    /// Its bridge.
    pub bridge: String,
    /// The bridge's IPv4 address (the first node's is the pods' gateway).
    pub ip4: Ipv4Addr,
    /// The bridge's IPv6 address.
    pub ip6: Ipv6Addr,
}

/// A pod: a namespace with `eth0` on a node's bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentPod {
    /// The name given.
    pub name: String,
    /// Its namespace.
    pub netns: String,
    /// Its IPv4 address.
    pub ip4: Ipv4Addr,
    /// Its IPv6 address.
    pub ip6: Ipv6Addr,
}

#[derive(Default)]
struct State {
    /// Namespaces in creation order (deleted in reverse).
    namespaces: Vec<String>,
    next_host: u8,
    nodes: usize,
    gateway: Option<(Ipv4Addr, Ipv6Addr)>,
    first: Option<SegmentNode>,
}

/// A segment; [`Segment::teardown`] removes every namespace it made.
pub struct Segment {
    tag: String,
    /// Suffix of its link names (unique per segment on the host).
    hex: String,
    v4: [u8; 3],
    v6: [u16; 3],
    state: Mutex<State>,
}

impl Segment {
    /// A segment whose namespaces are `<tag>-<name>`, with subnets `a.b.c.0/24` and
    /// `x:y:z::/64`, and link names ending in `hex`. Nothing is created yet.
    pub fn new(tag: &str, hex: &str, v4: [u8; 3], v6: [u16; 3]) -> Segment {
        Segment {
            tag: tag.to_owned(),
            hex: hex.to_owned(),
            v4,
            v6,
            state: Mutex::new(State { next_host: 1, ..State::default() }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The IPv4 subnet, e.g. `10.171.4.0/24`.
    pub fn subnet4(&self) -> String {
        let [a, b, c] = self.v4;
        format!("{a}.{b}.{c}.0/24")
    }

    /// The IPv6 subnet, e.g. `fd12:3456:789a::/64`.
    pub fn subnet6(&self) -> String {
        let [a, b, c] = self.v6;
        format!("{a:x}:{b:x}:{c:x}::/64")
    }

    /// Every namespace made so far, in creation order.
    pub fn namespaces(&self) -> Vec<String> {
        self.lock().namespaces.clone()
    }

    /// Creates `<tag>-<name>` and records it for removal before configuring anything.
    fn create_netns(&self, name: &str) -> Result<String, SegmentError> {
        if name.is_empty()
            || name.len() > MAX_NAME
            || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(SegmentError::Name(name.to_owned()));
        }
        let netns = format!("{}-{name}", self.tag);
        let mut state = self.lock();
        if state.namespaces.contains(&netns) {
            return Err(SegmentError::Duplicate(name.to_owned()));
        }
        ip::add_netns(&netns)?;
        state.namespaces.push(netns.clone());
        Ok(netns)
    }

    fn allocate(&self) -> Result<(Ipv4Addr, Ipv6Addr), SegmentError> {
        let mut state = self.lock();
        let host = state.next_host;
        if host > MAX_HOST {
            return Err(SegmentError::Full);
        }
        state.next_host += 1;
        let [a, b, c] = self.v4;
        let [x, y, z] = self.v6;
        Ok((Ipv4Addr::new(a, b, c, host), Ipv6Addr::new(x, y, z, 0, 0, 0, 0, u16::from(host))))
    }

    /// Adds a node; the first one's bridge holds the gateway addresses, later ones are trunked
    /// to it.
    pub fn add_node(&self, name: &str) -> Result<SegmentNode, SegmentError> {
        let netns = self.create_netns(name)?;
        let index = {
            let mut state = self.lock();
            state.nodes += 1;
            state.nodes
        };
        let bridge = format!("br{}", self.hex);
        let (ip4, ip6) = self.allocate()?;
        ip::sysctls(
            &netns,
            &[("net.ipv6.conf.all.accept_dad", "0"), ("net.ipv6.conf.default.accept_dad", "0")],
        )?;
        ip::inside(&netns, &["link", "set", "lo", "up"])?;
        ip::inside(&netns, &["link", "add", &bridge, "type", "bridge"])?;
        ip::inside(&netns, &["link", "set", &bridge, "type", "bridge", "forward_delay", "0"])?;
        ip::inside(&netns, &["link", "set", &bridge, "type", "bridge", "mcast_snooping", "0"])?;
        ip::inside(&netns, &["link", "set", &bridge, "up"])?;
        ip::inside(&netns, &["addr", "add", &format!("{ip4}/24"), "dev", &bridge])?;
        ip::inside(&netns, &["-6", "addr", "add", &format!("{ip6}/64"), "dev", &bridge, "nodad"])?;
        let node =
            SegmentNode { name: name.to_owned(), netns: netns.clone(), bridge: bridge.clone(), ip4, ip6 };
        let first = self.lock().first.clone();
        match first {
            Some(first) if index > 1 => {
                let here = format!("v{}n{index}", self.hex);
                let there = format!("v{}m{index}", self.hex);
                ip::add_veth(&here, &netns, &there, &first.netns)?;
                ip::inside(&netns, &["link", "set", &here, "master", &bridge, "up"])?;
                ip::inside(&first.netns, &["link", "set", &there, "master", &first.bridge, "up"])?;
            }
            _ => {
                let mut state = self.lock();
                state.gateway = Some((ip4, ip6));
                state.first = Some(node.clone());
            }
        }
        Ok(node)
    }

    /// Adds a pod on `node`: `lo` up, v4 and v6 addresses without DAD, default routes through
    /// the gateway, `net.ipv4.tcp_migrate_req=1`.
    pub fn add_pod(&self, node: &SegmentNode, name: &str) -> Result<SegmentPod, SegmentError> {
        let netns = self.create_netns(name)?;
        let (ip4, ip6) = self.allocate()?;
        let (gw4, gw6) = self.lock().gateway.unwrap_or((node.ip4, node.ip6));
        let peer = format!("v{}p{}", self.hex, ip4.octets()[3]);
        ip::sysctls(
            &netns,
            &[
                ("net.ipv6.conf.all.accept_dad", "0"),
                ("net.ipv6.conf.default.accept_dad", "0"),
                ("net.ipv4.tcp_migrate_req", "1"),
            ],
        )?;
        ip::add_veth("eth0", &netns, &peer, &node.netns)?;
        ip::inside(&node.netns, &["link", "set", &peer, "master", &node.bridge, "up"])?;
        ip::inside(&netns, &["link", "set", "lo", "up"])?;
        ip::inside(&netns, &["link", "set", "eth0", "up"])?;
        ip::inside(&netns, &["addr", "add", &format!("{ip4}/24"), "dev", "eth0"])?;
        ip::inside(&netns, &["-6", "addr", "add", &format!("{ip6}/64"), "dev", "eth0", "nodad"])?;
        ip::inside(&netns, &["route", "add", "default", "via", &gw4.to_string(), "dev", "eth0"])?;
        ip::inside(&netns, &["-6", "route", "add", "default", "via", &gw6.to_string(), "dev", "eth0"])?;
        Ok(SegmentPod { name: name.to_owned(), netns, ip4, ip6 })
    }

    /// Kills what runs in each namespace and deletes them, newest first.
    pub fn teardown(&self) {
        let namespaces = std::mem::take(&mut self.lock().namespaces);
        for ns in namespaces.iter().rev() {
            let _ = ip::delete_netns(ns);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Deletes the namespaces `<prefix><pid>-*` whose creating process `<pid>` is gone (left by a
/// test run killed before it could clean up).
pub fn remove_stale(prefix: &str) {
    for name in ip::netns_with_prefix(prefix) {
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new("/proc").join(pid.to_string()).exists() {
            let _ = ip::delete_netns(&name);
        }
    }
}
