//! Istio's gateway controller, for waypoints: each `Gateway` of class `istio-waypoint` gets a
//! Deployment, a Service and a ServiceAccount named after it in its namespace (as istiod's
//! deployment controller makes them), and the address node proxies reach it at
//! (`status.addresses`: the Service's hostname), so that the YAML a user gives Istio needs
//! nothing more here. The pod runs `ambit waypoint`; the cluster gives it the control plane's
//! address, roots and its node's token when it starts it ([`WAYPOINT_COMMAND`]).

use serde_json::{Value, json};

use super::{DEFAULT_NAMESPACE, Location};

pub use ambit_objects::waypoint::{GATEWAY_NAME_LABEL, READINESS, WAYPOINT_CLASS, WAYPOINT_COMMAND};
/// The domain the Service's hostname is in (`ambit control`'s default, istiod's).
pub const DOMAIN: &str = "cluster.local";

/// A waypoint Gateway found among the documents.
struct Found {
    namespace: String,
    name: String,
    at: Location,
}

fn waypoint_gateway(v: &Value) -> Option<(String, String)> {
    let api = v.get("apiVersion").and_then(Value::as_str)?;
    if !api.starts_with("gateway.networking.k8s.io/")
        || v.get("kind").and_then(Value::as_str) != Some("Gateway")
    {
        return None;
    }
    if v.pointer("/spec/gatewayClassName").and_then(Value::as_str) != Some(WAYPOINT_CLASS) {
        return None;
    }
    let name = v.pointer("/metadata/name").and_then(Value::as_str).filter(|n| !n.is_empty())?;
    let ns = v.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(DEFAULT_NAMESPACE);
    Some((ns.to_owned(), name.to_owned()))
}

/// Adds what istiod's gateway controller would make for each waypoint Gateway of `documents`,
/// and gives the Gateway its address unless it states one. A Deployment, Service or
/// ServiceAccount the user wrote under the same name is in the way: an error each, naming both.
pub(super) fn expand(documents: &mut Vec<(Value, Location)>) -> Vec<(Location, String)> {
    let mut found = Vec::new();
    for (v, at) in documents.iter_mut() {
        let Some((namespace, name)) = waypoint_gateway(v) else { continue };
        let has_address =
            v.pointer("/status/addresses").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        if !has_address && let Some(obj) = v.as_object_mut() {
            let status = obj.entry("status").or_insert_with(|| json!({}));
            if let Some(status) = status.as_object_mut() {
                status.insert(
                    "addresses".into(),
                    json!([{ "type": "Hostname", "value": format!("{name}.{namespace}.svc.{DOMAIN}") }]),
                );
            }
        }
        found.push(Found { namespace, name, at: at.clone() });
    }
    let mut problems = Vec::new();
    for (v, at) in documents.iter() {
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
        let api = v.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        if !matches!((api, kind), ("apps/v1", "Deployment") | ("v1", "Service") | ("v1", "ServiceAccount")) {
            continue;
        }
        let name = v.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let ns = v.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(DEFAULT_NAMESPACE);
        if let Some(w) = found.iter().find(|w| w.name == name && w.namespace == ns) {
            problems.push((
                at.clone(),
                format!(
                    "{kind} {ns}/{name} has the name of the waypoint Gateway at {}, whose Deployment, Service and ServiceAccount {ns}/{name} are made for it (as istiod makes them); rename this {kind}",
                    w.at
                ),
            ));
        }
    }
    if !problems.is_empty() {
        return problems;
    }
    for w in found {
        for doc in ambit_objects::waypoint::objects(&w.namespace, &w.name) {
            documents.push((doc, w.at.clone()));
        }
    }
    Vec::new()
}
