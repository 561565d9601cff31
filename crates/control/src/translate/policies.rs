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
        // Not an action (a typo such as `deny`): see `convert`. Files are decoded strictly, so
        // only the Kubernetes API (decoded leniently) can bring one.
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
    let mut notes = Notes::default();
    let out = translate(&ctx.settings.root_namespace, n, ap, &mut notes);
    if out.is_none() {
        debug!(policy = %n, action = ap.spec.action, "not a policy for node proxies");
    }
    for r in notes.rules.iter().filter(|r| r.dropped) {
        warn!(policy = %n, rule = r.index, "ALLOW rule with L7 attributes dropped for node proxies: the policy allows less than written until a waypoint enforces it");
    }
    if notes.unknown_action {
        warn!(policy = %n, action = ap.spec.action, "unknown action; the policy denies everything it selects");
    }
    for i in &notes.ignored {
        warn!(policy = %n, field = i.path, value = i.value, "{}; value ignored", i.problem);
    }
    out
}

/// What the translation of one policy did that its author should know (the policy report of
/// [`super::explain`] is built from it).
#[derive(Debug, Default)]
pub(crate) struct Notes {
    /// The rules that name L7 attributes.
    pub rules: Vec<RuleNote>,
    /// Values that are not what their field takes.
    pub ignored: Vec<Ignored>,
    /// The action is not ALLOW, DENY, AUDIT or CUSTOM: the policy fails closed.
    pub unknown_action: bool,
}

/// One rule with L7 attributes.
#[derive(Debug)]
pub(crate) struct RuleNote {
    /// Its index in `spec.rules`.
    pub index: usize,
    /// The paths of the L7 fields, from `spec` (`rules[0].to[0].operation.methods`).
    pub paths: Vec<String>,
    /// Their names as istiod's status lists them (`methods`, `request.headers[x]`).
    pub names: Vec<String>,
    /// Whether the rule is left out (ALLOW); a DENY rule keeps its L4 part.
    pub dropped: bool,
    /// The rule as node proxies enforce it (DENY only).
    pub enforced: Option<Rule>,
}

/// A value the translation could not use.
#[derive(Debug)]
pub(crate) struct Ignored {
    /// Its field, from `spec`.
    pub path: String,
    /// The value.
    pub value: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// [`convert`] without logging, with what it did in `notes`.
pub(crate) fn translate(
    root_namespace: &str,
    n: &Name,
    ap: &AuthorizationPolicy,
    notes: &mut Notes,
) -> Option<Authorization> {
    let action = enforced(ap)?;
    let scope = if ap.spec.selector.is_some() {
        Scope::WorkloadSelector
    } else if n.ns == root_namespace {
        Scope::Global
    } else {
        Scope::Namespace
    };
    let deny = action == Action::Deny;
    let known = matches!(ap.spec.action.as_str(), "" | "ALLOW" | "DENY");
    // A policy whose action we cannot read fails closed: an ALLOW with no rules, which denies
    // every connection to what it selects, instead of silently opening what the user restricted.
    let rules = if known {
        let mut rules = Vec::new();
        for (i, r) in ap.spec.rules.iter().enumerate() {
            if let Some(r) = rule(&n.ns, i, r, deny, notes) {
                rules.push(r);
            }
        }
        rules
    } else {
        notes.unknown_action = true;
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
fn rule(
    ns: &str,
    index: usize,
    r: &ambit_objects::istio::Rule,
    deny: bool,
    notes: &mut Notes,
) -> Option<Rule> {
    let mut clauses = Vec::new();
    let mut l7 = L7::default();
    let push = |matches: Vec<Option<Match>>, clauses: &mut Vec<Clause>| {
        if matches.is_empty() {
            return;
        }
        // Some(m) with only L4 fields; None: an entry with only L7 fields (matches all in DENY).
        if matches.iter().any(Option::is_none) && deny {
            return;
        }
        clauses.push(Clause { matches: matches.into_iter().flatten().collect() });
    };
    let at = format!("rules[{index}]");
    let to: Vec<Option<Match>> =
        r.to.iter()
            .enumerate()
            .map(|(i, t)| operation(&format!("{at}.to[{i}].operation"), &t.operation, &mut l7, notes))
            .collect();
    push(to, &mut clauses);
    let from: Vec<Option<Match>> = r
        .from
        .iter()
        .enumerate()
        .map(|(i, f)| source(ns, &format!("{at}.from[{i}].source"), &f.source, &mut l7, notes))
        .collect();
    push(from, &mut clauses);
    for (i, c) in r.when.iter().enumerate() {
        let m = condition(&format!("{at}.when[{i}]"), c, &mut l7, notes);
        push(vec![m], &mut clauses);
    }
    let out = Rule { clauses };
    if !l7.paths.is_empty() {
        l7.names.sort();
        l7.names.dedup();
        notes.rules.push(RuleNote {
            index,
            paths: l7.paths,
            names: l7.names,
            dropped: !deny,
            enforced: deny.then(|| out.clone()),
        });
        if !deny {
            return None;
        }
    }
    Some(out)
}

/// The L7 fields found in one rule.
#[derive(Default)]
struct L7 {
    paths: Vec<String>,
    names: Vec<String>,
}

impl L7 {
    /// Notes the non-empty fields among `fields` (istiod's names) of the entry at `at`.
    fn note(&mut self, at: &str, fields: &[(&str, &Vec<String>)]) -> bool {
        let mut found = false;
        for (name, _) in fields.iter().filter(|(_, v)| !v.is_empty()) {
            self.paths.push(format!("{at}.{name}"));
            self.names.push((*name).to_owned());
            found = true;
        }
        found
    }
}

/// A `to[].operation`: its Match (`None` if it has no L4 field).
fn operation(at: &str, op: &Operation, l7: &mut L7, notes: &mut Notes) -> Option<Match> {
    let found = l7.note(
        at,
        &[
            ("hosts", &op.hosts),
            ("notHosts", &op.not_hosts),
            ("methods", &op.methods),
            ("notMethods", &op.not_methods),
            ("paths", &op.paths),
            ("notPaths", &op.not_paths),
        ],
    );
    let m = Match {
        destination_ports: ports(&format!("{at}.ports"), &op.ports, notes),
        not_destination_ports: ports(&format!("{at}.notPorts"), &op.not_ports, notes),
        ..Match::default()
    };
    finish(m, found, !op.ports.is_empty() || !op.not_ports.is_empty())
}

/// A `from[].source`.
fn source(ns: &str, at: &str, s: &Source, l7: &mut L7, notes: &mut Notes) -> Option<Match> {
    let found = l7.note(
        at,
        &[
            ("requestPrincipals", &s.request_principals),
            ("notRequestPrincipals", &s.not_request_principals),
            ("remoteIpBlocks", &s.remote_ip_blocks),
            ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
        ],
    );
    let m = Match {
        namespaces: strings(&s.namespaces),
        not_namespaces: strings(&s.not_namespaces),
        service_accounts: accounts(ns, &s.service_accounts),
        not_service_accounts: accounts(ns, &s.not_service_accounts),
        principals: strings(&s.principals),
        not_principals: strings(&s.not_principals),
        source_ips: ips(&format!("{at}.ipBlocks"), &s.ip_blocks, notes),
        not_source_ips: ips(&format!("{at}.notIpBlocks"), &s.not_ip_blocks, notes),
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
    finish(m, found, l4)
}

/// A `when[]` condition on an L4 key, else an L7 one (`None`).
fn condition(at: &str, c: &Condition, l7: &mut L7, notes: &mut Notes) -> Option<Match> {
    let mut m = Match::default();
    let values = format!("{at}.values");
    let not_values = format!("{at}.notValues");
    match c.key.as_str() {
        "source.ip" => {
            m.source_ips = ips(&values, &c.values, notes);
            m.not_source_ips = ips(&not_values, &c.not_values, notes);
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
            m.destination_ips = ips(&values, &c.values, notes);
            m.not_destination_ips = ips(&not_values, &c.not_values, notes);
        }
        "destination.port" => {
            m.destination_ports = ports(&values, &c.values, notes);
            m.not_destination_ports = ports(&not_values, &c.not_values, notes);
        }
        key => {
            l7.paths.push(format!("{at} ({key})"));
            l7.names.push(key.to_owned());
            return None;
        }
    }
    Some(m)
}

/// An entry with L4 fields keeps its Match even if every value failed to parse (then it
/// matches nothing, as istiod); an entry with only L7 fields has none.
fn finish(m: Match, l7: bool, l4: bool) -> Option<Match> {
    if l4 || !l7 { Some(m) } else { None }
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
fn ips(at: &str, values: &[String], notes: &mut Notes) -> Vec<Address> {
    values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let parsed = match v.split_once('/') {
                Some(_) => v.parse::<IpNet>().ok().map(|net| (net.addr(), u32::from(net.prefix_len()))),
                None => v.parse::<IpAddr>().ok().map(|ip| (ip, if ip.is_ipv4() { 32 } else { 128 })),
            };
            if parsed.is_none() {
                let problem = "not an IP address or CIDR";
                notes.ignored.push(Ignored { path: format!("{at}[{i}]"), value: v.clone(), problem });
            }
            parsed.map(|(ip, length)| Address { address: names::ip_bytes(ip), length })
        })
        .collect()
}

/// Port numbers; unparsable values are dropped.
fn ports(at: &str, values: &[String], notes: &mut Notes) -> Vec<u32> {
    values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let p = v.parse::<u16>().ok().map(u32::from);
            if p.is_none() {
                let problem = "not a port number";
                notes.ignored.push(Ignored { path: format!("{at}[{i}]"), value: v.clone(), problem });
            }
            p
        })
        .collect()
}
