//! The server side of ZDS, used by the node agent (and tests): listen, accept, send requests.

use std::future::Future;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_seqpacket::{UnixSeqpacket, UnixSeqpacketListener};

use crate::message::{self, Ack, ProtocolError, RecvError, WorkloadInfo};
use crate::packet;

/// How long the server waits for a hello, for a send, and for an ack (upstream: 5 s each).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The node agent's listening ZDS socket.
#[derive(Debug)]
pub struct ZdsListener {
    listener: Mutex<UnixSeqpacketListener>,
    path: PathBuf,
}

/// One accepted node-proxy connection; requests are strictly sequential (send, then ack).
///
/// Acks are matched to requests only by order (as upstream). After a timeout, or if a request
/// future is dropped mid-way, a late ack may be read as the next request's; callers that need
/// certainty should close the connection then (the proxy reconnects and gets a fresh snapshot).
#[derive(Debug)]
pub struct ZdsServerConn {
    socket: UnixSeqpacket,
    timeout: Duration,
}

/// Credentials of the process that connected (from `SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id, when the kernel reports one.
    pub pid: Option<i32>,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl ZdsListener {
    /// Unlinks a stale socket file at `path`, then binds and listens (must run inside Tokio).
    pub fn bind(path: &Path) -> io::Result<Self> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot remove stale ZDS socket {}: {e}", path.display()),
                ));
            }
        }
        let listener = UnixSeqpacketListener::bind(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot listen on ZDS socket {}: {e}; does its directory exist and is it writable?",
                    path.display()
                ),
            )
        })?;
        Ok(ZdsListener { listener: Mutex::new(listener), path: path.to_owned() })
    }

    /// The socket path this listener is bound to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts the next node-proxy connection (call [`ZdsServerConn::recv_hello`] next).
    pub async fn accept(&self) -> io::Result<ZdsServerConn> {
        let socket = self.listener.lock().await.accept().await?;
        Ok(ZdsServerConn { socket, timeout: DEFAULT_TIMEOUT })
    }
}

impl ZdsServerConn {
    /// Sets the deadline for each hello read, send and ack read (default [`DEFAULT_TIMEOUT`]).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Reads the client's `ZdsHello` and returns its version (1 = V1; not checked, as upstream).
    pub async fn recv_hello(&mut self) -> Result<u32, RecvError> {
        let packet = self.recv_packet("the ZDS hello").await?;
        Ok(message::decode_hello(&packet.bytes, packet.fds)?)
    }

    /// Sends `AddWorkload` with the pod's netns fd and waits for the proxy's [`Ack`].
    pub async fn add(
        &mut self,
        uid: &str,
        info: &WorkloadInfo,
        netns: BorrowedFd<'_>,
    ) -> Result<Ack, RecvError> {
        let bytes = message::encode_add(uid, info)?;
        self.request(&bytes, &[netns]).await
    }

    /// Sends `KeepWorkload` (snapshot only) and waits for the ack.
    pub async fn keep(&mut self, uid: &str) -> Result<Ack, RecvError> {
        let bytes = message::encode_keep(uid)?;
        self.request(&bytes, &[]).await
    }

    /// Sends `DelWorkload` and waits for the ack.
    pub async fn del(&mut self, uid: &str) -> Result<Ack, RecvError> {
        let bytes = message::encode_del(uid)?;
        self.request(&bytes, &[]).await
    }

    /// Sends `SnapshotSent` and waits for the ack.
    pub async fn snapshot_sent(&mut self) -> Result<Ack, RecvError> {
        self.request(&message::encode_snapshot_sent(), &[]).await
    }

    /// Sends arbitrary bytes with arbitrary fds as one record (for tests of bad input).
    pub async fn send_raw(&mut self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        self.with_timeout("sending a ZDS message", packet::send(&self.socket, bytes, fds)).await?
    }

    /// Reads the [`Ack`] of the last request.
    pub async fn recv_ack(&mut self) -> Result<Ack, RecvError> {
        let packet = self.recv_packet("the ZDS ack").await?;
        Ok(message::decode_response(&packet.bytes, packet.fds)?)
    }

    /// Keepalive while idle: `Ok(true)` if nothing arrived within `wait` (alive), `Ok(false)`
    /// if the proxy closed the connection, an error if it sent unsolicited data.
    pub async fn check_idle(&mut self, wait: Duration) -> Result<bool, RecvError> {
        match tokio::time::timeout(wait, packet::recv(&self.socket)).await {
            Err(_elapsed) => Ok(true),
            Ok(Ok(None)) => Ok(false),
            Ok(Ok(Some(_))) => Err(ProtocolError::Unsolicited.into()),
            Ok(Err(e)) => Err(e),
        }
    }

    /// The credentials of the connected process.
    pub fn peer_cred(&self) -> io::Result<PeerCred> {
        let cred = self.socket.peer_cred()?;
        Ok(PeerCred { pid: cred.pid(), uid: cred.uid(), gid: cred.gid() })
    }

    async fn request(&mut self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<Ack, RecvError> {
        self.send_raw(bytes, fds).await?;
        self.recv_ack().await
    }

    async fn recv_packet(&self, what: &str) -> Result<packet::Packet, RecvError> {
        match self.with_timeout(&format!("waiting for {what}"), packet::recv(&self.socket)).await?? {
            Some(packet) => Ok(packet),
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the node proxy closed the ZDS connection while the agent was waiting for {what}"),
            )
            .into()),
        }
    }

    async fn with_timeout<T>(&self, what: &str, fut: impl Future<Output = T>) -> io::Result<T> {
        tokio::time::timeout(self.timeout, fut).await.map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("timed out after {:?} {what}; is the node proxy stuck?", self.timeout),
            )
        })
    }
}
