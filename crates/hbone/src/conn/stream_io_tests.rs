//! [`StreamIo`] over real HBONE on loopback: bytes both ways, half-close, a peer's reset as a
//! [`crate::GONE`] error, and a transfer many times the windows.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ambit_identity::FakeCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::H2Settings;
use crate::server::{ConnectRequest, ServerConfig, serve};
use crate::testing::{TestBudget, TestDrain, pool_to, server_identity, settings};

const T: Duration = Duration::from_secs(20);

/// An HBONE server on loopback that hands every CONNECT to `handler`.
pub(super) async fn server<F, Fut>(ca: &FakeCa, settings: H2Settings, handler: F) -> SocketAddr
where
    F: Fn(ConnectRequest) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let cert = ca.issue(&server_identity(), Duration::from_secs(3600)).expect("issue");
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let (config, handler) = (cert.server_config(), handler.clone());
            tokio::spawn(async move {
                let Ok(tls) = tls::accept(&tcp, config).await else { return };
                let budget = TestBudget::unlimited(settings);
                let _ = serve(tcp, tls, ServerConfig::new(settings), budget, &TestDrain::default(), handler)
                    .await;
            });
        }
    });
    addr
}

/// Answers 200 and echoes through [`StreamIo`] until the client's END_STREAM, then ends.
pub(super) async fn echo(req: ConnectRequest) {
    if req.stream.respond(200, &HeaderMap::new(), false).is_err() {
        return;
    }
    let (mut r, mut w) = tokio::io::split(req.stream.into_io());
    let _ = tokio::io::copy(&mut r, &mut w).await;
    let _ = w.shutdown().await;
}

/// A client stream to `addr` as [`StreamIo`].
async fn open(ca: Arc<FakeCa>, addr: SocketAddr, settings: H2Settings) -> StreamIo {
    let (pool, key) = pool_to(ca, addr, &server_identity(), settings);
    let authority: SocketAddr = "10.0.0.2:8080".parse().expect("addr");
    let tunnel = pool.connect(&key, authority, &HeaderMap::new()).await.expect("connect");
    tunnel.into_io()
}

#[tokio::test]
async fn bytes_echo_both_ways_and_a_half_close_is_the_peers_eof() {
    let ca = Arc::new(FakeCa::generate());
    let addr = server(&ca, settings(), echo).await;
    let mut io = open(ca, addr, settings()).await;
    io.write_all(b"hello ").await.expect("write");
    let mut got = [0u8; 6];
    io.read_exact(&mut got).await.expect("first echo");
    assert_eq!(&got, b"hello ");
    io.write_all(b"world").await.expect("write");
    // Our END_STREAM: the server's copy ends, it ends its side, and we read to the end.
    io.shutdown().await.expect("shutdown");
    let mut rest = Vec::new();
    tokio::time::timeout(T, io.read_to_end(&mut rest)).await.expect("in time").expect("read to end");
    assert_eq!(rest, b"world");
    // After our END_STREAM, writing fails.
    let e = io.write_all(b"late").await.expect_err("write after shutdown");
    assert_eq!(e.kind(), crate::GONE);
}

#[tokio::test]
async fn the_server_still_answers_after_the_clients_half_close() {
    let ca = Arc::new(FakeCa::generate());
    let addr = server(&ca, settings(), |req: ConnectRequest| async move {
        if req.stream.respond(200, &HeaderMap::new(), false).is_err() {
            return;
        }
        let mut io = req.stream.into_io();
        let mut all = Vec::new();
        if io.read_to_end(&mut all).await.is_err() {
            return;
        }
        let answer = format!("read {} bytes", all.len());
        let _ = io.write_all(answer.as_bytes()).await;
        let _ = io.shutdown().await;
    })
    .await;
    let mut io = open(ca, addr, settings()).await;
    io.write_all(&[7u8; 1000]).await.expect("write");
    io.shutdown().await.expect("shutdown");
    let mut answer = String::new();
    tokio::time::timeout(T, io.read_to_string(&mut answer)).await.expect("in time").expect("read");
    assert_eq!(answer, "read 1000 bytes");
}

#[tokio::test]
async fn a_peer_reset_reads_and_writes_as_gone() {
    let ca = Arc::new(FakeCa::generate());
    let addr = server(&ca, settings(), |req: ConnectRequest| async move {
        if req.stream.respond(200, &HeaderMap::new(), false).is_err() {
            return;
        }
        let mut buf = [0u8; 4];
        let mut io = req.stream.into_io();
        if io.read_exact(&mut buf).await.is_ok() {
            io.handle().reset(Reason::CANCEL);
        }
        // Keep the connection up while the client looks.
        tokio::time::sleep(T).await;
    })
    .await;
    let mut io = open(ca, addr, settings()).await;
    io.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 16];
    let e = tokio::time::timeout(T, io.read(&mut buf)).await.expect("in time").expect_err("read after reset");
    assert_eq!(e.kind(), crate::GONE);
    assert_eq!(e.to_string(), "the HBONE stream was reset by the peer: CANCEL");
    let e = io.write_all(b"more").await.expect_err("write after reset");
    assert_eq!(e.kind(), crate::GONE);
}

#[tokio::test]
async fn a_transfer_many_times_the_windows_goes_through_flow_control_intact() {
    // 64 KiB windows, 8 MiB each way: the transfer only finishes if both sides give the
    // window back as the reader takes the bytes.
    let small = H2Settings {
        window_size: 65_535,
        connection_window_size: 65_535,
        frame_size: 16_384,
        max_streams: 10,
    };
    let ca = Arc::new(FakeCa::generate());
    let addr = server(&ca, small, echo).await;
    let io = open(ca, addr, small).await;
    let (mut r, mut w) = tokio::io::split(io);
    let payload: Vec<u8> = (0..8usize << 20).map(|i| (i % 251) as u8).collect();
    let sent = payload.clone();
    let writer = tokio::spawn(async move {
        for part in sent.chunks(100_000) {
            w.write_all(part).await.expect("write");
        }
        w.shutdown().await.expect("shutdown");
    });
    let mut got = Vec::with_capacity(payload.len());
    tokio::time::timeout(T, r.read_to_end(&mut got)).await.expect("in time").expect("read");
    writer.await.expect("writer");
    assert_eq!(got.len(), payload.len());
    assert!(got == payload, "the bytes came back changed");
}

#[tokio::test]
async fn a_complete_answer_before_the_clients_end_is_read_whole_despite_the_no_error_reset() {
    // The server answers, ends its side and drops the stream while the client's side is open:
    // RST_STREAM(NO_ERROR) follows its END_STREAM (RFC 9113 §8.1). The client must still read
    // the whole answer, then the end.
    let ca = Arc::new(FakeCa::generate());
    let addr = server(&ca, settings(), |req: ConnectRequest| async move {
        if req.stream.respond(200, &HeaderMap::new(), false).is_err() {
            return;
        }
        let mut io = req.stream.into_io();
        let _ = io.write_all(b"the whole answer").await;
        let _ = io.shutdown().await;
    })
    .await;
    let mut io = open(ca, addr, settings()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut answer = String::new();
    tokio::time::timeout(T, io.read_to_string(&mut answer)).await.expect("in time").expect("read");
    assert_eq!(answer, "the whole answer");
}
