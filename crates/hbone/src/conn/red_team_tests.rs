//! What a security review found a mesh member could do with hand-sealed TLS records and
//! hand-built HTTP/2 frames, and what the peer TLS suite (tlsfuzzer's probes, TESTING.md) found
//! after it, each replayed against the server side: every test checks the defence by its
//! evidence (the alert or GOAWAY and its code, the resets counted, the answers owed), never by
//! a timeout alone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ambit_identity::{FakeCa, Identity, WorkloadCertificate};
use tokio::net::TcpListener;

use super::tests::cfg;
use super::*;
use crate::testing::RawPeer;
use crate::testing::wire::{self, content};

const T: Duration = Duration::from_secs(20);

/// What the server does with the streams it accepts.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Holds every stream until the peer resets it.
    Hold,
    /// Answers 403 and ends its side at once.
    Reject,
    /// Answers 200, then sends 100 bytes every 10 ms until the stream is gone.
    Talk,
}

struct Server {
    addr: SocketAddr,
    identity: Identity,
    accepted: Arc<AtomicUsize>,
    result: tokio::sync::oneshot::Receiver<Result<(), ConnError>>,
}

/// A server on one connection, with `behaviour`; its end is sent on `result`.
async fn server(ca: &FakeCa, behaviour: Behaviour) -> Server {
    let identity = Identity::new("cluster.local", "default", "server");
    let cert = ca.issue(&identity, Duration::from_secs(3600)).expect("issue");
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let (tx, result) = tokio::sync::oneshot::channel();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let Ok((tcp, _)) = l.accept().await else { return };
        let est = tls::accept(&tcp, cert.server_config()).await.expect("handshake");
        let mut server = super::server(tcp, est, cfg()).expect("server");
        let r = loop {
            match server.accept().await {
                Some(Ok(i)) => {
                    count.fetch_add(1, Ordering::AcqRel);
                    tokio::spawn(handle(i.stream, behaviour));
                }
                Some(Err(e)) => break Err(e),
                None => break Ok(()),
            }
        };
        let _ = tx.send(r);
    });
    Server { addr, identity, accepted, result }
}

async fn handle(stream: StreamHandle, behaviour: Behaviour) {
    match behaviour {
        Behaviour::Hold => {
            let _ = std::future::poll_fn(|cx| stream.poll_gone(cx)).await;
        }
        Behaviour::Reject => {
            let _ = stream.respond(403, &HeaderMap::new(), true);
        }
        Behaviour::Talk => {
            if stream.respond(200, &HeaderMap::new(), false).is_err() {
                return;
            }
            while stream.send(&[b'x'; 100]).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

fn client_cert(ca: &FakeCa) -> WorkloadCertificate {
    ca.issue(&Identity::new("cluster.local", "default", "client"), Duration::from_secs(3600)).expect("issue")
}

/// A connection past its handshake: the server's SETTINGS arrived, so what follows is read by
/// the record layer.
async fn peer(ca: &FakeCa, s: &Server) -> RawPeer {
    let mut p = RawPeer::connect(&client_cert(ca), s.addr, &s.identity).await.expect("tls");
    assert!(p.settled(T).await, "no SETTINGS from the server: {:?}", p.seen);
    p
}

async fn server_end(s: Server) -> Result<(), ConnError> {
    tokio::time::timeout(T, s.result).await.expect("the server ended in time").expect("server result")
}

fn protocol(reason: Reason, message: &str) -> Result<(), ConnError> {
    Err(ConnError { kind: ConnErrorKind::Protocol(reason), message: message.to_owned() })
}

fn tls_violation(what: &str, alert: &str) -> Result<(), ConnError> {
    Err(ConnError {
        kind: ConnErrorKind::Tls,
        message: format!("tls error: TLS protocol violation: {what} (alert {alert})"),
    })
}

fn connect(id: u32) -> Vec<u8> {
    wire::frame(wire::kind::HEADERS, wire::flag::END_HEADERS, id, &wire::connect_block("10.0.0.2:8080"))
}

/// Point 1: a KeyUpdate the peer asks for is owed once, and more than 32 without application
/// data in between end the connection (rustls's limit).
#[tokio::test]
async fn key_update_requests_are_answered_once_and_a_flood_is_cut() {
    let ca = FakeCa::generate();
    // Three requests, then a PING: one KeyUpdate comes back, before the PING's answer.
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let mut v = p.data(&wire::client_preface());
    for _ in 0..3 {
        v.extend(p.request_key_update());
    }
    let mut ping = Vec::new();
    wire::ping(&mut ping, *b"after-ku", false);
    v.extend(p.data(&ping));
    p.send(&v).await.expect("send");
    assert!(p.read_until(T, |seen| seen.pong(b"after-ku")).await, "no PING answer: {:?}", p.seen);
    assert_eq!(p.seen.key_updates, 1, "answers to three requests sent in one write");

    // A flood: 100 requests without data. The connection ends at the 33rd with
    // unexpected_message, and at most one answer was sent.
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let mut v = p.data(&wire::client_preface());
    for _ in 0..100 {
        v.extend(p.request_key_update());
    }
    p.send(&v).await.expect("send");
    p.read_until(T, |seen| seen.closed).await;
    assert_eq!(p.seen.alert, Some(wire::Alert::UNEXPECTED_MESSAGE), "{:?}", p.seen);
    assert!(p.seen.key_updates <= 1, "answers owed: {}", p.seen.key_updates);
    assert_eq!(
        server_end(s).await,
        tls_violation("too many KeyUpdates without application data", "unexpected_message")
    );
}

/// Point 3 ("MadeYouReset"): streams we reset because of the peer's frames count, as h2 counts
/// them, and past 1 024 the connection ends with ENHANCE_YOUR_CALM.
#[tokio::test]
async fn resets_the_peer_causes_are_counted() {
    let ca = FakeCa::generate();
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let mut plain = wire::client_preface();
    for i in 0..1_100u32 {
        let id = 2 * i + 1;
        plain.extend(connect(id));
        match i % 3 {
            // A WINDOW_UPDATE of 0.
            0 => wire::window_update(&mut plain, id, 0),
            // Trailers that do not end the stream.
            1 => plain.extend(wire::frame(
                wire::kind::HEADERS,
                wire::flag::END_HEADERS,
                id,
                &wire::literal_block(&[("x-trailer", "1")]),
            )),
            // A stream that depends on itself.
            _ => {
                plain.extend(wire::frame(wire::kind::PRIORITY, 0, id, &[0, 0, (id >> 8) as u8, id as u8, 1]))
            }
        }
    }
    let v = p.data(&plain);
    p.send(&v).await.expect("send");
    p.read_until(T, |seen| seen.goaway().is_some()).await;
    assert_eq!(p.seen.resets().len(), 1_024, "resets before the GOAWAY");
    assert!(p.seen.resets().iter().all(|(_, r)| *r == Reason::PROTOCOL_ERROR));
    assert_eq!(p.seen.goaway().map(|g| g.1), Some(Reason::ENHANCE_YOUR_CALM));
    assert_eq!(
        server_end(s).await,
        protocol(
            Reason::ENHANCE_YOUR_CALM,
            "http2 connection error: too many streams reset because of the peer's frames (ENHANCE_YOUR_CALM)"
        )
    );
}

/// After a complete error answer the stream ends with NO_ERROR (RFC 9113 §8.1), not CANCEL;
/// such answers count as refusals, 1 024 per 10 s.
#[tokio::test]
async fn error_answers_end_with_no_error_and_count_as_refusals() {
    let ca = FakeCa::generate();
    let s = server(&ca, Behaviour::Reject).await;
    let mut p = peer(&ca, &s).await;
    let mut v = p.data(&wire::client_preface());
    v.extend(p.data(&connect(1)));
    p.send(&v).await.expect("send");
    assert!(p.read_until(T, |seen| !seen.resets().is_empty()).await, "{:?}", p.seen);
    assert_eq!(p.seen.resets(), vec![(1, Reason::NO_ERROR)]);

    let mut plain = Vec::new();
    for i in 1..1_100u32 {
        plain.extend(connect(2 * i + 1));
    }
    let v = p.data(&plain);
    p.send(&v).await.expect("send");
    p.read_until(T, |seen| seen.goaway().is_some()).await;
    assert_eq!(p.seen.resets().len(), 1_024, "refusals before the GOAWAY");
    assert_eq!(
        server_end(s).await,
        protocol(
            Reason::ENHANCE_YOUR_CALM,
            "http2 connection error: too many streams refused or answered before the peer finished (ENHANCE_YOUR_CALM)"
        )
    );
}

/// Point 4: a handshake message split over records may not be interleaved with other records
/// (RFC 8446 §5.1), and a client may send no post-handshake message but KeyUpdate.
#[tokio::test]
async fn handshake_fragments_interleaved_with_data_are_refused() {
    let ca = FakeCa::generate();
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let mut v = p.data(&wire::client_preface());
    // The first three bytes of a KeyUpdate's header, then application data.
    v.extend(p.record(content::HANDSHAKE, &[24, 0, 0]));
    let mut ping = Vec::new();
    wire::ping(&mut ping, *b"12345678", false);
    v.extend(p.data(&ping));
    p.send(&v).await.expect("send");
    p.read_until(T, |seen| seen.closed).await;
    assert_eq!(p.seen.alert, Some(wire::Alert::UNEXPECTED_MESSAGE), "{:?}", p.seen);
    assert_eq!(
        server_end(s).await,
        tls_violation("a record inside a fragmented handshake message", "unexpected_message")
    );

    // A NewSessionTicket from a client: refused at its header.
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let mut v = p.data(&wire::client_preface());
    v.extend(p.record(content::HANDSHAKE, &[4, 0, 0xff, 0xff]));
    p.send(&v).await.expect("send");
    p.read_until(T, |seen| seen.closed).await;
    assert_eq!(p.seen.alert, Some(wire::Alert::UNEXPECTED_MESSAGE), "{:?}", p.seen);
    assert_eq!(server_end(s).await, tls_violation("unexpected post-handshake message", "unexpected_message"));
}

/// Point 5: HEADERS on a half-closed (remote) stream resets it (STREAM_CLOSED), and a reset
/// stream sends nothing more.
#[tokio::test]
async fn a_stream_reset_for_headers_after_its_end_sends_no_more_data() {
    let ca = FakeCa::generate();
    let s = server(&ca, Behaviour::Talk).await;
    let mut p = peer(&ca, &s).await;
    let mut v = p.data(&wire::client_preface());
    v.extend(p.data(&connect(1)));
    p.send(&v).await.expect("send");
    assert!(p.read_until(T, |seen| seen.data_frames.len() >= 3).await, "the server talks: {:?}", p.seen);
    // END_STREAM, then HEADERS on the half-closed stream.
    let mut plain = Vec::new();
    wire::data_end(&mut plain, 1);
    plain.extend(connect(1));
    let v = p.data(&plain);
    p.send(&v).await.expect("send");
    assert!(p.read_until(T, |seen| !seen.resets().is_empty()).await, "{:?}", p.seen);
    assert_eq!(p.seen.resets(), vec![(1, Reason::STREAM_CLOSED)]);
    let at_reset = p.seen.data_frames.len();
    // The talker sends every 10 ms: half a second would show some 50 frames.
    p.read_until(Duration::from_millis(500), |_| false).await;
    assert_eq!(p.seen.data_frames.len(), at_reset, "DATA after our RST_STREAM");
}

/// Point 6: a CONNECT with `:scheme` or `:path`, `:protocol` without
/// SETTINGS_ENABLE_CONNECT_PROTOCOL, or a response pseudo-header in a request is malformed
/// (RFC 9113 §8.5, §8.3): the stream is reset (PROTOCOL_ERROR) and never handed out.
#[tokio::test]
async fn malformed_connect_requests_are_refused() {
    let ca = FakeCa::generate();
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let cases: [&[(&str, &str)]; 5] = [
        &[(":method", "CONNECT"), (":scheme", "https"), (":authority", "10.0.0.2:8080")],
        &[(":method", "CONNECT"), (":path", "/"), (":authority", "10.0.0.2:8080")],
        &[(":method", "CONNECT"), (":protocol", "websocket"), (":authority", "10.0.0.2:8080")],
        &[(":method", "CONNECT"), (":status", "200"), (":authority", "10.0.0.2:8080")],
        &[(":method", "CONNECT")],
    ];
    let mut plain = wire::client_preface();
    for (i, fields) in cases.iter().enumerate() {
        let id = 2 * i as u32 + 1;
        plain.extend(wire::frame(
            wire::kind::HEADERS,
            wire::flag::END_HEADERS,
            id,
            &wire::literal_block(fields),
        ));
    }
    // A good one last: it is handed out.
    plain.extend(connect(11));
    let v = p.data(&plain);
    p.send(&v).await.expect("send");
    assert!(p.read_until(T, |seen| seen.resets().len() >= 5).await, "{:?}", p.seen);
    assert_eq!(p.seen.resets(), (0..5).map(|i| (2 * i + 1, Reason::PROTOCOL_ERROR)).collect::<Vec<_>>());
    let t0 = tokio::time::Instant::now();
    while s.accepted.load(Ordering::Acquire) < 1 && t0.elapsed() < T {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(s.accepted.load(Ordering::Acquire), 1, "only the well-formed CONNECT was handed out");
}

/// Point 7: frames and records that carry nothing are counted (h2's and rustls's limits as the
/// reference) and a flood of them ends the connection with its code.
#[tokio::test]
async fn chatter_is_counted_and_cut() {
    let ca = FakeCa::generate();
    let over = MAX_CHATTER as usize + 10;
    let calm = "http2 connection error: too many control frames (ENHANCE_YOUR_CALM)";
    let frames: Vec<(&str, Vec<u8>, &str)> = vec![
        ("PRIORITY", wire::frame(wire::kind::PRIORITY, 0, 3, &[0, 0, 0, 1, 1]), calm),
        ("SETTINGS ACK", wire::frame(wire::kind::SETTINGS, wire::flag::ACK, 0, &[]), calm),
        ("PING ACK", wire::frame(wire::kind::PING, wire::flag::ACK, 0, b"unasked!"), calm),
        (
            "WINDOW_UPDATE on a closed stream",
            wire::frame(wire::kind::WINDOW_UPDATE, 0, 1, &[0, 0, 0, 1]),
            calm,
        ),
        ("RST_STREAM on a closed stream", wire::frame(wire::kind::RST_STREAM, 0, 1, &[0, 0, 0, 8]), calm),
    ];
    for (name, f, message) in frames {
        let s = server(&ca, Behaviour::Reject).await;
        let mut p = peer(&ca, &s).await;
        // Stream 1 is opened and closed (answered 403, reset NO_ERROR) first.
        let mut plain = wire::client_preface();
        plain.extend(connect(1));
        let v = p.data(&plain);
        p.send(&v).await.expect("send");
        assert!(p.read_until(T, |seen| !seen.resets().is_empty()).await, "{name}: {:?}", p.seen);
        let plain: Vec<u8> = std::iter::repeat_n(f, over).flatten().collect();
        let v = p.data(&plain);
        p.send(&v).await.expect("send");
        p.read_until(T, |seen| seen.goaway().is_some()).await;
        assert_eq!(p.seen.goaway().map(|g| g.1), Some(Reason::ENHANCE_YOUR_CALM), "{name}");
        assert_eq!(server_end(s).await, protocol(Reason::ENHANCE_YOUR_CALM, message), "{name}");
    }

    // Empty CONTINUATION frames of one block: cut by the count of CONTINUATIONs.
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let mut plain = wire::client_preface();
    plain.extend(wire::frame(wire::kind::HEADERS, 0, 1, &wire::connect_block("10.0.0.2:8080")));
    for _ in 0..100_000 {
        plain.extend(wire::frame(wire::kind::CONTINUATION, 0, 1, &[]));
    }
    let v = p.data(&plain);
    p.send(&v).await.expect("send");
    p.read_until(T, |seen| seen.goaway().is_some()).await;
    assert_eq!(p.seen.goaway().map(|g| g.1), Some(Reason::ENHANCE_YOUR_CALM));
    assert_eq!(
        server_end(s).await,
        protocol(
            Reason::ENHANCE_YOUR_CALM,
            "http2 connection error: too many CONTINUATION frames in one header block (ENHANCE_YOUR_CALM)"
        )
    );

    // Records: empty ones in a row, user_canceled alerts, KeyUpdates not asking for one.
    type Record = fn(&mut RawPeer) -> Vec<u8>;
    let records: [(&str, Record, usize, &str); 3] = [
        (
            "empty records",
            |p| p.record(content::APPLICATION_DATA, &[]),
            33,
            "too many empty records in a row",
        ),
        ("user_canceled", |p| p.record(content::ALERT, &[1, 90]), 5, "too many user_canceled alerts"),
        ("KeyUpdate", |p| p.key_update(), 33, "too many KeyUpdates without application data"),
    ];
    for (name, record, n, what) in records {
        let s = server(&ca, Behaviour::Hold).await;
        let mut p = peer(&ca, &s).await;
        let mut v = p.data(&wire::client_preface());
        // One fewer than the limit is taken: the connection still answers.
        for _ in 0..n - 1 {
            v.extend(record(&mut p));
        }
        let mut ping = Vec::new();
        wire::ping(&mut ping, *b"stillok?", false);
        v.extend(p.data(&ping));
        p.send(&v).await.expect("send");
        assert!(p.read_until(T, |seen| seen.pong(b"stillok?")).await, "{name}: {:?}", p.seen);
        // The limit counts from the last data for empty records and KeyUpdates, over the
        // connection for alerts.
        let again = if name == "user_canceled" { 1 } else { n };
        let v: Vec<u8> = (0..again).flat_map(|_| record(&mut p)).collect();
        p.send(&v).await.expect("send");
        p.read_until(T, |seen| seen.closed).await;
        assert_eq!(p.seen.alert, Some(wire::Alert::UNEXPECTED_MESSAGE), "{name}: {:?}", p.seen);
        assert_eq!(server_end(s).await, tls_violation(what, "unexpected_message"), "{name}");
    }
}

/// Point 8: a record trickled a byte at a time, header included, is put together and read: each
/// piece in its own read (a pause after each), and then a flood of single-byte writes.
#[tokio::test]
async fn records_trickled_byte_by_byte_are_read() {
    let ca = FakeCa::generate();
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let mut plain = wire::client_preface();
    wire::ping(&mut plain, *b"trickle1", false);
    let first = p.data(&plain);
    // A full-size record of PINGs.
    let mut pings = Vec::new();
    while pings.len() + 17 <= wire::MAX_CONTENT {
        wire::ping(&mut pings, *b"trickle2", false);
    }
    let second = p.data(&pings);
    // The first record and the second's header a byte per read, the second's body in pieces of
    // 1 000 bytes, one per read.
    let paused: Vec<&[u8]> = first
        .chunks(1)
        .chain(second[..wire::HEADER_LEN].chunks(1))
        .chain(second[wire::HEADER_LEN..].chunks(1000))
        .collect();
    for piece in paused {
        p.send(piece).await.expect("send a piece");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(p.read_until(T, |seen| seen.pong(b"trickle1") && seen.pong(b"trickle2")).await, "{:?}", p.seen);
    // Another full record, a byte per write as fast as they go.
    let mut ping = Vec::new();
    wire::ping(&mut ping, *b"trickle3", false);
    let mut third = p.data(&pings);
    third.extend(p.data(&ping));
    for b in third {
        p.send(&[b]).await.expect("send a byte");
    }
    assert!(p.read_until(T, |seen| seen.pong(b"trickle3")).await, "{:?}", p.seen);
}

/// Found by the peer suite: TLSInnerPlaintext over 2^14 + 1 bytes (padding included) is a
/// record_overflow (RFC 8446 §5.4), as rustls has it.
#[tokio::test]
async fn a_record_padded_over_the_limit_overflows() {
    let ca = FakeCa::generate();
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let mut v = p.data(&wire::client_preface());
    let mut ping = Vec::new();
    wire::ping(&mut ping, *b"overflow", false);
    let content = [ping.clone(), vec![0; wire::MAX_CONTENT - 8 - ping.len()]].concat();
    // 16 376 bytes of content, the type and 9 bytes of padding: 2^14 + 2 bytes.
    let mut filler = content.clone();
    filler.truncate(wire::MAX_CONTENT - 8);
    v.extend(p.padded(content::APPLICATION_DATA, &ping, wire::MAX_CONTENT + 2 - ping.len() - 1));
    p.send(&v).await.expect("send");
    p.read_until(T, |seen| seen.closed).await;
    assert!(!p.seen.pong(b"overflow"), "the overflowing record was read");
    assert_eq!(p.seen.alert, Some(wire::Alert::RECORD_OVERFLOW), "{:?}", p.seen);
    assert_eq!(server_end(s).await, tls_violation("record plaintext over 2^14 + 1 bytes", "record_overflow"));
}

/// Found by the peer suite: the peer's close_notify is answered with ours before the connection
/// closes (RFC 8446 §6.1).
#[tokio::test]
async fn close_notify_is_answered() {
    let ca = FakeCa::generate();
    let s = server(&ca, Behaviour::Hold).await;
    let mut p = peer(&ca, &s).await;
    let mut v = p.data(&wire::client_preface());
    v.extend(p.record(content::ALERT, &[1, 0]));
    p.send(&v).await.expect("send");
    p.read_until(T, |seen| seen.closed).await;
    assert!(p.seen.close_notify, "closed without close_notify: {:?}", p.seen);
    assert_eq!(server_end(s).await, Ok(()));
}
