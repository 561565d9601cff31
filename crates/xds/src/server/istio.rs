//! istiod's checks of a stream's node (control-plane.md §5.1) as an [`Authorize`] hook: the node
//! id's shape, its IPs, and that the caller's identity belongs to the namespace (and service
//! account) the node claims.

use std::net::IpAddr;

use ambit_api::xds::Node;
use ambit_identity::Identity;
use tonic::Status;

use super::{Authorize, Principal, metadata_string};

/// The node types istiod accepts as the first part of a node id.
pub const NODE_TYPES: [&str; 5] = ["sidecar", "router", "waypoint", "ztunnel", "agentgateway"];

/// A node id `type~ip~id~domain` with the metadata istiod reads from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IstioNode {
    /// One of [`NODE_TYPES`].
    pub node_type: String,
    /// `INSTANCE_IPS` when every entry is an IP, else the id's second part.
    pub ip_addresses: Vec<IpAddr>,
    /// The third part (`<pod>.<namespace>` for Kubernetes proxies).
    pub id: String,
    /// The fourth part (`<namespace>.svc.cluster.local`).
    pub domain: String,
    /// Metadata `NAMESPACE`, else the first label of the domain (empty if neither).
    pub config_namespace: String,
    /// Metadata `SERVICE_ACCOUNT` (optional).
    pub service_account: Option<String>,
}

/// Why a node is refused (`InvalidArgument`; messages as istiod's).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeError {
    /// Not four `~`-separated parts.
    #[error("missing parts in the service node {0:?}")]
    Parts(String),
    /// The first part is not a known node type.
    #[error(
        "invalid node type (valid types: sidecar, router, waypoint, ztunnel, agentgateway) in the service node {0:?}"
    )]
    Type(String),
    /// Neither `INSTANCE_IPS` nor the id's second part is an IP address.
    #[error("no valid IP address in the service node id or metadata")]
    NoIp,
}

impl IstioNode {
    /// Parses `node.id` and the metadata istiod reads with it.
    pub fn parse(node: &Node) -> Result<Self, NodeError> {
        let parts: Vec<&str> = node.id.split('~').collect();
        let [node_type, ip, id, domain] = parts.as_slice() else {
            return Err(NodeError::Parts(node.id.clone()));
        };
        if !NODE_TYPES.contains(node_type) {
            return Err(NodeError::Type(node.id.clone()));
        }
        let from_metadata: Option<Vec<IpAddr>> = metadata_string(node, "INSTANCE_IPS")
            .filter(|v| !v.is_empty())
            .and_then(|v| v.split(',').map(|ip| ip.parse().ok()).collect());
        let ip_addresses = match from_metadata {
            Some(ips) => ips,
            None => vec![ip.parse().map_err(|_| NodeError::NoIp)?],
        };
        let config_namespace = match metadata_string(node, "NAMESPACE").filter(|n| !n.is_empty()) {
            Some(ns) => ns.to_owned(),
            None => match domain.split_once('.') {
                Some((first, _)) => first.to_owned(),
                None => String::new(),
            },
        };
        Ok(Self {
            node_type: (*node_type).to_owned(),
            ip_addresses,
            id: (*id).to_owned(),
            domain: (*domain).to_owned(),
            config_namespace,
            service_account: metadata_string(node, "SERVICE_ACCOUNT")
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        })
    }

    /// The first of `identities` in this node's config namespace (any, if it has none) and, if
    /// the node names one, of its service account (istiod's `checkConnectionIdentity`).
    pub fn verified_identity<'a>(&self, identities: &'a [Identity]) -> Option<&'a Identity> {
        identities.iter().find(|id| {
            (self.config_namespace.is_empty() || id.namespace == self.config_namespace)
                && self.service_account.as_ref().is_none_or(|sa| &id.service_account == sa)
        })
    }
}

/// istiod's first-request checks: the node must parse as an [`IstioNode`] (`InvalidArgument`
/// otherwise) and, when the stream is authenticated and `identity_check` is on
/// (`PILOT_ENABLE_XDS_IDENTITY_CHECK`, default on), one of the caller's identities must match
/// its namespace and service account (`PermissionDenied` "authorization failed: …" otherwise).
/// An unauthenticated stream (a plaintext port) is not identity-checked, as istiod.
#[derive(Clone, Debug)]
pub struct NodeCheck {
    /// Match the caller's identities against the node.
    pub identity_check: bool,
}

impl Default for NodeCheck {
    fn default() -> Self {
        Self { identity_check: true }
    }
}

impl Authorize for NodeCheck {
    fn authorize(&self, principal: Option<&Principal>, node: &Node) -> Result<(), Status> {
        let parsed = IstioNode::parse(node).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let Some(principal) = principal.filter(|_| self.identity_check) else {
            return Ok(());
        };
        if parsed.verified_identity(&principal.identities).is_some() {
            return Ok(());
        }
        let ids: Vec<String> = principal.identities.iter().map(ToString::to_string).collect();
        Err(Status::permission_denied(format!(
            "authorization failed: no identities ([{}]) matched {}/{}",
            ids.join(" "),
            parsed.config_namespace,
            parsed.service_account.as_deref().unwrap_or_default()
        )))
    }

    /// `<namespace>/<service account>` of the identity the node check verified: a waypoint runs
    /// as its Gateway's name in the Gateway's namespace, so this scopes the Gateway's own
    /// configuration to it. An unauthenticated stream, or one with no identity matching its
    /// node, has none.
    fn scope(&self, principal: Option<&Principal>, node: &Node) -> Option<String> {
        let parsed = IstioNode::parse(node).ok()?;
        let id = parsed.verified_identity(&principal?.identities)?;
        Some(format!("{}/{}", id.namespace, id.service_account))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, meta: &[(&str, &str)]) -> Node {
        let fields = meta
            .iter()
            .map(|(k, v)| {
                let value =
                    prost_types::Value { kind: Some(prost_types::value::Kind::StringValue((*v).into())) };
                ((*k).to_owned(), value)
            })
            .collect();
        Node { id: id.into(), metadata: Some(prost_types::Struct { fields }), ..Default::default() }
    }

    #[test]
    fn parses_ztunnel_node_ids_as_istiod() {
        let n =
            IstioNode::parse(&node("ztunnel~10.0.0.1~zt-1.istio-system~istio-system.svc.cluster.local", &[]))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n.node_type, "ztunnel");
        assert_eq!(n.ip_addresses, vec!["10.0.0.1".parse::<IpAddr>().unwrap_or_else(|e| panic!("{e}"))]);
        assert_eq!((n.id.as_str(), n.config_namespace.as_str()), ("zt-1.istio-system", "istio-system"));
        assert_eq!(n.service_account, None);

        // INSTANCE_IPS wins when every entry is an IP; NAMESPACE wins over the domain.
        let n = IstioNode::parse(&node(
            "sidecar~1.1.1.1~p.ns~ns.svc.cluster.local",
            &[("INSTANCE_IPS", "10.0.0.2,fd00::2"), ("NAMESPACE", "other"), ("SERVICE_ACCOUNT", "sa")],
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n.ip_addresses.len(), 2);
        assert_eq!((n.config_namespace.as_str(), n.service_account.as_deref()), ("other", Some("sa")));
        // One bad entry: the id's IP is used.
        let n = IstioNode::parse(&node("sidecar~1.1.1.1~p.ns~ns.svc", &[("INSTANCE_IPS", "10.0.0.2,x")]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n.ip_addresses, vec!["1.1.1.1".parse::<IpAddr>().unwrap_or_else(|e| panic!("{e}"))]);
    }

    #[test]
    fn the_scope_is_the_verified_identitys_namespace_and_account() {
        let id = |ns: &str, sa: &str| Identity::new("cluster.local", ns, sa);
        let wp = Principal { name: "wp".into(), identities: vec![id("other", "x"), id("app", "wp")] };
        let n = node("waypoint~10.0.0.5~wp-1.app~app.svc.cluster.local", &[]);
        let check = NodeCheck::default();
        assert_eq!(
            check.scope(Some(&wp), &n),
            Some("app/wp".to_owned()),
            "the identity in the node's namespace"
        );
        let n = node("waypoint~10.0.0.5~wp-1.app~app.svc.cluster.local", &[("SERVICE_ACCOUNT", "other")]);
        assert_eq!(check.scope(Some(&wp), &n), None, "no identity matches the node");
        assert_eq!(check.scope(None, &n), None, "unauthenticated");
    }

    #[test]
    fn refuses_malformed_nodes_with_istiods_messages() {
        let cases = [
            ("ztunnel~10.0.0.1~p.ns", NodeError::Parts("ztunnel~10.0.0.1~p.ns".into())),
            ("a~b~c~d~e", NodeError::Parts("a~b~c~d~e".into())),
            ("envoy~10.0.0.1~p.ns~ns.svc", NodeError::Type("envoy~10.0.0.1~p.ns~ns.svc".into())),
            ("ztunnel~not-an-ip~p.ns~ns.svc", NodeError::NoIp),
        ];
        for (id, want) in cases {
            assert_eq!(IstioNode::parse(&node(id, &[])), Err(want), "{id}");
        }
        assert_eq!(NodeError::Parts("x".into()).to_string(), "missing parts in the service node \"x\"",);
    }
}
