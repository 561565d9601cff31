//! The waypoint's data path in-process: a source node proxy (HBONE client) sends CONNECTs to the
//! waypoint, which authorizes, routes and sends the requests over HBONE to a fake node proxy in
//! front of plain HTTP backends.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ambit_api::waypoint as api;
use ambit_hbone::TunnelError;
use ambit_identity::FakeCa;
use ambit_waypoint::testing::{Backend, Harness, NodeProxy, body, endpoint, service, tally, tcp_echo, text};
use http::{Method, Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::*;

#[tokio::test]
async fn policies_allow_and_deny_by_method_path_and_header_and_denials_are_counted_by_policy() {
    let ca = Arc::new(FakeCa::generate());
    let (_backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let mut svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    let policies = vec![
        policy(
            "deny-delete",
            api::policy::Action::Deny,
            api::Rule {
                to: vec![api::Operation { methods: vec!["DELETE".into()], ..Default::default() }],
                ..Default::default()
            },
        ),
        policy(
            "deny-header",
            api::policy::Action::Deny,
            api::Rule {
                when: vec![api::Condition {
                    key: "request.headers[x-block]".into(),
                    values: vec!["yes".into()],
                    not_values: vec![],
                }],
                ..Default::default()
            },
        ),
        policy(
            "allow-paths",
            api::policy::Action::Allow,
            api::Rule {
                to: vec![api::Operation { paths: vec!["/allowed/*".into()], ..Default::default() }],
                ..Default::default()
            },
        ),
    ];
    svc.policies = policies.iter().map(|(n, _)| n.clone()).collect();
    let errors = h.configure(&[named("app-ns/svc", svc)], &policies);
    assert!(errors.is_empty(), "{errors:?}");
    let mut c = h.http1(sock("10.0.0.10:80")).await;

    assert_eq!(send(&mut c, get("/allowed/x")).await, (StatusCode::OK, "a".into()));
    let delete = Request::delete("/allowed/x").header("host", "svc").body(body("")).expect("request");
    assert_eq!(send(&mut c, delete).await, (StatusCode::FORBIDDEN, "RBAC: access denied".into()));
    let blocked = Request::get("/allowed/x")
        .header("host", "svc")
        .header("x-block", "yes")
        .body(body(""))
        .expect("request");
    assert_eq!(send(&mut c, blocked).await, (StatusCode::FORBIDDEN, "RBAC: access denied".into()));
    assert_eq!(send(&mut c, get("/secret")).await, (StatusCode::FORBIDDEN, "RBAC: access denied".into()));
    // `/allowed/../secret` normalizes to `/secret`.
    assert_eq!(
        send(&mut c, get("/allowed/../secret")).await,
        (StatusCode::FORBIDDEN, "RBAC: access denied".into())
    );

    let counters = h.waypoint.counters();
    assert_eq!(counters.denials("app-ns/deny-delete"), 1);
    assert_eq!(counters.denials("app-ns/deny-header"), 1);
    assert_eq!(counters.denials(ambit_waypoint::NO_ALLOW_MATCHED), 2);
    assert_eq!(counters.responses(403), 4);
    assert_eq!(counters.responses(200), 1);

    // istio_requests_total, reporter="waypoint".
    let labels = |code: &str, flags: &str, principal: &str| ambit_waypoint::RequestLabels {
        reporter: "waypoint".into(),
        source_workload_namespace: "default".into(),
        source_principal: "spiffe://cluster.local/ns/default/sa/client".into(),
        destination_service: "svc.app-ns.svc.cluster.local".into(),
        destination_service_name: "svc".into(),
        destination_service_namespace: "app-ns".into(),
        destination_principal: principal.into(),
        request_protocol: "http".into(),
        response_code: code.into(),
        response_flags: flags.into(),
        connection_security_policy: "mutual_tls".into(),
        ..Default::default()
    };
    assert_eq!(counters.requests_total(&labels("403", "RBAC", "")), 4);
    assert_eq!(
        counters.requests_total(&labels("200", "-", "spiffe://cluster.local/ns/app-ns/sa/backend")),
        1
    );
    let mut registry = prometheus_client::registry::Registry::default();
    counters.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let line = text.lines().find(|l| l.contains("response_code=\"403\"")).expect("a 403 line");
    assert!(
        line.starts_with("istio_requests_total{reporter=\"waypoint\",source_workload_namespace=\"default\","),
        "{line}"
    );
    assert!(line.contains("destination_workload=\"unknown\"") && line.ends_with("} 4"), "{line}");
}

#[tokio::test]
async fn request_and_response_sizes_are_recorded_in_istios_histograms_when_the_answer_ends() {
    let ca = Arc::new(FakeCa::generate());
    let (_backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    h.configure(&[named("app-ns/svc", svc)], &[]);
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    let post = Request::post("/x").header("host", "svc").body(body("hello world")).expect("request");
    assert_eq!(send(&mut c, post).await, (StatusCode::OK, "a".into()));

    let mut registry = prometheus_client::registry::Registry::default();
    h.waypoint.counters().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let value = |name: &str| -> &str {
        let line =
            text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {text}"));
        assert!(line.contains("reporter=\"waypoint\"") && line.contains("response_code=\"200\""), "{line}");
        line.rsplit(' ').next().expect("a value")
    };
    // The request: `:method` POST (11 bytes), `:path` /x (7), host: svc (7), content-length: 11
    // (16), then the 11 bytes of its body.
    assert_eq!(value("istio_request_bytes_sum{"), "52.0");
    assert_eq!(value("istio_request_bytes_count{"), "1");
    // The answer: `:status` 200 (10), x-backend: a (10), content-length: 1 (15), date: <29
    // characters> (33), and its body "a".
    assert_eq!(value("istio_response_bytes_sum{"), "69.0");
    assert_eq!(value("istio_response_bytes_count{"), "1");
    assert_eq!(value("istio_requests_total{"), "1");
}

#[tokio::test]
async fn a_90_10_split_holds_per_request_on_one_keepalive_connection() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let mut svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.3")]);
    svc.routes =
        vec![route("app-ns/split#0", vec![backend("app-ns/v1", 80, 90), backend("app-ns/v2", 80, 10)])];
    let v1 = service("v1", None, &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    let v2 = service("v2", None, &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.2")]);
    let errors =
        h.configure(&[named("app-ns/svc", svc), named("app-ns/v1", v1), named("app-ns/v2", v2)], &[]);
    assert!(errors.is_empty(), "{errors:?}");
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    let mut names = Vec::new();
    for _ in 0..200 {
        let (status, name) = send(&mut c, get("/")).await;
        assert_eq!(status, StatusCode::OK);
        names.push(name);
    }
    let t = tally(names.iter().map(String::as_str));
    let a = t.get("a").copied().unwrap_or(0);
    let b = t.get("b").copied().unwrap_or(0);
    assert_eq!(a + b, 200, "{t:?}");
    assert!((160..=200).contains(&a) && (1..=40).contains(&b), "90/10 ±10 points: {t:?}");
    assert_eq!(backends[2].requests(), 0);
    // One downstream connection, one upstream connection per endpoint.
    assert_eq!(node.connects("10.1.0.1:8080"), 1);
    assert_eq!(node.connects("10.1.0.2:8080"), 1);
}

#[tokio::test]
async fn requests_on_one_connection_go_round_robin_over_the_endpoints_with_forwarding_headers() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let svc = service(
        "svc",
        Some("10.0.0.10"),
        &[(80, 8080, api::Protocol::Http)],
        vec![endpoint("10.1.0.1"), endpoint("10.1.0.2"), endpoint("10.1.0.3")],
    );
    h.configure(&[named("app-ns/svc", svc)], &[]);
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    let mut names = Vec::new();
    for _ in 0..9 {
        names.push(send(&mut c, get("/rr")).await.1);
    }
    // Each endpoint in turn: every window of three has all three.
    for w in names.chunks(3) {
        let mut w = w.to_vec();
        w.sort();
        assert_eq!(w, ["a", "b", "c"], "{names:?}");
    }
    for b in &backends {
        assert_eq!(b.requests(), 3);
    }
    let seen = backends[0].last().expect("a request");
    assert_eq!(seen.headers.get("x-forwarded-for").map(|v| v.as_bytes()), Some(&b"127.0.0.1"[..]));
    assert_eq!(seen.headers.get("x-forwarded-proto").map(|v| v.as_bytes()), Some(&b"http"[..]));
    assert_eq!(seen.headers.get("x-request-id").map(|v| v.len()), Some(36));
}

#[tokio::test]
async fn a_slow_backend_gets_504_after_the_request_timeout() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    backends[0].delay_ms.store(5000, Ordering::Relaxed);
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let mut svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    let mut r = route("app-ns/slow#0", vec![backend("app-ns/svc", 80, 1)]);
    r.request_timeout_ms = 300;
    svc.routes = vec![r];
    h.configure(&[named("app-ns/svc", svc)], &[]);
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    let t0 = Instant::now();
    assert_eq!(
        send(&mut c, get("/")).await,
        (StatusCode::GATEWAY_TIMEOUT, "upstream request timeout".into())
    );
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(280) && took < Duration::from_secs(3), "answered after {took:?}");
    assert_eq!(h.waypoint.counters().timeouts(), 1);
    assert_eq!(h.waypoint.counters().responses(504), 1);
}

#[tokio::test]
async fn the_request_timeout_bounds_the_whole_response_not_only_its_head() {
    let ca = Arc::new(FakeCa::generate());
    let (_backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let mut svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    let mut r = route("app-ns/slow#0", vec![backend("app-ns/svc", 80, 1)]);
    r.request_timeout_ms = 300;
    svc.routes = vec![r];
    h.configure(&[named("app-ns/svc", svc)], &[]);
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    c.ready().await.expect("ready");
    let t0 = Instant::now();
    let resp =
        tokio::time::timeout(T, c.send_request(get("/slow-body"))).await.expect("in time").expect("head");
    assert_eq!(resp.status(), StatusCode::OK);
    let body =
        tokio::time::timeout(T, http_body_util::BodyExt::collect(resp.into_body())).await.expect("in time");
    assert!(body.is_err(), "the body completed past the timeout");
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(280) && took < Duration::from_secs(3), "cut after {took:?}");
}

#[tokio::test]
async fn failing_attempts_are_retried_on_another_endpoint() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    backends[0].status.store(503, Ordering::Relaxed);
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    // 10.1.0.1 answers 503, 10.1.0.9 has no app behind the node proxy (CONNECT refused: a
    // connect failure), 10.1.0.2 answers.
    let mut svc = service(
        "svc",
        Some("10.0.0.10"),
        &[(80, 8080, api::Protocol::Http)],
        vec![endpoint("10.1.0.1"), endpoint("10.1.0.9"), endpoint("10.1.0.2")],
    );
    let mut r = route("app-ns/retry#0", vec![backend("app-ns/svc", 80, 1)]);
    r.retry = Some(api::Retry { attempts: 2, codes: vec![503], backoff_ms: 0 });
    svc.routes = vec![r];
    h.configure(&[named("app-ns/svc", svc)], &[]);
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    for _ in 0..6 {
        assert_eq!(send(&mut c, get("/")).await, (StatusCode::OK, "b".into()));
    }
    let counters = h.waypoint.counters();
    assert!(backends[0].requests() > 0 && node.connects("10.1.0.9:8080") > 0);
    assert!(counters.retries() >= 4, "retries: {}", counters.retries());
    assert_eq!(counters.responses(200), 6);
    assert_eq!(counters.responses(503), 0);
}

/// Without a route, or with one that sets no retry policy, a request gets Istio's default: two
/// retries of 503s and connection failures on other endpoints; a route with `attempts: 0` gets
/// none (before, both got none: the 503 endpoint's answers reached the client).
#[tokio::test]
async fn istios_default_retry_applies_unless_a_route_sets_its_own() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    backends[0].status.store(503, Ordering::Relaxed);
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let endpoints = || vec![endpoint("10.1.0.1"), endpoint("10.1.0.2")];
    let plain = service("plain", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], endpoints());
    let mut routed = service("routed", Some("10.0.0.11"), &[(80, 8080, api::Protocol::Http)], endpoints());
    routed.routes = vec![route("app-ns/routed#0", vec![backend("app-ns/routed", 80, 1)])];
    let mut none = service("none", Some("10.0.0.12"), &[(80, 8080, api::Protocol::Http)], endpoints());
    let mut r = route("app-ns/none#0", vec![backend("app-ns/none", 80, 1)]);
    r.retry = Some(api::Retry { attempts: 0, codes: vec![], backoff_ms: 0 });
    none.routes = vec![r];
    h.configure(
        &[named("app-ns/plain", plain), named("app-ns/routed", routed), named("app-ns/none", none)],
        &[],
    );
    for vip in ["10.0.0.10:80", "10.0.0.11:80"] {
        let mut c = h.http1(sock(vip)).await;
        for _ in 0..4 {
            assert_eq!(send(&mut c, get("/")).await, (StatusCode::OK, "b".into()), "{vip}");
        }
    }
    let counters = h.waypoint.counters();
    assert!(backends[0].requests() > 0, "the 503 endpoint was never tried");
    assert!(counters.retries() >= 2, "retries: {}", counters.retries());
    assert_eq!(counters.responses(503), 0);
    let retried = counters.retries();
    let mut c = h.http1(sock("10.0.0.12:80")).await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(send(&mut c, get("/")).await.0);
    }
    assert!(codes.contains(&StatusCode::SERVICE_UNAVAILABLE), "{codes:?}");
    assert_eq!(counters.retries(), retried, "attempts: 0 retried");
}

#[tokio::test]
async fn tcp_ports_relay_bytes_and_an_l4_deny_refuses_the_connect() {
    let ca = Arc::new(FakeCa::generate());
    let echo = tcp_echo().await;
    let node =
        NodeProxy::start(&ca, HashMap::from([(sock("10.1.0.5:9000"), echo), (sock("10.1.0.5:9001"), echo)]))
            .await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let mut svc = service(
        "tcp",
        Some("10.0.0.20"),
        &[(9000, 9000, api::Protocol::Tcp), (9001, 9001, api::Protocol::Tcp)],
        vec![endpoint("10.1.0.5")],
    );
    let policies = vec![
        // L4 deny of port 9001 for the client.
        policy(
            "deny-9001",
            api::policy::Action::Deny,
            api::Rule {
                from: vec![api::Source {
                    principals: vec!["cluster.local/ns/default/sa/client".into()],
                    ..Default::default()
                }],
                to: vec![api::Operation { ports: vec!["9001".into()], ..Default::default() }],
                ..Default::default()
            },
        ),
        // An HTTP-only DENY on port 9000 (a method): on TCP its method is left out, so it
        // would deny 9000 too; it names another principal, so it does not.
        policy(
            "deny-get-other",
            api::policy::Action::Deny,
            api::Rule {
                from: vec![api::Source {
                    principals: vec!["cluster.local/ns/other/sa/x".into()],
                    ..Default::default()
                }],
                to: vec![api::Operation {
                    methods: vec!["GET".into()],
                    ports: vec!["9000".into()],
                    ..Default::default()
                }],
                ..Default::default()
            },
        ),
    ];
    svc.policies = policies.iter().map(|(n, _)| n.clone()).collect();
    let errors = h.configure(&[named("app-ns/tcp", svc)], &policies);
    assert!(errors.is_empty(), "{errors:?}");

    let mut io = h.connect(sock("10.0.0.20:9000")).await.expect("CONNECT to 9000");
    io.write_all(b"hello tcp").await.expect("write");
    io.shutdown().await.expect("shutdown");
    let mut out = Vec::new();
    tokio::time::timeout(T, io.read_to_end(&mut out)).await.expect("in time").expect("read");
    assert_eq!(out, b"hello tcp");
    assert_eq!(h.waypoint.counters().tcp_connections(), 1);

    match h.connect(sock("10.0.0.20:9001")).await {
        Err(TunnelError::Status(s)) => assert_eq!(s, StatusCode::UNAUTHORIZED),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("the denied CONNECT was accepted"),
    }
    assert_eq!(h.waypoint.counters().connection_denials("app-ns/deny-9001"), 1);
    assert_eq!(node.connects("10.1.0.5:9001"), 0);
}

#[tokio::test]
async fn an_undeclared_port_sniffs_http_and_falls_back_to_tcp() {
    let ca = Arc::new(FakeCa::generate());
    let echo = tcp_echo().await;
    let b = Backend::start("a").await;
    let node = NodeProxy::start(
        &ca,
        HashMap::from([(sock("10.1.0.1:8080"), b.addr), (sock("10.1.0.6:7000"), echo)]),
    )
    .await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let web = service(
        "web",
        Some("10.0.0.30"),
        &[(80, 8080, api::Protocol::Undeclared)],
        vec![endpoint("10.1.0.1")],
    );
    let opaque = service(
        "opaque",
        Some("10.0.0.31"),
        &[(7000, 7000, api::Protocol::Undeclared)],
        vec![endpoint("10.1.0.6")],
    );
    h.configure(&[named("app-ns/web", web), named("app-ns/opaque", opaque)], &[]);

    let mut c = h.http1(sock("10.0.0.30:80")).await;
    assert_eq!(send(&mut c, get("/")).await, (StatusCode::OK, "a".into()));

    let mut io = h.connect(sock("10.0.0.31:7000")).await.expect("CONNECT");
    io.write_all(b"\x00\x01binary").await.expect("write");
    io.shutdown().await.expect("shutdown");
    let mut answer = Vec::new();
    tokio::time::timeout(T, io.read_to_end(&mut answer)).await.expect("in time").expect("read");
    assert_eq!(answer, b"\x00\x01binary");
}

#[tokio::test]
async fn method_query_and_header_matches_pick_routes_and_filters_apply() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let mut svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    let v2 = service("v2", None, &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.2")]);
    let to_v2 = {
        let mut r = route("app-ns/r#0", vec![backend("app-ns/v2", 80, 1)]);
        r.matches = vec![api::Match {
            path: Some(api::PathMatch { kind: Some(api::path_match::Kind::Prefix("/api".into())) }),
            headers: vec![api::ValueMatch {
                name: "x-version".into(),
                kind: Some(api::value_match::Kind::Regex("v[2-3]".into())),
            }],
            query_params: vec![api::ValueMatch {
                name: "beta".into(),
                kind: Some(api::value_match::Kind::Exact("1".into())),
            }],
            method: "GET".into(),
        }];
        r.filters = vec![
            api::Filter {
                kind: Some(api::filter::Kind::UrlRewrite(api::Rewrite {
                    hostname: String::new(),
                    path: Some(api::rewrite::Path::Prefix("/v2".into())),
                })),
            },
            api::Filter {
                kind: Some(api::filter::Kind::RequestHeaders(api::HeaderModifier {
                    set: vec![api::Header { name: "x-routed".into(), value: "v2".into() }],
                    ..Default::default()
                })),
            },
            api::Filter {
                kind: Some(api::filter::Kind::ResponseHeaders(api::HeaderModifier {
                    add: vec![api::Header { name: "x-via".into(), value: "waypoint".into() }],
                    ..Default::default()
                })),
            },
        ];
        r
    };
    let redirect = {
        let mut r = route("app-ns/r#1", vec![]);
        r.matches = vec![api::Match {
            path: Some(api::PathMatch { kind: Some(api::path_match::Kind::Exact("/old".into())) }),
            ..Default::default()
        }];
        r.filters = vec![api::Filter {
            kind: Some(api::filter::Kind::Redirect(api::Redirect {
                path: Some(api::redirect::Path::FullPath("/new".into())),
                status_code: 301,
                ..Default::default()
            })),
        }];
        r
    };
    let rest = route("app-ns/r#2", vec![backend("app-ns/svc", 80, 1)]);
    svc.routes = vec![to_v2, redirect, rest];
    let errors = h.configure(&[named("app-ns/svc", svc), named("app-ns/v2", v2)], &[]);
    assert!(errors.is_empty(), "{errors:?}");
    let mut c = h.http1(sock("10.0.0.10:80")).await;

    let req = Request::get("/api/users?beta=1")
        .header("host", "svc")
        .header("x-version", "v3")
        .body(body(""))
        .expect("req");
    c.ready().await.expect("ready");
    let resp = c.send_request(req).await.expect("response");
    assert_eq!(resp.headers().get("x-via").map(|v| v.as_bytes()), Some(&b"waypoint"[..]));
    assert_eq!(text(resp).await, (StatusCode::OK, "b".into()));
    let seen = backends[1].last().expect("seen");
    assert_eq!(seen.path, "/v2/users?beta=1");
    assert_eq!(seen.headers.get("x-routed").map(|v| v.as_bytes()), Some(&b"v2"[..]));

    // `/apix` is not under the prefix `/api`; a POST does not match the method; both fall through.
    let miss = Request::get("/apix?beta=1")
        .header("host", "svc")
        .header("x-version", "v3")
        .body(body(""))
        .expect("req");
    assert_eq!(send(&mut c, miss).await, (StatusCode::OK, "a".into()));
    let post = Request::builder()
        .method(Method::POST)
        .uri("/api/x?beta=1")
        .header("host", "svc")
        .header("x-version", "v2")
        .body(body(""))
        .expect("req");
    assert_eq!(send(&mut c, post).await, (StatusCode::OK, "a".into()));

    c.ready().await.expect("ready");
    let resp = c.send_request(get("/old?q=1")).await.expect("response");
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(
        resp.headers().get("location").map(|v| v.as_bytes()),
        Some(&b"http://svc.app-ns.svc.cluster.local/new?q=1"[..])
    );
}

#[tokio::test]
async fn no_endpoints_answers_503_and_an_invalid_backend_500() {
    let ca = Arc::new(FakeCa::generate());
    let (_backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let empty = service("empty", Some("10.0.0.40"), &[(80, 8080, api::Protocol::Http)], vec![]);
    let mut broken =
        service("broken", Some("10.0.0.41"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    broken.routes = vec![route("app-ns/broken#0", vec![backend("app-ns/missing", 80, 1)])];
    h.configure(&[named("app-ns/empty", empty), named("app-ns/broken", broken)], &[]);
    let mut c = h.http1(sock("10.0.0.40:80")).await;
    assert_eq!(send(&mut c, get("/")).await, (StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream".into()));
    let mut c = h.http1(sock("10.0.0.41:80")).await;
    assert_eq!(send(&mut c, get("/")).await, (StatusCode::INTERNAL_SERVER_ERROR, "no valid backend".into()));
}

#[tokio::test]
async fn mirrors_get_a_copy_plain_tcp_endpoints_are_reached_directly_and_connects_carry_baggage() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let outside = Backend::start("outside").await;
    let mut settings = Harness::settings();
    settings.baggage =
        Some(http::HeaderValue::from_static("k8s.deployment.name=waypoint,service.name=waypoint"));
    let h = Harness::start(ca, settings, node.addr).await;
    let mut svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    let mut r = route("app-ns/mirror#0", vec![backend("app-ns/svc", 80, 1)]);
    r.filters = vec![api::Filter {
        kind: Some(api::filter::Kind::Mirror(api::Mirror {
            destination: "gw-ns/waypoint/app-ns/shadow".into(),
            port: 80,
            percent: 100,
        })),
    }];
    svc.routes = vec![r];
    let shadow = service("shadow", None, &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.2")]);
    // An endpoint outside the mesh: plain TCP to 127.0.0.1 on the backend's port.
    let plain = service(
        "plain",
        Some("10.0.0.50"),
        &[(80, u32::from(outside.addr.port()), api::Protocol::Http)],
        vec![api::Endpoint {
            address: vec![127, 0, 0, 1],
            tunnel: ambit_api::workload::TunnelProtocol::None as i32,
            healthy: true,
            ..Default::default()
        }],
    );
    let errors = h.configure(
        &[named("app-ns/svc", svc), named("app-ns/shadow", shadow), named("app-ns/plain", plain)],
        &[],
    );
    assert!(errors.is_empty(), "{errors:?}");

    let mut c = h.http1(sock("10.0.0.10:80")).await;
    assert_eq!(send(&mut c, get("/copied")).await, (StatusCode::OK, "a".into()));
    // The mirror is fire and forget: wait for its copy.
    let t0 = Instant::now();
    while backends[1].requests() == 0 && t0.elapsed() < T {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let copy = backends[1].last().expect("the mirror got a copy");
    assert_eq!(copy.path, "/copied");
    assert_eq!(
        copy.headers.get("host").map(|v| v.as_bytes()),
        Some(&b"svc.app-ns.svc.cluster.local-shadow"[..])
    );

    let mut c = h.http1(sock("10.0.0.50:80")).await;
    assert_eq!(send(&mut c, get("/")).await, (StatusCode::OK, "outside".into()));

    let connects = node.headers.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(!connects.is_empty());
    for headers in connects {
        assert_eq!(
            headers.get("baggage").map(|v| v.as_bytes()),
            Some(&b"k8s.deployment.name=waypoint,service.name=waypoint"[..])
        );
    }
}

#[tokio::test]
async fn a_new_configuration_applies_to_the_next_request_on_an_open_connection() {
    let ca = Arc::new(FakeCa::generate());
    let (_backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    h.configure(&[named("app-ns/svc", svc.clone())], &[]);
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    assert_eq!(send(&mut c, get("/")).await, (StatusCode::OK, "a".into()));

    // A DENY policy arrives while the connection stays open.
    let policies = vec![policy("deny-all", api::policy::Action::Deny, api::Rule::default())];
    let mut denied = svc;
    denied.policies = vec![policies[0].0.clone()];
    h.configure(&[named("app-ns/svc", denied)], &policies);
    assert_eq!(send(&mut c, get("/")).await, (StatusCode::FORBIDDEN, "RBAC: access denied".into()));
    assert_eq!(h.waypoint.counters().denials("app-ns/deny-all"), 1);

    // And the destination goes away: its requests have nowhere to go.
    h.configure(&[], &[]);
    assert_eq!(send(&mut c, get("/")).await, (StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream".into()));
}

/// The labels of a request are its own even on a stream that keeps the series of earlier ones:
/// the Service bound at the same address replaced, or another endpoint answering, makes a new
/// series.
#[tokio::test]
async fn labels_follow_the_configuration_on_one_connection() {
    let ca = Arc::new(FakeCa::generate());
    let (_backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let first =
        service("first", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    h.configure(&[named("app-ns/first", first)], &[]);
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    assert_eq!(send(&mut c, get("/")).await, (StatusCode::OK, "a".into()));
    let second =
        service("second", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.2")]);
    h.configure(&[named("app-ns/second", second)], &[]);
    for _ in 0..2 {
        assert_eq!(send(&mut c, get("/")).await, (StatusCode::OK, "b".into()));
    }
    let mut registry = prometheus_client::registry::Registry::default();
    h.waypoint.counters().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let count = |name: &str| -> Vec<&str> {
        text.lines()
            .filter(|l| {
                l.starts_with("istio_requests_total{")
                    && l.contains(&format!("destination_service_name=\"{name}\""))
            })
            .map(|l| l.rsplit(' ').next().unwrap_or_default())
            .collect()
    };
    assert_eq!((count("first"), count("second")), (vec!["1"], vec!["2"]), "{text}");
}

#[tokio::test]
async fn an_upgrade_is_passed_through_and_the_connections_are_joined() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    h.configure(&[named("app-ns/svc", svc)], &[]);
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    let req = Request::get("/ws")
        .header("host", "svc")
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .body(body(""))
        .expect("request");
    c.ready().await.expect("ready");
    let resp = tokio::time::timeout(T, c.send_request(req)).await.expect("in time").expect("response");
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(resp.headers().get("upgrade").map(|v| v.as_bytes()), Some(&b"websocket"[..]));
    let seen = backends[0].last().expect("seen");
    assert_eq!(seen.headers.get("upgrade").map(|v| v.as_bytes()), Some(&b"websocket"[..]));
    let upgraded =
        tokio::time::timeout(T, hyper::upgrade::on(resp)).await.expect("in time").expect("upgraded");
    let mut io = hyper_util::rt::TokioIo::new(upgraded);
    io.write_all(b"ping over the upgrade").await.expect("write");
    let mut got = [0u8; 21];
    tokio::time::timeout(T, io.read_exact(&mut got)).await.expect("in time").expect("read");
    assert_eq!(&got, b"ping over the upgrade");
}
