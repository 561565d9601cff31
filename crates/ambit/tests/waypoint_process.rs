//! `ambit waypoint`, the real binary, end to end without root: its certificate from a shared
//! FAKE_CA_ROOT, its configuration from an in-test delta ADS server, HBONE in from a source node
//! proxy's pool and out to a fake node proxy in front of an HTTP backend. Every address is on
//! a loopback address of its own (127.a.b.c), so the Istio ports (15008, 15000, 15020, 15021)
//! are used as they are and parallel runs do not collide.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ambit_api::type_url::{WAYPOINT_DESTINATION, WAYPOINT_POLICY};
use ambit_api::waypoint as api;
use ambit_api::xds::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use ambit_hbone::testing::{TcpDialer, settings};
use ambit_hbone::{Pool, PoolKey};
use ambit_identity::{CertManager, CertSigner, FakeCa, Identity};
use ambit_waypoint::testing::{Backend, NodeProxy, body, client_identity, endpoint, service, text};
use ambit_xds::server::{AdsServer, Changes, Hooks, Resources, ServerConfig, ServerResource};
use http::{HeaderMap, Request, StatusCode};
use hyper_util::rt::TokioIo;
use nix::sys::signal::Signal;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::ChildGuard;

const DESTINATION: &str = "gw-ns/waypoint/app-ns/echo";
const BROKEN: &str = "gw-ns/waypoint/app-ns/broken";
const POLICY: &str = "gw-ns/waypoint/app-ns/deny-admin";
const VIP: &str = "10.96.0.10:80";
const DRAIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waypoint_process_serves_authorizes_reports_and_drains() {
    let dir = tempfile::tempdir().expect("tempdir");
    ambit_identity::dev_ca_init(dir.path(), false).expect("dev CA");
    let ca = Arc::new(FakeCa::from_dir(dir.path()).expect("load dev CA"));
    let (a, b) = (rand::random_range(1..=254u8), rand::random_range(1..=254u8));
    let (wp_ip, ep_ip) = (Ipv4Addr::new(127, a, b, 1), Ipv4Addr::new(127, a, b, 2));
    let at = |ip: Ipv4Addr, port: u16| SocketAddr::from((ip, port));

    let backend = Backend::start("backend").await;
    let apps = HashMap::from([(at(ep_ip, 8080), backend.addr)]);
    let node = NodeProxy::start_at(&ca, at(ep_ip, 15008), apps).await;

    // The control plane: not ready until the test publishes, so the waypoint starts unsynced.
    let resources = Resources::new([WAYPOINT_DESTINATION, WAYPOINT_POLICY]);
    let cfg =
        ServerConfig { debounce_after: Duration::from_millis(20), ready: false, ..ServerConfig::default() };
    let ads = AdsServer::new(resources.clone(), cfg, Hooks::default());
    let xds_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind xDS");
    let xds_addr = xds_listener.local_addr().expect("xDS address");
    let svc = ads.clone();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(svc))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(xds_listener))
            .await;
    });

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ambit"));
    cmd.arg("waypoint")
        .env("POD_NAME", "waypoint-0")
        .env("POD_NAMESPACE", "gw-ns")
        .env("SERVICE_ACCOUNT", "waypoint")
        .env("INSTANCE_IP", wp_ip.to_string())
        .env("FAKE_CA", "true")
        .env("FAKE_CA_ROOT", dir.path())
        .env("XDS_ADDRESS", format!("http://{xds_addr}"))
        .env("AMBIT_HBONE_ADDR", at(wp_ip, 15008).to_string())
        .env("AMBIT_ADMIN_ADDR", at(wp_ip, 15000).to_string())
        .env("AMBIT_STATS_ADDR", at(wp_ip, 15020).to_string())
        .env("AMBIT_READINESS_ADDR", at(wp_ip, 15021).to_string())
        .env("TERMINATION_DRAIN_DURATION", format!("{}s", DRAIN.as_secs()))
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST");
    let mut waypoint = ChildGuard::spawn("ambit waypoint", cmd);

    // Not ready: the certificate may be in, the xDS server refuses streams.
    let ready = at(wp_ip, 15021);
    let (code, body_text) = poll_get(ready, "/healthz/ready").await;
    assert_eq!(code, 503, "{body_text}");
    assert!(body_text.starts_with("not ready: "), "{body_text}");

    let mut dest = service(
        "echo",
        Some("10.96.0.10"),
        &[(80, 8080, api::Protocol::Http)],
        vec![endpoint(&ep_ip.to_string())],
    );
    dest.policies = vec![POLICY.to_owned()];
    let mut broken = service("broken", Some("10.96.0.11"), &[(80, 8080, api::Protocol::Http)], vec![]);
    broken.addresses = vec![vec![10, 96, 0]];
    let policy = api::Policy {
        name: "deny-admin".into(),
        namespace: "app-ns".into(),
        action: api::policy::Action::Deny as i32,
        rules: vec![api::Rule {
            to: vec![api::Operation { paths: vec!["/admin".into()], ..Default::default() }],
            ..Default::default()
        }],
    };
    resources
        .publish([
            upsert(
                WAYPOINT_DESTINATION,
                &[(DESTINATION, dest.encode_to_vec()), (BROKEN, broken.encode_to_vec())],
            ),
            upsert(WAYPOINT_POLICY, &[(POLICY, policy.encode_to_vec())]),
        ])
        .expect("publish");
    ads.set_ready(true);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (code, text) = get(ready, "/healthz/ready").await.unwrap_or((0, String::new()));
        if code == 200 {
            assert_eq!(text, "ready\n");
            break;
        }
        assert!(Instant::now() < deadline, "not ready in time: {code} {text}\n{}", waypoint.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Through it: 200 from the backend, 403 from the policy.
    let signer: Arc<dyn CertSigner> = ca.clone();
    let pool = Pool::new(
        CertManager::new(signer, Duration::from_secs(3600)),
        Box::new(TcpDialer),
        settings(),
        Duration::from_secs(300),
    );
    let key = PoolKey {
        src_identity: client_identity(),
        dst_identities: vec![Identity::new("cluster.local", "gw-ns", "waypoint")],
        dst: at(wp_ip, 15008),
        src_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
    };
    let mut c = http1(&pool, &key).await;
    let (status, text_ok) = send(&mut c, "/hello").await;
    assert_eq!((status, text_ok.as_str()), (StatusCode::OK, "backend"));
    let (status, denied) = send(&mut c, "/admin").await;
    assert_eq!((status, denied.as_str()), (StatusCode::FORBIDDEN, "RBAC: access denied"));
    assert_eq!(node.connects(&at(ep_ip, 8080).to_string()), 1, "one upstream CONNECT to the endpoint");
    let seen = backend.last().expect("the backend saw the request");
    assert_eq!(seen.path, "/hello");
    // `c` stays open, idle, through the drain below.

    // Metrics: the denial, reported by the waypoint, counted once.
    let (code, metrics) = get(at(wp_ip, 15020), "/metrics").await.expect("metrics");
    assert_eq!(code, 200);
    let denied_lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("istio_requests_total{") && l.contains(r#"response_code="403""#))
        .collect();
    assert_eq!(denied_lines.len(), 1, "{metrics}");
    assert!(denied_lines[0].contains(r#"reporter="waypoint""#), "{}", denied_lines[0]);
    assert!(denied_lines[0].ends_with(" 1"), "{}", denied_lines[0]);
    assert!(metrics.contains("istio_xds_message_total{"), "xDS metrics served beside: {metrics}");

    // Config dump: the resources held, the refusal, and both types ACKed, none NACKed.
    let (code, dump) = get(at(wp_ip, 15000), "/config_dump").await.expect("config_dump");
    assert_eq!(code, 200);
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("config_dump is JSON");
    let names = |kind: &str| -> Vec<String> {
        dump["resources"][kind].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    };
    assert_eq!(names("destinations"), [BROKEN, DESTINATION]);
    assert_eq!(names("policies"), [POLICY]);
    assert_eq!(
        dump["resources"]["refusals"],
        serde_json::json!([
            "destination gw-ns/waypoint/app-ns/broken refused: address 0 has 3 bytes; an IP address has 4 or 16"
        ]),
        "refused, reported, and still ACKed"
    );
    for t in dump["xds"]["types"].as_array().expect("types") {
        assert_eq!(
            (t["nacks"].as_u64(), t["resources"].as_u64().map(|n| n > 0)),
            (Some(0), Some(true)),
            "{t}"
        );
    }
    assert_eq!(dump["config"]["identity"], "spiffe://cluster.local/ns/gw-ns/sa/waypoint");

    // SIGTERM with a request in flight and an idle connection open: the request completes,
    // readiness turns 503, the idle connection is closed at once rather than held to the
    // deadline, and the process exits 0 well within the drain bound.
    backend.delay_ms.store(1500, Ordering::Relaxed);
    let mut slow_c = http1(&pool, &key).await;
    let in_flight = tokio::spawn(async move { slow_c.send_request(req("/slow")).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    waypoint.signal(Signal::SIGTERM);
    let signalled = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (code, text_ready) = get(ready, "/healthz/ready").await.expect("readiness while draining");
    assert_eq!((code, text_ready.as_str()), (503, "not ready: draining\n"));
    let resp = in_flight.await.expect("task").expect("the in-flight request completes");
    let (status, slow) = text(resp).await;
    assert_eq!((status, slow.as_str()), (StatusCode::OK, "backend"));
    let exit = tokio::task::spawn_blocking(move || {
        let status = waypoint.wait_timeout(DRAIN + Duration::from_secs(2));
        (status, waypoint)
    })
    .await
    .expect("wait");
    let (status, waypoint) = exit;
    let status = status.unwrap_or_else(|| panic!("no exit within the drain bound\n{}", waypoint.logs()));
    assert!(status.success(), "exit {status}\n{}", waypoint.logs());
    let took = signalled.elapsed();
    assert!(took < Duration::from_secs(5), "drained in {took:?}: the idle connection held the drain");
    assert!(c.ready().await.is_err(), "the idle connection was closed by the drain");
    assert!(waypoint.logs().contains("drained, exiting"), "{}", waypoint.logs());
}

fn upsert(type_url: &str, items: &[(&str, Vec<u8>)]) -> Changes {
    Changes {
        type_url: type_url.to_owned(),
        upserts: items
            .iter()
            .map(|(name, bytes)| ServerResource {
                name: (*name).to_owned(),
                aliases: vec![],
                resource: prost_types::Any { type_url: type_url.to_owned(), value: bytes.clone() },
                also: vec![],
                node: None,
            })
            .collect(),
        removals: vec![],
    }
}

/// One request on `c` once it is ready for it: status and body.
async fn send(
    c: &mut hyper::client::conn::http1::SendRequest<ambit_waypoint::Body>,
    path: &str,
) -> (StatusCode, String) {
    c.ready().await.expect("connection ready");
    text(c.send_request(req(path)).await.expect("request")).await
}

fn req(path: &str) -> Request<ambit_waypoint::Body> {
    Request::get(path).header("host", "echo.app-ns.svc.cluster.local").body(body("")).expect("request")
}

/// An HTTP/1.1 connection through a CONNECT to the VIP, as the source node proxy opens it.
async fn http1(pool: &Pool, key: &PoolKey) -> hyper::client::conn::http1::SendRequest<ambit_waypoint::Body> {
    let vip: SocketAddr = VIP.parse().expect("vip");
    let tunnel = pool.connect(key, vip, &HeaderMap::new()).await.expect("CONNECT through the waypoint");
    let (send, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tunnel.into_io())).await.expect("handshake");
    tokio::spawn(conn);
    send
}

/// A plain HTTP/1.0 GET: status and body.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .map_err(std::io::Error::other)??;
    let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((code, body))
}

/// Polls `path` until the server answers at all (the process is starting).
async fn poll_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(answer) = get(addr, path).await {
            return answer;
        }
        assert!(Instant::now() < deadline, "{addr}{path} never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
