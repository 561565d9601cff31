//! The server's metrics move exactly as documented: a response counts one push and one push-time
//! sample of its type, a debounced push one convergence sample per stream, a NACK one reject, a
//! stale nonce one expired nonce, the connected gauge follows admission and disconnects, and each
//! refusal reason counts once. Values are read from the encoded registry text.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use ambit_api::xds::DeltaDiscoveryRequest;
use ambit_xds::BoxFuture;
use ambit_xds::server::istio::NodeCheck;
use ambit_xds::server::{Authenticate, Hooks, Principal, ServerConfig, ServerMetrics};
use common::ads::*;
use common::*;
use prometheus_client::registry::Registry;
use tonic::{Code, Request, Status};

const ZTUNNEL: &str = "ztunnel~10.0.0.1~p.ns~ns.svc.cluster.local";

struct Metered {
    server: Server,
    registry: Registry,
}

async fn metered(cfg: ServerConfig, hooks: Hooks) -> Metered {
    let mut registry = Registry::default();
    let metrics = ServerMetrics::register(&mut registry);
    let server = start_with(cfg, Hooks { metrics, ..hooks }).await;
    Metered { server, registry }
}

impl Metered {
    fn text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }

    /// The value of the sample `series` (name and labels exactly as encoded), if present.
    fn value(&self, series: &str) -> Option<f64> {
        self.text().lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Waits (bounded) until `series` reads `want`, then asserts it exactly.
    async fn settles(&self, series: &str, want: Option<f64>) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.value(series) != want && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(self.value(series), want, "{series} in\n{}", self.text());
    }

    /// The `ambit_xds_stream_refusals_total` samples, as `reason=value` lines.
    fn refusals(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("ambit_xds_stream_refusals_total{reason=\""))
            .map(|l| l.replace("\"} ", "="))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    }
}

fn pushes(t: &str) -> String {
    format!("pilot_xds_pushes{{type=\"{t}\"}}")
}

fn first(node_id: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest { node: Some(node(node_id)), ..req(A) }
}

#[tokio::test]
async fn a_push_counts_one_response_and_one_latency_sample_of_its_type_and_one_convergence_sample() {
    let m = metered(fast(), Hooks::default()).await;
    // Registered types show from the start, at zero.
    assert_eq!(m.value(&pushes(A)), Some(0.0));
    assert_eq!(m.value(&pushes(B)), Some(0.0));
    assert_eq!(m.value("pilot_proxy_convergence_time_count"), Some(0.0));

    let mut c = Client::open(&m.server.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    let initial = c.recv().await;
    c.ack(&initial).await;
    // The answer to a request is a push with a push time, but converges nothing.
    m.settles(&pushes(A), Some(1.0)).await;
    assert_eq!(m.value(&format!("pilot_xds_push_time_count{{type=\"{A}\"}}")), Some(1.0));
    assert_eq!(m.value("pilot_proxy_convergence_time_count"), Some(0.0));

    m.server.resources.publish([upsert(A, vec![r("a1", "payload")])]).unwrap();
    let p = c.recv().await;
    assert_eq!(names(&p), strings(&["a1"]));
    c.ack(&p).await;
    m.settles(&pushes(A), Some(2.0)).await;
    assert_eq!(m.value(&format!("pilot_xds_push_time_count{{type=\"{A}\"}}")), Some(2.0));
    assert_eq!(m.value(&pushes(B)), Some(0.0));
    m.settles("pilot_proxy_convergence_time_count", Some(1.0)).await;
    // Measured from the publish: it includes at least the 20 ms of quiet the debouncer waits.
    let converged = m.value("pilot_proxy_convergence_time_sum").unwrap();
    assert!(converged >= 0.020, "convergence {converged} s is shorter than the debounce");
    // One resource of 7 payload bytes in that push (the initial response had none).
    assert_eq!(m.value(&format!("ambit_xds_push_resources_sum{{type=\"{A}\"}}")), Some(1.0));
    assert_eq!(m.value(&format!("pilot_xds_config_size_bytes_sum{{type=\"{A}\"}}")), Some(7.0));
    c.quiet(100).await;
    assert_eq!(m.value(&pushes(A)), Some(2.0));
    assert_eq!(m.value("pilot_proxy_convergence_time_count"), Some(1.0));
}

#[tokio::test]
async fn one_publish_to_two_types_and_two_streams_counts_each_response_and_one_convergence_per_stream() {
    let m = metered(fast(), Hooks::default()).await;
    let mut clients = Vec::new();
    for _ in 0..2 {
        let mut c = Client::open(&m.server.url, None).await.unwrap();
        for t in [A, B] {
            c.wildcard(t, &[]).await;
            let resp = c.recv().await;
            c.ack(&resp).await;
        }
        clients.push(c);
    }
    m.settles(&pushes(A), Some(2.0)).await;
    m.settles(&pushes(B), Some(2.0)).await;

    m.server.resources.publish([upsert(A, vec![r("a1", "x")]), upsert(B, vec![r("b1", "y")])]).unwrap();
    for c in &mut clients {
        for _ in 0..2 {
            let p = c.recv().await;
            c.ack(&p).await;
        }
    }
    m.settles(&pushes(A), Some(4.0)).await;
    m.settles(&pushes(B), Some(4.0)).await;
    assert_eq!(m.value(&format!("pilot_xds_push_time_count{{type=\"{B}\"}}")), Some(4.0));
    m.settles("pilot_proxy_convergence_time_count", Some(2.0)).await;
}

#[tokio::test]
async fn a_nack_counts_one_reject_and_a_stale_nonce_one_expired_nonce_of_its_type() {
    let m = metered(fast(), Hooks::default()).await;
    m.server.resources.publish([upsert(A, vec![r("a1", "x")])]).unwrap();
    let mut c = Client::open(&m.server.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    let resp = c.recv().await;
    c.send(DeltaDiscoveryRequest {
        response_nonce: resp.nonce.clone(),
        error_detail: Some(ambit_api::xds::Status {
            code: 3,
            message: "a1: bad".into(),
            ..Default::default()
        }),
        ..req(A)
    })
    .await;
    m.settles(&format!("pilot_total_xds_rejects{{type=\"{A}\"}}"), Some(1.0)).await;
    assert_eq!(m.value(&format!("pilot_total_xds_rejects{{type=\"{B}\"}}")), Some(0.0));
    assert_eq!(m.value(&format!("pilot_xds_expired_nonce{{type=\"{A}\"}}")), Some(0.0));

    c.send(DeltaDiscoveryRequest { response_nonce: "not-the-last".into(), ..req(A) }).await;
    m.settles(&format!("pilot_xds_expired_nonce{{type=\"{A}\"}}"), Some(1.0)).await;
    c.quiet(50).await;
    assert_eq!(m.value(&format!("pilot_total_xds_rejects{{type=\"{A}\"}}")), Some(1.0));
    assert_eq!(m.value(&pushes(A)), Some(1.0));
}

#[tokio::test]
async fn the_connected_gauge_follows_admission_and_disconnects_by_version() {
    let m = metered(fast(), Hooks::default()).await;
    let v124 = "pilot_xds{version=\"1.24.0\"}";
    let mut a = Client::open(&m.server.url, None).await.unwrap();
    // Open but not yet admitted (no first request): not counted.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(m.value(v124), None);
    let versioned =
        || DeltaDiscoveryRequest { node: Some(node_with(ZTUNNEL, &[("ISTIO_VERSION", "1.24.0")])), ..req(A) };
    a.send(versioned()).await;
    a.recv().await;
    m.settles(v124, Some(1.0)).await;
    let mut b = Client::open(&m.server.url, None).await.unwrap();
    b.send(versioned()).await;
    b.recv().await;
    m.settles(v124, Some(2.0)).await;
    let mut c = Client::open(&m.server.url, None).await.unwrap();
    c.send(first(ZTUNNEL)).await;
    c.recv().await;
    m.settles("pilot_xds{version=\"\"}", Some(1.0)).await;

    drop(a);
    m.settles(v124, Some(1.0)).await;
    drop(b);
    // The last stream of a version removes its series.
    m.settles(v124, None).await;
    assert_eq!(m.value("pilot_xds{version=\"\"}"), Some(1.0));
    drop(c);
    m.settles("pilot_xds{version=\"\"}", None).await;
}

#[tokio::test]
async fn refusals_before_any_request_count_by_reason() {
    // Not ready.
    let m = metered(ServerConfig { ready: false, ..fast() }, Hooks::default()).await;
    let err = Client::open(&m.server.url, None).await.err().unwrap();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(m.refusals(), ["not_ready=1"]);

    // Too many streams.
    let m = metered(ServerConfig { max_streams: 1, ..fast() }, Hooks::default()).await;
    let _held = Client::open(&m.server.url, None).await.unwrap();
    let err = Client::open(&m.server.url, None).await.err().unwrap();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(m.refusals(), ["too_many_streams=1"]);

    // The new-stream rate limit.
    let cfg = ServerConfig { new_streams_per_second: 1, new_stream_max_wait: Duration::ZERO, ..fast() };
    let m = metered(cfg, Hooks::default()).await;
    let _first = Client::open(&m.server.url, None).await.unwrap();
    let err = Client::open(&m.server.url, None).await.err().unwrap();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(m.refusals(), ["rate_limited=1"]);

    // Authentication refused, and authentication that does not finish.
    let cfg = ServerConfig { authenticate_timeout: Duration::from_millis(100), ..fast() };
    let m = metered(cfg, Hooks { authenticate: Some(Arc::new(Tokens)), ..Hooks::default() }).await;
    let err = Client::open(&m.server.url, Some("nobody")).await.err().unwrap();
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = Client::open(&m.server.url, Some("hang")).await.err().unwrap();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(m.refusals(), ["authentication_timeout=1", "unauthenticated=1"]);
}

#[tokio::test]
async fn refusals_on_the_first_request_and_for_the_name_limit_count_by_reason() {
    // No node; a node the authorizer refuses.
    let hooks = Hooks { authorize: Some(Arc::new(NodeCheck::default())), ..Hooks::default() };
    let m = metered(fast(), hooks).await;
    let mut c = Client::open(&m.server.url, None).await.unwrap();
    c.send(req(A)).await;
    assert_eq!(c.recv_err().await.code(), Code::InvalidArgument);
    let mut c = Client::open(&m.server.url, None).await.unwrap();
    c.send(first("ztunnel~not-an-ip~p.ns~ns.svc.cluster.local")).await;
    assert_eq!(c.recv_err().await.code(), Code::InvalidArgument);
    assert_eq!(m.refusals(), ["missing_node=1", "unauthorized=1"]);
    assert_eq!(m.value("pilot_xds{version=\"\"}"), None);

    // Past max_subscribed_names: admitted (counted), then ended.
    let m = metered(ServerConfig { max_subscribed_names: 1, ..fast() }, Hooks::default()).await;
    let mut c = Client::open(&m.server.url, None).await.unwrap();
    c.send(DeltaDiscoveryRequest { resource_names_subscribe: strings(&["x", "y"]), ..first(ZTUNNEL) }).await;
    assert_eq!(c.recv_err().await.code(), Code::ResourceExhausted);
    assert_eq!(m.refusals(), ["too_many_names=1"]);
    m.settles("pilot_xds{version=\"\"}", None).await;
}

/// `Bearer hang` never finishes; anything else is refused.
struct Tokens;

impl Authenticate for Tokens {
    fn authenticate<'a>(&'a self, req: &'a Request<()>) -> BoxFuture<'a, Result<Principal, Status>> {
        let hang = req.metadata().get("authorization").is_some_and(|v| v == "Bearer hang");
        Box::pin(async move {
            if hang {
                std::future::pending().await
            }
            Err(Status::unauthenticated("authentication failure"))
        })
    }
}
