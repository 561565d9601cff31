//! What the waypoint serves, as its admin endpoint `/debug/serving` shows it and `ambit inspect
//! waypoints` reads it (apart from `/config_dump`, which stays small at any size): each destination it holds with its addresses and protocols, routes and
//! their weighted backends, policies and endpoints.

use serde::Serialize;

use super::{DestinationKind, Protocol, Snapshot};

/// One destination.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationDump {
    /// The resource name (`<gw ns>/<gw name>/…`).
    pub resource: String,
    /// `service` or `workload`.
    pub kind: &'static str,
    /// `namespace/name` of the Service or workload.
    pub name: String,
    /// The Service's hostname (empty for a workload).
    pub hostname: String,
    /// Whether the waypoint serves it (else it is only a route's backend).
    pub bound: bool,
    /// `ip:port/protocol` of each address and port.
    pub listeners: Vec<String>,
    /// Its routes, in precedence order.
    pub routes: Vec<RouteDump>,
    /// The AuthorizationPolicies of its requests (`namespace/name`).
    pub policies: Vec<String>,
    /// Its endpoints.
    pub endpoints: Vec<EndpointDump>,
}

/// One route.
#[derive(Debug, Serialize)]
pub struct RouteDump {
    /// `<namespace>/<route>#<n>`.
    pub name: String,
    /// `destination:port` and weight of each backend.
    pub backends: Vec<(String, u32)>,
}

/// One endpoint.
#[derive(Debug, Serialize)]
pub struct EndpointDump {
    /// The workload's IP.
    pub address: String,
    /// Whether it takes traffic.
    pub healthy: bool,
    /// Its identity.
    pub identity: String,
}

fn protocol(p: Protocol) -> &'static str {
    match p {
        Protocol::Undeclared => "sniffed",
        Protocol::Tcp => "tcp",
        Protocol::Http => "http",
        Protocol::Http2 => "http2",
        Protocol::Grpc => "grpc",
    }
}

impl Snapshot {
    /// Every destination held, by resource name.
    pub fn dump(&self) -> Vec<DestinationDump> {
        let mut out: Vec<DestinationDump> = self
            .destinations
            .values()
            .map(|d| DestinationDump {
                resource: d.resource.clone(),
                kind: match d.kind {
                    DestinationKind::Service => "service",
                    DestinationKind::Workload => "workload",
                },
                name: format!("{}/{}", d.namespace, d.name),
                hostname: d.hostname.clone(),
                bound: d.bound,
                listeners: d
                    .addresses
                    .iter()
                    .flat_map(|ip| {
                        let ip = match ip {
                            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                            v4 => v4.to_string(),
                        };
                        d.ports.iter().map(move |p| format!("{ip}:{}/{}", p.port, protocol(p.protocol)))
                    })
                    .collect(),
                routes: d
                    .routes
                    .iter()
                    .map(|r| RouteDump {
                        name: r.name.clone(),
                        backends: r
                            .backends
                            .iter()
                            .map(|b| (format!("{}:{}", b.destination, b.port), b.weight))
                            .collect(),
                    })
                    .collect(),
                policies: d.policies.policies().iter().map(crate::authz::Policy::key).collect(),
                endpoints: d
                    .endpoints
                    .iter()
                    .map(|e| EndpointDump {
                        address: e.address.to_string(),
                        healthy: e.healthy,
                        identity: e.identity.as_ref().map(ToString::to_string).unwrap_or_default(),
                    })
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| a.resource.cmp(&b.resource));
        out
    }
}
