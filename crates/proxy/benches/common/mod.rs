//! A generated mesh for the state benchmarks: `n` workloads of the shape istiod sends (every
//! field a pod has set, one IPv4 address, HBONE, a listed policy, locality), ten per service.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use ambit_proxy::authz::{Action, Authorization, Scope};
use ambit_proxy::state::{
    HealthStatus, LocalConfig, Locality, NetworkAddress, NetworkMode, Protocol, Service, Visibility, Workload,
};

/// The node the benchmarked proxy runs on (1 workload in 1 000 is on it).
pub const NODE: &str = "node-7";

pub fn workload_ip(i: usize) -> IpAddr {
    Ipv4Addr::from(0x0a00_0000u32 + i as u32 + 1).into()
}

pub fn workload(i: usize) -> Workload {
    let svc = i / 10;
    let ns = svc % 100;
    let mut services = BTreeMap::new();
    services.insert(format!("ns{ns}/app-{svc}.ns{ns}.svc.cluster.local"), BTreeMap::from([(80, 8080)]));
    Workload {
        uid: format!("cluster1//v1/Pod/ns{ns}/app-{svc}-5d9c7b8f4-{i}"),
        name: format!("app-{svc}-5d9c7b8f4-{i}"),
        namespace: format!("ns{ns}"),
        workload_ips: vec![workload_ip(i)],
        protocol: Protocol::Hbone,
        trust_domain: "cluster.local".into(),
        service_account: format!("app-{svc}"),
        network: String::new(),
        waypoint: None,
        network_gateway: None,
        node: format!("node-{}", i % 1000),
        canonical_name: format!("app-{svc}"),
        canonical_revision: "v1".into(),
        workload_name: format!("app-{svc}"),
        workload_type: "deployment".into(),
        cluster_id: "cluster1".into(),
        authorization_policies: vec![format!("ns{ns}/allow-app-{ns}")],
        status: HealthStatus::Healthy,
        locality: Locality { region: "eu-west-1".into(), zone: "eu-west-1a".into(), subzone: String::new() },
        capacity: 1,
        hostname: String::new(),
        network_mode: NetworkMode::Standard,
        native_tunnel: false,
        application_tunnel: None,
        services,
    }
}

/// Service `i`, in namespace `i % 100`, of workloads `10 i .. 10 i + 9`.
pub fn service(i: usize) -> Service {
    let ns = i % 100;
    Service {
        name: format!("app-{i}"),
        namespace: format!("ns{ns}"),
        hostname: format!("app-{i}.ns{ns}.svc.cluster.local"),
        vips: vec![NetworkAddress {
            network: String::new(),
            address: Ipv4Addr::from(0x0b00_0000u32 + i as u32 + 1).into(),
        }],
        cidr_vips: vec![],
        ports: BTreeMap::from([(80, 8080)]),
        endpoints: Default::default(),
        subject_alt_names: vec![format!("spiffe://cluster.local/ns/ns{ns}/sa/app-{i}")],
        waypoint: None,
        weighted_waypoints: vec![],
        load_balancer: None,
        ip_families: None,
        canonical: false,
        visibility: Visibility::Public,
    }
}

pub fn policy(i: usize) -> Authorization {
    Authorization {
        name: format!("allow-app-{i}"),
        namespace: format!("ns{}", i % 100),
        scope: Scope::WorkloadSelector,
        action: Action::Allow,
        rules: vec![],
        dry_run: false,
    }
}

/// `workloads` workloads, `workloads / 10` services, 100 policies.
pub fn mesh(workloads: usize) -> LocalConfig {
    LocalConfig {
        workloads: (0..workloads).map(workload).collect(),
        services: (0..workloads / 10).map(service).collect(),
        policies: (0..100).map(policy).collect(),
    }
}
