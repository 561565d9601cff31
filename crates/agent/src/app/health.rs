//! The agent's small HTTP servers: health (`/healthz`, `/readyz`) and metrics (`/metrics`).
//!
//! Health is bound first, before the pod source is read, so that a probe always gets an answer:
//! `/healthz` is 200 while the process runs, `/readyz` is 503 with the reason until the agent is
//! ready (for example "waiting for the initial list of pods and namespaces from the Kubernetes API
//! server; last error: …"), then 200.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;

use super::AgentError;

pub use ambit_admin::Readiness;

/// Binds the health address and serves `/healthz` and `/readyz`.
pub async fn serve_health(addr: SocketAddr, readiness: Arc<Readiness>) -> Result<(), AgentError> {
    spawn_http(addr, "health", move |path| match path {
        "/healthz" => (200, "ok\n".into()),
        "/readyz" => match readiness.reason() {
            None => (200, "ready\n".into()),
            Some(reason) => (503, format!("not ready: {reason}\n")),
        },
        _ => (404, "not found\n".into()),
    })
    .await
}

/// Binds the metrics address and serves `/metrics`.
pub async fn serve_metrics(addr: SocketAddr, registry: Arc<Registry>) -> Result<(), AgentError> {
    spawn_http(addr, "metrics", move |path| {
        if path != "/metrics" {
            return (404, "not found\n".into());
        }
        let mut body = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut body, &registry);
        (200, body)
    })
    .await
}

/// A tiny HTTP/1.1 server answering by path.
async fn spawn_http(
    addr: SocketAddr,
    what: &'static str,
    handler: impl Fn(&str) -> (u16, String) + Send + Sync + Clone + 'static,
) -> Result<(), AgentError> {
    let listener = ambit_admin::bind(addr).map_err(|error| AgentError::Bind {
        what,
        where_: addr.to_string(),
        error,
    })?;
    tokio::spawn(ambit_admin::serve(listener, move |req: http::Request<hyper::body::Incoming>| {
        let (status, body) = handler(req.uri().path());
        let status = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        async move { ambit_admin::text(status, body) }
    }));
    Ok(())
}
