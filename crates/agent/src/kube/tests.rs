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

use std::collections::HashMap;
use std::time::Duration;

use ambit_objects::testing::ScriptedApi;
use ambit_objects::{Change, Object};

use crate::enroll::{AMBIENT, DATAPLANE_MODE};

fn api_pod(name: &str, node: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo", "uid": uid, "generateName": "web-"},
        "spec": {"nodeName": node, "serviceAccountName": "web", "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.4", "podIPs": [{"ip": "10.0.0.4"}]}
    })
}

/// The agent's watch: this node's pods (converted to the agent's model) and all namespaces.
#[tokio::test]
async fn watches_this_nodes_pods_and_all_namespaces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put_namespace("demo", &[(DATAPLANE_MODE, AMBIENT)]);
    api.put_pod(api_pod("web-a", "node-1", "ua"));
    api.put_pod(api_pod("other", "node-2", "uo"));
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let mut src = watch(client, "node-1");
    src.synced(Duration::from_secs(10), |_| {}).await.expect("synced");
    let mut pods = HashMap::new();
    let mut namespaces = HashMap::new();
    for change in src.poll() {
        match change {
            Change::Upsert(Object::Pod(p)) => {
                let p = Pod::from_k8s(&p).expect("pod");
                pods.insert(p.uid.clone(), p);
            }
            Change::Upsert(Object::Namespace(n)) => {
                let n = crate::model::Namespace::from_k8s(&n).expect("namespace");
                namespaces.insert(n.name.clone(), n);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(pods.keys().collect::<Vec<_>>(), ["ua"], "only this node's pods");
    assert_eq!(pods["ua"].generate_name, "web-");
    assert_eq!(namespaces["demo"].labels.get(DATAPLANE_MODE).map(String::as_str), Some(AMBIENT));
    let lists: Vec<_> = api.requests().into_iter().filter(|r| r.path == "/api/v1/pods").collect();
    assert!(
        !lists.is_empty()
            && lists
                .iter()
                .all(|r| r.query.get("fieldSelector").map(String::as_str) == Some("spec.nodeName=node-1")),
        "{lists:?}"
    );
}

/// A 403 on the initial list fails start-up at once, naming the resource, the verb and what to
/// grant the agent.
#[tokio::test]
async fn forbidden_list_fails_synced_with_resource_and_verb() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = ScriptedApi::start().await;
    api.put_namespace("demo", &[]);
    api.forbid("pods", "list");
    let client = api.client(&dir.path().join("kubeconfig")).await;
    let src = watch(client, "node-1");
    let started = std::time::Instant::now();
    let err = src.synced(Duration::from_secs(30), |_| {}).await.expect_err("403");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(
        err.to_string(),
        "the Kubernetes API server refused to list pods (403 Forbidden: pods is forbidden: User \
         \"system:serviceaccount:ambit-system:ambit-agent\" cannot list resource \"pods\" in API group \"\" at the \
         cluster scope); grant the agent's service account the verbs get, list and watch on pods and namespaces (a \
         ClusterRole bound to it), and patch on pods/status"
    );
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
