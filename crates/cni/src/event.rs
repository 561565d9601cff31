//! The plugin → agent ADD event: the JSON body of `POST /cmdadd` on the agent's event socket.
//!
//! The body is what Go's `encoding/json` makes of istio-cni's `CNIPluginAddEvent` (capitalised
//! field names, `net.IPNet` as `{"IP": text, "Mask": base64 bytes}`, a nil slice as `null`), so
//! either side can talk to istio-cni's counterpart:
//!
//! ```json
//! {"Netns":"/var/run/netns/cni-5f1c","PodName":"web-0","PodNamespace":"demo",
//!  "IPs":[{"Interface":0,"Address":{"IP":"10.244.1.5","Mask":"////AA=="},"Gateway":"10.244.1.1"}]}
//! ```
//!
//! Both directions are here: the plugin serializes, the node agent deserializes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// File name of the agent's plugin event socket inside its run directory.
pub const EVENT_SOCKET: &str = "pluginevent.sock";
/// HTTP path of the ADD event.
pub const EVENT_PATH: &str = "/cmdadd";

/// One CNI ADD, as sent to the node agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginEvent {
    /// `CNI_NETNS`, verbatim (a host path such as `/var/run/netns/cni-…`).
    #[serde(rename = "Netns")]
    pub netns: String,
    /// `K8S_POD_NAME`.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// `K8S_POD_NAMESPACE`.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// The pod's addresses from `prevResult.ips`; sent as `null` when empty (a Go nil slice).
    #[serde(rename = "IPs", with = "nil_slice", default)]
    pub ips: Vec<EventIp>,
}

/// One address of the pod, from a `prevResult.ips[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventIp {
    /// Index into `prevResult.interfaces`, when the primary plugin gave one.
    #[serde(rename = "Interface", default)]
    pub interface: Option<i64>,
    /// The address with its mask.
    #[serde(rename = "Address")]
    pub address: IpNet,
    /// The gateway; sent as `""` when absent (a Go nil `net.IP`).
    #[serde(rename = "Gateway", with = "go_ip", default)]
    pub gateway: Option<IpAddr>,
}

/// An address and its mask, shaped like Go's `net.IPNet`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpNet {
    /// The pod's address (not the network address).
    #[serde(rename = "IP", with = "go_ip_required")]
    pub ip: IpAddr,
    /// The raw mask bytes: 4 for IPv4, 16 for IPv6; base64 on the wire.
    #[serde(rename = "Mask", with = "go_bytes")]
    pub mask: Vec<u8>,
}

/// Why a CIDR string is not an address with a prefix length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an address in CIDR notation (like 10.244.1.5/24 or fd00::5/64)")]
pub struct CidrError(pub String);

impl PluginEvent {
    /// The JSON body, exactly as Go would encode it.
    pub fn to_json(&self) -> String {
        // Only strings, integers and byte vectors: serialization cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a request body.
    pub fn from_json(body: &[u8]) -> Result<PluginEvent, serde_json::Error> {
        serde_json::from_slice(body)
    }
}

impl IpNet {
    /// Parses `addr/prefix` the way Go's `net.ParseCIDR` does (keeping the host address).
    pub fn parse_cidr(s: &str) -> Result<IpNet, CidrError> {
        let err = || CidrError(s.to_owned());
        let (addr, prefix) = s.split_once('/').ok_or_else(err)?;
        if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let prefix: u8 = prefix.parse().map_err(|_| err())?;
        let ip: IpAddr = addr.parse().map_err(|_| err())?;
        let bits: u8 = if ip.is_ipv4() { 32 } else { 128 };
        if prefix > bits {
            return Err(err());
        }
        Ok(IpNet { ip, mask: mask_bytes(prefix, bits) })
    }

    /// The prefix length, when the mask is a contiguous run of ones.
    pub fn prefix_len(&self) -> Option<u8> {
        let ones: u32 = self.mask.iter().map(|b| b.count_ones()).sum();
        let canonical = mask_bytes(u8::try_from(ones).ok()?, u8::try_from(self.mask.len() * 8).ok()?);
        (canonical == self.mask).then_some(ones as u8)
    }
}

fn mask_bytes(prefix: u8, bits: u8) -> Vec<u8> {
    (0..bits / 8)
        .map(|i| {
            let ones = prefix.saturating_sub(i * 8).min(8);
            if ones == 0 { 0 } else { 0xffu8 << (8 - ones) }
        })
        .collect()
}

/// Go's `net.IP` text form: an IPv4-mapped IPv6 address prints as IPv4.
fn go_ip_text(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v6.to_string(),
        },
        IpAddr::V4(v4) => v4.to_string(),
    }
}

fn parse_go_ip<E: serde::de::Error>(s: &str) -> Result<IpAddr, E> {
    s.parse::<Ipv4Addr>()
        .map(IpAddr::V4)
        .or_else(|_| s.parse::<Ipv6Addr>().map(IpAddr::V6))
        .map_err(|_| E::custom(format!("{s:?} is not an IP address")))
}

mod nil_slice {
    use super::*;

    pub(super) fn serialize<S: Serializer>(v: &[EventIp], s: S) -> Result<S::Ok, S::Error> {
        if v.is_empty() { s.serialize_none() } else { v.serialize(s) }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<EventIp>, D::Error> {
        Ok(Option::<Vec<EventIp>>::deserialize(d)?.unwrap_or_default())
    }
}

mod go_ip {
    use super::*;

    pub(super) fn serialize<S: Serializer>(v: &Option<IpAddr>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.as_ref().map(go_ip_text).unwrap_or_default())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) if s.is_empty() => Ok(None),
            Some(s) => parse_go_ip(&s).map(Some),
        }
    }
}

mod go_ip_required {
    use super::*;

    pub(super) fn serialize<S: Serializer>(v: &IpAddr, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&go_ip_text(v))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<IpAddr, D::Error> {
        parse_go_ip(&String::deserialize(d)?)
    }
}

mod go_bytes {
    use super::*;

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::base64::encode(v))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(Vec::new()),
            Some(s) => crate::base64::decode(&s)
                .ok_or_else(|| D::Error::custom(format!("{s:?} is not standard base64"))),
        }
    }
}

#[cfg(test)]
mod tests;
