//! §4.13 outbound conformance table, plus load-balancing and waypoint cases.

use super::*;
use ambit_identity::Identity;

const SOURCE: &str = "cluster1//v1/Pod/ns/source-workload";
const WAYPOINT: &str = "cluster1//v1/Pod/ns/waypoint-workload";

/// Source pod 127.0.0.1 (+ ::1) in `ns` on `local-node`, and two waypoint pods.
fn base() -> Vec<Workload> {
    let mut source = wl(SOURCE, &["127.0.0.1", "::1"]);
    source.namespace = "ns".into();
    source.node = "local-node".into();
    let mut waypoint = wl(WAYPOINT, &["127.0.0.10"]);
    waypoint.namespace = "ns".into();
    waypoint.service_account = "waypoint-sa".into();
    waypoint.protocol = Protocol::Hbone;
    let mut dual = wl("cluster1//v1/Pod/ns/waypoint-workload-dual", &["127.0.0.11", "ff06::c5"]);
    dual.namespace = "ns".into();
    dual.service_account = "waypoint-sa".into();
    vec![source, waypoint, dual]
}

fn run(workloads: Vec<Workload>, services: Vec<Service>, dst: &str) -> Result<Route, RouteError> {
    let mut all = base();
    all.extend(workloads);
    let st = state(all, services);
    let src = st.find_local("ns", "source-workload", "default").unwrap();
    st.route_outbound(&src, "", sa(dst))
}

/// (protocol, HBONE authority, L4 destination), as in the conformance table.
fn summary(r: &Result<Route, RouteError>) -> (&'static str, String, String) {
    match r.as_ref().map(|r| &r.kind) {
        Ok(RouteKind::Hbone { target, authority, .. }) => {
            ("HBONE", authority.to_string(), target.to_string())
        }
        Ok(RouteKind::Tcp { target }) => ("TCP", String::new(), target.to_string()),
        Ok(RouteKind::Passthrough { target }) => ("PASSTHROUGH", String::new(), target.to_string()),
        Err(e) => ("ERROR", String::new(), e.to_string()),
    }
}

fn expect(r: Result<Route, RouteError>, proto: &str, authority: &str, dst: &str) -> Route {
    assert_eq!(
        summary(&r),
        (
            match proto {
                "HBONE" => "HBONE",
                "TCP" => "TCP",
                _ => "PASSTHROUGH",
            },
            authority.to_owned(),
            dst.to_owned()
        )
    );
    r.unwrap()
}

fn hbone_workload(uid: &str, ips: &[&str]) -> Workload {
    let mut w = wl(uid, ips);
    w.protocol = Protocol::Hbone;
    w
}

#[test]
fn unknown_destination_is_passthrough() {
    let r = run(vec![wl("cluster1//v1/Pod/default/my-pod", &["127.0.0.2"])], vec![], "1.2.3.4:80");
    let r = expect(r, "PASSTHROUGH", "", "1.2.3.4:80");
    assert!(r.destination_workload.is_none() && r.destination_service.is_none());
}

#[test]
fn known_tcp_workload_any_node() {
    for node in ["remote-node", "local-node"] {
        let mut w = wl("cluster1//v1/Pod/ns/test-tcp", &["127.0.0.2"]);
        w.node = node.into();
        let r = expect(run(vec![w], vec![], "127.0.0.2:80"), "TCP", "", "127.0.0.2:80");
        assert_eq!(&*r.destination_workload.unwrap().name, "test-tcp");
    }
}

#[test]
fn known_hbone_workload_any_node() {
    for node in ["remote-node", "local-node"] {
        let mut w = hbone_workload("cluster1//v1/Pod/ns/test-hbone", &["127.0.0.2"]);
        w.node = node.into();
        w.namespace = "ns".into();
        let r = run(vec![w], vec![], "127.0.0.2:80");
        let r = expect(r, "HBONE", "127.0.0.2:80", "127.0.0.2:15008");
        let RouteKind::Hbone { expected, .. } = r.kind else { unreachable!() };
        assert_eq!(expected, vec![Identity::new("cluster.local", "ns", "default")]);
    }
}

#[test]
fn service_vip_uses_endpoint_port_map() {
    // Named target ports (0): only the endpoint that maps port 80 is usable.
    let s = svc("example.com", &["127.0.0.3"], &[(80, 0), (8080, 0)]);
    let matching = endpoint_of(
        wl("cluster1//v1/Pod/default/matching-pod", &["127.0.0.2"]),
        "default/example.com",
        &[(80, 1234)],
    );
    let unmatching = endpoint_of(
        wl("cluster1//v1/Pod/default/unmatching-pod", &["127.0.0.4"]),
        "default/example.com",
        &[(8080, 9999)],
    );
    for _ in 0..20 {
        let r = run(vec![matching.clone(), unmatching.clone()], vec![s.clone()], "127.0.0.3:80");
        let r = expect(r, "TCP", "", "127.0.0.2:1234");
        assert_eq!(r.destination_service.unwrap().hostname, "example.com");
    }
}

#[test]
fn workload_waypoint() {
    let mut w = wl("cluster1//v1/Pod/default/my-pod", &["127.0.0.2"]);
    w.waypoint = Some(gw_addr("127.0.0.10", 15008));
    let r = run(vec![w], vec![], "127.0.0.2:80");
    let r = expect(r, "HBONE", "127.0.0.2:80", "127.0.0.10:15008");
    assert_eq!(&*r.destination_workload.unwrap().uid, WAYPOINT);
    let RouteKind::Hbone { expected, .. } = r.kind else { unreachable!() };
    assert_eq!(expected, vec![Identity::new("cluster.local", "ns", "waypoint-sa")]);
}

#[test]
fn source_is_the_destination_waypoint() {
    let mut w = wl("cluster1//v1/Pod/default/my-pod", &["127.0.0.2"]);
    w.waypoint = Some(gw_addr("127.0.0.10", 15008));
    let mut all = base();
    all.push(w);
    let st = state(all, vec![]);
    let waypoint = st.workload_by_uid(WAYPOINT).unwrap();
    let r = st.route_outbound(&waypoint, "", sa("127.0.0.2:80"));
    expect(r, "TCP", "", "127.0.0.2:80");
    // The same identity from another address is not the waypoint.
    let mut impostor = (*waypoint).clone();
    impostor.workload_ips = vec![ip("127.0.0.99")];
    let r = st.route_outbound(&impostor, "", sa("127.0.0.2:80"));
    expect(r, "HBONE", "127.0.0.2:80", "127.0.0.10:15008");
}

#[test]
fn address_waypoint_keeps_its_family() {
    let mut w = wl("cluster1//v1/Pod/default/my-pod", &["127.0.0.2", "ff06::c3"]);
    w.waypoint = Some(gw_addr("127.0.0.11", 15008));
    let r = run(vec![w], vec![], "[ff06::c3]:80");
    expect(r, "HBONE", "[ff06::c3]:80", "127.0.0.11:15008");
}

#[test]
fn dual_stack_tcp_workload_keeps_dialed_family() {
    let w = wl("cluster1//v1/Pod/ns/test-tcp", &["127.0.0.2", "ff06::c3"]);
    expect(run(vec![w.clone()], vec![], "127.0.0.2:80"), "TCP", "", "127.0.0.2:80");
    expect(run(vec![w], vec![], "[ff06::c3]:80"), "TCP", "", "[ff06::c3]:80");
}

#[test]
fn service_waypoint() {
    let mut s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    s.waypoint = Some(gw_addr("127.0.0.10", 15008));
    let r = expect(run(vec![], vec![s], "127.0.0.3:80"), "HBONE", "127.0.0.3:80", "127.0.0.10:15008");
    assert_eq!(r.destination_service.unwrap().hostname, "example.com");
    assert_eq!(&*r.destination_workload.unwrap().uid, WAYPOINT);
}

#[test]
fn service_without_endpoints_fails() {
    let s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    let r = run(vec![], vec![s], "127.0.0.3:80");
    assert_eq!(r, Err(RouteError::NoHealthyUpstream(sa("127.0.0.3:80"))));
    assert_eq!(
        RouteError::NoHealthyUpstream(sa("127.0.0.3:80")).to_string(),
        "no healthy upstream: 127.0.0.3:80"
    );
}

fn passthrough_svc() -> Service {
    let mut s = svc("external.example", &["1.2.3.4"], &[(80, 80)]);
    s.load_balancer = Some(LoadBalancer { mode: LoadBalancerMode::Passthrough, ..Default::default() });
    s
}

#[test]
fn passthrough_service() {
    let r = run(vec![], vec![passthrough_svc()], "1.2.3.4:80");
    expect(r, "PASSTHROUGH", "", "1.2.3.4:80");
}

#[test]
fn passthrough_service_with_waypoint() {
    let mut s = passthrough_svc();
    s.waypoint = Some(gw_addr("127.0.0.10", 15008));
    let r = run(vec![], vec![s], "1.2.3.4:80");
    expect(r, "HBONE", "1.2.3.4:80", "127.0.0.10:15008");
}

fn remote_endpoint(with_gateway: bool) -> Workload {
    let mut w =
        endpoint_of(wl("cluster1//v1/Pod/default/remote-pod", &[]), "default/example.com", &[(80, 8080)]);
    w.network = "remote".into();
    if with_gateway {
        let mut gw = gw_addr("10.22.1.1", 15009);
        if let Destination::Address(a) = &mut gw.destination {
            a.network = "remote".into();
        }
        w.network_gateway = Some(gw);
    } else {
        w.workload_ips = vec![ip("10.0.0.2")];
    }
    w
}

#[test]
fn double_hbone_is_reported_as_unsupported() {
    let s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    let r = run(vec![remote_endpoint(true)], vec![s.clone()], "127.0.0.3:80");
    assert_eq!(r, Err(RouteError::DoubleHboneUnsupported));
    // Without a gateway the remote endpoint is unusable.
    let r = run(vec![remote_endpoint(false)], vec![s], "127.0.0.3:80");
    assert!(matches!(r, Err(RouteError::WrongNetwork(..))), "{r:?}");
}

#[test]
fn failover_prefers_local_network() {
    let mut s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    s.load_balancer = Some(LoadBalancer {
        routing_preferences: vec![LoadBalancerScope::Network],
        mode: LoadBalancerMode::Failover,
        health_policy: HealthPolicy::OnlyHealthy,
    });
    let local = endpoint_of(
        hbone_workload("Kubernetes//Pod/default/local-pod", &["127.0.0.2"]),
        "default/example.com",
        &[(80, 8080)],
    );
    for _ in 0..20 {
        let r = run(vec![local.clone(), remote_endpoint(true)], vec![s.clone()], "127.0.0.3:80");
        expect(r, "HBONE", "127.0.0.2:8080", "127.0.0.2:15008");
    }
    let mut unhealthy = local;
    unhealthy.status = HealthStatus::Unhealthy;
    let r = run(vec![unhealthy, remote_endpoint(true)], vec![s], "127.0.0.3:80");
    assert_eq!(r, Err(RouteError::DoubleHboneUnsupported));
}

#[test]
fn host_network_workloads_sharing_an_ip() {
    let s = svc("example.com", &["127.0.0.3"], &[(80, 80)]);
    let mut pod1 =
        endpoint_of(wl("cluster1//v1/Pod/default/pod1", &["127.0.0.2"]), "default/example.com", &[(80, 80)]);
    pod1.network_mode = NetworkMode::HostNetwork;
    let mut pod2 = wl("cluster1//v1/Pod/default/pod2", &["127.0.0.2"]);
    pod2.network_mode = NetworkMode::HostNetwork;
    let ws = vec![pod1, pod2];
    let r = expect(run(ws.clone(), vec![s.clone()], "127.0.0.3:80"), "TCP", "", "127.0.0.2:80");
    assert_eq!(&*r.destination_workload.unwrap().name, "pod1");
    let r = expect(run(ws, vec![s], "127.0.0.2:80"), "PASSTHROUGH", "", "127.0.0.2:80");
    assert!(r.destination_workload.is_none());
}

#[test]
fn service_ip_families() {
    let w = endpoint_of(
        hbone_workload("cluster1//v1/Pod/default/dual", &["127.0.0.2", "ff06::c3"]),
        "default/example.com",
        &[],
    );
    let s = |f: Option<IpFamily>| {
        let mut s = svc("example.com", &["127.0.0.3", "::3"], &[(80, 80)]);
        s.ip_families = f;
        s
    };
    let cases = [
        (Some(IpFamily::IPv6), "127.0.0.3:80", "[ff06::c3]:80", "[ff06::c3]:15008"),
        (Some(IpFamily::IPv4), "127.0.0.3:80", "127.0.0.2:80", "127.0.0.2:15008"),
        (Some(IpFamily::Dual), "127.0.0.3:80", "127.0.0.2:80", "127.0.0.2:15008"),
        (Some(IpFamily::Dual), "[::3]:80", "[ff06::c3]:80", "[ff06::c3]:15008"),
        (None, "[::3]:80", "[ff06::c3]:80", "[ff06::c3]:15008"),
    ];
    for (family, dst, authority, target) in cases {
        let r = run(vec![w.clone()], vec![s(family)], dst);
        expect(r, "HBONE", authority, target);
    }
}

#[test]
fn direct_hbone_expects_service_sans_too() {
    let mut s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    s.subject_alt_names = vec!["spiffe://cluster.local/ns/default/sa/extra".into(), "not-a-spiffe-id".into()];
    let w =
        endpoint_of(hbone_workload("cluster1//v1/Pod/default/p", &["127.0.0.2"]), "default/example.com", &[]);
    let r = run(vec![w], vec![s], "127.0.0.3:80");
    let RouteKind::Hbone { expected, .. } = r.unwrap().kind else { panic!("want HBONE") };
    assert_eq!(
        expected,
        vec![
            Identity::new("cluster.local", "default", "default"),
            Identity::new("cluster.local", "default", "extra"),
        ]
    );
}

fn zoned(uid: &str, ip_: &str, zone: &str, region: &str) -> Workload {
    let mut w = endpoint_of(wl(uid, &[ip_]), "default/example.com", &[(80, 8080)]);
    w.locality = Locality { region: region.into(), zone: zone.into(), subzone: Default::default() }.into();
    w
}

fn lb_svc(mode: LoadBalancerMode, prefs: Vec<LoadBalancerScope>) -> Service {
    let mut s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    s.load_balancer =
        Some(LoadBalancer { routing_preferences: prefs, mode, health_policy: HealthPolicy::OnlyHealthy });
    s
}

/// Routes `n` times from a source in region r1 / zone z1 and returns the distinct targets.
fn targets(ws: Vec<Workload>, s: Service, n: usize) -> Result<Vec<String>, RouteError> {
    let mut all = base();
    all[0].locality = Locality { region: "r1".into(), zone: "z1".into(), subzone: Default::default() }.into();
    all.extend(ws);
    let st = state(all, vec![s]);
    let src = st.workload_by_uid(SOURCE).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let r = st.route_outbound(&src, "", sa("127.0.0.3:80"))?;
        let t = summary(&Ok(r)).2;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out.sort();
    Ok(out)
}

#[test]
fn strict_mode_requires_every_preference() {
    use LoadBalancerScope::{Region, Zone};
    let same = zoned("c//Pod/default/a", "127.0.0.2", "z1", "r1");
    let other_zone = zoned("c//Pod/default/b", "127.0.0.4", "z2", "r1");
    let s = lb_svc(LoadBalancerMode::Strict, vec![Region, Zone]);
    assert_eq!(targets(vec![same, other_zone.clone()], s.clone(), 30).unwrap(), ["127.0.0.2:8080"]);
    assert_eq!(targets(vec![other_zone], s, 1), Err(RouteError::NoHealthyUpstream(sa("127.0.0.3:80"))));
}

#[test]
fn failover_mode_falls_back_by_rank() {
    use LoadBalancerScope::{Region, Zone};
    let s = lb_svc(LoadBalancerMode::Failover, vec![Region, Zone]);
    let same_zone = zoned("c//Pod/default/a", "127.0.0.2", "z1", "r1");
    let same_region = zoned("c//Pod/default/b", "127.0.0.4", "z2", "r1");
    let far = zoned("c//Pod/default/c", "127.0.0.5", "z9", "r9");
    let all = vec![same_zone, same_region.clone(), far.clone()];
    assert_eq!(targets(all, s.clone(), 30).unwrap(), ["127.0.0.2:8080"]);
    assert_eq!(targets(vec![same_region, far.clone()], s.clone(), 30).unwrap(), ["127.0.0.4:8080"]);
    assert_eq!(targets(vec![far], s, 5).unwrap(), ["127.0.0.5:8080"]);
}

#[test]
fn standard_mode_ignores_preferences() {
    let s = lb_svc(LoadBalancerMode::Standard, vec![LoadBalancerScope::Zone]);
    let a = zoned("c//Pod/default/a", "127.0.0.2", "z1", "r1");
    let b = zoned("c//Pod/default/b", "127.0.0.4", "z2", "r1");
    assert_eq!(targets(vec![a, b], s, 200).unwrap(), ["127.0.0.2:8080", "127.0.0.4:8080"]);
}

#[test]
fn health_policy() {
    let mut sick = zoned("c//Pod/default/a", "127.0.0.2", "z1", "r1");
    sick.status = HealthStatus::Unhealthy;
    let mut s = lb_svc(LoadBalancerMode::Standard, vec![]);
    assert!(targets(vec![sick.clone()], s.clone(), 1).is_err());
    s.load_balancer.as_mut().unwrap().health_policy = HealthPolicy::AllowAll;
    assert_eq!(targets(vec![sick], s, 3).unwrap(), ["127.0.0.2:8080"]);
}

#[test]
fn capacity_weights() {
    let mut heavy = zoned("c//Pod/default/a", "127.0.0.2", "z1", "r1");
    heavy.capacity = 3;
    let light = zoned("c//Pod/default/b", "127.0.0.4", "z1", "r1");
    let mut zero = zoned("c//Pod/default/c", "127.0.0.5", "z1", "r1");
    zero.capacity = 0;
    let mut all = base();
    all.extend([heavy, light, zero]);
    let st = state(all, vec![lb_svc(LoadBalancerMode::Standard, vec![])]);
    let src = st.workload_by_uid(SOURCE).unwrap();
    let n = 4000;
    let mut heavy_hits = 0;
    for _ in 0..n {
        let r = st.route_outbound(&src, "", sa("127.0.0.3:80")).unwrap();
        match summary(&Ok(r)).2.as_str() {
            "127.0.0.2:8080" => heavy_hits += 1,
            "127.0.0.4:8080" => {}
            other => panic!("capacity 0 endpoint chosen: {other}"),
        }
    }
    let share = f64::from(heavy_hits) / f64::from(n);
    assert!((0.70..0.80).contains(&share), "heavy share {share}");
}

#[test]
fn hostname_waypoint_through_its_service() {
    let wp_svc = {
        let mut s = svc("waypoint.ns.svc.cluster.local", &["127.0.0.20"], &[(15008, 15008)]);
        s.namespace = "ns".into();
        s.subject_alt_names = vec!["spiffe://cluster.local/ns/ns/sa/waypoint-svc-san".into()];
        s
    };
    let mut base_wp = base();
    base_wp[1].services.insert("ns/waypoint.ns.svc.cluster.local", BTreeMap::new());
    let mut target = wl("cluster1//v1/Pod/default/my-pod", &["127.0.0.2"]);
    target.waypoint = Some(gw_host("ns", "waypoint.ns.svc.cluster.local", 15008));
    base_wp.push(target);
    let st = state(base_wp, vec![wp_svc]);
    let src = st.workload_by_uid(SOURCE).unwrap();
    let r = st.route_outbound(&src, "", sa("127.0.0.2:80"));
    let r = expect(r, "HBONE", "127.0.0.2:80", "127.0.0.10:15008");
    let RouteKind::Hbone { expected, .. } = r.kind else { unreachable!() };
    assert_eq!(
        expected,
        vec![
            Identity::new("cluster.local", "ns", "waypoint-sa"),
            Identity::new("cluster.local", "ns", "waypoint-svc-san"),
        ]
    );
}

#[test]
fn hostname_waypoint_through_a_workload_hostname() {
    let mut all = base();
    all[2].hostname = "wp.example".into();
    let mut s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    s.waypoint = Some(gw_host("ns", "wp.example", 15008));
    let st = state(all, vec![s]);
    let src = st.workload_by_uid(SOURCE).unwrap();
    // Family-adaptive: the waypoint address follows the dialed family.
    expect(st.route_outbound(&src, "", sa("127.0.0.3:80")), "HBONE", "127.0.0.3:80", "127.0.0.11:15008");
}

#[test]
fn unknown_waypoint_is_an_error() {
    let mut s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    s.waypoint = Some(gw_host("ns", "nowhere", 15008));
    let r = run(vec![], vec![s.clone()], "127.0.0.3:80");
    assert_eq!(r, Err(RouteError::UnknownWaypoint("ns/nowhere".into())));
    s.waypoint = Some(gw_addr("127.9.9.9", 15008));
    let r = run(vec![], vec![s], "127.0.0.3:80");
    assert!(matches!(r, Err(RouteError::UnknownWaypoint(_))));
}

#[test]
fn weighted_waypoints_skip_zero_weights() {
    let mut s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    s.waypoint = Some(gw_addr("127.0.0.11", 15008));
    s.weighted_waypoints = vec![
        WeightedWaypoint { destination: gw_addr("127.0.0.11", 15008), weight: 0 },
        WeightedWaypoint { destination: gw_addr("127.0.0.10", 15008), weight: 5 },
    ];
    for _ in 0..20 {
        let r = run(vec![], vec![s.clone()], "127.0.0.3:80");
        expect(r, "HBONE", "127.0.0.3:80", "127.0.0.10:15008");
    }
    // All-zero weights fall back to `waypoint`.
    s.weighted_waypoints[1].weight = 0;
    let r = run(vec![], vec![s], "127.0.0.3:80");
    expect(r, "HBONE", "127.0.0.3:80", "127.0.0.11:15008");
}

#[test]
fn vip_selection_namespace_visibility_and_cidr() {
    let ep = |uid: &str, ip_: &str, key: &str| endpoint_of(wl(uid, &[ip_]), key, &[(80, 80)]);
    // Two services share a VIP: the client's namespace wins.
    let mut in_ns = svc("a.example", &["127.0.0.3"], &[(80, 80)]);
    in_ns.namespace = "ns".into();
    let other = svc("b.example", &["127.0.0.3"], &[(80, 80)]);
    let ws = vec![
        ep("c//Pod/ns/a", "127.0.0.2", "ns/a.example"),
        ep("c//Pod/default/b", "127.0.0.4", "default/b.example"),
    ];
    let r = run(ws.clone(), vec![other.clone(), in_ns], "127.0.0.3:80").unwrap();
    assert_eq!(r.destination_service.unwrap().hostname, "a.example");

    // A namespace-private service in another namespace is invisible: passthrough.
    let mut private = other.clone();
    private.visibility = Visibility::Namespace;
    let r = run(ws.clone(), vec![private], "127.0.0.3:80");
    expect(r, "PASSTHROUGH", "", "127.0.0.3:80");

    // CIDR VIPs: longest prefix wins, and only on an exact-VIP miss.
    let mut wide = svc("wide.example", &[], &[(80, 80)]);
    wide.cidr_vips = vec![CidrVip { network: String::new(), cidr: "10.0.0.0/8".parse().unwrap() }];
    let mut narrow = svc("narrow.example", &[], &[(80, 80)]);
    narrow.cidr_vips = vec![CidrVip { network: String::new(), cidr: "10.1.0.0/16".parse().unwrap() }];
    let ws = vec![
        ep("c//Pod/default/w", "127.0.0.2", "default/wide.example"),
        ep("c//Pod/default/n", "127.0.0.4", "default/narrow.example"),
    ];
    let svcs = vec![wide, narrow];
    let r = run(ws.clone(), svcs.clone(), "10.1.2.3:80").unwrap();
    assert_eq!(r.destination_service.unwrap().hostname, "narrow.example");
    let r = run(ws.clone(), svcs.clone(), "10.2.0.1:80").unwrap();
    assert_eq!(r.destination_service.unwrap().hostname, "wide.example");
    let r = run(ws, svcs, "11.0.0.1:80");
    expect(r, "PASSTHROUGH", "", "11.0.0.1:80");
}

#[test]
fn service_port_missing_from_service_has_no_upstream() {
    let s = svc("example.com", &["127.0.0.3"], &[(80, 8080)]);
    let w = endpoint_of(wl("c//Pod/default/p", &["127.0.0.2"]), "default/example.com", &[(81, 9090)]);
    let r = run(vec![w], vec![s], "127.0.0.3:81");
    assert_eq!(r, Err(RouteError::NoHealthyUpstream(sa("127.0.0.3:81"))));
}
