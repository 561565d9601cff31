//! Conversion of xDS `istio.security.Authorization` resources into the policy model.
//!
//! Tolerated like ztunnel: an `Address` with a bad byte length or prefix length is dropped
//! from its list, a `StringMatch` with no oneof set is dropped, `extensions` are ignored.
//! Rejected (the resource is NACKed): unknown scope or action values, since guessing either
//! could open access, and destination ports above 65535, which no connection can have and
//! which ztunnel would silently truncate into a different port.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ambit_api::security as proto;
use ipnet::IpNet;

use super::{Action, Authorization, Match, Scope, ServiceAccountMatch, StringMatch};

/// Why an xDS Authorization resource cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// The scope enum value is not GLOBAL, NAMESPACE or WORKLOAD_SELECTOR.
    #[error(
        "unknown scope value {0} (known: 0 GLOBAL, 1 NAMESPACE, 2 WORKLOAD_SELECTOR); is the control plane newer than this proxy?"
    )]
    UnknownScope(i32),
    /// The action enum value is not ALLOW or DENY.
    #[error("unknown action value {0} (known: 0 ALLOW, 1 DENY); is the control plane newer than this proxy?")]
    UnknownAction(i32),
    /// A destination port does not fit in 16 bits.
    #[error("destination port {0} is above 65535; fix the policy in the control plane")]
    PortOutOfRange(u32),
    /// An error inside the policy with this key (`namespace/name`).
    #[error("authorization policy {policy}: {error}")]
    InPolicy {
        /// The policy key.
        policy: String,
        /// What is wrong with it.
        error: Box<ConvertError>,
    },
}

impl TryFrom<&proto::Authorization> for Authorization {
    type Error = ConvertError;

    fn try_from(p: &proto::Authorization) -> Result<Self, Self::Error> {
        let in_policy = |error| ConvertError::InPolicy {
            policy: format!("{}/{}", p.namespace, p.name),
            error: Box::new(error),
        };
        let scope =
            proto::Scope::try_from(p.scope).map_err(|_| in_policy(ConvertError::UnknownScope(p.scope)))?;
        let action = proto::Action::try_from(p.action)
            .map_err(|_| in_policy(ConvertError::UnknownAction(p.action)))?;
        let rules = p
            .rules
            .iter()
            .map(|rule| {
                rule.clauses
                    .iter()
                    .map(|clause| clause.matches.iter().map(Match::try_from).collect())
                    .collect::<Result<Vec<Vec<Match>>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(in_policy)?;
        Ok(Authorization {
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            scope: scope.into(),
            action: action.into(),
            rules,
            dry_run: p.dry_run,
        })
    }
}

impl TryFrom<proto::Authorization> for Authorization {
    type Error = ConvertError;

    fn try_from(p: proto::Authorization) -> Result<Self, Self::Error> {
        Authorization::try_from(&p)
    }
}

impl From<proto::Scope> for Scope {
    fn from(s: proto::Scope) -> Self {
        match s {
            proto::Scope::Global => Scope::Global,
            proto::Scope::Namespace => Scope::Namespace,
            proto::Scope::WorkloadSelector => Scope::WorkloadSelector,
        }
    }
}

impl From<proto::Action> for Action {
    fn from(a: proto::Action) -> Self {
        match a {
            proto::Action::Allow => Action::Allow,
            proto::Action::Deny => Action::Deny,
        }
    }
}

impl TryFrom<&proto::Match> for Match {
    type Error = ConvertError;

    fn try_from(m: &proto::Match) -> Result<Self, Self::Error> {
        Ok(Match {
            namespaces: string_matches(&m.namespaces),
            not_namespaces: string_matches(&m.not_namespaces),
            service_accounts: m.service_accounts.iter().map(Into::into).collect(),
            not_service_accounts: m.not_service_accounts.iter().map(Into::into).collect(),
            principals: string_matches(&m.principals),
            not_principals: string_matches(&m.not_principals),
            source_ips: nets(&m.source_ips),
            not_source_ips: nets(&m.not_source_ips),
            destination_ips: nets(&m.destination_ips),
            not_destination_ips: nets(&m.not_destination_ips),
            destination_ports: ports(&m.destination_ports)?,
            not_destination_ports: ports(&m.not_destination_ports)?,
        })
    }
}

impl From<&proto::ServiceAccountMatch> for ServiceAccountMatch {
    fn from(m: &proto::ServiceAccountMatch) -> Self {
        ServiceAccountMatch { namespace: m.namespace.clone(), service_account: m.service_account.clone() }
    }
}

/// Fails when no oneof is set (such a matcher is dropped from its list).
impl TryFrom<&proto::StringMatch> for StringMatch {
    type Error = MissingMatchType;

    fn try_from(m: &proto::StringMatch) -> Result<Self, Self::Error> {
        use proto::string_match::MatchType;
        match &m.match_type {
            Some(MatchType::Exact(s)) => Ok(StringMatch::Exact(s.clone())),
            Some(MatchType::Prefix(s)) => Ok(StringMatch::Prefix(s.clone())),
            Some(MatchType::Suffix(s)) => Ok(StringMatch::Suffix(s.clone())),
            Some(MatchType::Presence(())) => Ok(StringMatch::Presence()),
            None => Err(MissingMatchType),
        }
    }
}

/// A `StringMatch` with none of exact/prefix/suffix/presence set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("string match has no match type set")]
pub struct MissingMatchType;

/// Converts an `Address` (4 or 16 bytes plus a prefix length) into a CIDR.
fn address_to_net(a: &proto::Address) -> Option<IpNet> {
    let ip = match a.address.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(a.address.as_slice()).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(a.address.as_slice()).ok()?)),
        _ => return None,
    };
    IpNet::new(ip, u8::try_from(a.length).ok()?).ok()
}

fn string_matches(ms: &[proto::StringMatch]) -> Vec<StringMatch> {
    ms.iter().filter_map(|m| StringMatch::try_from(m).ok()).collect()
}

fn nets(addrs: &[proto::Address]) -> Vec<IpNet> {
    addrs.iter().filter_map(address_to_net).collect()
}

fn ports(ports: &[u32]) -> Result<Vec<u16>, ConvertError> {
    ports.iter().map(|&p| u16::try_from(p).map_err(|_| ConvertError::PortOutOfRange(p))).collect()
}

/// The policy model back into an xDS resource (for xDS servers built on this model); converting
/// the result again gives the same policy.
impl From<&Authorization> for proto::Authorization {
    fn from(p: &Authorization) -> Self {
        proto::Authorization {
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            scope: match p.scope {
                Scope::Global => proto::Scope::Global,
                Scope::Namespace => proto::Scope::Namespace,
                Scope::WorkloadSelector => proto::Scope::WorkloadSelector,
            } as i32,
            action: match p.action {
                Action::Allow => proto::Action::Allow,
                Action::Deny => proto::Action::Deny,
            } as i32,
            rules: p
                .rules
                .iter()
                .map(|rule| proto::Rule {
                    clauses: rule
                        .iter()
                        .map(|clause| proto::Clause { matches: clause.iter().map(Into::into).collect() })
                        .collect(),
                })
                .collect(),
            dry_run: p.dry_run,
            extensions: Vec::new(),
        }
    }
}

impl From<&Match> for proto::Match {
    fn from(m: &Match) -> Self {
        let strings = |v: &[StringMatch]| v.iter().map(Into::into).collect();
        let accounts = |v: &[ServiceAccountMatch]| {
            v.iter()
                .map(|a| proto::ServiceAccountMatch {
                    namespace: a.namespace.clone(),
                    service_account: a.service_account.clone(),
                })
                .collect()
        };
        let nets = |v: &[IpNet]| {
            v.iter()
                .map(|n| proto::Address {
                    address: match n.addr() {
                        IpAddr::V4(a) => a.octets().to_vec(),
                        IpAddr::V6(a) => a.octets().to_vec(),
                    },
                    length: u32::from(n.prefix_len()),
                })
                .collect()
        };
        let ports = |v: &[u16]| v.iter().map(|p| u32::from(*p)).collect();
        proto::Match {
            namespaces: strings(&m.namespaces),
            not_namespaces: strings(&m.not_namespaces),
            service_accounts: accounts(&m.service_accounts),
            not_service_accounts: accounts(&m.not_service_accounts),
            principals: strings(&m.principals),
            not_principals: strings(&m.not_principals),
            source_ips: nets(&m.source_ips),
            not_source_ips: nets(&m.not_source_ips),
            destination_ips: nets(&m.destination_ips),
            not_destination_ips: nets(&m.not_destination_ips),
            destination_ports: ports(&m.destination_ports),
            not_destination_ports: ports(&m.not_destination_ports),
            extensions: Vec::new(),
        }
    }
}

impl From<&StringMatch> for proto::StringMatch {
    fn from(m: &StringMatch) -> Self {
        use proto::string_match::MatchType;
        let match_type = match m {
            StringMatch::Exact(s) => MatchType::Exact(s.clone()),
            StringMatch::Prefix(s) => MatchType::Prefix(s.clone()),
            StringMatch::Suffix(s) => MatchType::Suffix(s.clone()),
            StringMatch::Presence() => MatchType::Presence(()),
        };
        proto::StringMatch { match_type: Some(match_type) }
    }
}

#[cfg(test)]
mod tests;
