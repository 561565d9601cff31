//! AuthorizationPolicy → `istio.security.Authorization` (`control-plane.md` §4.1,
//! `node-proxy.md` §5.5), and which selector policies a workload lists (§2.6).

use std::net::IpAddr;

use ambit_api::security::{
    Action, Address, Authorization, Clause, Match, Rule, Scope, ServiceAccountMatch, StringMatch,
    string_match,
};
use ambit_objects::istio::{AuthorizationPolicy, Condition, Operation, Source};
use ipnet::IpNet;
use tracing::{debug, warn};

use super::Ctx;
use super::names::{self, Labels, Name};

/// Whether the policy is sent to node proxies at all: ALLOW, DENY or an unknown action, no
/// targetRef, not dry-run. AUDIT and CUSTOM are for waypoints.
pub(crate) fn enforced(ap: &AuthorizationPolicy) -> Option<Action> {
    let action = match ap.spec.action.as_str() {
        "" | "ALLOW" => Action::Allow,
        "DENY" => Action::Deny,
        "AUDIT" | "CUSTOM" => return None,
        // Not an action (a typo such as `deny`): see `convert`.
        _ => Action::Allow,
    };
    if ap.spec.target_ref.is_some() || !ap.spec.target_refs.is_empty() {
        return None;
    }
    let dry_run = names::annotations(&ap.metadata)
        .get(names::DRY_RUN_ANNOTATION)
        .and_then(|v| names::parse_bool(v))
        .unwrap_or(false);
    (!dry_run).then_some(action)
}

/// The policy as node proxies enforce it, or `None` if it is not for them.
pub(crate) fn convert(ctx: &Ctx<'_>, n: &Name, ap: &AuthorizationPolicy) -> Option<Authorization> {
    let Some(action) = enforced(ap) else {
        debug!(policy = %n, action = ap.spec.action, "not a policy for node proxies");
        return None;
    };
    let scope = if ap.spec.selector.is_some() {
        Scope::WorkloadSelector
    } else if n.ns == ctx.settings.root_namespace {
        Scope::Global
    } else {
        Scope::Namespace
    };
    let deny = action == Action::Deny;
    let known = matches!(ap.spec.action.as_str(), "" | "ALLOW" | "DENY");
    // A policy whose action we cannot read fails closed: an ALLOW with no rules, which denies
    // every connection to what it selects, instead of silently opening what the user restricted.
    let rules = if known {
        ap.spec.rules.iter().filter_map(|r| rule(n, r, deny)).collect()
    } else {
        warn!(policy = %n, action = ap.spec.action, "unknown action; the policy denies everything it selects");
        Vec::new()
    };
    Some(Authorization {
        name: n.name.clone(),
        namespace: n.ns.clone(),
        scope: scope as i32,
        action: action as i32,
        rules,
        ..Authorization::default()
    })
}

/// The selector policies a workload in `ns` with `labels` lists: its namespace's and the root
/// namespace's, sorted (§2.6 step 1).
pub(crate) fn selected(ctx: &Ctx<'_>, ns: &str, labels: &Labels) -> Vec<String> {
    let mut out = Vec::new();
    let root = ctx.settings.root_namespace.as_str();
    for pns in if ns == root { vec![ns] } else { vec![ns, root] } {
        let Some(objects) = ctx.store.ns(pns) else { continue };
        for name in &objects.auth {
            let n = Name::new(pns, name.as_str());
            let Some(ap) = ctx.store.auth.get(&n) else { continue };
            let Some(sel) = &ap.spec.selector else { continue };
            // An empty selector selects every workload (Kubernetes selector semantics).
            if enforced(ap).is_some() && names::subset(&sel.match_labels, labels) {
                out.push(n.to_string());
            }
        }
    }
    out.sort();
    out
}

/// One AP rule → one Rule: a clause for all `to`, one for all `from`, one per `when`.
///
/// L7 attributes cannot be seen by a node proxy. In an ALLOW rule they drop the rule (it can
/// only allow less). In a DENY rule they are treated as matching, so the rule denies at least
/// what the user wrote: an entry left with no L4 field matches everything, which makes its
/// clause match everything, so the clause is left out. (istiod keeps an empty Match there,
/// which node proxies never match, so the DENY silently stops denying.)
fn rule(n: &Name, r: &ambit_objects::istio::Rule, deny: bool) -> Option<Rule> {
    let mut clauses = Vec::new();
    let mut l7 = false;
    let mut push = |matches: Vec<Option<Match>>, l7_found: bool, clauses: &mut Vec<Clause>| {
        l7 |= l7_found;
        if matches.is_empty() {
            return;
        }
        // Some(m) with only L4 fields; None: an entry with only L7 fields (matches all in DENY).
        if matches.iter().any(Option::is_none) && deny {
            return;
        }
        clauses.push(Clause { matches: matches.into_iter().flatten().collect() });
    };
    let to: Vec<(Option<Match>, bool)> = r.to.iter().map(|t| operation(n, &t.operation)).collect();
    let to_l7 = to.iter().any(|(_, l)| *l);
    push(to.into_iter().map(|(m, _)| m).collect(), to_l7, &mut clauses);
    let from: Vec<(Option<Match>, bool)> = r.from.iter().map(|f| source(n, &f.source)).collect();
    let from_l7 = from.iter().any(|(_, l)| *l);
    push(from.into_iter().map(|(m, _)| m).collect(), from_l7, &mut clauses);
    for c in &r.when {
        let (m, is_l7) = condition(n, c);
        push(vec![m], is_l7, &mut clauses);
    }
    if l7 && !deny {
        debug!(policy = %n, "ALLOW rule with L7 attributes dropped for node proxies");
        return None;
    }
    Some(Rule { clauses })
}

/// A `to[].operation`: its Match (`None` if it has no L4 field) and whether it had L7 fields.
fn operation(n: &Name, op: &Operation) -> (Option<Match>, bool) {
    let l7 = [&op.hosts, &op.not_hosts, &op.methods, &op.not_methods, &op.paths, &op.not_paths]
        .iter()
        .any(|v| !v.is_empty());
    let m = Match {
        destination_ports: ports(n, &op.ports),
        not_destination_ports: ports(n, &op.not_ports),
        ..Match::default()
    };
    finish(m, l7, !op.ports.is_empty() || !op.not_ports.is_empty())
}

/// A `from[].source`.
fn source(n: &Name, s: &Source) -> (Option<Match>, bool) {
    let l7 = [&s.request_principals, &s.not_request_principals, &s.remote_ip_blocks, &s.not_remote_ip_blocks]
        .iter()
        .any(|v| !v.is_empty());
    let ns = n.ns.as_str();
    let m = Match {
        namespaces: strings(&s.namespaces),
        not_namespaces: strings(&s.not_namespaces),
        service_accounts: accounts(ns, &s.service_accounts),
        not_service_accounts: accounts(ns, &s.not_service_accounts),
        principals: strings(&s.principals),
        not_principals: strings(&s.not_principals),
        source_ips: ips(n, &s.ip_blocks),
        not_source_ips: ips(n, &s.not_ip_blocks),
        ..Match::default()
    };
    let l4 = [
        &s.namespaces,
        &s.not_namespaces,
        &s.service_accounts,
        &s.not_service_accounts,
        &s.principals,
        &s.not_principals,
        &s.ip_blocks,
        &s.not_ip_blocks,
    ]
    .iter()
    .any(|v| !v.is_empty());
    finish(m, l7, l4)
}

/// A `when[]` condition on an L4 key, else an L7 one.
fn condition(n: &Name, c: &Condition) -> (Option<Match>, bool) {
    let mut m = Match::default();
    match c.key.as_str() {
        "source.ip" => {
            m.source_ips = ips(n, &c.values);
            m.not_source_ips = ips(n, &c.not_values);
        }
        "source.namespace" => {
            m.namespaces = strings(&c.values);
            m.not_namespaces = strings(&c.not_values);
        }
        "source.principal" => {
            m.principals = strings(&c.values);
            m.not_principals = strings(&c.not_values);
        }
        "destination.ip" => {
            m.destination_ips = ips(n, &c.values);
            m.not_destination_ips = ips(n, &c.not_values);
        }
        "destination.port" => {
            m.destination_ports = ports(n, &c.values);
            m.not_destination_ports = ports(n, &c.not_values);
        }
        _ => return (None, true),
    }
    (Some(m), false)
}

/// An entry with L4 fields keeps its Match even if every value failed to parse (then it
/// matches nothing, as istiod); an entry with only L7 fields has none.
fn finish(m: Match, l7: bool, l4: bool) -> (Option<Match>, bool) {
    if l4 || !l7 { (Some(m), l7) } else { (None, l7) }
}

/// `*` ⇒ presence, `*x` ⇒ suffix, `x*` ⇒ prefix, else exact.
fn strings(values: &[String]) -> Vec<StringMatch> {
    values
        .iter()
        .map(|v| {
            let m = if v == "*" {
                string_match::MatchType::Presence(())
            } else if let Some(s) = v.strip_prefix('*') {
                string_match::MatchType::Suffix(s.to_owned())
            } else if let Some(p) = v.strip_suffix('*') {
                string_match::MatchType::Prefix(p.to_owned())
            } else {
                string_match::MatchType::Exact(v.clone())
            };
            StringMatch { match_type: Some(m) }
        })
        .collect()
}

/// `sa` (the policy's namespace) or `ns/sa`.
fn accounts(ns: &str, values: &[String]) -> Vec<ServiceAccountMatch> {
    values
        .iter()
        .map(|v| match v.split_once('/') {
            Some((ns, sa)) => {
                ServiceAccountMatch { namespace: ns.to_owned(), service_account: sa.to_owned() }
            }
            None => ServiceAccountMatch { namespace: ns.to_owned(), service_account: v.clone() },
        })
        .collect()
}

/// IPs or CIDRs; a CIDR keeps its address bytes unmasked. Unparsable values are dropped.
fn ips(n: &Name, values: &[String]) -> Vec<Address> {
    values
        .iter()
        .filter_map(|v| {
            let parsed = match v.split_once('/') {
                Some(_) => v.parse::<IpNet>().ok().map(|net| (net.addr(), u32::from(net.prefix_len()))),
                None => v.parse::<IpAddr>().ok().map(|ip| (ip, if ip.is_ipv4() { 32 } else { 128 })),
            };
            if parsed.is_none() {
                warn!(policy = %n, value = v, "not an IP address or CIDR; value ignored");
            }
            parsed.map(|(ip, length)| Address { address: names::ip_bytes(ip), length })
        })
        .collect()
}

/// Port numbers; unparsable values are dropped.
fn ports(n: &Name, values: &[String]) -> Vec<u32> {
    values
        .iter()
        .filter_map(|v| {
            let p = v.parse::<u16>().ok().map(u32::from);
            if p.is_none() {
                warn!(policy = %n, value = v, "not a port number; value ignored");
            }
            p
        })
        .collect()
}
