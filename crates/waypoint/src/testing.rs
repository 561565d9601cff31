//! Test helpers (never shipped): a waypoint on loopback with generated certificates, a fake
//! node proxy that answers the waypoint's CONNECTs by relaying to plain backends, HTTP backends
//! that say who they are, and the source node proxy's side (an HBONE client to the waypoint).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_api::waypoint as api;
use ambit_hbone::testing::{Counted, TcpDialer, TestBudget, TestDrain, settings};
use ambit_hbone::{Dialed, Dialer, Pool, PoolKey, ServerConfig, StreamIo};
use ambit_identity::{CertManager, CertSigner, FakeCa, Identity};
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

use crate::config::Snapshot;
use crate::server::{Settings, Waypoint};
use crate::upstream::{Body, BoxError};

/// The waypoint's identity in tests.
pub fn waypoint_identity() -> Identity {
    Identity::new("cluster.local", "gw-ns", "waypoint")
}

/// The source workload's identity (the client's node proxy connects with it).
pub fn client_identity() -> Identity {
    Identity::new("cluster.local", "default", "client")
}

/// The backends' identity (their node proxy presents it).
pub fn backend_identity() -> Identity {
    Identity::new("cluster.local", "app-ns", "backend")
}

/// What a test backend saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// HTTP version.
    pub version: http::Version,
    /// Headers.
    pub headers: HeaderMap,
}

/// An HTTP/1.1 + HTTP/2 backend on loopback that answers with its name (or a set status, after
/// a set delay), gRPC requests with `grpc-status: 0` trailers (or, with a set status, that gRPC
/// status trailers-only), and `/slow-body` with a head at
/// once and the rest of the body 5 s later, and upgrades with 101 and an echo.
pub struct Backend {
    /// Its name (the body of its answers).
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Status to answer with (0: 200); for gRPC requests, the gRPC status (0: OK).
    pub status: Arc<AtomicU16>,
    /// Delay before answering, in ms.
    pub delay_ms: Arc<AtomicU64>,
    /// Requests seen.
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Backend {
    /// Starts a backend named `name`.
    pub async fn start(name: &str) -> Backend {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind backend");
        let addr = l.local_addr().expect("addr");
        let backend = Backend {
            name: name.to_owned(),
            addr,
            status: Arc::default(),
            delay_ms: Arc::default(),
            seen: Arc::default(),
        };
        let (n, status, delay, seen) =
            (backend.name.clone(), backend.status.clone(), backend.delay_ms.clone(), backend.seen.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = l.accept().await {
                let (n, status, delay, seen) = (n.clone(), status.clone(), delay.clone(), seen.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (n, status, delay, seen) =
                            (n.clone(), status.clone(), delay.clone(), seen.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(answer(&n, &status, &delay, &seen, req).await)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        backend
    }

    /// Requests seen so far.
    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The last request seen.
    pub fn last(&self) -> Option<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).last().cloned()
    }
}

async fn answer(
    name: &str,
    status: &AtomicU16,
    delay: &AtomicU64,
    seen: &Mutex<Vec<Seen>>,
    mut req: Request<Incoming>,
) -> Response<Body> {
    // An upgrade: 101, then an echo of the upgraded connection.
    let upgrade = req.headers().get("upgrade").cloned();
    let on_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let _ = body.collect().await;
    seen.lock().unwrap_or_else(|p| p.into_inner()).push(Seen {
        method: parts.method.to_string(),
        path: parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default(),
        version: parts.version,
        headers: parts.headers.clone(),
    });
    if let (Some(protocol), Some(on_upgrade)) = (upgrade, on_upgrade) {
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                let (mut r, mut w) = tokio::io::split(TokioIo::new(upgraded));
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
        });
        let mut resp = Response::new(Full::new(Bytes::new()).map_err(|never| match never {}).boxed_unsync());
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        resp.headers_mut().insert("connection", http::HeaderValue::from_static("upgrade"));
        resp.headers_mut().insert("upgrade", protocol);
        return resp;
    }
    let ms = delay.load(Ordering::Relaxed);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let code = status.load(Ordering::Relaxed);
    if parts.headers.get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/grpc")) {
        if code != 0 {
            // A set status is a gRPC status here, answered trailers-only (in the head).
            let mut resp =
                Response::new(Full::new(Bytes::new()).map_err(|never| match never {}).boxed_unsync());
            let headers = resp.headers_mut();
            headers.insert("content-type", http::HeaderValue::from_static("application/grpc"));
            headers.insert("grpc-status", http::HeaderValue::from(code));
            return resp;
        }
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        // One empty gRPC message: not compressed, length 0.
        let frames: Vec<Result<Frame<Bytes>, BoxError>> =
            vec![Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))), Ok(Frame::trailers(trailers))];
        let body = StreamBody::new(futures::stream::iter(frames));
        let mut resp = Response::new(BodyExt::boxed_unsync(body));
        resp.headers_mut().insert("content-type", http::HeaderValue::from_static("application/grpc"));
        return resp;
    }
    if parts.uri.path() == "/slow-body" {
        // The head at once, the end of the body five seconds later.
        let frames = futures::stream::unfold(0u8, |step| async move {
            match step {
                0 => Some((Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"start "))), 1)),
                1 => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Some((Ok(Frame::data(Bytes::from_static(b"end"))), 2))
                }
                _ => None,
            }
        });
        return Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    }
    let mut resp =
        Response::new(Full::new(Bytes::from(name.to_owned())).map_err(|never| match never {}).boxed_unsync());
    if code != 0 {
        *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    }
    resp.headers_mut()
        .insert("x-backend", http::HeaderValue::from_str(name).expect("name is a header value"));
    resp
}

/// A TCP app on loopback that echoes what it reads.
pub async fn tcp_echo() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A fake node proxy: an HBONE server presenting [`backend_identity`] that relays each
/// CONNECT to the app registered for its `:authority` and answers 503 for others.
pub struct NodeProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    /// CONNECTs per `:authority`.
    pub connects: Arc<Mutex<HashMap<String, usize>>>,
    /// The headers of every CONNECT, in order.
    pub headers: Arc<Mutex<Vec<HeaderMap>>>,
}

impl NodeProxy {
    /// Starts it on a free loopback port with `apps`: `:authority` → app address.
    pub async fn start(ca: &FakeCa, apps: HashMap<SocketAddr, SocketAddr>) -> NodeProxy {
        NodeProxy::start_at(ca, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), apps).await
    }

    /// Starts it on `addr` (an endpoint's `ip:15008`, where a waypoint process dials it).
    pub async fn start_at(ca: &FakeCa, addr: SocketAddr, apps: HashMap<SocketAddr, SocketAddr>) -> NodeProxy {
        let cert = ca.issue(&backend_identity(), Duration::from_secs(3600)).expect("issue");
        let l = TcpListener::bind(addr).await.expect("bind node proxy");
        let addr = l.local_addr().expect("addr");
        let connects: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let headers: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
        let apps = Arc::new(apps);
        let (c, hs) = (connects.clone(), headers.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = l.accept().await {
                let (config, apps, c, hs) = (cert.server_config(), apps.clone(), c.clone(), hs.clone());
                tokio::spawn(async move {
                    let Ok(tls) = ambit_hbone::accept(&tcp, config).await else { return };
                    let budget = TestBudget::unlimited(settings());
                    let cfg = ServerConfig::new(settings());
                    let _ = ambit_hbone::serve(tcp, tls, cfg, budget, &TestDrain::default(), move |req| {
                        let (apps, c, hs) = (apps.clone(), c.clone(), hs.clone());
                        async move {
                            hs.lock().unwrap_or_else(|p| p.into_inner()).push(req.head.headers.clone());
                            let authority = req.head.authority.clone().unwrap_or_default();
                            *c.lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .entry(authority.clone())
                                .or_default() += 1;
                            let app =
                                authority.parse::<SocketAddr>().ok().and_then(|a| apps.get(&a).copied());
                            let Some(app) = app else { return req.reject(StatusCode::SERVICE_UNAVAILABLE) };
                            let Ok(tcp) = TcpStream::connect(app).await else {
                                return req.reject(StatusCode::SERVICE_UNAVAILABLE);
                            };
                            if req.stream.respond(200, &HeaderMap::new(), false).is_ok() {
                                let _ = req.stream.relay(tcp, Arc::new(Counted::default())).await;
                            }
                        }
                    })
                    .await;
                });
            }
        });
        NodeProxy { addr, connects, headers }
    }

    /// CONNECTs it got for `authority`.
    pub fn connects(&self, authority: &str) -> usize {
        self.connects.lock().unwrap_or_else(|p| p.into_inner()).get(authority).copied().unwrap_or(0)
    }
}

/// Dials every HBONE address (`endpoint:15008`) at one fake node proxy.
struct ToNodeProxy(SocketAddr);

impl Dialer for ToNodeProxy {
    fn dial(&self, _dst: SocketAddr) -> Pin<Box<dyn Future<Output = std::io::Result<Dialed>> + Send + '_>> {
        let to = self.0;
        Box::pin(async move {
            let tcp = TcpStream::connect(to).await?;
            tcp.set_nodelay(true)?;
            Ok(Dialed { tcp, guard: Box::new(()) })
        })
    }
}

/// A waypoint on 127.0.0.1 whose upstream HBONE goes to `node_proxy`, and the source side.
pub struct Harness {
    /// The CA every certificate comes from.
    pub ca: Arc<FakeCa>,
    /// The waypoint.
    pub waypoint: Waypoint,
    /// Its HBONE address.
    pub addr: SocketAddr,
    /// The source node proxy's pool to the waypoint.
    pub client_pool: Arc<Pool>,
    /// The waypoint's drain: [`TestDrain::begin`] starts it.
    pub drain: TestDrain,
}

impl Harness {
    /// Starts a waypoint with `settings` (see [`Harness::settings`]) sending upstream HBONE to
    /// `node_proxy`.
    pub async fn start(ca: Arc<FakeCa>, waypoint_settings: Settings, node_proxy: SocketAddr) -> Harness {
        let signer: Arc<dyn CertSigner> = ca.clone();
        let certs = CertManager::new(signer.clone(), Duration::from_secs(3600));
        let pool =
            Pool::new(certs.clone(), Box::new(ToNodeProxy(node_proxy)), settings(), Duration::from_secs(300));
        let waypoint = Waypoint::new(waypoint_settings, certs, pool);
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind waypoint");
        let addr = l.local_addr().expect("addr");
        let (w, drain) = (waypoint.clone(), TestDrain::default());
        let d = Arc::new(drain.clone());
        tokio::spawn(async move { w.run(l, d).await });
        let client_certs = CertManager::new(signer, Duration::from_secs(3600));
        let client_pool = Pool::new(client_certs, Box::new(TcpDialer), settings(), Duration::from_secs(300));
        Harness { ca, waypoint, addr, client_pool, drain }
    }

    /// The settings of a test waypoint: round-robin balancing, short limits.
    pub fn settings() -> Settings {
        let mut s = Settings::new(waypoint_identity(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        s.balance = crate::Balance::RoundRobin;
        s.limits.header_read_timeout = Duration::from_millis(500);
        s.limits.sniff_timeout = Duration::from_millis(500);
        s
    }

    /// Parses and installs a configuration, returning what was refused.
    pub fn configure(
        &self,
        destinations: &[(String, api::Destination)],
        policies: &[(String, api::Policy)],
    ) -> Vec<crate::ConfigError> {
        let (snapshot, errors) = Snapshot::build(destinations, policies);
        self.waypoint.set_config(snapshot);
        errors
    }

    /// A CONNECT to the waypoint for `vip`, as the source node proxy sends it.
    pub async fn connect(&self, vip: SocketAddr) -> Result<StreamIo, ambit_hbone::TunnelError> {
        let key = PoolKey {
            src_identity: client_identity(),
            dst_identities: vec![waypoint_identity()],
            dst: self.addr,
            src_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        Ok(self.client_pool.connect(&key, vip, &HeaderMap::new()).await?.into_io())
    }

    /// An HTTP/1.1 client connection through a CONNECT to `vip`.
    pub async fn http1(&self, vip: SocketAddr) -> hyper::client::conn::http1::SendRequest<Body> {
        let io = self.connect(vip).await.expect("CONNECT to the waypoint");
        let (send, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(io)).await.expect("http1 handshake");
        tokio::spawn(conn.with_upgrades());
        send
    }

    /// An HTTP/2 client connection through a CONNECT to `vip`.
    pub async fn http2(&self, vip: SocketAddr) -> hyper::client::conn::http2::SendRequest<Body> {
        let io = self.connect(vip).await.expect("CONNECT to the waypoint");
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("http2 handshake");
        tokio::spawn(conn);
        send
    }
}

/// A request body from bytes.
pub fn body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

/// A response's status and body text.
pub async fn text(resp: Response<Incoming>) -> (StatusCode, String) {
    let status = resp.status();
    let bytes = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// IPv4 bytes of `ip` for the protos.
pub fn ip_bytes(ip: &str) -> Vec<u8> {
    let ip: Ipv4Addr = ip.parse().expect("an IPv4 address");
    ip.octets().to_vec()
}

/// An HBONE endpoint of [`backend_identity`] at `ip`.
pub fn endpoint(ip: &str) -> api::Endpoint {
    api::Endpoint {
        address: ip_bytes(ip),
        identity: backend_identity().to_string(),
        tunnel: ambit_api::workload::TunnelProtocol::Hbone as i32,
        healthy: true,
        ..api::Endpoint::default()
    }
}

/// A Service destination at `vip` with `ports` (port, target, protocol) and `endpoints`.
pub fn service(
    name: &str,
    vip: Option<&str>,
    ports: &[(u32, u32, api::Protocol)],
    endpoints: Vec<api::Endpoint>,
) -> api::Destination {
    api::Destination {
        kind: api::destination::Kind::Service as i32,
        name: name.to_owned(),
        namespace: "app-ns".into(),
        hostname: format!("{name}.app-ns.svc.cluster.local"),
        bound: vip.is_some(),
        addresses: vip.map(|v| vec![ip_bytes(v)]).unwrap_or_default(),
        ports: ports
            .iter()
            .map(|(port, target, protocol)| api::Port {
                port: *port,
                target_port: *target,
                protocol: *protocol as i32,
                name: String::new(),
            })
            .collect(),
        endpoints,
        ..api::Destination::default()
    }
}

/// How many times each name occurs.
pub fn tally<'a>(names: impl IntoIterator<Item = &'a str>) -> HashMap<String, usize> {
    names.into_iter().fold(HashMap::new(), |mut m, n| {
        *m.entry(n.to_owned()).or_default() += 1;
        m
    })
}
