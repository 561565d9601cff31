//! Helpers shared by the conformance tests: a local tonic listener and small builders.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use ambit_api::xds::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_api::xds::{DeltaDiscoveryRequest, Node};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// Type URLs used by the tests (the crate is generic; these need not be Istio's).
pub const A: &str = "type.googleapis.com/test.A";
pub const B: &str = "type.googleapis.com/test.B";

/// Upper bound on any single wait in the tests, so a hang fails instead of stalling.
pub const WAIT: Duration = Duration::from_secs(5);

/// Serves `svc` on 127.0.0.1 (plaintext); returns the address and the server task.
pub async fn serve<S: AggregatedDiscoveryService>(svc: S) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a local port");
    let addr = listener.local_addr().expect("local address");
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(svc))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await;
    });
    (addr, task)
}

pub fn node(id: &str) -> Node {
    Node { id: id.into(), ..Default::default() }
}

pub fn any(type_url: &str, payload: &[u8]) -> prost_types::Any {
    prost_types::Any { type_url: type_url.into(), value: payload.to_vec() }
}

pub fn req(type_url: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest { type_url: type_url.into(), ..Default::default() }
}

pub fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

pub mod ads;

/// A node with string metadata.
pub fn node_with(id: &str, meta: &[(&str, &str)]) -> Node {
    let fields = meta
        .iter()
        .map(|(k, v)| {
            let value = prost_types::Value { kind: Some(prost_types::value::Kind::StringValue((*v).into())) };
            ((*k).to_owned(), value)
        })
        .collect();
    Node { id: id.into(), metadata: Some(prost_types::Struct { fields }), ..Default::default() }
}
