//! The proxy's xDS client (`ambit_proxy::testing::Xds`) against an `ambit-xds` server in the test:
//! what it applies to the state, what it NACKs (and that the rest of the response applies),
//! readiness, removals, policy changes reaching the policy watcher, and on-demand lookups by IP.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ambit_api::type_url::{ADDRESS, AUTHORIZATION};
use ambit_api::workload as pb;
use ambit_api::xds::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use ambit_identity::control::RootSource;
use ambit_proxy::testing::{
    ControlSettings, NodeInfo, State, StateStore, Xds, XdsSettings, address_resources, any,
    authorization_resources, generated,
};
use ambit_xds::server::{AdsServer, Changes, Resources, ServerConfig, ServerResource};
use prometheus_client::registry::Registry;

struct Server {
    addr: SocketAddr,
    resources: Resources,
    ads: AdsServer,
}

async fn server() -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let resources = Resources::new([ADDRESS, AUTHORIZATION]);
    let cfg = ServerConfig { debounce_after: Duration::from_millis(5), ..ServerConfig::default() };
    let ads = AdsServer::new(resources.clone(), cfg, Default::default());
    let svc = AggregatedDiscoveryServiceServer::new(ads.clone());
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let _ = tonic::transport::Server::builder().add_service(svc).serve_with_incoming(incoming).await;
    });
    Server { addr, resources, ads }
}

fn settings(addr: SocketAddr, on_demand: bool) -> XdsSettings {
    XdsSettings {
        control: ControlSettings {
            address: format!("http://{addr}"),
            roots: RootSource::System,
            alt_hostname: None,
            token: None,
            cluster_id: "Kubernetes".into(),
            headers: Vec::new(),
        },
        on_demand,
        node: NodeInfo {
            id: "ztunnel~10.0.0.1~ztunnel-a.istio-system~istio-system.svc.cluster.local".into(),
            metadata: BTreeMap::new(),
        },
    }
}

fn start(addr: SocketAddr, on_demand: bool) -> (Xds, StateStore, Registry) {
    let store = StateStore::new(State::default());
    let mut registry = Registry::default();
    let xds =
        Xds::start(&settings(addr, on_demand), store.clone(), None, &mut registry).expect("start the client");
    (xds, store, registry)
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..400 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 4 s");
}

/// A workload the proxy refuses: LEGACY_ISTIO_MTLS.
fn legacy(uid: &str) -> ServerResource {
    let w = pb::Workload {
        uid: uid.into(),
        name: "legacy".into(),
        namespace: "ns0".into(),
        tunnel_protocol: pb::TunnelProtocol::LegacyIstioMtls as i32,
        ..Default::default()
    };
    ServerResource {
        name: uid.into(),
        aliases: vec![],
        resource: any(ADDRESS, &pb::Address { r#type: Some(pb::address::Type::Workload(w)) }),
        also: vec![],
        node: None,
    }
}

#[tokio::test]
async fn applies_nacks_the_bad_resource_and_keeps_the_rest_and_tracks_removals_and_policies() {
    let s = server().await;
    let mesh = generated::mesh_with(20, 2);
    let mut addresses = address_resources(&mesh.workloads, &mesh.services);
    addresses.push(legacy("cluster1//v1/Pod/ns0/legacy"));
    s.resources
        .publish(vec![
            Changes { type_url: ADDRESS.into(), upserts: addresses, removals: vec![] },
            Changes {
                type_url: AUTHORIZATION.into(),
                upserts: authorization_resources(&mesh.policies),
                removals: vec![],
            },
        ])
        .expect("publish");
    let (xds, store, _registry) = start(s.addr, false);
    let mut policies = store.subscribe_policies();
    eventually("the good resources are applied", || {
        let st = store.current();
        st.policies().count() == mesh.policies.len() && st.workloads().count() == 20
    })
    .await;

    // Everything good applied; the bad workload NACKed with its name and reason.
    let state = store.current();
    assert_eq!(state.workloads().count(), 20);
    assert_eq!(state.services().count(), 2);
    assert_eq!(state.policies().count(), 1, "one policy per 100 workloads");
    assert!(state.workload_by_uid("cluster1//v1/Pod/ns0/legacy").is_none());
    let status = xds.status();
    let address = status.types.iter().find(|t| t.type_url == ADDRESS).expect("address status");
    let nack = address.last_nack.as_ref().expect("the response with the bad workload was NACKed");
    assert_eq!(
        nack.message,
        "cluster1//v1/Pod/ns0/legacy: workload \"cluster1//v1/Pod/ns0/legacy\": tunnel protocol LEGACY_ISTIO_MTLS is not supported; use HBONE or NONE"
    );
    // The client records the NACK as it sends it; the server sees it a moment later.
    let server_nacks = || -> Vec<String> {
        s.ads
            .status()
            .iter()
            .flat_map(|st| st.types.iter().flat_map(|t| t.nacks.iter().map(|n| n.message.clone())))
            .collect()
    };
    eventually("the server sees the NACK", || !server_nacks().is_empty()).await;
    assert_eq!(server_nacks(), vec![nack.message.clone()], "the server saw the NACK");
    // As ztunnel: the first sync is an ACK of every type, so a NACKed first response keeps the
    // proxy unready until a later response of that type is ACKed.
    assert!(!xds.is_synced(), "synced although the only Address response was NACKed");
    s.resources
        .publish(vec![Changes {
            type_url: ADDRESS.into(),
            upserts: vec![],
            removals: vec!["cluster1//v1/Pod/ns0/legacy".into()],
        }])
        .expect("publish");
    tokio::time::timeout(Duration::from_secs(5), xds.synced())
        .await
        .expect("synced after the next (good) response");

    // A removal and a policy change reach the state; the policy change bumps the policy watcher
    // (live connections are re-evaluated).
    let gone = mesh.workloads[3].uid.to_string();
    s.resources
        .publish(vec![Changes { type_url: ADDRESS.into(), upserts: vec![], removals: vec![gone.clone()] }])
        .expect("publish");
    eventually("the removed workload leaves the state", || store.current().workload_by_uid(&gone).is_none())
        .await;
    policies.borrow_and_update();
    let key = mesh.policies[0].key();
    s.resources
        .publish(vec![Changes {
            type_url: AUTHORIZATION.into(),
            upserts: vec![],
            removals: vec![key.clone()],
        }])
        .expect("publish");
    eventually("the removed policy leaves the state", || store.current().policies().all(|p| p.key() != key))
        .await;
    assert!(policies.has_changed().expect("watcher"), "a policy removal did not bump the policy watcher");
}

#[tokio::test]
async fn not_synced_without_a_server_and_on_demand_lookups_by_ip_resolve_by_alias() {
    // No server at this address yet: not synced.
    let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead = probe.local_addr().expect("addr");
    drop(probe);
    let (idle, _store, _r) = start(dead, false);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), idle.synced()).await.is_err(),
        "synced with no server"
    );

    let s = server().await;
    let mesh = generated::mesh_with(5, 1);
    s.resources
        .publish(vec![Changes {
            type_url: ADDRESS.into(),
            upserts: address_resources(&mesh.workloads, &mesh.services),
            removals: vec![],
        }])
        .expect("publish");
    let (xds, store, _registry) = start(s.addr, true);
    // On demand, only Authorization gates the sync; no address is sent until asked for.
    tokio::time::timeout(Duration::from_secs(5), xds.synced()).await.expect("synced within 5 s");
    assert_eq!(store.current().workloads().count(), 0);
    let ip: IpAddr = generated::workload_ip(2);
    assert!(xds.demand_address("", ip).await, "the on-demand lookup of {ip} got no answer");
    let w =
        store.current().workload_by_addr("", ip).expect("the workload at the demanded IP is in the state");
    assert_eq!(w.uid, mesh.workloads[2].uid);
    // An address nobody has is answered as removed: no wait.
    let t = std::time::Instant::now();
    assert!(xds.demand_address("", "10.255.255.254".parse().expect("ip")).await);
    assert!(t.elapsed() < Duration::from_secs(2), "an unknown address took {:?}", t.elapsed());
}
