//! Scoped types: each stream receives only the resources of its own scope (from istiod's node
//! check, the verified identity's `<namespace>/<service account>`), never another's, neither in
//! the first response, nor by name, nor in pushes and removals; a stream whose identity has no
//! resources gets none of the type, and unscoped types are served as before.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use ambit_api::xds::DeltaDiscoveryRequest;
use ambit_xds::BoxFuture;
use ambit_xds::server::istio::NodeCheck;
use ambit_xds::server::{AdsServer, Authenticate, Hooks, Principal, Resources, ServerResource, scope_of};
use common::ads::*;
use common::*;
use tonic::{Request, Status};

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

fn scoped(name: &str, payload: &str) -> ServerResource {
    ServerResource { resource: any(B, payload.as_bytes()), ..r(name, payload) }
}

async fn start_scoped() -> (Resources, String) {
    let resources = Resources::with_scoped([A, B], [B]);
    let hooks = Hooks {
        authenticate: Some(Arc::new(Accounts)),
        authorize: Some(Arc::new(NodeCheck::default())),
        ..Hooks::default()
    };
    let ads = AdsServer::new(resources.clone(), fast(), hooks);
    let (addr, _task) = serve(ads).await;
    resources
        .publish([
            upsert(A, vec![r("addr", "a")]),
            upsert(
                B,
                vec![
                    scoped("ns/wp-a/ns/x", "x"),
                    scoped("ns/wp-b/ns/y", "y"),
                    scoped("other/wp-a/ns/z", "z"),
                ],
            ),
        ])
        .unwrap();
    (resources, format!("http://{addr}"))
}

/// A stream as `ns/sa`, with a waypoint's node in `ns`, subscribed (wildcard) to `type_url`.
async fn open(url: &str, account: &str, type_url: &str, initial: &[(&str, &str)]) -> Client {
    let c = Client::open(url, Some(account)).await.unwrap();
    let ns = account.split('/').next().unwrap_or_default();
    c.send(DeltaDiscoveryRequest {
        node: Some(node(&format!("waypoint~10.0.0.5~wp-1.{ns}~{ns}.svc.cluster.local"))),
        initial_resource_versions: initial.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..req(type_url)
    })
    .await;
    c
}

#[test]
fn the_scope_is_a_names_first_two_segments() {
    assert_eq!(scope_of("ns/wp/ns/reviews.ns.svc.cluster.local"), Some("ns/wp"));
    assert_eq!(scope_of("ns/wp/Kubernetes//Pod/ns/p"), Some("ns/wp"));
    assert_eq!(scope_of("ns/wp"), None);
    assert_eq!(scope_of("plain"), None);
}

#[tokio::test]
async fn a_waypoint_identity_gets_its_own_resources_and_never_another_waypoints() {
    let (resources, url) = start_scoped().await;
    let mut a = open(&url, "ns/wp-a", B, &[]).await;
    let first = a.recv().await;
    assert_eq!(names(&first), ["ns/wp-a/ns/x"], "not ns/wp-b's, not other/wp-a's");
    a.ack(&first).await;
    let mut b = open(&url, "ns/wp-b", B, &[]).await;
    let first = b.recv().await;
    assert_eq!(names(&first), ["ns/wp-b/ns/y"]);
    b.ack(&first).await;

    // Pushes and removals go only where the resource was visible.
    resources
        .publish([upsert(B, vec![scoped("ns/wp-a/ns/x2", "x2")]), remove(B, &["ns/wp-b/ns/y"])])
        .unwrap();
    let push = a.recv().await;
    assert_eq!((names(&push), push.removed_resources.clone()), (vec!["ns/wp-a/ns/x2".to_owned()], vec![]));
    a.ack(&push).await;
    let push = b.recv().await;
    assert_eq!((names(&push), push.removed_resources.clone()), (vec![], vec!["ns/wp-b/ns/y".to_owned()]));
    b.ack(&push).await;
    a.quiet(150).await;
    b.quiet(150).await;

    // Asking by name for another waypoint's resource is answered as if it did not exist.
    b.send(DeltaDiscoveryRequest { resource_names_subscribe: vec!["ns/wp-a/ns/x".into()], ..req(B) }).await;
    let answer = b.recv().await;
    assert!(answer.resources.is_empty());
}

#[tokio::test]
async fn another_identity_gets_none_of_the_scoped_type_and_the_unscoped_types_as_before() {
    let (resources, url) = start_scoped().await;
    let mut zt = open(&url, "istio-system/ztunnel", A, &[]).await;
    let first = zt.recv().await;
    assert_eq!(names(&first), ["addr"]);
    zt.ack(&first).await;
    zt.send(DeltaDiscoveryRequest { ..req(B) }).await;
    let first = zt.recv().await;
    assert!(first.resources.is_empty() && first.removed_resources.is_empty(), "{first:?}");
    zt.ack(&first).await;
    resources
        .publish([upsert(B, vec![scoped("ns/wp-a/ns/x3", "x3")]), remove(B, &["ns/wp-a/ns/x"])])
        .unwrap();
    zt.quiet(200).await;

    // A reconnecting stream that claims another scope's names is told they are gone.
    let mut b = open(&url, "ns/wp-b", B, &[("ns/wp-a/ns/x3", &version("x3"))]).await;
    let first = b.recv().await;
    assert_eq!(names(&first), ["ns/wp-b/ns/y"]);
    assert_eq!(first.removed_resources, ["ns/wp-a/ns/x3"]);
}
