//! Node authorization for `ImpersonatedIdentity` (control-plane.md §6.3): a node proxy may get
//! a certificate for an identity only if a pod with that identity runs on its own node.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::Arc;

use ambit_identity::Identity;

use super::{AuthMethod, Caller};

/// What node authorization needs of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.serviceAccountName`.
    pub service_account: String,
    /// `spec.nodeName`.
    pub node: String,
}

/// The pods node authorization consults (implemented over the object store). Like istiod's
/// index it leaves out pods in phase `Failed` and pods without a node or service account.
pub trait PodIndex: Send + Sync {
    /// The pod `namespace/name`.
    fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo>;
    /// Whether some pod of service account `service_account` in `namespace` is on `node`.
    fn has_pod_on_node(&self, namespace: &str, service_account: &str, node: &str) -> bool;
}

/// `CA_TRUSTED_NODE_ACCOUNTS`: the `namespace/serviceaccount` pairs of node proxies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedNodeAccounts(BTreeSet<(String, String)>);

/// A malformed `CA_TRUSTED_NODE_ACCOUNTS` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CA_TRUSTED_NODE_ACCOUNTS entry {0:?} is not <namespace>/<service account>")]
pub struct TrustedNodeAccountsError(pub String);

impl FromStr for TrustedNodeAccounts {
    type Err = TrustedNodeAccountsError;

    /// A comma list of `ns/sa`; blanks around entries and empty entries are ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut set = BTreeSet::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match entry.split('/').collect::<Vec<_>>().as_slice() {
                [ns, sa] if !ns.is_empty() && !sa.is_empty() => {
                    set.insert(((*ns).to_owned(), (*sa).to_owned()));
                }
                _ => return Err(TrustedNodeAccountsError(entry.to_owned())),
            }
        }
        Ok(TrustedNodeAccounts(set))
    }
}

impl TrustedNodeAccounts {
    /// Whether `namespace/service_account` is a node proxy account.
    pub fn contains(&self, namespace: &str, service_account: &str) -> bool {
        self.0.contains(&(namespace.to_owned(), service_account.to_owned()))
    }

    /// Whether the list is empty (then only local-mode node tokens may impersonate).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Why an impersonation request is refused (logged; the peer only learns that it was).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeAuthError {
    /// The caller authenticated with a client certificate, which names no pod or node.
    #[error(
        "a caller authenticated by client certificate cannot impersonate (no pod or node is known for it)"
    )]
    NotANode,
    /// The caller's service account is not a trusted node account.
    #[error("caller {namespace}/{service_account} is not in CA_TRUSTED_NODE_ACCOUNTS")]
    Untrusted {
        /// Caller namespace.
        namespace: String,
        /// Caller service account.
        service_account: String,
    },
    /// The requested identity is not a SPIFFE workload id.
    #[error("the impersonated identity is invalid: {0}")]
    Identity(#[from] ambit_identity::IdentityError),
    /// The requested identity is in another trust domain.
    #[error("the impersonated identity {requested} is not in trust domain {trust_domain:?}")]
    TrustDomain {
        /// What was asked for.
        requested: String,
        /// Ours.
        trust_domain: String,
    },
    /// The token is not bound to a pod.
    #[error("the caller's token is not bound to a pod (no pod name and uid in the TokenReview)")]
    NoBoundPod,
    /// The caller's pod is not known (or is gone).
    #[error("the caller's pod {namespace}/{name} is not known")]
    PodNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The pod of that name is another pod than the token's.
    #[error("the caller's pod {namespace}/{name} has uid {found}, the token is bound to uid {token}")]
    PodUid {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// UID in the index.
        found: String,
        /// UID in the token.
        token: String,
    },
    /// The pod runs as another service account than the token's.
    #[error("the caller's pod {namespace}/{name} runs as service account {found}, the token is for {token}")]
    PodServiceAccount {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// SA in the index.
        found: String,
        /// SA in the token.
        token: String,
    },
    /// No pod of the requested identity is on the caller's node.
    #[error("no pod with service account {service_account} in namespace {namespace} runs on node {node}")]
    NoPodOnNode {
        /// Requested namespace.
        namespace: String,
        /// Requested service account.
        service_account: String,
        /// The caller's node.
        node: String,
    },
}

/// Decides whether a node proxy may obtain a certificate for an identity.
pub struct NodeAuthorizer {
    trusted: TrustedNodeAccounts,
    pods: Arc<dyn PodIndex>,
    trust_domain: String,
}

impl NodeAuthorizer {
    /// An authorizer trusting `trusted` node accounts (local-mode node-token callers are always
    /// trusted on their node), looking pods up in `pods`, issuing only in `trust_domain`.
    pub fn new(trusted: TrustedNodeAccounts, pods: Arc<dyn PodIndex>, trust_domain: &str) -> Self {
        NodeAuthorizer { trusted, pods, trust_domain: trust_domain.to_owned() }
    }

    /// The identity `caller` may impersonate for `requested`, or why not (§6.3, in order:
    /// trusted account, identity shape, caller pod by name with matching uid and service
    /// account, a pod of the requested identity on the caller's node).
    pub fn authorize(&self, caller: &Caller, requested: &str) -> Result<Identity, NodeAuthError> {
        match &caller.method {
            AuthMethod::ClientCertificate => Err(NodeAuthError::NotANode),
            AuthMethod::NodeToken { node } => {
                let identity = self.requested(requested)?;
                self.on_node(identity, node)
            }
            AuthMethod::KubernetesToken(sa) => {
                if !self.trusted.contains(&sa.namespace, &sa.service_account) {
                    return Err(NodeAuthError::Untrusted {
                        namespace: sa.namespace.clone(),
                        service_account: sa.service_account.clone(),
                    });
                }
                let identity = self.requested(requested)?;
                let bound = sa.pod.as_ref().ok_or(NodeAuthError::NoBoundPod)?;
                let pod = self.pods.pod(&sa.namespace, &bound.name).ok_or_else(|| {
                    NodeAuthError::PodNotFound { namespace: sa.namespace.clone(), name: bound.name.clone() }
                })?;
                if pod.uid != bound.uid {
                    return Err(NodeAuthError::PodUid {
                        namespace: sa.namespace.clone(),
                        name: bound.name.clone(),
                        found: pod.uid,
                        token: bound.uid.clone(),
                    });
                }
                if pod.service_account != sa.service_account {
                    return Err(NodeAuthError::PodServiceAccount {
                        namespace: sa.namespace.clone(),
                        name: bound.name.clone(),
                        found: pod.service_account,
                        token: sa.service_account.clone(),
                    });
                }
                self.on_node(identity, &pod.node)
            }
        }
    }

    fn requested(&self, requested: &str) -> Result<Identity, NodeAuthError> {
        let identity: Identity = requested.parse()?;
        // istiod does not compare the trust domain; we issue only in ours, so a node proxy
        // cannot mint identities of another mesh that trusts the same root.
        if identity.trust_domain != self.trust_domain {
            return Err(NodeAuthError::TrustDomain {
                requested: requested.to_owned(),
                trust_domain: self.trust_domain.clone(),
            });
        }
        Ok(identity)
    }

    fn on_node(&self, identity: Identity, node: &str) -> Result<Identity, NodeAuthError> {
        if self.pods.has_pod_on_node(&identity.namespace, &identity.service_account, node) {
            Ok(identity)
        } else {
            Err(NodeAuthError::NoPodOnNode {
                namespace: identity.namespace,
                service_account: identity.service_account,
                node: node.to_owned(),
            })
        }
    }
}
