//! The internal model back into `istio.workload` xDS messages (for xDS servers built on this
//! model, e.g. a test serving a YAML mesh). Converting back what came from a proto and
//! converting that again gives the same model (`tests/props.rs`). What the model does not keep
//! (port app protocols, extensions, a service's endpoints, which workloads carry) is not sent.

use std::net::IpAddr;

use ambit_api::workload as pb;

use super::model::{
    AppTunnelProtocol, Destination, GatewayAddress, HealthPolicy, HealthStatus, IpFamily, LoadBalancer,
    LoadBalancerMode, LoadBalancerScope, NetworkMode, Protocol, Service, Visibility, Workload,
};
use super::proto::Address;

impl From<&Address> for pb::Address {
    fn from(a: &Address) -> Self {
        let r#type = match a {
            Address::Workload(w) => pb::address::Type::Workload(w.into()),
            Address::Service(s) => pb::address::Type::Service(s.into()),
        };
        pb::Address { r#type: Some(r#type) }
    }
}

impl From<&Workload> for pb::Workload {
    fn from(w: &Workload) -> Self {
        let workload_type = match w.workload_type.as_str() {
            "cronjob" => pb::WorkloadType::Cronjob,
            "pod" => pb::WorkloadType::Pod,
            "job" => pb::WorkloadType::Job,
            _ => pb::WorkloadType::Deployment,
        };
        let locality = (w.locality != Default::default()).then(|| pb::Locality {
            region: w.locality.region.to_string(),
            zone: w.locality.zone.to_string(),
            subzone: w.locality.subzone.to_string(),
        });
        pb::Workload {
            uid: w.uid.to_string(),
            name: w.name.to_string(),
            namespace: w.namespace.to_string(),
            addresses: w.workload_ips.iter().map(|ip| ip_bytes(*ip)).collect(),
            hostname: w.hostname.to_string(),
            network: w.network.to_string(),
            tunnel_protocol: match w.protocol {
                Protocol::Tcp => pb::TunnelProtocol::None,
                Protocol::Hbone => pb::TunnelProtocol::Hbone,
            } as i32,
            trust_domain: w.trust_domain.to_string(),
            service_account: w.service_account.to_string(),
            waypoint: w.waypoint.as_ref().map(gateway),
            network_gateway: w.network_gateway.as_ref().map(gateway),
            node: w.node.to_string(),
            canonical_name: w.canonical_name.to_string(),
            canonical_revision: w.canonical_revision.to_string(),
            workload_type: workload_type as i32,
            workload_name: w.workload_name.to_string(),
            native_tunnel: w.native_tunnel,
            application_tunnel: w.application_tunnel.map(|t| pb::ApplicationTunnel {
                protocol: match t.protocol {
                    AppTunnelProtocol::None => pb::application_tunnel::Protocol::None,
                    AppTunnelProtocol::Proxy => pb::application_tunnel::Protocol::Proxy,
                } as i32,
                port: t.port.map_or(0, u32::from),
            }),
            services: w
                .services
                .iter()
                .map(|(key, ports)| (key.to_string(), pb::PortList { ports: port_list(ports.iter()) }))
                .collect(),
            authorization_policies: w.authorization_policies.iter().map(|p| p.to_string()).collect(),
            status: match w.status {
                HealthStatus::Healthy => pb::WorkloadStatus::Healthy,
                HealthStatus::Unhealthy => pb::WorkloadStatus::Unhealthy,
            } as i32,
            cluster_id: w.cluster_id.to_string(),
            locality,
            network_mode: match w.network_mode {
                NetworkMode::Standard => pb::NetworkMode::Standard,
                NetworkMode::HostNetwork => pb::NetworkMode::HostNetwork,
            } as i32,
            extensions: Vec::new(),
            capacity: Some(w.capacity),
        }
    }
}

impl From<&Service> for pb::Service {
    fn from(s: &Service) -> Self {
        let hosts = s.vips.iter().map(|v| pb::NetworkAddress {
            network: v.network.clone(),
            address: ip_bytes(v.address),
            length: None,
        });
        let ranges = s.cidr_vips.iter().map(|c| pb::NetworkAddress {
            network: c.network.clone(),
            address: ip_bytes(c.cidr.addr()),
            length: Some(u32::from(c.cidr.prefix_len())),
        });
        pb::Service {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            hostname: s.hostname.clone(),
            addresses: hosts.chain(ranges).collect(),
            ports: port_list(s.ports.iter()),
            subject_alt_names: s.subject_alt_names.clone(),
            waypoint: s.waypoint.as_ref().map(gateway),
            load_balancing: s.load_balancer.as_ref().map(load_balancing),
            ip_families: match s.ip_families {
                None => pb::IpFamilies::Automatic,
                Some(IpFamily::IPv4) => pb::IpFamilies::Ipv4Only,
                Some(IpFamily::IPv6) => pb::IpFamilies::Ipv6Only,
                Some(IpFamily::Dual) => pb::IpFamilies::Dual,
            } as i32,
            extensions: Vec::new(),
            canonical: s.canonical,
            ingress_use_waypoint: false,
            weighted_waypoints: s
                .weighted_waypoints
                .iter()
                .map(|w| pb::WeightedWaypoint {
                    destination: Some(gateway(&w.destination)),
                    weight: w.weight,
                })
                .collect(),
            visibility: match s.visibility {
                Visibility::Public => pb::service::Visibility::Public,
                Visibility::Namespace => pb::service::Visibility::Namespace,
            } as i32,
        }
    }
}

fn load_balancing(lb: &LoadBalancer) -> pb::LoadBalancing {
    use pb::load_balancing::{HealthPolicy as H, Mode as M, Scope as S};
    let scope = |s: &LoadBalancerScope| {
        (match s {
            LoadBalancerScope::Region => S::Region,
            LoadBalancerScope::Zone => S::Zone,
            LoadBalancerScope::Subzone => S::Subzone,
            LoadBalancerScope::Node => S::Node,
            LoadBalancerScope::Cluster => S::Cluster,
            LoadBalancerScope::Network => S::Network,
        }) as i32
    };
    pb::LoadBalancing {
        routing_preference: lb.routing_preferences.iter().map(scope).collect(),
        mode: match lb.mode {
            LoadBalancerMode::Standard => M::UnspecifiedMode,
            LoadBalancerMode::Strict => M::Strict,
            LoadBalancerMode::Failover => M::Failover,
            LoadBalancerMode::Passthrough => M::Passthrough,
        } as i32,
        health_policy: match lb.health_policy {
            HealthPolicy::OnlyHealthy => H::OnlyHealthy,
            HealthPolicy::AllowAll => H::AllowAll,
        } as i32,
    }
}

fn gateway(g: &GatewayAddress) -> pb::GatewayAddress {
    let destination = match &g.destination {
        Destination::Address(a) => pb::gateway_address::Destination::Address(pb::NetworkAddress {
            network: a.network.clone(),
            address: ip_bytes(a.address),
            length: None,
        }),
        Destination::Hostname(h) => pb::gateway_address::Destination::Hostname(pb::NamespacedHostname {
            namespace: h.namespace.clone(),
            hostname: h.hostname.clone(),
        }),
    };
    pb::GatewayAddress { hbone_mtls_port: u32::from(g.hbone_mtls_port), destination: Some(destination) }
}

fn port_list<'a>(ports: impl Iterator<Item = (&'a u16, &'a u16)>) -> Vec<pb::Port> {
    ports
        .map(|(s, t)| pb::Port { service_port: u32::from(*s), target_port: u32::from(*t), app_protocol: 0 })
        .collect()
}

/// 4 or 16 raw bytes.
pub(crate) fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}
