//! The translation recomputes only what a change feeds (the table in `translate`'s module
//! documentation), proven with its `Recomputed` counter, and publishes only what changed.
//! Also the queries the xDS server uses (§1.3).

use ambit_api::workload::address;
use ambit_control::translate::{Recomputed, Settings, Translator};
use ambit_objects::{Change, Kind, Object, ObjectKey};
use serde_json::{Value, json};

fn obj(v: Value) -> Change {
    Change::Upsert(Object::from_value(v).expect("valid object"))
}

fn pod(ns: &str, name: &str, ip: &str, node: &str, app: &str) -> Change {
    obj(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [{"name": "web", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }))
}

fn service(ns: &str, name: &str, ip: &str, target: Value) -> Change {
    obj(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": ip, "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": target}]},
    }))
}

fn node(name: &str, zone: &str) -> Change {
    obj(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}}}))
}

/// 1 000 pods in 10 namespaces of 100 on 10 nodes, one Service per namespace selecting them.
fn mesh() -> Translator {
    let mut t = Translator::new(Settings::default());
    let mut changes = Vec::new();
    for n in 0..10 {
        changes.push(node(&format!("node-{n}"), "z1"));
    }
    for ns in 0..10 {
        let nsname = format!("ns-{ns}");
        changes.push(service(&nsname, "web", &format!("10.96.0.{ns}"), json!(8080)));
        for p in 0..100 {
            let ip = format!("10.{ns}.{}.{}", p / 250, p % 250 + 1);
            changes.push(pod(&nsname, &format!("web-{p}"), &ip, &format!("node-{}", p % 10), "web"));
        }
    }
    let out = t.apply(changes);
    assert_eq!(out.addresses.len(), 1010, "1000 workloads and 10 services published");
    t
}

#[test]
fn one_pod_changed_among_1000_recomputes_one_workload_and_sends_one() {
    let mut t = mesh();
    // A pod that becomes unready.
    let out = t.apply([obj(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-42", "namespace": "ns-3", "labels": {"app": "web"}},
        "spec": {"nodeName": "node-2", "containers": [{"name": "c", "ports": [{"name": "web", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": "10.3.0.43"},
    }))]);
    assert_eq!(t.recomputed(), Recomputed { workloads: 1, services: 0, policies: 0, waypoints: 0 });
    let names: Vec<&str> = out.addresses.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["Kubernetes//Pod/ns-3/web-42"]);
    assert!(out.authorizations.is_empty());

    // The same pod again: recomputed, but equal on the proto, so nothing is sent.
    let again = t.apply([pod("ns-3", "web-42", "10.3.0.43", "node-2", "web")]);
    assert_eq!(again.addresses.len(), 1, "ready again");
    let same = t.apply([pod("ns-3", "web-42", "10.3.0.43", "node-2", "web")]);
    assert_eq!(t.recomputed().workloads, 1);
    assert!(same.is_empty(), "an unchanged translation publishes nothing: {same:?}");

    // Deleted: one removal.
    let gone = t.apply([Change::Delete(ObjectKey::new(Kind::Pod, "ns-3", "web-42"))]);
    assert_eq!(t.recomputed().workloads, 1);
    assert_eq!(gone.addresses, vec![("Kubernetes//Pod/ns-3/web-42".to_owned(), None)]);
    assert!(t.service_members("ns-3/web.ns-3.svc.cluster.local").len() == 99);
}

#[test]
fn a_service_change_recomputes_only_its_namespace() {
    let mut t = mesh();
    // Named target port: every pod of ns-5 now maps 80 → its container port `web`.
    let out = t.apply([service("ns-5", "web", "10.96.0.5", json!("web"))]);
    assert_eq!(t.recomputed(), Recomputed { workloads: 100, services: 1, policies: 0, waypoints: 0 });
    assert_eq!(out.addresses.len(), 1, "only the Service changed: every pod still maps 80→8080");
    assert_eq!(out.addresses[0].0, "ns-5/web.ns-5.svc.cluster.local");

    // A different target: the Service (target 0 stays 0) is unchanged, the 100 pods change.
    let out = t.apply([service("ns-5", "web", "10.96.0.5", json!(9090))]);
    assert_eq!(t.recomputed(), Recomputed { workloads: 100, services: 1, policies: 0, waypoints: 0 });
    assert_eq!(out.addresses.len(), 101);
    assert!(out.addresses.iter().all(|(n, _)| n.contains("ns-5")), "nothing outside ns-5");
}

#[test]
fn a_node_change_recomputes_its_pods_only() {
    let mut t = mesh();
    let out = t.apply([node("node-7", "z2")]);
    assert_eq!(t.recomputed(), Recomputed { workloads: 100, services: 0, policies: 0, waypoints: 0 });
    assert_eq!(out.addresses.len(), 100);
    for (_, a) in &out.addresses {
        let Some(address::Type::Workload(w)) = a.as_ref().and_then(|a| a.r#type.as_ref()) else {
            panic!("workload")
        };
        assert_eq!(w.node, "node-7");
        assert_eq!(w.locality.as_ref().map(|l| l.zone.as_str()), Some("z2"));
    }
}

#[test]
fn policies_recompute_what_they_select() {
    let mut t = mesh();
    // A namespace-wide policy: no workload lists it.
    let out = t.apply([obj(json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "allow-ns", "namespace": "ns-1"}, "spec": {"rules": [{}]}}))]);
    assert_eq!(t.recomputed(), Recomputed { workloads: 0, services: 0, policies: 1, waypoints: 0 });
    assert_eq!(out.authorizations.len(), 1);
    assert!(out.addresses.is_empty());
    // A selector policy: its namespace's workloads.
    t.apply([obj(json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "sel", "namespace": "ns-1"}, "spec": {"selector": {"matchLabels": {"app": "web"}}}}))]);
    assert_eq!(t.recomputed(), Recomputed { workloads: 100, services: 0, policies: 1, waypoints: 0 });
    // A PeerAuthentication in a namespace: static policy, that namespace's PAs and workloads.
    let out = t.apply([obj(json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
        "metadata": {"name": "strict", "namespace": "ns-2"}, "spec": {"mtls": {"mode": "STRICT"}}}))]);
    // Policies: the converted policy of the one PA of ns-2, and the static one.
    assert_eq!(t.recomputed(), Recomputed { workloads: 100, services: 0, policies: 2, waypoints: 0 });
    assert_eq!(out.addresses.len(), 100, "ns-2's workloads list the static policy");
    assert_eq!(out.authorizations.len(), 1, "the static policy");
    // Mesh-wide (root namespace): every workload.
    t.apply([obj(json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": "istio-system"}, "spec": {"mtls": {"mode": "STRICT"}}}))]);
    assert_eq!(t.recomputed().workloads, 1000);
}

#[test]
fn queries_follow_istiod_lookup() {
    // control-plane.md §8 row 28's state: a pod at 127.0.0.1 on another node.
    let mut t = Translator::new(Settings::default());
    t.apply([
        pod("default", "pod", "127.0.0.1", "other", "web"),
        service("default", "web", "10.96.0.1", json!(8080)),
        obj(json!({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
            "metadata": {"name": "vm", "namespace": "default"}, "spec": {"address": "127.0.0.1"}})),
        obj(json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "cidr", "namespace": "default"},
            "spec": {"hosts": ["cidr.example.com"], "addresses": ["10.10.0.0/16"], "resolution": "STATIC"}})),
    ]);
    let pod = "Kubernetes//Pod/default/pod";
    let vm = "Kubernetes/networking.istio.io/WorkloadEntry/default/vm";
    let svc = "default/web.default.svc.cluster.local";
    assert_eq!(t.lookup(pod), [pod]);
    assert_eq!(t.lookup("/127.0.0.1"), [pod, vm], "every workload at that address");
    assert!(t.lookup("/127.0.0.2").is_empty());
    assert!(t.lookup("no-slash").is_empty());
    assert_eq!(t.lookup(svc), [svc, pod]);
    assert_eq!(t.lookup("/10.96.0.1"), [svc, pod], "by VIP: the service and its members");
    assert_eq!(t.aliases(pod), ["/127.0.0.1"]);
    assert_eq!(t.aliases(svc), ["/10.96.0.1"]);
    assert_eq!(t.aliases("default/cidr.example.com"), ["/10.10.0.0/16"]);
    assert_eq!(t.service_members(svc), [pod]);
    assert_eq!(t.node_of(pod), Some("other"));
    assert_eq!(t.node_of(vm), None);
}

#[test]
fn equal_translations_encode_to_equal_bytes() {
    // xDS versions are a hash of the encoded resource, so two control planes (or one after a
    // restart) must encode the same workload to the same bytes; a workload in several services
    // is where a hash map's iteration order would leak into the encoding.
    use prost::Message;
    let objects = || {
        let mut v = vec![pod("ns", "web", "10.0.0.1", "n", "web")];
        for i in 0..8 {
            v.push(service("ns", &format!("svc-{i}"), &format!("10.96.0.{i}"), json!(8080)));
        }
        v
    };
    let mut a = Translator::new(Settings::default());
    a.apply(objects());
    let mut b = Translator::new(Settings::default());
    b.apply(objects().into_iter().rev());
    let uid = "Kubernetes//Pod/ns/web";
    let bytes = |t: &Translator| t.address(uid).expect("published").encode_to_vec();
    assert_eq!(bytes(&a), bytes(&b));
}
