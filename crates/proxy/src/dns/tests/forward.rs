//! Forwarding to a fake upstream on 127.0.0.1, upstream failures, and the UDP/TCP serving
//! loops end to end.

use std::net::Ipv4Addr;
use std::sync::Mutex;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::A as ARecord;
use hickory_proto::rr::{RData, Record};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::dns::serve::TCP_REQUEST_TIMEOUT;

/// The canned upstream answer.
const UPSTREAM_IP: Ipv4Addr = Ipv4Addr::new(1, 2, 3, 4);

/// What the fake upstream saw: (transport, message id) per query.
type Seen = Arc<Mutex<Vec<(Protocol, u16)>>>;

/// A fake resolver on one 127.0.0.1 port (UDP and TCP). Answers every query with
/// `A 1.2.3.4`; over UDP, names starting with `big.` get a truncated empty answer instead.
pub(super) struct Upstream {
    pub(super) addr: SocketAddr,
    seen: Seen,
    stop: CancellationToken,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn upstream_reply(query: &[u8], truncate: bool) -> Vec<u8> {
    let q = Message::from_vec(query).unwrap();
    let mut r = Message::response(q.metadata.id, q.metadata.op_code);
    r.add_queries(q.queries.iter().cloned());
    if truncate {
        r.metadata.truncation = true;
    } else {
        let name = q.queries[0].name().clone();
        r.add_answer(Record::from_rdata(name, 60, RData::A(ARecord(UPSTREAM_IP))));
    }
    r.to_vec().unwrap()
}

async fn bind_pair() -> (UdpSocket, TcpListener) {
    for _ in 0..50 {
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = udp.local_addr().unwrap().port();
        if let Ok(tcp) = TcpListener::bind(("127.0.0.1", port)).await {
            return (udp, tcp);
        }
    }
    panic!("no free UDP+TCP port pair on 127.0.0.1");
}

pub(super) async fn upstream() -> Upstream {
    let (udp, tcp) = bind_pair().await;
    let addr = udp.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let stop = CancellationToken::new();
    let (s, st) = (seen.clone(), stop.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65535];
        loop {
            let (n, peer) = tokio::select! {
                _ = st.cancelled() => return,
                r = udp.recv_from(&mut buf) => r.unwrap(),
            };
            let q = Message::from_vec(&buf[..n]).unwrap();
            s.lock().unwrap().push((Protocol::Udp, q.metadata.id));
            let big = q.queries[0].name().to_ascii().starts_with("big.");
            udp.send_to(&upstream_reply(&buf[..n], big), peer).await.unwrap();
        }
    });
    let (s, st) = (seen.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = tokio::select! {
                _ = st.cancelled() => return,
                r = tcp.accept() => r.unwrap(),
            };
            let s = s.clone();
            tokio::spawn(async move {
                while let Ok(len) = conn.read_u16().await {
                    let mut buf = vec![0u8; usize::from(len)];
                    conn.read_exact(&mut buf).await.unwrap();
                    let q = Message::from_vec(&buf).unwrap();
                    s.lock().unwrap().push((Protocol::Tcp, q.metadata.id));
                    let r = upstream_reply(&buf, false);
                    conn.write_u16(r.len() as u16).await.unwrap();
                    conn.write_all(&r).await.unwrap();
                }
            });
        }
    });
    Upstream { addr, seen, stop }
}

pub(super) fn with_upstreams(upstreams: Vec<SocketAddr>) -> DnsConfig {
    DnsConfig { upstreams, ..config("ns1") }
}

/// An address where nothing listens (UDP gets ICMP port unreachable, TCP a reset).
pub(super) async fn dead_addr() -> SocketAddr {
    let (udp, tcp) = bind_pair().await;
    let addr = udp.local_addr().unwrap();
    drop((udp, tcp));
    addr
}

fn seen(u: &Upstream) -> Vec<(Protocol, u16)> {
    u.seen.lock().unwrap().clone()
}

#[tokio::test]
async fn non_mesh_names_are_forwarded_over_udp() {
    let up = upstream().await;
    let proxy = proxy_with(MESH, with_upstreams(vec![up.addr]), "ns1");
    let m = ask(&proxy, "nothing.example.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(m.metadata.id, 0x1234, "the client's id is restored");
    assert!(!m.metadata.authoritative);
    assert_eq!(rendered(&m), vec!["nothing.example. A 1.2.3.4"]);
    let seen = seen(&up);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, Protocol::Udp);
}

#[tokio::test]
async fn other_types_for_mesh_names_are_forwarded() {
    let up = upstream().await;
    let proxy = proxy_with(MESH, with_upstreams(vec![up.addr]), "ns1");
    let m = ask(&proxy, "productpage.ns1.svc.cluster.local.", RecordType::TXT).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(seen(&up).len(), 1);
    // Mesh A queries never reach the upstream.
    ask(&proxy, "productpage.ns1.svc.cluster.local.", RecordType::A).await;
    assert_eq!(seen(&up).len(), 1);
}

#[tokio::test]
async fn tcp_queries_are_forwarded_over_tcp() {
    let up = upstream().await;
    let proxy = proxy_with(MESH, with_upstreams(vec![up.addr]), "ns1");
    let m = ask_msg(&proxy, &query("nothing.example.", RecordType::A, None), Protocol::Tcp).await;
    assert_eq!(rendered(&m), vec!["nothing.example. A 1.2.3.4"]);
    let seen = seen(&up);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, Protocol::Tcp);
}

#[tokio::test]
async fn truncated_udp_answers_are_retried_over_tcp() {
    let up = upstream().await;
    let proxy = proxy_with(MESH, with_upstreams(vec![up.addr]), "ns1");
    let m = ask(&proxy, "big.example.", RecordType::A).await;
    assert!(!m.metadata.truncation);
    assert_eq!(rendered(&m), vec!["big.example. A 1.2.3.4"]);
    let transports: Vec<Protocol> = seen(&up).into_iter().map(|(p, _)| p).collect();
    assert_eq!(transports, vec![Protocol::Udp, Protocol::Tcp]);
}

#[tokio::test]
async fn the_next_upstream_is_tried() {
    let up = upstream().await;
    let dead = dead_addr().await;
    let proxy = proxy_with(MESH, with_upstreams(vec![dead, up.addr]), "ns1");
    for protocol in [Protocol::Udp, Protocol::Tcp] {
        let m = ask_msg(&proxy, &query("nothing.example.", RecordType::A, None), protocol).await;
        assert_eq!(rendered(&m), vec!["nothing.example. A 1.2.3.4"], "{protocol}");
    }
}

#[tokio::test]
async fn servfail_when_the_upstream_is_down() {
    let dead = dead_addr().await;
    let proxy = proxy_with(MESH, with_upstreams(vec![dead]), "ns1");
    for protocol in [Protocol::Udp, Protocol::Tcp] {
        let q = query("nothing.example.", RecordType::A, Some(1232));
        let m = ask_msg(&proxy, &q, protocol).await;
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail, "{protocol}");
        assert_eq!(m.metadata.id, 0x1234);
        assert_eq!(m.queries.len(), 1);
        assert!(m.edns.is_some());
    }
}

#[tokio::test]
async fn servfail_when_the_upstream_is_silent() {
    // Receives but never answers, on both transports.
    let (udp, tcp) = bind_pair().await;
    let addr = udp.local_addr().unwrap();
    let proxy = proxy_with_timeout(with_upstreams(vec![addr]), Duration::from_millis(200));
    let started = std::time::Instant::now();
    for protocol in [Protocol::Udp, Protocol::Tcp] {
        let m = ask_msg(&proxy, &query("nothing.example.", RecordType::A, None), protocol).await;
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail, "{protocol}");
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    drop((udp, tcp));
}

#[tokio::test]
async fn udp_loop_end_to_end() {
    let up = upstream().await;
    let proxy = proxy_with(MESH, with_upstreams(vec![up.addr]), "ns1");
    let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(proxy.serve_udp(server, stop.clone()));

    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.connect(addr).await.unwrap();
    let mut buf = vec![0u8; 4096];
    for (name, want) in [
        ("productpage.ns1.svc.cluster.local.", "productpage.ns1.svc.cluster.local. A 9.9.9.9"),
        ("nothing.example.", "nothing.example. A 1.2.3.4"),
    ] {
        let q = query(name, RecordType::A, None);
        client.send(&q.to_vec().unwrap()).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf)).await.unwrap().unwrap();
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(m.metadata.id, 0x1234);
        assert_eq!(rendered(&m), vec![want]);
    }
    // Garbage gets no reply, and the loop keeps serving.
    client.send(b"garbage").await.unwrap();
    client.send(&query("productpage.", RecordType::A, None).to_vec().unwrap()).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf)).await.unwrap().unwrap();
    assert_eq!(rendered(&Message::from_vec(&buf[..n]).unwrap()), vec!["productpage. A 9.9.9.9"]);

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}

async fn tcp_exchange(conn: &mut TcpStream, q: &[u8]) -> Message {
    conn.write_u16(q.len() as u16).await.unwrap();
    conn.write_all(q).await.unwrap();
    let len = conn.read_u16().await.unwrap();
    let mut buf = vec![0u8; usize::from(len)];
    conn.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

#[tokio::test]
async fn tcp_loop_end_to_end() {
    let up = upstream().await;
    let proxy = proxy_with(MESH, with_upstreams(vec![up.addr]), "ns1");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(proxy.serve_tcp(listener, stop.clone()));

    // Several queries on one connection.
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let m = tcp_exchange(&mut conn, &query("productpage.", RecordType::A, None).to_vec().unwrap()).await;
    assert_eq!(rendered(&m), vec!["productpage. A 9.9.9.9"]);
    let m = tcp_exchange(&mut conn, &query("nothing.example.", RecordType::A, None).to_vec().unwrap()).await;
    assert_eq!(rendered(&m), vec!["nothing.example. A 1.2.3.4"]);
    assert_eq!(seen(&up)[0].0, Protocol::Tcp);

    // Garbage closes the connection.
    conn.write_all(b"\x00\x07garbage").await.unwrap();
    let mut rest = Vec::new();
    let n =
        tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0);

    // Stopping closes open connections and ends the loop.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    let n =
        tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0);
}

#[tokio::test(start_paused = true)]
async fn idle_tcp_connections_time_out() {
    let proxy = proxy_with(MESH, config("ns1"), "ns1");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(proxy.serve_tcp(listener, stop.clone()));
    let mut conn = TcpStream::connect(addr).await.unwrap();
    // Half a length prefix, then silence.
    conn.write_all(b"\x00").await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(TCP_REQUEST_TIMEOUT * 2, conn.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    stop.cancel();
}
