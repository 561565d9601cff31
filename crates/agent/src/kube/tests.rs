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
