//! `ambit inspect waypoints`: what each waypoint serves, from its own `/debug/serving`: the Services and workloads bound to it with their addresses and protocols, the
//! policies of their requests, their endpoints, and under each its routes with their weighted
//! backends. Targets: the local cluster's waypoint pods, or one waypoint's admin address
//! (`--admin http://HOST:15000`).

use std::net::SocketAddr;

use ambit_cluster::up::Layout;
use serde::Serialize;
use serde_json::Value;

use super::render::{Row, dash};
use super::{InspectArgs, Target};

/// One destination a waypoint holds.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Served {
    waypoint: String,
    destination: String,
    kind: String,
    listeners: Vec<String>,
    policies: Vec<String>,
    endpoints: String,
    routes: Vec<String>,
}

impl Row for Served {
    fn header() -> &'static [&'static str] {
        &["WAYPOINT", "DESTINATION", "KIND", "LISTENERS", "POLICIES", "ENDPOINTS"]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.waypoint.clone(),
            self.destination.clone(),
            self.kind.clone(),
            dash(self.listeners.join(",")),
            dash(self.policies.join(",")),
            self.endpoints.clone(),
        ]
    }

    fn details(&self) -> Vec<String> {
        self.routes.clone()
    }
}

/// The local cluster's waypoint pods (on `--node` when given), or the `--admin` address.
pub fn targets(args: &InspectArgs) -> Result<Vec<Target>, String> {
    if let Some(url) = &args.admin {
        return Ok(vec![Target { node: url.clone(), netns: None, admin: super::address(url)? }]);
    }
    let (at, state) = super::live_cluster(args, "a waypoint")?;
    let layout = Layout(at.run_dir.clone());
    let mut out = Vec::new();
    for w in crate::status::waypoints::gather(&state, &layout, false) {
        let Some(pod) = state.pods.iter().find(|p| format!("{}/{}", p.namespace, p.name) == w.pod) else {
            continue;
        };
        if args.node.as_ref().is_some_and(|n| *n != pod.node) {
            continue;
        }
        out.push(Target {
            node: format!("{} ({})", w.gateway, w.pod),
            netns: Some(pod.netns.clone()),
            admin: SocketAddr::from(([127, 0, 0, 1], 15000)),
        });
    }
    Ok(out)
}

/// The rows of each waypoint's `/debug/serving`: bound destinations first, then those it only
/// sends to.
pub fn served(dumps: &[(String, Value)], ns: Option<&str>) -> Result<Vec<Served>, String> {
    let mut out = Vec::new();
    for (waypoint, serving) in dumps {
        let Some(serving) = serving.as_array() else {
            return Err(format!(
                "{waypoint}: /debug/serving is not a list of destinations: is it a waypoint?"
            ));
        };
        let mut rows: Vec<(bool, Served)> = Vec::new();
        for s in serving {
            let name = s["name"].as_str().unwrap_or_default();
            if ns.is_some_and(|ns| name.split('/').next() != Some(ns)) {
                continue;
            }
            let strings = |v: &Value| -> Vec<String> {
                v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)).collect()
            };
            let endpoints = s["endpoints"].as_array().map(Vec::as_slice).unwrap_or_default();
            let healthy = endpoints.iter().filter(|e| e["healthy"] == true).count();
            let routes = s["routes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    let backends: Vec<String> = r["backends"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|b| format!("{} ({})", short(b[0].as_str().unwrap_or_default()), b[1]))
                        .collect();
                    format!("route {}: {}", r["name"].as_str().unwrap_or_default(), backends.join(", "))
                })
                .collect();
            let bound = s["bound"] == true;
            let kind = s["kind"].as_str().unwrap_or_default();
            rows.push((
                bound,
                Served {
                    waypoint: waypoint.clone(),
                    destination: name.to_owned(),
                    kind: if bound { kind.to_owned() } else { format!("{kind} (backend)") },
                    listeners: strings(&s["listeners"]),
                    policies: strings(&s["policies"]),
                    endpoints: format!("{healthy}/{} healthy", endpoints.len()),
                    routes,
                },
            ));
        }
        rows.sort_by_key(|(bound, r)| (!*bound, r.destination.clone()));
        out.extend(rows.into_iter().map(|(_, r)| r));
    }
    Ok(out)
}

/// A destination resource name's last part (a Service's hostname, a workload's name), without
/// the waypoint's own scope.
fn short(resource: &str) -> &str {
    resource.rsplit('/').next().unwrap_or(resource)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_waypoints_dump_becomes_one_row_per_destination_with_its_routes_under_it() {
        let dump = json!([
            {"resource": "shop/waypoint/reviews-v1", "kind": "service", "name": "shop/reviews-v1", "bound": false,
             "listeners": ["10.96.0.12:8080/http"], "routes": [], "policies": [],
             "endpoints": [{"address": "10.244.1.4", "healthy": true, "identity": "spiffe://x"}]},
            {"resource": "shop/waypoint/reviews", "kind": "service", "name": "shop/reviews", "bound": true,
             "listeners": ["10.96.0.11:8080/http"],
             "routes": [{"name": "shop/reviews#2", "backends": [["shop/waypoint/reviews-v1:8080", 90], ["shop/waypoint/reviews-v2:8080", 10]]}],
             "policies": ["shop/no-mallory"],
             "endpoints": [{"address": "10.244.1.4", "healthy": true}, {"address": "10.244.1.5", "healthy": false}]},
        ]);
        let rows = served(&[("shop/waypoint (shop/waypoint-0)".into(), dump)], None).expect("rows");
        assert_eq!(
            super::super::render::table(&rows),
            "WAYPOINT                         DESTINATION      KIND               LISTENERS             POLICIES         ENDPOINTS\n\
             shop/waypoint (shop/waypoint-0)  shop/reviews     service            10.96.0.11:8080/http  shop/no-mallory  1/2 healthy\n    \
             route shop/reviews#2: reviews-v1:8080 (90), reviews-v2:8080 (10)\n\
             shop/waypoint (shop/waypoint-0)  shop/reviews-v1  service (backend)  10.96.0.12:8080/http  -                1/1 healthy\n"
        );
        assert_eq!(
            served(&[("other".into(), json!({"services": []}))], None).err().as_deref(),
            Some("other: /debug/serving is not a list of destinations: is it a waypoint?")
        );
        assert!(served(&[("w".into(), json!([]))], Some("shop")).is_ok_and(|r| r.is_empty()));
    }
}
