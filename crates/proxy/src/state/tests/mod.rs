//! Tests of the state module: config parsing, proto conversion, indexing, routing, store.

#![allow(clippy::unwrap_used)]

mod config;
mod delta;
mod inbound;
mod index;
mod outbound;
mod props;
mod proto;
mod store;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use super::config::{MAX_FILE_BYTES, MAX_POLICIES, MAX_SERVICES, MAX_WORKLOADS, Position};
use super::model::{
    AppTunnelProtocol, ApplicationTunnel, CidrVip, Destination, Endpoint, GatewayAddress, HealthPolicy,
    LoadBalancer, LoadBalancerMode, LoadBalancerScope, NamespacedHostname, WeightedWaypoint,
};
use super::route::RouteError;
use super::*;

/// A healthy TCP workload in namespace `default` with the given IPs.
fn wl(uid: &str, ips: &[&str]) -> Workload {
    WorkloadSpec {
        uid: uid.into(),
        name: uid.rsplit('/').next().unwrap_or(uid).into(),
        namespace: "default".into(),
        workload_ips: ips.iter().map(|i| ip(i)).collect(),
        protocol: Protocol::Tcp,
        trust_domain: "cluster.local".into(),
        service_account: "default".into(),
        network: Default::default(),
        waypoint: None,
        network_gateway: None,
        node: Default::default(),
        canonical_name: Default::default(),
        canonical_revision: Default::default(),
        workload_name: Default::default(),
        workload_type: Default::default(),
        cluster_id: Default::default(),
        authorization_policies: vec![],
        status: HealthStatus::Healthy,
        locality: Locality::default(),
        capacity: 1,
        hostname: Default::default(),
        network_mode: NetworkMode::Standard,
        native_tunnel: false,
        application_tunnel: None,
        services: Default::default(),
    }
    .into()
}

/// A service `<hostname>` in namespace `default` with VIPs on the default network.
fn svc(hostname: &str, vips: &[&str], ports: &[(u16, u16)]) -> Service {
    Service {
        name: hostname.split('.').next().unwrap_or(hostname).to_owned(),
        namespace: "default".to_owned(),
        hostname: hostname.to_owned(),
        vips: vips.iter().map(|v| NetworkAddress { network: String::new(), address: ip(v) }).collect(),
        cidr_vips: vec![],
        ports: ports.iter().copied().collect(),
        endpoints: EndpointSet::default(),
        subject_alt_names: vec![],
        waypoint: None,
        weighted_waypoints: vec![],
        load_balancer: None,
        ip_families: None,
        canonical: false,
        visibility: Visibility::Public,
    }
}

/// Makes `w` an endpoint of `svc_key` with the given port map.
fn endpoint_of(mut w: Workload, svc_key: &str, ports: &[(u16, u16)]) -> Workload {
    w.services.insert(svc_key, ports.iter().copied().collect::<BTreeMap<u16, u16>>());
    w
}

/// Address-form gateway on the default network.
fn gw_addr(a: &str, port: u16) -> GatewayAddress {
    GatewayAddress {
        destination: Destination::Address(NetworkAddress { network: String::new(), address: ip(a) }),
        hbone_mtls_port: port,
    }
}

/// Hostname-form gateway.
fn gw_host(ns: &str, host: &str, port: u16) -> GatewayAddress {
    GatewayAddress {
        destination: Destination::Hostname(NamespacedHostname {
            namespace: ns.to_owned(),
            hostname: host.to_owned(),
        }),
        hbone_mtls_port: port,
    }
}

fn state(workloads: Vec<Workload>, services: Vec<Service>) -> State {
    State::from_config(LocalConfig { workloads, services, policies: vec![] }, None).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}
