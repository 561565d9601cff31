//! The UDP and TCP serving loops (TCP: 2-byte length prefix, 5 s request timeout).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::forward::MAX_MESSAGE;
use super::{DnsProxy, Protocol};

/// How long a TCP client may take to send a whole request (also the idle timeout between requests).
pub const TCP_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// UDP queries answered concurrently (more wait in the socket buffer).
const MAX_UDP_IN_FLIGHT: usize = 512;
/// TCP connections served concurrently (more wait in the accept queue).
const MAX_TCP_CONNECTIONS: usize = 128;
/// Pause after a failed accept/receive, so a persistent error does not spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(20);

thread_local! {
    /// One receive buffer per thread for every UDP DNS socket of every pod: a datagram is copied
    /// out at once, so a socket waiting for one holds no buffer. (A 64 KiB buffer per socket
    /// costs nothing while its pages are fresh, but once the allocator hands out reused memory
    /// it is 128 KiB of resident memory per idle pod.)
    static RECV_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0u8; MAX_MESSAGE]);
}

/// Receives one datagram of up to [`MAX_MESSAGE`] bytes: its bytes and its sender. Cancel-safe.
pub(super) async fn recv_datagram(socket: &UdpSocket) -> std::io::Result<(Vec<u8>, SocketAddr)> {
    loop {
        socket.readable().await?;
        let received = RECV_BUF
            .with_borrow_mut(|buf| socket.try_recv_from(buf).map(|(n, peer)| (buf[..n].to_vec(), peer)));
        match received {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

impl DnsProxy {
    /// Serves DNS over UDP on `socket` until `stop` is cancelled (in-flight queries are dropped).
    pub async fn serve_udp(self: Arc<Self>, socket: UdpSocket, stop: CancellationToken) {
        let socket = Arc::new(socket);
        let slots = Arc::new(Semaphore::new(MAX_UDP_IN_FLIGHT));
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => break,
                r = recv_datagram(&socket) => r,
            };
            let (query, peer) = match received {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(target: "dns", error = %e, "UDP receive failed");
                    tokio::time::sleep(ERROR_BACKOFF).await;
                    continue;
                }
            };
            let permit = tokio::select! {
                _ = stop.cancelled() => break,
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let (proxy, socket, stop) = (self.clone(), socket.clone(), stop.clone());
            tokio::spawn(async move {
                let _permit = permit;
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = proxy.reply_udp(&socket, &query, peer) => {}
                }
            });
        }
    }

    /// Serves DNS over TCP on `listener` until `stop` is cancelled (open connections are closed).
    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener, stop: CancellationToken) {
        let slots = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
        loop {
            let permit = tokio::select! {
                _ = stop.cancelled() => break,
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let accepted = tokio::select! {
                _ = stop.cancelled() => break,
                r = listener.accept() => r,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!(target: "dns", error = %e, "TCP accept failed");
                    tokio::time::sleep(ERROR_BACKOFF).await;
                    continue;
                }
            };
            let (proxy, stop) = (self.clone(), stop.clone());
            tokio::spawn(async move {
                let _permit = permit;
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = proxy.serve_connection(stream) => {}
                }
            });
        }
    }

    async fn reply_udp(&self, socket: &UdpSocket, query: &[u8], peer: SocketAddr) {
        if let Some(response) = self.answer(query, Protocol::Udp).await
            && let Err(e) = socket.send_to(&response, peer).await
        {
            tracing::debug!(target: "dns", %peer, error = %e, "UDP send failed");
        }
    }

    /// Answers length-prefixed queries one after another until the client closes, stalls for
    /// [`TCP_REQUEST_TIMEOUT`], or sends something that is not a DNS message.
    async fn serve_connection(&self, mut stream: TcpStream) {
        loop {
            let query = match tokio::time::timeout(TCP_REQUEST_TIMEOUT, read_frame(&mut stream)).await {
                Ok(Ok(Some(q))) => q,
                _ => return,
            };
            let Some(response) = self.answer(&query, Protocol::Tcp).await else {
                return;
            };
            let Ok(len) = u16::try_from(response.len()) else {
                return;
            };
            let mut frame = Vec::with_capacity(response.len() + 2);
            frame.extend_from_slice(&len.to_be_bytes());
            frame.extend_from_slice(&response);
            if stream.write_all(&frame).await.is_err() {
                return;
            }
        }
    }
}

/// One length-prefixed message; `None` at a clean end of stream or for an empty frame.
async fn read_frame(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = usize::from(u16::from_be_bytes(len));
    if len == 0 {
        return Ok(None);
    }
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).await?;
    Ok(Some(buf))
}
