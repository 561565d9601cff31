//! Local config YAML: ztunnel's format accepted unchanged, errors located, dump shape.

use super::*;
use crate::authz::{Action, Scope, ServiceAccountMatch, StringMatch};

const ZTUNNEL_LOCAL: &str = r#"workloads:
- uid: cluster1//v1/Pod/default/local
  name: local
  namespace: default
  serviceAccount: default
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
  node: local
  network: ""
  services:
    "default/example.com":
      80: 8080
policies:
- name: deny-9999
  namespace: default
  scope: Namespace
  action: Allow
  rules: [[[{notDestinationPorts: [9999]}]]]
services:
- name: local
  namespace: default
  hostname: example.com
  vips: ["/127.10.0.1"]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/local"]
"#;

#[test]
fn parses_ztunnel_local_config_verbatim() {
    let cfg = LocalConfig::parse(ZTUNNEL_LOCAL).unwrap();
    assert_eq!(cfg.workloads.len(), 1);
    let w = &cfg.workloads[0];
    assert_eq!(w.uid, "cluster1//v1/Pod/default/local");
    assert_eq!(w.workload_ips, vec![ip("127.0.0.1")]);
    assert_eq!(w.protocol, Protocol::Hbone);
    assert_eq!(w.node, "local");
    assert_eq!(w.capacity, 1);
    assert_eq!(w.status, HealthStatus::Healthy);
    // Local config does not apply proto defaults.
    assert_eq!(w.trust_domain, "");
    assert_eq!(w.cluster_id, "");
    assert_eq!(w.services["default/example.com"], BTreeMap::from([(80u16, 8080u16)]));

    let p = &cfg.policies[0];
    assert_eq!(p.key(), "default/deny-9999");
    assert_eq!((p.scope, p.action, p.dry_run), (Scope::Namespace, Action::Allow, false));
    assert_eq!(p.rules.len(), 1);
    assert_eq!(p.rules[0][0][0].not_destination_ports, vec![9999]);

    let s = &cfg.services[0];
    assert_eq!(s.key(), "default/example.com");
    assert_eq!(s.vips, vec![NetworkAddress { network: String::new(), address: ip("127.10.0.1") }]);
    assert_eq!(s.ports, BTreeMap::from([(80, 8080)]));

    let st = State::from_config(cfg, Some("local")).unwrap();
    let local = st.find_local("default", "local", "default").unwrap();
    assert_eq!(local.identity().to_string(), "spiffe://cluster.local/ns/default/sa/default");
    assert_eq!(st.policies_for(&local).len(), 1);
    let svc = st.service_by_vip("", ip("127.10.0.1"), "default").unwrap();
    assert!(svc.endpoints.contains_key("cluster1//v1/Pod/default/local"));
    // Another node's proxy does not see this workload as local.
    let cfg = LocalConfig::parse(ZTUNNEL_LOCAL).unwrap();
    let other = State::from_config(cfg, Some("elsewhere")).unwrap();
    assert!(other.find_local("default", "local", "default").is_none());
}

#[test]
fn parses_policies_with_string_matches() {
    let yaml = r#"
policies:
- name: allow-frontend
  namespace: shop
  scope: WorkloadSelector
  action: Deny
  dryRun: true
  rules:
  - - - principals: [{Exact: "cluster.local/ns/shop/sa/frontend"}, {Prefix: "cluster.local/ns/ops/"}]
        notNamespaces: [{Suffix: "-test"}]
        serviceAccounts: [{namespace: shop, serviceAccount: frontend}]
        sourceIps: ["10.0.0.0/8", "fd00::/8"]
        destinationPorts: [8080]
        notDestinationPorts: [9999]
    - - namespaces: [{Presence: []}]
"#;
    let cfg = LocalConfig::parse(yaml).unwrap();
    let p = &cfg.policies[0];
    assert_eq!((p.scope, p.action, p.dry_run), (Scope::WorkloadSelector, Action::Deny, true));
    let m = &p.rules[0][0][0];
    assert_eq!(
        m.principals,
        vec![
            StringMatch::Exact("cluster.local/ns/shop/sa/frontend".into()),
            StringMatch::Prefix("cluster.local/ns/ops/".into()),
        ]
    );
    assert_eq!(m.not_namespaces, vec![StringMatch::Suffix("-test".into())]);
    assert_eq!(
        m.service_accounts,
        vec![ServiceAccountMatch { namespace: "shop".into(), service_account: "frontend".into() }]
    );
    assert_eq!(m.source_ips.len(), 2);
    assert_eq!((m.destination_ports.clone(), m.not_destination_ports.clone()), (vec![8080], vec![9999]));
    assert_eq!(p.rules[0][1][0].namespaces, vec![StringMatch::Presence()]);

    // Selector-scoped: applies only to workloads listing it.
    let mut listed = wl("c//Pod/shop/a", &["10.1.0.1"]);
    listed.namespace = "shop".into();
    listed.authorization_policies = vec!["shop/allow-frontend".into(), "shop/unknown".into()];
    let mut unlisted = listed.clone();
    unlisted.uid = "c//Pod/shop/b".into();
    unlisted.authorization_policies.clear();
    let st = State::from_config(
        LocalConfig {
            workloads: vec![listed.clone(), unlisted.clone()],
            services: vec![],
            policies: cfg.policies,
        },
        None,
    )
    .unwrap();
    assert_eq!(st.policies_for(&listed).len(), 1);
    assert!(st.policies_for(&unlisted).is_empty());
}

/// The full `examples/localhost.yaml` shape, with every optional key ztunnel knows.
#[test]
fn parses_full_shape() {
    let yaml = r#"
workloads:
- uid: cluster1//v1/Pod/default/local
  name: local
  namespace: default
  serviceAccount: default
  trustDomain: cluster.local
  workloadIps: ["127.0.0.1", "::1"]
  protocol: HBONE
  networkMode: Standard
  node: local
  network: ""
  waypoint: {destination: "/127.0.0.10", hboneMtlsPort: 15008}
  networkGateway: {destination: "istio-system/eastwest.example", hboneMtlsPort: 15009}
  canonicalName: local
  canonicalRevision: v1
  workloadName: local
  workloadType: deployment
  clusterId: cluster1
  nativeTunnel: false
  applicationTunnel: {protocol: PROXY, port: 15088}
  authorizationPolicies: ["default/p"]
  status: Unhealthy
  locality: {region: r, zone: z, subzone: s}
  capacity: 7
  hostname: local.example
  services:
    "default/example.com": {80: 8080}
    "default/example2.com": {80: 8080}
- uid: cluster1//v1/Pod/default/local-tcp
  namespace: default
  workloadIps: ["127.0.0.2"]
  protocol: TCP
  networkMode: HostNetwork
services:
- name: local
  namespace: default
  hostname: example.com
  vips: ["/127.10.0.1"]
  cidrVips: [{network: "", cidr: "10.9.0.0/16"}]
  ports: {80: 8080}
  subjectAltNames: ["spiffe://cluster.local/ns/default/sa/local"]
  canonical: true
  waypoint: {destination: "default/waypoint.example", hboneMtlsPort: 15008}
  weightedWaypoints: [{destination: {destination: "/127.0.0.11", hboneMtlsPort: 15008}, weight: 3}]
  loadBalancer: {routingPreferences: [Network, Region, Zone, Subzone, Node, Cluster], mode: Failover, healthPolicy: AllowAll}
  ipFamilies: Dual
  visibility: Namespace
  endpoints:
    cluster1//v1/Pod/default/static: {workloadUid: cluster1//v1/Pod/default/static, port: {80: 9090}, status: Healthy}
- name: remote
  namespace: default
  hostname: example2.com
  vips: ["remote/127.10.0.2"]
  ports: {80: 8080}
  ipFamilies: IPv6
"#;
    let cfg = LocalConfig::parse(yaml).unwrap();
    let w = &cfg.workloads[0];
    assert_eq!(w.waypoint, Some(gw_addr("127.0.0.10", 15008)));
    assert_eq!(w.network_gateway, Some(gw_host("istio-system", "eastwest.example", 15009)));
    assert_eq!(
        w.application_tunnel,
        Some(ApplicationTunnel { protocol: AppTunnelProtocol::Proxy, port: Some(15088) })
    );
    assert_eq!((w.capacity, w.status), (7, HealthStatus::Unhealthy));
    assert_eq!(cfg.workloads[1].network_mode, NetworkMode::HostNetwork);
    let s = &cfg.services[0];
    let lb = s.load_balancer.as_ref().unwrap();
    assert_eq!(lb.routing_preferences.len(), 6);
    assert_eq!((lb.mode, lb.health_policy), (LoadBalancerMode::Failover, HealthPolicy::AllowAll));
    assert_eq!(s.weighted_waypoints[0].weight, 3);
    assert_eq!(s.visibility, Visibility::Namespace);
    assert_eq!(s.endpoints.len(), 1);
    assert_eq!(cfg.services[1].vips[0].network, "remote");
    assert_eq!(cfg.services[1].ip_families, Some(IpFamily::IPv6));

    let st = State::from_config(cfg, None).unwrap();
    // The unhealthy workload is kept as an endpoint since the service allows all.
    let svc = st.service_by_name("default", "example.com").unwrap();
    assert_eq!(svc.endpoints.len(), 2);
    // example2.com has no ALLOW_ALL: the unhealthy endpoint is dropped.
    assert!(st.service_by_name("default", "example2.com").unwrap().endpoints.is_empty());
    // Host-network workloads are not indexed by address.
    assert!(st.workload_by_addr("", ip("127.0.0.2")).is_none());
}

#[test]
fn dump_is_sorted_and_camel_case() {
    let mut cfg = LocalConfig::parse(ZTUNNEL_LOCAL).unwrap();
    let mut second = cfg.workloads[0].clone();
    second.uid = "a-first".into();
    second.workload_ips = vec![ip("127.0.0.5")];
    second.services.insert("default/staged.example".into(), BTreeMap::new());
    cfg.workloads.push(second);
    let mut s2 = cfg.services[0].clone();
    s2.hostname = "a.example".into();
    cfg.services.push(s2);
    let st = State::from_config(cfg, None).unwrap();
    let d = st.dump();
    let uids: Vec<&str> =
        d["workloads"].as_array().unwrap().iter().map(|w| w["uid"].as_str().unwrap()).collect();
    assert_eq!(uids, ["a-first", "cluster1//v1/Pod/default/local"]);
    let hosts: Vec<&str> =
        d["services"].as_array().unwrap().iter().map(|s| s["hostname"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["a.example", "example.com"]);
    assert_eq!(d["workloads"][1]["workloadIps"][0], "127.0.0.1");
    assert_eq!(d["workloads"][1]["protocol"], "HBONE");
    assert_eq!(d["services"][1]["vips"][0], "/127.10.0.1");
    assert_eq!(d["policies"][0]["name"], "deny-9999");
    assert_eq!(d["policies"][0]["rules"][0][0][0]["notDestinationPorts"][0], 9999);
    assert!(d["stagedServices"]["default/staged.example"]["a-first"].is_object());
}

#[test]
fn empty_and_comment_only_documents_are_empty_configs() {
    assert_eq!(LocalConfig::parse("").unwrap(), LocalConfig::default());
    assert_eq!(LocalConfig::parse("# nothing\n\n").unwrap(), LocalConfig::default());
    assert_eq!(LocalConfig::parse("workloads: []").unwrap(), LocalConfig::default());
}

#[test]
fn errors_carry_location() {
    let yaml = "workloads:\n- uid: a\n  namespace: default\n  workloadIps: [\"not-an-ip\"]\n";
    let e = LocalConfig::parse(yaml).unwrap_err();
    let LocalConfigError::Yaml { line, .. } = &e else { panic!("want a YAML error, got {e}") };
    assert_eq!(*line, Some(4), "{e}");
    assert!(e.to_string().contains("line 4"), "{e}");

    // Missing required key.
    let e = LocalConfig::parse("workloads:\n- uid: a\n  workloadIps: []\n").unwrap_err();
    assert!(e.to_string().contains("namespace"), "{e}");
    // Bad VIP form.
    let e = LocalConfig::parse("services:\n- hostname: h\n  vips: [\"10.0.0.1\"]\n").unwrap_err();
    assert!(e.to_string().contains("<network>/<ip>"), "{e}");
    // Bad services key is rejected when building the state.
    let cfg =
        LocalConfig::parse("workloads:\n- namespace: d\n  workloadIps: []\n  services: {nokey: {80: 80}}\n")
            .unwrap();
    assert!(matches!(State::from_config(cfg, None), Err(LocalConfigError::ServiceKey { .. })));
}

#[test]
fn load_reports_the_path() {
    let e = LocalConfig::load(std::path::Path::new("/nonexistent/ambit.yaml")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/ambit.yaml"), "{e}");
}

#[test]
fn gateway_destination_forms() {
    assert_eq!(
        "net1/10.0.0.1".parse::<Destination>(),
        Ok(Destination::Address(NetworkAddress { network: "net1".into(), address: ip("10.0.0.1") }))
    );
    assert_eq!("/ff06::1".parse::<Destination>().unwrap().to_string(), "/ff06::1");
    assert_eq!("ns/wp.example".parse::<Destination>().unwrap().to_string(), "ns/wp.example");
    assert!("no-slash".parse::<Destination>().is_err());
    assert!("ns/".parse::<Destination>().is_err());
}

#[test]
fn string_match_tag_form() {
    let yaml = "policies:\n- name: p\n  namespace: n\n  rules: [[[{principals: [!Exact x, !Suffix y]}]]]\n";
    let cfg = LocalConfig::parse(yaml).unwrap();
    assert_eq!(
        cfg.policies[0].rules[0][0][0].principals,
        vec![StringMatch::Exact("x".into()), StringMatch::Suffix("y".into())]
    );
}
