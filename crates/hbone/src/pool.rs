//! Outbound HBONE connection pool: one set of HTTP/2 connections per
//! (source identity, expected server identities, destination, source IP), at most one dial per key at
//! a time, a stream cap per connection, idle release, and a retry on a fresh connection for
//! streams the peer never processed (GOAWAY races during a peer's drain).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ambit_identity::{CertManager, Identity};
use http::{HeaderMap, StatusCode};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use crate::conn::{self, ConnError, Keepalive, StreamError, StreamHandle, StreamIo};
use crate::tls::{self, TlsError};
use crate::{H2Settings, PING_INTERVAL, PING_TIMEOUT};

/// A TCP connection the pool may run a new HBONE connection on, with whatever the dialer holds
/// for it (a descriptor permit) until the connection closes.
pub struct Dialed {
    /// The connected socket.
    pub tcp: TcpStream,
    /// Released when the HBONE connection on `tcp` ends.
    pub guard: Box<dyn Send>,
}

/// Opens the TCP connections the pool runs HBONE on (the proxy's socket options and descriptor
/// budget).
pub trait Dialer: Send + Sync + 'static {
    /// Connects to `dst`; the pool bounds the time it may take.
    fn dial(&self, dst: SocketAddr) -> Pin<Box<dyn Future<Output = std::io::Result<Dialed>> + Send + '_>>;
}

/// Identifies a reusable set of HBONE connections.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// Our identity (client certificate).
    pub src_identity: Identity,
    /// Identities the server may present.
    pub dst_identities: Vec<Identity>,
    /// The peer's HBONE address.
    pub dst: SocketAddr,
    /// Source IP of the downstream connection.
    pub src_ip: IpAddr,
}

/// Why a tunnel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// TCP connect timed out.
    #[error("connection timed out, maybe a NetworkPolicy is blocking HBONE port 15008: {0}")]
    ConnectTimeout(SocketAddr),
    /// TCP connect failed.
    #[error("connection to {0} failed: {1}")]
    Connect(SocketAddr, std::io::Error),
    /// Our certificate is not available.
    #[error("identity error: {0}")]
    Identity(#[from] ambit_identity::CertError),
    /// TLS handshake failed (including identity verification of the server).
    #[error("tls error: {0}")]
    Tls(TlsError),
    /// HTTP/2 handshake failed.
    #[error("http2 handshake failed: {0}")]
    H2Handshake(ConnError),
    /// The CONNECT stream failed.
    #[error("http2 error: {0}")]
    H2(StreamError),
    /// The server answered with a non-200 status.
    #[error("http status: {0}")]
    Status(StatusCode),
}

struct PooledConn {
    client: conn::Client,
    streams: Arc<AtomicU32>,
    cap: u32,
    closed: Arc<AtomicBool>,
    last_used: Mutex<Instant>,
}

/// The pool.
pub struct Pool {
    certs: Arc<CertManager>,
    dialer: Box<dyn Dialer>,
    settings: H2Settings,
    idle_timeout: Duration,
    entries: Mutex<HashMap<PoolKey, Arc<Entry>>>,
}

#[derive(Default)]
struct Entry {
    conns: Mutex<Vec<Arc<PooledConn>>>,
    dial: tokio::sync::Mutex<()>,
}

/// An open CONNECT stream; dropping it releases its slot in the pooled connection.
pub struct Tunnel {
    /// The stream (relay it with [`StreamHandle::relay`]).
    pub stream: StreamHandle,
    /// Response headers of the peer (e.g. its baggage).
    pub headers: HeaderMap,
    _slot: Slot,
}

struct Slot(Arc<AtomicU32>);

impl Tunnel {
    /// The stream as `AsyncRead + AsyncWrite`, holding the pool slot until it is dropped.
    pub fn into_io(self) -> StreamIo {
        StreamIo::with_guard(self.stream, Box::new(self._slot))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the TLS handshake with a peer may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Pool {
    /// An empty pool that opens its TCP connections with `dialer`.
    pub fn new(
        certs: Arc<CertManager>,
        dialer: Box<dyn Dialer>,
        settings: H2Settings,
        idle_timeout: Duration,
    ) -> Arc<Pool> {
        Arc::new(Pool { certs, dialer, settings, idle_timeout, entries: Mutex::new(HashMap::new()) })
    }

    /// Opens a CONNECT stream to `key.dst` with `:authority` = `authority` and extra headers.
    pub async fn connect(
        &self,
        key: &PoolKey,
        authority: SocketAddr,
        headers: &HeaderMap,
    ) -> Result<Tunnel, TunnelError> {
        self.connect_early(key, authority, headers, &[]).await
    }

    /// [`Pool::connect`] with the app's first bytes sent behind the request head, before the
    /// response ([`conn::Client::connect`]); all of `early` is in the stream once this returns.
    pub async fn connect_early(
        &self,
        key: &PoolKey,
        authority: SocketAddr,
        headers: &HeaderMap,
        early: &[u8],
    ) -> Result<Tunnel, TunnelError> {
        // Streams refused by a draining peer (GOAWAY, REFUSED_STREAM) were never processed, nor
        // were the early bytes they carried: retry them once on a fresh connection, bytes and all.
        let mut last = None;
        for attempt in 0..3 {
            let conn = self.checkout(key, attempt > 0).await?;
            match self.open_stream(&conn, authority, headers, early).await {
                Ok(t) => return Ok(t),
                Err((e, retryable)) => {
                    // A refused stream or a failed connection: this connection takes no more. A
                    // stream the peer answered (a denial) leaves it in the pool.
                    if retryable || matches!(e, TunnelError::H2(StreamError::Connection(_))) {
                        conn.closed.store(true, Ordering::Relaxed);
                    }
                    if !retryable {
                        return Err(e);
                    }
                    tracing::debug!(dst = %key.dst, error = %e, "retrying CONNECT on a fresh connection");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or(TunnelError::Status(StatusCode::SERVICE_UNAVAILABLE)))
    }

    async fn open_stream(
        &self,
        conn: &PooledConn,
        authority: SocketAddr,
        headers: &HeaderMap,
        early: &[u8],
    ) -> Result<Tunnel, (TunnelError, bool)> {
        let slot = Slot(conn.streams.clone());
        let (stream, head, sent) =
            conn.client.connect(&authority.to_string(), headers, early).await.map_err(|e| {
                let r = e.is_retryable();
                (TunnelError::H2(e), r)
            })?;
        let status =
            head.status.and_then(|s| StatusCode::from_u16(s).ok()).unwrap_or(StatusCode::BAD_GATEWAY);
        if status != StatusCode::OK {
            return Err((TunnelError::Status(status), false));
        }
        // What the windows did not take before the response goes now.
        if sent < early.len() {
            stream.send(&early[sent..]).await.map_err(|e| (TunnelError::H2(e), false))?;
        }
        Ok(Tunnel { stream, headers: head.headers, _slot: slot })
    }

    /// A connection with a free stream slot (reserved), dialing a new one if needed.
    async fn checkout(&self, key: &PoolKey, fresh: bool) -> Result<Arc<PooledConn>, TunnelError> {
        let entry = {
            let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(key.clone()).or_default().clone()
        };
        if !fresh && let Some(c) = entry.reserve() {
            return Ok(c);
        }
        // One dial per key at a time; others wait here, then reuse what it made.
        let _dialing = entry.dial.lock().await;
        if !fresh && let Some(c) = entry.reserve() {
            return Ok(c);
        }
        let conn = Arc::new(self.dial(key).await?);
        conn.streams.fetch_add(1, Ordering::Relaxed);
        *conn.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let mut conns = entry.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.retain(|c| !c.closed.load(Ordering::Relaxed));
        conns.push(conn.clone());
        Ok(conn)
    }

    async fn dial(&self, key: &PoolKey) -> Result<PooledConn, TunnelError> {
        let cert = self.certs.fetch(&key.src_identity).await?;
        let Dialed { tcp, guard } =
            match tokio::time::timeout(CONNECT_TIMEOUT, self.dialer.dial(key.dst)).await {
                Err(_) => return Err(TunnelError::ConnectTimeout(key.dst)),
                Ok(Err(e)) => return Err(TunnelError::Connect(key.dst, e)),
                Ok(Ok(d)) => d,
            };
        let name = ServerName::IpAddress(key.dst.ip().into());
        let handshake = tls::connect(&tcp, cert.client_config(&key.dst_identities), name);
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return Err(TunnelError::Tls(e)),
            Err(_) => {
                return Err(TunnelError::Tls(TlsError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("TLS handshake with {} not done within {HANDSHAKE_TIMEOUT:?}", key.dst),
                ))));
            }
        };
        let cfg = conn::Config {
            stream_window: self.settings.window_size,
            connection_window: self.settings.connection_window_size,
            max_frame_size: self.settings.frame_size,
            max_concurrent_streams: None,
            max_header_list_size: 64 * 1024,
            keepalive: Some(Keepalive { interval: PING_INTERVAL, timeout: PING_TIMEOUT }),
        };
        let (client, driver) = conn::client(tcp, tls, cfg).map_err(TunnelError::H2Handshake)?;
        let closed = Arc::new(AtomicBool::new(false));
        let done = closed.clone();
        let dst = key.dst;
        tokio::spawn(async move {
            let _guard = guard;
            match driver.await {
                Ok(()) => tracing::debug!(%dst, "pooled HBONE connection closed"),
                Err(e) => tracing::debug!(%dst, error = %e, "pooled HBONE connection ended"),
            }
            done.store(true, Ordering::Relaxed);
        });
        Ok(PooledConn {
            client,
            streams: Arc::new(AtomicU32::new(0)),
            cap: self.settings.max_streams.max(1),
            closed,
            last_used: Mutex::new(Instant::now()),
        })
    }

    /// Drops connections nobody checked out for the idle timeout (they close once their
    /// last stream ends). Call periodically.
    pub fn release_idle(&self) {
        let now = Instant::now();
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, entry| {
            let mut conns = entry.conns.lock().unwrap_or_else(|p| p.into_inner());
            conns.retain(|c| {
                let last = *c.last_used.lock().unwrap_or_else(|p| p.into_inner());
                !c.closed.load(Ordering::Relaxed)
                    && !c.client.is_closed()
                    && (c.streams.load(Ordering::Relaxed) > 0 || now.duration_since(last) < self.idle_timeout)
            });
            !conns.is_empty()
        });
    }

    /// Number of pooled connections (for tests and the config dump).
    pub fn connections(&self) -> usize {
        let map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        map.values().map(|e| e.conns.lock().unwrap_or_else(|p| p.into_inner()).len()).sum()
    }
}

impl Entry {
    fn reserve(&self) -> Option<Arc<PooledConn>> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        for c in conns.iter() {
            if c.closed.load(Ordering::Relaxed) || c.client.is_closed() {
                continue;
            }
            // The peer's SETTINGS_MAX_CONCURRENT_STREAMS can change: a full connection sends new
            // streams to another one.
            let cap = c.cap.min(c.client.max_concurrent_streams()).max(1);
            let n = c.streams.fetch_add(1, Ordering::Relaxed);
            if n < cap {
                *c.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                return Some(c.clone());
            }
            c.streams.fetch_sub(1, Ordering::Relaxed);
        }
        None
    }
}

#[cfg(test)]
mod tests;
