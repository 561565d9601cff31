//! Helpers shared by the waypoint's in-process tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ambit_api::waypoint as api;
use ambit_identity::FakeCa;
use ambit_waypoint::testing::{Backend, Harness, NodeProxy, body, text};
use http::{Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const T: Duration = Duration::from_secs(20);

pub fn sock(s: &str) -> SocketAddr {
    s.parse().expect("a socket address")
}

pub fn named(name: &str, d: api::Destination) -> (String, api::Destination) {
    (format!("gw-ns/waypoint/{name}"), d)
}

pub fn route(name: &str, backends: Vec<api::Backend>) -> api::Route {
    api::Route { name: name.into(), backends, ..api::Route::default() }
}

pub fn backend(dest: &str, port: u32, weight: u32) -> api::Backend {
    api::Backend { destination: format!("gw-ns/waypoint/{dest}"), port, weight, filters: vec![] }
}

pub fn get(path: &str) -> Request<ambit_waypoint::Body> {
    Request::get(path).header("host", "svc.app-ns.svc.cluster.local").body(body("")).expect("request")
}

/// Three backends behind one node proxy: endpoints 10.1.0.1–3 on port 8080.
pub async fn three_backends(ca: &FakeCa) -> (Vec<Backend>, NodeProxy) {
    let mut backends = Vec::new();
    let mut apps = HashMap::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let b = Backend::start(name).await;
        apps.insert(sock(&format!("10.1.0.{}:8080", i + 1)), b.addr);
        backends.push(b);
    }
    let node = NodeProxy::start(ca, apps).await;
    (backends, node)
}

pub async fn send(
    client: &mut hyper::client::conn::http1::SendRequest<ambit_waypoint::Body>,
    req: Request<ambit_waypoint::Body>,
) -> (StatusCode, String) {
    client.ready().await.expect("connection ready");
    let resp = tokio::time::timeout(T, client.send_request(req)).await.expect("in time").expect("response");
    text(resp).await
}

pub fn policy(name: &str, action: api::policy::Action, rule: api::Rule) -> (String, api::Policy) {
    (
        format!("gw-ns/waypoint/app-ns/{name}"),
        api::Policy {
            name: name.into(),
            namespace: "app-ns".into(),
            action: action as i32,
            rules: vec![rule],
        },
    )
}

/// Writes raw bytes through a CONNECT to `vip` and reads the answer until the stream ends (or
/// `limit`).
pub async fn raw(h: &Harness, vip: &str, bytes: &[u8], limit: Duration) -> (String, Duration) {
    let mut io = h.connect(sock(vip)).await.expect("CONNECT");
    io.write_all(bytes).await.expect("write");
    let t0 = Instant::now();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(limit, io.read_to_end(&mut out)).await;
    (String::from_utf8_lossy(&out).into_owned(), t0.elapsed())
}
