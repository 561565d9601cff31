//! gRPC through the waypoint in-process: HTTP/2 both ways, the status counted from the
//! trailers, local answers trailers-only, Istio's default retry of UNAVAILABLE and CANCELLED.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ambit_api::waypoint as api;
use ambit_identity::FakeCa;
use ambit_waypoint::testing::{Harness, body, endpoint, service, text};
use http::{Request, StatusCode};

mod common;
use common::*;

/// Istio's default retry covers gRPC `UNAVAILABLE` and `CANCELLED` answered trailers-only: the
/// endpoint that answers them is left for another (before, its `grpc-status: 14` reached the
/// client).
#[tokio::test]
async fn istios_default_retry_retries_grpc_unavailable_and_cancelled() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let grpc = service(
        "grpc",
        Some("10.0.0.12"),
        &[(9090, 8080, api::Protocol::Grpc)],
        vec![endpoint("10.1.0.1"), endpoint("10.1.0.2")],
    );
    h.configure(&[named("app-ns/grpc", grpc)], &[]);
    let mut c = h.http2(sock("10.0.0.12:9090")).await;
    for code in [14, 1] {
        backends[0].status.store(code, Ordering::Relaxed);
        for _ in 0..4 {
            let req = Request::post("http://grpc.app-ns/pkg.Echo/Say")
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(body(&[0u8, 0, 0, 0, 0][..]))
                .expect("request");
            let resp =
                tokio::time::timeout(T, c.send_request(req)).await.expect("in time").expect("response");
            assert_eq!(resp.headers().get("grpc-status"), None, "grpc-status {code} reached the client");
            let collected = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body");
            let trailers = collected.trailers().cloned().expect("trailers");
            assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
        }
    }
    assert!(backends[0].requests() > 0, "the failing endpoint was never tried");
    assert!(h.waypoint.counters().retries() >= 1, "retries: {}", h.waypoint.counters().retries());
    // A route's own retry policy lists HTTP statuses only: gRPC statuses are not retried.
    let mut grpc =
        service("grpc", Some("10.0.0.12"), &[(9090, 8080, api::Protocol::Grpc)], vec![endpoint("10.1.0.1")]);
    let mut r = route("app-ns/grpc#0", vec![backend("app-ns/grpc", 9090, 1)]);
    r.retry = Some(api::Retry { attempts: 2, codes: vec![503], backoff_ms: 0 });
    grpc.routes = vec![r];
    h.configure(&[named("app-ns/grpc", grpc)], &[]);
    backends[0].status.store(14, Ordering::Relaxed);
    let before = h.waypoint.counters().retries();
    let req = Request::post("http://grpc.app-ns/pkg.Echo/Say")
        .header("content-type", "application/grpc")
        .body(body(&[0u8, 0, 0, 0, 0][..]))
        .expect("request");
    let resp = tokio::time::timeout(T, c.send_request(req)).await.expect("in time").expect("response");
    assert_eq!(resp.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"14"[..]));
    assert_eq!(h.waypoint.counters().retries(), before);
}

#[tokio::test]
async fn http2_and_grpc_requests_go_through_as_http2() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let h2 =
        service("h2", Some("10.0.0.11"), &[(80, 8080, api::Protocol::Http2)], vec![endpoint("10.1.0.1")]);
    let grpc =
        service("grpc", Some("10.0.0.12"), &[(9090, 8080, api::Protocol::Grpc)], vec![endpoint("10.1.0.2")]);
    h.configure(&[named("app-ns/h2", h2), named("app-ns/grpc", grpc)], &[]);

    let mut c = h.http2(sock("10.0.0.11:80")).await;
    let req = Request::get("http://h2.app-ns/x").body(body("")).expect("request");
    let resp = tokio::time::timeout(T, c.send_request(req)).await.expect("in time").expect("response");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(text(resp).await, (StatusCode::OK, "a".into()));
    assert_eq!(backends[0].last().expect("seen").version, http::Version::HTTP_2);

    let mut c = h.http2(sock("10.0.0.12:9090")).await;
    let req = Request::post("http://grpc.app-ns/pkg.Echo/Say")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body(&[0u8, 0, 0, 0, 0][..]))
        .expect("request");
    let resp = tokio::time::timeout(T, c.send_request(req)).await.expect("in time").expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    let collected = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body");
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
    let seen = backends[1].last().expect("seen");
    assert_eq!((seen.version, seen.path.as_str()), (http::Version::HTTP_2, "/pkg.Echo/Say"));
    // gRPC servers need `te: trailers`; it is the one TE value passed on.
    assert_eq!(seen.headers.get("te").map(|v| v.as_bytes()), Some(&b"trailers"[..]));
    // Counted once its body ended, with the status its trailers carried.
    let mut registry = prometheus_client::registry::Registry::default();
    h.waypoint.counters().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let grpc = |name: &str| -> Vec<&str> {
        text.lines().filter(|l| l.starts_with(name) && l.contains("request_protocol=\"grpc\"")).collect()
    };
    let counted = grpc("istio_requests_total{");
    assert_eq!(counted.len(), 1, "{text}");
    assert!(
        counted[0].contains("grpc_response_status=\"0\"") && counted[0].ends_with("} 1"),
        "{}",
        counted[0]
    );
    // Its duration too, in Istio's histogram (one observation).
    let count = grpc("istio_request_duration_milliseconds_count{");
    assert!(count.len() == 1 && count[0].ends_with("} 1"), "{text}");
}

#[tokio::test]
async fn a_denied_grpc_request_gets_a_trailers_only_permission_denied() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let mut grpc =
        service("grpc", Some("10.0.0.12"), &[(9090, 8080, api::Protocol::Grpc)], vec![endpoint("10.1.0.2")]);
    let policies = vec![policy(
        "deny-forbidden",
        api::policy::Action::Deny,
        api::Rule {
            to: vec![api::Operation { paths: vec!["/pkg.Echo/Forbidden".into()], ..Default::default() }],
            ..Default::default()
        },
    )];
    grpc.policies = vec![policies[0].0.clone()];
    h.configure(&[named("app-ns/grpc", grpc)], &policies);
    let mut c = h.http2(sock("10.0.0.12:9090")).await;
    let req = Request::post("http://grpc.app-ns/pkg.Echo/Forbidden")
        .header("content-type", "application/grpc")
        .body(body(&[0u8, 0, 0, 0, 0][..]))
        .expect("request");
    let resp = tokio::time::timeout(T, c.send_request(req)).await.expect("in time").expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers().get("grpc-status").map(|v| v.as_bytes()), Some(&b"7"[..]));
    assert_eq!(resp.headers().get("grpc-message").map(|v| v.as_bytes()), Some(&b"RBAC: access denied"[..]));
    assert_eq!(h.waypoint.counters().denials("app-ns/deny-forbidden"), 1);
    assert_eq!(h.waypoint.counters().responses(403), 1);
    assert_eq!(backends[1].requests(), 0);
}
