//! Stream admission as istiod (control-plane.md §5.1): readiness, the new-stream rate limit,
//! asynchronous authentication with the principal kept per stream, and the first request's
//! node checks (the generic hook and istiod's rules), each refusal with its exact code and
//! message.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_api::xds::{DeltaDiscoveryRequest, Node};
use ambit_xds::BoxFuture;
use ambit_xds::server::istio::NodeCheck;
use ambit_xds::server::{Authenticate, Authorize, Hooks, Principal, ServerConfig};
use common::ads::*;
use common::*;
use tokio::sync::Semaphore;
use tonic::{Code, Request, Status};

/// Tokens → principals; the token `slow` waits until the test releases the gate, `hang` never
/// finishes.
struct Tokens {
    gate: Arc<Semaphore>,
}

impl Tokens {
    fn new() -> Arc<Self> {
        Arc::new(Self { gate: Arc::new(Semaphore::new(0)) })
    }
}

impl Authenticate for Tokens {
    fn authenticate<'a>(&'a self, req: &'a Request<()>) -> BoxFuture<'a, Result<Principal, Status>> {
        let token = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
        Box::pin(async move {
            let principal = |sa: &str| Principal {
                name: format!("token for {sa}"),
                identities: vec![format!("spiffe://cluster.local/ns/istio-system/sa/{sa}").parse().unwrap()],
            };
            match token.as_deref() {
                Some("Bearer ztunnel") => Ok(principal("ztunnel")),
                Some("Bearer slow") => {
                    let _permit = self.gate.acquire().await;
                    Ok(principal("slow"))
                }
                Some("Bearer hang") => std::future::pending().await,
                _ => Err(Status::unauthenticated("authentication failure")),
            }
        })
    }
}

fn first(node: Node) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest { node: Some(node), ..req(A) }
}

const ZTUNNEL: &str = "ztunnel~10.0.0.1~ztunnel-abc.istio-system~istio-system.svc.cluster.local";

#[tokio::test]
async fn a_slow_authentication_holds_up_only_its_own_stream_and_each_stream_keeps_its_principal() {
    let tokens = Tokens::new();
    let s = start(fast(), Some(tokens.clone())).await;
    s.resources.publish([upsert(A, vec![r("a1", "one")])]).unwrap();

    let url = s.url.clone();
    let slow = tokio::spawn(async move { Client::open(&url, Some("slow")).await });
    // While the slow review is pending, another stream is authenticated and served.
    let mut fast_client = Client::open(&s.url, Some("ztunnel")).await.unwrap();
    fast_client.send(first(node(ZTUNNEL))).await;
    assert_eq!(names(&fast_client.recv().await), strings(&["a1"]));
    assert!(!slow.is_finished());
    assert_eq!(s.ads.status().len(), 1);

    tokens.gate.add_permits(1);
    let mut slow_client = slow.await.unwrap().unwrap();
    slow_client.send(first(node("ztunnel~10.0.0.2~z2.istio-system~istio-system.svc.cluster.local"))).await;
    slow_client.recv().await;

    let st = s.ads.status();
    let principals: HashMap<String, String> =
        st.iter().map(|s| (s.node_id.clone(), s.principal.as_ref().unwrap().name.clone())).collect();
    assert_eq!(
        principals,
        HashMap::from([
            (ZTUNNEL.to_owned(), "token for ztunnel".to_owned()),
            (
                "ztunnel~10.0.0.2~z2.istio-system~istio-system.svc.cluster.local".to_owned(),
                "token for slow".to_owned()
            ),
        ])
    );
}

#[tokio::test]
async fn an_authentication_that_does_not_finish_is_refused_in_bounded_time() {
    let cfg = ServerConfig { authenticate_timeout: Duration::from_millis(200), ..fast() };
    let s = start(cfg, Some(Tokens::new())).await;
    let err = Client::open(&s.url, Some("hang")).await.err().expect("refused");
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(err.message(), "authentication did not finish within 200ms; retry later");
    let err = Client::open(&s.url, Some("nobody")).await.err().expect("refused");
    assert_eq!((err.code(), err.message()), (Code::Unauthenticated, "authentication failure"));
    assert!(s.ads.status().is_empty());
}

#[tokio::test]
async fn an_empty_node_id_is_invalid_argument() {
    let s = start(fast(), None).await;
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(first(node(""))).await;
    let err = c.recv_err().await;
    assert_eq!((err.code(), err.message()), (Code::InvalidArgument, "missing node information"));
}

/// Records every call; refuses nodes whose id starts with `bad`.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(Option<String>, String)>>,
}

impl Authorize for Recorder {
    fn authorize(&self, principal: Option<&Principal>, node: &Node) -> Result<(), Status> {
        self.calls.lock().unwrap().push((principal.map(|p| p.name.clone()), node.id.clone()));
        if node.id.starts_with("bad") {
            return Err(Status::permission_denied(format!("authorization failed: {} may not", node.id)));
        }
        Ok(())
    }
}

#[tokio::test]
async fn the_authorize_hook_runs_once_per_stream_with_its_principal_and_node() {
    let rec = Arc::new(Recorder::default());
    let hooks = Hooks { authenticate: Some(Tokens::new()), authorize: Some(rec.clone()), ..Hooks::default() };
    let s = start_with(fast(), hooks).await;
    let mut c = Client::open(&s.url, Some("ztunnel")).await.unwrap();
    c.send(first(node("good-node"))).await;
    let p = c.recv().await;
    c.ack(&p).await;
    c.send(DeltaDiscoveryRequest { node: Some(node("good-node")), ..req(B) }).await;
    c.recv().await;
    assert_eq!(
        *rec.calls.lock().unwrap(),
        vec![(Some("token for ztunnel".to_owned()), "good-node".to_owned())]
    );

    let mut bad = Client::open(&s.url, Some("ztunnel")).await.unwrap();
    bad.send(first(node("bad-node"))).await;
    let err = bad.recv_err().await;
    assert_eq!(
        (err.code(), err.message()),
        (Code::PermissionDenied, "authorization failed: bad-node may not")
    );
    assert_eq!(rec.calls.lock().unwrap().len(), 2);
    // The refused stream is gone; the good one is served on.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let st = s.ads.status();
    assert_eq!(st.iter().map(|s| s.node_id.as_str()).collect::<Vec<_>>(), vec!["good-node"]);
}

/// A node id, its metadata, and the refusal expected (`None`: admitted).
type Case = (&'static str, Vec<(&'static str, &'static str)>, Option<(Code, String)>);

#[tokio::test]
async fn istiod_node_checks_refuse_with_istiods_codes_and_messages() {
    let hooks = Hooks {
        authenticate: Some(Tokens::new()),
        authorize: Some(Arc::new(NodeCheck::default())),
        ..Hooks::default()
    };
    let s = start_with(fast(), hooks).await;
    let me = "spiffe://cluster.local/ns/istio-system/sa/ztunnel";
    let cases: Vec<Case> = vec![
        (ZTUNNEL, vec![], None),
        (ZTUNNEL, vec![("NAMESPACE", "istio-system"), ("SERVICE_ACCOUNT", "ztunnel")], None),
        (
            ZTUNNEL,
            vec![("NAMESPACE", "default")],
            Some((Code::PermissionDenied, format!("authorization failed: no identities ([{me}]) matched default/"))),
        ),
        (
            ZTUNNEL,
            vec![("SERVICE_ACCOUNT", "other")],
            Some((
                Code::PermissionDenied,
                format!("authorization failed: no identities ([{me}]) matched istio-system/other"),
            )),
        ),
        (
            "ztunnel~10.0.0.1~ztunnel-abc.default~default.svc.cluster.local",
            vec![],
            Some((Code::PermissionDenied, format!("authorization failed: no identities ([{me}]) matched default/"))),
        ),
        (
            "ztunnel~10.0.0.1~x",
            vec![],
            Some((Code::InvalidArgument, "missing parts in the service node \"ztunnel~10.0.0.1~x\"".to_owned())),
        ),
        (
            "envoy~10.0.0.1~x.ns~ns.svc.cluster.local",
            vec![],
            Some((
                Code::InvalidArgument,
                "invalid node type (valid types: sidecar, router, waypoint, ztunnel, agentgateway) in the service \
                 node \"envoy~10.0.0.1~x.ns~ns.svc.cluster.local\""
                    .to_owned(),
            )),
        ),
        (
            "ztunnel~not-an-ip~x.istio-system~istio-system.svc.cluster.local",
            vec![("INSTANCE_IPS", "also-not")],
            Some((Code::InvalidArgument, "no valid IP address in the service node id or metadata".to_owned())),
        ),
    ];
    for (id, meta, want) in cases {
        let mut c = Client::open(&s.url, Some("ztunnel")).await.unwrap();
        c.send(first(node_with(id, &meta))).await;
        match want {
            None => {
                c.recv().await;
            }
            Some((code, message)) => {
                let err = c.recv_err().await;
                assert_eq!((err.code(), err.message()), (code, message.as_str()), "{id} {meta:?}");
            }
        }
    }
}

#[tokio::test]
async fn istiod_node_checks_skip_the_identity_check_for_an_unauthenticated_stream() {
    let hooks =
        Hooks { authenticate: None, authorize: Some(Arc::new(NodeCheck::default())), ..Hooks::default() };
    let s = start_with(fast(), hooks).await;
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(first(node_with(ZTUNNEL, &[("NAMESPACE", "default")]))).await;
    c.recv().await;
    // The node's shape is still checked.
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(first(node("ztunnel"))).await;
    let err = c.recv_err().await;
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "missing parts in the service node \"ztunnel\"")
    );
}

#[tokio::test]
async fn a_server_that_is_not_ready_refuses_new_streams_and_keeps_open_ones() {
    let s = start(ServerConfig { ready: false, ..fast() }, None).await;
    assert!(!s.ads.is_ready());
    let err = Client::open(&s.url, None).await.err().expect("refused");
    assert_eq!(
        (err.code(), err.message()),
        (Code::Unavailable, "server is not ready to serve discovery information")
    );
    assert!(s.ads.status().is_empty());

    s.ads.set_ready(true);
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(first(node("n"))).await;
    let p = c.recv().await;
    c.ack(&p).await;

    // Not ready again: new streams are refused, the open one still gets pushes.
    s.ads.set_ready(false);
    let err = Client::open(&s.url, None).await.err().expect("refused");
    assert_eq!(err.code(), Code::Unavailable);
    s.resources.publish([upsert(A, vec![r("a1", "one")])]).unwrap();
    assert_eq!(names(&c.recv().await), strings(&["a1"]));
}

#[tokio::test]
async fn new_streams_past_the_rate_limit_are_resource_exhausted() {
    let cfg = ServerConfig { new_streams_per_second: 1, new_stream_max_wait: Duration::ZERO, ..fast() };
    let s = start(cfg, None).await;
    let _c = Client::open(&s.url, None).await.unwrap();
    let err = Client::open(&s.url, None).await.err().expect("refused");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(
        err.message(),
        "request rate limit exceeded: this xDS server accepts 1 new streams per second; retry later"
    );
}

#[tokio::test]
async fn a_burst_of_new_streams_is_spread_out_and_what_would_wait_too_long_is_refused() {
    // 5 per second, a wait of at most 1 s: of 10 streams opened at once, those whose turn comes
    // within the second (turns at 0, 200, …, 1000 ms) are served, the rest refused at once.
    let cfg =
        ServerConfig { new_streams_per_second: 5, new_stream_max_wait: Duration::from_secs(1), ..fast() };
    let s = start(cfg, None).await;
    let started = std::time::Instant::now();
    let opens: Vec<_> = (0..10)
        .map(|_| {
            let url = s.url.clone();
            tokio::spawn(async move {
                let r = Client::open(&url, None).await;
                (r.map(|_| ()).map_err(|e| (e.code(), e.message().to_owned())), started.elapsed())
            })
        })
        .collect();
    let mut served = Vec::new();
    let mut refused = Vec::new();
    for o in opens {
        match o.await.unwrap() {
            (Ok(()), at) => served.push(at),
            (Err(e), at) => refused.push((e, at)),
        }
    }
    served.sort();
    eprintln!("served at {served:?}; refused {refused:?}");
    assert!((6..=7).contains(&served.len()), "served at {served:?}");
    assert!(refused.iter().all(|((code, _), _)| *code == Code::ResourceExhausted));
    // The last one served waited for its turn, 5 intervals after the first.
    assert!(served[5] >= Duration::from_millis(1000), "{served:?}");
}
