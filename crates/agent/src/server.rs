//! The CNI event server: the plugin's `POST /cmdadd` on `<run dir>/pluginevent.sock`, answered
//! only once the pod is captured and its proxy acked (or at once when it is not enrolled).
//!
//! Answers (the body is always one line of text for the operator):
//!
//! | Status | When | The plugin reports |
//! |---|---|---|
//! | 200 | captured and acked, or not to be enrolled | success |
//! | 400 | a body that is not the event, a netns path of the wrong form, a netns that is not a pod's | CNI code 999 |
//! | 404 / 405 | another path or method | CNI code 999 |
//! | 503 | retryable: no proxy connected, the proxy refused or did not answer, the pod not known yet | CNI code 11 (try again) |
//! | 500 | capture failed, or a running pod's netns was not found | CNI code 999 |
//!
//! istio-cni answers 500 for every processing error; 503 for the retryable ones lets the
//! plugin tell the runtime to try again (its code 11) instead of reporting a permanent failure.

use std::convert::Infallible;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;

use ambit_cni::event::{EVENT_PATH, PluginEvent, STATUS_RETRY};

use crate::mesh::{AddOutcome, Mesh, MeshError};

/// Largest accepted request body (the event is a few hundred bytes).
const MAX_BODY: usize = 64 * 1024;

/// Counts what the server did, for metrics.
pub trait EventMetrics: Send + Sync + 'static {
    /// One request finished with `outcome` (`enrolled`, `not_enrolled`, `bad_request`, `error`)
    /// and the HTTP status `code` the plugin got.
    fn observe(&self, outcome: &'static str, code: u16, seconds: f64);
}

/// Binds the socket (replacing a stale one; owner-only permissions).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Serves plugin events forever.
pub async fn serve(listener: UnixListener, mesh: Arc<Mesh>, metrics: Arc<dyn EventMetrics>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a CNI plugin connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (mesh, metrics) = (mesh.clone(), metrics.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let (mesh, metrics) = (mesh.clone(), metrics.clone());
                async move { Ok::<_, Infallible>(handle(req, &mesh, metrics.as_ref()).await) }
            });
            let _ =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

async fn handle(req: Request<Incoming>, mesh: &Mesh, metrics: &dyn EventMetrics) -> Response<Full<Bytes>> {
    let start = Instant::now();
    let (outcome, status, body) = answer(req, mesh).await;
    metrics.observe(outcome, status.as_u16(), start.elapsed().as_secs_f64());
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

async fn answer(req: Request<Incoming>, mesh: &Mesh) -> (&'static str, StatusCode, String) {
    if req.uri().path() != EVENT_PATH {
        return (
            "bad_request",
            StatusCode::NOT_FOUND,
            format!("unknown path; the plugin posts to {EVENT_PATH}\n"),
        );
    }
    if req.method() != Method::POST {
        return ("bad_request", StatusCode::METHOD_NOT_ALLOWED, "use POST\n".into());
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return ("bad_request", StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}\n"));
        }
    };
    let ev = match PluginEvent::parse(&body) {
        Ok(ev) => ev,
        Err(e) => return ("bad_request", StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let pod = format!("{}/{}", ev.pod_namespace, ev.pod_name);
    match mesh.cni_add(&ev).await {
        Ok(AddOutcome::Enrolled) => {
            ("enrolled", StatusCode::OK, format!("pod {pod} captured and handed to the node proxy\n"))
        }
        Ok(AddOutcome::NotEnrolled(why)) => {
            ("not_enrolled", StatusCode::OK, format!("pod {pod} is not in the mesh ({why})\n"))
        }
        Err(e) => {
            tracing::warn!(%pod, error = %e, "CNI ADD failed");
            let (status, hint) = status_of(&e);
            ("error", status, format!("{e}{hint}\n"))
        }
    }
}

/// The answer's status for a failed ADD, and a hint appended to the message.
fn status_of(e: &MeshError) -> (StatusCode, &'static str) {
    let retry = StatusCode::from_u16(STATUS_RETRY).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    match e {
        MeshError::InvalidNetns { .. } => (StatusCode::BAD_REQUEST, ""),
        e if e.retryable() => (retry, " (retryable: the runtime will retry the pod sandbox)"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, ""),
    }
}

#[cfg(test)]
mod tests;
