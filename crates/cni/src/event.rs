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
//! Both directions are here, one definition for both sides: the plugin serializes
//! ([`PluginEvent::to_json`]), the node agent parses and checks ([`PluginEvent::parse`]), and the
//! answer's status means the same to both ([`STATUS_RETRY`], [`is_retry_status`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// File name of the agent's plugin event socket inside its run directory.
pub const EVENT_SOCKET: &str = "pluginevent.sock";
/// HTTP path of the ADD event.
pub const EVENT_PATH: &str = "/cmdadd";
/// The agent's status for a failure that a later attempt can get past (no proxy yet, pod not
/// known yet): the plugin reports it as CNI code 11, "try again later".
pub const STATUS_RETRY: u16 = 503;
/// Longest accepted `Netns` path (Linux `PATH_MAX`).
pub const MAX_NETNS_PATH: usize = 4096;

/// Whether the agent's answer means "try again later" (CNI code 11) rather than a refusal.
pub fn is_retry_status(status: u16) -> bool {
    matches!(status, 429 | STATUS_RETRY)
}

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
    #[serde(rename = "Mask", with = "go_bytes", default)]
    pub mask: Vec<u8>,
}

/// Why a request body is not a usable plugin event (the agent answers 400 with this text).
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// Empty body.
    #[error("empty request body; expected the CNI plugin's JSON event")]
    Empty,
    /// Not the expected JSON.
    #[error("invalid CNI plugin event: {0}")]
    Json(#[from] serde_json::Error),
    /// A required field is empty.
    #[error("CNI plugin event has an empty {0}")]
    Missing(&'static str),
    /// The netns path has the wrong form.
    #[error(transparent)]
    Netns(#[from] NetnsPathError),
}

/// Why a `CNI_NETNS` path is refused before anything opens it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetnsPathError {
    /// Not absolute.
    #[error("CNI_NETNS {0:?} is not an absolute path; the runtime must pass the namespace's path")]
    NotAbsolute(String),
    /// A `.` or `..` component.
    #[error(
        "CNI_NETNS {0:?} has a '.' or '..' component; the runtime must pass the namespace's own path, \
         not one that walks elsewhere"
    )]
    Traversal(String),
    /// A NUL byte or more than [`MAX_NETNS_PATH`] bytes.
    #[error("CNI_NETNS is not a usable path (NUL byte, or longer than {MAX_NETNS_PATH} bytes)")]
    Unusable,
}

/// Checks the form of a `CNI_NETNS` path: absolute, no `.` or `..` component, no NUL, at most
/// [`MAX_NETNS_PATH`] bytes. It says nothing about what is at the path; whoever opens it must
/// still check that it is a network namespace (and not the host's).
pub fn check_netns_path(path: &str) -> Result<&Path, NetnsPathError> {
    if path.len() > MAX_NETNS_PATH || path.contains('\0') {
        return Err(NetnsPathError::Unusable);
    }
    if !path.starts_with('/') {
        return Err(NetnsPathError::NotAbsolute(path.to_owned()));
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return Err(NetnsPathError::Traversal(path.to_owned()));
    }
    Ok(Path::new(path))
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

    /// Decodes a body without checking it (see [`PluginEvent::parse`]).
    pub fn from_json(body: &[u8]) -> Result<PluginEvent, serde_json::Error> {
        serde_json::from_slice(body)
    }

    /// The agent's parse of a request body: decoded, the pod's identity present, the netns path
    /// of the right form ([`check_netns_path`]).
    pub fn parse(body: &[u8]) -> Result<PluginEvent, EventError> {
        if body.is_empty() {
            return Err(EventError::Empty);
        }
        let event = PluginEvent::from_json(body)?;
        for (name, v) in
            [("Netns", &event.netns), ("PodName", &event.pod_name), ("PodNamespace", &event.pod_namespace)]
        {
            if v.is_empty() {
                return Err(EventError::Missing(name));
            }
        }
        check_netns_path(&event.netns)?;
        Ok(event)
    }

    /// The pod's addresses, IPv4-mapped IPv6 addresses unmapped (the agent ignores the masks).
    pub fn pod_ips(&self) -> Vec<IpAddr> {
        self.ips.iter().map(|i| i.address.ip.to_canonical()).collect()
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
