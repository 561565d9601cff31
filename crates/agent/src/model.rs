//! The slice of Kubernetes Pod and Namespace objects the agent needs, parsed from the API's
//! JSON (or the same objects as YAML in local mode). Unknown fields are ignored.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;

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
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Not valid JSON of the expected shape.
    #[error("not a valid {kind} object: {source}")]
    Decode {
        /// `Pod` or `Namespace`.
        kind: &'static str,
        /// The decoder's error.
        source: serde_json::Error,
    },
    /// A required field is empty.
    #[error("{kind} object has no {field}")]
    Missing {
        /// `Pod` or `Namespace`.
        kind: &'static str,
        /// The missing field.
        field: &'static str,
    },
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Meta {
    uid: String,
    name: String,
    namespace: String,
    generate_name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawPod {
    metadata: Meta,
    spec: RawSpec,
    status: RawStatus,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawSpec {
    host_network: bool,
    service_account_name: String,
    node_name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawStatus {
    phase: String,
    #[serde(rename = "podIP")]
    pod_ip: String,
    #[serde(rename = "podIPs")]
    pod_ips: Vec<RawIp>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawIp {
    ip: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawNamespace {
    metadata: Meta,
}

impl Pod {
    /// Parses a Pod object (JSON value, as from the API or converted from YAML).
    pub fn from_value(v: serde_json::Value) -> Result<Pod, ModelError> {
        let raw: RawPod =
            serde_json::from_value(v).map_err(|source| ModelError::Decode { kind: "Pod", source })?;
        for (field, value) in [
            ("metadata.uid", &raw.metadata.uid),
            ("metadata.name", &raw.metadata.name),
            ("metadata.namespace", &raw.metadata.namespace),
        ] {
            if value.is_empty() {
                return Err(ModelError::Missing { kind: "Pod", field });
            }
        }
        let mut ips: Vec<IpAddr> = raw.status.pod_ips.iter().filter_map(|p| p.ip.parse().ok()).collect();
        if ips.is_empty()
            && let Ok(ip) = raw.status.pod_ip.parse()
        {
            ips.push(ip);
        }
        let phase = match raw.status.phase.as_str() {
            "Running" => Phase::Running,
            "Succeeded" => Phase::Succeeded,
            "Failed" => Phase::Failed,
            "Unknown" => Phase::Unknown,
            _ => Phase::Pending,
        };
        Ok(Pod {
            uid: raw.metadata.uid,
            name: raw.metadata.name,
            namespace: raw.metadata.namespace,
            generate_name: raw.metadata.generate_name,
            labels: raw.metadata.labels,
            annotations: raw.metadata.annotations,
            host_network: raw.spec.host_network,
            service_account: if raw.spec.service_account_name.is_empty() {
                "default".to_owned()
            } else {
                raw.spec.service_account_name
            },
            node_name: raw.spec.node_name,
            phase,
            ips,
        })
    }
}

impl Namespace {
    /// Parses a Namespace object.
    pub fn from_value(v: serde_json::Value) -> Result<Namespace, ModelError> {
        let raw: RawNamespace =
            serde_json::from_value(v).map_err(|source| ModelError::Decode { kind: "Namespace", source })?;
        if raw.metadata.name.is_empty() {
            return Err(ModelError::Missing { kind: "Namespace", field: "metadata.name" });
        }
        Ok(Namespace { name: raw.metadata.name, labels: raw.metadata.labels })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_a_pod() {
        let p = Pod::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"uid": "u-1", "name": "web-0", "namespace": "demo", "generateName": "web-",
                         "labels": {"app": "web"}, "annotations": {"a": "b"}},
            "spec": {"serviceAccountName": "web", "nodeName": "n1", "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}, {"ip": "garbage"}]}
        }))
        .expect("valid pod");
        assert_eq!(p.uid, "u-1");
        assert_eq!(p.generate_name, "web-");
        assert_eq!(p.service_account, "web");
        assert_eq!(p.phase, Phase::Running);
        assert_eq!(p.ips.len(), 2);
        assert!(!p.host_network);
    }

    #[test]
    fn defaults_and_errors() {
        let p = Pod::from_value(json!({"metadata": {"uid": "u", "name": "n", "namespace": "ns"},
            "status": {"podIP": "10.1.1.1"}}))
        .expect("minimal pod");
        assert_eq!(p.service_account, "default");
        assert_eq!(p.phase, Phase::Pending);
        assert_eq!(p.ips, vec!["10.1.1.1".parse::<IpAddr>().expect("ip")]);
        assert!(matches!(
            Pod::from_value(json!({"metadata": {"name": "n", "namespace": "ns"}})),
            Err(ModelError::Missing { field: "metadata.uid", .. })
        ));
        assert!(Pod::from_value(json!("nope")).is_err());
        assert!(Namespace::from_value(json!({"metadata": {}})).is_err());
    }
}
