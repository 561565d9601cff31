//! The HBONE server side: HTTP/2 over an accepted TLS stream, one task per CONNECT, with a
//! deadline on every phase of the connection and the per-peer caps applied to its streams and
//! windows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{H2Settings, keepalive};
use crate::drain::Drain;
use crate::limits::{LimitMetrics, PeerConn};

/// One CONNECT request, ready to be answered.
pub struct ConnectRequest {
    /// The request head.
    pub request: Request<h2::RecvStream>,
    /// Where to send the response.
    pub respond: h2::server::SendResponse<Bytes>,
}

impl ConnectRequest {
    /// Answers with an error status and ends the stream.
    pub fn reject(mut self, status: StatusCode) {
        let resp = Response::builder().status(status).body(()).unwrap_or_default();
        let _ = self.respond.send_response(resp, true);
    }
}

/// HTTP/2 settings and phase deadlines of a server-side HBONE connection.
#[derive(Clone, Copy, Debug)]
pub struct ServerConfig {
    /// HTTP/2 settings (the windows are the most a peer gets; its budget may give less).
    pub settings: H2Settings,
    /// TLS done → the client's HTTP/2 preface.
    pub preface_timeout: Duration,
    /// Preface → the first CONNECT.
    pub first_stream_timeout: Duration,
    /// No open stream for this long → GOAWAY and close.
    pub idle_timeout: Duration,
}

impl ServerConfig {
    /// `settings` with the default deadlines (10 s, 10 s, 10 min).
    pub fn new(settings: H2Settings) -> ServerConfig {
        ServerConfig {
            settings,
            preface_timeout: Duration::from_secs(10),
            first_stream_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
        }
    }
}

/// Why a connection ended (other than by the client closing it or an HTTP/2 error).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// No HTTP/2 preface in time.
    #[error(
        "no HTTP/2 preface within {0:?} of the TLS handshake (AMBIT_HBONE_PREFACE_TIMEOUT): connection closed"
    )]
    PrefaceTimeout(Duration),
    /// The HTTP/2 handshake failed.
    #[error("http2 handshake failed: {0}")]
    Handshake(h2::Error),
    /// No CONNECT in time.
    #[error(
        "no CONNECT within {0:?} of the HTTP/2 preface (AMBIT_HBONE_FIRST_STREAM_TIMEOUT): connection closed"
    )]
    FirstStreamTimeout(Duration),
    /// The connection failed.
    #[error("http2 error: {0}")]
    H2(h2::Error),
}

/// How a connection ended without a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The client closed it (or it ended after GOAWAY).
    Closed,
    /// Idle for the idle timeout: closed with GOAWAY.
    Idle,
    /// The drain was forced.
    Drained,
    /// The client stopped answering PINGs.
    PeerDead,
}

/// How long a connection that is being closed by us may take to flush its GOAWAY.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Runs HTTP/2 over an established TLS stream, handing every request to `handle` on its own
/// task. The peer gets the windows `peer` grants it; a stream over the peer's stream cap is
/// refused (REFUSED_STREAM, counted in `metrics`). On drain the server sends GOAWAY and lets
/// open streams finish; when the drain is forced it stops polling (closing the connection).
pub async fn serve<F, Fut>(
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    cfg: ServerConfig,
    mut peer: PeerConn,
    metrics: LimitMetrics,
    drain: Drain,
    handle: F,
) -> Result<Ended, ServeError>
where
    F: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let windows = peer.windows();
    let handshake = h2::server::Builder::new()
        .initial_window_size(windows.stream)
        .initial_connection_window_size(windows.connection)
        .max_frame_size(cfg.settings.frame_size)
        .max_concurrent_streams(200)
        .max_header_list_size(64 * 1024)
        .max_send_buffer_size(400 * 1024)
        .handshake::<_, Bytes>(tls);
    let mut conn = match tokio::time::timeout(cfg.preface_timeout, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(ServeError::Handshake(e)),
        Err(_) => return Err(ServeError::PrefaceTimeout(cfg.preface_timeout)),
    };
    // The keepalive task lives exactly as long as this connection.
    // A peer that stops answering PINGs gets its connection closed.
    let alive = tokio_util::sync::CancellationToken::new();
    let _alive = alive.clone().drop_guard();
    let dead = tokio_util::sync::CancellationToken::new();
    if let Some(pp) = conn.ping_pong() {
        let (d, dead) = (drain.clone(), dead.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = keepalive(pp) => dead.cancel(),
                _ = d.forced() => {}
                _ = alive.cancelled() => {}
            }
        });
    }
    let handle = Arc::new(handle);
    let activity = Arc::new(Activity::new());
    let mut goaway_sent = false;
    // One timer for the first-stream deadline, then the idle deadline, then the close grace.
    let timer = tokio::time::sleep(cfg.first_stream_timeout);
    tokio::pin!(timer);
    let mut seen_stream = false;
    let mut closing: Option<Result<Ended, ServeError>> = None;
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((request, mut respond))) => {
                    if !seen_stream {
                        seen_stream = true;
                        timer.as_mut().reset(Instant::now() + cfg.idle_timeout);
                    }
                    let slot = match peer.open_stream() {
                        Ok(s) => s,
                        Err(refusal) => {
                            metrics.refused(&refusal, None);
                            respond.send_reset(h2::Reason::REFUSED_STREAM);
                            continue;
                        }
                    };
                    if let Some(w) = peer.grow() {
                        conn.set_target_window_size(w.connection);
                        let _ = conn.set_initial_window_size(w.stream);
                    }
                    let open = activity.enter();
                    let h = handle.clone();
                    drain.spawn(async move {
                        h(ConnectRequest { request, respond }).await;
                        drop((open, slot));
                    });
                }
                Some(Err(e)) => return closing.unwrap_or(Err(ServeError::H2(e))),
                None => return closing.unwrap_or(Ok(Ended::Closed)),
            },
            () = &mut timer => {
                if closing.is_some() {
                    return closing.unwrap_or(Ok(Ended::Closed));
                }
                let now = Instant::now();
                let next = if !seen_stream {
                    closing = Some(Err(ServeError::FirstStreamTimeout(cfg.first_stream_timeout)));
                    None
                } else if activity.open() > 0 {
                    Some(now + cfg.idle_timeout)
                } else {
                    let idle_since = activity.idle_since();
                    let due = idle_since + cfg.idle_timeout;
                    if due <= now {
                        closing = Some(Ok(Ended::Idle));
                        None
                    } else {
                        Some(due)
                    }
                };
                match next {
                    Some(at) => timer.as_mut().reset(at),
                    None => {
                        if !goaway_sent {
                            goaway_sent = true;
                            conn.graceful_shutdown();
                        }
                        timer.as_mut().reset(now + CLOSE_GRACE);
                    }
                }
            }
            _ = drain.started(), if !goaway_sent => {
                goaway_sent = true;
                conn.graceful_shutdown();
            }
            _ = drain.forced() => return Ok(Ended::Drained),
            _ = dead.cancelled() => {
                tracing::debug!("HBONE peer stopped answering pings; closing the connection");
                return Ok(Ended::PeerDead);
            }
        }
    }
}

/// Open streams of one connection and since when it has none.
struct Activity {
    start: Instant,
    open: AtomicUsize,
    /// Milliseconds after `start` at which the last stream ended.
    idle_since_ms: AtomicU64,
}

/// One open stream of a connection.
struct Open(Arc<Activity>);

impl Activity {
    fn new() -> Activity {
        Activity { start: Instant::now(), open: AtomicUsize::new(0), idle_since_ms: AtomicU64::new(0) }
    }

    fn enter(self: &Arc<Self>) -> Open {
        self.open.fetch_add(1, Ordering::AcqRel);
        Open(self.clone())
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    fn idle_since(&self) -> Instant {
        self.start + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Stamp before the count drops, so the connection never sees zero streams with an old stamp.
        self.0.idle_since_ms.fetch_max(ms, Ordering::AcqRel);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}
