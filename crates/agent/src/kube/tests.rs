use super::*;
use http::{Request, Response};
use kube::client::Body;

#[test]
fn patch_shape() {
    assert_eq!(
        redirection_patch(Some("enabled")),
        serde_json::json!({"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}}})
    );
    assert_eq!(
        redirection_patch(None),
        serde_json::json!({"metadata": {"annotations": {"ambient.istio.io/redirection": null}}})
    );
}

#[test]
fn converts_api_objects() {
    let pod: k8s::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "demo", "uid": "u1", "labels": {"app": "web"}},
        "spec": {"containers": [], "nodeName": "n1", "serviceAccountName": "web"},
        "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.4"}]}
    }))
    .expect("pod");
    let bad: k8s::Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).expect("pod");
    let ns: k8s::Namespace = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "demo", "labels": {"istio.io/dataplane-mode": "ambient"}}}),
    )
    .expect("ns");
    let inv = inventory(&[Arc::new(pod), Arc::new(bad)], &[Arc::new(ns)]);
    assert_eq!(inv.pods.len(), 1, "an object without uid/namespace is skipped");
    let p = &inv.pods["u1"];
    assert_eq!((p.service_account.as_str(), p.node_name.as_str(), p.ips.len()), ("web", "n1", 1));
    assert_eq!(inv.namespaces["demo"].labels.len(), 1);
}

/// The annotator sends a merge patch to the pods/status subresource, and treats 404 as done.
#[tokio::test]
async fn annotates_through_pods_status() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let annotate = KubeAnnotate::new(client);
    let pod = Pod { uid: "u1".into(), name: "web".into(), namespace: "demo".into(), ..Default::default() };
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("a request");
        assert_eq!(req.method(), http::Method::PATCH);
        assert_eq!(req.uri().path(), "/api/v1/namespaces/demo/pods/web/status");
        assert_eq!(
            req.headers().get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/merge-patch+json")
        );
        let body = req.into_body().collect_bytes().await.expect("body");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v, redirection_patch(Some("enabled")));
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "demo"}});
        send.send_response(
            Response::builder().body(Body::from(serde_json::to_vec(&pod).expect("json"))).expect("resp"),
        );
        let (_req, send) = handle.next_request().await.expect("second request");
        let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "pods \"web\" not found"});
        send.send_response(
            Response::builder()
                .status(404)
                .body(Body::from(serde_json::to_vec(&status).expect("json")))
                .expect("resp"),
        );
    });
    annotate.set_redirection(&pod, Some("enabled")).await.expect("patched");
    annotate.set_redirection(&pod, None).await.expect("404 counts as done");
    server.await.expect("mock server");
}

// ---- Against the scripted API server, through a real kube::Client from a kubeconfig file ----

use std::time::Duration;

use super::testing::ScriptedApi;
use crate::enroll::{AMBIENT, DATAPLANE_MODE};

fn api_pod(name: &str, node: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo", "uid": uid, "generateName": "web-"},
        "spec": {"nodeName": node, "serviceAccountName": "web", "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.4", "podIPs": [{"ip": "10.0.0.4"}]}
    })
}

/// Polls the source until `check` holds on a polled inventory.
async fn until_inventory(src: &mut KubeSource, what: &str, check: impl Fn(&Inventory) -> bool) -> Inventory {
    let mut last = Inventory::default();
    for _ in 0..300 {
        if let Some(inv) = src.poll() {
            last = inv;
        }
        if check(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}; last inventory: {last:?}");
}

/// The source lists this node's pods and all namespaces, follows ADDED/MODIFIED/DELETED events
/// and bookmarks, and relists after a 410 Gone (objects deleted while no watch saw it vanish).
#[tokio::test]
async fn follows_list_watch_bookmarks_and_relists_after_410() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put_namespace("demo", &[(DATAPLANE_MODE, AMBIENT)]);
    api.put_pod(api_pod("web-a", "node-1", "ua"));
    api.put_pod(api_pod("other", "node-2", "uo"));
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let mut src = KubeSource::start(client, "node-1");
    let mut reasons = Vec::new();
    src.synced(Duration::from_secs(10), |r| reasons.push(r.to_owned())).await.expect("synced");
    assert!(reasons.iter().all(|r| r.starts_with("waiting for the initial list of ")), "{reasons:?}");
    let inv = until_inventory(&mut src, "the initial lists", |i| !i.pods.is_empty()).await;
    assert_eq!(inv.pods.keys().collect::<Vec<_>>(), ["ua"], "only this node's pods");
    assert_eq!(inv.pods["ua"].generate_name, "web-");
    assert_eq!(inv.namespaces["demo"].labels.get(DATAPLANE_MODE).map(String::as_str), Some(AMBIENT));
    // The pod list asked for this node only.
    let lists: Vec<_> = api.requests().into_iter().filter(|r| r.path == "/api/v1/pods").collect();
    assert!(
        !lists.is_empty()
            && lists
                .iter()
                .all(|r| r.query.get("fieldSelector").map(String::as_str) == Some("spec.nodeName=node-1")),
        "{lists:?}"
    );

    // Watch events reach the model.
    api.put_pod(api_pod("web-b", "node-1", "ub"));
    until_inventory(&mut src, "ADDED web-b", |i| i.pods.contains_key("ub")).await;
    let mut b = api_pod("web-b", "node-1", "ub");
    b["metadata"]["labels"] = serde_json::json!({"app": "web"});
    api.put_pod(b);
    until_inventory(&mut src, "MODIFIED web-b", |i| {
        i.pods.get("ub").is_some_and(|p| p.labels.contains_key("app"))
    })
    .await;
    api.delete_pod("demo", "web-a");
    until_inventory(&mut src, "DELETED web-a", |i| !i.pods.contains_key("ua") && i.pods.contains_key("ub"))
        .await;
    api.put_namespace("demo", &[]);
    until_inventory(&mut src, "MODIFIED namespace", |i| {
        i.namespaces.get("demo").is_some_and(|n| n.labels.is_empty())
    })
    .await;
    // A bookmark moves the resourceVersion on without changing the model.
    let before = api.count("watch", "/api/v1/pods");
    api.bookmark("pods");
    api.put_pod(api_pod("web-c", "node-1", "uc"));
    until_inventory(&mut src, "ADDED after a bookmark", |i| i.pods.contains_key("uc")).await;
    assert_eq!(api.count("watch", "/api/v1/pods"), before, "a bookmark does not restart the watch");

    // A pod vanishes with no event (lost while the watch was down), then the watch expires:
    // only the relist that the 410 forces can show it gone.
    let lists_before = api.count("list", "/api/v1/pods");
    api.delete_pod_silently("demo", "web-b");
    api.expire_watches("pods");
    let inv =
        until_inventory(&mut src, "the relist", |i| i.pods.contains_key("uc") && !i.pods.contains_key("ub"))
            .await;
    assert_eq!(inv.pods.len(), 1, "{inv:?}");
    assert!(api.count("list", "/api/v1/pods") > lists_before, "410 Gone must force a new list");
}

/// A 403 on the initial list fails start-up at once, naming the resource and the verb.
#[tokio::test]
async fn forbidden_list_fails_synced_with_resource_and_verb() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put_namespace("demo", &[]);
    api.forbid("pods", "list");
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let src = KubeSource::start(client, "node-1");
    let started = std::time::Instant::now();
    let err = src.synced(Duration::from_secs(30), |_| {}).await.expect_err("403");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(matches!(&err, KubeSourceError::Forbidden { resource: "pods", verb: "list", .. }), "{err:?}");
    assert!(
        err.to_string().starts_with("the Kubernetes API server refused to list pods (403 Forbidden: pods is forbidden: User \"system:serviceaccount:ambit-system:ambit-agent\" cannot list resource \"pods\""),
        "{err}"
    );
}

/// A 403 on the watch after the list (RBAC with list but not watch) is reported too, and one
/// that comes after start-up resolves `failed`.
#[tokio::test]
async fn forbidden_watch_is_fatal_during_and_after_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put_namespace("demo", &[]);
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let src = KubeSource::start(client, "node-1");
    src.synced(Duration::from_secs(10), |_| {}).await.expect("synced");
    api.forbid("namespaces", "watch");
    api.expire_watches("namespaces");
    let err = tokio::time::timeout(Duration::from_secs(20), src.failed()).await.expect("reported in time");
    assert!(matches!(&err, KubeSourceError::Forbidden { resource: "namespaces", .. }), "{err:?}");
}

/// Lists that never come: `synced` reports what it waits for and gives up after its timeout.
#[tokio::test]
async fn held_lists_time_out_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.hold_lists(true);
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let src = KubeSource::start(client, "node-1");
    let mut reasons = Vec::new();
    let err =
        src.synced(Duration::from_millis(600), |r| reasons.push(r.to_owned())).await.expect_err("timeout");
    assert_eq!(
        reasons.first().map(String::as_str),
        Some("waiting for the initial list of pods and namespaces from the Kubernetes API server")
    );
    assert_eq!(
        err.to_string(),
        "the initial list of pods and namespaces from the Kubernetes API server did not complete within 600ms"
    );
    assert!(reasons.len() >= 2, "progress reported while waiting: {reasons:?}");
}

/// The annotator against the scripted API: the patch lands on pods/status, and a 403 is the
/// typed refusal naming the verb and resource.
#[tokio::test]
async fn annotator_patches_and_reports_refusal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put_pod(api_pod("web-a", "node-1", "ua"));
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let annotate = KubeAnnotate::new(client);
    let pod = Pod { uid: "ua".into(), name: "web-a".into(), namespace: "demo".into(), ..Default::default() };
    annotate.set_redirection(&pod, Some("enabled")).await.expect("patched");
    let stored = api.pod("demo", "web-a").expect("pod");
    assert_eq!(stored["metadata"]["annotations"][REDIRECTION], "enabled");
    api.forbid("pods/status", "patch");
    let err = annotate.set_redirection(&pod, None).await.expect_err("403");
    assert_eq!(
        err.to_string(),
        "the API server refused to patch pods/status of pod demo/web-a (403: pods \"web-a\" is forbidden: User \
         \"system:serviceaccount:ambit-system:ambit-agent\" cannot patch resource \"pods/status\" in API group \"\" in \
         the namespace \"demo\"); grant the agent's service account the verb `patch` on the resource `pods/status`"
    );
}
