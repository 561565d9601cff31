//! Message-level handling: malformed input, opcodes, EDNS, UDP truncation, resolv.conf.

use std::net::SocketAddr;

use hickory_proto::op::{MessageType, OpCode, ResponseCode};

use super::*;

async fn raw(proxy: &DnsProxy, bytes: &[u8]) -> Option<Message> {
    let out = proxy.answer(bytes, Protocol::Udp).await?;
    Some(Message::from_vec(&out).unwrap())
}

#[tokio::test]
async fn response_messages_get_formerr() {
    let proxy = proxy_with(MESH, config("ns1"), "ns1");
    let mut q = query("productpage.", RecordType::A, None);
    q.metadata.message_type = MessageType::Response;
    let m = raw(&proxy, &q.to_vec().unwrap()).await.unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    assert_eq!(m.metadata.id, 0x1234);
    assert!(m.answers.is_empty());
}

#[tokio::test]
async fn other_opcodes_get_notimp() {
    let proxy = proxy_with(MESH, config("ns1"), "ns1");
    for op in [OpCode::Status, OpCode::Notify, OpCode::Unknown(9)] {
        let mut q = query("productpage.", RecordType::A, None);
        q.metadata.op_code = op;
        let m = raw(&proxy, &q.to_vec().unwrap()).await.unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NotImp, "{op:?}");
        assert_eq!(m.metadata.message_type, MessageType::Response);
    }
}

#[tokio::test]
async fn a_query_count_other_than_one_gets_formerr() {
    let proxy = proxy_with(MESH, config("ns1"), "ns1");
    let mut none = query("productpage.", RecordType::A, None);
    none.queries.clear();
    let m = raw(&proxy, &none.to_vec().unwrap()).await.unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);

    let mut two = query("productpage.", RecordType::A, None);
    two.add_query(Query::query(Name::from_ascii("www.google.com.").unwrap(), RecordType::A));
    let m = raw(&proxy, &two.to_vec().unwrap()).await.unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    assert!(m.answers.is_empty());
}

#[tokio::test]
async fn undecodable_input_gets_no_answer() {
    let proxy = proxy_with(MESH, config("ns1"), "ns1");
    assert!(proxy.answer(b"", Protocol::Udp).await.is_none());
    assert!(proxy.answer(b"\x12\x34\x01", Protocol::Udp).await.is_none());
    // A query header announcing a question that is not there.
    let mut q = query("productpage.", RecordType::A, None).to_vec().unwrap();
    q.truncate(14);
    assert!(proxy.answer(&q, Protocol::Tcp).await.is_none());
}

#[tokio::test]
async fn edns_is_echoed_with_at_least_512() {
    let proxy = proxy_with(MESH, config("ns1"), "ns1");
    for (asked, echoed) in [(100u16, 512u16), (1232, 1232), (4096, 4096)] {
        let m = ask_msg(&proxy, &query("productpage.", RecordType::A, Some(asked)), Protocol::Udp).await;
        let edns = m.edns.as_ref().unwrap();
        assert_eq!(edns.max_payload(), echoed);
        assert_eq!(rendered(&m), vec!["productpage. A 9.9.9.9"]);
    }
    let m = ask(&proxy, "productpage.", RecordType::A).await;
    assert!(m.edns.is_none(), "no EDNS in the query, none in the answer");
}

#[tokio::test]
async fn unknown_edns_version_gets_badvers() {
    let proxy = proxy_with(MESH, config("ns1"), "ns1");
    let mut q = query("productpage.", RecordType::A, Some(1232));
    q.edns.as_mut().unwrap().set_version(1);
    let m = ask_msg(&proxy, &q, Protocol::Udp).await;
    // BADVERS and BADSIG share the value 16; the decoder names it BADSIG.
    assert_eq!(u16::from(m.metadata.response_code), u16::from(ResponseCode::BADVERS));
    assert!(m.answers.is_empty());
}

#[tokio::test]
async fn large_udp_answers_are_truncated_tcp_ones_are_not() {
    let proxy = proxy_with(&headless_mesh(100), config("ns1"), "ns1");
    let q = query("big.ns1.svc.cluster.local.", RecordType::A, None);

    let udp = proxy.answer(&q.to_vec().unwrap(), Protocol::Udp).await.unwrap();
    assert!(udp.len() <= 512);
    let udp = Message::from_vec(&udp).unwrap();
    assert!(udp.metadata.truncation);
    assert!(udp.answers.is_empty());
    assert_eq!(udp.queries.len(), 1);

    let tcp = ask_msg(&proxy, &q, Protocol::Tcp).await;
    assert!(!tcp.metadata.truncation);
    assert_eq!(tcp.answers.len(), 100);

    // A large EDNS payload lets the whole answer through on UDP.
    let q = query("big.ns1.svc.cluster.local.", RecordType::A, Some(4096));
    let udp = ask_msg(&proxy, &q, Protocol::Udp).await;
    assert!(!udp.metadata.truncation);
    assert_eq!(udp.answers.len(), 100);
}

#[tokio::test]
async fn state_changes_are_seen() {
    let st = store("{}");
    let proxy = DnsProxy::new(
        st.clone(),
        Arc::new(config("ns1")),
        client("ns1"),
        Arc::new(LocalSockets),
        DnsMetrics::default(),
    );
    let m = ask(&proxy, "productpage.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    st.publish(State::from_config(LocalConfig::parse(MESH).unwrap(), None).unwrap());
    let m = ask(&proxy, "productpage.", RecordType::A).await;
    assert_eq!(rendered(&m), vec!["productpage. A 9.9.9.9"]);
}

#[test]
fn resolv_conf_parsing() {
    let text = "\
# generated
nameserver 10.96.0.10
nameserver   fd00::53   # trailing comment
nameserver fe80::1%eth0
nameserver not-an-ip
nameserver
domain ignored.example
search ns1.svc.cluster.local svc.cluster.local cluster.local
options ndots:5
garbage line
";
    let cfg = DnsConfig::from_resolv_conf(text, "cluster.local", false);
    let up: Vec<SocketAddr> = vec!["10.96.0.10:53".parse().unwrap(), "[fd00::53]:53".parse().unwrap()];
    assert_eq!(cfg.upstreams, up);
    assert_eq!(cfg.search_domains, vec!["ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"]);
    assert_eq!(cfg.cluster_domain, "cluster.local");
    assert!(!cfg.ipv6_enabled);
    assert_eq!(cfg.preferred_namespace, None);

    // The last of search/domain wins.
    let cfg = DnsConfig::from_resolv_conf("search a.example\ndomain b.example\n", "c.local", true);
    assert_eq!(cfg.search_domains, vec!["b.example"]);
    assert!(cfg.upstreams.is_empty());
    assert_eq!(DnsConfig::from_resolv_conf("", "cluster.local", true).upstreams, vec![]);
}

#[test]
fn pod_search_domains() {
    assert_eq!(
        DnsConfig::pod_search_domains("ns1", "cluster.local."),
        vec!["ns1.svc.cluster.local", "svc.cluster.local", "cluster.local"]
    );
}
