//! The ADD result: the previous plugin's `prevResult`, passed through.
//!
//! What is printed for each case (the output always has the configuration's `cniVersion`):
//!
//! | `prevResult` | Printed |
//! |---|---|
//! | absent | an empty result: `{"cniVersion":"1.x.0"}`, or `{"cniVersion":"0.x.y","dns":{}}` for 0.3.0–0.4.0 (what libcni prints) |
//! | `cniVersion` equal to the configuration's (the normal case: runtimes hand it over in the configuration's version) | the received bytes, verbatim |
//! | no `cniVersion` | the received bytes with `"cniVersion":"<conf>"` inserted after the opening brace |
//! | another version with the same layout (0.3.0/0.3.1/0.4.0, or 1.0.0/1.1.0) | re-encoded with `cniVersion` replaced |
//! | 0.3.x/0.4.0 → 1.x | re-encoded without `ips[].version` |
//! | 1.x → 0.3.x/0.4.0 | re-encoded with `ips[].version` (`"4"`/`"6"`) added and `interfaces[]` cut to `name`, `mac`, `sandbox` (as libcni converts) |
//!
//! Re-encoding keeps every value and unknown key but may reorder keys. 0.1.0/0.2.0 results
//! (`ip4`/`ip6`) are rejected: no supported configuration version uses them.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::event::{EventIp, IpNet};
use crate::version::{CniVersion, ResultFormat};

/// A parsed `prevResult`, keeping the received bytes for verbatim output.
#[derive(Debug)]
pub struct PrevResult<'a> {
    raw: &'a RawValue,
    object: Map<String, Value>,
    declared: Option<CniVersion>,
}

/// Why `prevResult` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    /// Not a JSON object.
    #[error("prevResult is not a JSON object")]
    NotObject,
    /// The JSON could not be re-read (should not happen for bytes serde already accepted).
    #[error("prevResult could not be decoded: {0}")]
    Json(#[from] serde_json::Error),
    /// `cniVersion` is not a version this plugin can convert.
    #[error(
        "prevResult has cniVersion {0}, which this plugin cannot convert (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)"
    )]
    Version(String),
    /// An `ips` entry is malformed.
    #[error("prevResult.ips{0}")]
    Ips(String),
}

impl<'a> PrevResult<'a> {
    /// Parses `prevResult` as received inside the network configuration.
    pub fn parse(raw: &'a RawValue) -> Result<PrevResult<'a>, ResultError> {
        let Value::Object(object) = serde_json::from_str(raw.get())? else {
            return Err(ResultError::NotObject);
        };
        let declared = match object.get("cniVersion") {
            None => None,
            Some(Value::String(v)) => Some(v.parse().map_err(|_| ResultError::Version(format!("{v:?}")))?),
            Some(other) => return Err(ResultError::Version(other.to_string())),
        };
        Ok(PrevResult { raw, object, declared })
    }

    /// The pod's addresses for the agent event, from `ips[]`.
    pub fn event_ips(&self) -> Result<Vec<EventIp>, ResultError> {
        let ips = match self.object.get("ips") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(Value::Array(ips)) => ips,
            Some(_) => return Err(ResultError::Ips(" is not an array".into())),
        };
        ips.iter()
            .enumerate()
            .map(|(i, ip)| event_ip(ip).map_err(|e| ResultError::Ips(format!("[{i}]: {e}"))))
            .collect()
    }

    /// The result to print for a configuration of version `target`.
    pub fn render(&self, target: CniVersion) -> String {
        let Some(declared) = self.declared else {
            return insert_version(self.raw.get(), target);
        };
        if declared == target {
            return self.raw.get().to_owned();
        }
        let mut object = self.object.clone();
        object.insert("cniVersion".into(), Value::String(target.as_str().into()));
        match (declared.result_format(), target.result_format()) {
            (ResultFormat::Legacy, ResultFormat::Current) => {
                for ip in array_objects(&mut object, "ips") {
                    ip.remove("version");
                }
            }
            (ResultFormat::Current, ResultFormat::Legacy) => {
                for ip in array_objects(&mut object, "ips") {
                    let family = ip
                        .get("address")
                        .and_then(Value::as_str)
                        .and_then(|a| IpNet::parse_cidr(a).ok())
                        .map(|net| if is_v4(&net) { "4" } else { "6" });
                    if let Some(family) = family {
                        ip.insert("version".into(), Value::String(family.into()));
                    }
                }
                for intf in array_objects(&mut object, "interfaces") {
                    intf.retain(|k, _| matches!(k.as_str(), "name" | "mac" | "sandbox"));
                }
            }
            _ => {}
        }
        Value::Object(object).to_string()
    }
}

/// The result printed when there is no `prevResult`.
pub fn empty_result(target: CniVersion) -> String {
    match target.result_format() {
        ResultFormat::Current => format!(r#"{{"cniVersion":"{target}"}}"#),
        ResultFormat::Legacy => format!(r#"{{"cniVersion":"{target}","dns":{{}}}}"#),
    }
}

fn event_ip(ip: &Value) -> Result<EventIp, String> {
    let Value::Object(ip) = ip else {
        return Err("is not an object".into());
    };
    let address = match ip.get("address") {
        Some(Value::String(a)) => IpNet::parse_cidr(a).map_err(|e| format!("address: {e}"))?,
        _ => return Err("has no address string".into()),
    };
    let gateway = match ip.get("gateway") {
        None | Some(Value::Null) => None,
        Some(Value::String(g)) if g.is_empty() => None,
        Some(Value::String(g)) => {
            Some(g.parse().map_err(|_| format!("gateway: {g:?} is not an IP address"))?)
        }
        Some(_) => return Err("gateway is not a string".into()),
    };
    let interface = match ip.get("interface") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => {
            Some(n.as_i64().ok_or_else(|| format!("interface: {n} is not an integer"))?)
        }
        Some(_) => return Err("interface is not an integer".into()),
    };
    Ok(EventIp { interface, address, gateway })
}

fn is_v4(net: &IpNet) -> bool {
    match net.ip {
        std::net::IpAddr::V4(_) => true,
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    }
}

fn array_objects<'m>(
    object: &'m mut Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'m mut Map<String, Value>> {
    object.get_mut(key).and_then(Value::as_array_mut).into_iter().flatten().filter_map(Value::as_object_mut)
}

/// Inserts `"cniVersion"` right after the opening brace, keeping every other byte.
fn insert_version(raw: &str, target: CniVersion) -> String {
    // `raw` is a validated JSON object, so its first non-space byte is `{`.
    let Some(brace) = raw.find('{') else {
        return empty_result(target);
    };
    let (head, rest) = raw.split_at(brace + 1);
    let separator = if rest.trim_start().starts_with('}') { "" } else { "," };
    format!(r#"{head}"cniVersion":"{target}"{separator}{rest}"#)
}

#[cfg(test)]
mod tests;
