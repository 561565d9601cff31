//! The waypoint's limits in-process: malformed, oversized and slow HTTP/1.1 heads, idle
//! connections, HTTP/2 rapid reset, CONNECTs it cannot serve.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ambit_api::waypoint as api;
use ambit_hbone::TunnelError;
use ambit_identity::FakeCa;
use ambit_waypoint::testing::{Harness, endpoint, service};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::*;

#[tokio::test]
async fn malformed_oversized_and_slow_http1_heads_are_refused() {
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    h.configure(&[named("app-ns/svc", svc)], &[]);

    // A request that closes the connection gets its whole answer before the stream ends.
    let (answer, _) =
        raw(&h, "10.0.0.10:80", b"GET / HTTP/1.1\r\nHost: svc\r\nConnection: close\r\n\r\n", T).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.ends_with("\r\n\r\na"), "{answer}");

    let smuggle =
        b"POST / HTTP/1.1\r\nHost: svc\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let (answer, _) = raw(&h, "10.0.0.10:80", smuggle, T).await;
    assert!(answer.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{answer}");
    assert!(answer.ends_with("Content-Length and Transfer-Encoding in one request"), "{answer}");

    let big = format!("GET / HTTP/1.1\r\nHost: svc\r\nx-big: {}\r\n\r\n", "a".repeat(70 * 1024));
    let (answer, _) = raw(&h, "10.0.0.10:80", big.as_bytes(), T).await;
    assert!(answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{answer}");

    let many: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let many = format!("GET / HTTP/1.1\r\nHost: svc\r\n{many}\r\n");
    let (answer, _) = raw(&h, "10.0.0.10:80", many.as_bytes(), T).await;
    assert!(answer.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{answer}");

    // Half a head, then nothing: closed at the header read timeout (500 ms here), unanswered.
    let (answer, took) =
        raw(&h, "10.0.0.10:80", b"GET / HTTP/1.1\r\nHost: svc\r\n", Duration::from_secs(5)).await;
    assert!(took >= Duration::from_millis(450) && took < Duration::from_secs(3), "closed after {took:?}");
    assert!(!answer.contains("200 OK"), "{answer}");
    // Only the well-formed request reached the backend.
    assert_eq!(backends[0].requests(), 1);
}

#[tokio::test]
async fn connects_the_waypoint_cannot_serve_are_answered_404_and_400() {
    let ca = Arc::new(FakeCa::generate());
    let (_backends, node) = three_backends(&ca).await;
    let h = Harness::start(ca.clone(), Harness::settings(), node.addr).await;
    h.configure(&[], &[]);
    // No destination at that address.
    match h.connect(sock("10.9.9.9:80")).await {
        Err(TunnelError::Status(s)) => assert_eq!(s, StatusCode::NOT_FOUND),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("CONNECT to an unknown address was accepted"),
    }
    // An `:authority` that is not ip:port (a hand-built HBONE client: ours only sends addresses).
    let tls = ambit_hbone::testing::tls_client(&ca, h.addr, &ambit_waypoint::testing::waypoint_identity())
        .await
        .expect("tls");
    let (send, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    tokio::spawn(conn);
    let mut send = send.ready().await.expect("ready");
    let req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri("svc.example:80")
        .body(())
        .expect("request");
    let (resp, _stream) = send.send_request(req, false).expect("send");
    let resp = tokio::time::timeout(T, resp).await.expect("in time").expect("response");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn an_idle_downstream_connection_is_closed_after_the_idle_timeout() {
    let ca = Arc::new(FakeCa::generate());
    let (_backends, node) = three_backends(&ca).await;
    let mut settings = Harness::settings();
    settings.limits.idle_timeout = Duration::from_millis(300);
    let h = Harness::start(ca, settings, node.addr).await;
    let svc =
        service("svc", Some("10.0.0.10"), &[(80, 8080, api::Protocol::Http)], vec![endpoint("10.1.0.1")]);
    h.configure(&[named("app-ns/svc", svc)], &[]);
    let mut c = h.http1(sock("10.0.0.10:80")).await;
    assert_eq!(send(&mut c, get("/")).await, (StatusCode::OK, "a".into()));
    let t0 = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while !c.is_closed() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "the idle connection stayed open");
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "closed after {took:?}");
}

#[tokio::test]
async fn an_http2_rapid_reset_flood_ends_the_connection_with_enhance_your_calm() {
    use ambit_hbone::testing::wire::{client_preface, frame, literal_block};
    let ca = Arc::new(FakeCa::generate());
    let (backends, node) = three_backends(&ca).await;
    backends[0].delay_ms.store(1000, Ordering::Relaxed);
    let h = Harness::start(ca, Harness::settings(), node.addr).await;
    let svc =
        service("svc", Some("10.0.0.11"), &[(80, 8080, api::Protocol::Http2)], vec![endpoint("10.1.0.1")]);
    h.configure(&[named("app-ns/svc", svc)], &[]);
    // 50 requests each reset at once (CVE-2023-44487), in one write: more than the 20 streams a
    // client may reset before the server accepted them.
    let mut flood = client_preface();
    let block =
        literal_block(&[(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "svc")]);
    for i in 0..50u32 {
        let id = 1 + 2 * i;
        flood.extend(frame(0x1, 0x4 | 0x1, id, &block)); // HEADERS, END_HEADERS | END_STREAM
        flood.extend(frame(0x3, 0, id, &8u32.to_be_bytes())); // RST_STREAM CANCEL
    }
    let mut io = h.connect(sock("10.0.0.11:80")).await.expect("CONNECT");
    io.write_all(&flood).await.expect("write");
    let mut got = Vec::new();
    let _ =
        tokio::time::timeout(T, io.read_to_end(&mut got)).await.expect("the server ended the stream in time");
    // The server's frames: find its GOAWAY and read the error code.
    let mut goaway = None;
    let mut at = 0;
    while at + 9 <= got.len() {
        let len = usize::from(got[at]) << 16 | usize::from(got[at + 1]) << 8 | usize::from(got[at + 2]);
        let (kind, payload) = (got[at + 3], &got[(at + 9).min(got.len())..(at + 9 + len).min(got.len())]);
        if kind == 0x7 && payload.len() >= 8 {
            goaway = Some(u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]));
        }
        at += 9 + len;
    }
    assert_eq!(goaway, Some(0xb), "GOAWAY with ENHANCE_YOUR_CALM (0xb)");
    assert_eq!(backends[0].requests(), 0);
}
