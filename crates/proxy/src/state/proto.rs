//! Conversion of `istio.workload` xDS messages into the internal model (proto defaults applied).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ambit_api::workload as pb;
use ipnet::IpNet;

use crate::name::Name;

use super::model::{
    AppTunnelProtocol, ApplicationTunnel, CidrVip, DEFAULT_CLUSTER_ID, DEFAULT_SERVICE_ACCOUNT,
    DEFAULT_TRUST_DOMAIN, Destination, GatewayAddress, HBONE_PORT, HealthPolicy, HealthStatus, IpFamily,
    LoadBalancer, LoadBalancerMode, LoadBalancerScope, Locality, NamespacedHostname, NetworkAddress,
    NetworkMode, Protocol, Service, ServicePorts, Visibility, WeightedWaypoint, Workload, WorkloadSpec,
};

/// A converted `istio.workload.Address` resource.
// Short-lived (converted, then moved into the store), so the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// A workload.
    Workload(Workload),
    /// A service.
    Service(Service),
}

/// Why an xDS resource was rejected (the resource is NACKed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Address resource with neither workload nor service.
    #[error("Address resource has neither a workload nor a service")]
    EmptyAddress,
    /// An IP address field is not 4 or 16 bytes.
    #[error("{field}: IP address must be 4 or 16 bytes, got {len}")]
    AddressLength {
        /// Which field.
        field: &'static str,
        /// Its length.
        len: usize,
    },
    /// A CIDR prefix length exceeds the address width.
    #[error("{field}: prefix length {len} is too long for {address}")]
    PrefixLength {
        /// Which field.
        field: &'static str,
        /// The address.
        address: IpAddr,
        /// The prefix length.
        len: u32,
    },
    /// `LEGACY_ISTIO_MTLS` tunnel protocol.
    #[error("workload {uid:?}: tunnel protocol LEGACY_ISTIO_MTLS is not supported; use HBONE or NONE")]
    LegacyIstioMtls {
        /// The workload.
        uid: String,
    },
    /// An enum carries a value this version does not know.
    #[error("{field}: unknown enum value {value}")]
    UnknownEnum {
        /// Which field.
        field: &'static str,
        /// The value.
        value: i32,
    },
    /// A port number does not fit in 16 bits.
    #[error("{field}: port {value} is out of range (0-65535)")]
    Port {
        /// Which field.
        field: &'static str,
        /// The value.
        value: u32,
    },
    /// A workload's `services` key is not `<namespace>/<hostname>`.
    #[error("workload {uid:?}: services key {key:?} is not of the form \"<namespace>/<hostname>\"")]
    ServiceKey {
        /// The workload.
        uid: String,
        /// The key.
        key: String,
    },
    /// A GatewayAddress without destination.
    #[error("{field}: gateway address has no destination")]
    GatewayWithoutDestination {
        /// Which field.
        field: &'static str,
    },
    /// `UNSPECIFIED_SCOPE` in routing preferences.
    #[error("service {hostname:?}: load balancing routing preference UNSPECIFIED_SCOPE is invalid")]
    UnspecifiedScope {
        /// The service.
        hostname: String,
    },
}

impl TryFrom<pb::Address> for Address {
    type Error = ProtoError;

    fn try_from(a: pb::Address) -> Result<Self, ProtoError> {
        match a.r#type {
            Some(pb::address::Type::Workload(w)) => Ok(Address::Workload(w.try_into()?)),
            Some(pb::address::Type::Service(s)) => Ok(Address::Service(s.try_into()?)),
            None => Err(ProtoError::EmptyAddress),
        }
    }
}

impl TryFrom<pb::Workload> for Workload {
    type Error = ProtoError;

    fn try_from(w: pb::Workload) -> Result<Self, ProtoError> {
        let protocol = match pb::TunnelProtocol::try_from(w.tunnel_protocol) {
            Ok(pb::TunnelProtocol::None) => Protocol::Tcp,
            Ok(pb::TunnelProtocol::Hbone) => Protocol::Hbone,
            Ok(pb::TunnelProtocol::LegacyIstioMtls) => {
                return Err(ProtoError::LegacyIstioMtls { uid: w.uid });
            }
            Err(_) => return Err(unknown("Workload.tunnel_protocol", w.tunnel_protocol)),
        };
        let workload_ips = w
            .addresses
            .iter()
            .map(|b| ip_from_bytes("Workload.addresses", b))
            .collect::<Result<Vec<_>, _>>()?;
        let mut services = ServicePorts::default();
        for (key, list) in w.services {
            if !key.contains('/') {
                return Err(ProtoError::ServiceKey { uid: w.uid, key });
            }
            services.insert(key, port_map("Workload.services", &list.ports)?);
        }
        let status = match pb::WorkloadStatus::try_from(w.status) {
            Ok(pb::WorkloadStatus::Healthy) => HealthStatus::Healthy,
            Ok(pb::WorkloadStatus::Unhealthy) => HealthStatus::Unhealthy,
            Err(_) => return Err(unknown("Workload.status", w.status)),
        };
        // Unknown network modes fall back to the standard (indexed) mode.
        let network_mode = match pb::NetworkMode::try_from(w.network_mode) {
            Ok(pb::NetworkMode::HostNetwork) => NetworkMode::HostNetwork,
            _ => NetworkMode::Standard,
        };
        let workload_type = pb::WorkloadType::try_from(w.workload_type)
            .map(|t| t.as_str_name().to_ascii_lowercase())
            .unwrap_or_else(|_| "deployment".to_owned());
        let application_tunnel = w
            .application_tunnel
            .map(|t| -> Result<ApplicationTunnel, ProtoError> {
                let protocol = match pb::application_tunnel::Protocol::try_from(t.protocol) {
                    Ok(pb::application_tunnel::Protocol::None) => AppTunnelProtocol::None,
                    Ok(pb::application_tunnel::Protocol::Proxy) => AppTunnelProtocol::Proxy,
                    Err(_) => return Err(unknown("ApplicationTunnel.protocol", t.protocol)),
                };
                let port = port16("ApplicationTunnel.port", t.port)?;
                Ok(ApplicationTunnel { protocol, port: (port != 0).then_some(port) })
            })
            .transpose()?;
        let locality = w
            .locality
            .map(|l| Locality { region: l.region.into(), zone: l.zone.into(), subzone: l.subzone.into() })
            .unwrap_or_default();
        Ok(WorkloadSpec {
            waypoint: w.waypoint.map(|g| gateway("Workload.waypoint", g)).transpose()?,
            network_gateway: w.network_gateway.map(|g| gateway("Workload.network_gateway", g)).transpose()?,
            uid: w.uid.into(),
            name: w.name.into(),
            namespace: w.namespace.into(),
            workload_ips,
            protocol,
            trust_domain: or_default(w.trust_domain, DEFAULT_TRUST_DOMAIN).into(),
            service_account: or_default(w.service_account, DEFAULT_SERVICE_ACCOUNT).into(),
            network: w.network.into(),
            node: w.node.into(),
            canonical_name: w.canonical_name.into(),
            canonical_revision: w.canonical_revision.into(),
            workload_name: w.workload_name.into(),
            workload_type: workload_type.into(),
            cluster_id: or_default(w.cluster_id, DEFAULT_CLUSTER_ID).into(),
            authorization_policies: w.authorization_policies.into_iter().map(Name::from).collect(),
            status,
            locality,
            capacity: w.capacity.unwrap_or(1),
            hostname: w.hostname.into(),
            network_mode,
            native_tunnel: w.native_tunnel,
            application_tunnel,
            services,
        }
        .into())
    }
}

impl TryFrom<pb::Service> for Service {
    type Error = ProtoError;

    fn try_from(s: pb::Service) -> Result<Self, ProtoError> {
        let mut vips = Vec::new();
        let mut cidr_vips = Vec::new();
        for a in s.addresses {
            let address = ip_from_bytes("Service.addresses", &a.address)?;
            let full = if address.is_ipv4() { 32 } else { 128 };
            match a.length {
                Some(len) if len != full => {
                    let prefix = u8::try_from(len).ok().filter(|l| u32::from(*l) <= full);
                    let cidr = prefix
                        .and_then(|p| IpNet::new(address, p).ok())
                        .ok_or(ProtoError::PrefixLength { field: "Service.addresses", address, len })?;
                    cidr_vips.push(CidrVip { network: a.network, cidr });
                }
                _ => vips.push(NetworkAddress { network: a.network, address }),
            }
        }
        let load_balancer = s.load_balancing.map(|lb| load_balancer(&s.hostname, lb)).transpose()?;
        let ip_families = match pb::IpFamilies::try_from(s.ip_families) {
            Ok(pb::IpFamilies::Automatic) => None,
            Ok(pb::IpFamilies::Ipv4Only) => Some(IpFamily::IPv4),
            Ok(pb::IpFamilies::Ipv6Only) => Some(IpFamily::IPv6),
            Ok(pb::IpFamilies::Dual) => Some(IpFamily::Dual),
            Err(_) => return Err(unknown("Service.ip_families", s.ip_families)),
        };
        // Unknown visibility values are treated as PUBLIC.
        let visibility = match pb::service::Visibility::try_from(s.visibility) {
            Ok(pb::service::Visibility::Namespace) => Visibility::Namespace,
            _ => Visibility::Public,
        };
        let weighted_waypoints = s
            .weighted_waypoints
            .into_iter()
            .map(|w| {
                let g = w
                    .destination
                    .ok_or(ProtoError::GatewayWithoutDestination { field: "Service.weighted_waypoints" })?;
                Ok(WeightedWaypoint {
                    destination: gateway("Service.weighted_waypoints", g)?,
                    weight: w.weight,
                })
            })
            .collect::<Result<Vec<_>, ProtoError>>()?;
        Ok(Service {
            ports: port_map("Service.ports", &s.ports)?,
            waypoint: s.waypoint.map(|g| gateway("Service.waypoint", g)).transpose()?,
            name: s.name,
            namespace: s.namespace,
            hostname: s.hostname,
            vips,
            cidr_vips,
            endpoints: Default::default(),
            subject_alt_names: s.subject_alt_names,
            weighted_waypoints,
            load_balancer,
            ip_families,
            canonical: s.canonical,
            visibility,
        })
    }
}

fn load_balancer(hostname: &str, lb: pb::LoadBalancing) -> Result<LoadBalancer, ProtoError> {
    use pb::load_balancing::{HealthPolicy as H, Mode as M, Scope as S};
    let routing_preferences = lb
        .routing_preference
        .iter()
        .map(|v| match S::try_from(*v) {
            Ok(S::Region) => Ok(LoadBalancerScope::Region),
            Ok(S::Zone) => Ok(LoadBalancerScope::Zone),
            Ok(S::Subzone) => Ok(LoadBalancerScope::Subzone),
            Ok(S::Node) => Ok(LoadBalancerScope::Node),
            Ok(S::Cluster) => Ok(LoadBalancerScope::Cluster),
            Ok(S::Network) => Ok(LoadBalancerScope::Network),
            Ok(S::UnspecifiedScope) => Err(ProtoError::UnspecifiedScope { hostname: hostname.to_owned() }),
            Err(_) => Err(unknown("LoadBalancing.routing_preference", *v)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mode = match M::try_from(lb.mode) {
        Ok(M::UnspecifiedMode) => LoadBalancerMode::Standard,
        Ok(M::Strict) => LoadBalancerMode::Strict,
        Ok(M::Failover) => LoadBalancerMode::Failover,
        Ok(M::Passthrough) => LoadBalancerMode::Passthrough,
        Err(_) => return Err(unknown("LoadBalancing.mode", lb.mode)),
    };
    let health_policy = match H::try_from(lb.health_policy) {
        Ok(H::OnlyHealthy) => HealthPolicy::OnlyHealthy,
        Ok(H::AllowAll) => HealthPolicy::AllowAll,
        Err(_) => return Err(unknown("LoadBalancing.health_policy", lb.health_policy)),
    };
    Ok(LoadBalancer { routing_preferences, mode, health_policy })
}

fn gateway(field: &'static str, g: pb::GatewayAddress) -> Result<GatewayAddress, ProtoError> {
    let destination = match g.destination {
        Some(pb::gateway_address::Destination::Address(a)) => Destination::Address(NetworkAddress {
            address: ip_from_bytes(field, &a.address)?,
            network: a.network,
        }),
        Some(pb::gateway_address::Destination::Hostname(h)) => {
            Destination::Hostname(NamespacedHostname { namespace: h.namespace, hostname: h.hostname })
        }
        None => return Err(ProtoError::GatewayWithoutDestination { field }),
    };
    // An unset port means the standard HBONE port.
    let port = match port16(field, g.hbone_mtls_port)? {
        0 => HBONE_PORT,
        p => p,
    };
    Ok(GatewayAddress { destination, hbone_mtls_port: port })
}

fn port_map(field: &'static str, ports: &[pb::Port]) -> Result<BTreeMap<u16, u16>, ProtoError> {
    ports.iter().map(|p| Ok((port16(field, p.service_port)?, port16(field, p.target_port)?))).collect()
}

fn port16(field: &'static str, value: u32) -> Result<u16, ProtoError> {
    u16::try_from(value).map_err(|_| ProtoError::Port { field, value })
}

/// Parses 4 or 16 raw bytes as an IP address.
pub(crate) fn ip_from_bytes(field: &'static str, b: &[u8]) -> Result<IpAddr, ProtoError> {
    if let Ok(v4) = <[u8; 4]>::try_from(b) {
        Ok(IpAddr::V4(Ipv4Addr::from(v4)))
    } else if let Ok(v6) = <[u8; 16]>::try_from(b) {
        Ok(IpAddr::V6(Ipv6Addr::from(v6)))
    } else {
        Err(ProtoError::AddressLength { field, len: b.len() })
    }
}

fn unknown(field: &'static str, value: i32) -> ProtoError {
    ProtoError::UnknownEnum { field, value }
}

fn or_default(s: String, default: &str) -> String {
    if s.is_empty() { default.to_owned() } else { s }
}
