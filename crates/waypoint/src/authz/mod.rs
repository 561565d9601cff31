//! HTTP authorization as Istio's AuthorizationPolicy defines it and Envoy's RBAC filter enforces
//! it in a waypoint: policies as typed values, matched against one [`Request`].
//!
//! Evaluation order (Envoy RBAC as istiod configures it): any matching DENY policy denies;
//! otherwise, when ALLOW policies exist, one of them must match; with none, the request is
//! allowed. AUDIT policies never decide, the [`Verdict`] lists those that matched. CUSTOM (external
//! authorization) is not supported: [`Action`] cannot hold it and parsing it is an error.
//!
//! Within a policy, rules are OR-ed; a rule needs its `from`, `to` and `when` to match (an empty
//! list matches); `from` and `to` are OR-ed lists of sources and operations, each of which
//! needs every field it sets; `when` conditions are AND-ed. For every field, the request must
//! match one of the values (when there are any) and none of the negated ones.

mod path;
mod pattern;
mod request;

use std::fmt;
use std::str::FromStr;

use ipnet::IpNet;
use thiserror::Error;

pub use path::{PathError, normalize_path};
pub use pattern::{Glob, Pattern};
pub use request::{Request, remote_ip};

/// What a policy does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The request is allowed if this or another ALLOW policy matches (and no DENY does).
    Allow,
    /// The request is denied if this matches.
    Deny,
    /// A match is recorded in the verdict; the decision does not change.
    Audit,
}

/// An AuthorizationPolicy action the waypoint cannot enforce (CUSTOM) or does not know.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("authorization action {0:?} is not supported (ALLOW, DENY and AUDIT are)")]
pub struct UnsupportedAction(pub String);

/// One AuthorizationPolicy, as attached to this waypoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The policy's name.
    pub name: String,
    /// The policy's namespace.
    pub namespace: String,
    /// What a match does.
    pub action: Action,
    /// OR-ed; a policy without rules matches nothing (so an ALLOW one allows nothing).
    pub rules: Vec<Rule>,
}

/// One rule: `from`, `to` and `when` must all match; an empty list matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// OR-ed sources.
    pub from: Vec<Source>,
    /// OR-ed operations.
    pub to: Vec<Operation>,
    /// AND-ed conditions.
    pub when: Vec<Condition>,
}

/// Who sends the request; every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    /// Peer identities without `spiffe://` (`cluster.local/ns/NS/sa/SA`).
    pub principals: Vec<Pattern>,
    /// Negated `principals`.
    pub not_principals: Vec<Pattern>,
    /// The namespace of the peer identity.
    pub namespaces: Vec<Glob>,
    /// Negated `namespaces`.
    pub not_namespaces: Vec<Glob>,
    /// The downstream peer address.
    pub ip_blocks: Vec<IpNet>,
    /// Negated `ip_blocks`.
    pub not_ip_blocks: Vec<IpNet>,
    /// The original client address (see [`remote_ip`]).
    pub remote_ip_blocks: Vec<IpNet>,
    /// Negated `remote_ip_blocks`.
    pub not_remote_ip_blocks: Vec<IpNet>,
    /// JWT principals (`iss/sub`). No JWT is validated yet, so a request never has one: a
    /// positive list never matches and a negated one always passes.
    pub request_principals: Vec<Pattern>,
    /// Negated `request_principals`.
    pub not_request_principals: Vec<Pattern>,
}

/// What the request asks for; every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Operation {
    /// The `:authority`, case-insensitively, port included as sent.
    pub hosts: Vec<Pattern>,
    /// Negated `hosts`.
    pub not_hosts: Vec<Pattern>,
    /// The destination port.
    pub ports: Vec<u16>,
    /// Negated `ports`.
    pub not_ports: Vec<u16>,
    /// The method, case-sensitively.
    pub methods: Vec<Pattern>,
    /// Negated `methods`.
    pub not_methods: Vec<Pattern>,
    /// The normalized path without its query.
    pub paths: Vec<Pattern>,
    /// Negated `paths`.
    pub not_paths: Vec<Pattern>,
}

/// One `when` condition, by the attribute it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// `request.headers[NAME]`: `*` means present, other patterns match all values joined by `,`.
    RequestHeader {
        /// The header's name (lower-case).
        name: http::HeaderName,
        /// Positive patterns.
        values: Vec<Pattern>,
        /// Negated patterns.
        not_values: Vec<Pattern>,
    },
    /// `source.ip`: the downstream peer address.
    SourceIp {
        /// Positive blocks.
        values: Vec<IpNet>,
        /// Negated blocks.
        not_values: Vec<IpNet>,
    },
    /// `remote.ip`: the original client address.
    RemoteIp {
        /// Positive blocks.
        values: Vec<IpNet>,
        /// Negated blocks.
        not_values: Vec<IpNet>,
    },
    /// `source.namespace`.
    SourceNamespace {
        /// Positive globs.
        values: Vec<Glob>,
        /// Negated globs.
        not_values: Vec<Glob>,
    },
    /// `source.principal` (without `spiffe://`).
    SourcePrincipal {
        /// Positive patterns.
        values: Vec<Pattern>,
        /// Negated patterns.
        not_values: Vec<Pattern>,
    },
    /// `destination.ip`.
    DestinationIp {
        /// Positive blocks.
        values: Vec<IpNet>,
        /// Negated blocks.
        not_values: Vec<IpNet>,
    },
    /// `destination.port`.
    DestinationPort {
        /// Positive ports.
        values: Vec<u16>,
        /// Negated ports.
        not_values: Vec<u16>,
    },
    /// `connection.sni`: the TLS server name (empty without one).
    ConnectionSni {
        /// Positive patterns.
        values: Vec<Pattern>,
        /// Negated patterns.
        not_values: Vec<Pattern>,
    },
    /// `request.auth.principal`, `.audiences`, `.presenter`, `.claims[…]`: JWT attributes. No JWT
    /// is validated yet, so positive values never match and negated ones always pass.
    RequestAuth {
        /// The attribute, as written.
        key: String,
        /// Positive values.
        values: Vec<String>,
        /// Negated values.
        not_values: Vec<String>,
    },
    /// A condition the waypoint cannot enforce as written. It is never ignored: in an ALLOW
    /// policy its rule never matches, in DENY and AUDIT policies it counts as matched (the
    /// narrower allow, the wider deny, as istiod does with attributes it cannot translate).
    /// [`PolicySet::unenforceable`] lists them for the caller to report.
    Unenforceable {
        /// The attribute, as written.
        key: String,
        /// Why it cannot be enforced.
        reason: String,
    },
}

/// The outcome of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Allowed or denied.
    pub decision: Decision,
    /// The AUDIT policies (`namespace/name`) that matched, in policy order.
    pub audited: Vec<String>,
}

/// Allowed or denied, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The request may proceed.
    Allow,
    /// The request is answered 403.
    Deny {
        /// The DENY policy (`namespace/name`) that matched; `None` when no ALLOW policy matched.
        policy: Option<String>,
        /// Why.
        reason: DenyReason,
    },
}

/// Why a request was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// A DENY policy matched.
    DenyPolicyMatched,
    /// ALLOW policies exist and none matched.
    NoAllowPolicyMatched,
}

/// A condition that cannot be enforced as written, with the policy it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unenforceable {
    /// The policy (`namespace/name`).
    pub policy: String,
    /// The policy's action, which decides what happens instead.
    pub action: Action,
    /// The attribute, as written.
    pub key: String,
    /// Why it cannot be enforced.
    pub reason: String,
}

/// The policies attached to one waypoint, ready to authorize requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySet {
    policies: Vec<Policy>,
}

impl FromStr for Action {
    type Err = UnsupportedAction;

    /// Reads `ALLOW`, `DENY` or `AUDIT` (Istio's spelling; empty is Istio's default, ALLOW).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "" | "ALLOW" => Ok(Action::Allow),
            "DENY" => Ok(Action::Deny),
            "AUDIT" => Ok(Action::Audit),
            other => Err(UnsupportedAction(other.to_owned())),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Allow => "ALLOW",
            Action::Deny => "DENY",
            Action::Audit => "AUDIT",
        })
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DenyReason::DenyPolicyMatched => "a DENY policy matched",
            DenyReason::NoAllowPolicyMatched => "no ALLOW policy matched",
        })
    }
}

impl fmt::Display for Unenforceable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let instead = match self.action {
            Action::Allow => "its rule never allows",
            Action::Deny => "its rule denies as if the condition held",
            Action::Audit => "its rule audits as if the condition held",
        };
        write!(
            f,
            "{} ({}): condition {:?} cannot be enforced: {}; {instead}",
            self.policy, self.action, self.key, self.reason
        )
    }
}

impl Policy {
    /// `namespace/name`, the policy's name in verdicts and logs.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn matches(&self, request: &Request<'_>, path: &str) -> bool {
        self.rules.iter().any(|rule| rule.matches(request, path, self.action))
    }

    fn matches_connection(&self, request: &Request<'_>) -> bool {
        self.rules.iter().any(|rule| rule.matches_connection(request, self.action))
    }
}

impl Rule {
    fn matches(&self, request: &Request<'_>, path: &str, action: Action) -> bool {
        (self.from.is_empty() || self.from.iter().any(|s| s.matches(request)))
            && (self.to.is_empty() || self.to.iter().any(|o| o.matches(request, path)))
            && self.when.iter().all(|c| c.matches(request, action))
    }

    /// A TCP connection has no HTTP attributes: as istiod builds a TCP filter chain's RBAC, an
    /// ALLOW rule that reads one never matches, and DENY and AUDIT rules match with those
    /// fields left out (the wider deny).
    fn matches_connection(&self, request: &Request<'_>, action: Action) -> bool {
        if action == Action::Allow && self.reads_http() {
            return false;
        }
        (self.from.is_empty() || self.from.iter().any(|s| s.matches_connection(request)))
            && (self.to.is_empty() || self.to.iter().any(|o| o.matches_connection(request)))
            && self.when.iter().filter(|c| !c.is_http_only()).all(|c| c.matches(request, action))
    }

    /// Whether the rule reads an attribute only HTTP requests have.
    fn reads_http(&self) -> bool {
        self.from.iter().any(|s| !s.request_principals.is_empty() || !s.not_request_principals.is_empty())
            || self.to.iter().any(|o| {
                !(o.hosts.is_empty()
                    && o.not_hosts.is_empty()
                    && o.methods.is_empty()
                    && o.not_methods.is_empty()
                    && o.paths.is_empty()
                    && o.not_paths.is_empty())
            })
            || self.when.iter().any(Condition::is_http_only)
    }
}

impl Source {
    fn matches(&self, request: &Request<'_>) -> bool {
        let namespace = request.source_namespace();
        field(&self.principals, &self.not_principals, |p| principal_matches(p, request.source_principal))
            && field(&self.namespaces, &self.not_namespaces, |g| namespace.is_some_and(|ns| g.matches(ns)))
            && field(&self.ip_blocks, &self.not_ip_blocks, |net| net.contains(&request.source_ip))
            && field(&self.remote_ip_blocks, &self.not_remote_ip_blocks, |net| {
                net.contains(&request.remote_ip)
            })
            && field(&self.request_principals, &self.not_request_principals, |_| false)
    }

    fn matches_connection(&self, request: &Request<'_>) -> bool {
        let namespace = request.source_namespace();
        field(&self.principals, &self.not_principals, |p| principal_matches(p, request.source_principal))
            && field(&self.namespaces, &self.not_namespaces, |g| namespace.is_some_and(|ns| g.matches(ns)))
            && field(&self.ip_blocks, &self.not_ip_blocks, |net| net.contains(&request.source_ip))
            && field(&self.remote_ip_blocks, &self.not_remote_ip_blocks, |net| {
                net.contains(&request.remote_ip)
            })
    }
}

impl Operation {
    /// Hosts: istiod's `HostMatcher` on `:authority` (`*` = present, else case-insensitive).
    /// The authority is compared as sent, port included: istiod strips ports only on gateways
    /// behind the `ISTIO_GATEWAY_STRIP_HOST_PORT` flag, off by default, so `example.com` does not
    /// match `example.com:8080` (istio/istio#44080; write `example.com*` or both forms).
    fn matches(&self, request: &Request<'_>, path: &str) -> bool {
        let host = |p: &Pattern| *p == Pattern::Presence || p.matches_ignore_case(request.authority);
        // Methods are a header matcher on `:method`: `*` means present, which it always is.
        let method = |p: &Pattern| *p == Pattern::Presence || p.matches(request.method);
        field(&self.hosts, &self.not_hosts, host)
            && field(&self.ports, &self.not_ports, |port| *port == request.destination_port)
            && field(&self.methods, &self.not_methods, method)
            && field(&self.paths, &self.not_paths, |p| p.matches(path))
    }

    fn matches_connection(&self, request: &Request<'_>) -> bool {
        field(&self.ports, &self.not_ports, |port| *port == request.destination_port)
    }
}

impl Condition {
    /// Reads one `when` entry: `key`, `values` and `notValues` as in the AuthorizationPolicy.
    /// Keys Istio defines for HTTP are typed; anything else, and values that do not parse,
    /// become [`Condition::Unenforceable`].
    pub fn parse<S: AsRef<str>>(key: &str, values: &[S], not_values: &[S]) -> Condition {
        let unenforceable = |reason: String| Condition::Unenforceable { key: key.to_owned(), reason };
        let strings = |list: &[S]| list.iter().map(|v| v.as_ref().to_owned()).collect::<Vec<_>>();
        let globs = |list: &[S]| list.iter().map(|v| Glob::new(v.as_ref())).collect::<Vec<_>>();
        match key {
            "source.ip" | "remote.ip" | "destination.ip" => {
                let (values, not_values) = match (ip_blocks(values), ip_blocks(not_values)) {
                    (Ok(v), Ok(n)) => (v, n),
                    (Err(bad), _) | (_, Err(bad)) => {
                        return unenforceable(format!("{bad:?} is not an IP address or CIDR block"));
                    }
                };
                match key {
                    "source.ip" => Condition::SourceIp { values, not_values },
                    "remote.ip" => Condition::RemoteIp { values, not_values },
                    _ => Condition::DestinationIp { values, not_values },
                }
            }
            "destination.port" => match (ports(values), ports(not_values)) {
                (Ok(values), Ok(not_values)) => Condition::DestinationPort { values, not_values },
                (Err(bad), _) | (_, Err(bad)) => unenforceable(format!("{bad:?} is not a port (0-65535)")),
            },
            "source.namespace" => {
                Condition::SourceNamespace { values: globs(values), not_values: globs(not_values) }
            }
            "source.principal" => Condition::SourcePrincipal {
                values: Pattern::parse_all(values),
                not_values: Pattern::parse_all(not_values),
            },
            "connection.sni" => Condition::ConnectionSni {
                values: Pattern::parse_all(values),
                not_values: Pattern::parse_all(not_values),
            },
            "request.auth.principal" | "request.auth.audiences" | "request.auth.presenter" => {
                Condition::RequestAuth {
                    key: key.to_owned(),
                    values: strings(values),
                    not_values: strings(not_values),
                }
            }
            _ if bracketed(key, "request.auth.claims").is_some_and(|claim| !claim.is_empty()) => {
                Condition::RequestAuth {
                    key: key.to_owned(),
                    values: strings(values),
                    not_values: strings(not_values),
                }
            }
            _ if key.starts_with("request.headers") => {
                let Some(name) = bracketed(key, "request.headers") else {
                    return unenforceable(
                        "the header name must be in brackets: request.headers[NAME]".into(),
                    );
                };
                if name.starts_with(':') {
                    return unenforceable(format!("pseudo-header {name:?} is not supported yet"));
                }
                match http::HeaderName::from_bytes(name.as_bytes()) {
                    Ok(name) => Condition::RequestHeader {
                        name,
                        values: Pattern::parse_all(values),
                        not_values: Pattern::parse_all(not_values),
                    },
                    Err(_) => unenforceable(format!("{name:?} is not a valid header name")),
                }
            }
            _ if key.starts_with("experimental.envoy.filters.") => {
                unenforceable("Envoy filter metadata does not exist in Ambit's waypoint".into())
            }
            _ => unenforceable("not an attribute Istio defines for HTTP requests".into()),
        }
    }

    /// Whether the condition reads an attribute only HTTP requests have (a header, a JWT).
    fn is_http_only(&self) -> bool {
        matches!(self, Condition::RequestHeader { .. } | Condition::RequestAuth { .. })
    }

    fn matches(&self, request: &Request<'_>, action: Action) -> bool {
        match self {
            Condition::RequestHeader { name, values, not_values } => {
                let header = request.header(name);
                field(values, not_values, |p| match p {
                    Pattern::Presence => header.is_some(),
                    _ => header.as_deref().is_some_and(|v| p.matches(v)),
                })
            }
            Condition::SourceIp { values, not_values } => {
                field(values, not_values, |net| net.contains(&request.source_ip))
            }
            Condition::RemoteIp { values, not_values } => {
                field(values, not_values, |net| net.contains(&request.remote_ip))
            }
            Condition::DestinationIp { values, not_values } => {
                field(values, not_values, |net| net.contains(&request.destination_ip))
            }
            Condition::SourceNamespace { values, not_values } => {
                let namespace = request.source_namespace();
                field(values, not_values, |g| namespace.is_some_and(|ns| g.matches(ns)))
            }
            Condition::SourcePrincipal { values, not_values } => {
                field(values, not_values, |p| principal_matches(p, request.source_principal))
            }
            Condition::DestinationPort { values, not_values } => {
                field(values, not_values, |port| *port == request.destination_port)
            }
            Condition::ConnectionSni { values, not_values } => {
                field(values, not_values, |p| p.matches(request.sni.unwrap_or_default()))
            }
            Condition::RequestAuth { values, not_values, .. } => field(values, not_values, |_| false),
            Condition::Unenforceable { .. } => action != Action::Allow,
        }
    }
}

impl PolicySet {
    /// The policies, in the order verdicts list audit matches.
    pub fn new(policies: Vec<Policy>) -> Self {
        PolicySet { policies }
    }

    /// The policies held.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// Decides one request. A path that cannot be normalized is an error: answer 400.
    pub fn authorize(&self, request: &Request<'_>) -> Result<Verdict, PathError> {
        let path = normalize_path(request.path)?;
        let matching = |action: Action| {
            self.policies.iter().filter(move |p| p.action == action).filter(|p| p.matches(request, &path))
        };
        let audited = matching(Action::Audit).map(Policy::key).collect();
        let decision = if let Some(deny) = matching(Action::Deny).next() {
            Decision::Deny { policy: Some(deny.key()), reason: DenyReason::DenyPolicyMatched }
        } else if !self.policies.iter().any(|p| p.action == Action::Allow)
            || matching(Action::Allow).next().is_some()
        {
            Decision::Allow
        } else {
            Decision::Deny { policy: None, reason: DenyReason::NoAllowPolicyMatched }
        };
        Ok(Verdict { decision, audited })
    }

    /// Decides one TCP connection (its HTTP fields in `request` are not read). Rules that read
    /// HTTP attributes: in ALLOW policies they never match; in DENY and AUDIT policies they
    /// match on their other fields (istiod's TCP RBAC, Istio's "TCP traffic" task).
    pub fn authorize_connection(&self, request: &Request<'_>) -> Verdict {
        let matching = |action: Action| {
            self.policies.iter().filter(move |p| p.action == action).filter(|p| p.matches_connection(request))
        };
        let audited = matching(Action::Audit).map(Policy::key).collect();
        let decision = if let Some(deny) = matching(Action::Deny).next() {
            Decision::Deny { policy: Some(deny.key()), reason: DenyReason::DenyPolicyMatched }
        } else if !self.policies.iter().any(|p| p.action == Action::Allow)
            || matching(Action::Allow).next().is_some()
        {
            Decision::Allow
        } else {
            Decision::Deny { policy: None, reason: DenyReason::NoAllowPolicyMatched }
        };
        Verdict { decision, audited }
    }

    /// Every condition that cannot be enforced as written, for the caller to report.
    pub fn unenforceable(&self) -> Vec<Unenforceable> {
        let mut found = Vec::new();
        for policy in &self.policies {
            for condition in policy.rules.iter().flat_map(|r| &r.when) {
                if let Condition::Unenforceable { key, reason } = condition {
                    found.push(Unenforceable {
                        policy: policy.key(),
                        action: policy.action,
                        key: key.clone(),
                        reason: reason.clone(),
                    });
                }
            }
        }
        found
    }
}

/// One field: one of `values` must match (when there are any) and none of `not_values`.
fn field<T>(values: &[T], not_values: &[T], matches: impl Fn(&T) -> bool) -> bool {
    (values.is_empty() || values.iter().any(&matches)) && !not_values.iter().any(&matches)
}

/// istiod matches principals against the peer's URI SAN with `spiffe://` put in front of the
/// value (`StringMatcherWithPrefix`), and `*` as the regex `.+`; no peer identity never matches.
fn principal_matches(pattern: &Pattern, principal: Option<&str>) -> bool {
    let Some(uri) = principal else {
        return false;
    };
    match pattern {
        Pattern::Presence => !uri.is_empty(),
        _ => uri.strip_prefix("spiffe://").is_some_and(|rest| pattern.matches(rest)),
    }
}

/// `prefix[NAME]` → `NAME`.
fn bracketed<'k>(key: &'k str, prefix: &str) -> Option<&'k str> {
    key.strip_prefix(prefix)?.strip_prefix('[')?.strip_suffix(']')
}

/// IP addresses (a full-length block) or CIDR blocks, as istiod's `AddrStrToCidrRange`.
fn ip_blocks<S: AsRef<str>>(values: &[S]) -> Result<Vec<IpNet>, String> {
    values
        .iter()
        .map(|v| {
            let v = v.as_ref();
            v.parse::<IpNet>()
                .or_else(|_| v.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| v.to_owned())
        })
        .collect()
}

fn ports<S: AsRef<str>>(values: &[S]) -> Result<Vec<u16>, String> {
    values.iter().map(|v| v.as_ref().parse::<u16>().map_err(|_| v.as_ref().to_owned())).collect()
}

#[cfg(test)]
mod tests;
