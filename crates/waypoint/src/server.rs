//! The waypoint's listener: HBONE in (mTLS, HTTP/2 CONNECT), one destination and port per
//! CONNECT, and by the port's protocol either hyper's HTTP server over the stream (requests then
//! go through [`crate::proxy`]) or a TCP relay after an L4 authorization.
//!
//! CONNECT answers: 400 when `:authority` is not an `ip:port`; 404 when no destination this
//! waypoint serves has that address and port (the node proxy sent traffic here that the
//! configuration does not route to this waypoint; nothing could answer it); for TCP ports, 401
//! when the authorization policies deny the connection (ztunnel's answer to a denied CONNECT)
//! and 503 when no endpoint can be reached.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ambit_hbone::{ConnectRequest, H2Settings, PeerBudget, Pool, ServerConfig, Shutdown, StreamIo, Windows};
use ambit_identity::{CertManager, Identity};
use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};

use crate::authz::{Decision, Request};
use crate::config::{Destination, Port, Protocol, Snapshot, Tunnel};
use crate::io::{DownstreamIo, Sniffed, sniff};
use crate::metrics::Counters;
use crate::proxy::{self, Downstream};
use crate::route::{Balance, pick_endpoint};
use crate::upstream::Upstream;

/// How the waypoint runs: who it is, how it balances, and the limits of its HTTP server.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The waypoint's identity: its HBONE server certificate and its client certificate to node
    /// proxies.
    pub identity: Identity,
    /// The waypoint's IP (the source of its HBONE connections).
    pub local_ip: IpAddr,
    /// `baggage` sent on every upstream CONNECT (the waypoint's own workload attributes).
    pub baggage: Option<HeaderValue>,
    /// Endpoint choice.
    pub balance: Balance,
    /// Istio's `numTrustedProxies`: how many `X-Forwarded-For` hops are trusted for `remote.ip`.
    pub num_trusted_proxies: u32,
    /// HBONE server settings and deadlines.
    pub hbone: ServerConfig,
    /// HTTP server limits.
    pub limits: Limits,
}

/// Limits of the HTTP server a CONNECT stream gets.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request head must arrive within this (HTTP/1.1): slow heads are cut.
    pub header_read_timeout: Duration,
    /// Largest header list (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE; the HTTP/1.1 head buffer).
    /// Bigger heads are answered 431. Envoy's default is 60 KiB.
    pub max_header_list_size: u32,
    /// Most header fields in one HTTP/1.1 request (Envoy: 100); more are answered 431.
    pub max_headers: usize,
    /// HTTP/2 streams open at once per connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 streams the client may reset before we accepted them (rapid reset, CVE-2023-44487).
    pub max_pending_accept_reset_streams: usize,
    /// HTTP/2 streams we may reset because of the client's frames ("MadeYouReset").
    pub max_local_error_reset_streams: usize,
    /// No bytes either way for this long closes the connection.
    pub idle_timeout: Duration,
    /// How long an UNDECLARED port waits for the client's first bytes before it relays TCP.
    pub sniff_timeout: Duration,
    /// Request bodies up to this size are buffered so that a retry can send them again.
    pub max_replay_body: usize,
    /// Once the drain starts, how long an HTTP/1.1 connection still takes requests (each
    /// answered with `Connection: close`) before it is closed if idle: a request already on its
    /// way when the drain began is answered, not lost with the connection.
    pub drain_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            max_header_list_size: 60 * 1024,
            max_headers: 100,
            max_concurrent_streams: 1000,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 1024,
            idle_timeout: Duration::from_secs(300),
            sniff_timeout: Duration::from_secs(5),
            max_replay_body: 64 * 1024,
            drain_grace: Duration::from_secs(1),
        }
    }
}

impl Settings {
    /// Defaults for `identity` on `local_ip`: least-request balancing, no trusted proxies,
    /// ztunnel's HTTP/2 windows and the default [`Limits`].
    pub fn new(identity: Identity, local_ip: IpAddr) -> Settings {
        let settings = H2Settings {
            window_size: 4 << 20,
            connection_window_size: 16 << 20,
            frame_size: 1 << 20,
            max_streams: 100,
        };
        Settings {
            identity,
            local_ip,
            baggage: None,
            balance: Balance::default(),
            num_trusted_proxies: 0,
            hbone: ServerConfig::new(settings),
            limits: Limits::default(),
        }
    }
}

/// The waypoint: its configuration, its HBONE server and its client to endpoints.
#[derive(Clone)]
pub struct Waypoint {
    shared: Arc<Shared>,
}

/// What every connection and request of a waypoint reads.
pub(crate) struct Shared {
    pub(crate) settings: Settings,
    pub(crate) config: ArcSwap<Snapshot>,
    pub(crate) certs: Arc<CertManager>,
    pub(crate) upstream: Arc<Upstream>,
    pub(crate) counters: Counters,
}

/// Fixed windows, no stream cap beyond the HBONE server's own.
struct Budget(Windows);

impl PeerBudget for Budget {
    type Slot = ();

    fn windows(&mut self) -> Windows {
        self.0
    }

    fn grow(&mut self) -> Option<Windows> {
        None
    }

    fn open_stream(&mut self) -> Option<()> {
        Some(())
    }
}

impl Waypoint {
    /// A waypoint with an empty configuration: its certificates come from `certs`, its HBONE
    /// connections to node proxies from `pool` (whose certificates should be `certs` too).
    pub fn new(settings: Settings, certs: Arc<CertManager>, pool: Arc<Pool>) -> Waypoint {
        let upstream = Arc::new(Upstream::new(
            pool,
            settings.identity.clone(),
            settings.local_ip,
            settings.baggage.clone(),
        ));
        Waypoint {
            shared: Arc::new(Shared {
                settings,
                config: ArcSwap::from_pointee(Snapshot::default()),
                certs,
                upstream,
                counters: Counters::default(),
            }),
        }
    }

    /// Replaces the configuration; requests that start from now on see it.
    pub fn set_config(&self, snapshot: Snapshot) {
        self.shared.config.store(Arc::new(snapshot));
    }

    /// The current configuration.
    pub fn config(&self) -> Arc<Snapshot> {
        self.shared.config.load_full()
    }

    /// The request counters.
    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Accepts HBONE connections on `listener` until it fails; each connection runs on its own
    /// task and follows `shutdown`'s drain.
    pub async fn run<S: Shutdown>(&self, listener: TcpListener, shutdown: Arc<S>) -> std::io::Result<()> {
        // Idle upstream HBONE connections go back while the waypoint lives.
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POOL_SWEEP);
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                shared.upstream.release_idle();
            }
        });
        loop {
            let (tcp, peer) = listener.accept().await?;
            let _ = tcp.set_nodelay(true);
            let (shared, shutdown) = (self.shared.clone(), shutdown.clone());
            tokio::spawn(async move {
                if let Err(e) = connection(shared, tcp, peer, shutdown).await {
                    tracing::debug!(%peer, error = %e, "HBONE connection ended");
                }
            });
        }
    }
}

/// How often idle upstream HBONE connections are released.
const POOL_SWEEP: Duration = Duration::from_secs(30);

/// How long the TLS handshake of a downstream connection may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a downstream connection ended early.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("the waypoint's certificate is not available: {0}")]
    Certificate(#[from] ambit_identity::CertError),
    #[error("TLS handshake failed: {0}")]
    Tls(#[from] ambit_hbone::TlsError),
    #[error("TLS handshake not done within {HANDSHAKE_TIMEOUT:?}")]
    HandshakeTimeout,
    #[error("{0}")]
    Serve(#[from] ambit_hbone::ServeError),
}

async fn connection<S: Shutdown>(
    shared: Arc<Shared>,
    tcp: TcpStream,
    peer: SocketAddr,
    shutdown: Arc<S>,
) -> Result<(), ConnectionError> {
    let cert = shared.certs.fetch(&shared.settings.identity).await?;
    let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, ambit_hbone::accept(&tcp, cert.server_config()))
        .await
        .map_err(|_| ConnectionError::HandshakeTimeout)??;
    // The node proxy connects with the source workload's certificate: its identity is the
    // request's source principal.
    let principal = ambit_identity::peer_identity(&tls.peer_certificates).map(|id| id.to_string());
    let ip = peer.ip().to_canonical();
    let ip_header =
        http::HeaderValue::from_str(&ip.to_string()).unwrap_or(http::HeaderValue::from_static("unknown"));
    let source = Arc::new(Source { principal, ip, ip_header });
    let cfg = shared.settings.hbone;
    let budget =
        Budget(Windows { stream: cfg.settings.window_size, connection: cfg.settings.connection_window_size });
    let drain = shutdown.clone();
    ambit_hbone::serve(tcp, tls, cfg, budget, &*shutdown, move |req| {
        let (shared, source, drain) = (shared.clone(), source.clone(), drain.clone());
        async move { on_connect(shared, source, req, drain).await }
    })
    .await?;
    Ok(())
}

/// Who is on the other end of a downstream HBONE connection.
#[derive(Debug)]
pub(crate) struct Source {
    /// The peer's SPIFFE id (`spiffe://…`).
    pub(crate) principal: Option<String>,
    /// The peer's address.
    pub(crate) ip: IpAddr,
    /// The same, as the `x-forwarded-for` value a request without one gets.
    pub(crate) ip_header: http::HeaderValue,
}

async fn on_connect<S: Shutdown>(
    shared: Arc<Shared>,
    source: Arc<Source>,
    req: ConnectRequest,
    drain: Arc<S>,
) {
    if req.head.method.as_deref() != Some("CONNECT") {
        return req.reject(StatusCode::METHOD_NOT_ALLOWED);
    }
    let Some(addr) = req.head.authority.as_deref().and_then(|a| a.parse::<SocketAddr>().ok()) else {
        tracing::debug!(authority = ?req.head.authority, "CONNECT :authority is not ip:port; answered 400");
        return req.reject(StatusCode::BAD_REQUEST);
    };
    let snapshot = shared.config.load_full();
    let Some((destination, port)) = snapshot.bound(addr) else {
        tracing::debug!(%addr, "no destination served by this waypoint at the CONNECT's address; answered 404");
        return req.reject(StatusCode::NOT_FOUND);
    };
    let downstream = Arc::new(Downstream::new(source, addr));
    match port.protocol {
        Protocol::Tcp => tcp(shared, downstream, req, &destination, &port).await,
        Protocol::Undeclared => {
            if req.stream.respond(200, &HeaderMap::new(), false).is_err() {
                return;
            }
            let mut io = req.stream.into_io();
            match sniff(&mut io, shared.settings.limits.sniff_timeout).await {
                Ok((Sniffed::Http, prefix)) => http(shared, downstream, io, prefix, &*drain).await,
                Ok((Sniffed::Tcp, prefix)) => {
                    tcp_after_sniff(shared, downstream, io, prefix, &destination, &port).await
                }
                Err(e) => tracing::debug!(%addr, error = %e, "stream failed before its first bytes"),
            }
        }
        Protocol::Http | Protocol::Http2 | Protocol::Grpc => {
            if req.stream.respond(200, &HeaderMap::new(), false).is_err() {
                return;
            }
            http(shared, downstream, req.stream.into_io(), Bytes::new(), &*drain).await
        }
    }
}

/// Serves HTTP/1.1 or HTTP/2 (detected) over the stream, and follows the drain:
/// - HTTP/2: GOAWAY at once; the requests in flight finish, and the client knows which it must
///   send again.
/// - HTTP/1.1, or nothing read yet: for [`Limits::drain_grace`] the connection still takes
///   requests, each answered with `Connection: close` (the client's next one goes to a new
///   connection), then it closes after the response in flight, or at once when idle. A request
///   that was on its way as the drain began (a new connection's first, or the next one on a
///   keep-alive connection) is answered instead of meeting a close, which a client cannot tell
///   from a request lost after it was read.
async fn http<S: Shutdown>(
    shared: Arc<Shared>,
    downstream: Arc<Downstream>,
    io: StreamIo,
    prefix: Bytes,
    drain: &S,
) {
    let limits = shared.settings.limits;
    let conflict = Arc::new(AtomicBool::new(false));
    let io = DownstreamIo::new(io, prefix, limits.idle_timeout, conflict.clone());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(limits.max_headers)
        .max_buf_size((limits.max_header_list_size as usize).max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_list_size)
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_pending_accept_reset_streams(limits.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(limits.max_local_error_reset_streams);
    let closing = Arc::new(AtomicBool::new(false));
    let http2 = Arc::new(AtomicBool::new(false));
    let (c, h2) = (closing.clone(), http2.clone());
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let (shared, downstream, conflict, closing, http2) =
            (shared.clone(), downstream.clone(), conflict.clone(), c.clone(), h2.clone());
        async move {
            let http1 = req.version() < http::Version::HTTP_2;
            if !http1 {
                http2.store(true, Ordering::Relaxed);
            }
            let connect = req.method() == http::Method::CONNECT;
            let mut resp = proxy::handle(shared, downstream, conflict, req).await;
            let upgraded =
                resp.status() == StatusCode::SWITCHING_PROTOCOLS || (connect && resp.status().is_success());
            if http1 && !upgraded && closing.load(Ordering::Relaxed) {
                resp.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let ended = tokio::select! {
        r = conn.as_mut() => r,
        () = drain.started() => {
            closing.store(true, Ordering::Relaxed);
            let within = if http2.load(Ordering::Relaxed) {
                None
            } else {
                tokio::time::timeout(limits.drain_grace, conn.as_mut()).await.ok()
            };
            match within {
                Some(r) => r,
                None => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "downstream HTTP connection ended");
    }
}

/// The L4 authorization of a TCP connection to `addr`.
fn authorize_connection(destination: &Destination, downstream: &Downstream) -> Decision {
    let headers = HeaderMap::new();
    let request = Request {
        method: "",
        authority: "",
        path: "/",
        headers: &headers,
        source_principal: downstream.source.principal.as_deref(),
        source_ip: downstream.source.ip,
        remote_ip: downstream.source.ip,
        destination_ip: downstream.addr.ip(),
        destination_port: downstream.addr.port(),
        sni: None,
    };
    destination.policies.authorize_connection(&request).decision
}

/// A TCP port: L4 authorization (401 when denied), then a relay to an endpoint.
async fn tcp(
    shared: Arc<Shared>,
    downstream: Arc<Downstream>,
    req: ConnectRequest,
    destination: &Destination,
    port: &Port,
) {
    if let Decision::Deny { policy, reason } = authorize_connection(destination, &downstream) {
        tracing::debug!(addr = %downstream.addr, ?policy, %reason, "TCP connection denied; answered 401");
        shared.counters.connection_denial(policy.as_deref());
        return req.reject(StatusCode::UNAUTHORIZED);
    }
    let upstream = match connect_tcp(&shared, destination, port).await {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(addr = %downstream.addr, error = %e, "no endpoint reachable; answered 503");
            return req.reject(StatusCode::SERVICE_UNAVAILABLE);
        }
    };
    if req.stream.respond(200, &HeaderMap::new(), false).is_err() {
        return;
    }
    shared.counters.tcp_connection();
    relay(req.stream.into_io(), Bytes::new(), upstream).await;
}

/// An UNDECLARED port whose bytes are not HTTP: the CONNECT is answered already, so a denied
/// connection is reset.
async fn tcp_after_sniff(
    shared: Arc<Shared>,
    downstream: Arc<Downstream>,
    io: StreamIo,
    prefix: Bytes,
    destination: &Destination,
    port: &Port,
) {
    if let Decision::Deny { policy, .. } = authorize_connection(destination, &downstream) {
        shared.counters.connection_denial(policy.as_deref());
        io.handle().reset(ambit_hbone::Reason::REFUSED_STREAM);
        return;
    }
    match connect_tcp(&shared, destination, port).await {
        Ok(upstream) => {
            shared.counters.tcp_connection();
            relay(io, prefix, upstream).await;
        }
        Err(e) => {
            tracing::debug!(addr = %downstream.addr, error = %e, "no endpoint reachable; stream reset");
            io.handle().reset(ambit_hbone::Reason::REFUSED_STREAM);
        }
    }
}

/// The upstream side of a TCP relay.
enum TcpUpstream {
    Hbone(StreamIo),
    Plain(TcpStream),
}

async fn connect_tcp(shared: &Shared, destination: &Destination, port: &Port) -> Result<TcpUpstream, String> {
    let endpoint = pick_endpoint(destination, shared.settings.balance, None)
        .ok_or_else(|| format!("{} has no healthy endpoint", destination.resource))?;
    let addr = SocketAddr::new(endpoint.address, endpoint.target_port(port));
    match endpoint.tunnel {
        Tunnel::Hbone => {
            shared.upstream.tunnel(&endpoint, addr).await.map(TcpUpstream::Hbone).map_err(|e| e.to_string())
        }
        Tunnel::None => TcpStream::connect(addr)
            .await
            .map(TcpUpstream::Plain)
            .map_err(|e| format!("connection to {addr} failed: {e}")),
    }
}

async fn relay(down: StreamIo, prefix: Bytes, up: TcpUpstream) {
    use tokio::io::AsyncWriteExt;
    let mut down = down;
    let r = match up {
        TcpUpstream::Hbone(mut up) => {
            if !prefix.is_empty() && up.write_all(&prefix).await.is_err() {
                return;
            }
            tokio::io::copy_bidirectional(&mut down, &mut up).await
        }
        TcpUpstream::Plain(mut up) => {
            if !prefix.is_empty() && up.write_all(&prefix).await.is_err() {
                return;
            }
            tokio::io::copy_bidirectional(&mut down, &mut up).await
        }
    };
    if let Err(e) = r {
        tracing::debug!(error = %e, "TCP relay ended");
    }
}
