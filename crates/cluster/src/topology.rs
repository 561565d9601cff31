//! The cluster network: one L2 segment (a bridge in a namespace of its own, the "fabric") that
//! every node namespace joins with a veth, each node with a pod CIDR of its own and a route to
//! every other node's pod CIDR through that node's segment address. Nothing is added to the
//! host's own namespace: the host's routes, links and firewall are untouched, and removing the
//! cluster's namespaces removes all of it.
//!
//! ```text
//!   <tag>-fabric:  bridge "fabric" 10.<s>.<t>.254/24
//!        │ veth                       │ veth
//!   <tag>-node1:  eth0 10.<s>.<t>.1   <tag>-node2:  eth0 10.<s>.<t>.2
//!     pods 10.<p>.1.0/24 on the CNI     pods 10.<p>.2.0/24
//!     bridge; route 10.<p>.2.0/24       route 10.<p>.1.0/24 via 10.<s>.<t>.1
//!     via 10.<s>.<t>.2
//! ```
//!
//! Hosts (the control plane) join the segment the same way, with no pod CIDR but routes to all.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::ip::{self, CommandError};

/// Longest namespace name part a caller may give (the tag and a dash come before it).
pub const MAX_NAME: usize = 24;
/// Longest tag.
pub const MAX_TAG: usize = 14;
/// Most members (nodes and hosts) one segment holds.
pub const MAX_MEMBERS: usize = 250;

/// A request for a network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkSpec {
    /// Prefix of every namespace name, e.g. `ambit` (`ambit-fabric`, `ambit-node1`). 1–14
    /// characters of `[a-z0-9]`. Tests use `ambc<pid><n>`, which the CI's leak check knows.
    pub tag: String,
    /// The node names, in order (node i gets pod CIDR `10.<pods>.<i+1>.0/24`).
    pub nodes: Vec<String>,
    /// Namespaces on the segment without pods (the control plane's).
    pub hosts: Vec<String>,
    /// Second and third octet of the segment `10.a.b.0/24`.
    pub segment: (u8, u8),
    /// Second octet of the pod CIDRs `10.<pods>.<node>.0/24`.
    pub pods: u8,
}

/// One member of the segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The name given (`node1`, `control`).
    pub name: String,
    /// Its namespace (`ip netns` name).
    pub netns: String,
    /// Its address on the segment (on its `eth0`).
    pub ip: Ipv4Addr,
    /// Its pod CIDR (`10.p.i.0/24`) and the pods' gateway (`.1`, the CNI bridge), for a node.
    pub pods: Option<PodCidr>,
}

/// A node's pod addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodCidr {
    /// The network address of the /24.
    pub network: Ipv4Addr,
    /// The gateway the CNI bridge holds (`.1`).
    pub gateway: Ipv4Addr,
}

impl PodCidr {
    /// `a.b.c.0/24`.
    pub fn cidr(&self) -> String {
        format!("{}/24", self.network)
    }

    /// Whether `ip` is in it.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        ip.octets()[..3] == self.network.octets()[..3]
    }
}

/// A built network; [`Network::teardown`] removes it (also after the process that built it is
/// gone: see [`remove_tagged`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Network {
    /// The tag.
    pub tag: String,
    /// The fabric namespace holding the bridge.
    pub fabric: String,
    /// The segment's gateway-less /24, e.g. `10.250.0.0/24`.
    pub segment: String,
    /// Nodes, in order.
    pub nodes: Vec<Member>,
    /// Hosts.
    pub hosts: Vec<Member>,
}

/// Why a network could not be built.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// A name or the tag is malformed.
    #[error("{what} {name:?} must be 1-{max} characters of [a-z0-9-], starting with a letter or digit")]
    Name {
        /// `node name` or `host name`.
        what: &'static str,
        /// The name.
        name: String,
        /// Its bound.
        max: usize,
    },
    /// The tag is malformed.
    #[error("tag {0:?} must be 1-{MAX_TAG} characters of [a-z0-9]")]
    Tag(String),
    /// Two members have one name.
    #[error("the name {0:?} is used twice")]
    Duplicate(String),
    /// Too many members, or no node.
    #[error("a network holds 1 to {MAX_MEMBERS} nodes and hosts; asked for {0} nodes and {1} hosts")]
    Size(usize, usize),
    /// A namespace of that name exists: another cluster (or a leftover) uses the tag.
    #[error(
        "network namespace {0} already exists (a cluster with this tag is up, or was not torn down: `ambit down`)"
    )]
    Exists(String),
    /// A command failed; what was built so far has been removed.
    #[error(transparent)]
    Command(#[from] CommandError),
}

fn valid_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && !name.starts_with('-')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl NetworkSpec {
    fn check(&self) -> Result<(), NetworkError> {
        if !valid_name(&self.tag, MAX_TAG) || self.tag.contains('-') {
            return Err(NetworkError::Tag(self.tag.clone()));
        }
        let total = self.nodes.len() + self.hosts.len();
        if self.nodes.is_empty() || total > MAX_MEMBERS {
            return Err(NetworkError::Size(self.nodes.len(), self.hosts.len()));
        }
        let mut seen = std::collections::BTreeSet::from(["fabric"]);
        for (what, names) in [("node name", &self.nodes), ("host name", &self.hosts)] {
            for n in names {
                if !valid_name(n, MAX_NAME) {
                    return Err(NetworkError::Name { what, name: n.clone(), max: MAX_NAME });
                }
                if !seen.insert(n.as_str()) {
                    return Err(NetworkError::Duplicate(n.clone()));
                }
            }
        }
        Ok(())
    }

    /// The plan: every member's namespace, address and pod CIDR (nothing is created).
    pub fn plan(&self) -> Result<Network, NetworkError> {
        self.check()?;
        let (a, b) = self.segment;
        let member = |i: usize, name: &String, pods: bool| {
            let host = u8::try_from(i + 1).unwrap_or(u8::MAX);
            Member {
                name: name.clone(),
                netns: format!("{}-{name}", self.tag),
                ip: Ipv4Addr::new(10, a, b, host),
                pods: pods.then(|| PodCidr {
                    network: Ipv4Addr::new(10, self.pods, host, 0),
                    gateway: Ipv4Addr::new(10, self.pods, host, 1),
                }),
            }
        };
        let nodes: Vec<Member> = self.nodes.iter().enumerate().map(|(i, n)| member(i, n, true)).collect();
        let hosts: Vec<Member> =
            self.hosts.iter().enumerate().map(|(i, n)| member(self.nodes.len() + i, n, false)).collect();
        Ok(Network {
            tag: self.tag.clone(),
            fabric: format!("{}-fabric", self.tag),
            segment: format!("10.{a}.{b}.0/24"),
            nodes,
            hosts,
        })
    }

    /// Builds the network. On any failure what was created is removed again.
    pub fn build(&self) -> Result<Network, NetworkError> {
        let net = self.plan()?;
        for ns in net.namespaces() {
            if ip::netns_exists(&ns) {
                return Err(NetworkError::Exists(ns));
            }
        }
        match net.create() {
            Ok(()) => Ok(net),
            Err(e) => {
                net.teardown();
                Err(e.into())
            }
        }
    }
}

impl Network {
    /// Every namespace of the network: the fabric, the nodes, the hosts.
    pub fn namespaces(&self) -> Vec<String> {
        std::iter::once(self.fabric.clone()).chain(self.members().map(|m| m.netns.clone())).collect()
    }

    /// Nodes, then hosts.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.nodes.iter().chain(&self.hosts)
    }

    /// The node or host `name`.
    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members().find(|m| m.name == name)
    }

    /// The fabric bridge's address (`.254`).
    pub fn fabric_ip(&self) -> Ipv4Addr {
        let ip = self.nodes.first().map_or(Ipv4Addr::UNSPECIFIED, |m| m.ip).octets();
        Ipv4Addr::new(ip[0], ip[1], ip[2], 254)
    }

    fn create(&self) -> Result<(), CommandError> {
        let fabric = &self.fabric;
        ip::add_netns(fabric)?;
        ip::inside(fabric, &["link", "set", "lo", "up"])?;
        ip::inside(fabric, &["link", "add", "fabric", "type", "bridge"])?;
        ip::inside(fabric, &["link", "set", "fabric", "type", "bridge", "forward_delay", "0"])?;
        ip::inside(fabric, &["link", "set", "fabric", "up"])?;
        ip::inside(fabric, &["addr", "add", &format!("{}/24", self.fabric_ip()), "dev", "fabric"])?;
        for (i, m) in self.members().enumerate() {
            ip::add_netns(&m.netns)?;
            ip::sysctls(&m.netns, &[("net.ipv4.ip_forward", "1"), ("net.ipv6.conf.all.accept_dad", "0")])?;
            ip::inside(&m.netns, &["link", "set", "lo", "up"])?;
            // eth0 in the member, its peer on the fabric bridge.
            let port = format!("p{i}");
            ip::add_veth("eth0", &m.netns, &port, fabric)?;
            ip::inside(fabric, &["link", "set", &port, "master", "fabric", "up"])?;
            ip::inside(&m.netns, &["addr", "add", &format!("{}/24", m.ip), "dev", "eth0"])?;
            ip::inside(&m.netns, &["link", "set", "eth0", "up"])?;
        }
        // Routes to every node's pods through that node (not to one's own: the CNI bridge
        // plugin adds that route when it creates the pods' bridge).
        for m in self.members() {
            for n in &self.nodes {
                if n.name == m.name {
                    continue;
                }
                if let Some(p) = &n.pods {
                    ip::inside(
                        &m.netns,
                        &["route", "add", &p.cidr(), "via", &n.ip.to_string(), "dev", "eth0"],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Removes every namespace of the network (killing what runs inside); what is already gone
    /// is skipped. Returns the errors of what could not be removed.
    pub fn teardown(&self) -> Vec<CommandError> {
        let mut errors = Vec::new();
        // Members first, the fabric last: veths go with either end.
        for ns in self.namespaces().iter().rev() {
            if let Err(e) = ip::delete_netns(ns) {
                errors.push(e);
            }
        }
        errors
    }
}

/// Removes every namespace whose name starts with `<tag>-` (after a crash, when no record of
/// the network survived). Returns the names removed and the errors.
pub fn remove_tagged(tag: &str) -> (Vec<String>, Vec<CommandError>) {
    let mut removed = Vec::new();
    let mut errors = Vec::new();
    for ns in ip::netns_with_prefix(&format!("{tag}-")) {
        match ip::delete_netns(&ns) {
            Ok(()) => removed.push(ns),
            Err(e) => errors.push(e),
        }
    }
    (removed, errors)
}

/// One node `node1` and one host `control`, tag `ambit` (planned, not built): for unit tests.
#[cfg(test)]
pub(crate) fn sample_network() -> Network {
    NetworkSpec {
        tag: "ambit".into(),
        nodes: vec!["node1".into()],
        hosts: vec!["control".into()],
        segment: (250, 0),
        pods: 244,
    }
    .plan()
    .unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> NetworkSpec {
        NetworkSpec {
            tag: "t1".into(),
            nodes: vec!["node1".into(), "node2".into()],
            hosts: vec!["control".into()],
            segment: (250, 7),
            pods: 244,
        }
    }

    #[test]
    fn the_plan_gives_each_node_a_pod_cidr_and_everyone_a_segment_address() {
        let net = spec().plan().expect("plan");
        assert_eq!(net.fabric, "t1-fabric");
        assert_eq!(net.segment, "10.250.7.0/24");
        assert_eq!(net.fabric_ip(), Ipv4Addr::new(10, 250, 7, 254));
        let n2 = net.member("node2").expect("node2");
        assert_eq!((n2.netns.as_str(), n2.ip), ("t1-node2", Ipv4Addr::new(10, 250, 7, 2)));
        let pods = n2.pods.expect("pods");
        assert_eq!((pods.cidr(), pods.gateway), ("10.244.2.0/24".to_owned(), Ipv4Addr::new(10, 244, 2, 1)));
        assert!(
            pods.contains(Ipv4Addr::new(10, 244, 2, 77)) && !pods.contains(Ipv4Addr::new(10, 244, 1, 77))
        );
        let control = net.member("control").expect("control");
        assert_eq!((control.ip, control.pods), (Ipv4Addr::new(10, 250, 7, 3), None));
        assert_eq!(net.namespaces(), ["t1-fabric", "t1-node1", "t1-node2", "t1-control"]);
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let with = |f: &dyn Fn(&mut NetworkSpec)| {
            let mut s = spec();
            f(&mut s);
            s.plan().expect_err("refused").to_string()
        };
        assert_eq!(with(&|s| s.tag = "Bad".into()), "tag \"Bad\" must be 1-14 characters of [a-z0-9]");
        assert_eq!(with(&|s| s.nodes[1] = "node1".into()), "the name \"node1\" is used twice");
        assert_eq!(with(&|s| s.hosts[0] = "fabric".into()), "the name \"fabric\" is used twice");
        assert_eq!(
            with(&|s| s.nodes[0] = "-x".into()),
            "node name \"-x\" must be 1-24 characters of [a-z0-9-], starting with a letter or digit"
        );
        assert_eq!(
            with(&|s| s.nodes.clear()),
            "a network holds 1 to 250 nodes and hosts; asked for 0 nodes and 1 hosts"
        );
    }
}
