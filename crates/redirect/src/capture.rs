//! What to capture for one pod: [`PodCapture`] and its per-pod annotation overrides (§2.8.4).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::{PROBE_SNAT_V4, PROBE_SNAT_V6};

/// Annotation that turns on "ingress mode" (no inbound capture).
pub const ANNOTATION_BYPASS_INBOUND: &str = "ambient.istio.io/bypass-inbound-capture";
/// Annotation that overrides the global DNS capture setting for one pod.
pub const ANNOTATION_DNS_CAPTURE: &str = "ambient.istio.io/dns-capture";
/// Annotation listing interfaces whose inbound TCP is sent to the outbound port.
pub const ANNOTATION_VIRTUAL_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";

/// The capture settings of one pod; the input of every render function and backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCapture {
    /// Install IPv4 rules (iptables family v4; v4 address rules in nftables).
    pub ipv4: bool,
    /// Install IPv6 rules (ip6tables; v6 address rules in nftables; `::/0` route).
    pub ipv6: bool,
    /// Capture DNS (UDP and TCP port 53) to the DNS proxy.
    pub dns: bool,
    /// Ingress mode: leave inbound traffic uncaptured (bypass-inbound-capture).
    pub ingress_mode: bool,
    /// Interfaces whose inbound TCP is redirected to the outbound port, in annotation order.
    pub virtual_interfaces: Vec<String>,
    /// Probe SNAT address exempted from capture, IPv4.
    pub probe_snat_v4: Ipv4Addr,
    /// Probe SNAT address exempted from capture, IPv6.
    pub probe_snat_v6: Ipv6Addr,
}

impl Default for PodCapture {
    /// IPv4 only, DNS capture on, no overrides: the spec's "default" rule set.
    fn default() -> Self {
        PodCapture {
            ipv4: true,
            ipv6: false,
            dns: true,
            ingress_mode: false,
            virtual_interfaces: Vec::new(),
            probe_snat_v4: PROBE_SNAT_V4,
            probe_snat_v6: PROBE_SNAT_V6,
        }
    }
}

impl PodCapture {
    /// Builds a pod's capture from its annotations, the global DNS setting and whether IPv6 is
    /// enabled; invalid values are logged as warnings and treated as absent (§2.8.4).
    pub fn from_annotations(annotations: &BTreeMap<String, String>, global_dns: bool, ipv6: bool) -> Self {
        let flag = |key: &str| {
            let value = annotations.get(key)?;
            let parsed = parse_go_bool(value);
            if parsed.is_none() {
                tracing::warn!(annotation = key, value, "invalid boolean annotation ignored");
            }
            parsed
        };
        let virtual_interfaces = annotations
            .get(ANNOTATION_VIRTUAL_INTERFACES)
            .map(|list| {
                list.split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .filter(|name| match check_interface_name(name) {
                        Ok(()) => true,
                        Err(reason) => {
                            tracing::warn!(
                                annotation = ANNOTATION_VIRTUAL_INTERFACES,
                                interface = name,
                                reason,
                                "invalid interface name ignored"
                            );
                            false
                        }
                    })
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        PodCapture {
            ipv4: true,
            ipv6,
            dns: flag(ANNOTATION_DNS_CAPTURE).unwrap_or(global_dns),
            ingress_mode: flag(ANNOTATION_BYPASS_INBOUND).unwrap_or(false),
            virtual_interfaces,
            ..PodCapture::default()
        }
    }
}

/// Go `strconv.ParseBool`: `1 t T TRUE true True` / `0 f F FALSE false False`, anything else `None`.
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Interface names end up inside rules (`-i NAME`, `iifname "NAME"`): accept only what Linux
/// accepts (1..=15 bytes, no `/`, `:` or whitespace) and nothing that could break the quoting.
pub(crate) fn check_interface_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 15 {
        return Err("interface names are 1 to 15 bytes long");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@' | b'+')) {
        return Err("only ASCII letters, digits and - _ . @ + are accepted");
    }
    Ok(())
}
