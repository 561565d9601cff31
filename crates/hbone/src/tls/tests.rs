//! The record layer against rustls itself (tokio-rustls on the other end): handshakes both
//! ways, data both ways, key updates started by either side, session tickets, close_notify, and
//! records that must be refused.

use std::sync::Arc;
use std::time::Duration;

use ambit_identity::{FakeCa, Identity, WorkloadCertificate};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

fn identity(name: &str) -> Identity {
    Identity::new("cluster.local", "default", name)
}

fn cert(ca: &FakeCa, name: &str) -> WorkloadCertificate {
    ca.issue(&identity(name), Duration::from_secs(3600)).expect("test CA issues")
}

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
    (a.expect("connect"), b.expect("accept").0)
}

fn name() -> ServerName<'static> {
    ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())
}

/// One application-data record holding `data`.
fn record(sealer: &mut Sealer, data: &[u8]) -> Vec<u8> {
    let mut rec = vec![0u8; OVERHEAD + data.len()];
    rec[HEADER_LEN..HEADER_LEN + data.len()].copy_from_slice(data);
    sealer.seal(&mut rec).expect("seal");
    rec
}

/// Reads records from `tcp` until `want` bytes of application data arrived; handles
/// post-handshake messages (and answers a requested key update on `tcp`).
async fn read_data(tcp: &mut TcpStream, est: &mut Established, want: usize) -> Vec<u8> {
    let mut buf = std::mem::take(&mut est.leftover);
    let mut got = Vec::new();
    while got.len() < want {
        while let Some(len) = record_len(&buf).expect("record header") {
            if buf.len() < len {
                break;
            }
            let mut rec: Vec<u8> = buf.drain(..len).collect();
            match est.session.open(&mut rec).expect("open") {
                Content::Data(r) => got.extend_from_slice(&rec[r]),
                Content::Handshake(r) => {
                    est.session.handshake(&rec[r], &mut est.sealer).expect("post-handshake");
                    if est.sealer.key_update_owed() {
                        let mut out = Vec::new();
                        est.sealer.key_update(&mut out).expect("key update");
                        tcp.write_all(&out).await.expect("write key update");
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if got.len() >= want {
            break;
        }
        let mut chunk = vec![0u8; 64 * 1024];
        let n = tcp.read(&mut chunk).await.expect("read");
        assert!(n > 0, "EOF with {} of {want} bytes", got.len());
        buf.extend_from_slice(&chunk[..n]);
    }
    est.leftover = buf;
    got
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[tokio::test]
async fn our_client_and_server_agree_both_ways() {
    let ca = FakeCa::generate();
    let (c, s) = pair().await;
    let server = cert(&ca, "server");
    let client = cert(&ca, "client");
    let (mut ce, mut se) = tokio::join!(
        connect(&c, client.client_config(&[identity("server")]), name()),
        accept(&s, server.server_config()),
    );
    let (ce, se) = (ce.as_mut().expect("client handshake"), se.as_mut().expect("server handshake"));
    assert_eq!(ambit_identity::peer_identity(&ce.peer_certificates), Some(identity("server")));
    assert_eq!(ambit_identity::peer_identity(&se.peer_certificates), Some(identity("client")));
    let (mut c, mut s) = (c, s);
    let up = pattern(100_000, 1);
    for part in up.chunks(MAX_CONTENT) {
        c.write_all(&record(&mut ce.sealer, part)).await.expect("write");
    }
    assert_eq!(read_data(&mut s, se, up.len()).await, up);
    let down = pattern(50_000, 2);
    for part in down.chunks(7000) {
        s.write_all(&record(&mut se.sealer, part)).await.expect("write");
    }
    assert_eq!(read_data(&mut c, ce, down.len()).await, down);
}

#[tokio::test]
async fn interoperates_with_rustls_both_ways_across_key_updates() {
    let ca = FakeCa::generate();
    let server = cert(&ca, "server");
    let client = cert(&ca, "client");

    // Our client, rustls's server.
    let (mut c, s) = pair().await;
    let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config());
    let (ours, theirs) =
        tokio::join!(connect(&c, client.client_config(&[identity("server")]), name()), acceptor.accept(s));
    let (mut ours, mut theirs) = (ours.expect("our client"), theirs.expect("rustls server"));
    // Our key moves every 3 records; rustls follows.
    ours.sealer.set_key_update_after(3);
    let data = pattern(200_000, 3);
    for part in data.chunks(10_000) {
        if ours.sealer.wants_key_update() {
            let mut out = Vec::new();
            ours.sealer.key_update(&mut out).expect("key update");
            c.write_all(&out).await.expect("write");
        }
        c.write_all(&record(&mut ours.sealer, part)).await.expect("write");
    }
    let mut got = vec![0u8; data.len()];
    theirs.read_exact(&mut got).await.expect("rustls reads");
    assert_eq!(got, data);
    // rustls moves its key and asks us to move ours; we follow and answer.
    theirs.get_mut().1.refresh_traffic_keys().expect("rustls key update");
    theirs.write_all(b"after the update").await.expect("rustls writes");
    theirs.flush().await.expect("flush");
    assert_eq!(read_data(&mut c, &mut ours, 16).await, b"after the update");
    c.write_all(&record(&mut ours.sealer, b"still readable")).await.expect("write");
    let mut got = [0u8; 14];
    theirs.read_exact(&mut got).await.expect("rustls reads after our answer");
    assert_eq!(&got, b"still readable");

    // rustls's client, our server.
    let (c, mut s) = pair().await;
    let connector = tokio_rustls::TlsConnector::from(client.client_config(&[identity("server")]));
    let (theirs, ours) = tokio::join!(connector.connect(name(), c), accept(&s, server.server_config()));
    let (mut theirs, mut ours) = (theirs.expect("rustls client"), ours.expect("our server"));
    let data = pattern(300_000, 4);
    let writer = async {
        theirs.write_all(&data).await.expect("rustls writes");
        theirs.flush().await.expect("flush");
        theirs
    };
    let (mut theirs, got) = tokio::join!(writer, read_data(&mut s, &mut ours, data.len()));
    assert_eq!(got, data);
    s.write_all(&record(&mut ours.sealer, b"from our server")).await.expect("write");
    let mut got = [0u8; 15];
    theirs.read_exact(&mut got).await.expect("rustls reads");
    assert_eq!(&got, b"from our server");
    // close_notify from our side: rustls sees a clean end of stream.
    let mut out = Vec::new();
    ours.sealer.close_notify(&mut out).expect("close_notify");
    s.write_all(&out).await.expect("write");
    let mut rest = Vec::new();
    assert_eq!(theirs.read_to_end(&mut rest).await.expect("clean EOF"), 0);
}

#[tokio::test]
async fn session_tickets_from_the_server_are_taken_after_the_handshake() {
    // rustls's server sends TLS 1.3 tickets once the client's Finished arrived: they reach our
    // client as post-handshake messages, and the data after them still reads.
    let ca = FakeCa::generate();
    let server = cert(&ca, "server");
    let client = cert(&ca, "client");
    let mut config = (*server.server_config()).clone();
    config.send_tls13_tickets = 2;
    let (mut c, s) = pair().await;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let (ours, theirs) =
        tokio::join!(connect(&c, client.client_config(&[identity("server")]), name()), acceptor.accept(s));
    let (mut ours, mut theirs) = (ours.expect("our client"), theirs.expect("rustls server"));
    theirs.write_all(b"hello").await.expect("write");
    theirs.flush().await.expect("flush");
    assert_eq!(read_data(&mut c, &mut ours, 5).await, b"hello");
}

#[tokio::test]
async fn a_server_with_another_identity_is_refused_and_told_why() {
    let ca = FakeCa::generate();
    let server = cert(&ca, "server");
    let client = cert(&ca, "client");
    let (c, s) = pair().await;
    let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config());
    let (ours, theirs) = tokio::join!(
        connect(&c, client.client_config(&[identity("someone-else")]), name()),
        acceptor.accept(s)
    );
    let err = ours.err().expect("our client refuses the server").to_string();
    assert!(err.contains("someone-else"), "{err}");
    let err = theirs.expect_err("the server learns of it").to_string();
    assert!(err.contains("received fatal alert"), "{err}");
}

#[tokio::test]
async fn tampered_and_malformed_records_are_refused() {
    let ca = FakeCa::generate();
    let (c, s) = pair().await;
    let server = cert(&ca, "server");
    let client = cert(&ca, "client");
    let (ce, se) = tokio::join!(
        connect(&c, client.client_config(&[identity("server")]), name()),
        accept(&s, server.server_config()),
    );
    let (mut ce, mut se) = (ce.expect("client"), se.expect("server"));
    let mut rec = record(&mut ce.sealer, b"payload");
    rec[HEADER_LEN + 2] ^= 1;
    assert_eq!(se.session.open(&mut rec).err().and_then(|e| e.alert()), Some(Alert::BAD_RECORD_MAC));
    // Keys stay in step only if records are opened in order: a skipped record fails the next.
    let _skipped = record(&mut ce.sealer, b"one");
    let mut next = record(&mut ce.sealer, b"two");
    assert_eq!(se.session.open(&mut next).err().and_then(|e| e.alert()), Some(Alert::BAD_RECORD_MAC));

    let err = |b: &[u8]| record_len(b).err().map(|e| e.to_string());
    assert_eq!(
        err(&[22, 3, 3, 0, 10]).as_deref(),
        Some("TLS protocol violation: unprotected record after the handshake (alert bad_record_mac)")
    );
    assert_eq!(
        err(&[20, 3, 3, 0, 1]).as_deref(),
        Some("TLS protocol violation: change_cipher_spec after the handshake (alert unexpected_message)")
    );
    assert_eq!(
        err(&[99, 3, 3, 0, 1]).as_deref(),
        Some("TLS protocol violation: unknown record type (alert decode_error)")
    );
    assert_eq!(
        err(&[23, 2, 3, 0, 10]).as_deref(),
        Some("TLS protocol violation: record version (alert decode_error)")
    );
    assert_eq!(
        err(&[23, 3, 3, 0x41, 0x01]).as_deref(),
        Some("TLS protocol violation: record over 2^14 + 256 bytes (alert record_overflow)")
    );
    assert_eq!(record_len(&[23, 3, 3, 0x41, 0x00]).expect("the largest record"), Some(MAX_RECORD));
    assert_eq!(record_len(&[23, 3, 3]).expect("a partial header"), None);

    // A record of all zeros after decryption has no content type.
    let mut zeros = vec![0u8; OVERHEAD + 4];
    let hdr = [TYPE_APPLICATION_DATA, 3, 3, 0, (4 + 1 + TAG_LEN) as u8];
    zeros[..HEADER_LEN].copy_from_slice(&hdr);
    let body_len = zeros.len() - HEADER_LEN - TAG_LEN;
    let (inner, tag) = zeros[HEADER_LEN..].split_at_mut(body_len);
    let t = ce
        .sealer
        .aead
        .key
        .seal_in_place_separate_tag(ce.sealer.aead.nonce(ce.sealer.seq), Aad::from(hdr), inner)
        .expect("seal");
    tag.copy_from_slice(t.as_ref());
    ce.sealer.seq += 1;
    // The receiver is one record behind after the two failures above: realign it.
    se.session.opener.seq = ce.sealer.seq - 1;
    assert_eq!(
        se.session.open(&mut zeros).err().map(|e| e.to_string()).as_deref(),
        Some("TLS protocol violation: record without a content type (alert unexpected_message)")
    );
}

/// Point 2: a client sends KeyUpdate(update_requested) in the same write as its Finished. The
/// record behind the Finished is the record layer's, not rustls's: the update is answered and
/// both directions keep reading (before, rustls took it inside the handshake and the answer it
/// owed was lost with the hand-over: every record of ours then failed bad_record_mac).
#[tokio::test]
async fn a_key_update_right_behind_the_clients_finished_is_answered() {
    let ca = FakeCa::generate();
    let server = cert(&ca, "server");
    let client = cert(&ca, "client");
    let (mut c, mut s) = pair().await;
    let ours = tokio::spawn(async move {
        let mut est = accept(&s, server.server_config()).await.expect("our server");
        let got = read_data(&mut s, &mut est, 5).await;
        s.write_all(&record(&mut est.sealer, b"world")).await.expect("write");
        got
    });
    let mut conn = rustls::ClientConnection::new(client.client_config(&[identity("server")]), name())
        .expect("rustls client");
    let mut buf = vec![0u8; 64 * 1024];
    // The handshake, holding back the client's last flight.
    while conn.is_handshaking() {
        let mut out = Vec::new();
        conn.write_tls(&mut out).expect("encode");
        c.write_all(&out).await.expect("write");
        let n = c.read(&mut buf).await.expect("read");
        assert!(n > 0, "our server closed during the handshake");
        conn.read_tls(&mut &buf[..n]).expect("read_tls");
        conn.process_new_packets().expect("rustls handshake");
    }
    // Finished, KeyUpdate(update_requested) and application data in one write.
    conn.refresh_traffic_keys().expect("rustls key update");
    std::io::Write::write_all(&mut conn.writer(), b"hello").expect("plaintext");
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).expect("encode");
    }
    c.write_all(&out).await.expect("write the last flight");
    assert_eq!(ours.await.expect("our server"), b"hello");
    let mut got = Vec::new();
    while got.len() < 5 {
        let n = c.read(&mut buf).await.expect("read");
        assert!(n > 0, "our server closed");
        conn.read_tls(&mut &buf[..n]).expect("read_tls");
        conn.process_new_packets().expect("rustls reads our records (no bad_record_mac)");
        let mut plain = [0u8; 64];
        while let Ok(n) = std::io::Read::read(&mut conn.reader(), &mut plain) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&plain[..n]);
        }
    }
    assert_eq!(got, b"world");
}

/// Point 9: no session resumption. A resumed client presents no certificate, so an identity
/// that expired or was rotated would keep working: rustls's client, with resumption on, gets a
/// full handshake with its certificate every time.
#[tokio::test]
async fn every_connection_is_a_full_handshake_with_a_client_certificate() {
    let ca = FakeCa::generate();
    let server = cert(&ca, "server");
    let client = cert(&ca, "client");
    let mut config = (*client.client_config(&[identity("server")])).clone();
    config.resumption = rustls::client::Resumption::in_memory_sessions(16);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    for round in 0..2 {
        let (c, mut s) = pair().await;
        let (theirs, ours) = tokio::join!(connector.connect(name(), c), accept(&s, server.server_config()));
        let (mut theirs, mut ours) = (theirs.expect("rustls client"), ours.expect("our server"));
        assert_eq!(
            theirs.get_ref().1.handshake_kind(),
            Some(rustls::HandshakeKind::Full),
            "connection {round} resumed a session"
        );
        assert_eq!(ambit_identity::peer_identity(&ours.peer_certificates), Some(identity("client")));
        // The client reads whatever the server sent after the handshake (tickets, if any).
        s.write_all(&record(&mut ours.sealer, b"x")).await.expect("write");
        let mut x = [0u8; 1];
        theirs.read_exact(&mut x).await.expect("read");
    }
}

/// What is not TLS is refused as soon as a record header shows it, not when as many bytes as the
/// header announced have come (a client that sends a few bytes of anything else is closed at
/// once, with rustls's alert).
#[tokio::test]
async fn garbage_is_refused_at_its_first_header() {
    let ca = FakeCa::generate();
    let server = cert(&ca, "server");
    let (mut c, s) = pair().await;
    c.write_all(b"GET / HTTP/1.1\r\n").await.expect("write");
    let r = tokio::time::timeout(Duration::from_secs(2), accept(&s, server.server_config())).await;
    let err = r.expect("refused within 2 s").err().expect("not a handshake").to_string();
    assert_eq!(err, "received corrupt message of type InvalidContentType");
}
