//! control-plane.md §8 rows 28 and 29 and the node-local rule of §5.3, with a generic resource
//! type (the names are istiod's, the payloads opaque bytes), and the push of one changed
//! resource among 10 000.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};

use ambit_api::xds::DeltaDiscoveryRequest;
use ambit_xds::server::{ServerResource, StreamTypeStatus};
use common::ads::*;
use common::*;

/// A pod as istiod names it (cluster `Kubernetes`, empty network), by IP alias, on `node`.
fn pod(name: &str, ip: &str, node: &str, payload: &str) -> ServerResource {
    ServerResource {
        name: format!("Kubernetes//Pod/default/{name}"),
        aliases: vec![format!("/{ip}")],
        resource: any(A, payload.as_bytes()),
        also: vec![],
        node: Some(node.into()),
    }
}

/// ztunnel's on-demand first request (`*` subscribed and unsubscribed) from a proxy on `node`.
fn on_demand(node_name: Option<&str>, initial: &[(&str, &str)]) -> DeltaDiscoveryRequest {
    let meta: Vec<(&str, &str)> = node_name.map(|n| ("NODE_NAME", n)).into_iter().collect();
    DeltaDiscoveryRequest {
        node: Some(node_with("ztunnel~10.0.0.1~zt.istio-system~istio-system.svc.cluster.local", &meta)),
        resource_names_subscribe: strings(&["*"]),
        resource_names_unsubscribe: strings(&["*"]),
        initial_resource_versions: initial.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..req(A)
    }
}

fn subscribe(name: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest { resource_names_subscribe: strings(&[name]), ..req(A) }
}

fn type_status(s: &Server) -> StreamTypeStatus {
    let st = s.ads.status();
    assert_eq!(st.len(), 1);
    st[0].types[0].clone()
}

const POD: &str = "Kubernetes//Pod/default/pod";

/// Row 28: on demand, NODE_NAME=node, a pod on another node at 127.0.0.1.
#[tokio::test]
async fn row_28_on_demand_by_ip_not_found_and_node_local_pushes() {
    let s = start(fast(), None).await;
    s.resources.publish([upsert(A, vec![pod("pod", "127.0.0.1", "other", "pod-v1")])]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(on_demand(Some("node"), &[])).await;
    // Empty initial response: nothing lives on `node`.
    let p = c.recv().await;
    assert!(p.resources.is_empty() && p.removed_resources.is_empty(), "{p:?}");
    c.ack(&p).await;
    assert_eq!(s.ads.status()[0].node_name.as_deref(), Some("node"));

    // By IP: the pod under its uid, with its alias; not echoed as removed.
    c.send(subscribe("/127.0.0.1")).await;
    let p = c.recv().await;
    assert_eq!(names(&p), strings(&[POD]));
    assert_eq!(p.resources[0].aliases, strings(&["/127.0.0.1"]));
    assert!(p.removed_resources.is_empty());
    c.ack(&p).await;

    // An IP nobody has: echoed as removed.
    c.send(subscribe("/127.0.0.2")).await;
    let p = c.recv().await;
    assert!(p.resources.is_empty());
    assert_eq!(p.removed_resources, strings(&["/127.0.0.2"]));
    c.ack(&p).await;

    // A new pod on `node` is pushed unrequested (with its aliases); one on another node is not.
    s.resources.publish([upsert(A, vec![pod("pod3", "127.0.0.3", "elsewhere", "pod3-v1")])]).unwrap();
    c.quiet(200).await;
    s.resources.publish([upsert(A, vec![pod("pod2", "127.0.0.2", "node", "pod2-v1")])]).unwrap();
    let p = c.recv().await;
    assert_eq!(
        contents(&p),
        BTreeMap::from([("Kubernetes//Pod/default/pod2".into(), (version("pod2-v1"), "pod2-v1".into()))])
    );
    assert_eq!(p.resources[0].aliases, strings(&["/127.0.0.2"]));
    c.ack(&p).await;

    // It joined the subscription: its updates and its removal are pushed.
    assert!(type_status(&s).subscriptions.contains(&"Kubernetes//Pod/default/pod2".to_owned()));
    s.resources.publish([upsert(A, vec![pod("pod2", "127.0.0.2", "node", "pod2-v2")])]).unwrap();
    let p = c.recv().await;
    assert_eq!(names(&p), strings(&["Kubernetes//Pod/default/pod2"]));
    c.ack(&p).await;
    s.resources.publish([remove(A, &["Kubernetes//Pod/default/pod2"])]).unwrap();
    let p = c.recv().await;
    assert!(p.resources.is_empty());
    assert_eq!(p.removed_resources, strings(&["Kubernetes//Pod/default/pod2"]));
}

#[tokio::test]
async fn node_local_resources_come_with_the_first_on_demand_response_only_to_their_node() {
    let s = start(fast(), None).await;
    s.resources
        .publish([upsert(
            A,
            vec![
                pod("a", "10.0.0.1", "node", "a-v1"),
                pod("b", "10.0.0.2", "node", "b-v1"),
                pod("c", "10.0.0.3", "other", "c-v1"),
                r("no-node", "x"),
            ],
        )])
        .unwrap();

    // On demand on `node`: its two pods, with aliases, plus what it asked for by IP.
    let mut c = Client::open(&s.url, None).await.unwrap();
    let mut first = on_demand(Some("node"), &[]);
    first.resource_names_subscribe.push("/10.0.0.3".into());
    c.send(first).await;
    let p = c.recv().await;
    assert_eq!(
        names(&p),
        strings(&["Kubernetes//Pod/default/a", "Kubernetes//Pod/default/b", "Kubernetes//Pod/default/c"])
    );
    assert!(p.resources.iter().all(|r| r.aliases.len() == 1));
    assert!(p.removed_resources.is_empty());
    drop(c);

    // Reconnect holding `a` at its version: only `b` is sent again.
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(on_demand(Some("node"), &[("Kubernetes//Pod/default/a", &version("a-v1"))])).await;
    let p = c.recv().await;
    assert_eq!(names(&p), strings(&["Kubernetes//Pod/default/b"]));
    drop(c);

    // Another node, or no NODE_NAME: nothing unrequested.
    for node_name in [Some("elsewhere"), None] {
        let mut c = Client::open(&s.url, None).await.unwrap();
        c.send(on_demand(node_name, &[])).await;
        let p = c.recv().await;
        assert!(p.resources.is_empty(), "{node_name:?}: {p:?}");
        c.ack(&p).await;
        s.resources
            .publish([upsert(A, vec![pod("a", "10.0.0.1", "node", &format!("a-{node_name:?}"))])])
            .unwrap();
        c.quiet(200).await;
    }

    // Wildcard streams are unchanged by NODE_NAME: everything, no aliases.
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(DeltaDiscoveryRequest {
        node: Some(node_with(
            "ztunnel~10.0.0.1~zt.istio-system~istio-system.svc.cluster.local",
            &[("NODE_NAME", "node")],
        )),
        ..req(A)
    })
    .await;
    let p = c.recv().await;
    assert_eq!(p.resources.len(), 4);
    assert!(p.resources.iter().all(|r| r.aliases.is_empty()));
}

#[tokio::test]
async fn a_resource_that_moves_onto_the_node_is_pushed_and_a_node_change_is_a_change() {
    let s = start(fast(), None).await;
    s.resources.publish([upsert(A, vec![pod("a", "10.0.0.1", "other", "a")])]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.send(on_demand(Some("node"), &[])).await;
    let p = c.recv().await;
    assert!(p.resources.is_empty());
    c.ack(&p).await;
    // Same payload, new node: a change, and now node-local.
    s.resources.publish([upsert(A, vec![pod("a", "10.0.0.1", "node", "a")])]).unwrap();
    let p = c.recv().await;
    assert_eq!(names(&p), strings(&["Kubernetes//Pod/default/a"]));
}

/// Row 29: wildcard reconnect with versions {pod, pod2}; meanwhile pod2 deleted, pod3 added.
#[tokio::test]
async fn row_29_wildcard_reconnect_sends_the_difference_and_resends_a_stale_version() {
    let s = start(fast(), None).await;
    s.resources.publish([upsert(A, vec![r("pod", "pod-v1"), r("pod2", "pod2-v1")])]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[]).await;
    let p = c.recv().await;
    let held: HashMap<String, String> =
        p.resources.iter().map(|r| (r.name.clone(), r.version.clone())).collect();
    assert_eq!(held.len(), 2);
    drop(c);

    s.resources.publish([remove(A, &["pod2"]), upsert(A, vec![r("pod3", "pod3-v1")])]).unwrap();
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[("pod", &held["pod"]), ("pod2", &held["pod2"])]).await;
    let p = c.recv().await;
    assert_eq!(names(&p), strings(&["pod3"]));
    assert_eq!(p.removed_resources, strings(&["pod2"]));
    drop(c);

    // A stale version for pod: pod is sent again.
    let mut c = Client::open(&s.url, None).await.unwrap();
    c.wildcard(A, &[("pod", "stale"), ("pod2", &held["pod2"])]).await;
    let p = c.recv().await;
    assert_eq!(contents(&p)["pod"], (version("pod-v1"), "pod-v1".to_owned()));
    assert_eq!(names(&p), strings(&["pod", "pod3"]));
    assert_eq!(p.removed_resources, strings(&["pod2"]));
}

/// 10 000 resources, half of them on the on-demand stream's node; the owner republishes all
/// of them with one payload changed (as a translator that recomputed a namespace would).
#[tokio::test]
async fn one_changed_resource_among_10_000_is_a_push_of_exactly_that_resource() {
    let s = start(fast(), None).await;
    let mut payloads: Vec<String> = (0..10_000).map(|i| format!("w{i}-v1")).collect();
    let all = |payloads: &[String]| -> Vec<ServerResource> {
        payloads
            .iter()
            .enumerate()
            .map(|(i, payload)| {
                let node = if i % 2 == 0 { "node" } else { "other" };
                pod(&format!("w{i}"), &format!("10.0.{}.{}", i >> 8, i & 255), node, payload)
            })
            .collect()
    };
    s.resources.publish([upsert(A, all(&payloads))]).unwrap();

    let mut wild = Client::open(&s.url, None).await.unwrap();
    wild.wildcard(A, &[]).await;
    let p = wild.recv().await;
    assert_eq!(p.resources.len(), 10_000);
    wild.ack(&p).await;
    let mut demand = Client::open(&s.url, None).await.unwrap();
    demand.send(on_demand(Some("node"), &[])).await;
    let p = demand.recv().await;
    assert_eq!(p.resources.len(), 5_000);
    demand.ack(&p).await;

    // w42 lives on `node`: both streams get exactly it.
    payloads[42] = "w42-v2".into();
    s.resources.publish([upsert(A, all(&payloads))]).unwrap();
    for c in [&mut wild, &mut demand] {
        let p = c.recv().await;
        assert_eq!(
            contents(&p),
            BTreeMap::from([("Kubernetes//Pod/default/w42".into(), (version("w42-v2"), "w42-v2".into()))])
        );
        assert!(p.removed_resources.is_empty());
        c.ack(&p).await;
    }
    // w43 lives elsewhere: the wildcard stream gets exactly it, the on-demand one nothing.
    payloads[43] = "w43-v2".into();
    s.resources.publish([upsert(A, all(&payloads))]).unwrap();
    let p = wild.recv().await;
    assert_eq!(
        contents(&p),
        BTreeMap::from([("Kubernetes//Pod/default/w43".into(), (version("w43-v2"), "w43-v2".into()))])
    );
    wild.ack(&p).await;
    wild.quiet(200).await;
    demand.quiet(200).await;
}
