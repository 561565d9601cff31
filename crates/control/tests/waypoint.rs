//! The waypoints' own configuration beyond the goldens: what `/debug/policies` says about
//! targeted policies, the exact configuration errors, and which changes recompute a waypoint.

use ambit_control::translate::{Settings, Translator};
use ambit_objects::{Change, Kind, Object, ObjectKey};
use serde_json::{Value, json};

fn obj(v: Value) -> Change {
    Change::Upsert(Object::from_value(v).expect("object"))
}

fn waypoint(ns: &str, name: &str) -> Change {
    obj(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"gatewayClassName": "istio-waypoint", "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
        "status": {"addresses": [{"type": "Hostname", "value": format!("{name}.{ns}.svc.cluster.local")}]},
    }))
}

fn service(ns: &str, name: &str, ip: &str, waypoint: Option<&str>) -> Change {
    let labels = waypoint.map_or(json!({}), |w| json!({"istio.io/use-waypoint": w}));
    obj(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"clusterIP": ip, "selector": {"app": name}, "ports": [{"name": "http", "port": 80}]},
    }))
}

fn pod(ns: &str, name: &str, app: &str, ip: &str) -> Change {
    obj(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "status": {"phase": "Running", "podIP": ip},
    }))
}

fn policy(name: &str, targets: Value) -> Change {
    obj(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": "app"},
        "spec": {"targetRefs": targets, "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]},
    }))
}

fn mesh() -> Translator {
    let mut t = Translator::new(Settings::default());
    t.apply([
        waypoint("app", "wp"),
        service("app", "reviews", "10.0.0.1", Some("wp")),
        service("app", "plain", "10.0.0.2", None),
        pod("app", "reviews-0", "reviews", "1.2.3.4"),
        pod("app", "plain-0", "plain", "1.2.3.5"),
    ]);
    t
}

#[test]
fn a_policy_targeting_an_existing_waypoint_is_reported_as_enforced_there() {
    let mut t = mesh();
    t.apply([
        policy(
            "on-gateway",
            json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "wp"}]),
        ),
        policy("on-service", json!([{"group": "", "kind": "Service", "name": "reviews"}])),
    ]);
    let reports = t.policy_reports();
    for name in ["on-gateway", "on-service"] {
        let r = reports.iter().find(|r| r.name == name).expect("report");
        assert!(!r.enforced, "not by node proxies");
        assert_eq!(r.waypoints, ["app/wp"], "{name}");
        assert!(r.warnings.is_empty(), "{name}: {:?}", r.warnings);
    }
    // Node proxies get no Authorization for targeted policies, as from istiod.
    assert!(t.authorization("app/on-gateway").is_none());
    assert!(t.authorization("app/on-service").is_none());
}

#[test]
fn a_policy_whose_target_is_no_waypoints_still_warns() {
    let mut t = mesh();
    t.apply([
        policy(
            "no-gateway",
            json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gone"}]),
        ),
        policy("unbound", json!([{"group": "", "kind": "Service", "name": "plain"}])),
        policy("no-service", json!([{"group": "", "kind": "Service", "name": "missing"}])),
        policy(
            "mixed",
            json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "wp"},
                   {"group": "networking.istio.io", "kind": "ServiceEntry", "name": "se"}]),
        ),
    ]);
    let reports = t.policy_reports();
    let warnings = |name: &str| -> Vec<(Vec<String>, String)> {
        let r = reports.iter().find(|r| r.name == name).expect("report");
        r.warnings.iter().map(|w| (w.fields.clone(), w.message.clone())).collect()
    };
    assert_eq!(
        warnings("no-gateway"),
        [(
            vec!["targetRefs[0]".to_owned()],
            "Gateway app/gone does not exist: no waypoint enforces this policy for it".to_owned()
        )]
    );
    assert_eq!(
        warnings("unbound"),
        [(
            vec!["targetRefs[0]".to_owned()],
            "Service app/plain is not bound to a waypoint (label istio.io/use-waypoint): no waypoint enforces this policy for it"
                .to_owned()
        )]
    );
    assert_eq!(
        warnings("no-service")[0].1,
        "Service app/missing does not exist: no waypoint enforces this policy for it"
    );
    assert_eq!(
        warnings("mixed"),
        [(
            vec!["targetRefs[1]".to_owned()],
            "networking.istio.io/ServiceEntry app/se: waypoints take policies for Gateways and Services only: no waypoint enforces this policy for it"
                .to_owned()
        )]
    );
    let mixed = reports.iter().find(|r| r.name == "mixed").expect("report");
    assert_eq!(mixed.waypoints, ["app/wp"]);
}

#[test]
fn only_changes_a_waypoint_read_recompute_it() {
    let mut t = mesh();
    // A pod of an unbound Service: no waypoint.
    t.apply([pod("app", "plain-1", "plain", "1.2.3.6")]);
    assert_eq!(t.recomputed().waypoints, 0);
    // A new endpoint of the bound Service: its waypoint, and it shows as an endpoint.
    let out = t.apply([pod("app", "reviews-1", "reviews", "1.2.3.7")]);
    assert_eq!(t.recomputed().waypoints, 1);
    let name = "app/wp/app/reviews.app.svc.cluster.local";
    assert_eq!(out.destinations.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), [name]);
    assert_eq!(t.destination(name).map(|d| d.endpoints.len()), Some(2));
    // Its removal too.
    t.apply([Change::Delete(ObjectKey::new(Kind::Pod, "app", "reviews-1"))]);
    assert_eq!(t.recomputed().waypoints, 1);
    assert_eq!(t.destination(name).map(|d| d.endpoints.len()), Some(1));
    // The Gateway going away removes every resource of the waypoint.
    let out = t.apply([Change::Delete(ObjectKey::new(Kind::Gateway, "app", "wp"))]);
    assert_eq!(out.destinations, [(name.to_owned(), None)]);
    assert_eq!(t.destinations().count(), 0);
}

#[test]
fn configuration_errors_name_the_object_the_field_and_the_effect() {
    let mut t = mesh();
    t.apply([obj(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "app"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "reviews", "sectionName": "grpc"}],
            "rules": [{"backendRefs": [{"name": "reviews", "port": 80}]}],
        },
    }))]);
    let errors: Vec<String> = t.waypoint_errors().iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "HTTPRoute app/r: parentRefs[0]: Service app/reviews has no port named \"grpc\": the route is not applied to it (waypoint app/wp)"
        ]
    );
    t.apply([obj(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "app"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "reviews"}],
            "rules": [{"backendRefs": [{"name": "reviews"}, {"name": "plain", "port": 81}]}],
        },
    }))]);
    let errors: Vec<String> = t.waypoint_errors().iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        [
            "HTTPRoute app/r: rules[0].backendRefs[0]: a backend Service needs a port (app/reviews): its share of requests (weight 1) answers 500 (waypoint app/wp)",
            "HTTPRoute app/r: rules[0].backendRefs[1]: Service app/plain has no port 81: its share of requests (weight 1) answers 500 (waypoint app/wp)",
        ]
    );
}
