//! ZDS, the protocol between the node agent (server) and the node proxy (client): typed
//! messages, their codec, and the `SOCK_SEQPACKET` transport that passes pod netns fds.
//!
//! One protobuf message per seqpacket record, at most [`MAX_MESSAGE`] bytes; the pod's
//! network namespace travels as exactly one `SCM_RIGHTS` fd beside each `AddWorkload`.
//! Upstream reference: Istio's `istio.workload.zds` (ztunnel `src/inpod`, istio-cni
//! `pkg/nodeagent`).

mod client;
mod message;
mod packet;
mod server;

pub use client::ZdsClient;
pub use message::{
    Ack, ProtocolError, RecvError, Request, WorkloadInfo, decode_hello, decode_request, decode_response,
    encode_ack, encode_add, encode_del, encode_hello, encode_keep, encode_snapshot_sent,
};
pub use server::{DEFAULT_TIMEOUT, PeerCred, ZdsListener, ZdsServerConn};

/// Largest ZDS record: both sides read into this many bytes; longer records are errors.
pub const MAX_MESSAGE: usize = 1024;

#[cfg(test)]
mod tests;
