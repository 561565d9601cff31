//! L4 authorization with Istio's semantics: policies, matching and evaluation.
//!
//! The policy model here is the internal one: it is what xDS `istio.security.Authorization`
//! resources convert into (`convert`), what the local config file deserialises into and what
//! `/config_dump` shows. Which policies apply to a destination workload is decided by the
//! state store; [`evaluate`] only decides a connection against an already selected set.

mod convert;
mod eval;

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use convert::ConvertError;
pub use eval::{Decision, DenyReason, evaluate};

/// One authorization policy, in the shape of ztunnel's local config (camelCase keys).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    /// Policy name.
    pub name: String,
    /// Policy namespace.
    pub namespace: String,
    /// Which workloads the policy applies to.
    #[serde(default)]
    pub scope: Scope,
    /// Allow or deny on match.
    #[serde(default)]
    pub action: Action,
    /// OR of rules; a rule is an AND of clauses; a clause is an OR of matches.
    #[serde(default)]
    pub rules: Vec<Vec<Vec<Match>>>,
    /// Log decisions without enforcing them.
    #[serde(default)]
    pub dry_run: bool,
}

impl Authorization {
    /// The policy key, `namespace/name`, used by workloads' `authorizationPolicies`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Policy scope.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scope {
    /// Every workload.
    #[default]
    Global,
    /// Workloads in the policy's namespace.
    Namespace,
    /// Workloads that list the policy key.
    WorkloadSelector,
}

/// Policy action.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// Allow on match (and deny when allow policies exist but none match).
    #[default]
    Allow,
    /// Deny on match.
    Deny,
}

/// One match: every present field family must pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Match {
    /// Source namespaces (from the peer identity), any must match.
    pub namespaces: Vec<StringMatch>,
    /// Source namespaces, none may match.
    pub not_namespaces: Vec<StringMatch>,
    /// Source service accounts, any must match.
    pub service_accounts: Vec<ServiceAccountMatch>,
    /// Source service accounts, none may match.
    pub not_service_accounts: Vec<ServiceAccountMatch>,
    /// Source principals (identity without `spiffe://`), any must match.
    pub principals: Vec<StringMatch>,
    /// Source principals, none may match.
    pub not_principals: Vec<StringMatch>,
    /// Source IP ranges, any must contain the peer address.
    pub source_ips: Vec<IpNet>,
    /// Source IP ranges, none may contain the peer address.
    pub not_source_ips: Vec<IpNet>,
    /// Destination IP ranges, any must contain the pod address.
    pub destination_ips: Vec<IpNet>,
    /// Destination IP ranges, none may contain the pod address.
    pub not_destination_ips: Vec<IpNet>,
    /// Destination (target) ports, any must equal the dialed port.
    pub destination_ports: Vec<u16>,
    /// Destination (target) ports, none may equal the dialed port.
    pub not_destination_ports: Vec<u16>,
}

/// A service account of a namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountMatch {
    /// Namespace of the service account.
    pub namespace: String,
    /// Service account name.
    pub service_account: String,
}

/// A string matcher (externally tagged: `{Exact: "x"}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StringMatch {
    /// The whole value.
    Exact(String),
    /// A prefix of the value.
    Prefix(String),
    /// A suffix of the value.
    Suffix(String),
    /// Any non-empty value; written `{Presence: []}` (an empty list, null or `{}` are read).
    #[serde(deserialize_with = "presence_payload")]
    Presence(),
}

/// Reads the payload of `Presence`: nothing, however it is spelled.
///
/// Needed because serde_json's `Value` deserializer hands an empty list to a tuple variant as
/// unit, so the derived impl would refuse the `{"Presence":[]}` it writes itself.
fn presence_payload<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    struct Empty;

    impl<'de> serde::de::Visitor<'de> for Empty {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an empty list, null or an empty map")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
            Ok(())
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
            Ok(())
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            match seq.next_element::<serde::de::IgnoredAny>()? {
                None => Ok(()),
                Some(_) => Err(serde::de::Error::invalid_length(1, &self)),
            }
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            match map.next_key::<serde::de::IgnoredAny>()? {
                None => Ok(()),
                Some(_) => Err(serde::de::Error::invalid_length(1, &self)),
            }
        }
    }

    d.deserialize_any(Empty)
}

/// The attributes of a connection that policies match on.
#[derive(Clone, Debug)]
pub struct Connection {
    /// TCP peer address.
    pub src_ip: IpAddr,
    /// Peer SPIFFE identity (mTLS only).
    pub src_identity: Option<ambit_identity::Identity>,
    /// Destination pod IP.
    pub dst_ip: IpAddr,
    /// Destination target port (the port actually dialed on the pod).
    pub dst_port: u16,
}

#[cfg(test)]
mod tests;
