use std::os::unix::fs::PermissionsExt;

use ambit_identity::Identity;
use tonic::metadata::{MetadataMap, MetadataValue};

use super::*;
use crate::testing::{FakePods, FakeReviewer, FakeToken};

const TD: &str = "cluster.local";

fn kube_config() -> KubeJwtConfig {
    KubeJwtConfig {
        audiences: vec![DEFAULT_AUDIENCE.to_owned()],
        trust_domain: TD.to_owned(),
        cluster_id: "Kubernetes".to_owned(),
        cluster_aliases: vec!["alias".to_owned()],
    }
}

fn reviewer() -> Arc<FakeReviewer> {
    let reviewer = FakeReviewer::default();
    reviewer.insert(
        "ztunnel",
        FakeToken::service_account("istio-system", "ztunnel", "istio-ca", Some(("zt-1", "uid-zt-1"))),
    );
    reviewer.insert("web", FakeToken::service_account("default", "web", "istio-ca", None));
    reviewer.insert("other-aud", FakeToken::service_account("default", "web", "vault", None));
    let mut user = FakeToken::service_account("default", "web", "istio-ca", None);
    user.groups = vec!["system:authenticated".to_owned()];
    reviewer.insert("not-an-sa", user);
    let mut odd = FakeToken::service_account("default", "web", "istio-ca", None);
    odd.username = "system:serviceaccount:default".to_owned();
    reviewer.insert("odd-user", odd);
    Arc::new(reviewer)
}

fn metadata(pairs: &[(&'static str, &str)]) -> MetadataMap {
    let mut md = MetadataMap::new();
    for (k, v) in pairs {
        md.insert(*k, MetadataValue::try_from(*v).expect("ascii"));
    }
    md
}

async fn kube_auth(reviewer: Arc<FakeReviewer>, md: &MetadataMap) -> Result<Caller, AuthError> {
    let chain =
        AuthChain::new().with_kubernetes(Arc::new(KubeJwtAuthenticator::new(reviewer, kube_config())));
    chain.authenticate(AuthRequest { metadata: md, peer: None }).await
}

fn reason(result: Result<Caller, AuthError>) -> String {
    result.expect_err("refused").to_string()
}

#[tokio::test]
async fn kubernetes_token_names_the_service_account_and_its_pod() {
    let reviewer = reviewer();
    let caller = kube_auth(
        reviewer.clone(),
        &metadata(&[("authorization", "Bearer ztunnel"), ("clusterid", "Kubernetes")]),
    )
    .await
    .expect("authenticated");
    assert_eq!(caller.identities, ["spiffe://cluster.local/ns/istio-system/sa/ztunnel"]);
    assert_eq!(
        caller.method,
        AuthMethod::KubernetesToken(ServiceAccountCaller {
            namespace: "istio-system".to_owned(),
            service_account: "ztunnel".to_owned(),
            pod: Some(BoundPod { name: "zt-1".to_owned(), uid: "uid-zt-1".to_owned() }),
        })
    );
    assert_eq!(
        reviewer.reviews(),
        [("ztunnel".to_owned(), vec!["istio-ca".to_owned()])],
        "reviewed for istio-ca"
    );
    // An alias and an empty clusterid are this cluster too.
    for cluster in ["alias", ""] {
        kube_auth(reviewer.clone(), &metadata(&[("authorization", "Bearer web"), ("clusterid", cluster)]))
            .await
            .expect("local cluster");
    }
}

#[tokio::test]
async fn kubernetes_token_refusals() {
    let cases: &[(&[(&'static str, &str)], &str)] = &[
        (&[], "kubernetes token: no bearer token"),
        (
            &[("authorization", "bearer web")],
            "kubernetes token: the authorization metadata is not `Bearer <token>`",
        ),
        (&[("authorization", "Bearer ")], "kubernetes token: the bearer token is empty"),
        (
            &[("authorization", "Bearer other-aud")],
            "kubernetes token: the token review failed: token audiences [\"vault\"] is invalid for the target audiences [\"istio-ca\"]",
        ),
        (
            &[("authorization", "Bearer forged")],
            "kubernetes token: the token review failed: invalid bearer token",
        ),
        (
            &[("authorization", "Bearer not-an-sa")],
            "kubernetes token: the token is not a service account token",
        ),
        (
            &[("authorization", "Bearer odd-user")],
            "kubernetes token: username \"system:serviceaccount:default\" is not system:serviceaccount:<ns>:<sa>",
        ),
        (
            &[("authorization", "Bearer web"), ("clusterid", "remote")],
            "kubernetes token: clusterid \"remote\" is not this cluster (\"Kubernetes\")",
        ),
    ];
    for (md, want) in cases {
        assert_eq!(reason(kube_auth(reviewer(), &metadata(md)).await), *want, "{md:?}");
    }
}

#[tokio::test]
async fn a_review_without_audiences_is_refused() {
    let reviewer = FakeReviewer::not_audience_aware();
    reviewer.insert("web", FakeToken::service_account("default", "web", "istio-ca", None));
    let got = reason(kube_auth(Arc::new(reviewer), &metadata(&[("authorization", "Bearer web")])).await);
    assert_eq!(got, "kubernetes token: the token is not for audience istio-ca (the review returned [])");
}

/// A reviewer that never answers.
struct Stuck;

impl TokenReviewer for Stuck {
    fn review<'a>(
        &'a self,
        _: &'a str,
        _: &'a [String],
    ) -> BoxFuture<'a, Result<k8s_openapi::api::authentication::v1::TokenReviewStatus, ReviewError>> {
        Box::pin(futures::future::pending())
    }
}

#[tokio::test(start_paused = true)]
async fn a_stuck_review_times_out() {
    let auth = KubeJwtAuthenticator::new(Arc::new(Stuck), kube_config());
    let chain = AuthChain::new().with_kubernetes(Arc::new(auth));
    let md = metadata(&[("authorization", "Bearer web")]);
    let started = tokio::time::Instant::now();
    let got = reason(chain.authenticate(AuthRequest { metadata: &md, peer: None }).await);
    assert_eq!(got, "kubernetes token: the token review took longer than 5s");
    assert_eq!(started.elapsed(), REVIEW_TIMEOUT);
}

fn proxy_identity() -> Identity {
    Identity::new(TD, "istio-system", "ztunnel")
}

#[tokio::test]
async fn node_tokens_are_private_random_files_naming_their_node() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("tokens");
    let tokens = NodeTokens::create(&dir, ["node-a".to_owned(), "node-b".to_owned()], &proxy_identity())
        .expect("create");
    assert_eq!(std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777, 0o700);
    let a = std::fs::read_to_string(dir.join("node-a.token")).expect("a");
    let b = std::fs::read_to_string(dir.join("node-b.token")).expect("b");
    assert_eq!(std::fs::metadata(dir.join("node-a.token")).expect("a").permissions().mode() & 0o777, 0o600);
    assert_eq!(a.len(), 43, "256 random bits, base64url");
    assert_ne!(a, b);

    let chain = AuthChain::new().with_node_tokens(Arc::new(tokens));
    let md = metadata(&[("authorization", &format!("Bearer {b}"))]);
    let caller = chain.authenticate(AuthRequest { metadata: &md, peer: None }).await.expect("node token");
    assert_eq!(caller.identities, ["spiffe://cluster.local/ns/istio-system/sa/ztunnel"]);
    assert_eq!(caller.method, AuthMethod::NodeToken { node: "node-b".to_owned() });

    let md = metadata(&[("authorization", &format!("Bearer {a}x"))]);
    let got = reason(chain.authenticate(AuthRequest { metadata: &md, peer: None }).await);
    assert_eq!(got, "node token: the bearer token is not a node token");

    // A restart writes new tokens; the old ones no longer authenticate.
    let again = NodeTokens::create(&dir, ["node-a".to_owned()], &proxy_identity()).expect("restart");
    assert_ne!(std::fs::read_to_string(dir.join("node-a.token")).expect("a"), a);
    assert!(again.authenticate(&a).is_none());

    for bad in ["", "../x", "Node", "a/b", "-a", "a..b"] {
        assert!(matches!(again.add(bad), Err(NodeTokenError::NodeName(_))), "{bad:?} accepted");
    }
}

fn pods() -> Arc<FakePods> {
    let pods = FakePods::default();
    pods.insert("istio-system", "zt-1", "uid-zt-1", "ztunnel", "node-a");
    pods.insert("default", "web-1", "uid-web-1", "web", "node-a");
    pods.insert("default", "db-1", "uid-db-1", "db", "node-b");
    Arc::new(pods)
}

fn authorizer() -> NodeAuthorizer {
    NodeAuthorizer::new("istio-system/ztunnel".parse().expect("accounts"), pods(), TD)
}

fn sa_caller(ns: &str, sa: &str, pod: Option<(&str, &str)>) -> Caller {
    Caller {
        identities: vec![format!("spiffe://{TD}/ns/{ns}/sa/{sa}")],
        method: AuthMethod::KubernetesToken(ServiceAccountCaller {
            namespace: ns.to_owned(),
            service_account: sa.to_owned(),
            pod: pod.map(|(name, uid)| BoundPod { name: name.to_owned(), uid: uid.to_owned() }),
        }),
    }
}

#[test]
fn node_authorization() {
    let auth = authorizer();
    let ztunnel = sa_caller("istio-system", "ztunnel", Some(("zt-1", "uid-zt-1")));
    let web = "spiffe://cluster.local/ns/default/sa/web";
    assert_eq!(auth.authorize(&ztunnel, web), Ok(Identity::new(TD, "default", "web")));
    let refused = |caller: &Caller, requested: &str| {
        auth.authorize(caller, requested).expect_err("refused").to_string()
    };
    assert_eq!(
        refused(&ztunnel, "spiffe://cluster.local/ns/default/sa/db"),
        "no pod with service account db in namespace default runs on node node-a"
    );
    assert_eq!(
        refused(&sa_caller("default", "web", Some(("web-1", "uid-web-1"))), web),
        "caller default/web is not in CA_TRUSTED_NODE_ACCOUNTS"
    );
    assert_eq!(
        refused(&ztunnel, "spiffe://cluster.local/ns/default/sa/web/x"),
        "the impersonated identity is invalid: identity \"spiffe://cluster.local/ns/default/sa/web/x\" is not of the form spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
    );
    assert_eq!(
        refused(&ztunnel, "spiffe://other.td/ns/default/sa/web"),
        "the impersonated identity spiffe://other.td/ns/default/sa/web is not in trust domain \"cluster.local\""
    );
    assert_eq!(
        refused(&sa_caller("istio-system", "ztunnel", None), web),
        "the caller's token is not bound to a pod (no pod name and uid in the TokenReview)"
    );
    assert_eq!(
        refused(&sa_caller("istio-system", "ztunnel", Some(("zt-9", "uid-zt-9"))), web),
        "the caller's pod istio-system/zt-9 is not known"
    );
    assert_eq!(
        refused(&sa_caller("istio-system", "ztunnel", Some(("zt-1", "stale"))), web),
        "the caller's pod istio-system/zt-1 has uid uid-zt-1, the token is bound to uid stale"
    );
    let cert = Caller { identities: vec![web.to_owned()], method: AuthMethod::ClientCertificate };
    assert_eq!(
        refused(&cert, web),
        "a caller authenticated by client certificate cannot impersonate (no pod or node is known for it)"
    );

    // A node-token caller is a trusted node account on its node, whatever the list says.
    let empty = NodeAuthorizer::new(TrustedNodeAccounts::default(), pods(), TD);
    let node_b = Caller { identities: vec![], method: AuthMethod::NodeToken { node: "node-b".to_owned() } };
    assert_eq!(
        empty.authorize(&node_b, "spiffe://cluster.local/ns/default/sa/db"),
        Ok(Identity::new(TD, "default", "db"))
    );
    assert_eq!(
        empty.authorize(&node_b, web).expect_err("not on node-b").to_string(),
        "no pod with service account web in namespace default runs on node node-b"
    );
}

#[test]
fn a_pod_running_as_another_service_account_is_refused() {
    let pods = FakePods::default();
    pods.insert("istio-system", "zt-1", "uid-zt-1", "other", "node-a");
    let auth = NodeAuthorizer::new("istio-system/ztunnel".parse().expect("accounts"), Arc::new(pods), TD);
    let got = auth
        .authorize(
            &sa_caller("istio-system", "ztunnel", Some(("zt-1", "uid-zt-1"))),
            "spiffe://cluster.local/ns/a/sa/b",
        )
        .expect_err("refused");
    assert_eq!(
        got.to_string(),
        "the caller's pod istio-system/zt-1 runs as service account other, the token is for ztunnel"
    );
}

#[test]
fn trusted_node_accounts_parse() {
    let accounts: TrustedNodeAccounts = " istio-system/ztunnel, kube-system/ambit ,".parse().expect("parse");
    assert!(accounts.contains("istio-system", "ztunnel") && accounts.contains("kube-system", "ambit"));
    assert!(!accounts.contains("istio-system", "ambit"));
    assert!("".parse::<TrustedNodeAccounts>().expect("empty").is_empty());
    for bad in ["ztunnel", "a/b/c", "/b", "a/"] {
        assert_eq!(
            bad.parse::<TrustedNodeAccounts>(),
            Err(TrustedNodeAccountsError(bad.to_owned())),
            "{bad}"
        );
    }
}

/// A one-shot HTTP/1.1 server: answers the first request on each connection with `status` and
/// `body`, and hands back what it received (request line and headers, body).
async fn one_shot_api_server(
    status: &'static str,
    reply_body: String,
) -> (String, tokio::sync::oneshot::Receiver<(String, String)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.expect("accept");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let (head, body) = loop {
            let n = conn.read(&mut chunk).await.expect("read");
            assert!(n > 0, "connection closed before a full request");
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let head = text[..end].to_owned();
                let len = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().expect("len"))
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    break (head, text[end + 4..end + 4 + len].to_owned());
                }
            }
        };
        let reply = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply_body}",
            reply_body.len()
        );
        conn.write_all(reply.as_bytes()).await.expect("write");
        let _ = tx.send((head, body));
    });
    (url, rx)
}

fn kube_client(url: &str) -> ::kube::Client {
    let config = ::kube::Config::new(url.parse().expect("url"));
    ::kube::Client::try_from(config).expect("client")
}

#[tokio::test]
async fn the_kube_reviewer_posts_a_token_review_with_our_audiences() {
    let answer = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "t0k3n", "audiences": ["istio-ca"]},
        "status": {
            "authenticated": true,
            "audiences": ["istio-ca"],
            "user": {
                "username": "system:serviceaccount:default:web",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {
                    "authentication.kubernetes.io/pod-name": ["web-1"],
                    "authentication.kubernetes.io/pod-uid": ["uid-web-1"]
                }
            }
        }
    });
    let (url, seen) = one_shot_api_server("201 Created", answer.to_string()).await;
    let auth = KubeJwtAuthenticator::new(Arc::new(KubeTokenReviewer::new(kube_client(&url))), kube_config());
    let chain = AuthChain::new().with_kubernetes(Arc::new(auth));
    let md = metadata(&[("authorization", "Bearer t0k3n")]);
    let caller = chain.authenticate(AuthRequest { metadata: &md, peer: None }).await.expect("authenticated");
    assert_eq!(caller.identities, ["spiffe://cluster.local/ns/default/sa/web"]);
    let (head, body) = seen.await.expect("request");
    assert!(head.starts_with("POST /apis/authentication.k8s.io/v1/tokenreviews"), "{head}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("json body");
    assert_eq!(body["kind"], "TokenReview");
    assert_eq!(body["spec"], serde_json::json!({"token": "t0k3n", "audiences": ["istio-ca"]}));
}

#[tokio::test]
async fn a_forbidden_token_review_names_the_missing_permission() {
    let answer = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": "tokenreviews.authentication.k8s.io is forbidden: User \"system:serviceaccount:istio-system:ambit\" cannot create resource \"tokenreviews\""
    });
    let (url, _seen) = one_shot_api_server("403 Forbidden", answer.to_string()).await;
    let reviewer = KubeTokenReviewer::new(kube_client(&url));
    let err = reviewer.review("t0k3n", &["istio-ca".to_owned()]).await.expect_err("forbidden");
    assert_eq!(
        err.to_string(),
        "the API server refused the TokenReview (403): tokenreviews.authentication.k8s.io is forbidden: User \"system:serviceaccount:istio-system:ambit\" cannot create resource \"tokenreviews\"; grant the control plane's service account `create` on `tokenreviews.authentication.k8s.io` (ClusterRole system:auth-delegator)"
    );
}

/// A reviewer that answers every review with one status.
struct StaticReviewer(k8s_openapi::api::authentication::v1::TokenReviewStatus);

impl TokenReviewer for StaticReviewer {
    fn review<'a>(
        &'a self,
        _: &'a str,
        _: &'a [String],
    ) -> BoxFuture<'a, Result<k8s_openapi::api::authentication::v1::TokenReviewStatus, ReviewError>> {
        Box::pin(std::future::ready(Ok(self.0.clone())))
    }
}

#[tokio::test]
async fn a_review_that_is_not_authenticated_is_refused_even_without_an_error() {
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};
    let status = TokenReviewStatus {
        authenticated: Some(false),
        audiences: Some(vec!["istio-ca".to_owned()]),
        user: Some(UserInfo {
            username: Some("system:serviceaccount:default:web".to_owned()),
            groups: Some(vec!["system:serviceaccounts".to_owned()]),
            ..UserInfo::default()
        }),
        error: None,
    };
    let auth = KubeJwtAuthenticator::new(Arc::new(StaticReviewer(status)), kube_config());
    let chain = AuthChain::new().with_kubernetes(Arc::new(auth));
    let md = metadata(&[("authorization", "Bearer web")]);
    let got = reason(chain.authenticate(AuthRequest { metadata: &md, peer: None }).await);
    assert_eq!(got, "kubernetes token: the token is not authenticated");
}

/// An authorizer over `pods` that waits up to 2 s (at most `max_waiting` requests) for pod
/// index updates sent on the returned channel.
fn catching_up(pods: Arc<FakePods>, max_waiting: usize) -> (NodeAuthorizer, tokio::sync::watch::Sender<u64>) {
    let (tx, rx) = tokio::sync::watch::channel(0);
    let catch_up = CatchUp { max_wait: std::time::Duration::from_secs(2), max_waiting };
    let auth = NodeAuthorizer::new("istio-system/ztunnel".parse().expect("accounts"), pods, TD)
        .with_catch_up(rx, catch_up);
    (auth, tx)
}

#[tokio::test(start_paused = true)]
async fn a_pod_the_index_gets_late_is_authorized_when_it_arrives() {
    let pods = pods();
    let (auth, updates) = catching_up(pods.clone(), 8);
    let auth = Arc::new(auth);
    let ztunnel = sa_caller("istio-system", "ztunnel", Some(("zt-1", "uid-zt-1")));
    let api = "spiffe://cluster.local/ns/default/sa/api";
    let started = tokio::time::Instant::now();
    let waiting = tokio::spawn({
        let (auth, ztunnel) = (auth.clone(), ztunnel.clone());
        async move { auth.authorize_when_known(&ztunnel, api).await }
    });
    // An unrelated index update: decided again, still refused, still waiting.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    updates.send_modify(|g| *g += 1);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "decided before the pod arrived");
    pods.insert("default", "api-1", "uid-api-1", "api", "node-a");
    updates.send_modify(|g| *g += 1);
    assert_eq!(waiting.await.expect("task"), Ok(Identity::new(TD, "default", "api")));
    assert_eq!(started.elapsed(), std::time::Duration::from_millis(300), "decided at the update");
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_never_arrives_is_refused_after_the_wait_and_other_refusals_at_once() {
    let (auth, _updates) = catching_up(pods(), 1);
    let ztunnel = sa_caller("istio-system", "ztunnel", Some(("zt-1", "uid-zt-1")));
    let db = "spiffe://cluster.local/ns/default/sa/db";
    let started = tokio::time::Instant::now();
    assert_eq!(
        auth.authorize_when_known(&ztunnel, db).await.expect_err("refused").to_string(),
        "no pod with service account db in namespace default runs on node node-a"
    );
    assert_eq!(started.elapsed(), std::time::Duration::from_secs(2));

    // Refusals no pod can cure are not held.
    let started = tokio::time::Instant::now();
    let web = sa_caller("default", "web", Some(("web-1", "uid-web-1")));
    assert!(matches!(auth.authorize_when_known(&web, db).await, Err(NodeAuthError::Untrusted { .. })));
    assert!(matches!(
        auth.authorize_when_known(&ztunnel, "spiffe://other.td/ns/default/sa/db").await,
        Err(NodeAuthError::TrustDomain { .. })
    ));
    assert_eq!(started.elapsed(), std::time::Duration::ZERO);

    // With the one waiting slot taken, a second request is decided at once.
    let auth = Arc::new(auth);
    let first = tokio::spawn({
        let (auth, ztunnel) = (auth.clone(), ztunnel.clone());
        async move { auth.authorize_when_known(&ztunnel, db).await }
    });
    tokio::task::yield_now().await;
    let started = tokio::time::Instant::now();
    assert!(matches!(auth.authorize_when_known(&ztunnel, db).await, Err(NodeAuthError::NoPodOnNode { .. })));
    assert_eq!(started.elapsed(), std::time::Duration::ZERO, "the second request waited");
    assert!(matches!(first.await.expect("task"), Err(NodeAuthError::NoPodOnNode { .. })));
}

#[tokio::test]
async fn without_catch_up_a_refusal_is_immediate() {
    let auth = authorizer();
    let ztunnel = sa_caller("istio-system", "ztunnel", Some(("zt-1", "uid-zt-1")));
    let started = std::time::Instant::now();
    assert!(matches!(
        auth.authorize_when_known(&ztunnel, "spiffe://cluster.local/ns/default/sa/db").await,
        Err(NodeAuthError::NoPodOnNode { .. })
    ));
    assert!(started.elapsed() < std::time::Duration::from_millis(500));
}
