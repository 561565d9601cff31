//! Deciding one connection against a set of selected policies (Istio's L4 RBAC semantics).
//!
//! Evaluation is on the connection hot path: it walks the policies once and never allocates,
//! except for the policy key carried by an explicit deny.

use std::fmt;
use std::net::IpAddr;

use ambit_identity::Identity;
use ipnet::IpNet;
use tracing::{Level, debug};

use super::{Action, Authorization, Connection, Match, ServiceAccountMatch, StringMatch};

/// The outcome of authorizing one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The connection may proceed.
    Allow,
    /// The connection must be rejected.
    Deny(DenyReason),
}

/// Why a connection was denied; the Display text is the one ztunnel logs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DenyReason {
    /// An enforced DENY policy matched; carries its key `namespace/name`.
    #[error("explicitly denied by: {0}")]
    ExplicitDeny(String),
    /// Enforced ALLOW policies apply but none matched.
    #[error("allow policies exist, but none allowed")]
    NoAllowMatch,
}

/// Decides `conn` against the policies selected for its destination workload.
///
/// Order (spec §5.2): dry-run DENY policies are only logged; any matching enforced DENY
/// denies; dry-run ALLOW policies are only logged; with no enforced ALLOW policy the
/// connection is allowed, otherwise one of them must match. Scope is ignored here: selection
/// already happened. The policies are walked once, so the iterator need not be `Clone`.
pub fn evaluate<'a>(policies: impl IntoIterator<Item = &'a Authorization>, conn: &Connection) -> Decision {
    // Dry-run policies only produce logs, so they are not even evaluated unless someone
    // would see the result.
    let log_dry_run = tracing::enabled!(Level::DEBUG);
    let mut denied_by: Option<&'a Authorization> = None;
    let mut allow_policies = false;
    let mut allowed = false;
    let mut dry_allow_policies = false;
    let mut dry_allowed_by: Option<&'a Authorization> = None;

    for policy in policies {
        match (policy.action, policy.dry_run) {
            (Action::Deny, true) => {
                if log_dry_run && policy_matches(policy, conn) {
                    debug!(policy = %Key(policy), "dry-run: deny policy would deny the connection");
                }
            }
            (Action::Deny, false) => {
                if denied_by.is_none() && policy_matches(policy, conn) {
                    denied_by = Some(policy);
                    if !log_dry_run {
                        break;
                    }
                }
            }
            (Action::Allow, true) => {
                dry_allow_policies = true;
                if log_dry_run && dry_allowed_by.is_none() && policy_matches(policy, conn) {
                    dry_allowed_by = Some(policy);
                }
            }
            (Action::Allow, false) => {
                allow_policies = true;
                // Once denied or allowed, further ALLOW policies cannot change the outcome.
                if denied_by.is_none() && !allowed && policy_matches(policy, conn) {
                    allowed = true;
                }
            }
        }
    }

    if let Some(policy) = denied_by {
        return Decision::Deny(DenyReason::ExplicitDeny(policy.key()));
    }
    if log_dry_run && dry_allow_policies {
        match dry_allowed_by {
            Some(policy) => {
                debug!(policy = %Key(policy), "dry-run: allow policy would allow the connection");
            }
            None => debug!("dry-run: allow policies exist, but none would allow the connection"),
        }
    }
    if !allow_policies || allowed { Decision::Allow } else { Decision::Deny(DenyReason::NoAllowMatch) }
}

impl Match {
    /// True when no field family is set; such a match never matches.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.not_namespaces.is_empty()
            && self.service_accounts.is_empty()
            && self.not_service_accounts.is_empty()
            && self.principals.is_empty()
            && self.not_principals.is_empty()
            && self.source_ips.is_empty()
            && self.not_source_ips.is_empty()
            && self.destination_ips.is_empty()
            && self.not_destination_ips.is_empty()
            && self.destination_ports.is_empty()
            && self.not_destination_ports.is_empty()
    }

    /// Whether the connection passes every present field family.
    fn matches(&self, conn: &Connection) -> bool {
        if self.is_empty() {
            return false;
        }
        let id = conn.src_identity.as_ref();
        let (src_ip, dst_ip) = (conn.src_ip.to_canonical(), conn.dst_ip.to_canonical());
        // Cheapest families first; the result does not depend on the order.
        family(&self.destination_ports, &self.not_destination_ports, |p| *p == conn.dst_port)
            && family(&self.source_ips, &self.not_source_ips, |n| net_contains(n, src_ip))
            && family(&self.destination_ips, &self.not_destination_ips, |n| net_contains(n, dst_ip))
            && family(&self.namespaces, &self.not_namespaces, |m| {
                id.is_some_and(|id| m.matches(&id.namespace))
            })
            && family(&self.service_accounts, &self.not_service_accounts, |m| {
                id.is_some_and(|id| m.matches(id))
            })
            && family(&self.principals, &self.not_principals, |m| {
                id.is_some_and(|id| m.matches_principal(id))
            })
    }
}

impl StringMatch {
    /// Whether `value` matches; presence means non-empty.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            StringMatch::Exact(s) => value == s,
            StringMatch::Prefix(s) => value.starts_with(s.as_str()),
            StringMatch::Suffix(s) => value.ends_with(s.as_str()),
            StringMatch::Presence() => !value.is_empty(),
        }
    }

    /// Whether the identity's principal, `<td>/ns/<ns>/sa/<sa>`, matches.
    ///
    /// The principal is compared piece by piece so that no string is built per connection.
    pub fn matches_principal(&self, id: &Identity) -> bool {
        let pieces = principal_pieces(id);
        match self {
            StringMatch::Exact(s) => {
                pieces_len(&pieces) == s.len() && pieces_start_with(&pieces, s.as_bytes())
            }
            StringMatch::Prefix(s) => pieces_start_with(&pieces, s.as_bytes()),
            StringMatch::Suffix(s) => pieces_end_with(&pieces, s.as_bytes()),
            // Always non-empty: it contains "/ns/".
            StringMatch::Presence() => true,
        }
    }
}

impl ServiceAccountMatch {
    /// Whether the identity has this namespace and service account.
    pub fn matches(&self, id: &Identity) -> bool {
        self.namespace == id.namespace && self.service_account == id.service_account
    }
}

/// Whether a policy matches: any rule, where a rule is all clauses, where a clause is any
/// match. Zero rules never match; zero clauses and zero matches count as matched.
fn policy_matches(policy: &Authorization, conn: &Connection) -> bool {
    policy
        .rules
        .iter()
        .any(|rule| rule.iter().all(|clause| clause.is_empty() || clause.iter().any(|m| m.matches(conn))))
}

/// One field family: the positive list passes if empty or any element matches; the negative
/// list passes if no element matches.
fn family<T>(positive: &[T], negative: &[T], matches: impl Fn(&T) -> bool) -> bool {
    (positive.is_empty() || positive.iter().any(&matches)) && !negative.iter().any(&matches)
}

/// CIDR containment for a canonical address (IPv4-mapped IPv6 already turned into IPv4).
///
/// An IPv6 range matches an IPv4 address only if the range lies inside `::ffff:0:0/96`, so
/// that a mapped range written by a control plane still covers the addresses it names while
/// `::/0` does not swallow all IPv4 peers.
fn net_contains(net: &IpNet, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpNet::V4(net), IpAddr::V4(ip)) => net.contains(&ip),
        (IpNet::V6(net), IpAddr::V6(ip)) => net.contains(&ip),
        // A prefix shorter than /96 masks part of the `ffff` marker, so the network address
        // of such a range is not IPv4-mapped.
        (IpNet::V6(net), IpAddr::V4(ip)) => {
            net.network().to_ipv4_mapped().is_some() && net.contains(&ip.to_ipv6_mapped())
        }
        (IpNet::V4(_), IpAddr::V6(_)) => false,
    }
}

fn principal_pieces(id: &Identity) -> [&[u8]; 5] {
    [id.trust_domain.as_bytes(), b"/ns/", id.namespace.as_bytes(), b"/sa/", id.service_account.as_bytes()]
}

fn pieces_len(pieces: &[&[u8]]) -> usize {
    pieces.iter().map(|p| p.len()).sum()
}

/// Whether the concatenation of `pieces` starts with `pat`.
fn pieces_start_with(pieces: &[&[u8]], mut pat: &[u8]) -> bool {
    for piece in pieces {
        if pat.is_empty() {
            return true;
        }
        let n = piece.len().min(pat.len());
        if piece[..n] != pat[..n] {
            return false;
        }
        pat = &pat[n..];
    }
    pat.is_empty()
}

/// Whether the concatenation of `pieces` ends with `pat`.
fn pieces_end_with(pieces: &[&[u8]], mut pat: &[u8]) -> bool {
    for piece in pieces.iter().rev() {
        if pat.is_empty() {
            return true;
        }
        let n = piece.len().min(pat.len());
        if piece[piece.len() - n..] != pat[pat.len() - n..] {
            return false;
        }
        pat = &pat[..pat.len() - n];
    }
    pat.is_empty()
}

/// Displays a policy key without building a string.
struct Key<'a>(&'a Authorization);

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.0.namespace, self.0.name)
    }
}

#[cfg(test)]
pub(super) mod tests;
