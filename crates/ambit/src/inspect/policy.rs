//! `ambit inspect policies`: the policies a proxy holds (ztunnel's config-dump shape), read back
//! into `istio.security.Authorization` by the proxy's own conversion, so the control plane's
//! words describe them ([`explain::describe`]), with what the control plane reports about the object they came from
//! (what it applies to, its warnings) when the control plane is known.

use ambit_api::security::{Action, Scope};
use ambit_control::translate::explain;
use serde::Serialize;
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
            let p = ambit_proxy::dumped_policy(v.clone())
                .map_err(|e| format!("{node}: a policy of the config dump does not read: {e}"))?;
            if ns.is_some_and(|n| n != p.namespace) {
                continue;
            }
            let scope = Scope::try_from(p.scope).unwrap_or(Scope::Global);
            let action = if p.action == Action::Deny as i32 { "Deny" } else { "Allow" };
            // Converted PeerAuthentications carry a derived name; the report is under the object's.
            let object = p.name.strip_prefix("converted_peer_authentication_").unwrap_or(&p.name);
            let report = reports.and_then(|r| {
                r.as_array()?.iter().find(|x| x["namespace"] == p.namespace.as_str() && x["name"] == object)
            });
            out.push(Policy {
                node: node.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                scope: scope_name(scope).to_owned(),
                action: if p.dry_run { format!("{action} (dry run)") } else { action.to_owned() },
                rules: explain::describe(&p),
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

/// The scope as the config dump names it.
fn scope_name(scope: Scope) -> &'static str {
    match scope {
        Scope::Global => "Global",
        Scope::Namespace => "Namespace",
        Scope::WorkloadSelector => "WorkloadSelector",
    }
}
