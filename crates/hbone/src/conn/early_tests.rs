//! A client's first bytes go with its CONNECT, before the response: the server holds them for
//! the stream until it answers, a denial discards them and gives their window back, and a 200
//! relays them once, in order, ahead of what follows.

use std::sync::Arc;
use std::time::Duration;

use ambit_identity::FakeCa;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::stream_io_tests::{echo, server};
use super::*;
use crate::H2Settings;
use crate::pool::TunnelError;
use crate::testing::{pool_to, server_identity, settings};

const T: Duration = Duration::from_secs(20);

#[tokio::test]
async fn early_bytes_reach_the_server_before_it_answers_and_are_relayed_once() {
    let ca = Arc::new(FakeCa::generate());
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let addr = server(&ca, settings(), move |req| {
        let seen = seen_tx.clone();
        async move {
            // Before any answer: what the client sent with its request head.
            let before = tokio::time::timeout(Duration::from_secs(5), req.stream.recv()).await;
            let _ = seen.send(format!("{before:?}"));
            if req.stream.respond(200, &HeaderMap::new(), false).is_err() {
                return;
            }
            let (mut r, mut w) = tokio::io::split(req.stream.into_io());
            if let Ok(Some(Ok(b))) = before {
                let _ = w.write_all(&b).await;
            }
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        }
    })
    .await;
    let (pool, key) = pool_to(ca, addr, &server_identity(), settings());
    let authority = "10.0.0.2:8080".parse().expect("addr");
    let tunnel = tokio::time::timeout(T, pool.connect_early(&key, authority, &HeaderMap::new(), b"GET / "))
        .await
        .expect("connected in time")
        .expect("connect");
    assert_eq!(seen_rx.recv().await.expect("the handler's view"), r#"Ok(Some(Ok(b"GET / ")))"#);
    let mut io = tunnel.into_io();
    io.write_all(b"HTTP/1.1").await.expect("write");
    io.shutdown().await.expect("shutdown");
    let mut got = Vec::new();
    tokio::time::timeout(T, io.read_to_end(&mut got)).await.expect("echo in time").expect("read");
    assert_eq!(got, b"GET / HTTP/1.1", "the early bytes once, ahead of the rest");
}

#[tokio::test]
async fn denied_streams_discard_their_early_bytes_and_give_the_connection_window_back() {
    // One default-sized connection window (64 KiB): four denied 16 KiB payloads would hold all
    // of it if a denial kept what it had not relayed.
    let small = H2Settings { window_size: 65_535, connection_window_size: 65_535, ..settings() };
    let ca = Arc::new(FakeCa::generate());
    let addr = server(&ca, small, |req| async move {
        if req.head.headers.get("x-deny").is_some() {
            req.reject(StatusCode::FORBIDDEN);
        } else {
            echo(req).await;
        }
    })
    .await;
    let (pool, key) = pool_to(ca, addr, &server_identity(), small);
    let authority = "10.0.0.2:8080".parse().expect("addr");
    let mut deny = HeaderMap::new();
    deny.insert("x-deny", http::HeaderValue::from_static("1"));
    let payload = vec![7u8; 16 * 1024];
    for i in 0..12 {
        let r = tokio::time::timeout(T, pool.connect_early(&key, authority, &deny, &payload))
            .await
            .unwrap_or_else(|_| panic!("denial {i} in time"));
        match r {
            Err(TunnelError::Status(s)) => assert_eq!(s, StatusCode::FORBIDDEN),
            Err(e) => panic!("denial {i}: {e}"),
            Ok(_) => panic!("denial {i}: a tunnel"),
        }
    }
    assert_eq!(pool.connections(), 1, "the denials were answered on one connection");
    let tunnel = tokio::time::timeout(T, pool.connect_early(&key, authority, &HeaderMap::new(), &payload))
        .await
        .expect("a stream after the denials in time")
        .expect("connect");
    let mut io = tunnel.into_io();
    io.shutdown().await.expect("shutdown");
    let mut got = Vec::new();
    tokio::time::timeout(T, io.read_to_end(&mut got)).await.expect("echo in time").expect("read");
    assert_eq!(got, payload);
}

#[tokio::test]
async fn a_complete_answer_with_a_request_to_stop_sending_reaches_the_app_before_the_relay_ends() {
    // The answer, END_STREAM and RST_STREAM(NO_ERROR) (RFC 9113 §8.1) all came back before the
    // relay began, as they do when a server answers the early bytes at once (a 400 to a
    // smuggled request): the relay writes the answer and the FIN, and ends without error.
    let ca = Arc::new(FakeCa::generate());
    let addr = server(&ca, settings(), |req| async move {
        if req.stream.respond(200, &HeaderMap::new(), false).is_ok()
            && req.stream.send(b"answer").await.is_ok()
        {
            let _ = req.stream.finish();
        }
        // Dropped with the client's side still open: RST_STREAM(NO_ERROR).
    })
    .await;
    let (pool, key) = pool_to(ca, addr, &server_identity(), settings());
    let authority = "10.0.0.2:8080".parse().expect("addr");
    let tunnel = pool.connect_early(&key, authority, &HeaderMap::new(), b"GET / ").await.expect("connect");
    let stream = tunnel.stream;
    let stopped = async {
        while !stream.answered_and_stopped() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(T, stopped).await.expect("answer, END_STREAM and the reset in time");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let app = tokio::net::TcpStream::connect(l.local_addr().expect("addr")).await.expect("connect");
    let (mut peer, _) = l.accept().await.expect("accept");
    let counters = Arc::new(crate::testing::Counted::default());
    let relay = tokio::time::timeout(T, stream.relay(app, counters)).await.expect("the relay ends in time");
    assert!(relay.is_ok(), "the relay failed: {relay:?}");
    let mut got = Vec::new();
    let read = tokio::time::timeout(T, peer.read_to_end(&mut got)).await.expect("read in time");
    assert!(read.is_ok(), "the app was reset: {read:?}");
    assert_eq!(got, b"answer");
}
