//! xDS proto → internal model conversion (§1.1, §10).

use super::*;
use ambit_api::workload as pb;

fn pb_workload() -> pb::Workload {
    pb::Workload {
        uid: "cluster1//Pod/ns/w".into(),
        name: "w".into(),
        namespace: "ns".into(),
        addresses: vec![
            vec![10, 0, 0, 1],
            "ff06::c3".parse::<std::net::Ipv6Addr>().unwrap().octets().to_vec(),
        ],
        ..Default::default()
    }
}

#[test]
fn workload_defaults() {
    let w = Workload::try_from(pb_workload()).unwrap();
    assert_eq!(w.trust_domain, "cluster.local");
    assert_eq!(w.service_account, "default");
    assert_eq!(w.cluster_id, "Kubernetes");
    assert_eq!(w.capacity, 1);
    assert_eq!(w.protocol, Protocol::Tcp);
    assert_eq!(w.workload_type, "deployment");
    assert_eq!(w.workload_ips, vec![ip("10.0.0.1"), ip("ff06::c3")]);
}

#[test]
fn workload_fields() {
    let mut p = pb_workload();
    p.tunnel_protocol = pb::TunnelProtocol::Hbone as i32;
    p.trust_domain = "td".into();
    p.service_account = "sa".into();
    p.cluster_id = "c1".into();
    p.capacity = Some(0);
    p.workload_type = pb::WorkloadType::Cronjob as i32;
    p.status = pb::WorkloadStatus::Unhealthy as i32;
    p.network_mode = pb::NetworkMode::HostNetwork as i32;
    p.services.insert(
        "ns/svc.example".into(),
        pb::PortList { ports: vec![pb::Port { service_port: 80, target_port: 8080, app_protocol: 0 }] },
    );
    p.waypoint = Some(pb::GatewayAddress {
        hbone_mtls_port: 0,
        destination: Some(pb::gateway_address::Destination::Hostname(pb::NamespacedHostname {
            namespace: "ns".into(),
            hostname: "wp".into(),
        })),
    });
    p.application_tunnel = Some(pb::ApplicationTunnel { protocol: 1, port: 15088 });
    let w = Workload::try_from(p).unwrap();
    assert_eq!(w.protocol, Protocol::Hbone);
    assert_eq!(w.identity().to_string(), "spiffe://td/ns/ns/sa/sa");
    assert_eq!((w.cluster_id.as_str(), w.capacity), ("c1", 0));
    assert_eq!(w.workload_type, "cronjob");
    assert_eq!(w.status, HealthStatus::Unhealthy);
    assert_eq!(w.network_mode, NetworkMode::HostNetwork);
    assert_eq!(w.services["ns/svc.example"], BTreeMap::from([(80, 8080)]));
    assert_eq!(w.waypoint, Some(gw_host("ns", "wp", 15008)));
    assert_eq!(w.app_tunnel_port(), Some(15088));
}

#[test]
fn workload_rejections() {
    let mut p = pb_workload();
    p.tunnel_protocol = pb::TunnelProtocol::LegacyIstioMtls as i32;
    assert!(matches!(Workload::try_from(p), Err(ProtoError::LegacyIstioMtls { .. })));
    for len in [0usize, 3, 5, 15, 17] {
        let mut p = pb_workload();
        p.addresses = vec![vec![1; len]];
        assert_eq!(
            Workload::try_from(p),
            Err(ProtoError::AddressLength { field: "Workload.addresses", len })
        );
    }
    let mut p = pb_workload();
    p.services.insert("no-slash".into(), pb::PortList::default());
    assert!(matches!(Workload::try_from(p), Err(ProtoError::ServiceKey { .. })));
    let mut p = pb_workload();
    p.waypoint = Some(pb::GatewayAddress { hbone_mtls_port: 15008, destination: None });
    assert!(matches!(Workload::try_from(p), Err(ProtoError::GatewayWithoutDestination { .. })));
    let mut p = pb_workload();
    p.tunnel_protocol = 42;
    assert!(matches!(Workload::try_from(p), Err(ProtoError::UnknownEnum { .. })));
    let mut p = pb_workload();
    p.services.insert(
        "ns/x".into(),
        pb::PortList { ports: vec![pb::Port { service_port: 70000, target_port: 1, app_protocol: 0 }] },
    );
    assert!(matches!(Workload::try_from(p), Err(ProtoError::Port { value: 70000, .. })));
}

#[test]
fn service_conversion() {
    let na = |b: Vec<u8>, length: Option<u32>| pb::NetworkAddress { network: "".into(), address: b, length };
    let p = pb::Service {
        name: "s".into(),
        namespace: "ns".into(),
        hostname: "s.ns.svc.cluster.local".into(),
        addresses: vec![
            na(vec![10, 0, 0, 1], None),
            na(vec![10, 0, 0, 2], Some(32)),
            na(vec![10, 1, 0, 0], Some(16)),
        ],
        ports: vec![pb::Port { service_port: 80, target_port: 0, app_protocol: 0 }],
        load_balancing: Some(pb::LoadBalancing { routing_preference: vec![6, 2], mode: 2, health_policy: 1 }),
        ip_families: pb::IpFamilies::Ipv4Only as i32,
        visibility: 7,
        weighted_waypoints: vec![pb::WeightedWaypoint {
            destination: Some(pb::GatewayAddress {
                hbone_mtls_port: 15008,
                destination: Some(pb::gateway_address::Destination::Address(na(vec![10, 0, 0, 9], None))),
            }),
            weight: 2,
        }],
        ..Default::default()
    };
    let s = Service::try_from(p.clone()).unwrap();
    assert_eq!(s.vips.len(), 2);
    assert_eq!(s.cidr_vips[0].cidr, "10.1.0.0/16".parse::<ipnet::IpNet>().unwrap());
    assert_eq!(s.ports, BTreeMap::from([(80, 0)]));
    let lb = s.load_balancer.unwrap();
    assert_eq!(lb.routing_preferences, vec![LoadBalancerScope::Network, LoadBalancerScope::Zone]);
    assert_eq!((lb.mode, lb.health_policy), (LoadBalancerMode::Failover, HealthPolicy::AllowAll));
    assert_eq!(s.ip_families, Some(IpFamily::IPv4));
    assert_eq!(s.visibility, Visibility::Public);
    assert_eq!(s.weighted_waypoints[0].destination, gw_addr("10.0.0.9", 15008));

    let mut bad = p.clone();
    bad.load_balancing.as_mut().unwrap().routing_preference = vec![0];
    assert!(matches!(Service::try_from(bad), Err(ProtoError::UnspecifiedScope { .. })));
    let mut bad = p.clone();
    bad.addresses = vec![na(vec![10, 0, 0, 1], Some(33))];
    assert!(matches!(Service::try_from(bad), Err(ProtoError::PrefixLength { .. })));
    let mut bad = p.clone();
    bad.weighted_waypoints[0].destination = None;
    assert!(matches!(Service::try_from(bad), Err(ProtoError::GatewayWithoutDestination { .. })));
    let mut bad = p;
    bad.addresses = vec![na(vec![1, 2], None)];
    assert!(matches!(Service::try_from(bad), Err(ProtoError::AddressLength { .. })));
}

#[test]
fn address_resource() {
    let a = pb::Address { r#type: Some(pb::address::Type::Workload(pb_workload())) };
    assert!(matches!(Address::try_from(a), Ok(Address::Workload(_))));
    let a = pb::Address {
        r#type: Some(pb::address::Type::Service(pb::Service { hostname: "h".into(), ..Default::default() })),
    };
    assert!(matches!(Address::try_from(a), Ok(Address::Service(_))));
    assert_eq!(Address::try_from(pb::Address { r#type: None }), Err(ProtoError::EmptyAddress));
}
