//! Services and ServiceEntries → `istio.workload.Service` (`control-plane.md` §3), one hostname
//! at a time, since several objects may claim the same hostname (§3.5).

use std::net::IpAddr;

use ambit_api::workload::{
    AppProtocol, IpFamilies, LoadBalancing, NetworkAddress, Port, Service, load_balancing,
};
use ambit_objects::Service as KubeService;
use ambit_objects::istio::ServiceEntry;
use ambit_objects::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use ipnet::IpNet;
use tracing::debug;

use super::Ctx;
use super::index::ServiceSource;
use super::names::{self, Name};
use super::waypoints;

/// One hostname's outcome: the winning object per namespace, and the Services they publish.
#[derive(Default)]
pub(crate) struct HostResult {
    pub winners: Vec<(String, ServiceSource)>,
    pub services: Vec<Service>,
}

/// Every Service published for `host`.
pub(crate) fn hostname(ctx: &Ctx<'_>, host: &str, deps: &mut Vec<Name>) -> HostResult {
    struct Candidate<'a> {
        source: &'a ServiceSource,
        kube: bool,
        age: (Option<&'a ambit_objects::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>, &'a Name),
        service: Service,
    }
    let mut candidates: Vec<Candidate<'_>> = Vec::new();
    for source in ctx.store.hosts.get(host).into_iter().flatten() {
        let built = match source {
            ServiceSource::Service(n) => ctx.store.services.get(n).and_then(|s| {
                kube_service(ctx, n, s, deps)
                    .map(|svc| (true, s.metadata.creation_timestamp.as_ref(), n, svc))
            }),
            ServiceSource::Entry(n) => ctx.store.entries.get(n).and_then(|se| {
                entry_service(ctx, n, se, host, deps)
                    .map(|svc| (false, se.metadata.creation_timestamp.as_ref(), n, svc))
            }),
        };
        if let Some((kube, ts, n, service)) = built {
            candidates.push(Candidate { source, kube, age: (ts, n), service });
        }
    }
    // Per namespace: the Kubernetes Service, else the oldest ServiceEntry.
    candidates
        .sort_by(|a, b| (a.age.1.ns.as_str(), !a.kube, a.age).cmp(&(b.age.1.ns.as_str(), !b.kube, b.age)));
    candidates.dedup_by(|later, first| later.age.1.ns == first.age.1.ns);
    // Canonical: the Kubernetes Service, else the oldest survivor (every survivor is PUBLIC).
    let canonical = candidates
        .iter()
        .enumerate()
        .min_by(|(_, a), (_, b)| (!a.kube, a.age).cmp(&(!b.kube, b.age)))
        .map(|(i, _)| i);
    let mut out = HostResult::default();
    for (i, mut c) in candidates.into_iter().enumerate() {
        c.service.canonical = Some(i) == canonical;
        out.winners.push((c.age.1.ns.clone(), c.source.clone()));
        out.services.push(c.service);
    }
    out
}

/// A Kubernetes Service (§3.1); `None` for ExternalName or an unparsable cluster IP.
fn kube_service(ctx: &Ctx<'_>, n: &Name, svc: &KubeService, deps: &mut Vec<Name>) -> Option<Service> {
    let spec = svc.spec.clone().unwrap_or_default();
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    let ips = match spec.cluster_ips.as_ref().filter(|v| !v.is_empty()) {
        Some(ips) => ips.clone(),
        None => spec.cluster_ip.iter().cloned().collect(),
    };
    let mut addresses = Vec::new();
    for ip in ips.iter().filter(|ip| !ip.is_empty() && *ip != "None") {
        let Ok(ip) = ip.parse::<IpAddr>() else {
            debug!(service = %n, ip, "cluster IP does not parse; service not published");
            return None;
        };
        addresses.push(NetworkAddress {
            network: ctx.network.to_owned(),
            address: names::ip_bytes(ip),
            length: None,
        });
    }
    let mut ports = Vec::new();
    for p in spec.ports.iter().flatten() {
        let Some(service_port) = port_number(p.port) else { continue };
        let target_port = match &p.target_port {
            Some(IntOrString::Int(t)) => port_number(*t).unwrap_or(0),
            _ => 0,
        };
        let app_protocol = if p.protocol.as_deref() == Some("UDP") {
            AppProtocol::Unknown
        } else {
            app_protocol(p.app_protocol.as_deref().or(p.name.as_deref()).unwrap_or_default(), service_port)
        };
        ports.push(Port { service_port, target_port, app_protocol: app_protocol as i32 });
    }
    let labels = names::labels(&svc.metadata);
    let annotations = names::annotations(&svc.metadata);
    let wp = waypoints::for_service(ctx, &n.ns, labels, annotations, deps);
    let ip_families = match spec.ip_families.as_deref().unwrap_or_default() {
        [_, _] => IpFamilies::Dual,
        [f] if f == "IPv4" => IpFamilies::Ipv4Only,
        [f] if f == "IPv6" => IpFamilies::Ipv6Only,
        _ => IpFamilies::Automatic,
    };
    // §3.2: internalTrafficPolicy Local, else the traffic distribution, then (independently)
    // publishNotReadyAddresses.
    let mut lb = if spec.internal_traffic_policy.as_deref() == Some("Local") {
        Some(LoadBalancing {
            routing_preference: vec![load_balancing::Scope::Node as i32],
            mode: load_balancing::Mode::Strict as i32,
            health_policy: 0,
        })
    } else {
        spec.traffic_distribution
            .as_deref()
            .and_then(distribution)
            .or_else(|| annotated_distribution(ctx, &n.ns, annotations))
    };
    if spec.publish_not_ready_addresses == Some(true) {
        lb.get_or_insert_with(LoadBalancing::default).health_policy =
            load_balancing::HealthPolicy::AllowAll as i32;
    }
    Some(Service {
        name: n.name.clone(),
        namespace: n.ns.clone(),
        hostname: names::service_hostname(n, &ctx.settings.domain_suffix),
        addresses,
        ports,
        waypoint: wp.waypoint,
        load_balancing: lb,
        ip_families: ip_families as i32,
        canonical: true,
        ingress_use_waypoint: wp.ingress_use_waypoint,
        weighted_waypoints: wp.weighted,
        ..Service::default()
    })
}

/// A ServiceEntry's Service for one of its hosts (§3.4); `None` when an address does not parse.
fn entry_service(
    ctx: &Ctx<'_>,
    n: &Name,
    se: &ServiceEntry,
    host: &str,
    deps: &mut Vec<Name>,
) -> Option<Service> {
    let addresses = entry_addresses(ctx, n, se, host)?;
    let ports = se
        .spec
        .ports
        .iter()
        .filter(|p| (1..=65535).contains(&p.number))
        .map(|p| Port {
            service_port: p.number,
            target_port: if p.target_port == 0 { p.number } else { p.target_port },
            app_protocol: app_protocol(&p.protocol, p.number) as i32,
        })
        .collect();
    let labels = names::labels(&se.metadata);
    let annotations = names::annotations(&se.metadata);
    let wp = waypoints::for_service(ctx, &n.ns, labels, annotations, deps);
    let lb = if resolution(se) == "NONE" {
        Some(LoadBalancing {
            routing_preference: vec![],
            mode: load_balancing::Mode::Passthrough as i32,
            health_policy: load_balancing::HealthPolicy::AllowAll as i32,
        })
    } else {
        annotated_distribution(ctx, &n.ns, annotations)
    };
    Some(Service {
        name: n.name.clone(),
        namespace: n.ns.clone(),
        hostname: host.to_owned(),
        addresses,
        ports,
        subject_alt_names: se.spec.subject_alt_names.clone(),
        waypoint: wp.waypoint,
        load_balancing: lb,
        canonical: true,
        ingress_use_waypoint: wp.ingress_use_waypoint,
        weighted_waypoints: wp.weighted,
        ..Service::default()
    })
}

/// `spec.resolution`, `NONE` when empty (the proto default).
pub(crate) fn resolution(se: &ServiceEntry) -> &str {
    if se.spec.resolution.is_empty() { "NONE" } else { &se.spec.resolution }
}

/// `spec.addresses` (IPs or CIDRs, CIDRs masked), else the auto-allocated ones for `host`.
fn entry_addresses(ctx: &Ctx<'_>, n: &Name, se: &ServiceEntry, host: &str) -> Option<Vec<NetworkAddress>> {
    let network = ctx.network.to_owned();
    if !se.spec.addresses.is_empty() {
        let mut out = Vec::new();
        for a in &se.spec.addresses {
            let parsed = if a.contains('/') {
                a.parse::<IpNet>().ok().map(|net| {
                    let net = net.trunc();
                    let length =
                        (net.prefix_len() != net.max_prefix_len()).then_some(u32::from(net.prefix_len()));
                    (net.addr(), length)
                })
            } else {
                a.parse::<IpAddr>().ok().map(|ip| (ip, None))
            };
            let Some((ip, length)) = parsed else {
                debug!(service_entry = %n, address = a, "address does not parse; no services published");
                return None;
            };
            out.push(NetworkAddress { network: network.clone(), address: names::ip_bytes(ip), length });
        }
        return Some(out);
    }
    let resolution = resolution(se);
    let opted_out =
        names::labels(&se.metadata).get(names::AUTOALLOCATE_LABEL).map(String::as_str) == Some("false");
    if resolution == "NONE" || opted_out || (host.starts_with('*') && resolution != "DYNAMIC_DNS") {
        return Some(Vec::new());
    }
    let status = se.status.as_ref().map(|s| s.addresses.as_slice()).unwrap_or_default();
    Some(
        status
            .iter()
            .filter(|a| a.host == host)
            .filter_map(|a| a.value.parse::<IpAddr>().ok())
            .map(|ip| NetworkAddress { network: network.clone(), address: names::ip_bytes(ip), length: None })
            .collect(),
    )
}

/// A port number from the API's `i32`.
pub(crate) fn port_number(p: i32) -> Option<u32> {
    u32::try_from(p).ok().filter(|p| (1..=65535).contains(p))
}

/// §3.3: a port name, `appProtocol` or ServiceEntry protocol → AppProtocol.
pub(crate) fn app_protocol(name: &str, port: u32) -> AppProtocol {
    match name {
        "kubernetes.io/h2c" => return AppProtocol::Http2,
        "kubernetes.io/ws" => return AppProtocol::Http11,
        "kubernetes.io/wss" => return AppProtocol::Tls,
        _ => {}
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("grpc-web") {
        return AppProtocol::Unknown;
    }
    match lower.split('-').next().unwrap_or_default() {
        "http" => AppProtocol::Http11,
        "http2" => AppProtocol::Http2,
        "grpc" => AppProtocol::Grpc,
        "https" | "tls" => AppProtocol::Tls,
        "tcp" => AppProtocol::Tcp,
        _ if matches!(port, 25 | 53 | 3306 | 27017) => AppProtocol::Tcp,
        _ => AppProtocol::Unknown,
    }
}

/// `PreferClose`/`PreferSameZone`/`PreferSameNode` → FAILOVER with its scopes.
fn distribution(v: &str) -> Option<LoadBalancing> {
    use load_balancing::Scope;
    let scopes: &[Scope] = match v.to_ascii_lowercase().as_str() {
        "preferclose" | "prefersamezone" => &[Scope::Network, Scope::Region, Scope::Zone],
        "prefersamenode" => &[Scope::Network, Scope::Region, Scope::Zone, Scope::Subzone, Scope::Node],
        _ => return None,
    };
    Some(LoadBalancing {
        routing_preference: scopes.iter().map(|s| *s as i32).collect(),
        mode: load_balancing::Mode::Failover as i32,
        health_policy: 0,
    })
}

/// The traffic-distribution annotation on the object, else on its Namespace. An unknown value
/// on the object stops there (istiod does not look at the Namespace then).
fn annotated_distribution(ctx: &Ctx<'_>, ns: &str, annotations: &names::Labels) -> Option<LoadBalancing> {
    if let Some(v) = annotations.get(names::TRAFFIC_DISTRIBUTION_ANNOTATION) {
        return distribution(v);
    }
    let ns = ctx.store.namespaces.get(ns)?;
    names::annotations(&ns.metadata).get(names::TRAFFIC_DISTRIBUTION_ANNOTATION).and_then(|v| distribution(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_protocols() {
        assert_eq!(app_protocol("http", 80), AppProtocol::Http11);
        assert_eq!(app_protocol("HTTP2-x", 80), AppProtocol::Http2);
        assert_eq!(app_protocol("grpc-web", 80), AppProtocol::Unknown);
        assert_eq!(app_protocol("grpc-x", 80), AppProtocol::Grpc);
        assert_eq!(app_protocol("https", 443), AppProtocol::Tls);
        assert_eq!(app_protocol("kubernetes.io/h2c", 80), AppProtocol::Http2);
        assert_eq!(app_protocol("mysql", 3306), AppProtocol::Tcp);
        assert_eq!(app_protocol("mysql", 3307), AppProtocol::Unknown);
        assert_eq!(app_protocol("", 80), AppProtocol::Unknown);
    }
}
