//! Names, keys and label conventions (`control-plane.md` §1), and small parsers shared by the
//! translation modules.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ambit_objects::ObjectMeta;

/// A namespaced object's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Name {
    pub ns: String,
    pub name: String,
}

impl Name {
    pub(crate) fn new(ns: impl Into<String>, name: impl Into<String>) -> Name {
        Name { ns: ns.into(), name: name.into() }
    }

    /// Of an object's metadata (empty strings when absent; sources refuse those).
    pub(crate) fn of(meta: &ObjectMeta) -> Name {
        Name::new(meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ns, self.name)
    }
}

pub(crate) type Labels = BTreeMap<String, String>;

/// An empty map to borrow when an object has no labels or annotations.
pub(crate) static EMPTY: Labels = BTreeMap::new();

pub(crate) fn labels(meta: &ObjectMeta) -> &Labels {
    meta.labels.as_ref().unwrap_or(&EMPTY)
}

pub(crate) fn annotations(meta: &ObjectMeta) -> &Labels {
    meta.annotations.as_ref().unwrap_or(&EMPTY)
}

// Label and annotation names (istio/api).
pub(crate) const NETWORK_LABEL: &str = "topology.istio.io/network";
pub(crate) const REVISION_LABEL: &str = "istio.io/rev";
pub(crate) const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";
pub(crate) const TUNNEL_LABEL: &str = "networking.istio.io/tunnel";
pub(crate) const USE_WAYPOINT: &str = "istio.io/use-waypoint";
pub(crate) const USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
pub(crate) const USE_WAYPOINT_CANARY: &str = "istio.io/use-waypoint-canary";
pub(crate) const USE_WAYPOINT_CANARY_NAMESPACE: &str = "istio.io/use-waypoint-canary-namespace";
pub(crate) const CANARY_WEIGHT_ANNOTATION: &str = "istio.io/use-waypoint-canary-weight";
pub(crate) const INGRESS_USE_WAYPOINT: &str = "istio.io/ingress-use-waypoint";
pub(crate) const WAYPOINT_FOR: &str = "istio.io/waypoint-for";
pub(crate) use ambit_objects::waypoint::GATEWAY_NAME_LABEL;
pub(crate) const INBOUND_BINDING_ANNOTATION: &str = "ambient.istio.io/waypoint-inbound-binding";
pub(crate) const MANAGED_LABEL: &str = "gateway.istio.io/managed";
pub(crate) const TRAFFIC_DISTRIBUTION_ANNOTATION: &str = "networking.istio.io/traffic-distribution";
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub(crate) const METADATA_NAME_LABEL: &str = "kubernetes.io/metadata.name";
pub(crate) const AUTOALLOCATE_LABEL: &str = "networking.istio.io/enable-autoallocate-ip";
pub(crate) const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";
pub(crate) const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";
pub(crate) const AUTO_REGISTRATION_ANNOTATION: &str = "istio.io/autoRegistrationGroup";
pub(crate) const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub(crate) const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub(crate) const SUBZONE_LABEL: &str = "topology.istio.io/subzone";

/// Name of the static STRICT policy (§1.4), in the root namespace.
pub(crate) const STATIC_STRICT: &str = "istio_converted_static_strict";

/// `<cluster>//Pod/<ns>/<name>` (§1.1).
pub(crate) fn pod_uid(cluster: &str, n: &Name) -> String {
    format!("{cluster}//Pod/{}/{}", n.ns, n.name)
}

/// `<cluster>/networking.istio.io/WorkloadEntry/<ns>/<name>`.
pub(crate) fn workload_entry_uid(cluster: &str, n: &Name) -> String {
    format!("{cluster}/networking.istio.io/WorkloadEntry/{}/{}", n.ns, n.name)
}

/// `<cluster>/networking.istio.io/ServiceEntry/<ns>/<se>/<endpoint address or host>`.
pub(crate) fn service_entry_uid(cluster: &str, n: &Name, item: &str) -> String {
    format!("{cluster}/networking.istio.io/ServiceEntry/{}/{}/{item}", n.ns, n.name)
}

/// `<cluster>/discovery.k8s.io/EndpointSlice/<ns>/<slice>/<first address>`.
pub(crate) fn endpoint_slice_uid(cluster: &str, n: &Name, first: &str) -> String {
    format!("{cluster}/discovery.k8s.io/EndpointSlice/{}/{}/{first}", n.ns, n.name)
}

/// Service key `<ns>/<hostname>` (§1.2): xDS name and `Workload.services` key.
pub(crate) fn service_key(ns: &str, hostname: &str) -> String {
    format!("{ns}/{hostname}")
}

/// Hostname of a Kubernetes Service.
pub(crate) fn service_hostname(n: &Name, domain_suffix: &str) -> String {
    format!("{}.{}.svc.{domain_suffix}", n.name, n.ns)
}

/// `<network>/<ip>` (§1.3); an empty network renders as a leading slash.
pub(crate) fn network_ip(network: &str, ip: IpAddr) -> String {
    format!("{network}/{ip}")
}

/// An IP from its 4 or 16 wire bytes.
pub(crate) fn ip_of_bytes(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => <[u8; 4]>::try_from(b).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(b).ok().map(IpAddr::from),
        _ => None,
    }
}

/// The wire bytes of an IP.
pub(crate) fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// Go's `strconv.ParseBool` (istiod parses labels and annotations with it).
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Whether every `selector` pair is in `labels` (an empty selector matches everything).
pub(crate) fn subset(selector: &Labels, labels: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Whether the comma list in the tunnel label names `http` (§2.2 `native_tunnel`).
pub(crate) fn native_tunnel(labels: &Labels) -> bool {
    labels.get(TUNNEL_LABEL).is_some_and(|v| v.split(',').any(|t| t.trim() == "http"))
}

/// Kubernetes label-selector matching (`matchLabels` and `matchExpressions`).
pub(crate) fn selector_matches(sel: &ambit_objects::LabelSelector, labels: &Labels) -> bool {
    if let Some(ml) = &sel.match_labels
        && !subset(ml, labels)
    {
        return false;
    }
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default();
        let v = labels.get(&e.key);
        let ok = match e.operator.as_str() {
            "In" => v.is_some_and(|v| values.contains(v)),
            "NotIn" => v.is_none_or(|v| !values.contains(v)),
            "Exists" => v.is_some(),
            "DoesNotExist" => v.is_none(),
            // An operator Kubernetes does not know selects nothing (the API server refuses it).
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_and_keys() {
        let n = Name::new("default", "web-0");
        assert_eq!(pod_uid("Kubernetes", &n), "Kubernetes//Pod/default/web-0");
        assert_eq!(workload_entry_uid("c", &n), "c/networking.istio.io/WorkloadEntry/default/web-0");
        assert_eq!(service_hostname(&Name::new("ns", "svc"), "cluster.local"), "svc.ns.svc.cluster.local");
        assert_eq!(network_ip("", "10.0.0.1".parse().expect("ip")), "/10.0.0.1");
    }

    #[test]
    fn go_bools_and_tunnel_lists() {
        assert_eq!(parse_bool("True"), Some(true));
        assert_eq!(parse_bool("yes"), None);
        let mut l = Labels::new();
        l.insert(TUNNEL_LABEL.into(), "h2, http".into());
        assert!(native_tunnel(&l));
        l.insert(TUNNEL_LABEL.into(), "https".into());
        assert!(!native_tunnel(&l));
    }
}
