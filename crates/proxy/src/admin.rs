//! Admin (config dump, logging, CPU profile, quitquitquit), metrics and readiness HTTP servers.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use crate::drain::Drain;
use crate::instance::Shared;
use crate::readiness::Readiness;

use ambit_admin::text;
pub use ambit_admin::{bind_std, serve};

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
        "/metrics" | "/stats/prometheus" => ambit_admin::metrics(&req, &registry),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// The admin dashboard's text (`/`).
const INDEX: &str = "ambit proxy admin
  /config_dump            state, config and certificates (JSON)
  /debug/denials          the last connections denied by policy: time, peers, reason, deciding policies (JSON)
  /debug/connections      live inbound connections: peer, identity, workload, bytes each way, since (JSON)
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
        "/debug/denials" => ambit_admin::json(&ctx.shared.metrics.denials.list()),
        "/debug/connections" => ambit_admin::json(&ctx.shared.connections.dump()),
        "/quitquitquit" => {
            if req.method() != Method::POST {
                return text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n");
            }
            ctx.quit.notify_one();
            text(StatusCode::OK, "shutdown now\n")
        }
        _ => ambit_admin::tools(INDEX, req.method(), req.uri()).await,
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
            map.insert("workloadState".into(), w.dump(&ctx.shared.connections.dump()));
        }
        // Per type: version, nonce, resources held, last NACK; the connection's state.
        if let Some(x) = &ctx.shared.xds {
            map.insert("xds".into(), serde_json::to_value(x.status()).unwrap_or_default());
        }
    }
    serde_json::to_string_pretty(&dump).unwrap_or_default()
}
