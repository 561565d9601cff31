//! The HBONE server side: TLS with the workload's certificate, HTTP/2, one task per CONNECT.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tokio::net::TcpStream;

use super::{H2Settings, keepalive};
use crate::drain::Drain;

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

/// Runs HTTP/2 over an established TLS stream, handing every request to `handle` on its own
/// task. On drain the server sends GOAWAY and lets open streams finish; when the drain is
/// forced it stops polling (closing the connection).
pub async fn serve<F, Fut>(
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    settings: H2Settings,
    drain: Drain,
    handle: F,
) -> Result<(), h2::Error>
where
    F: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut conn = h2::server::Builder::new()
        .initial_window_size(settings.window_size)
        .initial_connection_window_size(settings.connection_window_size)
        .max_frame_size(settings.frame_size)
        .max_concurrent_streams(200)
        .max_header_list_size(64 * 1024)
        .max_send_buffer_size(400 * 1024)
        .handshake::<_, Bytes>(tls)
        .await?;
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
    let mut goaway_sent = false;
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((request, respond))) => {
                    let h = handle.clone();
                    drain.spawn(async move { h(ConnectRequest { request, respond }).await });
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            },
            _ = drain.started(), if !goaway_sent => {
                goaway_sent = true;
                conn.graceful_shutdown();
            }
            _ = drain.forced() => return Ok(()),
            _ = dead.cancelled() => {
                tracing::debug!("HBONE peer stopped answering pings; closing the connection");
                return Ok(());
            }
        }
    }
}
