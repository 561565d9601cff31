//! A hostile client against the server side: each way of breaking the protocol ends the
//! connection with a GOAWAY carrying its exact error code, floods are cut with
//! ENHANCE_YOUR_CALM, and a stream-level fault resets only its stream.

use std::net::SocketAddr;
use std::time::Duration;

use ambit_identity::{FakeCa, Identity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::testing::tls_client;

const T: Duration = Duration::from_secs(20);

pub(super) fn cfg() -> Config {
    Config {
        stream_window: 1 << 20,
        connection_window: frame::DEFAULT_WINDOW,
        max_frame_size: frame::DEFAULT_MAX_FRAME,
        max_concurrent_streams: None,
        max_header_list_size: 16 * 1024,
        keepalive: None,
    }
}

/// A server that holds every stream until the peer resets it; its result is sent on the
/// channel.
async fn server(
    ca: &FakeCa,
) -> (SocketAddr, Identity, tokio::sync::oneshot::Receiver<Result<(), ConnError>>) {
    let identity = Identity::new("cluster.local", "default", "server");
    let cert = ca.issue(&identity, Duration::from_secs(3600)).expect("issue");
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let Ok((tcp, _)) = l.accept().await else { return };
        let est = tls::accept(&tcp, cert.server_config()).await.expect("handshake");
        let mut server = super::server(tcp, est, cfg()).expect("server");
        let r = loop {
            match server.accept().await {
                Some(Ok(i)) => {
                    tokio::spawn(async move {
                        let _ = std::future::poll_fn(|cx| i.stream.poll_gone(cx)).await;
                    });
                }
                Some(Err(e)) => break Err(e),
                None => break Ok(()),
            }
        };
        let _ = tx.send(r);
    });
    (addr, identity, rx)
}

fn raw(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; frame::HEADER_LEN];
    Head { len: payload.len() as u32, kind, flags, stream }.encode(&mut v);
    v.extend_from_slice(payload);
    v
}

fn preface() -> Vec<u8> {
    let mut v = frame::PREFACE.to_vec();
    frame::settings(&mut v, &[]);
    v
}

/// A CONNECT header block (our encoder).
fn connect_block() -> Vec<u8> {
    let mut b = Vec::new();
    hpack::Encoder::default().connect(&mut b, "10.0.0.2:8080", &HeaderMap::new());
    b
}

/// Sends `bytes` after the TLS handshake, reading the server's frames meanwhile; returns the
/// GOAWAY the server sent (its last stream id and code), the RST_STREAM codes before it, and how
/// the server's side ended.
async fn provoke(bytes: Vec<u8>) -> (Option<(u32, Reason)>, Vec<(u32, Reason)>, Result<(), ConnError>) {
    let ca = FakeCa::generate();
    let (addr, identity, result) = server(&ca).await;
    let tls = tls_client(&ca, addr, &identity).await.expect("tls");
    let (mut r, mut w) = tokio::io::split(tls);
    let writer = tokio::spawn(async move {
        // The server may close while we write: that is the point.
        for part in bytes.chunks(64 * 1024) {
            if w.write_all(part).await.is_err() {
                return;
            }
        }
        let _ = w.flush().await;
        // Keep the write side open until the server is done.
        tokio::time::sleep(T).await;
    });
    let read = async {
        let mut reader = frame::Reader::new(frame::MAX_MAX_FRAME, 1 << 20);
        let mut goaway = None;
        let mut resets = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut input = &buf[..n];
            while let Some(ev) = reader.next(&mut input) {
                if let Ok(Event::Frame(h, p)) = ev {
                    match h.kind {
                        kind::GOAWAY => {
                            let last = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
                            goaway = Some((last, Reason(u32::from_be_bytes([p[4], p[5], p[6], p[7]]))));
                        }
                        kind::RST_STREAM => {
                            resets.push((h.stream, Reason(u32::from_be_bytes([p[0], p[1], p[2], p[3]]))))
                        }
                        _ => {}
                    }
                }
            }
        }
        (goaway, resets)
    };
    let (goaway, resets) = tokio::time::timeout(T, read).await.expect("the server closed in time");
    writer.abort();
    let result = tokio::time::timeout(T, result).await.expect("server result in time").expect("server ended");
    (goaway, resets, result)
}

fn protocol(reason: Reason, message: &str) -> Result<(), ConnError> {
    Err(ConnError { kind: ConnErrorKind::Protocol(reason), message: message.to_owned() })
}

#[tokio::test]
async fn protocol_violations_end_the_connection_with_their_code() {
    let headers = |id: u32| raw(kind::HEADERS, flag::END_HEADERS, id, &connect_block());
    let mut cases: Vec<(&str, Vec<u8>, Reason, &str)> = Vec::new();
    cases.push((
        "not a preface",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        Reason::PROTOCOL_ERROR,
        "http2 connection error: not an HTTP/2 connection preface (PROTOCOL_ERROR)",
    ));
    let mut v = frame::PREFACE.to_vec();
    frame::ping(&mut v, [0; 8], false);
    cases.push((
        "first frame",
        v,
        Reason::PROTOCOL_ERROR,
        "http2 connection error: the first frame is not SETTINGS (PROTOCOL_ERROR)",
    ));
    let mut v = preface();
    v.extend(raw(kind::DATA, 0, 1, b"x"));
    cases.push((
        "idle DATA",
        v,
        Reason::PROTOCOL_ERROR,
        "http2 connection error: DATA on an idle stream (PROTOCOL_ERROR)",
    ));
    let mut v = preface();
    frame::window_update(&mut v, 0, 0x7fff_ffff);
    cases.push((
        "window overflow",
        v,
        Reason::FLOW_CONTROL_ERROR,
        "http2 connection error: the connection window over 2^31-1 (FLOW_CONTROL_ERROR)",
    ));
    let mut v = preface();
    v.extend(raw(0xee, 0, 0, &vec![0u8; frame::DEFAULT_MAX_FRAME as usize + 1]));
    cases.push((
        "frame size",
        v,
        Reason::FRAME_SIZE_ERROR,
        "http2 connection error: frame larger than SETTINGS_MAX_FRAME_SIZE (FRAME_SIZE_ERROR)",
    ));
    let mut v = preface();
    v.extend(raw(kind::PUSH_PROMISE, flag::END_HEADERS, 1, &[0, 0, 0, 2]));
    cases.push((
        "push",
        v,
        Reason::PROTOCOL_ERROR,
        "http2 connection error: PUSH_PROMISE (push is disabled) (PROTOCOL_ERROR)",
    ));
    let mut v = preface();
    v.extend(raw(kind::HEADERS, flag::END_HEADERS, 1, &[0xff, 0x7f]));
    cases.push((
        "hpack",
        v,
        Reason::COMPRESSION_ERROR,
        "http2 connection error: header block: Header index out of bounds (COMPRESSION_ERROR)",
    ));
    let mut v = preface();
    v.extend(headers(1));
    for _ in 0..5 {
        v.extend(raw(kind::DATA, 0, 1, &[7u8; 16_000]));
    }
    cases.push((
        "connection window",
        v,
        Reason::FLOW_CONTROL_ERROR,
        "http2 connection error: DATA beyond the connection window (FLOW_CONTROL_ERROR)",
    ));
    let mut v = preface();
    v.extend(headers(2));
    cases.push((
        "even id",
        v,
        Reason::PROTOCOL_ERROR,
        "http2 connection error: HEADERS reusing a stream id (PROTOCOL_ERROR)",
    ));
    let mut v = preface();
    v.extend(headers(5));
    v.extend(headers(3));
    cases.push((
        "id goes back",
        v,
        Reason::PROTOCOL_ERROR,
        "http2 connection error: HEADERS reusing a stream id (PROTOCOL_ERROR)",
    ));
    let mut v = preface();
    v.extend(raw(kind::HEADERS, 0, 1, &connect_block()));
    frame::ping(&mut v, [0; 8], false);
    cases.push((
        "inside a block",
        v,
        Reason::PROTOCOL_ERROR,
        "http2 connection error: frame inside a header block (PROTOCOL_ERROR)",
    ));
    let mut v = preface();
    v.extend(raw(kind::SETTINGS, 0, 0, &[0, 4, 0x80, 0, 0, 0]));
    cases.push((
        "settings",
        v,
        Reason::FLOW_CONTROL_ERROR,
        "http2 connection error: invalid SETTINGS (FLOW_CONTROL_ERROR)",
    ));
    for (name, bytes, reason, message) in cases {
        let (goaway, _, result) = provoke(bytes).await;
        assert_eq!(goaway.map(|g| g.1), Some(reason), "{name}: GOAWAY");
        assert_eq!(result, protocol(reason, message), "{name}: the server's error");
    }
}

#[tokio::test]
async fn floods_are_cut_with_enhance_your_calm() {
    // CONTINUATION frames without end: small ones are cut by their count (h2's rule: what the
    // header list limit needs at our frame size plus a quarter, at least 5), large ones by the
    // size of the block.
    for (frames, size, message) in [
        (
            40,
            1024,
            "http2 connection error: too many CONTINUATION frames in one header block (ENHANCE_YOUR_CALM)",
        ),
        (4, 16_000, "http2 connection error: header block too large (ENHANCE_YOUR_CALM)"),
    ] {
        let mut v = preface();
        v.extend(raw(kind::HEADERS, 0, 1, &connect_block()));
        for _ in 0..frames {
            v.extend(raw(kind::CONTINUATION, 0, 1, &vec![0u8; size]));
        }
        let (goaway, _, result) = provoke(v).await;
        assert_eq!(goaway.map(|g| g.1), Some(Reason::ENHANCE_YOUR_CALM), "{message}");
        assert_eq!(result, protocol(Reason::ENHANCE_YOUR_CALM, message));
    }

    // PINGs.
    let mut v = preface();
    for i in 0..(MAX_CHATTER as u64 + 10) {
        frame::ping(&mut v, i.to_be_bytes(), false);
    }
    let (goaway, _, result) = provoke(v).await;
    assert_eq!(goaway.map(|g| g.1), Some(Reason::ENHANCE_YOUR_CALM));
    assert_eq!(
        result,
        protocol(
            Reason::ENHANCE_YOUR_CALM,
            "http2 connection error: too many control frames (ENHANCE_YOUR_CALM)"
        )
    );

    // Streams opened and reset before any answer (rapid reset).
    let mut v = preface();
    let block = connect_block();
    for i in 0..(MAX_EARLY_RESETS + 10) {
        let id = 2 * i + 1;
        v.extend(raw(kind::HEADERS, flag::END_HEADERS, id, &block));
        frame::rst_stream(&mut v, id, Reason::CANCEL);
    }
    let (goaway, _, result) = provoke(v).await;
    assert_eq!(goaway.map(|g| g.1), Some(Reason::ENHANCE_YOUR_CALM));
    assert_eq!(
        result,
        protocol(
            Reason::ENHANCE_YOUR_CALM,
            "http2 connection error: too many streams reset before their response (ENHANCE_YOUR_CALM)"
        )
    );
}

#[tokio::test]
async fn stream_faults_reset_only_their_stream() {
    let block = connect_block();
    let mut v = preface();
    // A WINDOW_UPDATE of 0 on stream 1 is a stream error.
    v.extend(raw(kind::HEADERS, flag::END_HEADERS, 1, &block));
    frame::window_update(&mut v, 1, 0);
    // A malformed head (uppercase name) refuses stream 3 only.
    let mut bad = block.clone();
    bad.push(0);
    hpack_string(&mut bad, b"Upper");
    hpack_string(&mut bad, b"x");
    v.extend(raw(kind::HEADERS, flag::END_HEADERS, 3, &bad));
    // DATA after END_STREAM on stream 5.
    v.extend(raw(kind::HEADERS, flag::END_HEADERS | flag::END_STREAM, 5, &block));
    v.extend(raw(kind::DATA, 0, 5, b"late"));
    // Then a clean GOAWAY from the client ends the connection without an error.
    frame::goaway(&mut v, 0, Reason::NO_ERROR);
    let (goaway, resets, result) = provoke(v).await;
    assert_eq!(
        resets,
        vec![(1, Reason::PROTOCOL_ERROR), (3, Reason::PROTOCOL_ERROR), (5, Reason::STREAM_CLOSED)]
    );
    assert!(!matches!(goaway, Some((_, r)) if r != Reason::NO_ERROR), "{goaway:?}");
    assert!(!matches!(result, Err(ConnError { kind: ConnErrorKind::Protocol(_), .. })), "{result:?}");
}

fn hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(s.len() as u8);
    out.extend_from_slice(s);
}

#[tokio::test]
async fn a_client_that_closes_cleanly_ends_the_connection_without_an_error() {
    let ca = FakeCa::generate();
    let (addr, identity, result) = server(&ca).await;
    let mut tls = tls_client(&ca, addr, &identity).await.expect("tls");
    tls.write_all(&preface()).await.expect("write");
    tls.flush().await.expect("flush");
    // close_notify, then FIN: a clean end.
    tls.shutdown().await.expect("shutdown");
    let r = tokio::time::timeout(T, result).await.expect("in time").expect("ended");
    assert_eq!(r, Ok(()));
}

#[tokio::test]
async fn streams_ended_by_empty_data_frames_are_not_a_flood() {
    // Each stream ends with an empty DATA frame carrying END_STREAM, as ours and h2's do: more of
    // them per interval than the chatter limit must not end the connection.
    let ca = FakeCa::generate();
    let (addr, identity, _result) = server(&ca).await;
    let tls = tls_client(&ca, addr, &identity).await.expect("tls");
    let (mut r, mut w) = tokio::io::split(tls);
    let mut v = preface();
    let block = connect_block();
    for i in 0..(MAX_CHATTER + 100) {
        let id = 2 * i + 1;
        v.extend(raw(kind::HEADERS, flag::END_HEADERS, id, &block));
        frame::data_end(&mut v, id);
    }
    frame::ping(&mut v, *b"alive?!!", false);
    let writer = tokio::spawn(async move {
        w.write_all(&v).await.expect("write");
        w.flush().await.expect("flush");
        w
    });
    let answered = tokio::time::timeout(T, async {
        let mut reader = frame::Reader::new(frame::MAX_MAX_FRAME, 1 << 20);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = r.read(&mut buf).await.expect("read");
            assert!(n > 0, "the server closed the connection");
            let mut input = &buf[..n];
            while let Some(ev) = reader.next(&mut input) {
                match ev.expect("frame") {
                    Event::Frame(h, p)
                        if h.kind == kind::PING && h.flags & flag::ACK != 0 && p == b"alive?!!" =>
                    {
                        return true;
                    }
                    Event::Frame(h, p) if h.kind == kind::GOAWAY => panic!("GOAWAY {p:?}"),
                    _ => {}
                }
            }
        }
    })
    .await
    .expect("answered in time");
    assert!(answered);
    drop(writer.await.expect("writer"));
}
