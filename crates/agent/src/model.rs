//! The slice of Kubernetes Pod and Namespace objects the agent needs, taken from the typed
//! objects `ambit-objects` delivers (from the API or from YAML in local mode): one conversion for
//! both sources.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ambit_objects::k8s_openapi::api::core::v1 as k8s;

/// A pod, as the agent sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pod {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.generateName` (`<daemonset>-` for a DaemonSet's pods; empty when not generated).
    pub generate_name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// `spec.serviceAccountName` (`default` when empty).
    pub service_account: String,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `status.phase`.
    pub phase: Phase,
    /// `status.podIPs` (or `status.podIP`), unparsable entries dropped.
    pub ips: Vec<IpAddr>,
}

/// A pod's lifecycle phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// Accepted, not all containers running yet (also: phase missing).
    #[default]
    Pending,
    /// Bound and running.
    Running,
    /// All containers terminated successfully.
    Succeeded,
    /// All containers terminated, at least one failed.
    Failed,
    /// State unknown.
    Unknown,
}

impl Phase {
    /// Terminated pods need no capture.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// A namespace, as the agent sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespace {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
}

/// Why an object is not a usable Pod or Namespace.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A required field is empty.
    #[error("{kind} object has no {field}")]
    Missing {
        /// `Pod` or `Namespace`.
        kind: &'static str,
        /// The missing field.
        field: &'static str,
    },
}

impl Pod {
    /// The agent's view of a Pod object; it needs a uid, a name and a namespace.
    pub fn from_k8s(pod: &k8s::Pod) -> Result<Pod, ModelError> {
        let m = &pod.metadata;
        let required = |field: &'static str, v: &Option<String>| match v.as_deref() {
            Some(v) if !v.is_empty() => Ok(v.to_owned()),
            _ => Err(ModelError::Missing { kind: "Pod", field }),
        };
        let uid = required("metadata.uid", &m.uid)?;
        let name = required("metadata.name", &m.name)?;
        let namespace = required("metadata.namespace", &m.namespace)?;
        let (spec, status) = (pod.spec.as_ref(), pod.status.as_ref());
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| p.ip.parse().ok())
            .collect();
        if ips.is_empty()
            && let Some(ip) = status.and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ip.parse().ok())
        {
            ips.push(ip);
        }
        let phase = match status.and_then(|s| s.phase.as_deref()) {
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            Some("Unknown") => Phase::Unknown,
            _ => Phase::Pending,
        };
        Ok(Pod {
            uid,
            name,
            namespace,
            generate_name: m.generate_name.clone().unwrap_or_default(),
            labels: m.labels.clone().unwrap_or_default(),
            annotations: m.annotations.clone().unwrap_or_default(),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .filter(|sa| !sa.is_empty())
                .unwrap_or_else(|| "default".to_owned()),
            node_name: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            phase,
            ips,
        })
    }
}

impl Namespace {
    /// The agent's view of a Namespace object.
    pub fn from_k8s(ns: &k8s::Namespace) -> Result<Namespace, ModelError> {
        match ns.metadata.name.as_deref() {
            Some(name) if !name.is_empty() => Ok(Namespace {
                name: name.to_owned(),
                labels: ns.metadata.labels.clone().unwrap_or_default(),
            }),
            _ => Err(ModelError::Missing { kind: "Namespace", field: "metadata.name" }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn k8s_pod(v: serde_json::Value) -> k8s::Pod {
        serde_json::from_value(v).expect("a Pod object")
    }

    #[test]
    fn converts_a_pod() {
        let p = Pod::from_k8s(&k8s_pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"uid": "u-1", "name": "web-0", "namespace": "demo", "generateName": "web-",
                         "labels": {"app": "web"}, "annotations": {"a": "b"}},
            "spec": {"serviceAccountName": "web", "nodeName": "n1", "hostNetwork": true, "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}, {"ip": "garbage"}]}
        })))
        .expect("valid pod");
        assert_eq!(p.uid, "u-1");
        assert_eq!(p.generate_name, "web-");
        assert_eq!(p.service_account, "web");
        assert_eq!(p.node_name, "n1");
        assert_eq!(p.phase, Phase::Running);
        assert_eq!(p.ips.len(), 2, "unparsable entries dropped");
        assert!(p.host_network);
        assert_eq!(p.annotations.get("a").map(String::as_str), Some("b"));
    }

    #[test]
    fn defaults_and_errors() {
        let p = Pod::from_k8s(&k8s_pod(json!({"metadata": {"uid": "u", "name": "n", "namespace": "ns"},
            "status": {"podIP": "10.1.1.1"}})))
        .expect("minimal pod");
        assert_eq!(p.service_account, "default");
        assert_eq!(p.phase, Phase::Pending);
        assert_eq!(p.ips, vec!["10.1.1.1".parse::<IpAddr>().expect("ip")]);
        assert_eq!(
            Pod::from_k8s(&k8s_pod(json!({"metadata": {"name": "n", "namespace": "ns"}}))),
            Err(ModelError::Missing { kind: "Pod", field: "metadata.uid" })
        );
        let ns: k8s::Namespace =
            serde_json::from_value(json!({"metadata": {"labels": {"a": "b"}}})).expect("ns");
        assert_eq!(
            Namespace::from_k8s(&ns),
            Err(ModelError::Missing { kind: "Namespace", field: "metadata.name" })
        );
    }
}
