//! The HBONE server side: HTTP/2 over an accepted TLS session ([`crate::conn`]), one task per
//! CONNECT, with a deadline on every phase of the connection and the peer's budget applied to
//! its streams and windows.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::conn::{self, ConnError, ConnErrorKind, Keepalive, StreamHandle};
use crate::frame::Reason;
use crate::hpack::Decoded;
use crate::tls::Established;
use crate::{H2Settings, PING_INTERVAL, PING_TIMEOUT};

/// The HTTP/2 windows one connection offers its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub stream: u32,
    /// Connection window (target).
    pub connection: u32,
}

/// What one peer's connection may take: the windows it is offered (the most it can make the
/// server buffer) and its streams. The proxy's per-peer caps implement it.
pub trait PeerBudget: Send + 'static {
    /// Held for as long as one stream is open.
    type Slot: Send + 'static;
    /// The windows of the connection's HTTP/2 handshake (called once, first).
    fn windows(&mut self) -> Windows;
    /// Larger windows to offer now that a stream opened, if the budget has room again.
    fn grow(&mut self) -> Option<Windows>;
    /// A slot for a new stream, or `None` to refuse it (REFUSED_STREAM); a refusal is the
    /// budget's to count and report.
    fn open_stream(&mut self) -> Option<Self::Slot>;
}

/// How a server learns that its process is going away, and where it runs its streams' tasks
/// (so that a drain can wait for them).
pub trait Shutdown: Send + Sync + 'static {
    /// Resolves when a graceful drain starts: the connection sends GOAWAY and lets open streams
    /// finish.
    fn started(&self) -> impl Future<Output = ()> + Send;
    /// Resolves when connections must close now.
    fn forced(&self) -> impl Future<Output = ()> + Send;
    /// Runs one stream's handler.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static);
}

/// One CONNECT request, ready to be answered.
pub struct ConnectRequest {
    /// The request head.
    pub head: Decoded,
    /// The stream: answer with [`StreamHandle::respond`], then relay.
    pub stream: StreamHandle,
}

impl ConnectRequest {
    /// Answers with an error status and ends the stream.
    pub fn reject(self, status: StatusCode) {
        let _ = self.stream.respond(status.as_u16(), &HeaderMap::new(), true);
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
    Handshake(ConnError),
    /// No CONNECT in time.
    #[error(
        "no CONNECT within {0:?} of the HTTP/2 preface (AMBIT_HBONE_FIRST_STREAM_TIMEOUT): connection closed"
    )]
    FirstStreamTimeout(Duration),
    /// The connection failed.
    #[error("http2 error: {0}")]
    H2(ConnError),
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

/// Runs HTTP/2 over an established TLS session, handing every request to `handle` on a task of
/// `shutdown`'s. The peer gets the windows its `budget` grants; a stream the budget refuses is
/// reset (REFUSED_STREAM). When a drain starts the server sends GOAWAY and lets open streams
/// finish; when the drain is forced it stops serving (closing the connection).
pub async fn serve<B, S, F, Fut>(
    tcp: TcpStream,
    tls: Established,
    cfg: ServerConfig,
    mut budget: B,
    shutdown: &S,
    handle: F,
) -> Result<Ended, ServeError>
where
    B: PeerBudget,
    S: Shutdown,
    F: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let windows = budget.windows();
    let engine = conn::Config {
        stream_window: windows.stream,
        connection_window: windows.connection,
        max_frame_size: cfg.settings.frame_size,
        max_concurrent_streams: Some(200),
        max_header_list_size: 64 * 1024,
        keepalive: Some(Keepalive { interval: PING_INTERVAL, timeout: PING_TIMEOUT }),
    };
    let mut conn = conn::server(tcp, tls, engine).map_err(ServeError::Handshake)?;
    let handle = Arc::new(handle);
    let activity = Arc::new(Activity::new());
    let mut goaway_sent = false;
    // One timer for the preface deadline, then the first-stream deadline, then the idle
    // deadline, then the close grace.
    let timer = tokio::time::sleep(cfg.preface_timeout);
    tokio::pin!(timer);
    let mut seen_stream = false;
    let mut closing: Option<Result<Ended, ServeError>> = None;
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok(conn::Incoming { head, stream })) => {
                    if !seen_stream {
                        seen_stream = true;
                        timer.as_mut().reset(Instant::now() + cfg.idle_timeout);
                    }
                    let Some(slot) = budget.open_stream() else {
                        stream.reset(Reason::REFUSED_STREAM);
                        continue;
                    };
                    if let Some(w) = budget.grow() {
                        conn.grow_windows(w.stream, w.connection);
                    }
                    let open = activity.enter();
                    let h = handle.clone();
                    shutdown.spawn(async move {
                        h(ConnectRequest { head, stream }).await;
                        drop((open, slot));
                    });
                }
                Some(Err(e)) => {
                    return closing.unwrap_or(match e.kind {
                        ConnErrorKind::PeerDead => {
                            tracing::debug!("HBONE peer stopped answering pings; closing the connection");
                            Ok(Ended::PeerDead)
                        }
                        ConnErrorKind::Closed => Ok(Ended::Closed),
                        _ => Err(ServeError::H2(e)),
                    });
                }
                None => return closing.unwrap_or(Ok(Ended::Closed)),
            },
            () = &mut timer => {
                if closing.is_some() {
                    return closing.unwrap_or(Ok(Ended::Closed));
                }
                let now = Instant::now();
                let next = match conn.preface_received_at() {
                    None => return Err(ServeError::PrefaceTimeout(cfg.preface_timeout)),
                    Some(at) if !seen_stream => {
                        let due = at + cfg.first_stream_timeout;
                        if due <= now {
                            closing = Some(Err(ServeError::FirstStreamTimeout(cfg.first_stream_timeout)));
                            None
                        } else {
                            Some(due)
                        }
                    }
                    Some(_) if activity.open() > 0 => Some(now + cfg.idle_timeout),
                    Some(_) => {
                        let due = activity.idle_since() + cfg.idle_timeout;
                        if due <= now {
                            closing = Some(Ok(Ended::Idle));
                            None
                        } else {
                            Some(due)
                        }
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
            _ = shutdown.started(), if !goaway_sent => {
                goaway_sent = true;
                conn.graceful_shutdown();
            }
            _ = shutdown.forced() => return Ok(Ended::Drained),
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

#[cfg(test)]
mod tests;
