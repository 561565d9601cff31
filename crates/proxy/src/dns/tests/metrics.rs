//! `istio_dns_*`: what the DNS proxy counts for local answers, forwarded queries and upstream
//! failures, with Istio's DnsLabels.

use hickory_proto::op::ResponseCode;
use prometheus_client::registry::Registry;

use super::forward::{dead_addr, upstream, with_upstreams};
use super::*;

const CLIENT_MESH: &str = r#"
workloads:
- uid: cluster1//v1/Pod/ns1/client
  name: client
  namespace: ns1
  serviceAccount: sa1
  canonicalName: frontend
  canonicalRevision: v2
  workloadIps: ["10.0.0.9"]
services:
- {name: productpage, namespace: ns1, hostname: productpage.ns1.svc.cluster.local, vips: ["/9.9.9.9"]}
"#;

fn scrape(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
    out
}

/// The samples of `family` (`name{labels} value`), sorted.
fn samples(text: &str, family: &str) -> Vec<String> {
    let mut v: Vec<String> =
        text.lines().filter(|l| l.starts_with(&format!("{family}{{"))).map(str::to_owned).collect();
    v.sort();
    v
}

fn labels(qtype: &str, protocol: &str, service: &str, revision: &str) -> String {
    format!(
        "request_query_type=\"{qtype}\",request_protocol=\"{protocol}\",source_canonical_service=\"{service}\",source_canonical_revision=\"{revision}\""
    )
}

#[tokio::test]
async fn queries_and_upstream_exchanges_are_counted_with_dns_labels() {
    let up = upstream().await;
    let mut registry = Registry::default();
    let metrics = crate::metrics::Metrics::register(&mut registry);
    let pod = DnsClient {
        namespace: "ns1".into(),
        network: String::new(),
        workload: Some(ambit_zds::WorkloadInfo {
            name: "client".into(),
            namespace: "ns1".into(),
            service_account: "sa1".into(),
        }),
    };
    let proxy = DnsProxy::new(
        store(CLIENT_MESH),
        Arc::new(with_upstreams(vec![up.addr])),
        pod,
        Arc::new(LocalSockets),
        metrics.dns().clone(),
    );
    // Answered from the mesh: counted as a request, not upstream.
    let m = ask(&proxy, "productpage.ns1.svc.cluster.local.", RecordType::A).await;
    assert_eq!(rendered(&m), vec!["productpage.ns1.svc.cluster.local. A 9.9.9.9"]);
    // Forwarded, answered.
    let m = ask(&proxy, "nothing.example.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    let m = ask_msg(&proxy, &query("nothing.example.", RecordType::TXT, None), Protocol::Tcp).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);

    // A second pod, unknown to the mesh state, whose upstream is down.
    let dead = dead_addr().await;
    let unknown = DnsProxy::new(
        store(CLIENT_MESH),
        Arc::new(with_upstreams(vec![dead])),
        client("ns1"),
        Arc::new(LocalSockets),
        metrics.dns().clone(),
    );
    let m = ask(&unknown, "down.example.", RecordType::AAAA).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);

    let text = scrape(&registry);
    let (a_udp, txt_tcp) = (labels("a", "udp", "frontend", "v2"), labels("txt", "tcp", "frontend", "v2"));
    let failed = labels("aaaa", "udp", "unknown", "unknown");
    assert_eq!(
        samples(&text, "istio_dns_requests_total"),
        vec![
            format!("istio_dns_requests_total{{{a_udp}}} 2"),
            format!("istio_dns_requests_total{{{failed}}} 1"),
            format!("istio_dns_requests_total{{{txt_tcp}}} 1"),
        ],
        "{text}"
    );
    assert_eq!(
        samples(&text, "istio_dns_upstream_requests_total"),
        vec![
            format!("istio_dns_upstream_requests_total{{{a_udp}}} 1"),
            format!("istio_dns_upstream_requests_total{{{failed}}} 1"),
            format!("istio_dns_upstream_requests_total{{{txt_tcp}}} 1"),
        ],
        "{text}"
    );
    assert_eq!(
        samples(&text, "istio_dns_upstream_failures_total"),
        vec![format!("istio_dns_upstream_failures_total{{{failed}}} 1")],
        "{text}"
    );
    assert_eq!(
        samples(&text, "istio_dns_upstream_request_duration_seconds_count"),
        vec![
            format!("istio_dns_upstream_request_duration_seconds_count{{{a_udp}}} 1"),
            format!("istio_dns_upstream_request_duration_seconds_count{{{failed}}} 1"),
            format!("istio_dns_upstream_request_duration_seconds_count{{{txt_tcp}}} 1"),
        ],
        "{text}"
    );
    let buckets: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("istio_dns_upstream_request_duration_seconds_bucket{") && l.contains(&a_udp)
        })
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(buckets, ["0.0005", "0.001", "0.01", "0.1", "1.0", "5.0", "+Inf"], "{text}");
    for family in [
        "istio_dns_requests",
        "istio_dns_upstream_requests",
        "istio_dns_upstream_failures",
        "istio_dns_upstream_request_duration_seconds",
    ] {
        let help = text.lines().find(|l| l.starts_with(&format!("# HELP {family} "))).unwrap_or_default();
        assert!(help.contains("(unstable)"), "{family}: {help:?}");
    }
}

#[tokio::test]
async fn malformed_input_is_not_counted_as_a_query() {
    let mut registry = Registry::default();
    let metrics = crate::metrics::Metrics::register(&mut registry);
    let proxy = DnsProxy::new(
        store(CLIENT_MESH),
        Arc::new(config("ns1")),
        client("ns1"),
        Arc::new(LocalSockets),
        metrics.dns().clone(),
    );
    assert_eq!(proxy.answer(b"\x12", Protocol::Udp).await, None);
    assert!(samples(&scrape(&registry), "istio_dns_requests_total").is_empty());
}
