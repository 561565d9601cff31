//! What each AuthorizationPolicy and PeerAuthentication means for the node proxies, in words.
//!
//! One evaluation, built from the translation itself ([`super::policies::translate`]), so what
//! is reported is what is published: `ambit apply` and `ambit up` print its warnings, the
//! monitoring server lists it (`/debug/policies`, `/debug/config_errors`), `ambit status` and
//! `ambit inspect` show it, and in a cluster it becomes istiod's `ZtunnelAccepted` condition.

use ambit_api::security::{Action, Authorization, Match, Rule, StringMatch, string_match};
use ambit_objects::istio::{AuthorizationPolicy, PeerAuthentication, WorkloadSelector};
use serde::Serialize;

use super::names::{self, Name};
use super::policies::{self, Notes};

/// What one policy object means for the node proxies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    /// `AuthorizationPolicy` or `PeerAuthentication`.
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// What it does, as written (`ALLOW`, `DENY`, `AUDIT`, `CUSTOM`; for a PeerAuthentication
    /// its mTLS mode).
    pub action: String,
    /// What it applies to, in words.
    pub applies_to: String,
    /// Whether node proxies enforce it (a policy with targetRefs is for waypoints).
    pub enforced: bool,
    /// The waypoints (`<ns>/<gateway>`) that enforce it (a policy with targetRefs naming a
    /// waypoint's Gateway or a Service bound to one); filled in by the translator, which knows
    /// the waypoints.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waypoints: Vec<String>,
    /// What node proxies enforce, one line per rule, in words.
    pub rules: Vec<String>,
    /// What differs from what was written, and the effect.
    pub warnings: Vec<Warning>,
    /// istiod's `ZtunnelAccepted` condition for the object (`None`: istiod writes none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<Accepted>,
}

/// Something in a policy that node proxies do not do as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The fields concerned, as paths from `spec`.
    pub fields: Vec<String>,
    /// What happens instead.
    pub message: String,
}

/// The `ZtunnelAccepted` condition, as istiod words it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Accepted {
    /// `True` when node proxies receive the policy.
    pub status: bool,
    /// `Accepted` or `UnsupportedValue`.
    pub reason: String,
    /// The message.
    pub message: String,
}

/// The condition type istiod writes on AuthorizationPolicies for node proxies.
pub const ZTUNNEL_ACCEPTED: &str = "ZtunnelAccepted";

/// Each AuthorizationPolicy's `ZtunnelAccepted` condition and the generation it is for, by
/// `(namespace, name)`.
pub type Conditions = std::collections::BTreeMap<(String, String), (i64, Option<Accepted>)>;

/// Whether one target of a policy's `targetRefs` reaches a waypoint: the waypoints that
/// enforce the policy for it, or why none does.
pub type TargetStatus = Result<Vec<String>, String>;

impl PolicyReport {
    /// Records where a targeted policy is enforced: each target's waypoints, or a warning for
    /// a target no waypoint enforces it for (in `targetRef`, then `targetRefs` order).
    pub fn at_waypoints(&mut self, legacy_target_ref: bool, targets: Vec<TargetStatus>) {
        for (i, t) in targets.into_iter().enumerate() {
            match t {
                Ok(wps) => self.waypoints.extend(wps),
                Err(why) => {
                    let field = match (legacy_target_ref, i) {
                        (true, 0) => "targetRef".to_owned(),
                        (true, i) => format!("targetRefs[{}]", i - 1),
                        (false, i) => format!("targetRefs[{i}]"),
                    };
                    self.warnings.push(Warning {
                        fields: vec![field],
                        message: format!("{why}: no waypoint enforces this policy for it"),
                    });
                }
            }
        }
        self.waypoints.sort();
        self.waypoints.dedup();
    }

    /// `kind namespace/name`.
    pub fn title(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }

    /// Each warning on one line, prefixed with the policy it is about.
    pub fn warning_lines(&self) -> Vec<String> {
        self.warnings.iter().map(|w| format!("{}: {}", self.title(), w.message)).collect()
    }
}

/// The report of one AuthorizationPolicy; `root_namespace` holds the mesh-wide policies.
pub fn authorization_policy(root_namespace: &str, ap: &AuthorizationPolicy) -> PolicyReport {
    let n = Name::of(&ap.metadata);
    let mut notes = Notes::default();
    let published = policies::translate(root_namespace, &n, ap, &mut notes);
    let action = if ap.spec.action.is_empty() { "ALLOW".to_owned() } else { ap.spec.action.clone() };
    let targeted = ap.spec.target_ref.is_some() || !ap.spec.target_refs.is_empty();
    let applies_to = if targeted {
        let refs: Vec<String> = ap
            .spec
            .target_ref
            .iter()
            .chain(&ap.spec.target_refs)
            .map(|r| {
                let ns = if r.namespace.is_empty() { &n.ns } else { &r.namespace };
                format!("{} {ns}/{}", if r.kind.is_empty() { "Gateway" } else { &r.kind }, r.name)
            })
            .collect();
        format!("traffic through {} (at its waypoint)", refs.join(", "))
    } else {
        selected(root_namespace, &n.ns, ap.spec.selector.as_ref())
    };
    let mut warnings = Vec::new();
    let mut rules = Vec::new();
    let condition;
    match &published {
        None if targeted => {
            condition = None;
        }
        None => {
            let dry_run = matches!(action.as_str(), "ALLOW" | "DENY");
            let message = if dry_run {
                format!(
                    "the {} annotation is set: node proxies do not enforce this policy (dry run is not supported for them)",
                    names::DRY_RUN_ANNOTATION
                )
            } else {
                format!("{action} policies are enforced by waypoints only: node proxies ignore this policy")
            };
            warnings.push(Warning { fields: vec!["action".into()], message });
            condition = (!dry_run).then(|| Accepted {
                status: false,
                reason: "UnsupportedValue".into(),
                message: format!("ztunnel does not support the {action} action"),
            });
        }
        Some(auth) => {
            rules = describe(auth);
            let deny = auth.action == Action::Deny as i32;
            if notes.unknown_action {
                warnings.push(Warning {
                    fields: vec!["action".into()],
                    message: format!(
                        "action {:?} is not ALLOW, DENY, AUDIT or CUSTOM: the policy denies all traffic to {applies_to}",
                        ap.spec.action
                    ),
                });
            }
            warnings.extend(l7_warnings(&notes, deny, ap.spec.rules.len(), &applies_to));
            for i in &notes.ignored {
                warnings.push(Warning {
                    fields: vec![i.path.clone()],
                    message: format!("{} {:?} is {}: the value is ignored", i.path, i.value, i.problem),
                });
            }
            condition = Some(accepted(&notes, deny));
        }
    }
    PolicyReport {
        kind: "AuthorizationPolicy",
        namespace: n.ns,
        name: n.name,
        action,
        applies_to,
        enforced: published.is_some(),
        waypoints: Vec::new(),
        rules,
        warnings,
        condition,
    }
}

/// The warnings for rules with L7 attributes: one for the dropped ALLOW rules, one per DENY
/// rule that is widened.
fn l7_warnings(notes: &Notes, deny: bool, total: usize, applies_to: &str) -> Vec<Warning> {
    let mut out = Vec::new();
    if deny {
        for r in &notes.rules {
            let what = r.enforced.as_ref().map_or_else(|| "all traffic".to_owned(), rule_words);
            let target = if what == "all traffic" {
                format!("all traffic to {applies_to}")
            } else {
                format!("all traffic to {applies_to} matching {what}")
            };
            out.push(Warning {
                fields: r.paths.clone(),
                message: format!(
                    "rules[{}]: node proxies cannot check {}: DENY applied to {target}, whatever the {}, until a waypoint enforces the policy",
                    r.index,
                    r.names.join(", "),
                    request_words(&r.names)
                ),
            });
        }
        return out;
    }
    let dropped: Vec<&policies::RuleNote> = notes.rules.iter().filter(|r| r.dropped).collect();
    if dropped.is_empty() {
        return out;
    }
    let indices: Vec<String> = dropped.iter().map(|r| format!("rules[{}]", r.index)).collect();
    let mut names: Vec<String> = dropped.iter().flat_map(|r| r.names.clone()).collect();
    names.sort();
    names.dedup();
    let effect = if dropped.len() == total {
        format!(
            "this ALLOW policy now allows nothing, so it denies all traffic to {applies_to} that no other ALLOW policy allows, until a waypoint enforces it"
        )
    } else {
        "this ALLOW policy allows only what its other rules allow until a waypoint enforces it".to_owned()
    };
    out.push(Warning {
        fields: dropped.iter().flat_map(|r| r.paths.clone()).collect(),
        message: format!(
            "{} dropped: node proxies cannot check {}; {effect}",
            indices.join(", "),
            names.join(", ")
        ),
    });
    out
}

/// "method", "path" … for the names found, as a person says them.
fn request_words(names: &[String]) -> String {
    let words: Vec<&str> = names
        .iter()
        .map(|n| match n.as_str() {
            "methods" | "notMethods" => "method",
            "paths" | "notPaths" => "path",
            "hosts" | "notHosts" => "host",
            "requestPrincipals" | "notRequestPrincipals" => "request principal",
            "remoteIpBlocks" | "notRemoteIpBlocks" => "original client address",
            _ => "request",
        })
        .collect();
    let mut words: Vec<&str> = words;
    words.dedup();
    words.join(" and ")
}

/// istiod's condition for a policy node proxies receive.
fn accepted(notes: &Notes, deny: bool) -> Accepted {
    let mut found: Vec<String> = notes.rules.iter().flat_map(|r| r.names.clone()).collect();
    found.sort();
    found.dedup();
    if found.is_empty() {
        return Accepted { status: true, reason: "Accepted".into(), message: "attached to ztunnel".into() };
    }
    let boilerplate = if deny {
        "DENY policy with HTTP attributes is enforced without the HTTP rules. This will be more restrictive than requested."
    } else {
        "Within an ALLOW policy, rules matching HTTP attributes are omitted. This will be more restrictive than requested."
    };
    Accepted {
        status: true,
        reason: "UnsupportedValue".into(),
        message: format!(
            "ztunnel does not support HTTP attributes (found: {}). In ambient mode you must use a waypoint proxy to enforce HTTP rules. {boilerplate}",
            found.join(", ")
        ),
    }
}

/// The report of one PeerAuthentication.
pub fn peer_authentication(root_namespace: &str, pa: &PeerAuthentication) -> PolicyReport {
    let n = Name::of(&pa.metadata);
    let mode = pa.spec.mtls.as_ref().map(|m| m.mode.as_str()).filter(|m| !m.is_empty()).unwrap_or("UNSET");
    let mut warnings = Vec::new();
    let known = |m: &str| matches!(m, "" | "UNSET" | "DISABLE" | "PERMISSIVE" | "STRICT");
    let modes = pa
        .spec
        .mtls
        .iter()
        .map(|m| ("mtls.mode".to_owned(), m))
        .chain(pa.spec.port_level_mtls.iter().map(|(p, m)| (format!("portLevelMtls[{p}].mode"), m)));
    for (path, m) in modes.filter(|(_, m)| !known(&m.mode)) {
        warnings.push(Warning {
            fields: vec![path.clone()],
            message: format!(
                "{path} {:?} is not UNSET, DISABLE, PERMISSIVE or STRICT: taken as STRICT (plaintext refused)",
                m.mode
            ),
        });
    }
    let with_selector = pa.spec.selector.as_ref().is_some_and(|s| !s.match_labels.is_empty());
    let ignored = n.ns == root_namespace && with_selector;
    if ignored {
        warnings.push(Warning {
            fields: vec!["selector".into()],
            message: format!(
                "a PeerAuthentication with a selector in the root namespace ({root_namespace}) is ignored, as istiod ignores it"
            ),
        });
    }
    if !pa.spec.port_level_mtls.is_empty() && !with_selector {
        warnings.push(Warning {
            fields: vec!["portLevelMtls".into()],
            message: "portLevelMtls applies only with a selector (as in istiod): the port modes are ignored"
                .into(),
        });
    }
    let mut rules = vec![match mode {
        "STRICT" => "mTLS required: plaintext connections are refused".to_owned(),
        "PERMISSIVE" | "DISABLE" => "plaintext connections accepted".to_owned(),
        "UNSET" => "inherits the mode of the namespace, else of the mesh".to_owned(),
        _ => "mTLS required: plaintext connections are refused (unknown mode)".to_owned(),
    }];
    if with_selector {
        for (port, m) in &pa.spec.port_level_mtls {
            rules.push(format!("port {port}: {}", if m.mode.is_empty() { "UNSET" } else { &m.mode }));
        }
    }
    PolicyReport {
        kind: "PeerAuthentication",
        namespace: n.ns.clone(),
        name: n.name.clone(),
        action: mode.to_owned(),
        applies_to: selected(root_namespace, &n.ns, pa.spec.selector.as_ref()),
        enforced: !ignored,
        waypoints: Vec::new(),
        rules,
        warnings,
        condition: None,
    }
}

/// What a selector in `ns` selects, in words.
fn selected(root_namespace: &str, ns: &str, selector: Option<&WorkloadSelector>) -> String {
    match selector {
        Some(s) if !s.match_labels.is_empty() => {
            let labels: Vec<String> = s.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if ns == root_namespace {
                format!("workloads with {} in any namespace", labels.join(","))
            } else {
                format!("workloads with {} in namespace {ns}", labels.join(","))
            }
        }
        _ if ns == root_namespace => "every workload in the mesh".to_owned(),
        _ => format!("every workload in namespace {ns}"),
    }
}

/// The object a published policy comes from, for a person: `namespace/name` of an
/// AuthorizationPolicy as it is, the policies the translation derives from PeerAuthentications
/// by what they are (`PeerAuthentication demo/strict (port-level mTLS)`, `STRICT mTLS
/// (PeerAuthentication)`).
pub fn origin(key: &str) -> String {
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    if name == names::STATIC_STRICT {
        return "STRICT mTLS (a PeerAuthentication)".to_owned();
    }
    match name.strip_prefix("converted_peer_authentication_") {
        Some(pa) => format!("PeerAuthentication {ns}/{pa} (port-level mTLS)"),
        None => key.to_owned(),
    }
}

/// A published policy in words: one line per rule (`allows` / `denies` …).
pub fn describe(auth: &Authorization) -> Vec<String> {
    let verb = if auth.action == Action::Deny as i32 { "denies" } else { "allows" };
    if auth.rules.is_empty() {
        return vec![if verb == "allows" {
            "allows nothing (no rule): every connection it applies to is denied unless another ALLOW policy allows it"
                .to_owned()
        } else {
            "denies nothing (no rule)".to_owned()
        }];
    }
    auth.rules.iter().map(|r| format!("{verb} {}", rule_words(r))).collect()
}

/// One rule: every clause must match (one of its matches).
fn rule_words(r: &Rule) -> String {
    let clauses: Vec<String> = r
        .clauses
        .iter()
        .map(|c| {
            let matches: Vec<String> = c.matches.iter().map(match_words).collect();
            match matches.len() {
                0 => "nothing".to_owned(),
                1 => matches[0].clone(),
                _ => format!("({})", matches.join(") or (")),
            }
        })
        .collect();
    if clauses.is_empty() { "all traffic".to_owned() } else { clauses.join(", and ") }
}

/// One match: all of its fields.
fn match_words(m: &Match) -> String {
    let mut parts = Vec::new();
    let mut field = |what: &str, values: Vec<String>, negated: bool| {
        if values.is_empty() {
            return;
        }
        // `*` alone: any value at all, which a plaintext peer (no identity) does not have.
        if values.len() == 1 && values[0] == PRESENT {
            let noun = what.trim_start_matches("from ");
            parts.push(if negated {
                format!("from no {noun} (plaintext)")
            } else {
                format!("from any {noun}")
            });
            return;
        }
        let not = if negated { "not " } else { "" };
        parts.push(format!("{what} {not}{}", values.join(" or ")));
    };
    let strings = |v: &[StringMatch]| v.iter().map(string_words).collect::<Vec<_>>();
    let accounts = |v: &[ambit_api::security::ServiceAccountMatch]| {
        v.iter().map(|a| format!("{}/{}", a.namespace, a.service_account)).collect::<Vec<_>>()
    };
    let ips = |v: &[ambit_api::security::Address]| v.iter().map(address_words).collect::<Vec<_>>();
    let ports = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>();
    field("from principal", strings(&m.principals), false);
    field("from principal", strings(&m.not_principals), true);
    field("from namespace", strings(&m.namespaces), false);
    field("from namespace", strings(&m.not_namespaces), true);
    field("from service account", accounts(&m.service_accounts), false);
    field("from service account", accounts(&m.not_service_accounts), true);
    field("from address", ips(&m.source_ips), false);
    field("from address", ips(&m.not_source_ips), true);
    field("to address", ips(&m.destination_ips), false);
    field("to address", ips(&m.not_destination_ips), true);
    field("to port", ports(&m.destination_ports), false);
    field("to port", ports(&m.not_destination_ports), true);
    if parts.is_empty() { "anything".to_owned() } else { parts.join(" and ") }
}

/// How a presence match reads among other values.
const PRESENT: &str = "*";

fn string_words(s: &StringMatch) -> String {
    match &s.match_type {
        Some(string_match::MatchType::Exact(x)) => x.clone(),
        Some(string_match::MatchType::Prefix(x)) => format!("{x}*"),
        Some(string_match::MatchType::Suffix(x)) => format!("*{x}"),
        Some(string_match::MatchType::Presence(())) => PRESENT.to_owned(),
        None => "(none)".to_owned(),
    }
}

fn address_words(a: &ambit_api::security::Address) -> String {
    let ip = match a.address.len() {
        4 => <[u8; 4]>::try_from(a.address.as_slice()).map(|b| std::net::IpAddr::from(b).to_string()),
        16 => <[u8; 16]>::try_from(a.address.as_slice()).map(|b| std::net::IpAddr::from(b).to_string()),
        _ => Ok(format!("{:?}", a.address)),
    }
    .unwrap_or_default();
    let full = if a.address.len() == 4 { 32 } else { 128 };
    if a.length == full { ip } else { format!("{ip}/{}", a.length) }
}

#[cfg(test)]
mod tests;
