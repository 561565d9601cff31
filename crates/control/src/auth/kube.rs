//! Kubernetes service-account tokens (control-plane.md §6.4 step 3): the token is sent to the
//! API server in a TokenReview with our audiences; a reviewed service account becomes
//! `spiffe://<trust domain>/ns/<ns>/sa/<sa>`.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use tokio::sync::Semaphore;

use super::{AuthMethod, AuthRequest, BoundPod, Caller, ServiceAccountCaller};

/// Audience a token must be for when none is configured (`TOKEN_AUDIENCES`).
pub const DEFAULT_AUDIENCE: &str = "istio-ca";
/// Longest a token review may take before the caller is refused.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Token reviews in flight at once; more callers wait (within [`REVIEW_TIMEOUT`]).
pub const MAX_CONCURRENT_REVIEWS: usize = 64;
/// Longest bearer token sent for review (a projected token is about 1 KiB).
const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// `user.extra` keys of a pod-bound projected token.
const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// The group every service account is in.
const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// Reviews a token (the API server's TokenReview, or a fake in tests).
pub trait TokenReviewer: Send + Sync {
    /// The review's status for `token` asked for `audiences`.
    fn review<'a>(
        &'a self,
        token: &'a str,
        audiences: &'a [String],
    ) -> BoxFuture<'a, Result<TokenReviewStatus, ReviewError>>;
}

/// Why a token review could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The API server refused the request itself (not the token).
    #[error(
        "the API server refused the TokenReview ({code}): {message}; grant the control plane's service account `create` on `tokenreviews.authentication.k8s.io` (ClusterRole system:auth-delegator)"
    )]
    Forbidden {
        /// HTTP status.
        code: u16,
        /// The API server's message.
        message: String,
    },
    /// Any other failure to reach the API server or read its answer.
    #[error("the TokenReview request failed: {0}")]
    Api(String),
    /// The API server answered without a status.
    #[error("the API server's TokenReview answer has no status")]
    NoStatus,
}

/// Settings of the Kubernetes token authenticator.
#[derive(Clone, Debug)]
pub struct KubeJwtConfig {
    /// Audiences asked for in the review (`TOKEN_AUDIENCES`, default `istio-ca`).
    pub audiences: Vec<String>,
    /// Trust domain of the identities it yields.
    pub trust_domain: String,
    /// Our cluster id: a `clusterid` header naming another cluster is refused.
    pub cluster_id: String,
    /// Other names of our cluster accepted in `clusterid`.
    pub cluster_aliases: Vec<String>,
}

/// Authenticates `authorization: Bearer <token>` with a [`TokenReviewer`].
pub struct KubeJwtAuthenticator {
    reviewer: Arc<dyn TokenReviewer>,
    config: KubeJwtConfig,
    reviews: Semaphore,
}

impl KubeJwtAuthenticator {
    /// An authenticator asking `reviewer`.
    pub fn new(reviewer: Arc<dyn TokenReviewer>, config: KubeJwtConfig) -> Self {
        KubeJwtAuthenticator { reviewer, config, reviews: Semaphore::new(MAX_CONCURRENT_REVIEWS) }
    }

    /// The caller named by the request's bearer token, or why not.
    pub(crate) async fn authenticate(&self, request: AuthRequest<'_>) -> Result<Caller, String> {
        let token = match request.bearer() {
            Some(token) => token,
            None if request.metadata.contains_key("authorization") => {
                return Err("the authorization metadata is not `Bearer <token>`".to_owned());
            }
            None => return Err("no bearer token".to_owned()),
        };
        if token.is_empty() {
            return Err("the bearer token is empty".to_owned());
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(format!("the bearer token is longer than {MAX_TOKEN_BYTES} bytes"));
        }
        if let Some(cluster) = request.metadata.get("clusterid") {
            let cluster = cluster.to_str().unwrap_or("<not ASCII>");
            if !cluster.is_empty()
                && cluster != self.config.cluster_id
                && !self.config.cluster_aliases.iter().any(|a| a == cluster)
            {
                return Err(format!(
                    "clusterid {:?} is not this cluster ({:?})",
                    clip(cluster),
                    self.config.cluster_id
                ));
            }
        }
        let status = tokio::time::timeout(REVIEW_TIMEOUT, async {
            let _permit =
                self.reviews.acquire().await.map_err(|_| "the token reviewer is closed".to_owned())?;
            self.reviewer.review(token, &self.config.audiences).await.map_err(|e| e.to_string())
        })
        .await
        .map_err(|_| format!("the token review took longer than {REVIEW_TIMEOUT:?}"))??;
        self.caller(&status)
    }

    /// istiod's checks of a review status, plus the audience check the TokenReview API asks
    /// audience-aware clients to make.
    fn caller(&self, status: &TokenReviewStatus) -> Result<Caller, String> {
        if let Some(error) = status.error.as_deref().filter(|e| !e.is_empty()) {
            return Err(format!("the token review failed: {}", clip(error)));
        }
        if status.authenticated != Some(true) {
            return Err("the token is not authenticated".to_owned());
        }
        let audiences = status.audiences.as_deref().unwrap_or_default();
        if !audiences.iter().any(|a| self.config.audiences.contains(a)) {
            return Err(format!(
                "the token is not for audience {} (the review returned {:?})",
                self.config.audiences.join(","),
                audiences.iter().map(|a| clip(a)).collect::<Vec<_>>()
            ));
        }
        let user = status.user.as_ref().ok_or("the token review names no user")?;
        let groups = user.groups.as_deref().unwrap_or_default();
        if !groups.iter().any(|g| g == SERVICE_ACCOUNTS_GROUP) {
            return Err("the token is not a service account token".to_owned());
        }
        let username = user.username.as_deref().unwrap_or_default();
        let (namespace, service_account) = match username.split(':').collect::<Vec<_>>().as_slice() {
            ["system", "serviceaccount", ns, sa] if !ns.is_empty() && !sa.is_empty() => {
                ((*ns).to_owned(), (*sa).to_owned())
            }
            _ => return Err(format!("username {:?} is not system:serviceaccount:<ns>:<sa>", clip(username))),
        };
        let extra = |key: &str| {
            user.extra
                .as_ref()
                .and_then(|e| e.get(key))
                .and_then(|v| v.first())
                .filter(|v| !v.is_empty())
                .cloned()
        };
        let pod = match (extra(EXTRA_POD_NAME), extra(EXTRA_POD_UID)) {
            (Some(name), Some(uid)) => Some(BoundPod { name, uid }),
            _ => None,
        };
        let identity = ambit_identity::Identity::new(&self.config.trust_domain, &namespace, &service_account);
        Ok(Caller {
            identities: vec![identity.to_string()],
            method: AuthMethod::KubernetesToken(ServiceAccountCaller { namespace, service_account, pod }),
        })
    }
}

/// The API server's TokenReview (`POST /apis/authentication.k8s.io/v1/tokenreviews`).
pub struct KubeTokenReviewer {
    api: kube::Api<TokenReview>,
}

impl KubeTokenReviewer {
    /// A reviewer using `client`.
    pub fn new(client: kube::Client) -> Self {
        KubeTokenReviewer { api: kube::Api::all(client) }
    }
}

impl TokenReviewer for KubeTokenReviewer {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audiences: &'a [String],
    ) -> BoxFuture<'a, Result<TokenReviewStatus, ReviewError>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec { token: Some(token.to_owned()), audiences: Some(audiences.to_vec()) },
                ..TokenReview::default()
            };
            let answer =
                self.api.create(&kube::api::PostParams::default(), &review).await.map_err(|e| match e {
                    kube::Error::Api(status) if status.code == 401 || status.code == 403 => {
                        ReviewError::Forbidden { code: status.code, message: status.message.clone() }
                    }
                    other => ReviewError::Api(other.to_string()),
                })?;
            answer.status.ok_or(ReviewError::NoStatus)
        })
    }
}

/// Cuts a peer-supplied string for a log line.
fn clip(s: &str) -> String {
    const MAX: usize = 128;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
