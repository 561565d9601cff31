//! In-process tests of the HBONE server's phase deadlines, per-peer caps and relay teardown,
//! over real TLS on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ambit_identity::FakeCa;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{Ended, ServerConfig};
use crate::testing::{RelayServer, TestBudget, echo_app, send_all, settings, tls_client};

const SHORT: Duration = Duration::from_millis(300);

fn deadlines() -> ServerConfig {
    ServerConfig {
        settings: settings(),
        preface_timeout: SHORT,
        first_stream_timeout: SHORT,
        idle_timeout: SHORT,
    }
}

fn unlimited() -> TestBudget {
    TestBudget::unlimited(settings())
}

/// An app that accepts connections and never reads them; keeps them open.
async fn app_that_never_reads() -> (SocketAddr, Arc<tokio::sync::Mutex<Vec<tokio::net::TcpStream>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind app");
    let addr = l.local_addr().expect("addr");
    let held = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let h = held.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            h.lock().await.push(s);
        }
    });
    (addr, held)
}

/// Waits until the server closes `tls` (EOF or error) and returns how long that took.
async fn closed_after<S: AsyncReadExt + Unpin>(mut s: S) -> Duration {
    let t0 = Instant::now();
    let mut buf = [0u8; 4096];
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(r.is_ok(), "the server did not close the connection within 10 s");
    t0.elapsed()
}

/// How the server's connections ended, once `n` of them did (waits up to 3 s).
async fn ended(server: &RelayServer, n: usize) -> Vec<Result<Ended, String>> {
    let t0 = Instant::now();
    loop {
        let ended = server.ended.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if ended.len() >= n || t0.elapsed() > Duration::from_secs(3) {
            return ended;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn silence_after_tls_and_half_a_preface_are_closed_at_the_preface_deadline() {
    let ca = FakeCa::generate();
    let server = RelayServer::start_with(&ca, deadlines(), unlimited(), echo_app().await).await;
    let silent = tls_client(&ca, server.addr, &server.identity).await.expect("tls");
    let mut half = tls_client(&ca, server.addr, &server.identity).await.expect("tls");
    half.write_all(&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..12]).await.expect("half a preface");
    half.flush().await.expect("flush");
    let (a, b) = tokio::join!(closed_after(silent), closed_after(half));
    for t in [a, b] {
        assert!(
            t >= SHORT - Duration::from_millis(50) && t < SHORT + Duration::from_secs(2),
            "closed after {t:?}"
        );
    }
    let ended = ended(&server, 2).await;
    assert_eq!(ended.len(), 2);
    assert!(ended.iter().all(|e| e.as_ref().is_err_and(|e| e.contains("no HTTP/2 preface"))), "{ended:?}");
}

#[tokio::test]
async fn a_client_that_never_sends_a_connect_is_closed_at_the_first_stream_deadline() {
    let ca = FakeCa::generate();
    let server = RelayServer::start_with(&ca, deadlines(), unlimited(), echo_app().await).await;
    let tls = tls_client(&ca, server.addr, &server.identity).await.expect("tls");
    let (_send, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    let t0 = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(r.is_ok(), "the connection was not closed");
    let t = t0.elapsed();
    assert!(
        t >= SHORT - Duration::from_millis(50) && t < SHORT + Duration::from_secs(2),
        "closed after {t:?}"
    );
    let ended = ended(&server, 1).await;
    assert!(matches!(ended.as_slice(), [Err(e)] if e.contains("no CONNECT within")), "{ended:?}");
}

#[tokio::test]
async fn an_idle_connection_is_closed_with_goaway_but_not_while_a_stream_is_open() {
    let ca = FakeCa::generate();
    let server = RelayServer::start_with(&ca, deadlines(), unlimited(), echo_app().await).await;
    let tls = tls_client(&ca, server.addr, &server.identity).await.expect("tls");
    let (send, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let mut send = send.ready().await.expect("ready");
    let req = http::Request::connect("10.0.0.2:8080").body(()).expect("request");
    let (resp, mut body) = send.send_request(req, false).expect("send");
    let resp = resp.await.expect("response");
    assert_eq!(resp.status(), 200);
    let mut recv = resp.into_body();
    // An open stream keeps the connection through several idle periods.
    for i in 0..4u8 {
        tokio::time::sleep(SHORT).await;
        send_all(&mut body, Bytes::from(vec![i; 10])).await.expect("stream still open");
        let chunk = recv.data().await.expect("echo").expect("data");
        let _ = recv.flow_control().release_capacity(chunk.len());
    }
    assert!(!conn.is_finished(), "closed while a stream was open");
    body.send_data(Bytes::new(), true).expect("end stream");
    while recv.data().await.is_some() {}
    // Keep the request handle, as a client pool does: only the server's idle deadline ends it.
    drop((body, recv));
    let t0 = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(r.is_ok(), "the idle connection was not closed");
    assert!(t0.elapsed() < SHORT + Duration::from_secs(2), "closed after {:?}", t0.elapsed());
    assert_eq!(ended(&server, 1).await, vec![Ok(Ended::Idle)]);
    drop(send);
}

#[tokio::test]
async fn streams_the_budget_refuses_are_reset_refused_stream() {
    let ca = FakeCa::generate();
    let s = settings();
    let budget = TestBudget::max_streams(s, 2);
    let server =
        RelayServer::start_with(&ca, ServerConfig::new(s), budget, app_that_never_reads().await.0).await;
    let tls = tls_client(&ca, server.addr, &server.identity).await.expect("tls");
    let (send, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    tokio::spawn(conn);
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let mut send = send.clone().ready().await.expect("ready");
        let req = http::Request::connect("10.0.0.2:8080").body(()).expect("request");
        let (resp, body) = send.send_request(req, false).expect("send");
        statuses.push(resp.await.map(|r| r.status().as_u16()).map_err(|e| e.reason()));
        held.push(body);
    }
    assert_eq!(statuses, vec![Ok(200), Ok(200), Err(Some(h2::Reason::REFUSED_STREAM))]);
}

/// The attack in small: a client pushes into an app that never reads, then leaves. The
/// relay must end (and release its buffers) although the app never reads again.
#[tokio::test]
async fn relays_end_when_the_client_leaves_or_resets_although_the_app_never_reads() {
    let ca = FakeCa::generate();
    let (app, held) = app_that_never_reads().await;
    let server = RelayServer::start_with(&ca, ServerConfig::new(settings()), unlimited(), app).await;
    // One connection left abruptly (TCP closed), one stream reset on a connection that stays.
    for leave in [true, false] {
        let tls = tls_client(&ca, server.addr, &server.identity).await.expect("tls");
        let (send, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
        let conn = tokio::spawn(conn);
        let mut send = send.ready().await.expect("ready");
        let req = http::Request::connect("10.0.0.2:8080").body(()).expect("request");
        let (resp, mut body) = send.send_request(req, false).expect("send");
        assert_eq!(resp.await.expect("response").status(), 200);
        // Push until flow control stops us: the app's socket buffers and the window fill up.
        let chunk = Bytes::from(vec![7u8; 256 * 1024]);
        let pushed = tokio::time::timeout(Duration::from_secs(2), async {
            let mut n = 0usize;
            while send_all(&mut body, chunk.clone()).await.is_ok() {
                n += chunk.len();
            }
            n
        })
        .await;
        assert!(pushed.is_err(), "flow control never stopped the client");
        assert_eq!(server.relays.load(Ordering::Acquire), 1, "the relay is running");
        if leave {
            conn.abort();
            drop((body, send));
        } else {
            body.send_reset(h2::Reason::CANCEL);
        }
        let t0 = Instant::now();
        while server.relays.load(Ordering::Acquire) > 0 {
            assert!(t0.elapsed() < Duration::from_secs(2), "relay still running 2 s after the client left");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // The app's side of each relay was reset, not left waiting behind unsent bytes.
    let mut sockets = held.lock().await;
    assert_eq!(sockets.len(), 2);
    for s in sockets.iter_mut() {
        let mut sink = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut sink)).await;
        let r = r.expect("the app's connection ended");
        assert_eq!(
            r.as_ref().map_err(|e| e.kind()).err(),
            Some(std::io::ErrorKind::ConnectionReset),
            "app saw {r:?}"
        );
    }
}
