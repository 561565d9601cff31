//! The waypoint's admin (127.0.0.1:15000), metrics (15020) and readiness (15021) endpoints, on
//! `ambit-admin`'s server.

use std::sync::Arc;

use ambit_admin::{Body, Readiness, text};
use ambit_hbone::Drain;
use ambit_identity::CertManager;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use super::args::Config;
use super::xds::Xds;

/// What the admin endpoints read.
pub(crate) struct AdminCtx {
    pub(crate) cfg: Arc<Config>,
    pub(crate) certs: Arc<CertManager>,
    pub(crate) xds: Xds,
    pub(crate) drain: Drain,
    pub(crate) quit: Arc<Notify>,
    pub(crate) waypoint: crate::Waypoint,
}

/// The admin dashboard's text (`/`).
const INDEX: &str = "ambit waypoint admin
  /config_dump            config, certificates, xDS state, resources held and refusals (JSON)
  /debug/serving          what it serves: each destination's listeners, routes, policies, endpoints (JSON)
  /logging                POST: show the log level; ?level=<level> or ?level=<mod>:<level>,...; ?reset
  /debug/pprof/profile    GET: CPU profile (pprof protobuf); ?seconds=1..300 (10), ?frequency=1..1000 Hz (100)
  /quitquitquit           POST: drain and exit
";

/// Admin (`/`, `/config_dump`, `/logging`, `/debug/pprof/profile`, `/quitquitquit`).
pub(crate) async fn admin(req: Request<Incoming>, ctx: Arc<AdminCtx>) -> Response<Body> {
    match req.uri().path() {
        "/config_dump" => ambit_admin::json(&serde_json::json!({
            "config": &*ctx.cfg,
            "certificates": ctx.certs.dump(),
            "xds": ctx.xds.status(),
            "resources": ctx.xds.held(),
            "connections": { "activeStreams": ctx.drain.active() },
            "version": { "version": env!("CARGO_PKG_VERSION"), "cryptoProvider": "aws-lc-rs" },
        })),
        "/debug/serving" => ambit_admin::json(&ctx.waypoint.config().dump()),
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

/// Metrics (`/metrics`, `/stats/prometheus`).
pub(crate) async fn metrics(req: Request<Incoming>, registry: Arc<Registry>) -> Response<Body> {
    match req.uri().path() {
        "/metrics" | "/stats/prometheus" => ambit_admin::metrics(&req, &registry),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Readiness (`/healthz/ready`): 200 once the certificate and the first xDS sync are in, 503
/// before and while draining.
pub(crate) async fn readiness(req: Request<Incoming>, readiness: Arc<Readiness>) -> Response<Body> {
    if req.uri().path() != "/healthz/ready" {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match readiness.reason() {
        None => text(StatusCode::OK, "ready\n"),
        Some(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")),
    }
}
