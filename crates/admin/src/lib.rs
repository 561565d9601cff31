//! What every Ambit process shares besides its own logic: the small HTTP/1.1 servers it runs
//! (metrics, readiness, admin and debug endpoints), the command-line value parsers
//! ([`parse_duration`]), and the endpoints they share: `/metrics` (Prometheus text or OpenMetrics),
//! `/logging` (the run-time log filter, as `istioctl ... log` drives it) and
//! `/debug/pprof/profile` (a CPU profile). One implementation for the proxy, the agent and the
//! control plane; each adds its own paths.

use std::borrow::Cow;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

mod control_args;
pub mod logging;
pub mod profile;

pub use control_args::{ControlArgs, DEFAULT_ROOT_CA};
pub use profile::ProfileError;

/// A response body.
pub type Body = Full<Bytes>;

/// Most connections one listener serves at once; further ones wait in the kernel's backlog
/// until one ends.
pub const MAX_CONNECTIONS: usize = 256;

/// Most connections one peer address may hold on one listener; one more is closed at once.
/// A peer that opens connections and leaves them idle cannot take every slot from the kubelet's
/// probes and Prometheus, which come from other addresses.
pub const MAX_CONNECTIONS_PER_PEER: usize = 32;

/// A request's head must arrive within this, and a keep-alive connection idle for this long is
/// closed: a connection that sends nothing does not hold its slot.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves HTTP/1.1 on `listener` with `handler` until the process ends, within
/// [`MAX_CONNECTIONS`], [`MAX_CONNECTIONS_PER_PEER`] and [`HEADER_READ_TIMEOUT`].
pub async fn serve<F, Fut>(listener: TcpListener, handler: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    serve_within(listener, Limits::default(), handler).await;
}

/// What one listener's peers may hold.
#[derive(Debug, Clone, Copy)]
struct Limits {
    connections: usize,
    per_peer: usize,
    header_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: MAX_CONNECTIONS,
            per_peer: MAX_CONNECTIONS_PER_PEER,
            header_read_timeout: HEADER_READ_TIMEOUT,
        }
    }
}

async fn serve_within<F, Fut>(listener: TcpListener, limits: Limits, handler: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    let peers = Arc::new(Mutex::new(HashMap::<IpAddr, usize>::new()));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(held) = PeerSlot::take(&peers, peer.ip(), limits.per_peer) else {
            tracing::debug!(%peer, "connection closed: the peer holds {} already", limits.per_peer);
            continue;
        };
        let h = handler.clone();
        tokio::spawn(async move {
            let _held = (slot, held);
            let svc = hyper::service::service_fn(move |req| {
                let h = h.clone();
                async move { Ok::<_, Infallible>(h(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// One of a peer's connections, counted while it lives.
struct PeerSlot {
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PeerSlot {
    /// Counts a connection of `ip`, or `None` when it holds `most` already.
    fn take(peers: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr, most: usize) -> Option<PeerSlot> {
        let mut map = peers.lock().unwrap_or_else(PoisonError::into_inner);
        let held = map.entry(ip).or_default();
        if *held >= most {
            return None;
        }
        *held += 1;
        Some(PeerSlot { peers: peers.clone(), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = map.get_mut(&self.ip) {
            *held -= 1;
            if *held == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Binds `addr` (non-blocking, for [`tokio::net::TcpListener::from_std`]). An unspecified IPv6
/// address (`[::]`) falls back to `0.0.0.0` where the host has no IPv6.
pub fn bind_std(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let l = match std::net::TcpListener::bind(addr) {
        Ok(l) => l,
        Err(_) if addr.is_ipv6() && addr.ip().is_unspecified() => {
            std::net::TcpListener::bind(SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port()))?
        }
        Err(e) => return Err(e),
    };
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Binds `addr` as [`bind_std`] does, for tokio (call inside a runtime).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::from_std(bind_std(addr)?)
}

/// What a readiness endpoint answers: ready, or not ready and why.
#[derive(Debug)]
pub struct Readiness {
    reason: Mutex<Option<String>>,
}

impl Readiness {
    /// Not ready, for `reason`.
    pub fn new(reason: &str) -> Arc<Readiness> {
        Arc::new(Readiness { reason: Mutex::new(Some(reason.to_owned())) })
    }

    /// Not ready, for `reason` (logged when it changes).
    pub fn not_ready(&self, reason: &str) {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.as_deref() != Some(reason) {
            tracing::info!(%reason, "not ready");
            *r = Some(reason.to_owned());
        }
    }

    /// Ready.
    pub fn ready(&self) {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// `None` when ready, else why not.
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Resolves when the process receives SIGTERM or SIGINT (never, if the handlers cannot be
/// installed).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// The process environment as one snapshot. A variable whose name or value is not UTF-8 is
/// left out (`std::env::vars` would panic on it); no setting Ambit reads can be such a one.
pub fn environment() -> std::collections::BTreeMap<String, String> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect()
}

/// Writes `bytes` to `path` through a temporary file beside it and a rename, so a reader sees
/// the old content or the new one, never a part.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .unwrap_or_default()
}

/// A JSON response (pretty-printed: these are read by people).
pub fn json(value: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_string_pretty(value) {
        Ok(body) => Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body + "\n")))
            .unwrap_or_default(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding JSON failed: {e}\n")),
    }
}

/// `registry` as Prometheus text, or OpenMetrics when the client asks for it.
pub fn metrics(req: &Request<Incoming>, registry: &Registry) -> Response<Body> {
    let mut body = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut body, registry) {
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics failed: {e}\n"));
    }
    let openmetrics = req
        .headers()
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().starts_with("application/openmetrics-text"));
    let ct = if openmetrics {
        "application/openmetrics-text;charset=utf-8;version=1.0.0"
    } else {
        "text/plain; charset=utf-8"
    };
    Response::builder().header("content-type", ct).body(Full::new(Bytes::from(body))).unwrap_or_default()
}

/// The endpoints that need no process state: `/` (answers `index`), `/logging`,
/// `/debug/pprof/profile`; anything else is 404.
pub async fn tools(index: &'static str, method: &Method, uri: &http::Uri) -> Response<Body> {
    tools_with(index, method, uri, logging::control()).await
}

/// [`tools`] with an explicit log control (`None`: the process installed no reloadable filter).
pub async fn tools_with(
    index: &'static str,
    method: &Method,
    uri: &http::Uri,
    logs: Option<&logging::LogControl>,
) -> Response<Body> {
    match uri.path() {
        "/" => text(StatusCode::OK, index),
        "/logging" => logging(method, uri.query(), logs),
        "/debug/pprof/profile" => {
            if method != Method::GET {
                return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
            }
            profile(uri.query()).await
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// The query's `key=value` pairs, percent-decoded.
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned().collect()
}

/// Parses a Go-style duration: `500ms`, `10s`, `5m`, `24h`, `1h30m`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let err = || format!("{s:?} is not a duration like 500ms, 10s, 5m or 24h");
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(err)?;
        let (num, tail) = rest.split_at(digits);
        let value: f64 = num.parse().map_err(|_| err())?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        let secs = value * scale;
        if !secs.is_finite() || !(0.0..=1e12).contains(&secs) {
            return Err(err());
        }
        total += Duration::from_secs_f64(secs);
        rest = tail;
    }
    Ok(total)
}

/// [`parse_duration`], refusing zero (poll intervals, timeouts).
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(format!("{:?} must be longer than zero", s.trim())),
        Err(e) => Err(e),
    }
}

/// `text` cut to at most `max` bytes (at a char boundary), with a note of its full length.
pub fn clip(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes, cut to {max})", &text[..end], text.len()))
}

/// `/logging` as `istioctl ztunnel-config log` drives it (`logs`: the process's reloadable
/// filter, if it installed one).
pub fn logging(method: &Method, query: Option<&str>, logs: Option<&logging::LogControl>) -> Response<Body> {
    use logging::HELP;
    if method != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, format!("Invalid HTTP method\n{HELP}"));
    }
    let Some(logs) = logs else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the log filter cannot be changed: this process did not install a reloadable one\n",
        );
    };
    let pairs = query_pairs(query);
    let level = pairs.iter().rev().find(|(k, _)| k == "level").map(|(_, v)| v.as_str());
    let reset = pairs.iter().any(|(k, _)| k == "reset");
    let result = match (level, reset) {
        (None, false) | (Some(""), false) => logs.current(),
        (level, reset) => logs.set(reset, level.unwrap_or_default()),
    };
    match result {
        Ok(filter) => text(StatusCode::OK, format!("current log level is {filter}\n")),
        Err(e @ logging::LevelError::Gone) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n{HELP}")),
        Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n{HELP}")),
    }
}

/// A CPU profile's parameters (`seconds` 1–300, default 10; `frequency` 1–1000 Hz, default 100).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileRequest {
    /// How long to sample.
    pub seconds: u64,
    /// Samples per second.
    pub frequency: u32,
}

impl ProfileRequest {
    /// Parses `seconds` and `frequency` from a query string.
    pub fn parse(query: Option<&str>) -> Result<ProfileRequest, ProfileError> {
        let pairs = query_pairs(query);
        let get = |name: &'static str, default: u64, max: u64| -> Result<u64, ProfileError> {
            match pairs.iter().rev().find(|(k, _)| k == name) {
                None => Ok(default),
                Some((_, v)) => v.parse::<u64>().ok().filter(|n| (1..=max).contains(n)).ok_or_else(|| {
                    ProfileError::Param { name, value: clip(v, 64).into_owned(), min: 1, max }
                }),
            }
        };
        let seconds = get("seconds", 10, 300)?;
        let frequency = get("frequency", 100, 1000)?;
        Ok(ProfileRequest { seconds, frequency: u32::try_from(frequency).unwrap_or(1000) })
    }
}

/// `/debug/pprof/profile`: samples the whole process's CPU use and answers pprof protobuf.
pub async fn profile(query: Option<&str>) -> Response<Body> {
    let req = match ProfileRequest::parse(query) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    match profile::cpu(req.seconds, req.frequency).await {
        Ok(bytes) => Response::builder()
            .header("content-type", "application/octet-stream")
            .header("content-disposition", "attachment; filename=\"profile\"")
            .body(Full::new(Bytes::from(bytes)))
            .unwrap_or_default(),
        Err(e @ ProfileError::Busy) => text(StatusCode::CONFLICT, format!("{e}\n")),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

#[cfg(test)]
mod tests;
