//! Tests of the DNS proxy: name resolution rules, protocol handling, forwarding, serving loops.

#![allow(clippy::unwrap_used)]

mod forward;
mod lookup;
mod metrics;
mod props;
mod protocol;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::{Name, RecordType};

use super::*;
use crate::state::{LocalConfig, State};

/// The mesh the tests resolve against (client default: namespace ns1, network "").
const MESH: &str = r#"
workloads:
- uid: cluster1//v1/Pod/ns1/h1
  name: h1
  namespace: ns1
  workloadIps: ["10.0.0.1", "fd00::1"]
  services: {"ns1/headless.ns1.svc.cluster.local": {80: 80}}
- uid: cluster1//v1/Pod/ns1/h2
  name: h2
  namespace: ns1
  workloadIps: ["10.0.0.2"]
  services: {"ns1/headless.ns1.svc.cluster.local": {80: 80}, "ns1/external.headless.example": {80: 80}}
services:
- {name: productpage, namespace: ns1, hostname: productpage.ns1.svc.cluster.local,
   vips: ["/9.9.9.9", "/fd00::9", "nw2/9.9.9.10"]}
- {name: example, namespace: ns2, hostname: example.ns2.svc.cluster.local, vips: ["/10.10.10.10"]}
- {name: google, namespace: ns1, hostname: www.google.com, vips: ["/1.1.1.1"]}
- {name: wild, namespace: ns1, hostname: "*.wild.example", vips: ["/8.8.8.8"]}
- {name: headless, namespace: ns1, hostname: headless.ns1.svc.cluster.local}
- {name: ext, namespace: ns1, hostname: external.headless.example}
- {name: private, namespace: ns2, hostname: private.ns2.svc.cluster.local, vips: ["/10.2.2.2"],
   visibility: Namespace}
- {name: v4only, namespace: ns1, hostname: v4only.ns1.svc.cluster.local,
   vips: ["/10.4.4.4", "/fd00::4"], ipFamilies: IPv4}
- {name: v6only, namespace: ns1, hostname: v6only.ns1.svc.cluster.local,
   vips: ["/10.6.6.6", "/fd00::6"], ipFamilies: IPv6}
- {name: s, namespace: ns2, hostname: shared.example, vips: ["/10.20.0.2"]}
- {name: s, namespace: ns1, hostname: shared.example, vips: ["/10.20.0.1"]}
- {name: s, namespace: ns3, hostname: shared.example, vips: ["/10.20.0.3"], canonical: true}
- {name: s, namespace: ns2, hostname: shared2.example, vips: ["/10.21.0.2"]}
- {name: s, namespace: ns3, hostname: shared2.example, vips: ["/10.21.0.3"], canonical: true}
- {name: s, namespace: preferred, hostname: shared2.example, vips: ["/10.21.0.4"]}
- {name: s, namespace: ns2, hostname: shared3.example, vips: ["/10.22.0.2"]}
- {name: s, namespace: preferred, hostname: shared3.example, vips: ["/10.22.0.4"]}
- {name: s, namespace: ns3, hostname: shared4.example, vips: ["/10.23.0.3"]}
- {name: s, namespace: ns2, hostname: shared4.example, vips: ["/10.23.0.2"]}
"#;

fn store(yaml: &str) -> StateStore {
    StateStore::new(State::from_config(LocalConfig::parse(yaml).unwrap(), None).unwrap())
}

/// The in-pod configuration for a client in `ns`, without upstreams.
fn config(ns: &str) -> DnsConfig {
    DnsConfig {
        cluster_domain: "cluster.local".to_owned(),
        ipv6_enabled: true,
        preferred_namespace: Some("preferred".to_owned()),
        upstreams: vec![],
        search_domains: DnsConfig::pod_search_domains(ns, "cluster.local"),
    }
}

fn client(ns: &str) -> DnsClient {
    DnsClient { namespace: ns.to_owned(), network: String::new(), workload: None }
}

/// Upstream sockets bound on 127.0.0.1 in the test's own network namespace.
struct LocalSockets;

impl UpstreamSockets for LocalSockets {
    fn udp(&self, _upstream: SocketAddr) -> std::io::Result<tokio::net::UdpSocket> {
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        s.set_nonblocking(true)?;
        tokio::net::UdpSocket::from_std(s)
    }

    fn tcp(&self, upstream: SocketAddr) -> BoxFuture<'_, std::io::Result<tokio::net::TcpStream>> {
        Box::pin(tokio::net::TcpStream::connect(upstream))
    }
}

fn proxy_with(yaml: &str, cfg: DnsConfig, ns: &str) -> Arc<DnsProxy> {
    DnsProxy::new(store(yaml), Arc::new(cfg), client(ns), Arc::new(LocalSockets), DnsMetrics::default())
}

/// A proxy whose upstream exchanges time out after `timeout`.
fn proxy_with_timeout(cfg: DnsConfig, timeout: Duration) -> Arc<DnsProxy> {
    Arc::new(DnsProxy::build(
        store(MESH),
        Arc::new(cfg),
        client("ns1"),
        Arc::new(LocalSockets),
        timeout,
        DnsMetrics::default(),
    ))
}

/// A recursive query for `name`/`rtype` with id 0x1234, optionally with EDNS.
fn query(name: &str, rtype: RecordType, edns: Option<u16>) -> Message {
    let mut m = Message::query();
    m.metadata.id = 0x1234;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    if let Some(payload) = edns {
        let mut e = Edns::new();
        e.set_max_payload(payload);
        m.set_edns(e);
    }
    m
}

async fn ask_msg(proxy: &DnsProxy, q: &Message, protocol: Protocol) -> Message {
    let bytes = proxy.answer(&q.to_vec().unwrap(), protocol).await.unwrap();
    Message::from_vec(&bytes).unwrap()
}

async fn ask(proxy: &DnsProxy, name: &str, rtype: RecordType) -> Message {
    ask_msg(proxy, &query(name, rtype, None), Protocol::Udp).await
}

/// Answers rendered as `owner TYPE rdata`, in message order.
fn rendered(m: &Message) -> Vec<String> {
    m.answers.iter().map(|r| format!("{} {} {}", r.name, r.record_type(), r.data)).collect()
}

/// A mesh with one headless service `big.ns1.svc.cluster.local` of `n` endpoints.
pub(super) fn headless_mesh(n: usize) -> String {
    let mut yaml = String::from("workloads:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "- {{uid: u{i}, name: p{i}, namespace: ns1, workloadIps: [\"10.9.{}.{}\"], \
             services: {{\"ns1/big.ns1.svc.cluster.local\": {{80: 80}}}}}}\n",
            i / 250,
            i % 250 + 1
        ));
    }
    yaml.push_str("services:\n- {name: big, namespace: ns1, hostname: big.ns1.svc.cluster.local}\n");
    yaml
}
