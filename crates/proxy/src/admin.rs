//! Admin (config dump, logging, CPU profile, quitquitquit), metrics and readiness HTTP servers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::drain::Drain;
use crate::instance::Shared;
use crate::logging::LogControl;
pub use crate::profile::ProfileError;
use crate::readiness::Readiness;

/// Serves HTTP/1.1 on `listener` with `handler` until the process ends.
pub async fn serve<F, Fut>(listener: TcpListener, handler: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let h = handler.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let h = h.clone();
                async move { Ok::<_, Infallible>(h(req).await) }
            });
            let _ =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .unwrap_or_default()
}

/// What the admin endpoints read.
pub struct AdminCtx {
    /// Process-wide state.
    pub shared: Shared,
    /// The process drain.
    pub drain: Drain,
    /// Notified by `/quitquitquit`.
    pub quit: Arc<Notify>,
    /// Shared mode: the per-pod proxies.
    pub workloads: Option<Arc<crate::inpod::Manager>>,
}

/// Readiness (`/healthz/ready` on 15021).
pub async fn readiness(
    req: Request<Incoming>,
    readiness: Readiness,
    draining: bool,
) -> Response<Full<Bytes>> {
    if req.uri().path() != "/healthz/ready" {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    if draining {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "not ready, pending: draining\n");
    }
    match readiness.status() {
        Ok(()) => text(StatusCode::OK, "ready\n"),
        Err(pending) => {
            text(StatusCode::INTERNAL_SERVER_ERROR, format!("not ready, pending: {}\n", pending.join(", ")))
        }
    }
}

/// Metrics (`/metrics`, `/stats/prometheus` on 15020).
pub async fn metrics(req: Request<Incoming>, registry: Arc<Registry>) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/metrics" | "/stats/prometheus" => {}
        _ => return text(StatusCode::NOT_FOUND, "not found\n"),
    }
    let mut body = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut body, &registry) {
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

/// The admin dashboard's text (`/`).
const INDEX: &str = "ambit proxy admin
  /config_dump            state, config and certificates (JSON)
  /logging                POST: show the log level; ?level=<level> or ?level=<mod>:<level>,...; ?reset
  /debug/pprof/profile    GET: CPU profile (pprof protobuf); ?seconds=1..300 (10), ?frequency=1..1000 Hz (100)
  /quitquitquit           POST: drain and exit
";

/// Admin (`/`, `/config_dump`, `/logging`, `/debug/pprof/profile`, `/quitquitquit` on
/// 127.0.0.1:15000).
pub async fn admin(req: Request<Incoming>, ctx: Arc<AdminCtx>) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/config_dump" => {
            let body = config_dump(&ctx);
            Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_default()
        }
        "/quitquitquit" => {
            if req.method() != Method::POST {
                return text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n");
            }
            ctx.quit.notify_one();
            text(StatusCode::OK, "shutdown now\n")
        }
        _ => tools(req.method(), req.uri(), crate::logging::control()).await,
    }
}

/// The admin endpoints that need no proxy state: `/`, `/logging`, `/debug/pprof/profile`, 404.
pub async fn tools(method: &Method, uri: &http::Uri, logs: Option<&LogControl>) -> Response<Full<Bytes>> {
    match uri.path() {
        "/" => text(StatusCode::OK, INDEX),
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
fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned().collect()
}

/// `/logging` as `istioctl ztunnel-config log` drives it.
fn logging(method: &Method, query: Option<&str>, logs: Option<&LogControl>) -> Response<Full<Bytes>> {
    use crate::logging::HELP;
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
        Err(e @ crate::logging::LevelError::Gone) => {
            text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n{HELP}"))
        }
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
                    ProfileError::Param { name, value: crate::metrics::clip(v, 64).into_owned(), min: 1, max }
                }),
            }
        };
        let seconds = get("seconds", 10, 300)?;
        let frequency = get("frequency", 100, 1000)?;
        Ok(ProfileRequest { seconds, frequency: u32::try_from(frequency).unwrap_or(1000) })
    }
}

/// `/debug/pprof/profile`: samples the whole process's CPU use and answers pprof protobuf.
async fn profile(query: Option<&str>) -> Response<Full<Bytes>> {
    let req = match ProfileRequest::parse(query) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    match crate::profile::cpu(req.seconds, req.frequency).await {
        Ok(bytes) => Response::builder()
            .header("content-type", "application/octet-stream")
            .header("content-disposition", "attachment; filename=\"profile\"")
            .body(Full::new(Bytes::from(bytes)))
            .unwrap_or_default(),
        Err(e @ ProfileError::Busy) => text(StatusCode::CONFLICT, format!("{e}\n")),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

fn config_dump(ctx: &AdminCtx) -> String {
    let state = ctx.shared.state.current();
    let mut dump = state.dump();
    if let serde_json::Value::Object(map) = &mut dump {
        map.insert("config".into(), serde_json::to_value(ctx.shared.cfg.as_ref()).unwrap_or_default());
        map.insert("certificates".into(), serde_json::to_value(ctx.shared.certs.dump()).unwrap_or_default());
        map.insert(
            "version".into(),
            serde_json::json!({
                "version": env!("CARGO_PKG_VERSION"),
                "cryptoProvider": "aws-lc-rs",
            }),
        );
        map.insert(
            "connections".into(),
            serde_json::json!({
                "inboundTracked": ctx.shared.connections.len(),
                "active": ctx.drain.active(),
            }),
        );
        map.insert("limits".into(), serde_json::to_value(ctx.shared.limits.dump()).unwrap_or_default());
        if let Some(w) = &ctx.workloads {
            map.insert("workloadState".into(), w.dump());
        }
        // Per type: version, nonce, resources held, last NACK; the connection's state.
        if let Some(x) = &ctx.shared.xds {
            map.insert("xds".into(), serde_json::to_value(x.status()).unwrap_or_default());
        }
    }
    serde_json::to_string_pretty(&dump).unwrap_or_default()
}

/// Binds `addr`, logging and returning `None` on failure (admin endpoints are not fatal).
pub fn bind_std(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

#[cfg(test)]
mod tests;
