//! Local config YAML: ztunnel's format accepted unchanged, errors located, dump shape.

use super::*;
use crate::authz::{Action, Scope, ServiceAccountMatch, StringMatch};
use crate::state::config::budget;

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
    assert_eq!(&*w.uid, "cluster1//v1/Pod/default/local");
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
    second.services.insert("default/staged.example", BTreeMap::new());
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
fn an_empty_file_is_refused_and_an_explicit_empty_config_accepted() {
    for empty in ["", "\n", "   \n\t\n", "# nothing\n\n", "  # truncated by an editor\n"] {
        let e = LocalConfig::parse(empty).unwrap_err();
        assert!(matches!(e, LocalConfigError::Empty), "{empty:?}: {e}");
        assert_eq!(
            e.to_string(),
            "the local config is empty (only whitespace or comments), which would remove every \
             workload, service and policy; refusing it (an editor may have truncated it before \
             writing). Write `{}` for a config that is meant to be empty"
        );
    }
    for explicit in
        ["{}", "{}\n", "# mesh\n{}\n", "workloads: []", "workloads: []\nservices: []\npolicies: []\n"]
    {
        assert_eq!(LocalConfig::parse(explicit).unwrap(), LocalConfig::default(), "{explicit:?}");
    }
}

const TWO_WORKLOADS: &str = "workloads:
- uid: a
  namespace: default
  workloadIps: [\"10.0.0.1\", \"fd00::1\"]
- uid: b
  namespace: default
  workloadIps: [\"10.0.0.2\"]
";

#[test]
fn duplicate_uids_are_refused_with_both_positions() {
    let yaml = format!("{TWO_WORKLOADS}- uid: a\n  namespace: other\n  workloadIps: [\"10.0.0.3\"]\n");
    let e = LocalConfig::parse(&yaml).unwrap_err();
    assert_eq!(
        e.to_string(),
        "workload at line 8, column 3 has uid \"a\", which the workload at line 2, column 3 already \
         has; every workload needs its own uid"
    );
    assert_eq!(e.position(), Some(Position { line: 8, column: 3 }));
}

#[test]
fn duplicate_addresses_are_refused_with_both_positions() {
    let yaml = format!(
        "{TWO_WORKLOADS}- uid: c\n  namespace: default\n  workloadIps: [\"10.0.0.5\", \"fd00::1\"]\n"
    );
    let e = LocalConfig::parse(&yaml).unwrap_err();
    assert_eq!(
        e.to_string(),
        "workload \"c\" at line 8, column 3 has address fd00::1 on network \"\", which workload \"a\" at \
         line 2, column 3 already has; two workloads cannot share an address on one network (only \
         host-network workloads may)"
    );
    assert_eq!(e.position(), Some(Position { line: 8, column: 3 }));
    // The same address on another network, on a host-network workload, or twice in one
    // workload is fine.
    for ok in [
        "- uid: c\n  namespace: default\n  network: remote\n  workloadIps: [\"10.0.0.1\"]\n",
        "- uid: c\n  namespace: default\n  networkMode: HostNetwork\n  workloadIps: [\"10.0.0.1\"]\n",
        "- uid: c\n  namespace: default\n  workloadIps: [\"10.0.0.9\", \"10.0.0.9\"]\n",
    ] {
        let cfg = LocalConfig::parse(&format!("{TWO_WORKLOADS}{ok}")).unwrap();
        assert_eq!(cfg.workloads.len(), 3, "{ok}");
    }
}

#[test]
fn duplicate_services_and_policies_are_refused() {
    let svc = "- name: s\n  namespace: default\n  hostname: s.example\n";
    let e = LocalConfig::parse(&format!("services:\n{svc}{svc}")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "service default/s.example at line 5, column 3 is already defined at line 2, column 3; define \
         each service once"
    );
    let other_ns = svc.replace("namespace: default", "namespace: other");
    assert_eq!(LocalConfig::parse(&format!("services:\n{svc}{other_ns}")).unwrap().services.len(), 2);
    let pol = "- name: p\n  namespace: default\n";
    let e = LocalConfig::parse(&format!("policies:\n{pol}{pol}")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "policy default/p at line 4, column 3 is already defined at line 2, column 3; define each \
         policy once"
    );
}

/// A fully specified workload of the shape a mesh generator would write (every string key set,
/// dual-stack, one service entry, one listed policy); `i` makes uid, name and addresses unique.
fn big_workload(i: usize) -> String {
    let (hi, lo) = (i / 65_536, i % 65_536);
    format!(
        "- uid: cluster1//v1/Pod/ns{ns}/app-{i}-5d9c7b8f4-x2x4q\n  name: app-{i}-5d9c7b8f4-x2x4q\n  \
         namespace: ns{ns}\n  serviceAccount: app-{svc}\n  trustDomain: cluster.local\n  \
         workloadIps: [\"10.{hi}.{a}.{b}\", \"fd00::{hi:x}:{lo:x}\"]\n  protocol: HBONE\n  node: node-{node}\n  \
         network: \"\"\n  canonicalName: app-{svc}\n  canonicalRevision: v1\n  workloadName: app-{svc}\n  \
         workloadType: deployment\n  clusterId: cluster1\n  hostname: \"\"\n  \
         authorizationPolicies: [ns{ns}/allow-app-{svc}]\n  locality: {{region: eu-west-1, zone: eu-west-1a}}\n  \
         services:\n    \"ns{ns}/app-{svc}.ns{ns}.svc.cluster.local\":\n      80: 8080\n",
        ns = i % 100,
        svc = i / 5,
        node = i % 1000,
        a = lo / 256,
        b = lo % 256,
    )
}

fn big_service(i: usize) -> String {
    format!(
        "- name: app-{i}\n  namespace: ns{ns}\n  hostname: app-{i}.ns{ns}.svc.cluster.local\n  \
         vips: [\"/10.96.{a}.{b}\"]\n  ports: {{80: 8080}}\n  \
         subjectAltNames: [\"spiffe://cluster.local/ns/ns{ns}/sa/app-{i}\"]\n",
        ns = i % 100,
        a = i / 256,
        b = i % 256,
    )
}

fn big_policy(i: usize) -> String {
    format!(
        "- name: allow-app-{i}\n  namespace: ns{ns}\n  scope: WorkloadSelector\n  action: Allow\n  \
         rules: [[[{{principals: [{{Exact: \"cluster.local/ns/ns{ns}/sa/client\"}}]}}], [{{destinationPorts: [8080]}}]]]\n",
        ns = i % 100
    )
}

/// A config with `workloads` workloads and the services and policies in the proportion of the
/// mesh we claim (5 workloads per service, 25 per policy).
pub(super) fn mesh_yaml(workloads: usize) -> String {
    let mut y = String::with_capacity(workloads * 700);
    y.push_str("workloads:\n");
    (0..workloads).for_each(|i| y.push_str(&big_workload(i)));
    y.push_str("services:\n");
    (0..workloads / 5).for_each(|i| y.push_str(&big_service(i)));
    y.push_str("policies:\n");
    (0..workloads / 25).for_each(|i| y.push_str(&big_policy(i)));
    y
}

static LAST_REPORT: std::sync::Mutex<Option<(usize, usize, usize)>> = std::sync::Mutex::new(None);

fn record(report: &serde_saphyr::budget::BudgetReport) {
    *LAST_REPORT.lock().unwrap() = Some((report.nodes, report.events, report.total_scalar_bytes));
}

/// What one item costs the YAML budget (nodes, events, scalar bytes), measured.
fn cost(yaml: &str) -> (usize, usize, usize) {
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget());
    options.budget_report = Some(record);
    let _: LocalConfig = serde_saphyr::from_str_with_options(yaml, options).unwrap();
    LAST_REPORT.lock().unwrap().take().unwrap()
}

/// The budget's per-item allowances hold what the items of the largest mesh cost, with at least
/// 50 % to spare (the figures quoted in `config.rs` come from here).
#[test]
fn budget_fits_the_largest_mesh() {
    let one = |item: String, key: &str| cost(&format!("{key}:\n{item}"));
    let (wn, we, wb) = one(big_workload(123_456), "workloads");
    let (sn, se, sb) = one(big_service(12_345), "services");
    let (pn, pe, pb) = one(big_policy(1_234), "policies");
    println!("per workload: {wn} nodes, {we} events, {wb} scalar bytes");
    println!("per service: {sn} nodes, {se} events, {sb} scalar bytes");
    println!("per policy: {pn} nodes, {pe} events, {pb} scalar bytes");
    let items = MAX_WORKLOADS + MAX_SERVICES + MAX_POLICIES;
    let b = budget();
    let need = |w: usize, s: usize, p: usize| MAX_WORKLOADS * w + MAX_SERVICES * s + MAX_POLICIES * p;
    assert!(b.max_nodes * 2 >= need(wn, sn, pn) * 3, "{} nodes for {items} items", b.max_nodes);
    assert!(b.max_events * 2 >= need(we, se, pe) * 3, "{} events", b.max_events);
    assert!(
        b.max_total_scalar_bytes * 2 >= need(wb, sb, pb) * 3,
        "{} scalar bytes",
        b.max_total_scalar_bytes
    );
    // The file of that mesh fits the size cap too.
    let bytes = MAX_WORKLOADS * big_workload(123_456).len()
        + MAX_SERVICES * big_service(12_345).len()
        + MAX_POLICIES * big_policy(1_234).len();
    println!("the largest mesh's file: {bytes} bytes");
    assert!(MAX_FILE_BYTES * 2 >= bytes * 3, "{bytes} bytes");
}

/// A valid file of 250 000 small workloads (uid, namespace, one IP) is accepted, where the YAML
/// parser's default budget (250 000 nodes) refused any file beyond about 30 000 of them. Sized
/// to run in a debug build in about 15 s; the largest fully specified mesh, slower to parse, is
/// `the_largest_mesh_is_accepted` (release builds).
#[test]
fn a_250k_workload_file_is_accepted() {
    const N: usize = 250_000;
    let mut yaml = String::with_capacity(N * 60);
    yaml.push_str("workloads:\n");
    for i in 0..N {
        let lo = i % 65_536;
        yaml.push_str(&format!(
            "- {{uid: w{i}, namespace: ns, workloadIps: [10.{}.{}.{}]}}\n",
            i / 65_536,
            lo / 256,
            lo % 256
        ));
    }
    let t0 = std::time::Instant::now();
    let cfg = LocalConfig::parse(&yaml).unwrap();
    let parsed = t0.elapsed();
    let st = State::from_config(cfg, None).unwrap();
    println!("{} bytes: parsed in {parsed:?}, state built {:?} later", yaml.len(), t0.elapsed() - parsed);
    assert_eq!(st.workloads().count(), N);
    assert_eq!(st.workload_by_addr("", ip("10.3.208.143")).map(|w| w.uid.clone()), Some("w249999".into()));
    let mut old = serde_saphyr::Options::default();
    old.budget = Some(serde_saphyr::Budget::default());
    let refused = serde_saphyr::from_str_with_options::<LocalConfig>(&yaml, old).unwrap_err();
    assert!(refused.to_string().contains("budget"), "{refused}");
}

/// A generated mesh of `MAX_WORKLOADS` workloads (with as many services and policies as allowed)
/// parses and builds. Slow in a debug build, so it runs in release builds only
/// (`cargo test --release -p ambit-proxy the_largest_mesh`); in debug builds (CI) the
/// 250 000-workload acceptance is `a_250k_workload_file_is_accepted`.
#[test]
#[cfg_attr(debug_assertions, ignore = "a 1 000 000-workload parse: run with --release")]
fn the_largest_mesh_is_accepted() {
    let yaml = mesh_yaml(MAX_WORKLOADS);
    let t0 = std::time::Instant::now();
    let cfg = LocalConfig::parse(&yaml).unwrap();
    let parsed = t0.elapsed();
    assert_eq!(
        (cfg.workloads.len(), cfg.services.len(), cfg.policies.len()),
        (MAX_WORKLOADS, MAX_SERVICES, MAX_POLICIES)
    );
    let st = State::from_config(cfg, Some("node-7")).unwrap();
    println!("{} bytes: parsed in {parsed:?}, state built {:?} later", yaml.len(), t0.elapsed() - parsed);
    assert_eq!(st.workloads().count(), MAX_WORKLOADS);
    assert!(st.workload_by_addr("", ip("10.3.208.143")).is_some());
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
fn an_oversized_file_is_refused_before_it_is_read() {
    let file = tempfile::NamedTempFile::new().unwrap();
    // Sparse: no disk space, no memory.
    file.as_file().set_len(MAX_FILE_BYTES as u64 + 1).unwrap();
    let Err(e) = load_local_file(file.path(), None) else { panic!("an oversized file loads") };
    assert_eq!(
        e.to_string(),
        format!(
            "the local config is {} bytes, more than the {MAX_FILE_BYTES}-byte limit; is this the right file?",
            MAX_FILE_BYTES + 1
        )
    );
}

#[test]
fn load_reports_the_path() {
    let Err(e) = load_local_file(std::path::Path::new("/nonexistent/ambit.yaml"), None) else {
        panic!("a missing file loads")
    };
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

/// Replicas (same namespace, identity, services, zone…) share one profile; a replica that differs
/// in one of those fields gets its own, and writing a field of one workload copies its profile
/// without touching the others'.
#[test]
fn replicas_share_one_profile_and_a_written_field_unshares_it() {
    let replica = |i: usize, sa: &str| {
        format!(
            "- uid: c//v1/Pod/ns/web-{i}\n  name: web-{i}\n  namespace: ns\n  serviceAccount: {sa}\n  \
             workloadIps: [\"10.1.0.{i}\"]\n  node: node-{i}\n  services: {{\"ns/web.ns.svc\": {{80: 8080}}}}\n"
        )
    };
    let yaml = format!("workloads:\n{}{}{}", replica(1, "web"), replica(2, "web"), replica(3, "other"));
    let cfg = LocalConfig::parse(&yaml).expect("parses");
    let [a, b, c] = [&cfg.workloads[0], &cfg.workloads[1], &cfg.workloads[2]];
    assert!(Arc::ptr_eq(a.profile(), b.profile()), "two replicas hold two profiles");
    assert!(!Arc::ptr_eq(a.profile(), c.profile()), "another service account shares the profile");
    assert_eq!((&*a.node, &*b.node, &*a.name, &*b.name), ("node-1", "node-2", "web-1", "web-2"));

    let mut moved = a.clone();
    moved.service_account = "moved".into();
    assert!(!Arc::ptr_eq(moved.profile(), a.profile()));
    assert_eq!((&*moved.service_account, &*a.service_account, &*b.service_account), ("moved", "web", "web"));
    // The dump writes every field flat again, as it was read.
    let dumped = serde_json::to_value(a).expect("serializes");
    assert_eq!(dumped["serviceAccount"], "web");
    assert_eq!(dumped["node"], "node-1");
    assert_eq!(dumped["services"]["ns/web.ns.svc"]["80"], 8080);
}

/// A JSON file reads as the YAML it equals; YAML flow syntax that is not JSON still reads as
/// YAML; a duplicate key is refused either way; a JSON file is held to the file's sizes.
#[test]
fn a_json_file_reads_as_its_yaml_and_is_held_to_the_same_rules() {
    let mesh = crate::testing::generated::mesh(120);
    let json = serde_json::to_string(&mesh).expect("serializes");
    assert_eq!(LocalConfig::parse(&json).expect("the JSON parses"), mesh);
    assert_eq!(LocalConfig::parse(&crate::testing::generated::local_config_yaml(120)).expect("parses"), mesh);

    let flow = LocalConfig::parse("{workloads: [], services: [], policies: []}").expect("YAML flow");
    assert_eq!(flow, LocalConfig::default());
    assert_eq!(LocalConfig::parse("{}").expect("an empty config"), LocalConfig::default());

    let dup_json = r#"{"workloads": [{"uid": "a", "name": "a", "namespace": "ns", "workloadIps": [],
        "services": {"ns/x": {"80": 1, "80": 2}}}]}"#;
    let dup_yaml = "workloads:\n- uid: a\n  name: a\n  namespace: ns\n  workloadIps: []\n  services: {ns/x: {80: 1, 80: 2}}\n";
    let (j, y) = (LocalConfig::parse(dup_json).unwrap_err(), LocalConfig::parse(dup_yaml).unwrap_err());
    // The JSON reader refuses it (it would have kept the last key) and the YAML reader reports it.
    let first_line = |e: &LocalConfigError| e.to_string().lines().next().unwrap_or_default().to_owned();
    assert_eq!(
        first_line(&j),
        "invalid local config YAML: error: line 2 column 40: duplicate mapping key: 80, set \
         DuplicateKeyPolicy in Options if acceptable"
    );
    assert_eq!(
        first_line(&y),
        "invalid local config YAML: error: line 6 column 28: duplicate mapping key: 80, set \
         DuplicateKeyPolicy in Options if acceptable"
    );

    let services: Vec<String> = (0..=MAX_SERVICES)
        .map(|i| format!(r#"{{"name":"s{i}","namespace":"n","hostname":"h{i}"}}"#))
        .collect();
    let big = format!(r#"{{"services":[{}]}}"#, services.join(","));
    assert_eq!(
        LocalConfig::parse(&big).unwrap_err().to_string(),
        "the local config lists 200001 services, more than the 200000 a local file is sized for; serve a \
         mesh this large over xDS"
    );
}

/// A file of the plain block shape parses in pieces to exactly the whole-file result; any other
/// shape, or a piece that fails on its own, is left to the whole-file parse.
#[test]
fn a_large_file_parses_in_pieces_to_the_whole_files_result() {
    use super::pieces;
    let yaml = crate::testing::generated::local_config_yaml(300);
    let whole = LocalConfig::parse(&yaml).expect("parses");
    for threads in [2, 3, 7] {
        assert_eq!(pieces::parse(&yaml, threads, 0).as_ref(), Some(&whole), "{threads} threads");
    }
    assert_eq!(pieces::parse(&yaml, 1, 0), None, "one thread");
    assert_eq!(pieces::parse(&yaml, 4, yaml.len() + 1), None, "below the size");

    let item = |i: usize| {
        format!("- uid: c//v1/Pod/ns/w{i}\n  name: w{i}\n  namespace: ns\n  workloadIps: [\"10.2.0.{i}\"]\n")
    };
    let items: String = (1..=8).map(item).collect();
    let plain = format!("# a comment\nworkloads:\n{items}services: []\n");
    // `services: []` is a key with a value on its line: not the plain shape.
    assert_eq!(pieces::parse(&plain, 4, 0), None);
    let plain = format!(
        "# a comment\nworkloads:\n{items}\n# between\npolicies:\n- name: p\n  namespace: ns\n  scope: Global\n  action: Deny\n"
    );
    let parsed = pieces::parse(&plain, 4, 0).expect("the plain shape");
    assert_eq!(parsed, LocalConfig::parse(&plain).expect("parses"));
    assert_eq!((parsed.workloads.len(), parsed.policies.len()), (8, 1));

    let not_plain = [
        ("flow at the top", format!("{{workloads: [{}]}}", "{uid: a, name: a, namespace: ns}")),
        ("a key twice", format!("workloads:\n{}workloads:\n{}", item(1), item(2))),
        ("an indented list", "workloads:\n  - uid: a\n    name: a\n    namespace: ns\n".to_owned()),
        ("a key without items", "workloads:\nservices:\n".to_owned()),
        ("a document marker", format!("---\nworkloads:\n{items}")),
        ("another key", format!("workloads:\n{items}extra:\n- 1\n")),
    ];
    for (what, text) in &not_plain {
        assert_eq!(pieces::parse(text, 4, 0), None, "{what}");
    }
    // An alias to an anchor in another piece, and a broken item, fail their piece: the whole-file
    // parse decides (the alias resolves there; the error is the whole file's).
    let aliased = format!(
        "workloads:\n- &first\n  uid: c//v1/Pod/ns/a\n  name: a\n  namespace: ns\n{}- uid: c//v1/Pod/ns/b\n  name: b\n  namespace: ns\n  workloadIps: []\n  services: *nothing\n",
        (1..=8).map(item).collect::<String>()
    );
    assert_eq!(pieces::parse(&aliased, 4, 0), None);
    let broken = format!("workloads:\n{items}- uid: [unclosed\n");
    assert_eq!(pieces::parse(&broken, 4, 0), None);
    let err = LocalConfig::parse(&broken).unwrap_err().to_string();
    assert_eq!(
        err.lines().next(),
        Some("invalid local config YAML: error: line 34 column 8: expected string scalar")
    );
}
