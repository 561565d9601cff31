//! AuthorizationPolicies parsed into the authorization engine's types: what cannot be read
//! becomes an unenforceable condition of its rule, never dropped.

use std::net::IpAddr;

use ambit_api::waypoint as api;
use ipnet::IpNet;

use crate::authz::{self, Action, Condition, Glob, Pattern};

/// Parses a Policy. Values that cannot be read become [`Condition::Unenforceable`] on their
/// rule; only an unknown action refuses the policy.
pub fn parse_policy(p: &api::Policy) -> Result<authz::Policy, String> {
    let action = match api::policy::Action::try_from(p.action) {
        Ok(api::policy::Action::Allow) => Action::Allow,
        Ok(api::policy::Action::Deny) => Action::Deny,
        Ok(api::policy::Action::Audit) => Action::Audit,
        Err(_) => return Err(format!("action {} is not supported (ALLOW, DENY and AUDIT are)", p.action)),
    };
    let rules = p.rules.iter().map(|r| parse_rule(r, &p.namespace)).collect();
    Ok(authz::Policy { name: p.name.clone(), namespace: p.namespace.clone(), action, rules })
}

fn parse_rule(r: &api::Rule, policy_ns: &str) -> authz::Rule {
    let mut when: Vec<Condition> =
        r.when.iter().map(|c| Condition::parse(&c.key, &c.values, &c.not_values)).collect();
    let mut bad = |key: &str, reason: String| {
        when.push(Condition::Unenforceable { key: key.to_owned(), reason });
    };
    let from = r
        .from
        .iter()
        .map(|s| authz::Source {
            principals: principals(
                &s.principals,
                &s.service_accounts,
                policy_ns,
                "from.source.serviceAccounts",
                &mut bad,
            ),
            not_principals: principals(
                &s.not_principals,
                &s.not_service_accounts,
                policy_ns,
                "from.source.notServiceAccounts",
                &mut bad,
            ),
            namespaces: s.namespaces.iter().map(|n| Glob::new(n)).collect(),
            not_namespaces: s.not_namespaces.iter().map(|n| Glob::new(n)).collect(),
            ip_blocks: nets(&s.ip_blocks, "from.source.ipBlocks", &mut bad),
            not_ip_blocks: nets(&s.not_ip_blocks, "from.source.notIpBlocks", &mut bad),
            remote_ip_blocks: nets(&s.remote_ip_blocks, "from.source.remoteIpBlocks", &mut bad),
            not_remote_ip_blocks: nets(&s.not_remote_ip_blocks, "from.source.notRemoteIpBlocks", &mut bad),
            request_principals: Pattern::parse_all(&s.request_principals),
            not_request_principals: Pattern::parse_all(&s.not_request_principals),
        })
        .collect();
    let to =
        r.to.iter()
            .map(|o| authz::Operation {
                hosts: Pattern::parse_all(&o.hosts),
                not_hosts: Pattern::parse_all(&o.not_hosts),
                ports: ports(&o.ports, "to.operation.ports", &mut bad),
                not_ports: ports(&o.not_ports, "to.operation.notPorts", &mut bad),
                methods: Pattern::parse_all(&o.methods),
                not_methods: Pattern::parse_all(&o.not_methods),
                paths: Pattern::parse_all(&o.paths),
                not_paths: Pattern::parse_all(&o.not_paths),
            })
            .collect();
    authz::Rule { from, to, when }
}

/// `principals` with `serviceAccounts` (`<ns>/<sa>`, or `<sa>` in the policy's namespace) added
/// as the principals they stand for, in any trust domain (`*/ns/<ns>/sa/<sa>`), as istiod
/// matches them. A positive list may set only one of the two fields (a source's fields are
/// AND-ed, so merging them would widen it): both set is reported as unenforceable, as is a value
/// that is not a service account. Negated lists merge (none of either may match).
fn principals(
    principals: &[String],
    accounts: &[String],
    policy_ns: &str,
    key: &str,
    bad: &mut impl FnMut(&str, String),
) -> Vec<Pattern> {
    let mut out = Pattern::parse_all(principals);
    if accounts.is_empty() {
        return out;
    }
    if !principals.is_empty() && key == "from.source.serviceAccounts" {
        bad(key, "principals and serviceAccounts are both set in one source".to_owned());
        return out;
    }
    for a in accounts {
        let (ns, sa) = a.split_once('/').unwrap_or((policy_ns, a.as_str()));
        let name =
            |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if name(ns) && name(sa) {
            out.push(Pattern::parse(&format!("*/ns/{ns}/sa/{sa}")));
        } else {
            bad(key, format!("{a:?} is not a service account (<namespace>/<name> or <name>)"));
        }
    }
    out
}

/// IP blocks; a value that is neither an address nor a CIDR block is reported through `bad`.
fn nets(values: &[String], key: &str, bad: &mut impl FnMut(&str, String)) -> Vec<IpNet> {
    let mut out = Vec::new();
    for v in values {
        match v.parse::<IpNet>().or_else(|_| v.parse::<IpAddr>().map(IpNet::from)) {
            Ok(n) => out.push(n),
            Err(_) => bad(key, format!("{v:?} is not an IP address or CIDR block")),
        }
    }
    out
}

/// Ports; a value that is not one is reported through `bad`.
fn ports(values: &[String], key: &str, bad: &mut impl FnMut(&str, String)) -> Vec<u16> {
    let mut out = Vec::new();
    for v in values {
        match v.parse::<u16>() {
            Ok(p) => out.push(p),
            Err(_) => bad(key, format!("{v:?} is not a port (0-65535)")),
        }
    }
    out
}
