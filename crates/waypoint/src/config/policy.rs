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
    let rules = p.rules.iter().map(parse_rule).collect();
    Ok(authz::Policy { name: p.name.clone(), namespace: p.namespace.clone(), action, rules })
}

fn parse_rule(r: &api::Rule) -> authz::Rule {
    let mut when: Vec<Condition> =
        r.when.iter().map(|c| Condition::parse(&c.key, &c.values, &c.not_values)).collect();
    let mut bad = |key: &str, reason: String| {
        when.push(Condition::Unenforceable { key: key.to_owned(), reason });
    };
    let from = r
        .from
        .iter()
        .map(|s| authz::Source {
            principals: Pattern::parse_all(&s.principals),
            not_principals: Pattern::parse_all(&s.not_principals),
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
