//! Bound Services and workloads → `Destination`s, from the published Address resources (so the
//! waypoint serves exactly what node proxies send it), with Istio's protocol selection.

use std::collections::BTreeSet;

use ambit_api::waypoint::{Destination, Endpoint, Port, Protocol, destination};
use ambit_api::workload::{Service, Workload, WorkloadStatus};

use super::View;
use crate::translate::names::{self, Name};

/// A Service's Destination (without routes and policies).
pub(super) fn service(view: &View<'_, '_>, key: &str, s: &Service, bound: bool) -> Destination {
    let ports: Vec<Port> = s
        .ports
        .iter()
        .map(|p| {
            let (name, protocol) = declared(view, s, p.service_port);
            Port { port: p.service_port, target_port: p.target_port, protocol: protocol as i32, name }
        })
        .collect();
    let endpoints = view
        .members
        .get(key)
        .into_iter()
        .flatten()
        .filter_map(|uid| match view.workload(uid) {
            Some(w) => endpoint(view, w, Some((key, s.ports.as_slice()))),
            None => None,
        })
        .collect();
    Destination {
        kind: destination::Kind::Service as i32,
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        hostname: s.hostname.clone(),
        bound,
        addresses: s.addresses.iter().map(|a| a.address.clone()).collect(),
        ports,
        endpoints,
        routes: Vec::new(),
        policies: Vec::new(),
        subject_alt_names: s.subject_alt_names.clone(),
    }
}

/// A workload's Destination: itself, on the target ports of its Services.
pub(super) fn workload(view: &View<'_, '_>, w: &Workload) -> Destination {
    let ports: BTreeSet<u32> =
        w.services.values().flat_map(|l| l.ports.iter().map(|p| p.target_port)).filter(|p| *p != 0).collect();
    Destination {
        kind: destination::Kind::Workload as i32,
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        hostname: String::new(),
        bound: true,
        addresses: w.addresses.clone(),
        ports: ports
            .into_iter()
            .map(|p| Port {
                port: p,
                target_port: p,
                protocol: Protocol::Undeclared as i32,
                name: String::new(),
            })
            .collect(),
        endpoints: endpoint(view, w, None).into_iter().collect(),
        routes: Vec::new(),
        policies: Vec::new(),
        subject_alt_names: Vec::new(),
    }
}

/// One workload as an endpoint; with a service, its named target ports resolved.
fn endpoint(
    view: &View<'_, '_>,
    w: &Workload,
    service: Option<(&str, &[ambit_api::workload::Port])>,
) -> Option<Endpoint> {
    let address = w.addresses.first()?.clone();
    let mut ports = std::collections::BTreeMap::new();
    if let Some((key, service_ports)) = service
        && let Some(list) = w.services.get(key)
    {
        for p in &list.ports {
            let named =
                service_ports.iter().any(|sp| sp.service_port == p.service_port && sp.target_port == 0);
            if named && p.target_port != 0 {
                ports.insert(p.service_port, p.target_port);
            }
        }
    }
    let trust_domain =
        if w.trust_domain.is_empty() { &view.ctx.settings.trust_domain } else { &w.trust_domain };
    // The API server defaults a pod's account to `default`; objects from files may lack it.
    let account = if w.service_account.is_empty() { "default" } else { &w.service_account };
    Some(Endpoint {
        address,
        identity: format!("spiffe://{trust_domain}/ns/{}/sa/{account}", w.namespace),
        tunnel: w.tunnel_protocol,
        ports,
        healthy: w.status == WorkloadStatus::Healthy as i32,
        locality: w.locality.clone(),
        node: w.node.clone(),
        uid: w.uid.clone(),
        workload_name: w.workload_name.clone(),
        namespace: w.namespace.clone(),
        canonical_name: w.canonical_name.clone(),
        canonical_revision: w.canonical_revision.clone(),
        cluster_id: w.cluster_id.clone(),
        service_account: w.service_account.clone(),
    })
}

/// The port's name and protocol as written on the object that published the service: a
/// Kubernetes Service's port (`appProtocol`, else the name), or a ServiceEntry's `protocol`.
fn declared(view: &View<'_, '_>, s: &Service, port: u32) -> (String, Protocol) {
    let n = Name::new(s.namespace.as_str(), s.name.as_str());
    let store = view.ctx.store;
    if let Some(svc) = store.services.get(&n)
        && names::service_hostname(&n, &view.ctx.settings.domain_suffix) == s.hostname
    {
        let spec_port = svc
            .spec
            .as_ref()
            .into_iter()
            .flat_map(|spec| spec.ports.iter().flatten())
            .find(|p| u32::try_from(p.port).ok() == Some(port));
        let Some(p) = spec_port else { return (String::new(), Protocol::Undeclared) };
        let name = p.name.clone().unwrap_or_default();
        let protocol = if p.protocol.as_deref() == Some("UDP") {
            Protocol::Tcp
        } else {
            kubernetes_protocol(port, &name, p.app_protocol.as_deref())
        };
        return (name, protocol);
    }
    if let Some(se) = store.entries.get(&n)
        && let Some(p) = se.spec.ports.iter().find(|p| p.number == port)
    {
        let protocol = match parse(&p.protocol) {
            Parsed::Known(p) => p,
            Parsed::Unsupported => Protocol::Undeclared,
        };
        return (p.name.clone(), protocol);
    }
    (String::new(), Protocol::Undeclared)
}

/// Istio's `kube.ConvertProtocol` (the Service's port): `appProtocol` replaces the name, the
/// Kubernetes-defined `kubernetes.io/*` values first, `grpc-web…` before the `-` prefix rule,
/// then `protocol.Parse` of the text before the first `-`; unrecognised names on the well-known
/// ports (DNS 53, SMTP 25, MySQL 3306, MongoDB 27017) are TCP; else undeclared (sniffed).
pub(crate) fn kubernetes_protocol(port: u32, name: &str, app_protocol: Option<&str>) -> Protocol {
    let name = match app_protocol {
        Some("kubernetes.io/h2c") => return Protocol::Http2,
        Some("kubernetes.io/ws") => return Protocol::Http,
        Some("kubernetes.io/wss") => return Protocol::Tcp,
        Some(a) => a,
        None => name,
    };
    if name.to_ascii_lowercase().starts_with("grpc-web") {
        return Protocol::Http;
    }
    let prefix = name.split_once('-').map_or(name, |(p, _)| p);
    match parse(prefix) {
        Parsed::Known(p) => p,
        Parsed::Unsupported if matches!(port, 25 | 53 | 3306 | 27017) => Protocol::Tcp,
        Parsed::Unsupported => Protocol::Undeclared,
    }
}

enum Parsed {
    Known(Protocol),
    Unsupported,
}

/// Istio's `protocol.Parse` (case-insensitive), folded onto what the waypoint distinguishes:
/// every protocol it does not read as HTTP (TLS, HTTPS, Mongo, MySQL, Redis, UDP) is TCP.
fn parse(s: &str) -> Parsed {
    Parsed::Known(match s.to_ascii_lowercase().as_str() {
        "http" | "http_proxy" | "grpc-web" => Protocol::Http,
        "http2" | "h2c" => Protocol::Http2,
        "grpc" => Protocol::Grpc,
        "tcp" | "udp" | "https" | "tls" | "mongo" | "mysql" | "redis" => Protocol::Tcp,
        _ => return Parsed::Unsupported,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_are_chosen_as_istio_does() {
        let cases: &[(u32, &str, Option<&str>, Protocol)] = &[
            (80, "http", None, Protocol::Http),
            (80, "http-web", None, Protocol::Http),
            (80, "HTTP2-x", None, Protocol::Http2),
            (80, "grpc", None, Protocol::Grpc),
            (80, "grpc-web", None, Protocol::Http),
            (80, "grpc-web-x", None, Protocol::Http),
            (80, "tcp-x", None, Protocol::Tcp),
            (443, "https", None, Protocol::Tcp),
            (443, "tls-x", None, Protocol::Tcp),
            (27017, "mongo", None, Protocol::Tcp),
            (6379, "redis", None, Protocol::Tcp),
            (3306, "db", None, Protocol::Tcp),
            (8080, "web", None, Protocol::Undeclared),
            (8080, "", None, Protocol::Undeclared),
            (8080, "tcp", Some("http"), Protocol::Http),
            (8080, "http", Some("kubernetes.io/h2c"), Protocol::Http2),
            (8080, "tcp", Some("h2c"), Protocol::Http2),
            (8080, "", Some("kubernetes.io/ws"), Protocol::Http),
            (8080, "http", Some("kubernetes.io/wss"), Protocol::Tcp),
            (8080, "http", Some("grpc"), Protocol::Grpc),
            (8080, "http", Some("custom.io/x"), Protocol::Undeclared),
        ];
        for &(port, name, app, want) in cases {
            assert_eq!(kubernetes_protocol(port, name, app), want, "{port} {name:?} {app:?}");
        }
    }
}
