//! Outbound routing (§4.2): service VIPs, waypoints (§4.4), load balancing (§4.5), passthrough.

use std::cmp::Ordering;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ambit_identity::Identity;
use rand::Rng;

use super::State;
use super::model::{
    Destination, GatewayAddress, HBONE_PORT, LoadBalancer, LoadBalancerMode, LoadBalancerScope, Protocol,
    Service, Workload,
};

/// Where and how to send an outbound connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Transport to use.
    pub kind: RouteKind,
    /// The workload the connection actually goes to (the waypoint when through one).
    pub destination_workload: Option<Arc<Workload>>,
    /// The service the client addressed, if any (not the waypoint's service).
    pub destination_service: Option<Arc<Service>>,
}

/// Transport for an outbound connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteKind {
    /// HTTP/2 CONNECT over mTLS to `target` (ip:15008 or waypoint), :authority = `authority`, server must present one of `expected`.
    Hbone {
        /// L4 destination.
        target: SocketAddr,
        /// CONNECT `:authority`.
        authority: SocketAddr,
        /// Identities the server may present.
        expected: Vec<Identity>,
    },
    /// Plain TCP to a known TCP workload (target port resolved).
    Tcp {
        /// L4 destination.
        target: SocketAddr,
    },
    /// Unknown destination: plain TCP to the original destination, unchanged.
    Passthrough {
        /// The original destination.
        target: SocketAddr,
    },
}

/// Why an outbound connection cannot be routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// A service matched but no endpoint is usable.
    #[error("no healthy upstream: {0}")]
    NoHealthyUpstream(SocketAddr),
    /// A waypoint reference resolves to nothing (or to no usable endpoint).
    #[error("unknown waypoint: {0}")]
    UnknownWaypoint(String),
    /// The upstream is on another network behind an east-west gateway.
    #[error(
        "destination is on another network and reachable only through an east-west gateway \
         (double HBONE), which is not supported yet"
    )]
    DoubleHboneUnsupported,
    /// The upstream is on another network and has no gateway.
    #[error("workload {0} is on network {1:?}, different from the source's, and has no network gateway")]
    WrongNetwork(String, String),
    /// The workload has no address usable for this connection.
    #[error("no valid destination address for workload {0}")]
    NoValidDestination(String),
    /// The workload is reachable only through a DNS hostname, which is not resolved yet.
    #[error(
        "workload {0} has no IP address, only hostname {1:?}; resolving workload hostnames is not supported yet"
    )]
    HostnameOnlyWorkload(String, String),
}

/// How an endpoint's target port is chosen.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PortMode {
    /// Application traffic: the service port must exist on the service.
    Direct,
    /// Waypoint traffic on its HBONE port: kept if the service has the port or the workload has
    /// an application tunnel.
    Waypoint,
}

/// A resolved next hop.
struct Hop {
    workload: Arc<Workload>,
    target: SocketAddr,
    expected: Vec<Identity>,
}

impl State {
    /// Outbound decision (§4.2) for a connection from `source` to `orig_dst`, on this proxy's `network`.
    pub fn route_outbound(
        &self,
        source: &Workload,
        network: &str,
        orig_dst: SocketAddr,
    ) -> Result<Route, RouteError> {
        let dst_ip = orig_dst.ip();
        let service = self.service_by_vip(network, dst_ip, &source.namespace);

        // A service waypoint takes all service-addressed traffic (also for PASSTHROUGH services).
        if let Some(svc) = &service
            && let Some(gw) = pick_service_waypoint(svc)
        {
            let hop = self.resolve_waypoint(gw, source, dst_ip)?;
            return Ok(Route {
                kind: RouteKind::Hbone { target: hop.target, authority: orig_dst, expected: hop.expected },
                destination_workload: Some(hop.workload),
                destination_service: Some(svc.clone()),
            });
        }

        let upstream = match &service {
            Some(svc) if svc.is_passthrough() => None,
            Some(svc) => self.pick_endpoint(svc, source, orig_dst.port(), PortMode::Direct),
            None => self.workload_by_addr(network, dst_ip).map(|w| (w, orig_dst.port())),
        };
        let Some((workload, port)) = upstream else {
            return match &service {
                Some(svc) if !svc.is_passthrough() => Err(RouteError::NoHealthyUpstream(orig_dst)),
                _ => Ok(Route {
                    kind: RouteKind::Passthrough { target: orig_dst },
                    destination_workload: None,
                    destination_service: None,
                }),
            };
        };

        if workload.network != source.network {
            return Err(cross_network_error(&workload, service.is_some()));
        }

        // Workload-addressed traffic to a workload behind a waypoint goes through the waypoint,
        // unless the source is that waypoint.
        if service.is_none()
            && let Some(gw) = &workload.waypoint
            && !self.is_from_waypoint(source, gw)
        {
            let hop = self.resolve_waypoint(gw, source, dst_ip)?;
            return Ok(Route {
                kind: RouteKind::Hbone { target: hop.target, authority: orig_dst, expected: hop.expected },
                destination_workload: Some(hop.workload),
                destination_service: None,
            });
        }

        let ip = upstream_ip(&workload, dst_ip, service.as_deref())?;
        let kind = match workload.protocol {
            Protocol::Hbone => RouteKind::Hbone {
                target: SocketAddr::new(ip, HBONE_PORT),
                authority: SocketAddr::new(ip, port),
                expected: identities(&workload, service.as_deref()),
            },
            Protocol::Tcp => RouteKind::Tcp { target: SocketAddr::new(ip, port) },
        };
        Ok(Route { kind, destination_workload: Some(workload), destination_service: service })
    }

    /// Resolves a waypoint reference (§4.4) to a next hop on the source's network.
    fn resolve_waypoint(
        &self,
        gw: &GatewayAddress,
        source: &Workload,
        family_hint: IpAddr,
    ) -> Result<Hop, RouteError> {
        let port = gw.hbone_mtls_port;
        let unknown = || RouteError::UnknownWaypoint(gw.destination.to_string());
        let (workload, ip, svc) = match &gw.destination {
            Destination::Address(na) => {
                if let Some(svc) = self.lookup_vip(&na.network, na.address, None) {
                    self.waypoint_endpoint(&svc, source, port, na.address, &unknown)?
                } else {
                    // An address-form waypoint keeps the address (and so the family) it names.
                    let w = self.workload_by_addr(&na.network, na.address).ok_or_else(unknown)?;
                    (w, Some((na.address, port)), None)
                }
            }
            Destination::Hostname(nh) => {
                if let Some(svc) = self.service_by_name(&nh.namespace, &nh.hostname) {
                    self.waypoint_endpoint(&svc, source, port, family_hint, &unknown)?
                } else {
                    let w = self.workload_by_hostname(&nh.namespace, &nh.hostname).ok_or_else(unknown)?;
                    (w, None, None)
                }
            }
        };
        if workload.network != source.network {
            return Err(cross_network_error(&workload, true));
        }
        let target = match ip {
            Some((ip, port)) => SocketAddr::new(ip, port),
            None => SocketAddr::new(upstream_ip(&workload, family_hint, svc.as_deref())?, port),
        };
        Ok(Hop { expected: identities(&workload, svc.as_deref()), workload, target })
    }

    /// Load-balances over a waypoint service's endpoints on its HBONE port.
    #[allow(clippy::type_complexity)]
    fn waypoint_endpoint(
        &self,
        svc: &Arc<Service>,
        source: &Workload,
        port: u16,
        family_hint: IpAddr,
        unknown: &dyn Fn() -> RouteError,
    ) -> Result<(Arc<Workload>, Option<(IpAddr, u16)>, Option<Arc<Service>>), RouteError> {
        let (w, target_port) =
            self.pick_endpoint(svc, source, port, PortMode::Waypoint).ok_or_else(unknown)?;
        let ip = if w.network == source.network {
            Some((upstream_ip(&w, family_hint, Some(svc))?, target_port))
        } else {
            None
        };
        Ok((w, ip, Some(svc.clone())))
    }

    /// Load balancing (§4.5): picks an endpoint of `svc` for `svc_port` and its target port.
    fn pick_endpoint(
        &self,
        svc: &Service,
        source: &Workload,
        svc_port: u16,
        mode: PortMode,
    ) -> Option<(Arc<Workload>, u16)> {
        let svc_target = svc.ports.get(&svc_port).copied();
        if mode == PortMode::Direct && svc_target.is_none() {
            return None;
        }
        let mut best_rank = 0usize;
        let mut candidates: Vec<(Arc<Workload>, u16)> = Vec::new();
        for ep in svc.endpoints.values() {
            let Some(w) = self.workloads.get(&*ep.workload_uid) else {
                continue;
            };
            if w.capacity == 0 || !reachable(w, source, svc) {
                continue;
            }
            let target = match (ep.port.get(&svc_port), svc_target) {
                (Some(p), _) => *p,
                (None, Some(t)) if t != 0 => t,
                _ if w.application_tunnel.is_some() => svc_port,
                _ => continue,
            };
            let Some(rank) = rank(svc.load_balancer.as_ref(), source, w) else {
                continue;
            };
            match rank.cmp(&best_rank) {
                Ordering::Greater => {
                    candidates.clear();
                    best_rank = rank;
                    candidates.push((w.clone(), target));
                }
                Ordering::Equal => candidates.push((w.clone(), target)),
                Ordering::Less => {}
            }
        }
        weighted_choice(&candidates).cloned()
    }

    /// Whether `source` is the waypoint `gw` (same identity and a shared address).
    fn is_from_waypoint(&self, source: &Workload, gw: &GatewayAddress) -> bool {
        let is_source = |w: &Workload| {
            same_identity(w, source) && w.workload_ips.iter().any(|ip| source.workload_ips.contains(ip))
        };
        let svc_has_source = |svc: &Service| {
            svc.endpoints.keys().filter_map(|uid| self.workloads.get(uid)).any(|w| is_source(w))
        };
        match &gw.destination {
            Destination::Address(na) => match self.lookup_vip(&na.network, na.address, None) {
                Some(svc) => svc_has_source(&svc),
                None => self.workload_by_addr(&na.network, na.address).is_some_and(|w| is_source(&w)),
            },
            Destination::Hostname(nh) => match self.service_by_name(&nh.namespace, &nh.hostname) {
                Some(svc) => svc_has_source(&svc),
                None => self.workload_by_hostname(&nh.namespace, &nh.hostname).is_some_and(|w| is_source(&w)),
            },
        }
    }
}

/// The service waypoint for this connection: a weighted sample of `weighted_waypoints`, else
/// `waypoint`.
fn pick_service_waypoint(svc: &Service) -> Option<&GatewayAddress> {
    let total: u64 = svc.weighted_waypoints.iter().map(|w| u64::from(w.weight)).sum();
    if total == 0 {
        return svc.waypoint.as_ref();
    }
    let mut x = rand::rng().random_range(0..total);
    for w in &svc.weighted_waypoints {
        let weight = u64::from(w.weight);
        if x < weight {
            return Some(&w.destination);
        }
        x -= weight;
    }
    svc.waypoint.as_ref()
}

/// Whether an endpoint workload has some way to be reached from `source`.
fn reachable(w: &Workload, source: &Workload, svc: &Service) -> bool {
    if w.network != source.network && w.network_gateway.is_some() {
        return true;
    }
    w.workload_ips.iter().any(|ip| svc.allows_family(*ip)) || !w.hostname.is_empty()
}

/// Locality rank of `w` for `source` (§4.5); `None` drops the endpoint (STRICT mismatch).
fn rank(lb: Option<&LoadBalancer>, source: &Workload, w: &Workload) -> Option<usize> {
    let lb = match lb {
        Some(lb) if matches!(lb.mode, LoadBalancerMode::Strict | LoadBalancerMode::Failover) => lb,
        _ => return Some(0),
    };
    let prefs = &lb.routing_preferences;
    let mut rank = 0;
    let mut all = true;
    for (i, scope) in prefs.iter().enumerate() {
        let matches = match scope {
            LoadBalancerScope::Region => source.locality.region == w.locality.region,
            LoadBalancerScope::Zone => source.locality.zone == w.locality.zone,
            LoadBalancerScope::Subzone => source.locality.subzone == w.locality.subzone,
            LoadBalancerScope::Node => source.node == w.node,
            LoadBalancerScope::Cluster => source.cluster_id == w.cluster_id,
            LoadBalancerScope::Network => source.network == w.network,
        };
        if i == 0 && *scope == LoadBalancerScope::Network {
            // A leading NETWORK preference dominates: a match outranks any combination of the
            // remaining scopes, and a mismatch does not stop the remaining comparisons.
            if matches {
                rank += prefs.len();
            } else {
                all = false;
            }
            continue;
        }
        if !matches {
            all = false;
            break;
        }
        rank += 1;
    }
    // STRICT keeps only endpoints that match every preference.
    if lb.mode == LoadBalancerMode::Strict && !all {
        return None;
    }
    Some(rank)
}

/// Random choice weighted by workload capacity.
fn weighted_choice(candidates: &[(Arc<Workload>, u16)]) -> Option<&(Arc<Workload>, u16)> {
    let total: u64 = candidates.iter().map(|(w, _)| u64::from(w.capacity)).sum();
    if total == 0 {
        return None;
    }
    let mut x = rand::rng().random_range(0..total);
    for c in candidates {
        let weight = u64::from(c.0.capacity);
        if x < weight {
            return Some(c);
        }
        x -= weight;
    }
    candidates.last()
}

/// Upstream IP of a workload: the dialed IP if it is one of the workload's, else among the
/// IPs the service's families allow, the first of the dialed family, else the first.
fn upstream_ip(w: &Workload, dst: IpAddr, svc: Option<&Service>) -> Result<IpAddr, RouteError> {
    if w.workload_ips.contains(&dst) {
        return Ok(dst);
    }
    let allowed = || w.workload_ips.iter().copied().filter(|ip| svc.is_none_or(|s| s.allows_family(*ip)));
    if let Some(ip) = allowed().find(|ip| ip.is_ipv4() == dst.is_ipv4()).or_else(|| allowed().next()) {
        return Ok(ip);
    }
    if w.hostname.is_empty() {
        Err(RouteError::NoValidDestination(w.uid.to_string()))
    } else {
        Err(RouteError::HostnameOnlyWorkload(w.uid.to_string(), w.hostname.to_string()))
    }
}

/// Identities accepted for a workload reached (possibly) as an endpoint of `svc`: the workload's
/// own identity, then the service's subject alt names.
fn identities(w: &Workload, svc: Option<&Service>) -> Vec<Identity> {
    let mut out = vec![w.identity()];
    for san in svc.iter().flat_map(|s| s.subject_alt_names.iter()) {
        if let Ok(id) = san.parse::<Identity>()
            && !out.contains(&id)
        {
            out.push(id);
        }
    }
    out
}

fn cross_network_error(w: &Workload, service_addressed: bool) -> RouteError {
    if service_addressed && w.network_gateway.is_some() {
        RouteError::DoubleHboneUnsupported
    } else {
        RouteError::WrongNetwork(w.uid.to_string(), w.network.to_string())
    }
}

fn same_identity(a: &Workload, b: &Workload) -> bool {
    a.namespace == b.namespace
        && a.effective_service_account() == b.effective_service_account()
        && a.effective_trust_domain() == b.effective_trust_domain()
}
