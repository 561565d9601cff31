//! `ambit status`'s waypoints: each `istio-waypoint` Gateway of the desired objects, the pod
//! `ambit up` runs for it, and what that pod says of itself: readiness (15021), the resources
//! it holds (`/config_dump` on 15000) and what it counted (`/metrics` on 15020).

use std::collections::BTreeMap;

use ambit_cluster::desired::Desired;
use ambit_cluster::desired::waypoints::{READINESS, WAYPOINT_CLASS};
use ambit_cluster::probe;
use ambit_cluster::state::ClusterState;
use ambit_cluster::up::Layout;
use ambit_objects::Kind;
use serde::Serialize;
use serde_json::Value;

/// One waypoint.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaypointReport {
    /// The Gateway, `namespace/name`.
    pub gateway: String,
    /// Where node proxies reach it (the Gateway's status address).
    pub address: String,
    /// Its pod, `namespace/name`, and node ("" when it has none yet).
    pub pod: String,
    /// The pod's node.
    pub node: String,
    /// `/healthz/ready` answered 200.
    pub ready: bool,
    /// Destinations and policies it holds from the control plane.
    pub destinations: usize,
    /// AuthorizationPolicies it holds.
    pub policies: usize,
    /// Requests it answered, by response code.
    pub requests: BTreeMap<String, u64>,
    /// Requests it denied, by deciding policy.
    pub denials: BTreeMap<String, u64>,
}

/// The waypoints of the cluster.
pub fn gather(state: &ClusterState, layout: &Layout, alive: bool) -> Vec<WaypointReport> {
    let nodes: Vec<String> = state.network.nodes.iter().map(|n| n.name.clone()).collect();
    let Ok(d) = Desired::load(&layout.desired(), &nodes) else { return Vec::new() };
    let mut out = Vec::new();
    for g in d.passed.iter().filter(|p| p.kind == Kind::Gateway) {
        if g.value.pointer("/spec/gatewayClassName").and_then(Value::as_str) != Some(WAYPOINT_CLASS) {
            continue;
        }
        let pod = state.pods.iter().find(|p| p.namespace == g.namespace && p.name == format!("{}-0", g.name));
        let mut w = WaypointReport {
            gateway: format!("{}/{}", g.namespace, g.name),
            address: g
                .value
                .pointer("/status/addresses/0/value")
                .and_then(Value::as_str)
                .unwrap_or("-")
                .to_owned(),
            pod: pod.map(|p| format!("{}/{}", p.namespace, p.name)).unwrap_or_default(),
            node: pod.map(|p| p.node.clone()).unwrap_or_default(),
            ready: false,
            destinations: 0,
            policies: 0,
            requests: BTreeMap::new(),
            denials: BTreeMap::new(),
        };
        if let Some(p) = pod.filter(|_| alive) {
            w.ready = probe::ready(&p.netns, READINESS.0, READINESS.1);
            if let Ok((200, body)) = probe::http_get(&p.netns, 15000, "/config_dump") {
                let dump: Value = serde_json::from_str(&body).unwrap_or_default();
                let count = |k: &str| dump["resources"][k].as_object().map_or(0, serde_json::Map::len);
                (w.destinations, w.policies) = (count("destinations"), count("policies"));
            }
            if let Ok((200, body)) = probe::http_get(&p.netns, 15020, "/metrics") {
                for l in body.lines() {
                    let value =
                        || l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or_default();
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    if l.starts_with("istio_requests_total{") {
                        *w.requests.entry(probe::label(l, "response_code")).or_default() += value() as u64;
                    } else if l.starts_with("ambit_waypoint_denials_total{") {
                        *w.denials.entry(probe::label(l, "policy")).or_default() += value() as u64;
                    }
                }
            }
        }
        out.push(w);
    }
    out
}

/// The WAYPOINTS section.
pub fn render(waypoints: &[WaypointReport]) -> String {
    let mut out = String::from("\nWAYPOINTS\n");
    for w in waypoints {
        let at =
            if w.pod.is_empty() { "no pod yet".to_owned() } else { format!("pod {} on {}", w.pod, w.node) };
        let ready = if w.ready { "ready" } else { "not ready" };
        out += &format!("  Gateway {}  {at}  {ready}  at {}\n", w.gateway, w.address);
        let answered: Vec<String> = w.requests.iter().map(|(code, n)| format!("{code}: {n}")).collect();
        let answered = if answered.is_empty() { "none".to_owned() } else { answered.join(", ") };
        out += &format!(
            "      holds {} destination(s), {} policy(ies); requests answered {answered}\n",
            w.destinations, w.policies
        );
        if !w.denials.is_empty() {
            let denied: Vec<String> = w.denials.iter().map(|(p, n)| format!("{p}: {n}")).collect();
            out += &format!("      denied by {}\n", denied.join(", "));
        }
    }
    if waypoints.is_empty() {
        out += "  (none: a Gateway of class istio-waypoint makes one)\n";
    }
    out
}
