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
