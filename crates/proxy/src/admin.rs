//! Admin (config dump, quitquitquit), metrics and readiness HTTP servers.

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

/// Admin (`/`, `/config_dump`, `/quitquitquit` on 127.0.0.1:15000).
pub async fn admin(req: Request<Incoming>, ctx: Arc<AdminCtx>) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/" => text(
            StatusCode::OK,
            "ambit proxy admin\n  /config_dump   state, config and certificates (JSON)\n  /quitquitquit  POST: drain and exit\n",
        ),
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
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
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
    }
    serde_json::to_string_pretty(&dump).unwrap_or_default()
}

/// Binds `addr`, logging and returning `None` on failure (admin endpoints are not fatal).
pub fn bind_std(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}
