//! Smoke tests of the network-namespace e2e harness itself (no proxy involved).

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::time::Duration;

use common::{
    Cluster, INBOUND_HBONE_PORT, INBOUND_PLAINTEXT_PORT, OUTBOUND_PORT, PROXY_MARK, accept_timeout, contains,
    echo_roundtrip, original_dst, pcap_payloads, require_root,
};

const WAIT: Duration = Duration::from_secs(5);
const VIP4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);

fn any6(port: u16) -> SocketAddr {
    SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port)
}

fn netns_list() -> String {
    let out = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn pods_exchange_data_over_the_bridge_v4_and_v6() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    let b = cluster.add_pod("b");
    let echo = b.echo_server(7000);

    for (target, source) in [(echo.addr4(), IpAddr::V4(a.ip4)), (echo.addr6(), IpAddr::V6(a.ip6))] {
        let mut stream = a.connect_tcp(target).expect("a reaches b through the bridge");
        let reply = echo_roundtrip(&mut stream, b"hello over the bridge").expect("echo reply");
        assert_eq!(reply, b"hello over the bridge");
        assert_eq!(stream.local_addr().expect("local addr").ip(), source);
    }
    assert_eq!(echo.peer_ips(), vec![IpAddr::V4(a.ip4), IpAddr::V6(a.ip6)]);
}

#[test]
fn pods_on_two_nodes_share_one_segment() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let second = cluster.add_node("node2");
    let a = cluster.add_pod("a");
    let b = second.add_pod("b");
    let echo = b.echo_server(7000);
    for target in [echo.addr4(), echo.addr6()] {
        let mut stream = a.connect_tcp(target).expect("a reaches b on the other node");
        assert_eq!(echo_roundtrip(&mut stream, b"x").expect("echo"), b"x");
    }
    assert_eq!(echo.peer_ips(), vec![IpAddr::V4(a.ip4), IpAddr::V6(a.ip6)]);
}

#[test]
fn capture_redirects_outbound_to_15001_with_original_destination() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    let b = cluster.add_pod("b");
    let echo = b.echo_server(8080);
    a.capture();
    let outbound = a.listen_tcp(any6(OUTBOUND_PORT));

    let targets =
        [b.addr4(8080), b.addr6(8080), SocketAddr::new(VIP4.into(), 80), SocketAddr::new(VIP6.into(), 80)];
    for target in targets {
        let mut client = a.connect_tcp(target).expect("captured connect succeeds");
        let (mut accepted, peer) = accept_timeout(&outbound, WAIT)
            .unwrap_or_else(|| panic!("connection to {target} was not redirected to 15001"));
        assert_eq!(original_dst(&accepted).expect("SO_ORIGINAL_DST"), target);
        assert!(peer.ip().is_loopback() || peer.ip() == IpAddr::V4(a.ip4) || peer.ip() == IpAddr::V6(a.ip6));
        client.write_all(b"ping").expect("write");
        let mut buf = [0u8; 4];
        accepted.read_exact(&mut buf).expect("read at 15001");
        assert_eq!(&buf, b"ping");
    }
    assert!(echo.peers().is_empty(), "b must not see captured traffic");
}

#[test]
fn capture_redirects_inbound_to_15006_but_not_hbone_port() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    let b = cluster.add_pod("b");
    a.capture();
    let inbound = a.listen_tcp(any6(INBOUND_PLAINTEXT_PORT));
    let hbone = a.listen_tcp(any6(INBOUND_HBONE_PORT));

    for (target, source) in [(a.addr4(8080), IpAddr::V4(b.ip4)), (a.addr6(8080), IpAddr::V6(b.ip6))] {
        let _client = b.connect_tcp(target).expect("inbound connect succeeds");
        let (accepted, peer) = accept_timeout(&inbound, WAIT)
            .unwrap_or_else(|| panic!("connection to {target} was not redirected to 15006"));
        assert_eq!(peer.ip(), source, "inbound keeps the client's source address");
        assert_eq!(original_dst(&accepted).expect("SO_ORIGINAL_DST"), target);
    }
    for target in [a.addr4(INBOUND_HBONE_PORT), a.addr6(INBOUND_HBONE_PORT)] {
        let _client = b.connect_tcp(target).expect("hbone connect succeeds");
        assert!(accept_timeout(&hbone, WAIT).is_some(), "{target} must reach the 15008 listener directly");
    }
    assert!(accept_timeout(&inbound, Duration::from_millis(100)).is_none());
}

#[test]
fn proxy_marked_socket_is_not_redirected() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    let b = cluster.add_pod("b");
    let echo = b.echo_server(8080);
    a.capture();
    let outbound = a.listen_tcp(any6(OUTBOUND_PORT));

    for target in [echo.addr4(), echo.addr6()] {
        let mut stream =
            a.connect_tcp_marked(target, PROXY_MARK).expect("marked socket connects to b directly");
        assert_eq!(echo_roundtrip(&mut stream, b"marked").expect("echo"), b"marked");
    }
    assert_eq!(echo.peer_ips(), vec![IpAddr::V4(a.ip4), IpAddr::V6(a.ip6)]);
    assert!(accept_timeout(&outbound, Duration::from_millis(100)).is_none());
    // The same connection without the mark is captured, so the bypass above is not vacuous.
    let _unmarked = a.connect_tcp(echo.addr4()).expect("unmarked connect");
    assert!(accept_timeout(&outbound, WAIT).is_some(), "unmarked socket must be redirected");
    assert_eq!(echo.peers().len(), 2);
}

#[test]
fn proxy_style_spoofed_connection_replies_return_through_table_100() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    let b = cluster.add_pod("b");
    let app = a.echo_server(8080);
    // Something listening at b's address proves replies did not leak out to the real b.
    let real_b = b.echo_server(40000);
    a.capture();

    for (source, target) in [(IpAddr::V4(b.ip4), app.addr4()), (IpAddr::V6(b.ip6), app.addr6())] {
        let mut stream = a
            .connect_tcp_spoofed(source, target, PROXY_MARK)
            .unwrap_or_else(|e| panic!("spoofed connect {source} -> {target}: {e}"));
        assert_eq!(echo_roundtrip(&mut stream, b"spoofed").expect("echo"), b"spoofed");
    }
    assert_eq!(app.peer_ips(), vec![IpAddr::V4(b.ip4), IpAddr::V6(b.ip6)]);
    assert!(real_b.peers().is_empty());

    // Without the policy route the app's replies would go to the real b and the handshake fails.
    let del = a.run_cmd("ip", &["-4", "rule", "del", "fwmark", "0x111/0xfff", "lookup", "100"]);
    assert!(del.status.success(), "ip rule del failed: {}", String::from_utf8_lossy(&del.stderr));
    let broken = a.connect_tcp_spoofed(IpAddr::V4(b.ip4), app.addr4(), PROXY_MARK);
    assert!(broken.is_err(), "handshake must fail without the fwmark rule");
}

#[test]
fn capture_redirects_dns_to_15053() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    a.capture();
    let dns = a.run(|| UdpSocket::bind("0.0.0.0:15053")).expect("bind 15053");
    let client = a.run(|| UdpSocket::bind("0.0.0.0:0")).expect("bind client");
    client.send_to(b"query", SocketAddr::new(VIP4.into(), 53)).expect("send dns");
    dns.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut buf = [0u8; 16];
    let (n, from) = dns.recv_from(&mut buf).expect("query redirected to 15053");
    assert_eq!(&buf[..n], b"query");
    assert_eq!(from.port(), client.local_addr().expect("local").port());
}

#[test]
fn nft_capture_redirects_like_iptables() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    let b = cluster.add_pod("b");
    let echo = b.echo_server(8080);
    a.capture_nft();
    let ruleset = a.ruleset("nft");
    assert!(ruleset.contains("table inet istio-ambient-nat"), "{ruleset}");
    let outbound = a.listen_tcp(any6(OUTBOUND_PORT));
    let inbound = a.listen_tcp(any6(INBOUND_PLAINTEXT_PORT));

    for target in [b.addr4(8080), b.addr6(8080)] {
        let _client = a.connect_tcp(target).expect("captured connect");
        let (accepted, _) = accept_timeout(&outbound, WAIT)
            .unwrap_or_else(|| panic!("{target} not redirected to 15001 by nftables"));
        assert_eq!(original_dst(&accepted).expect("original dst"), target);
    }
    for target in [a.addr4(9090), a.addr6(9090)] {
        let _client = b.connect_tcp(target).expect("inbound connect");
        assert!(accept_timeout(&inbound, WAIT).is_some(), "{target} not redirected to 15006");
    }
    let mut marked = a.connect_tcp_marked(echo.addr4(), PROXY_MARK).expect("marked bypass");
    assert_eq!(echo_roundtrip(&mut marked, b"m").expect("echo"), b"m");
}

#[test]
fn uncapture_restores_direct_traffic() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    let b = cluster.add_pod("b");
    let echo = b.echo_server(8080);
    a.capture();
    a.uncapture();
    assert!(!a.ruleset("iptables-save").contains("ISTIO_"));
    let mut stream = a.connect_tcp(echo.addr4()).expect("direct connect");
    assert_eq!(echo_roundtrip(&mut stream, b"direct").expect("echo"), b"direct");
    assert_eq!(echo.peer_ips(), vec![IpAddr::V4(a.ip4)]);
}

#[test]
fn tcpdump_on_the_bridge_sees_plaintext() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    let b = cluster.add_pod("b");
    let echo = b.echo_server(7000);
    let capture = cluster.node().tcpdump(None);
    let marker = b"PLAINTEXT-MARKER-5f3a";
    for target in [echo.addr4(), echo.addr6()] {
        let mut stream = a.connect_tcp(target).expect("connect");
        assert_eq!(echo_roundtrip(&mut stream, marker).expect("echo"), marker);
    }
    let pcap = capture.stop();
    let segments = pcap_payloads(&pcap);
    for (source, target) in [(IpAddr::V4(a.ip4), echo.addr4()), (IpAddr::V6(a.ip6), echo.addr6())] {
        assert!(
            segments
                .iter()
                .any(|(src, dst, data)| src.ip() == source && *dst == target && contains(data, marker)),
            "request {source} -> {target} with the marker not captured: {segments:?}"
        );
        assert!(
            segments
                .iter()
                .any(|(src, dst, data)| *src == target && dst.ip() == source && contains(data, marker)),
            "echo reply {target} -> {source} not captured"
        );
    }
}

#[test]
fn cluster_cleanup_removes_namespaces_even_on_panic() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    cluster.add_pod("a");
    let names = cluster.namespaces();
    assert_eq!(names.len(), 2);
    let listed = netns_list();
    assert!(names.iter().all(|n| listed.contains(n.as_str())));
    drop(cluster);
    let listed = netns_list();
    assert!(names.iter().all(|n| !listed.contains(n.as_str())), "{listed}");

    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::thread::spawn(move || {
        let cluster = Cluster::new();
        let pod = cluster.add_pod("p");
        pod.capture();
        let _sleeper = pod.spawn("sleep", &["60"]);
        tx.send(cluster.namespaces()).expect("send names");
        panic!("deliberate panic to exercise the cleanup guard");
    })
    .join();
    assert!(result.is_err());
    let names = rx.recv().expect("names");
    let listed = netns_list();
    assert!(names.iter().all(|n| !listed.contains(n.as_str())), "{listed}");
}

#[test]
fn pcap_parser_reads_ethernet_ipv4_and_ipv6_segments() {
    let v4 = tcp_frame_v4([10, 1, 2, 3], [10, 1, 2, 4], 40000, 15008, &[0x16, 3, 1, 0, 5]);
    let v6 = tcp_frame_v6(
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 3),
        40001,
        8080,
        b"plain",
    );
    let ack_only = tcp_frame_v4([10, 1, 2, 4], [10, 1, 2, 3], 15008, 40000, b"");
    let mut pcap = pcap_header();
    for frame in [&v4, &ack_only, &v6] {
        pcap.extend_from_slice(&record(frame));
    }
    // A record that claims more bytes than the file holds ends parsing without panicking.
    let mut truncated = record(&v4);
    truncated.truncate(30);
    pcap.extend_from_slice(&truncated);

    let segments = pcap_payloads(&pcap);
    assert_eq!(segments.len(), 2, "{segments:?}");
    assert_eq!(segments[0].0, "10.1.2.3:40000".parse().expect("addr"));
    assert_eq!(segments[0].1, "10.1.2.4:15008".parse().expect("addr"));
    assert_eq!(segments[0].2.first(), Some(&0x16));
    assert_eq!(segments[1].1, "[fd00::3]:8080".parse().expect("addr"));
    assert_eq!(segments[1].2, b"plain");

    assert!(pcap_payloads(&[]).is_empty());
    assert!(pcap_payloads(b"not a pcap file at all, no").is_empty());
    for cut in 0..pcap.len() {
        let _ = pcap_payloads(&pcap[..cut]);
    }
}

#[test]
fn http_get_reads_length_and_chunked_bodies() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let responses: [&[u8]; 2] = [
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nready",
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nnot \r\n5\r\nready\r\n0\r\n\r\n",
        ];
        for response in responses {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut request = [0u8; 1024];
            let n = stream.read(&mut request).expect("read request");
            assert!(request[..n].starts_with(b"GET /healthz/ready HTTP/1.1\r\n"));
            stream.write_all(response).expect("respond");
        }
    });
    assert_eq!(common::http_get(addr, "/healthz/ready").expect("get"), (200, "ready".to_owned()));
    assert_eq!(common::http_get(addr, "/healthz/ready").expect("get"), (503, "not ready".to_owned()));
    server.join().expect("server");
}

fn pcap_header() -> Vec<u8> {
    let mut header = Vec::new();
    header.extend_from_slice(&0xa1b2_c3d4_u32.to_le_bytes());
    header.extend_from_slice(&2u16.to_le_bytes());
    header.extend_from_slice(&4u16.to_le_bytes());
    header.extend_from_slice(&[0; 8]);
    header.extend_from_slice(&262_144u32.to_le_bytes());
    header.extend_from_slice(&1u32.to_le_bytes());
    header
}

fn record(frame: &[u8]) -> Vec<u8> {
    let len = u32::try_from(frame.len()).expect("small frame");
    let mut rec = Vec::new();
    rec.extend_from_slice(&[0; 8]);
    rec.extend_from_slice(&len.to_le_bytes());
    rec.extend_from_slice(&len.to_le_bytes());
    rec.extend_from_slice(frame);
    rec
}

fn tcp_header(src_port: u16, dst_port: u16) -> Vec<u8> {
    let mut tcp = Vec::new();
    tcp.extend_from_slice(&src_port.to_be_bytes());
    tcp.extend_from_slice(&dst_port.to_be_bytes());
    tcp.extend_from_slice(&[0; 8]);
    tcp.push(5 << 4);
    tcp.extend_from_slice(&[0x18, 0, 0, 0, 0, 0, 0]);
    tcp
}

fn ethernet(ethertype: u16) -> Vec<u8> {
    let mut frame = vec![0u8; 12];
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame
}

fn tcp_frame_v4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, data: &[u8]) -> Vec<u8> {
    let mut frame = ethernet(0x0800);
    let total = u16::try_from(20 + 20 + data.len()).expect("small");
    frame.extend_from_slice(&[0x45, 0]);
    frame.extend_from_slice(&total.to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
    frame.extend_from_slice(&src);
    frame.extend_from_slice(&dst);
    frame.extend_from_slice(&tcp_header(sport, dport));
    frame.extend_from_slice(data);
    // Ethernet minimum-size padding must not be read as payload.
    frame.resize(frame.len().max(60), 0);
    frame
}

fn tcp_frame_v6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, data: &[u8]) -> Vec<u8> {
    let mut frame = ethernet(0x86dd);
    let len = u16::try_from(20 + data.len()).expect("small");
    frame.extend_from_slice(&[0x60, 0, 0, 0]);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&[6, 64]);
    frame.extend_from_slice(&src.octets());
    frame.extend_from_slice(&dst.octets());
    frame.extend_from_slice(&tcp_header(sport, dport));
    frame.extend_from_slice(data);
    frame
}

#[test]
fn pod_processes_and_http_get_run_inside_the_pod() {
    if !require_root() {
        return;
    }
    let cluster = Cluster::new();
    let a = cluster.add_pod("a");
    a.capture();

    // A process started with `pod.spawn` sees the pod's interfaces.
    let mut shell = a.spawn("ip", &["-brief", "addr", "show", "dev", "eth0"]);
    let status = shell.wait_timeout(WAIT).expect("ip exits");
    assert!(status.success());
    let ip4 = a.ip4.to_string();
    assert!(common::wait_for(|| shell.logs().contains(&ip4), WAIT));
    let mut sleeper = a.spawn("sleep", &["60"]);
    assert!(sleeper.try_wait().is_none());
    let status = sleeper.stop(WAIT);
    assert!(!status.success(), "sleep was terminated by SIGTERM");

    // Loopback admin-style endpoints are reachable from the test even with capture applied.
    let listener = a.listen_tcp("127.0.0.1:15000".parse().expect("addr"));
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut request = [0u8; 1024];
        let _ = stream.read(&mut request).expect("read");
        stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").expect("respond");
    });
    let response = a.http_get("127.0.0.1:15000".parse().expect("addr"), "/ready");
    assert_eq!(response.expect("http get in pod"), (200, "ok".to_owned()));
    server.join().expect("server");
}
