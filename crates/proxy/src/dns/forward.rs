//! Forwarding of non-mesh queries to the upstream resolvers over UDP (retried over TCP when
//! truncated) or TCP, with a fresh message id per upstream exchange.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Protocol, UpstreamSockets};

/// Largest DNS message (TCP length prefix limit; also our UDP receive buffer).
pub(super) const MAX_MESSAGE: usize = u16::MAX as usize;

/// Why a query could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No upstream resolver is configured.
    #[error("no upstream DNS resolver configured; check the nameserver lines of resolv.conf")]
    NoUpstreams,
    /// The query could not be re-encoded.
    #[error("cannot encode the query for upstream {upstream}: {source}")]
    Encode {
        /// The upstream.
        upstream: SocketAddr,
        /// The encoder error.
        source: hickory_proto::ProtoError,
    },
    /// A socket operation with the upstream failed.
    #[error("DNS upstream {upstream} over {protocol}: {source}")]
    Io {
        /// The upstream.
        upstream: SocketAddr,
        /// Transport used.
        protocol: Protocol,
        /// The I/O error.
        source: io::Error,
    },
    /// The upstream did not answer in time.
    #[error(
        "DNS upstream {upstream} over {protocol} did not answer within {timeout:?}; is it reachable from the pod?"
    )]
    Timeout {
        /// The upstream.
        upstream: SocketAddr,
        /// Transport used.
        protocol: Protocol,
        /// The time allowed.
        timeout: Duration,
    },
    /// The upstream answered with something that is not a response to our query.
    #[error("DNS upstream {upstream} sent an invalid response: {reason}")]
    BadResponse {
        /// The upstream.
        upstream: SocketAddr,
        /// What was wrong.
        reason: String,
    },
    /// The upstream could not answer (SERVFAIL, REFUSED).
    #[error("DNS upstream {upstream} answered {code}")]
    Failed {
        /// The upstream.
        upstream: SocketAddr,
        /// Its response code.
        code: ResponseCode,
    },
}

/// Sends queries to the upstream resolvers in order until one answers.
pub(super) struct Forwarder {
    upstreams: Vec<SocketAddr>,
    sockets: Arc<dyn UpstreamSockets>,
    timeout: Duration,
}

/// A checked upstream response.
struct Reply {
    bytes: Vec<u8>,
    truncated: bool,
}

impl Forwarder {
    /// A forwarder over `upstreams`; `timeout` bounds each exchange (connect included).
    pub(super) fn new(
        upstreams: Vec<SocketAddr>,
        sockets: Arc<dyn UpstreamSockets>,
        timeout: Duration,
    ) -> Forwarder {
        Forwarder { upstreams, sockets, timeout }
    }

    /// The upstream response to `query`, with `query`'s id; `protocol` is how the client asked.
    pub(super) async fn forward(&self, query: &Message, protocol: Protocol) -> Result<Vec<u8>, ForwardError> {
        let mut last = ForwardError::NoUpstreams;
        for &upstream in &self.upstreams {
            match self.exchange(upstream, query, protocol).await {
                Ok(mut bytes) => {
                    // `check` decoded a whole header, so the id field is there.
                    if let Some(id) = bytes.get_mut(..2) {
                        id.copy_from_slice(&query.metadata.id.to_be_bytes());
                    }
                    return Ok(bytes);
                }
                Err(e) => {
                    tracing::debug!(target: "dns", %upstream, error = %e, "upstream failed");
                    last = e;
                }
            }
        }
        Err(last)
    }

    async fn exchange(
        &self,
        upstream: SocketAddr,
        query: &Message,
        protocol: Protocol,
    ) -> Result<Vec<u8>, ForwardError> {
        let mut out = query.clone();
        out.metadata.id = rand::random();
        let id = out.metadata.id;
        let bytes = out.to_vec().map_err(|source| ForwardError::Encode { upstream, source })?;
        let question = query.queries.first();
        let mut reply = None;
        if protocol == Protocol::Udp {
            let r = self.timed(upstream, Protocol::Udp, self.udp(upstream, &bytes, id, question)).await?;
            if !r.truncated {
                reply = Some(r);
            }
        }
        let reply = match reply {
            Some(r) => r,
            None => self.timed(upstream, Protocol::Tcp, self.tcp(upstream, &bytes, id, question)).await?,
        };
        Ok(reply.bytes)
    }

    async fn timed(
        &self,
        upstream: SocketAddr,
        protocol: Protocol,
        f: impl Future<Output = Result<Reply, ForwardError>>,
    ) -> Result<Reply, ForwardError> {
        tokio::time::timeout(self.timeout, f).await.map_err(|_| ForwardError::Timeout {
            upstream,
            protocol,
            timeout: self.timeout,
        })?
    }

    async fn udp(
        &self,
        upstream: SocketAddr,
        bytes: &[u8],
        id: u16,
        question: Option<&Query>,
    ) -> Result<Reply, ForwardError> {
        let io = |source| ForwardError::Io { upstream, protocol: Protocol::Udp, source };
        let socket = self.sockets.udp(upstream).map_err(io)?;
        // Connected: only the upstream's datagrams arrive, and ICMP errors surface.
        socket.connect(upstream).await.map_err(io)?;
        socket.send(bytes).await.map_err(io)?;
        loop {
            let (datagram, _) = super::serve::recv_datagram(&socket).await.map_err(io)?;
            match check(upstream, &datagram, id, question) {
                Ok(truncated) => {
                    return Ok(Reply { bytes: datagram, truncated });
                }
                // A stray or spoofed datagram: keep waiting for the real answer.
                Err(ForwardError::BadResponse { reason, .. }) => {
                    tracing::debug!(target: "dns", %upstream, reason, "ignored datagram");
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn tcp(
        &self,
        upstream: SocketAddr,
        bytes: &[u8],
        id: u16,
        question: Option<&Query>,
    ) -> Result<Reply, ForwardError> {
        let io = |source| ForwardError::Io { upstream, protocol: Protocol::Tcp, source };
        let len = u16::try_from(bytes.len()).map_err(|_| ForwardError::BadResponse {
            upstream,
            reason: "query too large for TCP".to_owned(),
        })?;
        let mut stream = self.sockets.tcp(upstream).await.map_err(io)?;
        let mut frame = Vec::with_capacity(bytes.len() + 2);
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(bytes);
        stream.write_all(&frame).await.map_err(io)?;
        let len = stream.read_u16().await.map_err(io)?;
        let mut buf = vec![0u8; usize::from(len)];
        stream.read_exact(&mut buf).await.map_err(io)?;
        let truncated = check(upstream, &buf, id, question)?;
        Ok(Reply { bytes: buf, truncated })
    }
}

/// Checks that `bytes` answers our query (id, response flag, same question) and succeeded;
/// returns the truncation flag.
pub(super) fn check(
    upstream: SocketAddr,
    bytes: &[u8],
    id: u16,
    question: Option<&Query>,
) -> Result<bool, ForwardError> {
    let bad = |reason: &str| ForwardError::BadResponse { upstream, reason: reason.to_owned() };
    let msg = Message::from_vec(bytes).map_err(|e| bad(&format!("undecodable: {e}")))?;
    if msg.metadata.id != id {
        return Err(bad("message id does not match the query"));
    }
    if msg.metadata.message_type != MessageType::Response {
        return Err(bad("not a response"));
    }
    let same_question = match (question, msg.queries.first()) {
        (Some(q), Some(r)) => {
            q.query_type() == r.query_type()
                && q.query_class() == r.query_class()
                && q.name().eq_ignore_root(r.name())
        }
        // A truncated or error response may omit the question.
        (_, None) => true,
        (None, Some(_)) => false,
    };
    if !same_question {
        return Err(bad("question does not match the query"));
    }
    match msg.metadata.response_code {
        code @ (ResponseCode::ServFail | ResponseCode::Refused) => {
            Err(ForwardError::Failed { upstream, code })
        }
        _ => Ok(msg.metadata.truncation),
    }
}
