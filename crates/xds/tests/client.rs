//! Conformance of the xDS client against a scripted server: a tonic server in the test hands
//! every stream to the test, which asserts each request and drives each response.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_api::xds::aggregated_discovery_service_server::AggregatedDiscoveryService;
use ambit_api::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use ambit_xds::client::{
    ClientConfig, ClientHandle, ConnectionState, Connector, DemandError, Handler, MetadataSource, Rejection,
    Subscription, Typed, TypedHandler, TypedUpdate, Update, XdsClient,
};
use ambit_xds::{BoxFuture, TerminationReason, XdsMetrics};
use common::*;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

/// One stream the scripted server accepted.
struct Scripted {
    requests: Streaming<DeltaDiscoveryRequest>,
    responses: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    metadata: MetadataMap,
}

impl Scripted {
    async fn req(&mut self) -> DeltaDiscoveryRequest {
        match timeout(WAIT, self.requests.message()).await {
            Ok(Ok(Some(r))) => r,
            other => panic!("expected a request from the client, got {other:?}"),
        }
    }

    async fn send(&self, resp: DeltaDiscoveryResponse) {
        self.responses.send(Ok(resp)).await.expect("stream open");
    }

    async fn end(self, status: Status) {
        self.responses.send(Err(status)).await.expect("stream open");
    }
}

#[derive(Clone, Default)]
struct Script {
    streams: Arc<Mutex<Option<mpsc::UnboundedSender<Scripted>>>>,
    refuse: Arc<Mutex<Option<Status>>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Script {
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        if let Some(status) = self.refuse.lock().unwrap().clone() {
            return Err(status);
        }
        let (metadata, _, requests) = request.into_parts();
        let (tx, rx) = mpsc::channel(16);
        if let Some(streams) = &*self.streams.lock().unwrap() {
            let _ = streams.send(Scripted { requests, responses: tx, metadata });
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One `apply` call: updated names, removed names.
type Call = (Vec<String>, Vec<String>);
type Subs = Vec<(String, Subscription)>;
type Handlers = Vec<(String, Arc<dyn Handler>)>;

/// What the test handler holds: name → payload. Payload `bad` is rejected.
#[derive(Clone, Default)]
struct Store {
    held: Arc<Mutex<BTreeMap<String, String>>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Handler for Store {
    fn apply(&self, updates: Vec<Update>, removed: Vec<String>) -> BoxFuture<'_, Vec<Rejection>> {
        Box::pin(async move {
            let mut rejected = Vec::new();
            let mut held = self.held.lock().unwrap();
            let names = updates.iter().map(|u| u.name.clone()).collect();
            for u in updates {
                let payload = String::from_utf8_lossy(&u.resource.value).into_owned();
                if payload == "bad" {
                    rejected.push(Rejection { name: u.name, reason: "payload is bad".into() });
                } else {
                    held.insert(u.name, payload);
                }
            }
            for r in &removed {
                held.remove(r);
            }
            self.calls.lock().unwrap().push((names, removed));
            rejected
        })
    }
}

impl Store {
    fn snapshot(&self) -> BTreeMap<String, String> {
        self.held.lock().unwrap().clone()
    }
}

struct Harness {
    script: Script,
    streams: mpsc::UnboundedReceiver<Scripted>,
    client: ClientHandle,
    registry: Registry,
    token: Arc<Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    async fn start(
        subscriptions: Vec<(String, Subscription)>,
        handlers: Vec<(String, Arc<dyn Handler>)>,
    ) -> Self {
        Self::start_with(subscriptions, handlers, |_| {}).await
    }

    async fn start_with(
        subscriptions: Vec<(String, Subscription)>,
        handlers: Vec<(String, Arc<dyn Handler>)>,
        tweak: impl FnOnce(&mut ClientConfig),
    ) -> Self {
        let script = Script::default();
        let (tx, streams) = mpsc::unbounded_channel();
        *script.streams.lock().unwrap() = Some(tx);
        let (addr, _server) = serve(script.clone()).await;
        let url = format!("http://{addr}");
        let connector: Connector = Arc::new(move || {
            let url = url.clone();
            Box::pin(async move {
                let ch = tonic::transport::Endpoint::from_shared(url)?.connect().await?;
                Ok(ch)
            })
        });
        let token = Arc::new(Mutex::new("t1".to_owned()));
        let t = token.clone();
        let metadata: MetadataSource = Arc::new(move || {
            let mut m = MetadataMap::new();
            m.insert("authorization", format!("Bearer {}", t.lock().unwrap()).parse()?);
            Ok(m)
        });
        let mut cfg = ClientConfig::new(
            node("ztunnel~10.0.0.1~p.ns~ns.svc.cluster.local"),
            format!("http://{addr}"),
            subscriptions,
        );
        cfg.backoff.initial = Duration::from_millis(10);
        cfg.backoff.max = Duration::from_millis(100);
        tweak(&mut cfg);
        let mut registry = Registry::with_prefix("istio");
        let metrics = XdsMetrics::register(&mut registry);
        let (client, run) = XdsClient::new(cfg, connector, metadata, handlers, metrics);
        let task = tokio::spawn(run);
        Self { script, streams, client, registry, token, task }
    }

    async fn stream(&mut self) -> Scripted {
        timeout(WAIT, self.streams.recv()).await.expect("client connects").expect("script alive")
    }

    fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }

    async fn wait_status(&self, what: &str, f: impl Fn(&ambit_xds::client::ClientStatus) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let st = self.client.status();
            if f(&st) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}: {st:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn res(name: &str, version: &str, payload: &str) -> Resource {
    Resource {
        name: name.into(),
        version: version.into(),
        resource: Some(any(A, payload.as_bytes())),
        ..Default::default()
    }
}

fn resp(type_url: &str, nonce: &str, resources: Vec<Resource>, removed: &[&str]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: format!("sv-{nonce}"),
        resources,
        type_url: type_url.into(),
        removed_resources: strings(removed),
        nonce: nonce.into(),
    }
}

fn wildcard2(store_a: &Store, store_b: &Store) -> (Subs, Handlers) {
    (
        vec![(A.into(), Subscription::Wildcard), (B.into(), Subscription::Wildcard)],
        vec![
            (A.into(), Arc::new(store_a.clone()) as Arc<dyn Handler>),
            (B.into(), Arc::new(store_b.clone()) as Arc<dyn Handler>),
        ],
    )
}

fn assert_ack(r: &DeltaDiscoveryRequest, type_url: &str, nonce: &str) {
    assert_eq!(r.type_url, type_url);
    assert_eq!(r.response_nonce, nonce);
    assert_eq!(r.error_detail, None, "expected an ACK, got a NACK: {r:?}");
    assert_eq!(r.node, None);
    assert!(r.resource_names_subscribe.is_empty() && r.resource_names_unsubscribe.is_empty());
}

#[tokio::test]
async fn wildcard_subscribe_ack_nack_partial_apply_removal_sync_status_metrics() {
    let (a, b) = (Store::default(), Store::default());
    let (subs, handlers) = wildcard2(&a, &b);
    let mut h = Harness::start(subs, handlers).await;
    let mut s = h.stream().await;
    assert_eq!(s.metadata.get("authorization").unwrap(), "Bearer t1");

    // Initial requests: in the configured order, node set, wildcard (both lists empty).
    let r = s.req().await;
    assert_eq!(r.type_url, A);
    assert_eq!(r.node.as_ref().unwrap().id, "ztunnel~10.0.0.1~p.ns~ns.svc.cluster.local");
    assert!(r.resource_names_subscribe.is_empty() && r.resource_names_unsubscribe.is_empty());
    assert!(r.initial_resource_versions.is_empty());
    assert_eq!(s.req().await.type_url, B);
    assert!(!h.client.is_synced());

    // One good and one bad resource: the good one applies, the NACK names the bad one.
    s.send(resp(A, "n1", vec![res("r1", "v1", "one"), res("r2", "v2", "bad"), res("r3", "v3", "bad")], &[]))
        .await;
    let r = s.req().await;
    assert_eq!(r.response_nonce, "n1");
    assert_eq!(r.error_detail.as_ref().unwrap().message, "r2: payload is bad; r3: payload is bad");
    assert_eq!(a.snapshot(), BTreeMap::from([("r1".into(), "one".into())]));

    s.send(resp(B, "m1", vec![res("b1", "x", "bee")], &[])).await;
    assert_ack(&s.req().await, B, "m1");
    // A was NACKed, so the client is not synced yet.
    assert!(!h.client.is_synced());

    s.send(resp(A, "n2", vec![res("r2", "v2b", "two")], &[])).await;
    assert_ack(&s.req().await, A, "n2");
    timeout(WAIT, h.client.synced()).await.expect("synced after an ACK of every type");
    assert!(h.client.is_synced());

    // A bad update keeps the last good state of that resource.
    s.send(resp(A, "n3", vec![res("r1", "v1b", "bad")], &[])).await;
    assert!(s.req().await.error_detail.unwrap().message.starts_with("r1: "));
    assert_eq!(a.snapshot().get("r1").map(String::as_str), Some("one"));

    // Removal.
    s.send(resp(A, "n4", vec![], &["r2"])).await;
    assert_ack(&s.req().await, A, "n4");
    assert_eq!(a.snapshot(), BTreeMap::from([("r1".into(), "one".into())]));
    assert_eq!(a.calls.lock().unwrap().last().unwrap(), &(vec![], vec!["r2".to_owned()]));

    let st = h.client.status();
    assert_eq!(st.connection.state, ConnectionState::Connected);
    assert_eq!(st.connection.connects, 1);
    let ta = &st.types[0];
    assert_eq!((ta.type_url.as_str(), ta.subscription), (A, "wildcard"));
    assert_eq!((ta.acks, ta.nacks, ta.resources), (2, 2, 0));
    assert_eq!(ta.last_nonce, "n4");
    assert_eq!(ta.system_version_info, "sv-n4");
    let nack = ta.last_nack.as_ref().unwrap();
    assert_eq!(nack.nonce, "n3");
    assert!(nack.message.starts_with("r1: payload is bad"), "{}", nack.message);
    assert_eq!(st.types[1].resources, 1);
    serde_json::to_string(&st).expect("status serializes");

    let m = h.metrics();
    assert!(m.contains(&format!("istio_xds_message_total{{url=\"{A}\"}} 4")), "{m}");
    assert!(m.contains(&format!("istio_xds_message_total{{url=\"{B}\"}} 1")), "{m}");
    // Any payload bytes: "one"+"bad"+"bad", "two", "bad", nothing.
    assert!(m.contains(&format!("istio_xds_message_bytes_total{{url=\"{A}\"}} 15")), "{m}");
    assert!(m.contains("(unstable)"), "{m}");
}

#[tokio::test]
async fn reconnect_reports_held_versions_excluding_nacked_and_rereads_metadata() {
    let (a, b) = (Store::default(), Store::default());
    let (subs, handlers) = wildcard2(&a, &b);
    let mut h = Harness::start(subs, handlers).await;
    let mut s = h.stream().await;
    s.req().await;
    s.req().await;
    s.send(resp(A, "n1", vec![res("r1", "v1", "one"), res("r2", "v2", "bad")], &[])).await;
    s.req().await;
    s.send(resp(B, "m1", vec![res("b1", "bv", "bee")], &[])).await;
    s.req().await;

    *h.token.lock().unwrap() = "t2".into();
    s.end(Status::unavailable("transport is closing")).await;
    let mut s = h.stream().await;
    assert_eq!(s.metadata.get("authorization").unwrap(), "Bearer t2");
    let r = s.req().await;
    assert_eq!(r.type_url, A);
    assert!(r.node.is_some());
    assert_eq!(r.initial_resource_versions, HashMap::from([("r1".to_owned(), "v1".to_owned())]));
    let r = s.req().await;
    assert_eq!(r.initial_resource_versions, HashMap::from([("b1".to_owned(), "bv".to_owned())]));
    let m = h.metrics();
    assert!(m.contains("istio_xds_connection_terminations_total{reason=\"Reconnect\"} 1"), "{m}");
    h.wait_status("second connect", |st| st.connection.connects == 2).await;
    assert_eq!(h.client.status().connection.last_error.as_deref(), Some("Unavailable: transport is closing"));
}

#[tokio::test]
async fn termination_reasons() {
    let (a, b) = (Store::default(), Store::default());
    let (subs, handlers) = wildcard2(&a, &b);
    let mut h = Harness::start(subs, handlers).await;

    // Clean end ⇒ Complete.
    let s = h.stream().await;
    drop(s);
    let _s = h.stream().await;
    // Another gRPC status ⇒ Error.
    drop(_s);
    let s = h.stream().await;
    s.end(Status::internal("boom")).await;
    let s = h.stream().await;
    s.end(Status::cancelled("bye")).await;
    let s = h.stream().await;
    s.end(Status::unavailable("received prior goaway: x")).await;
    let s = h.stream().await;
    s.end(Status::unavailable("something else")).await;
    let _s = h.stream().await;
    let m = h.metrics();
    assert!(m.contains("istio_xds_connection_terminations_total{reason=\"Complete\"} 2"), "{m}");
    assert!(m.contains("istio_xds_connection_terminations_total{reason=\"Error\"} 2"), "{m}");
    assert!(m.contains("istio_xds_connection_terminations_total{reason=\"Reconnect\"} 2"), "{m}");
}

#[tokio::test]
async fn token_refused_is_a_clear_connection_error() {
    let (a, b) = (Store::default(), Store::default());
    let (subs, handlers) = wildcard2(&a, &b);
    let h = Harness::start(subs, handlers).await;
    *h.script.refuse.lock().unwrap() = Some(Status::unauthenticated("authentication failure"));
    h.wait_status("a refused stream", |st| {
        matches!(
            st.connection.state,
            ConnectionState::Backoff { reason: TerminationReason::ConnectionError, .. }
        )
    })
    .await;
    let st = h.client.status();
    let err = st.connection.last_error.unwrap();
    assert!(err.contains("refused the stream: Unauthenticated: authentication failure"), "{err}");
    assert!(err.contains("refused our credentials (check the token"), "{err}");
    assert_eq!(st.connection.connects, 0);
    assert!(!h.client.is_synced());
    assert!(h.metrics().contains("istio_xds_connection_terminations_total{reason=\"ConnectionError\"}"));
}

#[tokio::test]
async fn oversized_response_ends_the_stream_and_reconnects() {
    let (a, b) = (Store::default(), Store::default());
    let (subs, handlers) = wildcard2(&a, &b);
    let mut h = Harness::start_with(subs, handlers, |c| c.max_message_bytes = 1024).await;
    let mut s = h.stream().await;
    s.req().await;
    s.send(resp(A, "n1", vec![res("big", "v", &"x".repeat(4096))], &[])).await;
    let _s2 = h.stream().await;
    let st = h.client.status();
    let err = st.connection.last_error.unwrap();
    assert!(err.contains("exceeded the 1024-byte limit"), "{err}");
    assert!(a.snapshot().is_empty());
    assert!(h.metrics().contains("istio_xds_connection_terminations_total{reason=\"Error\"} 1"));
}

#[tokio::test]
async fn on_demand_by_name_alias_and_removal_and_pending_names_on_reconnect() {
    let (a, b) = (Store::default(), Store::default());
    let subs = vec![(A.into(), Subscription::OnDemand), (B.into(), Subscription::Wildcard)];
    let handlers: Vec<(String, Arc<dyn Handler>)> =
        vec![(A.into(), Arc::new(a.clone())), (B.into(), Arc::new(b.clone()))];
    let mut h = Harness::start(subs, handlers).await;
    let mut s = h.stream().await;
    let r = s.req().await;
    assert_eq!(
        (r.type_url.as_str(), r.resource_names_subscribe.clone(), r.resource_names_unsubscribe.clone()),
        (A, strings(&["*"]), strings(&["*"]))
    );
    let r = s.req().await;
    assert!(r.resource_names_subscribe.is_empty());
    s.send(resp(B, "m1", vec![], &[])).await;
    s.req().await;
    // On-demand types do not gate sync.
    timeout(WAIT, h.client.synced()).await.expect("synced without the on-demand type");

    assert_eq!(h.client.demand(B, "x").await, Err(DemandError::NotDemandable(B.into())));

    let by_name = tokio::spawn(h.client.demand(A, "n1"));
    let r = s.req().await;
    assert_eq!((r.type_url.as_str(), r.resource_names_subscribe.clone()), (A, strings(&["n1"])));
    assert!(r.response_nonce.is_empty());
    s.send(resp(A, "d1", vec![res("n1", "v1", "one")], &[])).await;
    timeout(WAIT, by_name).await.unwrap().unwrap().unwrap();
    assert_ack(&s.req().await, A, "d1");

    let by_alias = tokio::spawn(h.client.demand(A, "net/10.0.0.9"));
    assert_eq!(s.req().await.resource_names_subscribe, strings(&["net/10.0.0.9"]));
    let mut w = res("uid-9", "v9", "nine");
    w.aliases = strings(&["net/10.0.0.9"]);
    s.send(resp(A, "d2", vec![w], &[])).await;
    timeout(WAIT, by_alias).await.unwrap().unwrap().unwrap();
    s.req().await;

    let missing = tokio::spawn(h.client.demand(A, "nope"));
    s.req().await;
    s.send(resp(A, "d3", vec![], &["nope"])).await;
    timeout(WAIT, missing).await.unwrap().unwrap().unwrap();
    s.req().await;

    // A demand while the stream is down goes out with the next connect, as an empty version.
    s.end(Status::internal("down")).await;
    h.wait_status("backoff", |st| {
        matches!(st.connection.state, ConnectionState::Backoff { .. } | ConnectionState::Connecting)
    })
    .await;
    let later = tokio::spawn(h.client.demand(A, "late"));
    let mut s = h.stream().await;
    let r = s.req().await;
    assert_eq!(r.type_url, A);
    assert_eq!(
        r.initial_resource_versions.into_iter().collect::<BTreeMap<_, _>>(),
        BTreeMap::from([
            ("late".into(), "".into()),
            ("n1".into(), "v1".into()),
            ("uid-9".into(), "v9".into())
        ])
    );
    s.req().await;
    s.send(resp(A, "e1", vec![res("late", "vl", "l")], &[])).await;
    timeout(WAIT, later).await.unwrap().unwrap().unwrap();
    assert_eq!(a.snapshot().len(), 3);
}

#[tokio::test]
async fn named_subscription_and_unknown_type_acked() {
    let a = Store::default();
    let subs = vec![(A.into(), Subscription::Named(BTreeSet::from(["x".to_owned(), "y".to_owned()])))];
    let mut h = Harness::start(subs, vec![(A.into(), Arc::new(a.clone()) as Arc<dyn Handler>)]).await;
    let mut s = h.stream().await;
    let r = s.req().await;
    assert_eq!(r.resource_names_subscribe, strings(&["x", "y"]));
    assert!(r.resource_names_unsubscribe.is_empty());
    // A type nobody handles is ACKed, not NACKed.
    s.send(resp("type.googleapis.com/test.Unknown", "u1", vec![res("z", "v", "bad")], &[])).await;
    assert_ack(&s.req().await, "type.googleapis.com/test.Unknown", "u1");
    s.send(resp(A, "n1", vec![res("x", "v", "ex")], &[])).await;
    assert_ack(&s.req().await, A, "n1");
    timeout(WAIT, h.client.synced()).await.expect("named types gate sync and are synced");
}

/// A typed handler that records decoded nodes.
#[derive(Clone, Default)]
struct Nodes(Arc<Mutex<Vec<String>>>);

impl TypedHandler<ambit_api::xds::Node> for Nodes {
    fn apply(
        &self,
        updates: Vec<TypedUpdate<ambit_api::xds::Node>>,
        _: Vec<String>,
    ) -> BoxFuture<'_, Vec<Rejection>> {
        self.0.lock().unwrap().extend(updates.into_iter().map(|u| u.resource.id));
        Box::pin(async { Vec::new() })
    }
}

#[tokio::test]
async fn typed_adapter_decodes_and_rejects() {
    use prost::Message;
    let nodes = Nodes::default();
    let typed = Typed::<ambit_api::xds::Node, _>::new(A, nodes.clone());
    let good = ambit_api::xds::Node { id: "n-1".into(), ..Default::default() }.encode_to_vec();
    let u = |name: &str, url: &str, value: Vec<u8>| Update {
        name: name.into(),
        version: "v".into(),
        aliases: vec![],
        resource: prost_types::Any { type_url: url.into(), value },
    };
    let rejected = typed
        .apply(
            vec![u("good", A, good), u("garbage", A, vec![0xff, 0xff, 0xff]), u("wrong", B, vec![])],
            vec![],
        )
        .await;
    assert_eq!(*nodes.0.lock().unwrap(), vec!["n-1".to_owned()]);
    assert_eq!(rejected.len(), 2);
    assert_eq!(rejected[0].name, "garbage");
    assert!(rejected[0].reason.starts_with(&format!("cannot decode {A}: ")), "{}", rejected[0].reason);
    assert_eq!(
        rejected[1],
        Rejection { name: "wrong".into(), reason: format!("payload has type URL {B:?}, expected {A:?}") }
    );
}

/// With paused time and a connector that always fails, the waits double from the initial
/// backoff up to the cap, each jittered into [w/2, w].
#[tokio::test(start_paused = true)]
async fn connect_failures_back_off_exponentially_with_jitter() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    let connector: Connector = Arc::new(move || {
        c.lock().unwrap().push(tokio::time::Instant::now());
        Box::pin(async { Err("no route to host".into()) })
    });
    let metadata: MetadataSource = Arc::new(|| Ok(MetadataMap::new()));
    let cfg = ClientConfig::new(node("n"), "http://x", vec![(A.into(), Subscription::OnDemand)]);
    let mut registry = Registry::default();
    let metrics = XdsMetrics::register(&mut registry);
    let (handle, run) = XdsClient::new(cfg, connector, metadata, Vec::new(), metrics);
    let task = tokio::spawn(run);
    tokio::time::sleep(Duration::from_secs(120)).await;
    task.abort();
    let _ = task.await;
    let calls = calls.lock().unwrap().clone();
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    let mut expected = Duration::from_millis(10);
    for (i, gap) in gaps.iter().enumerate() {
        expected = (expected * 2).min(Duration::from_secs(15));
        assert!(
            *gap >= expected / 2 && *gap <= expected,
            "wait {i} was {gap:?}, expected within [{:?}, {expected:?}]",
            expected / 2
        );
    }
    assert!(gaps.len() >= 10, "{gaps:?}");
    let st = handle.status();
    assert_eq!(
        st.connection.last_error.as_deref(),
        Some("cannot connect to the xDS server http://x: no route to host")
    );
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    assert!(
        out.contains(&format!(
            "xds_connection_terminations_total{{reason=\"ConnectionError\"}} {}",
            calls.len()
        )),
        "{out}"
    );
    assert_eq!(handle.demand(A, "x").await, Err(DemandError::Stopped));
}

#[tokio::test]
async fn subscribed_type_without_handler_is_acked_and_counts_for_sync() {
    let subs = vec![(A.into(), Subscription::Wildcard)];
    let mut h = Harness::start(subs, Vec::new()).await;
    let mut s = h.stream().await;
    s.req().await;
    s.send(resp(A, "n1", vec![res("x", "v", "bad")], &[])).await;
    assert_ack(&s.req().await, A, "n1");
    timeout(WAIT, h.client.synced()).await.expect("synced");
    assert_eq!(h.client.status().types[0].acks, 1);
}

#[tokio::test]
async fn waiting_demands_are_capped_and_abandoned_ones_are_pruned() {
    use ambit_xds::client::MAX_PENDING_DEMANDS;
    let connector: Connector = Arc::new(|| Box::pin(async { Err("down".into()) }));
    let metadata: MetadataSource = Arc::new(|| Ok(MetadataMap::new()));
    let cfg = ClientConfig::new(node("n"), "http://x", vec![(A.into(), Subscription::OnDemand)]);
    let (handle, run) = XdsClient::new(cfg, connector, metadata, Vec::new(), XdsMetrics::default());
    let task = tokio::spawn(run);
    let waiting: Vec<_> = (0..MAX_PENDING_DEMANDS).map(|i| handle.demand(A, &format!("n{i}"))).collect();
    // Another caller for a name already waited on is fine; a new name is refused.
    let again = handle.demand(A, "n0");
    assert_eq!(handle.demand(A, "one-too-many").await, Err(DemandError::TooMany));
    drop(again);
    // Callers that gave up (timed out) free their places.
    drop(waiting);
    let ok = handle.demand(A, "fresh");
    task.abort();
    let _ = task.await;
    assert_eq!(ok.await, Err(DemandError::Stopped));
}

#[tokio::test]
async fn a_response_in_parts_syncs_only_after_the_last_part() {
    let (a, b) = (Store::default(), Store::default());
    let (subs, handlers) = wildcard2(&a, &b);
    let mut h = Harness::start(subs, handlers).await;
    let mut s = h.stream().await;
    assert_eq!(s.req().await.type_url, A);
    assert_eq!(s.req().await.type_url, B);
    let part = |nonce: &str, version: &str, resources| DeltaDiscoveryResponse {
        system_version_info: version.into(),
        ..resp(A, nonce, resources, &[])
    };

    s.send(resp(B, "m1", vec![res("b1", "x", "bee")], &[])).await;
    assert_ack(&s.req().await, B, "m1");
    s.send(part("n1", "4 part 1/2", vec![res("r1", "v1", "one")])).await;
    assert_ack(&s.req().await, A, "n1");
    // Applied and ACKed, but the state is not whole yet: not synced.
    assert_eq!(a.snapshot(), BTreeMap::from([("r1".into(), "one".into())]));
    assert!(!h.client.is_synced());
    s.send(part("n2", "4 part 2/2", vec![res("r2", "v2", "two")])).await;
    assert_ack(&s.req().await, A, "n2");
    timeout(WAIT, h.client.synced()).await.expect("synced once the last part is ACKed");
    assert_eq!(a.snapshot().len(), 2);
    assert_eq!(h.client.status().types[0].system_version_info, "4 part 2/2");
}
