//! `ambit inspect policies`: the policies a proxy holds (ztunnel's config-dump shape), read back
//! into `istio.security.Authorization` so the control plane's own words describe them
//! ([`explain::describe`]), with what the control plane reports about the object they came from
//! (what it applies to, its warnings) when the control plane is known.

use std::net::IpAddr;

use ambit_api::security::{
    Action, Address, Authorization, Clause, Match, Rule, Scope, ServiceAccountMatch, StringMatch,
    string_match,
};
use ambit_control::translate::explain;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::render::Row;

/// One policy a proxy holds.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    node: String,
    namespace: String,
    name: String,
    scope: String,
    action: String,
    /// What it enforces, one line per rule.
    rules: Vec<String>,
    /// What it applies to, as the control plane reports it (empty: not known).
    applies_to: String,
    /// What the control plane reports the proxies do not enforce as written.
    warnings: Vec<String>,
}

impl Row for Policy {
    fn header() -> &'static [&'static str] {
        &["PROXY", "NAMESPACE", "NAME", "SCOPE", "ACTION", "APPLIES TO"]
    }

    fn cells(&self) -> Vec<String> {
        vec![
            self.node.clone(),
            self.namespace.clone(),
            self.name.clone(),
            self.scope.clone(),
            self.action.clone(),
            if self.applies_to.is_empty() { "-".into() } else { self.applies_to.clone() },
        ]
    }

    fn details(&self) -> Vec<String> {
        let warnings = self.warnings.iter().map(|w| format!("warning: {w}"));
        self.rules.iter().cloned().chain(warnings).collect()
    }
}

/// The policies of each proxy's dump, with the control plane's reports (`/debug/policies`)
/// joined by namespace and name when given.
pub fn policies(
    dumps: &[(String, Value)],
    reports: Option<&Value>,
    ns: Option<&str>,
) -> Result<Vec<Policy>, String> {
    let mut out = Vec::new();
    for (node, d) in dumps {
        for v in d["policies"].as_array().into_iter().flatten() {
            let p: Dumped = serde_json::from_value(v.clone())
                .map_err(|e| format!("{node}: a policy of the config dump does not read: {e}"))?;
            if ns.is_some_and(|n| n != p.namespace) {
                continue;
            }
            let auth = p.to_proto();
            // Converted PeerAuthentications carry a derived name; the report is under the object's.
            let object = p.name.strip_prefix("converted_peer_authentication_").unwrap_or(&p.name);
            let report = reports.and_then(|r| {
                r.as_array()?.iter().find(|x| x["namespace"] == p.namespace.as_str() && x["name"] == object)
            });
            out.push(Policy {
                node: node.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                scope: p.scope.clone(),
                action: if p.dry_run { format!("{} (dry run)", p.action) } else { p.action.clone() },
                rules: explain::describe(&auth),
                applies_to: report.and_then(|r| r["appliesTo"].as_str()).unwrap_or_default().to_owned(),
                warnings: report
                    .map(|r| {
                        r["warnings"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|w| w["message"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// A policy as the proxy's config dump writes it (ztunnel's local-config shape).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Dumped {
    name: String,
    namespace: String,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    rules: Vec<Vec<Vec<DumpedMatch>>>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct DumpedMatch {
    namespaces: Vec<Value>,
    not_namespaces: Vec<Value>,
    service_accounts: Vec<DumpedAccount>,
    not_service_accounts: Vec<DumpedAccount>,
    principals: Vec<Value>,
    not_principals: Vec<Value>,
    source_ips: Vec<String>,
    not_source_ips: Vec<String>,
    destination_ips: Vec<String>,
    not_destination_ips: Vec<String>,
    destination_ports: Vec<u32>,
    not_destination_ports: Vec<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DumpedAccount {
    namespace: String,
    service_account: String,
}

impl Dumped {
    fn to_proto(&self) -> Authorization {
        let strings = |v: &[Value]| v.iter().map(string_match).collect::<Vec<_>>();
        let accounts = |v: &[DumpedAccount]| {
            v.iter()
                .map(|a| ServiceAccountMatch {
                    namespace: a.namespace.clone(),
                    service_account: a.service_account.clone(),
                })
                .collect::<Vec<_>>()
        };
        let ips = |v: &[String]| v.iter().filter_map(|s| address(s)).collect::<Vec<_>>();
        let rules = self
            .rules
            .iter()
            .map(|rule| Rule {
                clauses: rule
                    .iter()
                    .map(|clause| Clause {
                        matches: clause
                            .iter()
                            .map(|m| Match {
                                namespaces: strings(&m.namespaces),
                                not_namespaces: strings(&m.not_namespaces),
                                service_accounts: accounts(&m.service_accounts),
                                not_service_accounts: accounts(&m.not_service_accounts),
                                principals: strings(&m.principals),
                                not_principals: strings(&m.not_principals),
                                source_ips: ips(&m.source_ips),
                                not_source_ips: ips(&m.not_source_ips),
                                destination_ips: ips(&m.destination_ips),
                                not_destination_ips: ips(&m.not_destination_ips),
                                destination_ports: m.destination_ports.clone(),
                                not_destination_ports: m.not_destination_ports.clone(),
                                ..Match::default()
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect();
        let scope = match self.scope.as_str() {
            "Namespace" => Scope::Namespace,
            "WorkloadSelector" => Scope::WorkloadSelector,
            _ => Scope::Global,
        };
        Authorization {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            scope: scope as i32,
            action: if self.action == "Deny" { Action::Deny as i32 } else { Action::Allow as i32 },
            rules,
            dry_run: self.dry_run,
            ..Authorization::default()
        }
    }
}

/// `{"Exact": "x"}`, `{"Prefix": …}`, `{"Suffix": …}`, `{"Presence": []}`.
fn string_match(v: &Value) -> StringMatch {
    let (kind, value) =
        v.as_object().and_then(|m| m.iter().next()).map_or(("", &Value::Null), |(k, v)| (k.as_str(), v));
    let s = value.as_str().unwrap_or_default().to_owned();
    let m = match kind {
        "Exact" => string_match::MatchType::Exact(s),
        "Prefix" => string_match::MatchType::Prefix(s),
        "Suffix" => string_match::MatchType::Suffix(s),
        _ => string_match::MatchType::Presence(()),
    };
    StringMatch { match_type: Some(m) }
}

/// `10.0.0.0/8` or `10.0.0.1/32`.
fn address(s: &str) -> Option<Address> {
    let (ip, len) = s.split_once('/').unwrap_or((s, ""));
    let ip: IpAddr = ip.parse().ok()?;
    let full = if ip.is_ipv4() { 32 } else { 128 };
    let length = if len.is_empty() { full } else { len.parse().ok()? };
    let address = match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    Some(Address { address, length })
}
