//! Incremental translation equals translation from scratch: random batches of upserts and
//! deletes over a small vocabulary of interdependent objects (pods, services, slices, entries,
//! policies, waypoints, routes, reference grants, namespaces, nodes); after each batch the published state must equal a
//! fresh translator's over the same objects, and the `Output`s applied in order must rebuild it.

use std::collections::BTreeMap;

use ambit_api::security::Authorization;
use ambit_api::waypoint::{Destination, Policy};
use ambit_api::workload::Address;
use ambit_control::translate::{Settings, Translator};
use ambit_objects::{Change, Object, ObjectKey};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Picks from `options` by successive bits of a seed.
struct Bits(u64);

impl Bits {
    fn pick<'a, T>(&mut self, options: &'a [T]) -> &'a T {
        let i = (self.0 % options.len() as u64) as usize;
        self.0 /= options.len() as u64;
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        &options[i]
    }
    fn flag(&mut self) -> bool {
        *self.pick(&[false, true])
    }
}

const NAMESPACES: &[&str] = &["a", "b"];

fn object(kind: u8, name: u8, seed: u64) -> Value {
    let mut r = Bits(seed);
    let ns = *r.pick(NAMESPACES);
    let name = format!("o{}", name % 3);
    let app = *r.pick(&["x", "y"]);
    match kind % 13 {
        0 => {
            let mut labels = serde_json::Map::new();
            if r.flag() {
                labels.insert("istio.io/use-waypoint".into(), json!(*r.pick(&["o0", "none", "o1"])));
            }
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels,
                "annotations": {"networking.istio.io/traffic-distribution": *r.pick(&["PreferClose", "x"])}}})
        }
        1 => json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("n{}", name.len() % 2),
            "labels": {"topology.kubernetes.io/zone": *r.pick(&["z1", "z2"])}}}),
        2 => {
            let mut labels = serde_json::Map::new();
            labels.insert("app".into(), json!(app));
            if r.flag() {
                labels.insert("istio.io/use-waypoint".into(), json!(*r.pick(&["o0", "o1"])));
            }
            if r.flag() {
                labels.insert("gateway.networking.k8s.io/gateway-name".into(), json!("o0"));
            }
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {"nodeName": *r.pick(&["n0", "n1"]),
                    "containers": [{"name": "c", "ports": [{"name": "web", "containerPort": *r.pick(&[8080, 9090])}]}]},
                "status": {"phase": *r.pick(&["Running", "Pending", "Succeeded"]), "podIP": *r.pick(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
                    "conditions": [{"type": "Ready", "status": *r.pick(&["True", "False"])}]}})
        }
        3 => {
            let selector = if r.flag() { json!({"app": app}) } else { json!({}) };
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns,
                    "labels": if r.flag() { json!({"istio.io/use-waypoint": "o0"}) } else { json!({}) }},
                "spec": {"clusterIP": *r.pick(&["10.96.0.1", "10.96.0.2"]), "selector": selector,
                    "ports": [{"name": "web", "port": 80, "targetPort": r.pick(&[json!(8080), json!("web")]).clone()}]}})
        }
        4 => json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": *r.pick(&["o0", "o1"])}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": [*r.pick(&["10.0.0.1", "10.0.0.9"])], "targetRef": {"kind": "Pod", "name": *r.pick(&["o0", "o1"])}},
                {"addresses": [*r.pick(&["10.0.1.1", "10.0.1.2"])]}],
            "ports": [{"name": "web", "port": 80}]}),
        5 => {
            let mut spec = json!({"hosts": [*r.pick(&["h1.example.com", "o0.a.svc.cluster.local", "h2.example.com"])],
                "resolution": *r.pick(&["STATIC", "DNS"]), "ports": [{"number": 80, "name": "web"}]});
            if r.flag() {
                spec["workloadSelector"] = json!({"labels": {"app": app}});
            } else if r.flag() {
                spec["endpoints"] =
                    json!([{"address": "10.1.0.1", "labels": {"istio.io/use-waypoint": "o0"}}]);
            }
            if r.flag() {
                spec["addresses"] = json!(["240.0.0.1"]);
            }
            json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
                "metadata": {"name": name, "namespace": ns,
                    "creationTimestamp": *r.pick(&["2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z"])}, "spec": spec})
        }
        6 => json!({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
            "metadata": {"name": name, "namespace": ns}, "spec": {"address": *r.pick(&["10.2.0.1", "vm.example.com"]),
            "labels": {"app": app}, "ports": {"web": 7070}}}),
        7 => {
            let ns = *r.pick(&["a", "istio-system"]);
            let mut spec = json!({"action": *r.pick(&["ALLOW", "DENY"]), "rules": [{"to": [{"operation": {"ports": ["80"]}}]}]});
            if r.flag() {
                spec["selector"] = json!({"matchLabels": {"app": app}});
            } else if r.flag() {
                spec["targetRefs"] = json!([*r.pick(&[
                    json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "o0"}),
                    json!({"group": "", "kind": "Service", "name": "o1"}),
                ])]);
            }
            json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
                "metadata": {"name": name, "namespace": ns}, "spec": spec})
        }
        8 => {
            let ns = *r.pick(&["a", "b", "istio-system"]);
            let mut spec = json!({"mtls": {"mode": *r.pick(&["STRICT", "PERMISSIVE", "UNSET", "DISABLE"])}});
            if r.flag() {
                spec["selector"] = json!({"matchLabels": {"app": app}});
                spec["portLevelMtls"] = json!({"9090": {"mode": *r.pick(&["STRICT", "DISABLE"])}});
            }
            json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
                "metadata": {"name": name, "namespace": ns,
                    "creationTimestamp": *r.pick(&["2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z"])}, "spec": spec})
        }
        9 => {
            let status = if r.flag() {
                json!({"addresses": [{"type": "Hostname", "value": format!("{name}.{ns}.svc")}]})
            } else {
                json!({})
            };
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": name, "namespace": ns,
                    "labels": {"istio.io/waypoint-for": *r.pick(&["all", "service", "workload"])}},
                "spec": {"gatewayClassName": "istio-waypoint", "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE",
                    "allowedRoutes": {"namespaces": {"from": *r.pick(&["All", "Same"])}}}]},
                "status": status})
        }
        11 => {
            let parent = r
                .pick(&[json!({"group": "", "kind": "Service", "name": "o0"}), json!({"name": "o0"})])
                .clone();
            let backend = r
                .pick(&[
                    json!({"name": "o1", "port": 80}),
                    json!({"name": "o0", "namespace": "b", "port": 80}),
                    json!({"name": "o2", "port": 80}),
                ])
                .clone();
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": name, "namespace": ns,
                    "creationTimestamp": *r.pick(&["2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z"])},
                "spec": {"parentRefs": [parent], "rules": [{
                    "matches": [{"path": {"type": *r.pick(&["PathPrefix", "Exact"]), "value": *r.pick(&["/a", "/ab"])}}],
                    "backendRefs": [backend, {"name": "o0", "port": 80, "weight": 3}]}]}})
        }
        12 => json!({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": name, "namespace": "b"},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": *r.pick(&["a", "b"])}],
                "to": [{"group": "", "kind": "Service"}]}}),
        _ => json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": "istio-waypoint", "labels": {"istio.io/waypoint-for": *r.pick(&["all", "workload"])},
                "annotations": {"ambient.istio.io/waypoint-inbound-binding": *r.pick(&["PROXY", "NONE/15088"])}}}),
    }
}

type State = (
    BTreeMap<String, Address>,
    BTreeMap<String, Authorization>,
    BTreeMap<String, Destination>,
    BTreeMap<String, Policy>,
);

fn state(t: &Translator) -> State {
    (
        t.addresses().map(|(k, v)| (k.clone(), v.clone())).collect(),
        t.authorizations().map(|(k, v)| (k.clone(), v.clone())).collect(),
        t.destinations().map(|(k, v)| (k.clone(), v.clone())).collect(),
        t.waypoint_policies().map(|(k, v)| (k.clone(), v.clone())).collect(),
    )
}

fn system() -> Object {
    Object::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "istio-system", "labels": {"topology.istio.io/network": "net"}}}))
    .expect("namespace")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn incremental_equals_from_scratch(
        batches in prop::collection::vec(prop::collection::vec((0u8..13, 0u8..3, any::<u64>(), 0u8..4), 1..4), 1..16)
    ) {
        let settings = Settings::default();
        let mut t = Translator::new(settings.clone());
        let mut objects: BTreeMap<ObjectKey, Object> = BTreeMap::new();
        let sys = system();
        objects.insert(sys.key(), sys.clone());
        t.apply([Change::Upsert(sys)]);
        let mut replica: State = state(&t);
        for batch in batches {
            let mut changes = Vec::new();
            for (kind, name, seed, op) in batch {
                let o = Object::from_value(object(kind, name, seed)).expect("generated object");
                if op == 0 {
                    let key = o.key();
                    objects.remove(&key);
                    changes.push(Change::Delete(key));
                } else {
                    objects.insert(o.key(), o.clone());
                    changes.push(Change::Upsert(o));
                }
            }
            let out = t.apply(changes);
            for (name, a) in out.addresses {
                match a { Some(a) => { replica.0.insert(name, a); } None => { replica.0.remove(&name); } }
            }
            for (name, a) in out.authorizations {
                match a { Some(a) => { replica.1.insert(name, a); } None => { replica.1.remove(&name); } }
            }
            for (name, d) in out.destinations {
                match d { Some(d) => { replica.2.insert(name, d); } None => { replica.2.remove(&name); } }
            }
            for (name, p) in out.policies {
                match p { Some(p) => { replica.3.insert(name, p); } None => { replica.3.remove(&name); } }
            }
            prop_assert_eq!(
                &t.waypoint_errors(),
                &{
                    let mut fresh = Translator::new(settings.clone());
                    fresh.apply(objects.values().cloned().map(Change::Upsert));
                    fresh.waypoint_errors()
                },
                "incremental waypoint errors differ"
            );
            let mut fresh = Translator::new(settings.clone());
            fresh.apply(objects.values().cloned().map(Change::Upsert));
            let want = state(&fresh);
            prop_assert_eq!(&state(&t), &want, "incremental state differs from a fresh translation");
            prop_assert_eq!(&replica, &want, "the Outputs do not rebuild the state");
        }
    }
}
