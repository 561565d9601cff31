//! Requests to endpoints: HTTP/1.1 or HTTP/2 (hyper's client) over an HBONE stream to the
//! endpoint's node proxy, or over plain TCP for endpoints outside the mesh, with connections
//! reused per endpoint: an HTTP/2 connection is shared by every request to its endpoint, idle
//! HTTP/1.1 connections wait in a per-endpoint list for the next request.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use ambit_hbone::{HBONE_PORT, Pool, PoolKey, StreamIo, TunnelError};
use ambit_identity::Identity;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::config::{Endpoint, Tunnel};

/// The error type of bodies the waypoint sends.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A request or response body, as the waypoint sends it.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Idle HTTP/1.1 connections kept per endpoint, at most.
const MAX_IDLE_H1: usize = 64;

/// Why a request to an endpoint failed before it had a response.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The HBONE tunnel to the endpoint's node proxy could not be opened.
    #[error("connection to {0} through its node proxy failed: {1}")]
    Tunnel(SocketAddr, TunnelError),
    /// The TCP connection failed.
    #[error("connection to {0} failed: {1}")]
    Connect(SocketAddr, std::io::Error),
    /// The HTTP handshake over the connection failed.
    #[error("http handshake with {0} failed: {1}")]
    Handshake(SocketAddr, hyper::Error),
    /// The request failed (reset, connection closed before a response).
    #[error("request to {0} failed: {1}")]
    Request(SocketAddr, hyper::Error),
    /// The endpoint has no identity to verify (an HBONE endpoint always has one).
    #[error("endpoint {0} has no identity to verify")]
    NoIdentity(IpAddr),
}

/// One HTTP connection to an endpoint.
enum Sender {
    H1(http1::SendRequest<Body>),
    H2(http2::SendRequest<Body>),
}

/// Which connections may carry a request: the same endpoint address, way and protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ConnKey {
    addr: SocketAddr,
    tunnel: Tunnel,
    h2: bool,
}

/// The waypoint's HTTP client to endpoints.
pub(crate) struct Upstream {
    pool: Arc<Pool>,
    identity: Identity,
    local_ip: IpAddr,
    baggage: Option<HeaderValue>,
    h2: Mutex<HashMap<ConnKey, http2::SendRequest<Body>>>,
    h1: Mutex<HashMap<ConnKey, Vec<http1::SendRequest<Body>>>>,
}

impl Upstream {
    /// A client that opens HBONE tunnels through `pool` as `identity` from `local_ip`, sending
    /// `baggage` (the waypoint's own, as ztunnel sends its workload's) on every CONNECT.
    pub(crate) fn new(
        pool: Arc<Pool>,
        identity: Identity,
        local_ip: IpAddr,
        baggage: Option<HeaderValue>,
    ) -> Self {
        Upstream { pool, identity, local_ip, baggage, h2: Mutex::default(), h1: Mutex::default() }
    }

    /// Sends `req` to `endpoint` on `port` over HTTP/2 (`h2`) or HTTP/1.1.
    pub(crate) async fn send(
        self: &Arc<Self>,
        endpoint: &Endpoint,
        port: u16,
        h2: bool,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let key = ConnKey { addr: SocketAddr::new(endpoint.address, port), tunnel: endpoint.tunnel, h2 };
        let sender = match self.checkout(&key) {
            Some(s) => s,
            None => self.connect(&key, endpoint).await?,
        };
        match sender {
            Sender::H2(mut s) => s.send_request(req).await.map_err(|e| UpstreamError::Request(key.addr, e)),
            Sender::H1(mut s) => {
                let resp = s.send_request(req).await.map_err(|e| UpstreamError::Request(key.addr, e))?;
                // The connection takes the next request once this response's body is read.
                let this = self.clone();
                tokio::spawn(async move {
                    if s.ready().await.is_ok() {
                        let mut idle = this.h1.lock().unwrap_or_else(|p| p.into_inner());
                        let list = idle.entry(key).or_default();
                        if list.len() < MAX_IDLE_H1 {
                            list.push(s);
                        }
                    }
                });
                Ok(resp)
            }
        }
    }

    /// A reusable connection for `key`, if one is open.
    fn checkout(&self, key: &ConnKey) -> Option<Sender> {
        if key.h2 {
            let mut conns = self.h2.lock().unwrap_or_else(|p| p.into_inner());
            match conns.get(key) {
                Some(s) if !s.is_closed() => return Some(Sender::H2(s.clone())),
                Some(_) => {
                    conns.remove(key);
                }
                None => {}
            }
            return None;
        }
        let mut idle = self.h1.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.get_mut(key)?;
        while let Some(s) = list.pop() {
            if s.is_ready() {
                return Some(Sender::H1(s));
            }
        }
        None
    }

    /// Drops closed HTTP connections and HBONE connections idle past the pool's timeout.
    pub(crate) fn release_idle(&self) {
        self.pool.release_idle();
        self.h2.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, s| !s.is_closed());
        let mut idle = self.h1.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|_, list| {
            list.retain(|s| !s.is_closed());
            !list.is_empty()
        });
    }

    /// Opens a connection to `endpoint` and starts HTTP on it.
    async fn connect(&self, key: &ConnKey, endpoint: &Endpoint) -> Result<Sender, UpstreamError> {
        let addr = key.addr;
        match key.tunnel {
            Tunnel::Hbone => {
                let io = self.tunnel(endpoint, addr).await?;
                self.handshake(key, TokioIo::new(io)).await
            }
            Tunnel::None => {
                let tcp = TcpStream::connect(addr).await.map_err(|e| UpstreamError::Connect(addr, e))?;
                let _ = tcp.set_nodelay(true);
                self.handshake(key, TokioIo::new(tcp)).await
            }
        }
    }

    /// An HBONE stream to `addr` through the node proxy of `endpoint`.
    pub(crate) async fn tunnel(
        &self,
        endpoint: &Endpoint,
        addr: SocketAddr,
    ) -> Result<StreamIo, UpstreamError> {
        let identity = endpoint.identity.clone().ok_or(UpstreamError::NoIdentity(endpoint.address))?;
        let pool_key = PoolKey {
            src_identity: self.identity.clone(),
            dst_identities: vec![identity],
            dst: SocketAddr::new(endpoint.address, HBONE_PORT),
            src_ip: self.local_ip,
        };
        let mut headers = HeaderMap::new();
        if let Some(b) = &self.baggage {
            headers.insert("baggage", b.clone());
        }
        let tunnel =
            self.pool.connect(&pool_key, addr, &headers).await.map_err(|e| UpstreamError::Tunnel(addr, e))?;
        Ok(tunnel.into_io())
    }

    async fn handshake<T>(&self, key: &ConnKey, io: TokioIo<T>) -> Result<Sender, UpstreamError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let addr = key.addr;
        if key.h2 {
            let (send, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(io)
                .await
                .map_err(|e| UpstreamError::Handshake(addr, e))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(%addr, error = %e, "upstream HTTP/2 connection ended");
                }
            });
            self.h2.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), send.clone());
            Ok(Sender::H2(send))
        } else {
            let (send, conn) =
                http1::Builder::new().handshake(io).await.map_err(|e| UpstreamError::Handshake(addr, e))?;
            tokio::spawn(async move {
                if let Err(e) = conn.with_upgrades().await {
                    tracing::debug!(%addr, error = %e, "upstream HTTP/1.1 connection ended");
                }
            });
            Ok(Sender::H1(send))
        }
    }
}
