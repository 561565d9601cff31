//! Against the scripted API server, through a real `kube::Client` built from a kubeconfig file.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::testing::ScriptedApi;

fn api_pod(name: &str, node: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.4", "podIPs": [{"ip": "10.0.0.4"}]}
    })
}

fn policy(name: &str, action: &str) -> Value {
    json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": "demo"},
        "spec": {"action": action, "rules": [{"from": [{"source": {"namespaces": ["demo"]}}]}]}
    })
}

fn describe(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match c {
            Change::Upsert(o) => format!("upsert {}", o.key()),
            Change::Delete(k) => format!("delete {k}"),
        })
        .collect()
}

/// Polls until the accumulated changes satisfy `done`; returns them, sorted.
async fn until(src: &mut KubeSource, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..300 {
        seen.extend(describe(&src.poll()));
        if done(&seen) {
            // Kinds are watched independently: their changes may come in separate polls.
            seen.sort();
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}; changes so far: {seen:?}");
}

/// Nothing more arrives for a while (after a change that must not be delivered).
async fn quiet(src: &mut KubeSource) -> Vec<String> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    describe(&src.poll())
}

/// Pods (of one node) and an Istio kind: list, then ADDED/MODIFIED/DELETED, bookmarks, and a
/// relist after 410 Gone that turns an object deleted unseen into a Delete and delivers nothing
/// for the objects that did not change.
#[tokio::test]
async fn follows_list_watch_bookmarks_and_relists_after_410() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put_pod(api_pod("web-a", "node-1", "ua"));
    api.put_pod(api_pod("other", "node-2", "uo"));
    api.put(policy("allow", "ALLOW"));
    api.put(policy("deny", "DENY"));
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let filter = Filter::kinds(&[Kind::Pod, Kind::AuthorizationPolicy]).pods_on("node-1");
    let mut src = KubeSource::start(client, &filter, None);
    let mut reasons = Vec::new();
    src.synced(Duration::from_secs(10), |r| reasons.push(r.to_owned())).await.expect("synced");
    assert!(src.is_synced());
    assert!(reasons.iter().all(|r| r.starts_with("waiting for the initial list of ")), "{reasons:?}");
    assert_eq!(
        describe(&src.poll()),
        [
            "upsert Pod demo/web-a",
            "upsert AuthorizationPolicy demo/allow",
            "upsert AuthorizationPolicy demo/deny"
        ],
        "only this node's pods"
    );
    let pod_lists: Vec<_> = api.requests().into_iter().filter(|r| r.path == "/api/v1/pods").collect();
    assert!(
        !pod_lists.is_empty()
            && pod_lists
                .iter()
                .all(|r| r.query.get("fieldSelector").map(String::as_str) == Some("spec.nodeName=node-1")),
        "{pod_lists:?}"
    );
    assert!(api.count("list", "/apis/security.istio.io/v1/authorizationpolicies") >= 1);

    // Watch events.
    api.put_pod(api_pod("web-b", "node-1", "ub"));
    api.put(policy("deny", "AUDIT"));
    let got = until(&mut src, "ADDED web-b, MODIFIED deny", |s| s.len() >= 2).await;
    assert_eq!(got, ["upsert AuthorizationPolicy demo/deny", "upsert Pod demo/web-b"]);
    api.delete(Kind::AuthorizationPolicy, "demo", "allow");
    api.delete_pod("demo", "web-a");
    let got = until(&mut src, "two deletes", |s| s.len() >= 2).await;
    assert_eq!(got, ["delete AuthorizationPolicy demo/allow", "delete Pod demo/web-a"]);

    // A bookmark moves the resourceVersion on without a change and without a new watch.
    let before = api.count("watch", "/api/v1/pods");
    api.bookmark("pods");
    assert_eq!(quiet(&mut src).await, Vec::<String>::new());
    api.put_pod(api_pod("web-c", "node-1", "uc"));
    assert_eq!(until(&mut src, "ADDED after a bookmark", |s| !s.is_empty()).await, ["upsert Pod demo/web-c"]);
    assert_eq!(api.count("watch", "/api/v1/pods"), before, "a bookmark does not restart the watch");

    // Deleted with no event, then the watch expires: the relist the 410 forces shows it gone,
    // and the objects that did not change are not delivered again.
    let lists_before = api.count("list", "/api/v1/pods");
    api.delete_pod_silently("demo", "web-b");
    api.delete_silently(Kind::AuthorizationPolicy, "demo", "deny");
    api.expire_watches("pods");
    api.expire_watches("authorizationpolicies.security.istio.io");
    let got = until(&mut src, "the relists", |s| s.len() >= 2).await;
    assert_eq!(got, ["delete AuthorizationPolicy demo/deny", "delete Pod demo/web-b"]);
    assert_eq!(quiet(&mut src).await, Vec::<String>::new(), "web-c, unchanged, is not delivered again");
    assert!(api.count("list", "/api/v1/pods") > lists_before, "410 Gone must force a new list");
}

/// A 403 on the initial list of an Istio kind fails start-up at once, naming the resource (with
/// its group) and the verb, and what to grant.
#[tokio::test]
async fn forbidden_list_fails_synced_with_resource_and_verb() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.set_user("system:serviceaccount:istio-system:ambit-control");
    api.forbid("peerauthentications.security.istio.io", "list");
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let src = KubeSource::start(client, &Filter::kinds(&[Kind::Pod, Kind::PeerAuthentication]), None);
    let started = std::time::Instant::now();
    let err = src.synced(Duration::from_secs(30), |_| {}).await.expect_err("403");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(
        err.to_string(),
        "the Kubernetes API server refused to list peerauthentications.security.istio.io (403 Forbidden: \
         peerauthentications.security.istio.io is forbidden: User \"system:serviceaccount:istio-system:ambit-control\" \
         cannot list resource \"peerauthentications\" in API group \"security.istio.io\" at the cluster scope); grant \
         the service account the verbs list and watch on pods and peerauthentications.security.istio.io (a \
         ClusterRole bound to it)"
    );
}

/// A 403 on the watch after start-up resolves `failed`, naming the verb.
#[tokio::test]
async fn forbidden_watch_after_start_is_fatal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let src = KubeSource::start(client, &Filter::kinds(&[Kind::Namespace]), Some("grant it".into()));
    src.synced(Duration::from_secs(10), |_| {}).await.expect("synced");
    api.forbid("namespaces", "watch");
    api.expire_watches("namespaces");
    let err = tokio::time::timeout(Duration::from_secs(20), src.failed()).await.expect("reported in time");
    assert!(
        matches!(&err, KubeSourceError::Forbidden { resource, verb: "watch", grant, .. } if resource == "namespaces" && grant == "grant it"),
        "{err:?}"
    );
}

/// Lists that never come: `synced` reports what it waits for and gives up after its timeout.
#[tokio::test]
async fn held_lists_time_out_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.hold_lists(true);
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let src = KubeSource::start(client, &Filter::kinds(&[Kind::Namespace, Kind::Pod, Kind::Service]), None);
    let mut reasons = Vec::new();
    let err =
        src.synced(Duration::from_millis(600), |r| reasons.push(r.to_owned())).await.expect_err("timeout");
    assert_eq!(
        reasons.first().map(String::as_str),
        Some("waiting for the initial list of namespaces, pods and services from the Kubernetes API server")
    );
    assert_eq!(
        err.to_string(),
        "the initial list of namespaces, pods and services from the Kubernetes API server did not complete within 600ms"
    );
    assert!(reasons.len() >= 2, "progress reported while waiting: {reasons:?}");
}

/// A kind whose CRD is not installed (404) counts as listed and empty; once served, its objects
/// arrive.
#[tokio::test]
async fn an_unserved_kind_is_empty_until_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.unserve("gateways.gateway.networking.k8s.io");
    api.put_namespace("demo", &[]);
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let mut src = KubeSource::start(client, &Filter::kinds(&[Kind::Namespace, Kind::Gateway]), None);
    src.synced(Duration::from_secs(10), |_| {}).await.expect("synced without the Gateway CRD");
    assert_eq!(describe(&src.poll()), ["upsert Namespace demo"]);
    api.put(json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "wp", "namespace": "demo"}, "spec": {"gatewayClassName": "istio-waypoint"}}));
    api.serve("gateways.gateway.networking.k8s.io");
    // kube-rs's backoff retries the list within a few seconds.
    let mut seen = Vec::new();
    for _ in 0..150 {
        seen.extend(describe(&src.poll()));
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, ["upsert Gateway demo/wp"]);
}

/// TokenReviews through the real client: a known token, a token for another audience, an
/// unknown token, and a forbidden review.
#[tokio::test]
async fn token_reviews_are_scripted() {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.add_token(
        "good",
        crate::testing::TokenIdentity {
            username: "system:serviceaccount:istio-system:ztunnel".into(),
            uid: "u-1".into(),
            audiences: vec!["istio-ca".into()],
            ..Default::default()
        },
    );
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let reviews: Api<TokenReview> = Api::all(client);
    let review = |token: &str, audience: &str| TokenReview {
        spec: TokenReviewSpec { token: Some(token.into()), audiences: Some(vec![audience.into()]) },
        ..Default::default()
    };
    let pp = kube::api::PostParams::default();
    let ok = reviews.create(&pp, &review("good", "istio-ca")).await.expect("review");
    let status = ok.status.expect("status");
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(
        status.user.and_then(|u| u.username).as_deref(),
        Some("system:serviceaccount:istio-system:ztunnel")
    );
    assert_eq!(status.audiences, Some(vec!["istio-ca".to_owned()]));
    let wrong = reviews.create(&pp, &review("good", "other")).await.expect("review").status.expect("status");
    assert_eq!(wrong.authenticated, Some(false));
    assert_eq!(
        wrong.error.as_deref(),
        Some(
            "[invalid bearer token, token audiences [\"istio-ca\"] is invalid for the target audiences [\"other\"]]"
        )
    );
    let unknown =
        reviews.create(&pp, &review("nope", "istio-ca")).await.expect("review").status.expect("status");
    assert_eq!(unknown.authenticated, Some(false));
    let seen = api.requests().into_iter().filter(|r| r.verb() == "create").count();
    assert_eq!(seen, 3);
    api.forbid("tokenreviews", "create");
    match reviews.create(&pp, &review("good", "istio-ca")).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403),
        other => panic!("expected a 403, got {other:?}"),
    }
}
