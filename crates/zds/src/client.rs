//! The client side of ZDS, used by the node proxy: connect, hello, receive requests, ack.

use std::io;
use std::path::Path;

use tokio_seqpacket::UnixSeqpacket;

use crate::message::{self, Ack, RecvError, Request};
use crate::packet;

/// A connection from the node proxy to the node agent.
#[derive(Debug)]
pub struct ZdsClient {
    socket: UnixSeqpacket,
}

impl ZdsClient {
    /// Connects (non-blocking `SOCK_SEQPACKET` connect) and sends `ZdsHello{V1}`.
    ///
    /// Retrying with backoff is the caller's job: upstream waits 20 ms doubling to 15 s.
    pub async fn connect(path: &Path) -> io::Result<ZdsClient> {
        let socket = UnixSeqpacket::connect(path).await.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot connect to the node agent's ZDS socket {}: {e}; is the node agent running?",
                    path.display()
                ),
            )
        })?;
        packet::send(&socket, &message::encode_hello(), &[]).await.map_err(|e| {
            io::Error::new(e.kind(), format!("cannot send the ZDS hello to the node agent: {e}"))
        })?;
        Ok(ZdsClient { socket })
    }

    /// Receives the next request; `Ok(None)` when the agent closed the connection.
    ///
    /// After `Err(RecvError::Protocol(_))` the connection is still usable for the NACK; upstream
    /// then reconnects (or exits if [`crate::ProtocolError::is_fatal`]).
    pub async fn recv(&mut self) -> Result<Option<Request>, RecvError> {
        let Some(packet) = packet::recv(&self.socket).await? else {
            return Ok(None);
        };
        Ok(Some(message::decode_request(&packet.bytes, packet.fds)?))
    }

    /// Answers the last request with an [`Ack`] (or `Ok(())` / `Err(reason)`, converted).
    pub async fn ack(&mut self, ack: impl Into<Ack>) -> io::Result<()> {
        packet::send(&self.socket, &message::encode_ack(&ack.into()), &[]).await
    }
}
