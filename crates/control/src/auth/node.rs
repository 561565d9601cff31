//! Node authorization for `ImpersonatedIdentity` (control-plane.md §6.3): a node proxy may get
//! a certificate for an identity only if a pod with that identity runs on its own node.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ambit_identity::Identity;
use tokio::sync::{Semaphore, watch};

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

impl NodeAuthError {
    /// Whether the refusal may only mean that the pod index has not caught up yet: the pod
    /// is not known, or is known under an older uid, or not on the node. A node proxy asks for
    /// a pod's certificate as soon as the pod starts, which can be before the control plane's
    /// watch (or file poll) has delivered the pod.
    pub fn may_be_stale(&self) -> bool {
        matches!(
            self,
            NodeAuthError::PodNotFound { .. }
                | NodeAuthError::PodUid { .. }
                | NodeAuthError::NoPodOnNode { .. }
        )
    }
}

/// How long a refusal that the pod index may not have caught up with waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchUp {
    /// Longest wait per request (0 refuses at once, as istiod does).
    pub max_wait: Duration,
    /// Requests waiting at once; beyond it requests are decided at once.
    pub max_waiting: usize,
}

impl Default for CatchUp {
    fn default() -> Self {
        CatchUp { max_wait: Duration::from_secs(2), max_waiting: 256 }
    }
}

/// Decides whether a node proxy may obtain a certificate for an identity.
pub struct NodeAuthorizer {
    trusted: TrustedNodeAccounts,
    pods: Arc<dyn PodIndex>,
    trust_domain: String,
    /// Pod index updates (a generation that changes with every batch of pod changes), and how
    /// long a possibly stale refusal waits for them.
    updates: Option<(watch::Receiver<u64>, CatchUp, Semaphore)>,
}

impl NodeAuthorizer {
    /// An authorizer trusting `trusted` node accounts (local-mode node-token callers are always
    /// trusted on their node), looking pods up in `pods`, issuing only in `trust_domain`.
    pub fn new(trusted: TrustedNodeAccounts, pods: Arc<dyn PodIndex>, trust_domain: &str) -> Self {
        NodeAuthorizer { trusted, pods, trust_domain: trust_domain.to_owned(), updates: None }
    }

    /// Lets [`authorize_when_known`](Self::authorize_when_known) wait for the pod index: a
    /// refusal that [may be stale](NodeAuthError::may_be_stale) is re-decided at each change
    /// of `updates` until `catch_up.max_wait` has passed.
    pub fn with_catch_up(mut self, updates: watch::Receiver<u64>, catch_up: CatchUp) -> Self {
        self.updates = Some((updates, catch_up, Semaphore::new(catch_up.max_waiting)));
        self
    }

    /// [`authorize`](Self::authorize), but a refusal that may only mean the pod index lags
    /// waits (bounded in time and in how many requests wait at once) for the index to catch
    /// up before it stands. The final decision is always made on the index.
    pub async fn authorize_when_known(
        &self,
        caller: &Caller,
        requested: &str,
    ) -> Result<Identity, NodeAuthError> {
        let first = self.authorize(caller, requested);
        let Some((updates, catch_up, waiting)) = &self.updates else { return first };
        match &first {
            Err(e) if e.may_be_stale() && !catch_up.max_wait.is_zero() => {}
            _ => return first,
        }
        let Ok(_slot) = waiting.try_acquire() else {
            tracing::debug!("CA: too many requests waiting for the pod index; deciding now");
            return first;
        };
        let mut updates = updates.clone();
        updates.mark_unchanged();
        // A change between the first decision and `mark_unchanged` is covered by deciding
        // once more before waiting.
        let deadline = tokio::time::Instant::now() + catch_up.max_wait;
        loop {
            let decision = self.authorize(caller, requested);
            match &decision {
                Err(e) if e.may_be_stale() => {}
                _ => return decision,
            }
            match tokio::time::timeout_at(deadline, updates.changed()).await {
                Ok(Ok(())) => {}
                // Timed out, or the index is gone: the refusal stands.
                Ok(Err(_)) | Err(_) => return decision,
            }
        }
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
