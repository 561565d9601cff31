//! Who is calling: the authentication chain the CA and xDS share (control-plane.md §6.4), and
//! node authorization for `ImpersonatedIdentity` (§6.3).
//!
//! The chain tries, in order, a verified client certificate, a local-mode node token, and a
//! Kubernetes service-account token (TokenReview); the first that succeeds names the caller.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use tonic::metadata::MetadataMap;

use crate::tls::PeerInfo;

mod kube;
mod node;
mod node_token;

pub use self::kube::{
    DEFAULT_AUDIENCE, KubeJwtAuthenticator, KubeJwtConfig, KubeTokenReviewer, MAX_CONCURRENT_REVIEWS,
    REVIEW_TIMEOUT, ReviewError, TokenReviewer,
};
pub use self::node::{
    CatchUp, NodeAuthError, NodeAuthorizer, PodIndex, PodInfo, TrustedNodeAccounts, TrustedNodeAccountsError,
};
pub use self::node_token::{NodeTokenError, NodeTokens, TOKEN_SUFFIX};

/// The `authorization` metadata prefix of a bearer token (exact, case-sensitive, as istiod).
pub const BEARER: &str = "Bearer ";

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The identities it authenticated as (the SANs of a certificate issued to it).
    pub identities: Vec<String>,
    /// How it authenticated, with what node authorization needs.
    pub method: AuthMethod,
}

/// How a caller authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    /// A client certificate verified against the mesh roots.
    ClientCertificate,
    /// A Kubernetes service-account token, reviewed by the API server.
    KubernetesToken(ServiceAccountCaller),
    /// A local-mode node token: the node proxy of `node`.
    NodeToken {
        /// The node the token was written for.
        node: String,
    },
}

/// What a reviewed service-account token says about its bearer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountCaller {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account.
    pub service_account: String,
    /// The pod the token is bound to (`authentication.kubernetes.io/pod-name`, `…/pod-uid`),
    /// present only for pod-bound projected tokens.
    pub pod: Option<BoundPod>,
}

/// The pod a projected token is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundPod {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

/// What an authenticator sees of a request.
#[derive(Clone, Copy)]
pub struct AuthRequest<'a> {
    /// gRPC request metadata.
    pub metadata: &'a MetadataMap,
    /// The connection (absent when not served by [`crate::tls::serve`]).
    pub peer: Option<&'a PeerInfo>,
}

impl<'a> AuthRequest<'a> {
    /// The metadata and connection of a tonic request.
    pub fn of<T>(request: &'a tonic::Request<T>) -> Self {
        AuthRequest { metadata: request.metadata(), peer: PeerInfo::of(request) }
    }

    /// The bearer token, if the `authorization` metadata has one.
    pub fn bearer(&self) -> Option<&'a str> {
        self.metadata.get("authorization")?.to_str().ok()?.strip_prefix(BEARER)
    }
}

/// Authenticates a request; async because a token review is a call to the API server.
pub trait Authenticate: Send + Sync {
    /// The caller, or why it is not authenticated (logged, never sent to the peer).
    fn authenticate<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Result<Caller, AuthError>>;
}

/// Why a request is not authenticated: each authenticator's reason, in chain order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthError {
    /// `(authenticator, reason)` for each authenticator tried.
    pub reasons: Vec<(&'static str, String)>,
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.reasons.is_empty() {
            return f.write_str("no authenticator is configured");
        }
        let parts: Vec<String> = self.reasons.iter().map(|(who, why)| format!("{who}: {why}")).collect();
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for AuthError {}

/// The authentication chain: client certificate, node tokens (local mode), Kubernetes tokens.
#[derive(Clone, Default)]
pub struct AuthChain {
    client_certificates: bool,
    node_tokens: Option<Arc<NodeTokens>>,
    kube: Option<Arc<KubeJwtAuthenticator>>,
}

impl AuthChain {
    /// A chain that accepts nothing; add authenticators with the `with_*` methods.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accept client certificates the TLS handshake verified against the mesh roots.
    pub fn with_client_certificates(mut self) -> Self {
        self.client_certificates = true;
        self
    }

    /// Accept local-mode node tokens.
    pub fn with_node_tokens(mut self, tokens: Arc<NodeTokens>) -> Self {
        self.node_tokens = Some(tokens);
        self
    }

    /// Accept Kubernetes service-account tokens.
    pub fn with_kubernetes(mut self, kube: Arc<KubeJwtAuthenticator>) -> Self {
        self.kube = Some(kube);
        self
    }

    async fn run(&self, request: AuthRequest<'_>) -> Result<Caller, AuthError> {
        let mut reasons = Vec::new();
        if self.client_certificates {
            match client_certificate(request) {
                Ok(caller) => return Ok(caller),
                Err(why) => reasons.push(("client certificate", why)),
            }
        }
        if let Some(tokens) = &self.node_tokens {
            match request.bearer().map(|t| tokens.authenticate(t)) {
                Some(Some(caller)) => return Ok(caller),
                Some(None) => reasons.push(("node token", "the bearer token is not a node token".to_owned())),
                None => reasons.push(("node token", "no bearer token".to_owned())),
            }
        }
        if let Some(kube) = &self.kube {
            match kube.authenticate(request).await {
                Ok(caller) => return Ok(caller),
                Err(why) => reasons.push(("kubernetes token", why)),
            }
        }
        Err(AuthError { reasons })
    }
}

impl Authenticate for AuthChain {
    fn authenticate<'a>(&'a self, request: AuthRequest<'a>) -> BoxFuture<'a, Result<Caller, AuthError>> {
        Box::pin(self.run(request))
    }
}

/// A client certificate: the handshake verified it against the mesh roots; its identities are
/// the leaf's URI and DNS SANs.
fn client_certificate(request: AuthRequest<'_>) -> Result<Caller, String> {
    let chain = request
        .peer
        .and_then(|p| p.verified_chain.as_ref())
        .ok_or_else(|| "no verified client certificate".to_owned())?;
    let leaf = chain.first().ok_or_else(|| "empty client certificate chain".to_owned())?;
    let identities = ambit_identity::certificate_names(leaf).map_err(|e| e.to_string())?;
    if identities.is_empty() {
        return Err("the client certificate has no URI or DNS SAN".to_owned());
    }
    Ok(Caller { identities, method: AuthMethod::ClientCertificate })
}

#[cfg(test)]
mod tests;
