//! AuthorizationPolicies attached to a waypoint (`targetRefs` naming its Gateway or one of its
//! Services) → `Policy` resources, values passed through in Istio's syntax.

use ambit_api::waypoint::{Condition, Operation, Policy, Rule, Source, policy};
use ambit_api::workload::Service;
use ambit_objects::istio::{AuthorizationPolicy, PolicyTargetReference};

use super::{Config, ConfigError, View, scoped};
use crate::translate::names::{self, Name};

/// What a policy's target reference names, for a waypoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A Gateway (`gateway.networking.k8s.io`).
    Gateway(Name),
    /// A Kubernetes Service.
    Service(Name),
    /// Something else (`group/kind name`), which waypoints do not take policies for.
    Other(String),
}

/// The targets of a policy, namespaces defaulted to the policy's.
pub(crate) fn targets(ap: &AuthorizationPolicy) -> Vec<Target> {
    let ns = ap.metadata.namespace.as_deref().unwrap_or_default();
    ap.spec.target_ref.iter().chain(&ap.spec.target_refs).map(|t| target(ns, t)).collect()
}

fn target(ns: &str, t: &PolicyTargetReference) -> Target {
    let name = Name::new(if t.namespace.is_empty() { ns } else { &t.namespace }, t.name.as_str());
    match (t.group.as_str(), t.kind.as_str()) {
        ("gateway.networking.k8s.io", "Gateway") => Target::Gateway(name),
        ("" | "core", "Service") => Target::Service(name),
        (g, k) => {
            Target::Other(format!("{}{k} {name}", if g.is_empty() { String::new() } else { format!("{g}/") }))
        }
    }
}

/// Adds the policies that target this waypoint or its bound Services, and lists them on the
/// Destinations they apply to.
pub(super) fn attach(view: &View<'_, '_>, wp: &Name, services: &[(String, &Service)], config: &mut Config) {
    let mut aps: Vec<(&Name, &AuthorizationPolicy)> =
        view.ctx.store.auth.iter().map(|(n, ap)| (n, ap.as_ref())).collect();
    aps.sort_by(|a, b| a.0.cmp(b.0));
    for (n, ap) in aps {
        if dry_run(ap) {
            continue;
        }
        let mut applies: Vec<String> = Vec::new();
        for t in targets(ap) {
            match t {
                Target::Gateway(g) if &g == wp => {
                    applies
                        .extend(config.destinations.iter().filter(|(_, d)| d.bound).map(|(k, _)| k.clone()));
                }
                Target::Service(s) => {
                    let domain = &view.ctx.settings.domain_suffix;
                    let key = names::service_key(&s.ns, &names::service_hostname(&s, domain));
                    if services.iter().any(|(k, _)| *k == key) && view.ctx.store.services.contains_key(&s) {
                        applies.push(scoped(wp, &key));
                    }
                }
                _ => {}
            }
        }
        if applies.is_empty() {
            continue;
        }
        let full = scoped(wp, &n.to_string());
        let (action, problem) = match ap.spec.action.as_str() {
            "" | "ALLOW" => (policy::Action::Allow, None),
            "DENY" => (policy::Action::Deny, None),
            "AUDIT" => (policy::Action::Audit, None),
            "CUSTOM" => (
                policy::Action::Deny,
                Some("action CUSTOM (external authorization) is not supported by Ambit's waypoint: it denies the requests its rules match instead".to_owned()),
            ),
            other => (
                policy::Action::Allow,
                Some(format!("action {other:?} is not ALLOW, DENY, AUDIT or CUSTOM: the policy allows nothing, so it denies what it applies to")),
            ),
        };
        if let Some(message) = problem {
            config.errors.push(ConfigError {
                waypoint: wp.to_string(),
                object: format!("AuthorizationPolicy {n}"),
                message,
            });
        }
        let unknown = problem_is_unknown(&ap.spec.action);
        let rules = if unknown { Vec::new() } else { ap.spec.rules.iter().map(rule).collect() };
        config.policies.insert(
            full.clone(),
            Policy { name: n.name.clone(), namespace: n.ns.clone(), action: action as i32, rules },
        );
        for d in applies {
            if let Some(dest) = config.destinations.get_mut(&d)
                && !dest.policies.contains(&full)
            {
                dest.policies.push(full.clone());
                dest.policies.sort();
            }
        }
    }
}

fn problem_is_unknown(action: &str) -> bool {
    !matches!(action, "" | "ALLOW" | "DENY" | "AUDIT" | "CUSTOM")
}

fn dry_run(ap: &AuthorizationPolicy) -> bool {
    names::annotations(&ap.metadata)
        .get(names::DRY_RUN_ANNOTATION)
        .and_then(|v| names::parse_bool(v))
        .unwrap_or(false)
}

fn rule(r: &ambit_objects::istio::Rule) -> Rule {
    Rule {
        from: r
            .from
            .iter()
            .map(|f| {
                let s = &f.source;
                Source {
                    principals: s.principals.clone(),
                    not_principals: s.not_principals.clone(),
                    request_principals: s.request_principals.clone(),
                    not_request_principals: s.not_request_principals.clone(),
                    namespaces: s.namespaces.clone(),
                    not_namespaces: s.not_namespaces.clone(),
                    ip_blocks: s.ip_blocks.clone(),
                    not_ip_blocks: s.not_ip_blocks.clone(),
                    remote_ip_blocks: s.remote_ip_blocks.clone(),
                    not_remote_ip_blocks: s.not_remote_ip_blocks.clone(),
                    service_accounts: s.service_accounts.clone(),
                    not_service_accounts: s.not_service_accounts.clone(),
                }
            })
            .collect(),
        to: r
            .to
            .iter()
            .map(|t| {
                let o = &t.operation;
                Operation {
                    hosts: o.hosts.clone(),
                    not_hosts: o.not_hosts.clone(),
                    ports: o.ports.clone(),
                    not_ports: o.not_ports.clone(),
                    methods: o.methods.clone(),
                    not_methods: o.not_methods.clone(),
                    paths: o.paths.clone(),
                    not_paths: o.not_paths.clone(),
                }
            })
            .collect(),
        when: r
            .when
            .iter()
            .map(|c| Condition {
                key: c.key.clone(),
                values: c.values.clone(),
                not_values: c.not_values.clone(),
            })
            .collect(),
    }
}
