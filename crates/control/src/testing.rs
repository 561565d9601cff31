//! Test doubles for the CA and xDS authentication: a token reviewer that answers as the API
//! server does, and a pod index.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};

use crate::auth::{PodIndex, PodInfo, ReviewError, TokenReviewer};

/// A token the fake reviewer knows.
#[derive(Clone, Debug)]
pub struct FakeToken {
    /// Audiences the token was issued for.
    pub audiences: Vec<String>,
    /// `system:serviceaccount:<ns>:<sa>` or another user name.
    pub username: String,
    /// Groups (a service account is in `system:serviceaccounts`).
    pub groups: Vec<String>,
    /// `(pod name, pod uid)` of a pod-bound token.
    pub pod: Option<(String, String)>,
}

impl FakeToken {
    /// A pod-bound service-account token for `audience`.
    pub fn service_account(namespace: &str, sa: &str, audience: &str, pod: Option<(&str, &str)>) -> Self {
        FakeToken {
            audiences: vec![audience.to_owned()],
            username: format!("system:serviceaccount:{namespace}:{sa}"),
            groups: vec!["system:serviceaccounts".to_owned(), format!("system:serviceaccounts:{namespace}")],
            pod: pod.map(|(n, u)| (n.to_owned(), u.to_owned())),
        }
    }
}

/// Answers TokenReviews as the API server does: an unknown token or one whose audiences do
/// not meet the requested ones is not authenticated; otherwise the status carries the user and
/// the audiences in common.
#[derive(Default)]
pub struct FakeReviewer {
    tokens: Mutex<BTreeMap<String, FakeToken>>,
    omit_audiences: bool,
    reviews: Mutex<Vec<(String, Vec<String>)>>,
}

impl FakeReviewer {
    /// A reviewer that answers `authenticated: true` without `audiences`.
    pub fn not_audience_aware() -> Self {
        FakeReviewer { omit_audiences: true, ..FakeReviewer::default() }
    }

    /// Makes `token` known.
    pub fn insert(&self, token: &str, info: FakeToken) {
        self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(token.to_owned(), info);
    }

    /// The `(token, audiences)` of every review asked for.
    pub fn reviews(&self) -> Vec<(String, Vec<String>)> {
        self.reviews.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl TokenReviewer for FakeReviewer {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audiences: &'a [String],
    ) -> BoxFuture<'a, Result<TokenReviewStatus, ReviewError>> {
        self.reviews
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((token.to_owned(), audiences.to_vec()));
        let known = self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(token).cloned();
        let status = match known {
            None => TokenReviewStatus {
                authenticated: Some(false),
                error: Some("invalid bearer token".to_owned()),
                ..TokenReviewStatus::default()
            },
            Some(info) => {
                let common: Vec<String> =
                    info.audiences.iter().filter(|a| audiences.contains(a)).cloned().collect();
                if common.is_empty() {
                    TokenReviewStatus {
                        authenticated: Some(false),
                        error: Some(format!(
                            "token audiences {:?} is invalid for the target audiences {:?}",
                            info.audiences, audiences
                        )),
                        ..TokenReviewStatus::default()
                    }
                } else {
                    let extra = info.pod.map(|(name, uid)| {
                        BTreeMap::from([
                            ("authentication.kubernetes.io/pod-name".to_owned(), vec![name]),
                            ("authentication.kubernetes.io/pod-uid".to_owned(), vec![uid]),
                        ])
                    });
                    TokenReviewStatus {
                        authenticated: Some(true),
                        audiences: (!self.omit_audiences).then_some(common),
                        user: Some(UserInfo {
                            username: Some(info.username),
                            groups: Some(info.groups),
                            extra,
                            uid: Some("uid".to_owned()),
                        }),
                        error: None,
                    }
                }
            }
        };
        Box::pin(std::future::ready(Ok(status)))
    }
}

/// A pod index over a fixed list of `(namespace, name, pod)`.
#[derive(Default)]
pub struct FakePods {
    pods: Mutex<Vec<(String, String, PodInfo)>>,
}

impl FakePods {
    /// Adds pod `namespace/name` running as `sa` on `node`.
    pub fn insert(&self, namespace: &str, name: &str, uid: &str, sa: &str, node: &str) {
        self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((
            namespace.to_owned(),
            name.to_owned(),
            PodInfo { uid: uid.to_owned(), service_account: sa.to_owned(), node: node.to_owned() },
        ));
    }
}

impl PodIndex for FakePods {
    fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        let pods = self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pods.iter().find(|(ns, n, _)| ns == namespace && n == name).map(|(_, _, p)| p.clone())
    }

    fn has_pod_on_node(&self, namespace: &str, service_account: &str, node: &str) -> bool {
        let pods = self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pods.iter()
            .any(|(ns, _, p)| ns == namespace && p.service_account == service_account && p.node == node)
    }
}
