use ambit_objects::istio::{AuthorizationPolicy, PeerAuthentication};
use serde_json::json;

use super::*;

fn ap(spec: serde_json::Value) -> AuthorizationPolicy {
    serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "demo"}, "spec": spec}))
        .expect("a policy")
}

fn pa(ns: &str, spec: serde_json::Value) -> PeerAuthentication {
    serde_json::from_value(json!({"metadata": {"name": "default", "namespace": ns}, "spec": spec}))
        .expect("a policy")
}

const ROOT: &str = "istio-system";

#[test]
fn an_allow_with_only_l7_rules_warns_that_it_denies_all() {
    let r = authorization_policy(
        ROOT,
        &ap(json!({
            "selector": {"matchLabels": {"app": "server"}},
            "rules": [{"to": [{"operation": {"methods": ["GET"], "paths": ["/api/*"]}}]}]
        })),
    );
    assert!(r.enforced);
    assert_eq!(r.action, "ALLOW");
    assert_eq!(r.applies_to, "workloads with app=server in namespace demo");
    assert_eq!(
        r.rules,
        [
            "allows nothing (no rule): every connection it applies to is denied unless another ALLOW policy allows it"
        ]
    );
    assert_eq!(
        r.warnings,
        [Warning {
            fields: vec!["rules[0].to[0].operation.methods".into(), "rules[0].to[0].operation.paths".into()],
            message: "rules[0] dropped: node proxies cannot check methods, paths; this ALLOW policy now allows \
                      nothing, so it denies all traffic to workloads with app=server in namespace demo that no \
                      other ALLOW policy allows, until a waypoint enforces it"
                .into(),
        }]
    );
    assert_eq!(
        r.warning_lines(),
        [
            "AuthorizationPolicy demo/p: rules[0] dropped: node proxies cannot check methods, paths; this ALLOW \
          policy now allows nothing, so it denies all traffic to workloads with app=server in namespace demo \
          that no other ALLOW policy allows, until a waypoint enforces it"
        ]
    );
    assert_eq!(
        r.condition,
        Some(Accepted {
            status: true,
            reason: "UnsupportedValue".into(),
            message: "ztunnel does not support HTTP attributes (found: methods, paths). In ambient mode you must \
                      use a waypoint proxy to enforce HTTP rules. Within an ALLOW policy, rules matching HTTP \
                      attributes are omitted. This will be more restrictive than requested."
                .into(),
        })
    );
}

#[test]
fn an_allow_keeps_its_l4_rules_and_says_which_rules_were_dropped() {
    let r = authorization_policy(
        ROOT,
        &ap(json!({
            "rules": [
                {"from": [{"source": {"principals": ["cluster.local/ns/demo/sa/client"]}}]},
                {"to": [{"operation": {"ports": ["80"]}}], "when": [{"key": "request.headers[x-user]", "values": ["a"]}]}
            ]
        })),
    );
    assert_eq!(r.applies_to, "every workload in namespace demo");
    assert_eq!(r.rules, ["allows from principal cluster.local/ns/demo/sa/client"]);
    assert_eq!(r.warnings.len(), 1);
    assert_eq!(r.warnings[0].fields, ["rules[1].when[0] (request.headers[x-user])"]);
    assert_eq!(
        r.warnings[0].message,
        "rules[1] dropped: node proxies cannot check request.headers[x-user]; this ALLOW policy allows only \
         what its other rules allow until a waypoint enforces it"
    );
}

#[test]
fn a_deny_with_only_methods_warns_that_it_denies_every_method() {
    let r = authorization_policy(
        ROOT,
        &ap(json!({
            "action": "DENY",
            "selector": {"matchLabels": {"app": "server"}},
            "rules": [{"to": [{"operation": {"methods": ["DELETE"]}}]}]
        })),
    );
    assert_eq!(r.rules, ["denies all traffic"]);
    assert_eq!(
        r.warnings[0].message,
        "rules[0]: node proxies cannot check methods: DENY applied to all traffic to workloads with app=server \
         in namespace demo, whatever the method, until a waypoint enforces the policy"
    );
    assert_eq!(
        r.condition.expect("a condition").message,
        "ztunnel does not support HTTP attributes (found: methods). In ambient mode you must use a waypoint \
         proxy to enforce HTTP rules. DENY policy with HTTP attributes is enforced without the HTTP rules. This \
         will be more restrictive than requested."
    );
}

#[test]
fn a_deny_on_ports_with_paths_names_the_ports_it_still_denies() {
    let r = authorization_policy(
        ROOT,
        &ap(json!({
            "action": "DENY",
            "rules": [{"to": [{"operation": {"ports": ["8080"], "paths": ["/admin"]}}]}]
        })),
    );
    assert_eq!(r.rules, ["denies to port 8080"]);
    assert_eq!(
        r.warnings[0].message,
        "rules[0]: node proxies cannot check paths: DENY applied to all traffic to every workload in namespace \
         demo matching to port 8080, whatever the path, until a waypoint enforces the policy"
    );
}

#[test]
fn a_plain_l4_policy_is_accepted_without_warnings() {
    let r = authorization_policy(
        "demo",
        &ap(json!({
            "rules": [{"from": [{"source": {"namespaces": ["a", "b*"], "notIpBlocks": ["10.0.0.0/8"]}}],
                       "to": [{"operation": {"ports": ["80", "443"]}}]}]
        })),
    );
    assert_eq!(r.applies_to, "every workload in the mesh");
    assert_eq!(
        r.rules,
        ["allows to port 80 or 443, and from namespace a or b* and from address not 10.0.0.0/8"]
    );
    assert!(r.warnings.is_empty());
    assert_eq!(
        r.condition,
        Some(Accepted { status: true, reason: "Accepted".into(), message: "attached to ztunnel".into() })
    );
}

#[test]
fn bad_values_and_unknown_actions_are_reported() {
    let r = authorization_policy(
        ROOT,
        &ap(
            json!({"rules": [{"from": [{"source": {"ipBlocks": ["10.0.0.300"]}}], "to": [{"operation": {"ports": ["http"]}}]}]}),
        ),
    );
    let messages: Vec<&str> = r.warnings.iter().map(|w| w.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "rules[0].to[0].operation.ports[0] \"http\" is not a port number: the value is ignored",
            "rules[0].from[0].source.ipBlocks[0] \"10.0.0.300\" is not an IP address or CIDR: the value is ignored",
        ]
    );
    // From the Kubernetes API (which does not check the enum when Istio's CRDs are not
    // installed), an unknown action fails closed and says so.
    let r = authorization_policy(ROOT, &ap(json!({"action": "deny", "rules": [{}]})));
    assert_eq!(
        r.rules,
        [
            "allows nothing (no rule): every connection it applies to is denied unless another ALLOW policy allows it"
        ]
    );
    assert_eq!(
        r.warnings[0].message,
        "action \"deny\" is not ALLOW, DENY, AUDIT or CUSTOM: the policy denies all traffic to every workload in \
         namespace demo"
    );
}

#[test]
fn waypoint_only_policies_are_not_enforced_by_node_proxies() {
    let r = authorization_policy(ROOT, &ap(json!({"action": "AUDIT"})));
    assert!(!r.enforced);
    assert_eq!(
        r.warnings[0].message,
        "AUDIT policies are enforced by waypoints only: node proxies ignore this policy"
    );
    assert_eq!(
        r.condition,
        Some(Accepted {
            status: false,
            reason: "UnsupportedValue".into(),
            message: "ztunnel does not support the AUDIT action".into()
        })
    );
    let r = authorization_policy(
        ROOT,
        &ap(
            json!({"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "waypoint"}],
                   "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}),
        ),
    );
    assert!(!r.enforced);
    assert!(r.warnings.is_empty());
    assert_eq!(r.condition, None);
    assert_eq!(r.applies_to, "traffic through Gateway demo/waypoint (at its waypoint)");
}

#[test]
fn peer_authentications_in_words() {
    let r = peer_authentication(ROOT, &pa(ROOT, json!({"mtls": {"mode": "STRICT"}})));
    assert_eq!((r.action.as_str(), r.applies_to.as_str()), ("STRICT", "every workload in the mesh"));
    assert_eq!(r.rules, ["mTLS required: plaintext connections are refused"]);
    assert!(r.warnings.is_empty());
    let r = peer_authentication(
        ROOT,
        &pa("demo", json!({"mtls": {"mode": "strict"}, "portLevelMtls": {"8080": {"mode": "DISABLE"}}})),
    );
    let messages: Vec<&str> = r.warnings.iter().map(|w| w.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "mtls.mode \"strict\" is not UNSET, DISABLE, PERMISSIVE or STRICT: taken as STRICT (plaintext refused)",
            "portLevelMtls applies only with a selector (as in istiod): the port modes are ignored",
        ]
    );
}

#[test]
fn presence_matches_read_as_any_or_plaintext() {
    let m = |principals, not_principals| Authorization {
        action: Action::Deny as i32,
        rules: vec![Rule {
            clauses: vec![ambit_api::security::Clause {
                matches: vec![Match { principals, not_principals, ..Match::default() }],
            }],
        }],
        ..Authorization::default()
    };
    let present = || vec![StringMatch { match_type: Some(string_match::MatchType::Presence(())) }];
    assert_eq!(describe(&m(Vec::new(), present())), ["denies from no principal (plaintext)"]);
    assert_eq!(describe(&m(present(), Vec::new())), ["denies from any principal"]);
}

#[test]
fn derived_policies_name_their_origin() {
    assert_eq!(origin("demo/allow"), "demo/allow");
    assert_eq!(origin("istio-system/istio_converted_static_strict"), "STRICT mTLS (a PeerAuthentication)");
    assert_eq!(
        origin("demo/converted_peer_authentication_ports"),
        "PeerAuthentication demo/ports (port-level mTLS)"
    );
}
