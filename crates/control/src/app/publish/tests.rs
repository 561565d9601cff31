//! Served as `ambit control` serves them (its resource set, publisher and istiod's node check
//! with its scope): a waypoint's identity receives its own Gateway's configuration, another
//! waypoint's identity does not see it, and a node proxy receives Address as before and none
//! of the waypoint types.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ambit_api::type_url::{ADDRESS, WAYPOINT_DESTINATION, WAYPOINT_POLICY};
use ambit_api::waypoint::Destination;
use ambit_api::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_api::xds::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use ambit_api::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node};
use ambit_objects::{Change, Object};
use ambit_xds::server::istio::NodeCheck;
use ambit_xds::server::{AdsServer, Authenticate, Hooks, Principal, ServerConfig, scope_of};
use futures::future::BoxFuture;
use prost::Message;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status};

use super::{Publisher, resources};
use crate::translate::{Settings, Translator};

/// `Bearer <ns>/<sa>` proves `spiffe://cluster.local/ns/<ns>/sa/<sa>`.
struct Accounts;

impl Authenticate for Accounts {
    fn authenticate<'a>(&'a self, req: &'a Request<()>) -> BoxFuture<'a, Result<Principal, Status>> {
        let token = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
        Box::pin(async move {
            let account = token.as_deref().and_then(|t| t.strip_prefix("Bearer ")).unwrap_or_default();
            let (ns, sa) = account.split_once('/').ok_or_else(|| Status::unauthenticated("no account"))?;
            let id = format!("spiffe://cluster.local/ns/{ns}/sa/{sa}");
            Ok(Principal { name: id.clone(), identities: vec![id.parse().unwrap()] })
        })
    }
}

fn objects() -> Vec<Change> {
    let mut out = Vec::new();
    for (wp, svc, ip) in [("wp-a", "a", "10.0.0.1"), ("wp-b", "b", "10.0.0.2")] {
        out.push(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": wp, "namespace": "app"},
            "spec": {"gatewayClassName": "istio-waypoint", "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
            "status": {"addresses": [{"type": "Hostname", "value": format!("{wp}.app.svc.cluster.local")}]},
        }));
        out.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc, "namespace": "app", "labels": {"istio.io/use-waypoint": wp}},
            "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80}]},
        }));
        out.push(json!({
            "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": format!("{wp}-get"), "namespace": "app"},
            "spec": {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": wp}],
                     "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]},
        }));
    }
    out.into_iter().map(|v| Change::Upsert(Object::from_value(v).unwrap())).collect()
}

struct Stream {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl Stream {
    async fn open(url: &str, account: &str) -> Stream {
        let mut stub = AggregatedDiscoveryServiceClient::connect(url.to_owned()).await.unwrap();
        let (tx, rx) = mpsc::channel(4);
        let mut req = Request::new(ReceiverStream::new(rx));
        req.metadata_mut().insert("authorization", format!("Bearer {account}").parse().unwrap());
        let rx = stub.delta_aggregated_resources(req).await.unwrap().into_inner();
        Stream { tx, rx }
    }

    /// Subscribes (wildcard) to `type_url` as a node of `kind` in `ns`; the names received.
    async fn wildcard(&mut self, kind: &str, ns: &str, type_url: &str) -> Vec<String> {
        let node = Node { id: format!("{kind}~10.0.0.5~p.{ns}~{ns}.svc.cluster.local"), ..Node::default() };
        let req = DeltaDiscoveryRequest { node: Some(node), type_url: type_url.into(), ..Default::default() };
        self.tx.send(req).await.unwrap();
        let resp =
            tokio::time::timeout(Duration::from_secs(5), self.rx.message()).await.unwrap().unwrap().unwrap();
        let mut names: Vec<String> = resp.resources.iter().map(|r| r.name.clone()).collect();
        names.sort();
        if type_url == WAYPOINT_DESTINATION {
            for r in &resp.resources {
                let d = Destination::decode(r.resource.as_ref().unwrap().value.as_slice()).unwrap();
                // References carry the same waypoint as the resource.
                let scope = scope_of(&r.name);
                assert!(!d.policies.is_empty() && d.policies.iter().all(|p| scope_of(p) == scope), "{d:?}");
            }
        }
        names
    }
}

#[tokio::test]
async fn a_waypoint_receives_only_its_own_gateways_configuration() {
    let resources = resources();
    let mut tr = Translator::new(Settings::default());
    let out = tr.apply(objects());
    Publisher::new(resources.clone()).publish(&tr, out);
    assert_eq!((resources.len(WAYPOINT_DESTINATION), resources.len(WAYPOINT_POLICY)), (2, 2));

    let hooks = Hooks {
        authenticate: Some(Arc::new(Accounts)),
        authorize: Some(Arc::new(NodeCheck::default())),
        ..Hooks::default()
    };
    let ads = AdsServer::new(resources, ServerConfig::default(), hooks);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut routes = tonic::service::RoutesBuilder::default();
    routes.add_service(AggregatedDiscoveryServiceServer::new(ads));
    let settings = crate::tls::ServeSettings::default();
    tokio::spawn(async move {
        crate::tls::serve(routes.routes(), listener, None, &settings, std::future::pending()).await
    });

    let mut a = Stream::open(&url, "app/wp-a").await;
    assert_eq!(
        a.wildcard("waypoint", "app", WAYPOINT_DESTINATION).await,
        ["app/wp-a/app/a.app.svc.cluster.local"]
    );
    assert_eq!(a.wildcard("waypoint", "app", WAYPOINT_POLICY).await, ["app/wp-a/app/wp-a-get"]);
    let mut b = Stream::open(&url, "app/wp-b").await;
    assert_eq!(
        b.wildcard("waypoint", "app", WAYPOINT_DESTINATION).await,
        ["app/wp-b/app/b.app.svc.cluster.local"]
    );
    assert_eq!(b.wildcard("waypoint", "app", WAYPOINT_POLICY).await, ["app/wp-b/app/wp-b-get"]);

    let mut node_proxy = Stream::open(&url, "istio-system/ztunnel").await;
    let addresses = node_proxy.wildcard("ztunnel", "istio-system", ADDRESS).await;
    assert_eq!(addresses, ["app/a.app.svc.cluster.local", "app/b.app.svc.cluster.local"]);
    assert!(node_proxy.wildcard("ztunnel", "istio-system", WAYPOINT_DESTINATION).await.is_empty());
    assert!(node_proxy.wildcard("ztunnel", "istio-system", WAYPOINT_POLICY).await.is_empty());
}
