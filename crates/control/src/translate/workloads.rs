//! Pods, WorkloadEntries, ServiceEntry endpoints and EndpointSlice endpoints →
//! `istio.workload.Workload` (`control-plane.md` §2).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ambit_api::workload::{
    Locality, NetworkMode, Port, PortList, TunnelProtocol, Workload, WorkloadStatus, WorkloadType,
};
use ambit_objects::istio::{ServiceEntry, WorkloadEntry, WorkloadEntrySpec};
use ambit_objects::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use ambit_objects::{EndpointSlice, Pod, Service as KubeService};
use tracing::debug;

use super::index::ServiceSource;
use super::names::{self, Labels, Name};
use super::services::{self, port_number};
use super::{Ctx, peer_auth, policies, waypoints};

/// A Pod's workload (§2.1–§2.6); `None` when the pod has no usable IP or has finished.
pub(crate) fn pod(ctx: &Ctx<'_>, n: &Name, pod: &Pod, deps: &mut Vec<Name>) -> Option<Workload> {
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let ips: Vec<&str> = match status.pod_ips.as_ref().filter(|v| !v.is_empty()) {
        Some(ips) => ips.iter().map(|p| p.ip.as_str()).collect(),
        None => status.pod_ip.iter().map(String::as_str).filter(|s| !s.is_empty()).collect(),
    };
    if ips.is_empty() {
        return None;
    }
    let mut addresses = Vec::with_capacity(ips.len());
    for ip in ips {
        let Ok(ip) = ip.parse::<IpAddr>() else {
            debug!(pod = %n, ip, "pod IP does not parse; pod not published");
            return None;
        };
        addresses.push(names::ip_bytes(ip));
    }
    let meta = &pod.metadata;
    let labels = names::labels(meta);
    let spec = pod.spec.clone().unwrap_or_default();
    let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
    let healthy = ready && meta.deletion_timestamp.is_none();
    let workload_name = pod_workload_name(n, pod);
    let (canonical_name, canonical_revision) = canonical(labels, &workload_name);
    let (tunnel_protocol, native) = tunnel(labels, names::annotations(meta));
    let node = spec.node_name.clone().unwrap_or_default();
    let locality = ctx.store.nodes.get(&node).and_then(|node| {
        let l = names::labels(&node.metadata);
        let get = |k: &str| l.get(k).cloned().unwrap_or_default();
        let loc = Locality {
            region: get(names::REGION_LABEL),
            zone: get(names::ZONE_LABEL),
            subzone: get(names::SUBZONE_LABEL),
        };
        (loc != Locality::default()).then_some(loc)
    });
    let (waypoint, application_tunnel) = match waypoints::instance(ctx, &n.ns, labels, deps) {
        Some(tunnel) => (None, tunnel),
        None => (waypoints::for_workload(ctx, &n.ns, labels, deps), None),
    };
    Some(Workload {
        uid: names::pod_uid(&ctx.settings.cluster_id, n),
        name: n.name.clone(),
        namespace: n.ns.clone(),
        addresses,
        network: ctx.network.to_owned(),
        tunnel_protocol: tunnel_protocol as i32,
        trust_domain: trust_domain(ctx),
        service_account: spec.service_account_name.clone().unwrap_or_default(),
        waypoint,
        node,
        canonical_name,
        canonical_revision,
        workload_type: WorkloadType::Pod as i32,
        workload_name,
        native_tunnel: native,
        application_tunnel,
        services: pod_services(ctx, n, pod, labels),
        authorization_policies: policy_keys(ctx, &n.ns, labels),
        status: if healthy { WorkloadStatus::Healthy } else { WorkloadStatus::Unhealthy } as i32,
        cluster_id: ctx.settings.cluster_id.clone(),
        locality,
        network_mode: if spec.host_network == Some(true) {
            NetworkMode::HostNetwork
        } else {
            NetworkMode::Standard
        } as i32,
        ..Workload::default()
    })
}

/// A WorkloadEntry's workload (§2.7).
pub(crate) fn workload_entry(ctx: &Ctx<'_>, n: &Name, we: &WorkloadEntry, deps: &mut Vec<Name>) -> Workload {
    let mut labels = we.spec.labels.clone();
    labels.extend(names::labels(&we.metadata).iter().map(|(k, v)| (k.clone(), v.clone())));
    let annotations = names::annotations(&we.metadata);
    let workload_name = annotations
        .get(names::AUTO_REGISTRATION_ANNOTATION)
        .or_else(|| labels.get(names::WORKLOAD_NAME_LABEL))
        .cloned()
        .unwrap_or_else(|| n.name.clone());
    let (canonical_name, canonical_revision) = canonical(&labels, &workload_name);
    let (tunnel_protocol, native) = tunnel(&labels, annotations);
    let mut services = BTreeMap::new();
    if let Some(ns) = ctx.store.ns(&n.ns) {
        for name in &ns.services {
            let sn = Name::new(n.ns.as_str(), name.as_str());
            let Some(svc) = ctx.store.services.get(&sn) else { continue };
            if !selects(svc, &labels) {
                continue;
            }
            let host = names::service_hostname(&sn, &ctx.settings.domain_suffix);
            if !wins(ctx, &host, &n.ns, &ServiceSource::Service(sn.clone())) {
                continue;
            }
            let ports = kube_ports(svc, |p| match &p.target_port {
                Some(IntOrString::String(name)) => we.spec.ports.get(name).copied(),
                t => Some(
                    we.spec
                        .ports
                        .get(p.name.as_deref().unwrap_or_default())
                        .copied()
                        .unwrap_or_else(|| numeric(t, p.port)),
                ),
            });
            services.insert(names::service_key(&n.ns, &host), ports);
        }
    }
    entry_services(ctx, &n.ns, &labels, &mut services, |_, p| entry_target(&we.spec, p));
    let mut w = endpoint_workload(ctx, &n.ns, &we.spec, &labels, deps);
    w.uid = names::workload_entry_uid(&ctx.settings.cluster_id, n);
    w.name = n.name.clone();
    w.workload_name = workload_name;
    w.canonical_name = canonical_name;
    w.canonical_revision = canonical_revision;
    w.tunnel_protocol = tunnel_protocol as i32;
    w.native_tunnel = native;
    w.services = services;
    w
}

/// A ServiceEntry's inline endpoints, or one workload per host for a DNS entry without
/// endpoints (§2.7). An entry whose every host lost deduplication publishes none.
pub(crate) fn service_entry(
    ctx: &Ctx<'_>,
    n: &Name,
    se: &ServiceEntry,
    deps: &mut Vec<Name>,
) -> Vec<Workload> {
    let hosts: Vec<&String> =
        se.spec.hosts.iter().filter(|h| wins(ctx, h, &n.ns, &ServiceSource::Entry(n.clone()))).collect();
    if hosts.is_empty() {
        return Vec::new();
    }
    let labels = names::labels(&se.metadata);
    let (canonical_name, canonical_revision) = canonical(labels, &n.name);
    let native = names::native_tunnel(labels);
    let tunnel_protocol = if native { TunnelProtocol::Hbone } else { TunnelProtocol::None };
    let finish = |mut w: Workload, uid: String| {
        w.uid = uid;
        w.name = n.name.clone();
        w.workload_name = n.name.clone();
        w.canonical_name = canonical_name.clone();
        w.canonical_revision = canonical_revision.clone();
        w.tunnel_protocol = tunnel_protocol as i32;
        w.native_tunnel = native;
        w.authorization_policies = policy_keys(ctx, &n.ns, labels);
        w
    };
    let ports_for = |spec: &WorkloadEntrySpec| PortList {
        ports: se
            .spec
            .ports
            .iter()
            .filter(|p| (1..=65535).contains(&p.number))
            .map(|p| Port { service_port: p.number, target_port: entry_target(spec, p), app_protocol: 0 })
            .collect(),
    };
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    if !se.spec.endpoints.is_empty() {
        for ep in &se.spec.endpoints {
            let uid = names::service_entry_uid(&ctx.settings.cluster_id, n, &ep.address);
            if !seen.insert(uid.clone()) {
                continue;
            }
            let mut w = endpoint_workload(ctx, &n.ns, ep, &ep.labels, deps);
            // Policies follow the entry's labels, the waypoint the endpoint's.
            let ports = ports_for(ep);
            w.services = hosts.iter().map(|h| (names::service_key(&n.ns, h), ports.clone())).collect();
            out.push(finish(w, uid));
        }
    } else if se.spec.workload_selector.is_none()
        && matches!(services::resolution(se), "DNS" | "DYNAMIC_DNS" | "DNS_ROUND_ROBIN")
    {
        let spec = WorkloadEntrySpec::default();
        for h in hosts {
            let mut w = endpoint_workload(ctx, &n.ns, &spec, &names::EMPTY, deps);
            w.hostname = h.clone();
            w.services = BTreeMap::from([(names::service_key(&n.ns, h), ports_for(&spec))]);
            out.push(finish(w, names::service_entry_uid(&ctx.settings.cluster_id, n, h)));
        }
    }
    out
}

/// The endpoints of an EndpointSlice that are not pods (§2.7), e.g. `default/kubernetes`.
pub(crate) fn endpoint_slice(ctx: &Ctx<'_>, n: &Name, slice: &EndpointSlice) -> Vec<Workload> {
    let Some(svc_name) = names::labels(&slice.metadata).get(names::SERVICE_NAME_LABEL) else {
        return Vec::new();
    };
    let sn = Name::new(n.ns.as_str(), svc_name.as_str());
    let Some(svc) = ctx.store.services.get(&sn) else { return Vec::new() };
    let host = names::service_hostname(&sn, &ctx.settings.domain_suffix);
    if slice.address_type == "FQDN" || !wins(ctx, &host, &n.ns, &ServiceSource::Service(sn.clone())) {
        return Vec::new();
    }
    let svc_ports = svc.spec.as_ref().and_then(|s| s.ports.as_ref()).map(Vec::as_slice).unwrap_or_default();
    let mut ports = Vec::new();
    for sp in slice.ports.iter().flatten() {
        if sp.protocol.as_deref().is_some_and(|p| p != "TCP") {
            continue;
        }
        let Some(target_port) = sp.port.and_then(port_number) else { continue };
        let name = sp.name.as_deref().unwrap_or_default();
        if let Some(service_port) = svc_ports
            .iter()
            .find(|p| p.name.as_deref().unwrap_or_default() == name)
            .and_then(|p| port_number(p.port))
        {
            ports.push(Port { service_port, target_port, app_protocol: 0 });
        }
    }
    let key = names::service_key(&n.ns, &host);
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for ep in &slice.endpoints {
        if ep.target_ref.as_ref().is_some_and(|r| r.kind.as_deref() == Some("Pod")) {
            continue;
        }
        let Some(first) = ep.addresses.first() else { continue };
        let Ok(addresses) = ep.addresses.iter().map(|a| a.parse::<IpAddr>().map(names::ip_bytes)).collect()
        else {
            debug!(slice = %n, address = first, "endpoint address does not parse; endpoint skipped");
            continue;
        };
        if !seen.insert(first.clone()) {
            continue;
        }
        let ready = ep.conditions.as_ref().and_then(|c| c.ready) != Some(false);
        out.push(Workload {
            uid: names::endpoint_slice_uid(&ctx.settings.cluster_id, n, first),
            name: n.name.clone(),
            namespace: n.ns.clone(),
            addresses,
            network: ctx.network.to_owned(),
            services: BTreeMap::from([(key.clone(), PortList { ports: ports.clone() })]),
            status: if ready { WorkloadStatus::Healthy } else { WorkloadStatus::Unhealthy } as i32,
            cluster_id: ctx.settings.cluster_id.clone(),
            network_mode: NetworkMode::HostNetwork as i32,
            ..Workload::default()
        });
    }
    out
}

/// The fields a WorkloadEntry and a ServiceEntry endpoint share.
fn endpoint_workload(
    ctx: &Ctx<'_>,
    ns: &str,
    spec: &WorkloadEntrySpec,
    labels: &Labels,
    deps: &mut Vec<Name>,
) -> Workload {
    let (addresses, hostname) = match spec.address.parse::<IpAddr>() {
        Ok(ip) => (vec![names::ip_bytes(ip)], String::new()),
        Err(_) => (Vec::new(), spec.address.clone()),
    };
    let locality = (!spec.locality.is_empty()).then(|| {
        let mut parts = spec.locality.splitn(3, '/').map(str::to_owned);
        Locality {
            region: parts.next().unwrap_or_default(),
            zone: parts.next().unwrap_or_default(),
            subzone: parts.next().unwrap_or_default(),
        }
    });
    Workload {
        namespace: ns.to_owned(),
        addresses,
        hostname,
        network: if spec.network.is_empty() { ctx.network.to_owned() } else { spec.network.clone() },
        trust_domain: trust_domain(ctx),
        service_account: spec.service_account.clone(),
        waypoint: waypoints::for_workload(ctx, ns, labels, deps),
        workload_type: WorkloadType::Pod as i32,
        authorization_policies: policy_keys(ctx, ns, labels),
        status: WorkloadStatus::Healthy as i32,
        cluster_id: ctx.settings.cluster_id.clone(),
        locality,
        capacity: (spec.weight > 0).then_some(spec.weight),
        ..Workload::default()
    }
}

/// §2.4: the services a pod joins, with its port list for each.
fn pod_services(ctx: &Ctx<'_>, n: &Name, pod: &Pod, labels: &Labels) -> BTreeMap<String, PortList> {
    let mut out = BTreeMap::new();
    let Some(ns) = ctx.store.ns(&n.ns) else { return out };
    let containers = named_tcp_ports(pod);
    for name in &ns.services {
        let sn = Name::new(n.ns.as_str(), name.as_str());
        let Some(svc) = ctx.store.services.get(&sn) else { continue };
        if selects(svc, labels) {
            add_kube_service(ctx, &sn, svc, &containers, &mut out);
        }
    }
    // Selector-less Services: a slice endpoint whose targetRef is this pod.
    for slice_name in ctx.store.slices_by_pod.get(n).into_iter().flatten() {
        let Some(slice) = ctx.store.slices.get(&Name::new(n.ns.as_str(), slice_name.as_str())) else {
            continue;
        };
        if slice.address_type == "FQDN" || !slice.endpoints.iter().any(|e| refers_to(e, n, pod)) {
            continue;
        }
        let Some(svc_name) = names::labels(&slice.metadata).get(names::SERVICE_NAME_LABEL) else { continue };
        let sn = Name::new(n.ns.as_str(), svc_name.as_str());
        let Some(svc) = ctx.store.services.get(&sn) else { continue };
        let selector_less = svc.spec.as_ref().and_then(|s| s.selector.as_ref()).is_none_or(|s| s.is_empty());
        if selector_less {
            add_kube_service(ctx, &sn, svc, &containers, &mut out);
        }
    }
    entry_services(ctx, &n.ns, labels, &mut out, |_, p| {
        containers.get(p.name.as_str()).copied().unwrap_or(if p.target_port == 0 {
            p.number
        } else {
            p.target_port
        })
    });
    out
}

fn add_kube_service(
    ctx: &Ctx<'_>,
    sn: &Name,
    svc: &KubeService,
    containers: &BTreeMap<&str, u32>,
    out: &mut BTreeMap<String, PortList>,
) {
    let host = names::service_hostname(sn, &ctx.settings.domain_suffix);
    if !wins(ctx, &host, &sn.ns, &ServiceSource::Service(sn.clone())) {
        return;
    }
    let ports = kube_ports(svc, |p| match &p.target_port {
        Some(IntOrString::String(name)) => containers.get(name.as_str()).copied(),
        t => Some(numeric(t, p.port)),
    });
    out.insert(names::service_key(&sn.ns, &host), ports);
}

/// ServiceEntries of `ns` whose workloadSelector selects `labels`, for each winning host.
fn entry_services(
    ctx: &Ctx<'_>,
    ns: &str,
    labels: &Labels,
    out: &mut BTreeMap<String, PortList>,
    target: impl Fn(&ServiceEntry, &ambit_objects::istio::ServicePort) -> u32,
) {
    let Some(objects) = ctx.store.ns(ns) else { return };
    for name in &objects.entries {
        let en = Name::new(ns, name.as_str());
        let Some(se) = ctx.store.entries.get(&en) else { continue };
        let Some(sel) = &se.spec.workload_selector else { continue };
        if sel.labels.is_empty() || !names::subset(&sel.labels, labels) {
            continue;
        }
        let ports = PortList {
            ports: se
                .spec
                .ports
                .iter()
                .filter(|p| (1..=65535).contains(&p.number))
                .map(|p| Port { service_port: p.number, target_port: target(se, p), app_protocol: 0 })
                .collect(),
        };
        for host in &se.spec.hosts {
            if wins(ctx, host, ns, &ServiceSource::Entry(en.clone())) {
                out.insert(names::service_key(ns, host), ports.clone());
            }
        }
    }
}

/// A WorkloadEntry's (or endpoint's) override for a ServiceEntry port, else the entry's target.
fn entry_target(spec: &WorkloadEntrySpec, p: &ambit_objects::istio::ServicePort) -> u32 {
    spec.ports.get(&p.name).copied().unwrap_or(if p.target_port == 0 { p.number } else { p.target_port })
}

/// The port list of a Kubernetes Service for one workload; `target` returns `None` to omit a port.
fn kube_ports(
    svc: &KubeService,
    target: impl Fn(&ambit_objects::k8s_openapi::api::core::v1::ServicePort) -> Option<u32>,
) -> PortList {
    let ports = svc.spec.as_ref().and_then(|s| s.ports.as_ref()).map(Vec::as_slice).unwrap_or_default();
    PortList {
        ports: ports
            .iter()
            .filter_map(|p| {
                let service_port = port_number(p.port)?;
                let target_port = target(p)?;
                Some(Port { service_port, target_port, app_protocol: 0 })
            })
            .collect(),
    }
}

/// A numeric targetPort; absent (or 0) means the service port, as the API server defaults it.
fn numeric(t: &Option<IntOrString>, port: i32) -> u32 {
    match t {
        Some(IntOrString::Int(t)) if *t != 0 => port_number(*t).unwrap_or(0),
        _ => port_number(port).unwrap_or(0),
    }
}

fn selects(svc: &KubeService, labels: &Labels) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|sel| !sel.is_empty() && names::subset(sel, labels))
}

/// Whether `source` is the object that publishes `host` in `ns` (§3.5).
fn wins(ctx: &Ctx<'_>, host: &str, ns: &str, source: &ServiceSource) -> bool {
    ctx.winners.get(host).and_then(|m| m.get(ns)) == Some(source)
}

fn refers_to(e: &ambit_objects::k8s_openapi::api::discovery::v1::Endpoint, n: &Name, pod: &Pod) -> bool {
    let Some(r) = &e.target_ref else { return false };
    let uid_ok = match (r.uid.as_deref(), pod.metadata.uid.as_deref()) {
        (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() => a == b,
        _ => true,
    };
    r.kind.as_deref() == Some("Pod")
        && r.name.as_deref() == Some(n.name.as_str())
        && r.namespace.as_deref().is_none_or(|ns| ns == n.ns)
        && uid_ok
}

/// Container ports by name, TCP only: containers first, then sidecar init containers
/// (`restartPolicy: Always`); the first of a name wins.
fn named_tcp_ports(pod: &Pod) -> BTreeMap<&str, u32> {
    let mut out = BTreeMap::new();
    let Some(spec) = &pod.spec else { return out };
    let sidecars =
        spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always"));
    for c in spec.containers.iter().chain(sidecars) {
        for p in c.ports.iter().flatten() {
            let tcp = p.protocol.as_deref().is_none_or(|p| p == "TCP");
            if let (Some(name), true, Some(port)) = (p.name.as_deref(), tcp, port_number(p.container_port)) {
                out.entry(name).or_insert(port);
            }
        }
    }
    out
}

/// §2.3.
fn pod_workload_name(n: &Name, pod: &Pod) -> String {
    let meta = &pod.metadata;
    let labels = names::labels(meta);
    if let Some(w) = labels.get(names::WORKLOAD_NAME_LABEL) {
        return w.clone();
    }
    let generated = meta.generate_name.as_deref().is_some_and(|g| !g.is_empty());
    let owner = meta.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    let (true, Some(owner)) = (generated, owner) else { return n.name.clone() };
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let hash = labels.get("pod-template-hash").or_else(|| labels.get("rollouts-pod-template-hash"));
            match hash.and_then(|h| owner.name.strip_suffix(h.as_str())).and_then(|s| s.strip_suffix('-')) {
                Some(base) => base.to_owned(),
                None => owner.name.clone(),
            }
        }
        "ReplicationController" => {
            labels.get("deploymentconfig").cloned().unwrap_or_else(|| owner.name.clone())
        }
        "Job" => match owner.name.rsplit_once('-') {
            Some((base, digits))
                if (8..=10).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()) =>
            {
                base.to_owned()
            }
            _ => owner.name.clone(),
        },
        _ => owner.name.clone(),
    }
}

/// `canonical_name`, `canonical_revision` (§2.2).
fn canonical(labels: &Labels, workload_name: &str) -> (String, String) {
    let first = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k)).cloned();
    (
        first(&["service.istio.io/canonical-name", "app.kubernetes.io/name", "app"])
            .unwrap_or_else(|| workload_name.to_owned()),
        first(&["service.istio.io/canonical-revision", "app.kubernetes.io/version", "version"])
            .unwrap_or_else(|| "latest".to_owned()),
    )
}

/// The HBONE decision: the node agent's capture annotation, or a native tunnel label.
fn tunnel(labels: &Labels, annotations: &Labels) -> (TunnelProtocol, bool) {
    let native = names::native_tunnel(labels);
    let captured = annotations.get(names::REDIRECTION_ANNOTATION).map(String::as_str) == Some("enabled");
    (if captured || native { TunnelProtocol::Hbone } else { TunnelProtocol::None }, native)
}

fn trust_domain(ctx: &Ctx<'_>) -> String {
    if ctx.settings.trust_domain == "cluster.local" {
        String::new()
    } else {
        ctx.settings.trust_domain.clone()
    }
}

/// §2.6: selector policies, then PeerAuthentication keys.
fn policy_keys(ctx: &Ctx<'_>, ns: &str, labels: &Labels) -> Vec<String> {
    let mut keys = policies::selected(ctx, ns, labels);
    keys.extend(peer_auth::keys(ctx, ns, labels));
    keys
}
