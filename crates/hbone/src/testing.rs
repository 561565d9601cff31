//! Test helpers (never shipped): HBONE echo and relay servers on loopback, a pool that trusts
//! them, a peer budget and a drain for tests, and TLS clients for hand-built HBONE peers.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use ambit_identity::{CertManager, CertSigner, FakeCa, Identity};
use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};

use crate::pool::{Dialed, Dialer, Pool, PoolKey, Tunnel};
use crate::server::{self, PeerBudget, Shutdown, Windows};
use crate::{H2Settings, RelayCounters};

/// ztunnel's default HTTP/2 settings.
pub fn settings() -> H2Settings {
    H2Settings {
        window_size: 4 << 20,
        connection_window_size: 16 << 20,
        frame_size: 1 << 20,
        max_streams: 100,
    }
}

/// A peer budget for tests: fixed windows and, optionally, a cap on the streams open at once
/// across every connection made from the same budget.
#[derive(Clone)]
pub struct TestBudget {
    windows: Windows,
    open: Arc<AtomicU32>,
    max_streams: u32,
}

impl TestBudget {
    /// The windows of `settings`, no cap.
    pub fn unlimited(settings: H2Settings) -> TestBudget {
        TestBudget::max_streams(settings, u32::MAX)
    }

    /// The windows of `settings`, at most `max` streams open at once.
    pub fn max_streams(settings: H2Settings, max: u32) -> TestBudget {
        TestBudget {
            windows: Windows { stream: settings.window_size, connection: settings.connection_window_size },
            open: Arc::default(),
            max_streams: max,
        }
    }
}

/// A stream slot of a [`TestBudget`].
pub struct TestSlot(Arc<AtomicU32>);

impl Drop for TestSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl PeerBudget for TestBudget {
    type Slot = TestSlot;

    fn windows(&mut self) -> Windows {
        self.windows
    }

    fn grow(&mut self) -> Option<Windows> {
        None
    }

    fn open_stream(&mut self) -> Option<TestSlot> {
        let max = self.max_streams;
        self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(TestSlot(self.open.clone()))
    }
}

/// A drain for tests: [`TestDrain::begin`] starts it; it is never forced.
#[derive(Clone)]
pub struct TestDrain(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for TestDrain {
    fn default() -> TestDrain {
        TestDrain(Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl TestDrain {
    /// Starts the drain: servers send GOAWAY.
    pub fn begin(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown for TestDrain {
    async fn started(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|started| *started).await;
    }

    async fn forced(&self) {
        std::future::pending::<()>().await
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        tokio::spawn(task);
    }
}

/// Connects with plain tokio sockets (TCP_NODELAY set, as every HBONE peer does).
pub struct TcpDialer;

impl Dialer for TcpDialer {
    fn dial(&self, dst: SocketAddr) -> Pin<Box<dyn Future<Output = std::io::Result<Dialed>> + Send + '_>> {
        Box::pin(async move {
            let tcp = TcpStream::connect(dst).await?;
            tcp.set_nodelay(true)?;
            Ok(Dialed { tcp, guard: Box::new(()) })
        })
    }
}

/// Counts a relay's bytes.
#[derive(Debug, Default)]
pub struct Counted {
    /// Bytes from the app into the stream.
    pub from_app: AtomicUsize,
    /// Bytes from the stream to the app.
    pub to_app: AtomicUsize,
}

impl RelayCounters for Counted {
    fn app_to_stream(&self, n: usize) {
        self.from_app.fetch_add(n, Ordering::Relaxed);
    }

    fn stream_to_app(&self, n: usize) {
        self.to_app.fetch_add(n, Ordering::Relaxed);
    }
}

/// The identity test servers present.
pub fn server_identity() -> Identity {
    Identity::new("cluster.local", "default", "server")
}

/// An HBONE server on 127.0.0.1 that answers every CONNECT with 200 and echoes the stream.
pub struct EchoServer {
    /// Listening address.
    pub addr: SocketAddr,
    /// The server's identity.
    pub identity: Identity,
    /// Drain signal of every connection the server accepted.
    pub drain: TestDrain,
    /// TCP connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
}

impl EchoServer {
    /// Starts the server with a certificate from `ca`.
    pub async fn start(ca: &FakeCa, settings: H2Settings) -> EchoServer {
        let identity = server_identity();
        let cert = ca.issue(&identity, Duration::from_secs(3600)).expect("test CA issues");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let config = cert.server_config();
        let drain = TestDrain::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (d, n) = (drain.clone(), accepted.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                n.fetch_add(1, Ordering::Relaxed);
                let _ = tcp.set_nodelay(true);
                let (config, d) = (config.clone(), d.clone());
                tokio::spawn(async move {
                    let Ok(tls) = crate::tls::accept(&tcp, config).await else {
                        return;
                    };
                    let cfg = server::ServerConfig::new(settings);
                    let budget = TestBudget::unlimited(settings);
                    let _ = server::serve(tcp, tls, cfg, budget, &d, |req| async move {
                        let stream = req.stream;
                        if stream.respond(200, &http::HeaderMap::new(), false).is_err() {
                            return;
                        }
                        while let Some(Ok(chunk)) = stream.recv().await {
                            if stream.send(&chunk).await.is_err() {
                                return;
                            }
                        }
                        let _ = stream.finish();
                    })
                    .await;
                });
            }
        });
        EchoServer { addr, identity, drain, accepted }
    }
}

/// An HBONE server on 127.0.0.1 that relays every CONNECT stream to a TCP app, as the proxy's
/// inbound handler does.
pub struct RelayServer {
    /// Listening address of the HBONE side.
    pub addr: SocketAddr,
    /// The server's identity.
    pub identity: Identity,
    /// Relays running now.
    pub relays: Arc<AtomicUsize>,
    /// How each connection's `serve` ended, in order.
    pub ended: Arc<std::sync::Mutex<Vec<Result<server::Ended, String>>>>,
}

impl RelayServer {
    /// Starts the relay and a TCP echo app, with default deadlines and no caps.
    pub async fn start(ca: &FakeCa, settings: H2Settings) -> RelayServer {
        let echo_addr = echo_app().await;
        let budget = TestBudget::unlimited(settings);
        RelayServer::start_with(ca, server::ServerConfig::new(settings), budget, echo_addr).await
    }

    /// Starts the relay to `app` with deadlines `cfg`; every connection gets a clone of `budget`.
    pub async fn start_with(
        ca: &FakeCa,
        cfg: server::ServerConfig,
        budget: TestBudget,
        app: SocketAddr,
    ) -> RelayServer {
        let identity = server_identity();
        let cert = ca.issue(&identity, Duration::from_secs(3600)).expect("test CA issues");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let config = cert.server_config();
        let relays = Arc::new(AtomicUsize::new(0));
        let ended = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (relays2, ended2) = (relays.clone(), ended.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                let (config, budget, relays, ended) =
                    (config.clone(), budget.clone(), relays2.clone(), ended2.clone());
                tokio::spawn(async move {
                    let Ok(tls) = crate::tls::accept(&tcp, config).await else {
                        return;
                    };
                    let r = server::serve(tcp, tls, cfg, budget, &TestDrain::default(), move |req| {
                        let relays = relays.clone();
                        async move {
                            let Ok(app) = TcpStream::connect(app).await else {
                                return;
                            };
                            let _ = app.set_nodelay(true);
                            if req.stream.respond(200, &http::HeaderMap::new(), false).is_err() {
                                return;
                            }
                            relays.fetch_add(1, Ordering::AcqRel);
                            let _ = req.stream.relay(app, Arc::new(Counted::default())).await;
                            relays.fetch_sub(1, Ordering::AcqRel);
                        }
                    })
                    .await;
                    ended.lock().unwrap_or_else(|p| p.into_inner()).push(r.map_err(|e| e.to_string()));
                });
            }
        });
        RelayServer { addr, identity, relays, ended }
    }
}

/// A TCP app on 127.0.0.1 that echoes every connection until it ends.
pub async fn echo_app() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind echo app");
    let addr = l.local_addr().expect("echo addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A TLS connection to an HBONE server at `addr` (presenting `server`), with a certificate for
/// `default/client` from `ca`, through tokio-rustls: for hand-built HBONE clients (the `h2`
/// crate's, in interoperability tests).
pub async fn tls_client(
    ca: &FakeCa,
    addr: SocketAddr,
    server: &Identity,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let client = Identity::new("cluster.local", "default", "client");
    let cert = ca.issue(&client, Duration::from_secs(3600)).map_err(std::io::Error::other)?;
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    tokio_rustls::TlsConnector::from(cert.client_config(std::slice::from_ref(server)))
        .connect(rustls_pki_types::ServerName::IpAddress(addr.ip().into()), tcp)
        .await
}

/// A pool whose certificates come from `ca`, and the key to reach `server` as `client`.
pub fn pool_for(ca: Arc<FakeCa>, server: &EchoServer, settings: H2Settings) -> (Arc<Pool>, PoolKey) {
    pool_to(ca, server.addr, &server.identity, settings)
}

/// A pool whose certificates come from `ca` (idle connections kept 300 s), and the key to reach
/// the HBONE server at `addr` (presenting `identity`) as `client`.
pub fn pool_to(
    ca: Arc<FakeCa>,
    addr: SocketAddr,
    identity: &Identity,
    settings: H2Settings,
) -> (Arc<Pool>, PoolKey) {
    let signer: Arc<dyn CertSigner> = ca;
    let certs = CertManager::new(signer, Duration::from_secs(3600));
    let pool = Pool::new(certs, Box::new(TcpDialer), settings, Duration::from_secs(300));
    let key = PoolKey {
        src_identity: Identity::new("cluster.local", "default", "client"),
        dst_identities: vec![identity.clone()],
        dst: addr,
        src_ip: Ipv4Addr::LOCALHOST.into(),
    };
    (pool, key)
}

/// Sends a whole chunk on an `h2` stream, waiting for flow-control capacity (for tests that
/// speak to an HBONE server through the `h2` crate).
pub async fn send_all(send: &mut h2::SendStream<Bytes>, mut chunk: Bytes) -> Result<(), h2::Error> {
    while !chunk.is_empty() {
        send.reserve_capacity(chunk.len());
        let n = match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(e),
            None => return Err(h2::Error::from(h2::Reason::CANCEL)),
        };
        let part = chunk.split_to(n.min(chunk.len()));
        send.send_data(part, false)?;
    }
    Ok(())
}

/// Sends `payload` through the tunnel and reads the same number of bytes back.
pub async fn echo_once(t: &mut Tunnel, payload: &Bytes) {
    t.stream.send(payload).await.expect("send");
    let mut got = 0;
    while got < payload.len() {
        let chunk = t.stream.recv().await.expect("stream open").expect("data");
        got += chunk.len();
    }
}

/// The wire as a test writes it by hand: frame kinds, flags and writers, and the records of
/// [`RawPeer`].
pub mod wire {
    pub use crate::frame::{
        HEADER_LEN, PREFACE, Reason, data_end, flag, goaway, kind, ping, rst_stream, setting, settings,
        settings_ack, window_update,
    };
    pub use crate::tls::{Alert, MAX_CONTENT};

    /// Record content types.
    pub mod content {
        /// change_cipher_spec.
        pub const CHANGE_CIPHER_SPEC: u8 = 20;
        /// alert.
        pub const ALERT: u8 = 21;
        /// handshake.
        pub const HANDSHAKE: u8 = 22;
        /// application_data.
        pub const APPLICATION_DATA: u8 = 23;
    }

    /// One frame.
    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; HEADER_LEN];
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        crate::frame::Head { len, kind, flags, stream }.encode(&mut v);
        v.extend_from_slice(payload);
        v
    }

    /// The client preface and an empty SETTINGS frame.
    pub fn client_preface() -> Vec<u8> {
        let mut v = PREFACE.to_vec();
        settings(&mut v, &[]);
        v
    }

    /// A CONNECT request's header block (as Ambit's client writes it).
    pub fn connect_block(authority: &str) -> Vec<u8> {
        let mut b = Vec::new();
        crate::hpack::Encoder::default().connect(&mut b, authority, &http::HeaderMap::new());
        b
    }

    /// A header block of literal fields (without indexing), in order, pseudo-headers included:
    /// for heads our encoder would never write.
    pub fn literal_block(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut b = Vec::new();
        for (name, value) in fields {
            b.push(0);
            for s in [name.as_bytes(), value.as_bytes()] {
                // Lengths under 127 fit the 7-bit prefix.
                b.push(u8::try_from(s.len()).unwrap_or(127).min(126));
                b.extend_from_slice(&s[..s.len().min(126)]);
            }
        }
        b
    }
}

/// What a [`RawPeer`] saw the server send.
#[derive(Debug, Default)]
pub struct Seen {
    /// Every frame but DATA, in order: kind, flags, stream and payload.
    pub frames: Vec<(u8, u8, u32, Vec<u8>)>,
    /// DATA frames per stream (their number), in order of arrival.
    pub data_frames: Vec<u32>,
    /// DATA frames in order of arrival: stream, payload length, END_STREAM.
    pub data: Vec<(u32, u32, bool)>,
    /// KeyUpdate messages received.
    pub key_updates: usize,
    /// The fatal alert that ended the connection.
    pub alert: Option<crate::tls::Alert>,
    /// close_notify arrived.
    pub close_notify: bool,
    /// The socket reached its end (FIN or reset).
    pub closed: bool,
    /// Why reading stopped, when the server broke the protocol as we see it.
    pub error: Option<String>,
}

impl Seen {
    /// The RST_STREAMs received: (stream, code).
    pub fn resets(&self) -> Vec<(u32, crate::Reason)> {
        self.frames
            .iter()
            .filter(|f| f.1 == 0 && f.0 == crate::frame::kind::RST_STREAM && f.3.len() == 4)
            .map(|f| (f.2, crate::Reason(u32::from_be_bytes([f.3[0], f.3[1], f.3[2], f.3[3]]))))
            .collect()
    }

    /// The last GOAWAY: (last stream, code).
    pub fn goaway(&self) -> Option<(u32, crate::Reason)> {
        self.frames.iter().rev().find(|f| f.0 == crate::frame::kind::GOAWAY && f.3.len() >= 8).map(|f| {
            let p = &f.3;
            (
                u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff,
                crate::Reason(u32::from_be_bytes([p[4], p[5], p[6], p[7]])),
            )
        })
    }

    /// Whether a PING acknowledgement with `payload` arrived.
    pub fn pong(&self, payload: &[u8; 8]) -> bool {
        self.frames
            .iter()
            .any(|f| f.0 == crate::frame::kind::PING && f.1 & crate::frame::flag::ACK != 0 && f.3 == payload)
    }
}

/// A hand-driven HBONE client for tests that play a misbehaving peer: rustls runs the handshake
/// (with a client certificate), then the test lays out records one by one (any content type,
/// any content, KeyUpdates asked for or not) and everything the server sends is opened and
/// summed up in [`Seen`].
pub struct RawPeer {
    tcp: TcpStream,
    sealer: crate::tls::Sealer,
    session: crate::tls::Session,
    inbox: Vec<u8>,
    reader: crate::frame::Reader,
    /// What the server sent so far.
    pub seen: Seen,
}

impl RawPeer {
    /// A TLS connection to `addr` (which must present `server`) with `cert`.
    pub async fn connect(
        cert: &ambit_identity::WorkloadCertificate,
        addr: SocketAddr,
        server: &Identity,
    ) -> Result<RawPeer, crate::TlsError> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        RawPeer::over(tcp, cert, server).await
    }

    /// The same over a connected socket.
    pub async fn over(
        tcp: TcpStream,
        cert: &ambit_identity::WorkloadCertificate,
        server: &Identity,
    ) -> Result<RawPeer, crate::TlsError> {
        let addr = tcp.peer_addr()?;
        let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
        let est = crate::tls::connect(&tcp, cert.client_config(std::slice::from_ref(server)), name).await?;
        Ok(RawPeer {
            tcp,
            sealer: est.sealer,
            session: est.session,
            inbox: est.leftover,
            reader: crate::frame::Reader::new(crate::frame::MAX_MAX_FRAME, 1 << 20),
            seen: Seen::default(),
        })
    }

    /// Waits for the server's SETTINGS (its first frame): what is sent after that is read by the
    /// record layer, not inside the handshake.
    pub async fn settled(&mut self, limit: Duration) -> bool {
        self.read_until(limit, |s| s.frames.iter().any(|f| f.0 == crate::frame::kind::SETTINGS)).await
    }

    /// One record of content type `typ` holding `content`, sealed (not sent).
    pub fn record(&mut self, typ: u8, content: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(content.len() + crate::tls::OVERHEAD);
        self.sealer.seal_raw(&mut out, typ, content).expect("seal a record");
        out
    }

    /// One record of `content`, content type `typ` and `padding` zero bytes, however large,
    /// sealed (not sent).
    pub fn padded(&mut self, typ: u8, content: &[u8], padding: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.sealer.seal_padded(&mut out, typ, content, padding);
        out
    }

    /// `plain` as application-data records of at most 16 KiB, sealed (not sent).
    pub fn data(&mut self, plain: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plain.len() + plain.len() / 1000 + 64);
        for chunk in plain.chunks(crate::tls::MAX_CONTENT) {
            self.sealer.seal_raw(&mut out, wire::content::APPLICATION_DATA, chunk).expect("seal");
        }
        out
    }

    /// A KeyUpdate asking the server to update too; our sending key moves on (not sent).
    pub fn request_key_update(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.sealer.request_key_update(&mut out).expect("key update");
        out
    }

    /// A KeyUpdate not asking for one in return; our sending key moves on (not sent).
    pub fn key_update(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.sealer.key_update(&mut out).expect("key update");
        out
    }

    /// Writes `bytes` to the server.
    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        crate::tls::write_all(&self.tcp, bytes).await
    }

    /// The socket (to read its options, or to write to it piece by piece).
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Writes `bytes` while reading what the server sends (a server may close before it read
    /// them all: the writing then stops), until `done` holds, the connection ends or `limit`
    /// passes; returns whether `done` held.
    pub async fn send_reading(
        &mut self,
        bytes: &[u8],
        limit: Duration,
        done: impl Fn(&Seen) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        let mut rest = bytes;
        let mut buf = vec![0u8; 64 * 1024];
        while !rest.is_empty() && !self.seen.closed {
            let ready = tokio::select! {
                r = self.tcp.ready(tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE) => r,
                () = tokio::time::sleep_until(deadline) => return done(&self.seen),
            };
            let Ok(ready) = ready else { break };
            if ready.is_writable() {
                match self.tcp.try_write(rest) {
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => break,
                }
            }
            if ready.is_readable() {
                match self.tcp.try_read(&mut buf) {
                    Ok(0) => self.seen.closed = true,
                    Ok(n) => {
                        self.inbox.extend_from_slice(&buf[..n]);
                        self.open_inbox();
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => self.seen.closed = true,
                }
            }
        }
        self.read_until(deadline.saturating_duration_since(tokio::time::Instant::now()), done).await
    }

    /// Reads what the server sends until `done` holds for what was seen, the connection ends,
    /// or `limit` passes; returns whether `done` held.
    pub async fn read_until(&mut self, limit: Duration, done: impl Fn(&Seen) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if done(&self.seen) {
                return true;
            }
            if self.seen.closed || self.seen.error.is_some() {
                return false;
            }
            let n = match tokio::time::timeout_at(deadline, async {
                loop {
                    self.tcp.readable().await?;
                    match self.tcp.try_read(&mut buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        r => return r,
                    }
                }
            })
            .await
            {
                Err(_) => return done(&self.seen),
                Ok(Ok(0)) | Ok(Err(_)) => {
                    self.seen.closed = true;
                    continue;
                }
                Ok(Ok(n)) => n,
            };
            self.inbox.extend_from_slice(&buf[..n]);
            self.open_inbox();
        }
    }

    fn open_inbox(&mut self) {
        let mut at = 0;
        while let Ok(Some(len)) = crate::tls::record_len(&self.inbox[at..]) {
            if self.inbox.len() < at + len {
                break;
            }
            let rec = &mut self.inbox[at..at + len];
            at += len;
            match self.session.open(rec) {
                Ok(crate::tls::Content::Data(r)) => {
                    let plain = rec[r].to_vec();
                    self.frames(&plain);
                }
                Ok(crate::tls::Content::Handshake(r)) => {
                    if rec[r.clone()].first() == Some(&24) {
                        self.seen.key_updates += 1;
                    }
                    let bytes = rec[r].to_vec();
                    if let Err(e) = self.session.handshake(&bytes, &mut self.sealer) {
                        self.seen.error = Some(e.to_string());
                    }
                }
                Ok(crate::tls::Content::CloseNotify) => self.seen.close_notify = true,
                Ok(crate::tls::Content::UserCanceled) => {}
                Err(crate::TlsError::Alert(a)) => self.seen.alert = Some(a),
                Err(e) => self.seen.error = Some(e.to_string()),
            }
        }
        self.inbox.drain(..at);
    }

    fn frames(&mut self, mut input: &[u8]) {
        use crate::frame::Event;
        while let Some(ev) = self.reader.next(&mut input) {
            match ev {
                Ok(Event::DataStart { stream, flow }) => {
                    self.seen.data_frames.push(stream);
                    self.seen.data.push((stream, flow, false));
                }
                Ok(Event::DataEnd { end_stream, .. }) => {
                    if let Some(last) = self.seen.data.last_mut() {
                        last.2 = end_stream;
                    }
                }
                Ok(Event::Frame(h, p)) => self.seen.frames.push((h.kind, h.flags, h.stream, p.to_vec())),
                Ok(_) => {}
                Err(e) => self.seen.error = Some(e.to_string()),
            }
        }
    }
}
