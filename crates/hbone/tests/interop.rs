//! Ambit's HBONE (its own TLS record layer and HTTP/2, `ambit_hbone`) against the
//! reference stack the proxy used before and Istio's HBONE peers are built on: the `h2` crate
//! over tokio-rustls, as client and as server. Every HTTP/2 feature HBONE peers use is crossed:
//! flow control (small windows both ways, windows changed mid-connection), SETTINGS, PING,
//! GOAWAY (graceful, with streams in flight), RST_STREAM, CONTINUATION and large header blocks,
//! the peer's stream limit, and bulk data whose every byte is checked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ambit_hbone::testing::{
    EchoServer, RelayServer, TestBudget, echo_app, pool_to, send_all, settings, tls_client,
};
use ambit_hbone::{H2Settings, Reason, ServerConfig, StreamError, Tunnel, TunnelError};
use ambit_identity::{FakeCa, Identity};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use tokio::net::TcpListener;

const T: Duration = Duration::from_secs(20);

fn authority() -> SocketAddr {
    "10.0.0.2:8080".parse().expect("addr")
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| ((i / 7) as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

fn small_windows() -> H2Settings {
    H2Settings { window_size: 65_535, connection_window_size: 65_535, frame_size: 16_384, max_streams: 100 }
}

/// Our server (the relay to an echo app) with `s` as its settings.
async fn our_server(ca: &FakeCa, s: H2Settings) -> RelayServer {
    RelayServer::start_with(ca, ServerConfig::new(s), TestBudget::unlimited(s), echo_app().await).await
}

type H2Client =
    (h2::client::SendRequest<Bytes>, tokio::sync::mpsc::UnboundedSender<u32>, Option<h2::PingPong>);

/// An `h2` client over tokio-rustls; the sender takes new window sizes for the connection.
async fn h2_client(
    ca: &FakeCa,
    addr: SocketAddr,
    server: &Identity,
    builder: h2::client::Builder,
) -> H2Client {
    let tls = tls_client(ca, addr, server).await.expect("tls");
    let (send, mut conn) = builder.handshake::<_, Bytes>(tls).await.expect("h2 handshake");
    let pp = conn.ping_pong();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = &mut conn => return r,
                Some(w) = rx.recv() => {
                    conn.set_initial_window_size(w).expect("new initial window");
                    conn.set_target_window_size(w);
                }
            }
        }
    });
    (send, tx, pp)
}

async fn h2_connect(
    send: &h2::client::SendRequest<Bytes>,
    headers: &[(&'static str, String)],
) -> Result<(h2::SendStream<Bytes>, h2::RecvStream), h2::Error> {
    let mut send = send.clone().ready().await?;
    let mut req = Request::connect(authority().to_string()).body(()).expect("request");
    for (k, v) in headers {
        req.headers_mut().insert(*k, HeaderValue::from_str(v).expect("value"));
    }
    let (resp, body) = send.send_request(req, false)?;
    let resp = resp.await?;
    assert_eq!(resp.status(), StatusCode::OK);
    Ok((body, resp.into_body()))
}

/// Sends `data` on an `h2` stream and reads it back, concurrently.
async fn h2_echo(body: &mut h2::SendStream<Bytes>, recv: &mut h2::RecvStream, data: &[u8]) {
    let sender = async {
        for part in data.chunks(100_000) {
            send_all(body, Bytes::copy_from_slice(part)).await.expect("send");
        }
    };
    let receiver = async {
        let mut got = Vec::with_capacity(data.len());
        while got.len() < data.len() {
            let chunk = recv.data().await.expect("open").expect("data");
            let _ = recv.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        got
    };
    let ((), got) =
        tokio::time::timeout(T, async { tokio::join!(sender, receiver) }).await.expect("echo in time");
    assert!(got == data, "echoed bytes differ");
}

/// Waits for END_STREAM on an `h2` stream (h2 hands out the empty DATA frame that carries it).
async fn h2_end(recv: &mut h2::RecvStream) {
    let end = tokio::time::timeout(T, async {
        loop {
            match recv.data().await {
                Some(Ok(b)) if b.is_empty() => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("END_STREAM in time");
    assert!(end.is_none(), "data or an error instead of END_STREAM: {end:?}");
}

#[tokio::test]
async fn h2_client_bulk_data_through_small_windows_both_ways() {
    let ca = FakeCa::generate();
    let server = our_server(&ca, small_windows()).await;
    // h2's own windows are small too, so both directions stop and start on flow control.
    let mut b = h2::client::Builder::new();
    b.initial_window_size(16_384).initial_connection_window_size(40_000);
    let (send, _, _) = h2_client(&ca, server.addr, &server.identity, b).await;
    let (mut body, mut recv) = h2_connect(&send, &[]).await.expect("CONNECT");
    h2_echo(&mut body, &mut recv, &pattern(8 << 20, 1)).await;
    // A second stream on the same connection while the first is still open.
    let (mut body2, mut recv2) = h2_connect(&send, &[]).await.expect("second CONNECT");
    h2_echo(&mut body2, &mut recv2, &pattern(1 << 20, 2)).await;
    // END_STREAM passes through to the app (FIN) and back.
    body.send_data(Bytes::new(), true).expect("end");
    h2_end(&mut recv).await;
}

#[tokio::test]
async fn h2_client_changes_its_windows_mid_connection_and_pings() {
    let ca = FakeCa::generate();
    let server = our_server(&ca, settings()).await;
    let mut b = h2::client::Builder::new();
    b.initial_window_size(65_535).initial_connection_window_size(65_535);
    let (send, windows, pp) = h2_client(&ca, server.addr, &server.identity, b).await;
    let (mut body, mut recv) = h2_connect(&send, &[]).await.expect("CONNECT");
    h2_echo(&mut body, &mut recv, &pattern(1 << 20, 3)).await;
    // New SETTINGS_INITIAL_WINDOW_SIZE and a connection WINDOW_UPDATE with a stream open.
    windows.send(4 << 20).expect("send");
    h2_echo(&mut body, &mut recv, &pattern(4 << 20, 4)).await;
    let mut pp = pp.expect("ping_pong");
    tokio::time::timeout(T, pp.ping(h2::Ping::opaque())).await.expect("pong in time").expect("pong");
}

#[tokio::test]
async fn h2_client_sees_our_graceful_goaway_and_finishes_its_stream() {
    let ca = FakeCa::generate();
    let server = EchoServer::start(&ca, settings()).await;
    let (send, _, _) = h2_client(&ca, server.addr, &server.identity, h2::client::Builder::new()).await;
    let (mut body, mut recv) = h2_connect(&send, &[]).await.expect("CONNECT");
    server.drain.clone().begin();
    // The stream opened before the GOAWAY keeps working.
    h2_echo(&mut body, &mut recv, &pattern(300_000, 5)).await;
    // A new stream on this connection is refused: h2 reports the GOAWAY.
    let refused = tokio::time::timeout(T, async {
        loop {
            match h2_connect(&send, &[]).await {
                Err(e) => return e,
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
    .expect("refused in time");
    assert!(refused.is_go_away() || refused.reason() == Some(h2::Reason::REFUSED_STREAM), "{refused}");
    body.send_data(Bytes::new(), true).expect("end");
    h2_end(&mut recv).await;
}

#[tokio::test]
async fn h2_client_resets_one_stream_and_the_others_go_on() {
    let ca = FakeCa::generate();
    let server = our_server(&ca, settings()).await;
    let (send, _, _) = h2_client(&ca, server.addr, &server.identity, h2::client::Builder::new()).await;
    let (mut body, mut recv) = h2_connect(&send, &[]).await.expect("CONNECT");
    let (mut gone, _gone_recv) = h2_connect(&send, &[]).await.expect("CONNECT");
    send_all(&mut gone, Bytes::from(vec![1u8; 100_000])).await.expect("send");
    gone.send_reset(h2::Reason::CANCEL);
    h2_echo(&mut body, &mut recv, &pattern(2 << 20, 6)).await;
    let t0 = std::time::Instant::now();
    while server.relays.load(Ordering::Acquire) > 1 {
        assert!(t0.elapsed() < T, "the reset stream's relay did not end");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn h2_client_headers_in_continuation_frames_and_over_our_limit() {
    let ca = FakeCa::generate();
    // 16 KiB frames: a 40 KiB header block needs HEADERS and CONTINUATION frames.
    let server = our_server(&ca, small_windows()).await;
    let (send, _, _) = h2_client(&ca, server.addr, &server.identity, h2::client::Builder::new()).await;
    let big = "v".repeat(40 * 1024);
    let (mut body, mut recv) =
        h2_connect(&send, &[("x-large", big)]).await.expect("CONNECT with large headers");
    h2_echo(&mut body, &mut recv, b"after large headers").await;
    // Over our 64 KiB header list: that stream is refused, the connection stays.
    let huge = "h".repeat(70 * 1024);
    let err = h2_connect(&send, &[("x-huge", huge)]).await.expect_err("refused");
    assert_eq!(err.reason(), Some(h2::Reason::PROTOCOL_ERROR), "{err}");
    let (mut body, mut recv) = h2_connect(&send, &[]).await.expect("the connection still serves");
    h2_echo(&mut body, &mut recv, b"still here").await;
}

// ---- Our client against an h2 server ----

#[derive(Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    Echo,
    /// Answers 200 with a header of this many bytes, then echoes.
    LargeHeaders(usize),
    /// Answers 200, then resets the stream with CANCEL.
    Reset,
    /// Answers 401.
    Deny,
}

struct H2Server {
    addr: SocketAddr,
    identity: Identity,
    accepted: Arc<AtomicUsize>,
    shutdown: Arc<tokio::sync::Notify>,
    /// PINGs the server sent that came back.
    pongs: Arc<AtomicUsize>,
}

async fn h2_server(ca: &FakeCa, builder: h2::server::Builder, behaviour: Behaviour) -> H2Server {
    h2_server_with(ca, builder, behaviour, None).await
}

/// The same; with `key_updates`, its TLS layer asks for a KeyUpdate with its first record after
/// the handshake and every so many records (counted in the server's `key_updates`).
async fn h2_server_with(
    ca: &FakeCa,
    builder: h2::server::Builder,
    behaviour: Behaviour,
    key_updates: Option<(usize, Arc<AtomicUsize>)>,
) -> H2Server {
    let identity = Identity::new("cluster.local", "default", "h2-server");
    let cert = ca.issue(&identity, Duration::from_secs(3600)).expect("issue");
    let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config());
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let pongs = Arc::new(AtomicUsize::new(0));
    let (n, sd, pg) = (accepted.clone(), shutdown.clone(), pongs.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let key_updates = key_updates.clone();
            // As every HBONE server (ztunnel, ours): without it, Nagle holds small frames
            // (WINDOW_UPDATE) behind unacknowledged data.
            let _ = tcp.set_nodelay(true);
            n.fetch_add(1, Ordering::AcqRel);
            let (acceptor, builder, sd, pg) = (acceptor.clone(), builder.clone(), sd.clone(), pg.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let tls = KeyUpdating::new(tokio_rustls::TlsStream::Server(tls), key_updates);
                let Ok(mut conn) = builder.handshake::<_, Bytes>(tls).await else { return };
                if let Some(mut pp) = conn.ping_pong() {
                    tokio::spawn(async move {
                        if pp.ping(h2::Ping::opaque()).await.is_ok() {
                            pg.fetch_add(1, Ordering::AcqRel);
                        }
                    });
                }
                let mut shut = false;
                loop {
                    let next = tokio::select! {
                        next = conn.accept() => next,
                        () = sd.notified(), if !shut => {
                            shut = true;
                            conn.graceful_shutdown();
                            continue;
                        }
                    };
                    let Some(Ok((req, respond))) = next else { return };
                    tokio::spawn(serve_h2(req, respond, behaviour));
                }
            });
        }
    });
    H2Server { addr, identity, accepted, shutdown, pongs }
}

async fn serve_h2(req: Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>, b: Behaviour) {
    assert_eq!(req.method(), http::Method::CONNECT);
    assert_eq!(req.uri().authority().map(|a| a.as_str()), Some("10.0.0.2:8080"));
    assert_eq!(req.headers().get("x-from").map(|v| v.as_bytes()), Some(&b"ambit"[..]));
    let mut resp = Response::builder().status(if b == Behaviour::Deny { 401 } else { 200 });
    if let Behaviour::LargeHeaders(n) = b {
        resp = resp.header("x-large", "L".repeat(n));
    }
    let Ok(mut send) = respond.send_response(resp.body(()).expect("response"), b == Behaviour::Deny) else {
        return;
    };
    if b == Behaviour::Reset {
        tokio::time::sleep(Duration::from_millis(50)).await;
        send.send_reset(h2::Reason::CANCEL);
        return;
    }
    let mut recv = req.into_body();
    while let Some(Ok(chunk)) = recv.data().await {
        let _ = recv.flow_control().release_capacity(chunk.len());
        if send_all(&mut send, chunk).await.is_err() {
            return;
        }
    }
    let _ = send.send_data(Bytes::new(), true);
}

fn from_ambit() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-from", HeaderValue::from_static("ambit"));
    h
}

/// Sends `data` through our tunnel and reads it back.
async fn our_echo(t: &Tunnel, data: &[u8]) {
    let sender = async { t.stream.send(data).await.expect("send") };
    let receiver = async {
        let mut got = Vec::with_capacity(data.len());
        while got.len() < data.len() {
            got.extend_from_slice(&t.stream.recv().await.expect("open").expect("data"));
        }
        got
    };
    let ((), got) =
        tokio::time::timeout(T, async { tokio::join!(sender, receiver) }).await.expect("echo in time");
    assert!(got == data, "echoed bytes differ");
}

#[tokio::test]
async fn our_client_bulk_data_through_an_h2_server_with_small_windows() {
    let ca = Arc::new(FakeCa::generate());
    let mut b = h2::server::Builder::new();
    b.initial_window_size(16_384).initial_connection_window_size(30_000).max_frame_size(16_384);
    let server = h2_server(&ca, b, Behaviour::Echo).await;
    let (pool, key) = pool_to(ca.clone(), server.addr, &server.identity, small_windows());
    let t = pool.connect(&key, authority(), &from_ambit()).await.expect("tunnel");
    our_echo(&t, &pattern(8 << 20, 7)).await;
    // END_STREAM both ways.
    t.stream.finish().expect("finish");
    assert!(tokio::time::timeout(T, t.stream.recv()).await.expect("end in time").is_none());
    // The h2 server's PING was answered by our connection.
    let t0 = std::time::Instant::now();
    while server.pongs.load(Ordering::Acquire) == 0 {
        assert!(t0.elapsed() < T, "the server's PING went unanswered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn our_client_keeps_to_the_h2_servers_stream_limit() {
    let ca = Arc::new(FakeCa::generate());
    let mut b = h2::server::Builder::new();
    b.max_concurrent_streams(1);
    let server = h2_server(&ca, b, Behaviour::Echo).await;
    let (pool, key) = pool_to(ca.clone(), server.addr, &server.identity, settings());
    let t1 = pool.connect(&key, authority(), &from_ambit()).await.expect("t1");
    our_echo(&t1, b"one").await;
    let t2 = pool.connect(&key, authority(), &from_ambit()).await.expect("t2");
    our_echo(&t2, b"two").await;
    assert_eq!(server.accepted.load(Ordering::Acquire), 2, "a second stream needs a second connection");
}

#[tokio::test]
async fn our_client_moves_to_a_fresh_connection_after_the_h2_servers_goaway() {
    let ca = Arc::new(FakeCa::generate());
    let server = h2_server(&ca, h2::server::Builder::new(), Behaviour::Echo).await;
    let (pool, key) = pool_to(ca.clone(), server.addr, &server.identity, settings());
    let held = pool.connect(&key, authority(), &from_ambit()).await.expect("held");
    our_echo(&held, b"before").await;
    server.shutdown.notify_one();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fresh = pool.connect(&key, authority(), &from_ambit()).await.expect("fresh");
    our_echo(&fresh, b"fresh").await;
    our_echo(&held, &pattern(1 << 20, 8)).await;
    assert_eq!(server.accepted.load(Ordering::Acquire), 2, "the new stream went to a fresh connection");
}

#[tokio::test]
async fn our_client_takes_large_headers_resets_and_denials_from_an_h2_server() {
    let ca = Arc::new(FakeCa::generate());
    // With our 16 KiB frames, a 40 KiB response head comes as HEADERS and CONTINUATION frames.
    let large = h2_server(&ca, h2::server::Builder::new(), Behaviour::LargeHeaders(40 * 1024)).await;
    let (pool, key) = pool_to(ca.clone(), large.addr, &large.identity, small_windows());
    let t = pool.connect(&key, authority(), &from_ambit()).await.expect("tunnel with large headers");
    assert_eq!(t.headers.get("x-large").map(|v| v.len()), Some(40 * 1024));
    our_echo(&t, b"after large headers").await;
    // Over our 64 KiB header list: the stream fails, the connection stays.
    let huge = h2_server(&ca, h2::server::Builder::new(), Behaviour::LargeHeaders(70 * 1024)).await;
    let (pool, key) = pool_to(ca.clone(), huge.addr, &huge.identity, small_windows());
    let err = pool.connect(&key, authority(), &from_ambit()).await.err().expect("refused");
    assert_eq!(err.to_string(), "http2 error: header list larger than 65536 bytes");

    let reset = h2_server(&ca, h2::server::Builder::new(), Behaviour::Reset).await;
    let (pool, key) = pool_to(ca.clone(), reset.addr, &reset.identity, settings());
    let t = pool.connect(&key, authority(), &from_ambit()).await.expect("tunnel");
    let r = tokio::time::timeout(T, t.stream.recv()).await.expect("reset in time");
    assert_eq!(r.map(|r| r.err()), Some(Some(StreamError::Reset(Reason::CANCEL))));

    let deny = h2_server(&ca, h2::server::Builder::new(), Behaviour::Deny).await;
    let (pool, key) = pool_to(ca.clone(), deny.addr, &deny.identity, settings());
    for _ in 0..3 {
        let err = pool.connect(&key, authority(), &from_ambit()).await.err().expect("denied");
        assert!(matches!(err, TunnelError::Status(s) if s == StatusCode::UNAUTHORIZED), "{err}");
    }
    assert_eq!(deny.accepted.load(Ordering::Acquire), 1, "denials keep the pooled connection");
}

// ---- Both sides ours: the relays under connection churn ----

/// An app that reads a request, answers `size` bytes and closes (an HTTP/1.0-style server).
async fn answer_and_close_app(size: usize) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind app");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut req = [0u8; 64];
                let mut got = 0;
                while got < 16 {
                    match s.read(&mut req[got..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                let _ = s.write_all(&vec![b'r'; size]).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churned_connections_through_both_relays_end_cleanly_with_every_byte() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = Arc::new(FakeCa::generate());
    let app = answer_and_close_app(1024).await;
    let budget = TestBudget::unlimited(settings());
    let server = RelayServer::start_with(&ca, ServerConfig::new(settings()), budget, app).await;
    let (pool, key) = pool_to(ca.clone(), server.addr, &server.identity, settings());
    // The client side: each accepted connection is relayed through a pooled tunnel, as the
    // outbound listener does.
    let front = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let front_addr = front.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = front.accept().await {
            let _ = s.set_nodelay(true);
            let (pool, key) = (pool.clone(), key.clone());
            tokio::spawn(async move {
                let Ok(t) = pool.connect(&key, authority(), &HeaderMap::new()).await else { return };
                let _ = t.stream.relay(s, Arc::new(ambit_hbone::testing::Counted::default())).await;
            });
        }
    });
    let bad = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..16 {
        let bad = bad.clone();
        clients.push(tokio::spawn(async move {
            for _ in 0..100 {
                let mut s = tokio::net::TcpStream::connect(front_addr).await.expect("connect");
                s.write_all(b"GET /1k HTTP/1.0").await.expect("request");
                let mut got = Vec::new();
                match s.read_to_end(&mut got).await {
                    Ok(_) if got.len() == 1024 => {}
                    other => {
                        eprintln!("bad answer: {:?} after {} bytes", other.map(|_| ()), got.len());
                        bad.fetch_add(1, Ordering::AcqRel);
                    }
                }
            }
        }));
    }
    for c in clients {
        tokio::time::timeout(Duration::from_secs(60), c).await.expect("in time").expect("client");
    }
    assert_eq!(bad.load(Ordering::Acquire), 0, "connections ended without their whole answer");
}

/// A rustls stream whose sender asks for a KeyUpdate (update_requested) before its first record
/// of application data and then every `every` records, counting them in `done`; without
/// `every`, a plain pass-through.
struct KeyUpdating<S> {
    inner: tokio_rustls::TlsStream<S>,
    every: Option<(usize, Arc<AtomicUsize>)>,
    records: usize,
    started: bool,
}

impl<S> KeyUpdating<S> {
    fn new(inner: tokio_rustls::TlsStream<S>, every: Option<(usize, Arc<AtomicUsize>)>) -> KeyUpdating<S> {
        KeyUpdating { inner, every, records: 0, started: false }
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> tokio::io::AsyncRead for KeyUpdating<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for KeyUpdating<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        if let Some((every, done)) = &me.every
            && (!me.started || me.records >= *every)
        {
            let refreshed = match &mut me.inner {
                tokio_rustls::TlsStream::Client(t) => t.get_mut().1.refresh_traffic_keys(),
                tokio_rustls::TlsStream::Server(t) => t.get_mut().1.refresh_traffic_keys(),
            };
            refreshed.map_err(std::io::Error::other)?;
            done.fetch_add(1, Ordering::AcqRel);
            me.started = true;
            me.records = 0;
        }
        let r = std::pin::Pin::new(&mut me.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            me.records += n.div_ceil(16 * 1024);
        }
        r
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A socket that holds back what is written to it once something was read, until released:
/// a TLS 1.3 client's last flight (Certificate, CertificateVerify, Finished) waits there, so
/// that what the client writes next goes out in the same write.
struct Corked {
    tcp: tokio::net::TcpStream,
    read_once: bool,
    held: Vec<u8>,
    release: bool,
}

impl tokio::io::AsyncRead for Corked {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let me = self.get_mut();
        let r = std::pin::Pin::new(&mut me.tcp).poll_read(cx, buf);
        if matches!(r, std::task::Poll::Ready(Ok(()))) {
            me.read_once = true;
        }
        r
    }
}

impl tokio::io::AsyncWrite for Corked {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        if me.read_once && (!me.release || !me.held.is_empty()) {
            me.held.extend_from_slice(buf);
            return std::task::Poll::Ready(Ok(buf.len()));
        }
        std::pin::Pin::new(&mut me.tcp).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let me = self.get_mut();
        if me.release {
            while !me.held.is_empty() {
                let n = std::task::ready!(std::pin::Pin::new(&mut me.tcp).poll_write(cx, &me.held))?;
                me.held.drain(..n);
            }
            return std::pin::Pin::new(&mut me.tcp).poll_flush(cx);
        }
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// Our server against an `h2` client whose TLS layer sends KeyUpdate(update_requested) in the
/// same write as its Finished, and again every 1 000 records: every byte echoes both ways.
#[tokio::test]
async fn h2_client_sending_key_updates_behind_its_finished_and_every_1000_records() {
    let ca = FakeCa::generate();
    let server = our_server(&ca, settings()).await;
    let client = ca
        .issue(&Identity::new("cluster.local", "default", "client"), Duration::from_secs(3600))
        .expect("issue");
    let tcp = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let corked = Corked { tcp, read_once: false, held: Vec::new(), release: false };
    let connector =
        tokio_rustls::TlsConnector::from(client.client_config(std::slice::from_ref(&server.identity)));
    let name = rustls_pki_types::ServerName::IpAddress(server.addr.ip().into());
    let mut tls = connector.connect(name, corked).await.expect("tls");
    assert!(!tls.get_ref().0.held.is_empty(), "the last flight is held back");
    // KeyUpdate behind the Finished, both in one write.
    tls.get_mut().1.refresh_traffic_keys().expect("key update");
    tls.get_mut().0.release = true;
    tokio::io::AsyncWriteExt::flush(&mut tls).await.expect("flush");
    let updates = Arc::new(AtomicUsize::new(0));
    let tls = KeyUpdating::new(tokio_rustls::TlsStream::Client(tls), Some((1_000, updates.clone())));
    let (send, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    tokio::spawn(conn);
    let (mut body, mut recv) = h2_connect(&send, &[]).await.expect("CONNECT");
    h2_echo(&mut body, &mut recv, &pattern(40 << 20, 9)).await;
    assert!(updates.load(Ordering::Acquire) >= 3, "KeyUpdates asked: {}", updates.load(Ordering::Acquire));
}

/// Our client against an `h2` server whose TLS layer asks for a KeyUpdate with its first record
/// after the handshake (rustls's server cannot send one before the client's Finished) and every
/// 1 000 records: every byte echoes both ways.
#[tokio::test]
async fn h2_server_sending_key_updates_after_its_handshake_and_every_1000_records() {
    let ca = Arc::new(FakeCa::generate());
    let updates = Arc::new(AtomicUsize::new(0));
    let server =
        h2_server_with(&ca, h2::server::Builder::new(), Behaviour::Echo, Some((1_000, updates.clone())))
            .await;
    let (pool, key) = pool_to(ca.clone(), server.addr, &server.identity, settings());
    let t = pool.connect(&key, authority(), &from_ambit()).await.expect("tunnel");
    our_echo(&t, &pattern(40 << 20, 10)).await;
    assert!(updates.load(Ordering::Acquire) >= 3, "KeyUpdates asked: {}", updates.load(Ordering::Acquire));
}
