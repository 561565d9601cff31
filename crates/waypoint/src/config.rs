//! The waypoint's configuration as typed values, parsed from the control plane's
//! `ambit.waypoint.v1` resources ([`ambit_api::waypoint`]), which are untrusted input.
//!
//! [`Snapshot::build`] parses every resource it is given and reports each refusal as a
//! [`ConfigError`]: a destination whose addresses, ports, regexes or headers cannot be read is
//! refused as a whole (half a route table would send requests where no rule says), an endpoint
//! that cannot be reached safely is left out, and policy values that cannot be read become the
//! authorization engine's [`Condition::Unenforceable`] (an ALLOW rule holding one never matches,
//! a DENY rule matches as if it held), never dropped. A destination naming a policy that is not
//! there (or was refused) denies every request until it arrives: fail closed.
//!
//! A snapshot is immutable; the server reads the current one through an `ArcSwap`, so a request
//! takes no lock the configuration path holds (see [`crate::Waypoint::set_config`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ambit_api::waypoint as api;
use ambit_identity::Identity;

use crate::authz::{self, Action, Condition, PolicySet};

/// The longest regular expression accepted, in bytes.
pub const MAX_REGEX_LEN: usize = 1024;
/// The most memory one compiled regular expression may take (the `regex` crate's size limit).
pub const REGEX_SIZE_LIMIT: usize = 256 * 1024;
/// Retries after the first attempt, at most.
pub const MAX_RETRIES: u32 = 10;

/// One immutable view of the configuration: destinations by resource name and by the
/// (address, port) the node proxies send their CONNECTs to.
#[derive(Debug, Default)]
pub struct Snapshot {
    destinations: HashMap<String, Arc<Destination>>,
    bound: HashMap<SocketAddr, (Arc<Destination>, Port)>,
    /// Bound destinations without ports (workloads in no Service): every port, sniffed.
    any_port: HashMap<IpAddr, Arc<Destination>>,
}

/// Something the waypoint serves or sends to (a Service or a workload).
#[derive(Debug)]
pub struct Destination {
    /// The resource name (`<gw-ns>/<gw-name>/<name>`, opaque).
    pub resource: String,
    /// Service or workload.
    pub kind: DestinationKind,
    /// The Service's or pod's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The Service's hostname (empty for a workload).
    pub hostname: String,
    /// Whether this waypoint serves it.
    pub bound: bool,
    /// VIPs or workload IPs.
    pub addresses: Vec<IpAddr>,
    /// Its ports.
    pub ports: Vec<Port>,
    /// Where its requests go.
    pub endpoints: Vec<Arc<Endpoint>>,
    /// Route rules in precedence order.
    pub routes: Vec<Arc<Route>>,
    /// The authorization policies of requests for it.
    pub policies: PolicySet,
    /// Identities a backend of this destination may present besides the endpoint's own.
    pub subject_alt_names: Vec<Identity>,
    /// Round-robin cursor of the endpoint choice.
    pub(crate) cursor: AtomicUsize,
}

/// Service or workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestinationKind {
    /// A Service.
    Service,
    /// A workload.
    Workload,
}

/// One port of a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// The port clients dial.
    pub port: u16,
    /// The endpoints' port.
    pub target_port: u16,
    /// How the waypoint reads its traffic.
    pub protocol: Protocol,
    /// The port's name.
    pub name: String,
}

/// Istio's protocol selection of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Sniffed: HTTP/1.1 or HTTP/2 prior knowledge, else TCP.
    Undeclared,
    /// Opaque bytes.
    Tcp,
    /// HTTP/1.1 (upstream too).
    Http,
    /// HTTP/2 (upstream too).
    Http2,
    /// gRPC: HTTP/2.
    Grpc,
}

/// How an endpoint is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tunnel {
    /// HBONE through its node proxy at `address:15008`.
    Hbone,
    /// Plain TCP.
    None,
}

/// One endpoint of a destination.
#[derive(Debug)]
pub struct Endpoint {
    /// The workload's IP.
    pub address: IpAddr,
    /// Its identity (required for HBONE).
    pub identity: Option<Identity>,
    /// How it is reached.
    pub tunnel: Tunnel,
    /// Service port → target port, for named target ports.
    pub ports: HashMap<u16, u16>,
    /// Whether it takes traffic.
    pub healthy: bool,
    /// Its uid (telemetry).
    pub uid: String,
    /// Its workload's name (telemetry: `destination_workload`).
    pub workload_name: String,
    /// Its namespace (telemetry: `destination_workload_namespace`).
    pub namespace: String,
    /// Requests in flight to it (least-request balancing).
    pub(crate) active: AtomicUsize,
}

/// Why (part of) a resource was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The destination cannot be used; it is left out of the snapshot.
    #[error("destination {resource} refused: {reason}")]
    Destination {
        /// The resource name.
        resource: String,
        /// Why.
        reason: String,
    },
    /// One endpoint cannot be reached safely; it is left out.
    #[error("destination {resource}: endpoint {index} left out: {reason}")]
    Endpoint {
        /// The destination's resource name.
        resource: String,
        /// The endpoint's index.
        index: usize,
        /// Why.
        reason: String,
    },
    /// Two bound destinations claim one address and port; the first by name keeps it.
    #[error("{addr} is claimed by {kept} and {refused}; requests go to {kept}")]
    Conflict {
        /// The address.
        addr: SocketAddr,
        /// The destination that keeps it.
        kept: String,
        /// The one that does not get it.
        refused: String,
    },
    /// The policy cannot be used; destinations naming it deny every request.
    #[error("policy {resource} refused: {reason}; destinations naming it deny every request")]
    Policy {
        /// The resource name.
        resource: String,
        /// Why.
        reason: String,
    },
    /// A destination names a policy that is not there: it denies every request.
    #[error(
        "destination {resource} names policy {policy}, which is not in the configuration: its requests are denied until it arrives"
    )]
    MissingPolicy {
        /// The destination.
        resource: String,
        /// The missing policy.
        policy: String,
    },
    /// A policy condition that cannot be enforced as written (see [`authz::Unenforceable`]).
    #[error("{0}")]
    Unenforceable(authz::Unenforceable),
}

impl Snapshot {
    /// Parses `destinations` and `policies` (resource name, message) into a snapshot, with every
    /// refusal reported.
    pub fn build(
        destinations: &[(String, api::Destination)],
        policies: &[(String, api::Policy)],
    ) -> (Snapshot, Vec<ConfigError>) {
        let mut errors = Vec::new();
        let mut parsed_policies = HashMap::new();
        for (resource, policy) in policies {
            match parse_policy(policy) {
                Ok(p) => {
                    parsed_policies.insert(resource.clone(), p);
                }
                Err(reason) => errors.push(ConfigError::Policy { resource: resource.clone(), reason }),
            }
        }
        let mut sorted: Vec<&(String, api::Destination)> = destinations.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut snapshot = Snapshot::default();
        for (resource, message) in sorted {
            let destination = match parse_destination(resource, message, &parsed_policies, &mut errors) {
                Ok(d) => Arc::new(d),
                Err(reason) => {
                    errors.push(ConfigError::Destination { resource: resource.clone(), reason });
                    continue;
                }
            };
            for u in destination.policies.unenforceable() {
                errors.push(ConfigError::Unenforceable(u));
            }
            if destination.bound && destination.ports.is_empty() {
                for ip in &destination.addresses {
                    match snapshot.any_port.get(ip) {
                        Some(kept) => errors.push(ConfigError::Conflict {
                            addr: SocketAddr::new(*ip, 0),
                            kept: kept.resource.clone(),
                            refused: resource.clone(),
                        }),
                        None => {
                            snapshot.any_port.insert(*ip, destination.clone());
                        }
                    }
                }
            }
            if destination.bound {
                for ip in &destination.addresses {
                    for port in &destination.ports {
                        let addr = SocketAddr::new(*ip, port.port);
                        match snapshot.bound.get(&addr) {
                            Some((kept, _)) => errors.push(ConfigError::Conflict {
                                addr,
                                kept: kept.resource.clone(),
                                refused: resource.clone(),
                            }),
                            None => {
                                snapshot.bound.insert(addr, (destination.clone(), port.clone()));
                            }
                        }
                    }
                }
            }
            snapshot.destinations.insert(resource.clone(), destination);
        }
        (snapshot, errors)
    }

    /// The destination of [`Snapshot::bound`] alone, without copying its port.
    pub fn bound_destination(&self, addr: SocketAddr) -> Option<&Arc<Destination>> {
        match self.bound.get(&addr) {
            Some((d, _)) => Some(d),
            None => self.any_port.get(&addr.ip()),
        }
    }

    /// The destination and port the node proxies send `addr` (a CONNECT's `:authority`) to: a
    /// port the destination lists, else, for a destination that lists none (a workload in no
    /// Service), `addr`'s port as dialed, sniffed.
    pub fn bound(&self, addr: SocketAddr) -> Option<(Arc<Destination>, Port)> {
        if let Some(found) = self.bound.get(&addr) {
            return Some(found.clone());
        }
        let d = self.any_port.get(&addr.ip())?;
        let port = Port {
            port: addr.port(),
            target_port: addr.port(),
            protocol: Protocol::Undeclared,
            name: String::new(),
        };
        Some((d.clone(), port))
    }

    /// A destination by resource name.
    pub fn destination(&self, resource: &str) -> Option<&Arc<Destination>> {
        self.destinations.get(resource)
    }

    /// Number of destinations.
    pub fn len(&self) -> usize {
        self.destinations.len()
    }

    /// Whether there are no destinations.
    pub fn is_empty(&self) -> bool {
        self.destinations.is_empty()
    }
}

impl Destination {
    /// The port `port` of this destination.
    pub fn port(&self, port: u16) -> Option<&Port> {
        self.ports.iter().find(|p| p.port == port)
    }
}

impl Endpoint {
    /// The port to dial for the destination port `port` (its named target port, else
    /// `target`).
    pub fn target_port(&self, port: &Port) -> u16 {
        self.ports.get(&port.port).copied().unwrap_or(port.target_port)
    }

    /// Requests in flight to this endpoint.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }
}

fn parse_destination(
    resource: &str,
    d: &api::Destination,
    policies: &HashMap<String, authz::Policy>,
    errors: &mut Vec<ConfigError>,
) -> Result<Destination, String> {
    let kind = match api::destination::Kind::try_from(d.kind) {
        Ok(api::destination::Kind::Service) => DestinationKind::Service,
        Ok(api::destination::Kind::Workload) => DestinationKind::Workload,
        Err(_) => return Err(format!("unknown kind {}", d.kind)),
    };
    let addresses = d
        .addresses
        .iter()
        .enumerate()
        .map(|(i, a)| {
            ip(a).ok_or_else(|| format!("address {i} has {} bytes; an IP address has 4 or 16", a.len()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ports = d.ports.iter().map(parse_port).collect::<Result<Vec<_>, _>>()?;
    let mut endpoints = Vec::new();
    for (index, e) in d.endpoints.iter().enumerate() {
        match parse_endpoint(e) {
            Ok(e) => endpoints.push(Arc::new(e)),
            Err(reason) => {
                errors.push(ConfigError::Endpoint { resource: resource.to_owned(), index, reason })
            }
        }
    }
    let routes = d
        .routes
        .iter()
        .map(|r| routes::parse_route(r).map(Arc::new).map_err(|e| format!("route {:?}: {e}", r.name)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut resolved = Vec::new();
    for name in &d.policies {
        match policies.get(name) {
            Some(p) => resolved.push(p.clone()),
            None => {
                errors
                    .push(ConfigError::MissingPolicy { resource: resource.to_owned(), policy: name.clone() });
                resolved.push(deny_all(name));
            }
        }
    }
    let subject_alt_names = d
        .subject_alt_names
        .iter()
        .map(|s| s.parse::<Identity>().map_err(|e| format!("subject alt name {s:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Destination {
        resource: resource.to_owned(),
        kind,
        name: d.name.clone(),
        namespace: d.namespace.clone(),
        hostname: d.hostname.clone(),
        bound: d.bound,
        addresses,
        ports,
        endpoints,
        routes,
        policies: PolicySet::new(resolved),
        subject_alt_names,
        cursor: AtomicUsize::new(0),
    })
}

/// The stand-in for a policy that is not there: a DENY whose one condition cannot be enforced,
/// so it matches every request (and every connection).
fn deny_all(name: &str) -> authz::Policy {
    let (namespace, short) = name.rsplit_once('/').unwrap_or(("", name));
    authz::Policy {
        name: short.to_owned(),
        namespace: namespace.to_owned(),
        action: Action::Deny,
        rules: vec![authz::Rule {
            when: vec![Condition::Unenforceable {
                key: "policy".into(),
                reason: format!("policy {name} is not in the configuration"),
            }],
            ..authz::Rule::default()
        }],
    }
}

fn ip(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

pub(super) fn port_number(n: u32, what: &str) -> Result<u16, String> {
    match u16::try_from(n) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(format!("{what} {n} is not a port (1-65535)")),
    }
}

fn parse_port(p: &api::Port) -> Result<Port, String> {
    let port = port_number(p.port, "port")?;
    let target_port = if p.target_port == 0 { port } else { port_number(p.target_port, "target port")? };
    let protocol = match api::Protocol::try_from(p.protocol) {
        Ok(api::Protocol::Undeclared) => Protocol::Undeclared,
        Ok(api::Protocol::Tcp) => Protocol::Tcp,
        Ok(api::Protocol::Http) => Protocol::Http,
        Ok(api::Protocol::Http2) => Protocol::Http2,
        Ok(api::Protocol::Grpc) => Protocol::Grpc,
        Err(_) => return Err(format!("port {port}: unknown protocol {}", p.protocol)),
    };
    Ok(Port { port, target_port, protocol, name: p.name.clone() })
}

fn parse_endpoint(e: &api::Endpoint) -> Result<Endpoint, String> {
    let address = ip(&e.address)
        .ok_or_else(|| format!("address has {} bytes; an IP address has 4 or 16", e.address.len()))?;
    let tunnel = match ambit_api::workload::TunnelProtocol::try_from(e.tunnel) {
        Ok(ambit_api::workload::TunnelProtocol::Hbone) => Tunnel::Hbone,
        Ok(ambit_api::workload::TunnelProtocol::None) => Tunnel::None,
        _ => return Err(format!("tunnel protocol {} is not supported (HBONE and NONE are)", e.tunnel)),
    };
    let identity = if e.identity.is_empty() {
        None
    } else {
        Some(e.identity.parse::<Identity>().map_err(|err| format!("identity {:?}: {err}", e.identity))?)
    };
    if tunnel == Tunnel::Hbone && identity.is_none() {
        return Err("an HBONE endpoint needs an identity (its node proxy must present it)".into());
    }
    let mut ports = HashMap::new();
    for (service, target) in &e.ports {
        ports.insert(port_number(*service, "service port")?, port_number(*target, "target port")?);
    }
    Ok(Endpoint {
        address,
        identity,
        tunnel,
        ports,
        healthy: e.healthy,
        uid: e.uid.clone(),
        workload_name: e.workload_name.clone(),
        namespace: e.namespace.clone(),
        active: AtomicUsize::new(0),
    })
}

mod dump;
mod policy;
mod routes;

pub use dump::{DestinationDump, EndpointDump, RouteDump};
pub use policy::parse_policy;
pub use routes::{
    Backend, Filter, HeaderModifier, Match, Mirror, PathMatch, PathRewrite, Redirect, Retry, Rewrite, Route,
    StringMatch,
};

#[cfg(test)]
mod tests;
