//! The CNI plugin → agent event (`POST /cmdadd` on `pluginevent.sock`), compatible with
//! istio-cni's: Go field names, the pod's IPs from the primary plugin's result.

use std::net::IpAddr;

use serde::Deserialize;

/// One pod ADD as reported by the plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginEvent {
    /// Path of the pod's network namespace (`CNI_NETNS`).
    pub netns: String,
    /// Pod name (`K8S_POD_NAME`).
    pub pod_name: String,
    /// Pod namespace (`K8S_POD_NAMESPACE`).
    pub pod_namespace: String,
    /// The pod's IPs from the primary plugin (v4-mapped addresses unmapped).
    pub ips: Vec<IpAddr>,
}

/// Why a request body is not a plugin event.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// Empty body.
    #[error("empty request body; expected the CNI plugin's JSON event")]
    Empty,
    /// Not the expected JSON.
    #[error("invalid CNI plugin event: {0}")]
    Json(#[from] serde_json::Error),
    /// A required field is missing.
    #[error("CNI plugin event has no {0}")]
    Missing(&'static str),
}

#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "Netns", default)]
    netns: String,
    #[serde(rename = "PodName", default)]
    pod_name: String,
    #[serde(rename = "PodNamespace", default)]
    pod_namespace: String,
    #[serde(rename = "IPs", default)]
    ips: Option<Vec<RawIp>>,
}

#[derive(Deserialize)]
struct RawIp {
    #[serde(rename = "Address")]
    address: RawNet,
}

#[derive(Deserialize)]
struct RawNet {
    #[serde(rename = "IP")]
    ip: String,
}

impl PluginEvent {
    /// Parses the request body.
    pub fn parse(body: &[u8]) -> Result<PluginEvent, EventError> {
        if body.is_empty() {
            return Err(EventError::Empty);
        }
        let raw: Raw = serde_json::from_slice(body)?;
        for (name, v) in
            [("Netns", &raw.netns), ("PodName", &raw.pod_name), ("PodNamespace", &raw.pod_namespace)]
        {
            if v.is_empty() {
                return Err(EventError::Missing(name));
            }
        }
        let ips = raw
            .ips
            .unwrap_or_default()
            .iter()
            .filter_map(|i| i.address.ip.parse::<IpAddr>().ok())
            .map(|ip| ip.to_canonical())
            .collect();
        Ok(PluginEvent { netns: raw.netns, pod_name: raw.pod_name, pod_namespace: raw.pod_namespace, ips })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example event of the spec (node-agent §1.5), as istio-cni sends it.
    #[test]
    fn istio_cni_event() {
        let body = br#"{"Netns":"/var/run/netns/cni-5f1c","PodName":"web-0","PodNamespace":"demo",
 "IPs":[{"Interface":0,"Address":{"IP":"10.244.1.5","Mask":"////AA=="},"Gateway":"10.244.1.1"}]}"#;
        let ev = PluginEvent::parse(body).expect("valid");
        assert_eq!(ev.netns, "/var/run/netns/cni-5f1c");
        assert_eq!(ev.pod_name, "web-0");
        assert_eq!(ev.pod_namespace, "demo");
        assert_eq!(ev.ips, vec!["10.244.1.5".parse::<IpAddr>().expect("ip")]);
    }

    #[test]
    fn null_ips_mapped_addresses_and_errors() {
        let ev =
            PluginEvent::parse(br#"{"Netns":"/x","PodName":"p","PodNamespace":"n","IPs":null}"#).expect("ok");
        assert!(ev.ips.is_empty());
        let ev = PluginEvent::parse(
            br#"{"Netns":"/x","PodName":"p","PodNamespace":"n","IPs":[{"Address":{"IP":"::ffff:10.0.0.1"}}]}"#,
        )
        .expect("ok");
        assert_eq!(ev.ips, vec!["10.0.0.1".parse::<IpAddr>().expect("ip")]);
        assert!(matches!(PluginEvent::parse(b""), Err(EventError::Empty)));
        assert!(matches!(PluginEvent::parse(b"{"), Err(EventError::Json(_))));
        assert!(matches!(
            PluginEvent::parse(br#"{"PodName":"p","PodNamespace":"n"}"#),
            Err(EventError::Missing("Netns"))
        ));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = PluginEvent::parse(&body);
        }
    }
}
