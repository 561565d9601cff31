//! Typed ZDS messages and the codec between them and one seqpacket record (bytes + fds).

use std::fmt;
use std::io;
use std::os::fd::OwnedFd;

use ambit_api::workload::zds as proto;
use prost::Message;

use ambit_netns::Netns;

use crate::MAX_MESSAGE;

/// Kubernetes metadata of a pod: what the node agent hands to the node proxy over ZDS, and what
/// a dedicated proxy is told it serves (`PROXY_WORKLOAD_INFO`). The one domain type for it in
/// Ambit; the generated `ambit_api` message is wire code, converted only by this crate's codec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadInfo {
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Service account the pod runs as.
    pub service_account: String,
}

/// The proxy's answer to one ZDS request (`Ack{}` or `Ack{error}` on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// The request was applied.
    Ok,
    /// The request was refused.
    Nack {
        /// Why, for an operator (the agent logs and reports it). Never empty on the wire: an
        /// empty reason is sent as "unspecified error", since an empty error means success.
        reason: String,
    },
}

/// A request as received by the proxy (parsed: every invariant checked).
#[derive(Debug)]
pub enum Request {
    /// Start (or keep, if the netns is unchanged) the proxies of a pod inside its netns.
    Add {
        /// Pod UID (never empty).
        uid: String,
        /// Pod metadata.
        info: WorkloadInfo,
        /// The pod's network namespace (checked to be a netns, close-on-exec).
        netns: Netns,
    },
    /// Snapshot only: the pod exists but the agent could not find its netns; keep its proxies.
    Keep {
        /// Pod UID (never empty).
        uid: String,
    },
    /// Stop the proxies of a pod.
    Del {
        /// Pod UID (never empty).
        uid: String,
    },
    /// The snapshot is complete: pods not added or kept since connecting are gone.
    SnapshotSent,
}

/// Why a received packet is not a valid ZDS message.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The packet was longer than [`MAX_MESSAGE`] bytes (`MSG_TRUNC`).
    #[error(
        "ZDS packet longer than {MAX_MESSAGE} bytes was truncated; the peer does not speak ZDS \
         or sent an oversized message"
    )]
    Truncated,
    /// The ancillary data did not fit into the receive buffer (`MSG_CTRUNC`).
    #[error(
        "ZDS packet carried more ancillary data than expected (MSG_CTRUNC); all received file \
         descriptors were closed"
    )]
    ControlTruncated,
    /// Ancillary data other than `SCM_RIGHTS` was attached.
    #[error(
        "ZDS packet carried an unexpected control message (level {level}, type {kind}); only \
         SCM_RIGHTS is allowed"
    )]
    UnexpectedControlMessage {
        /// `cmsg_level`.
        level: i32,
        /// `cmsg_type`.
        kind: i32,
    },
    /// The bytes are not a valid protobuf of the expected message.
    #[error("ZDS packet is not a valid protobuf message: {0}")]
    Decode(#[from] prost::DecodeError),
    /// The `oneof payload` was absent (or an unknown variant from a newer peer).
    #[error("ZDS message has no payload (empty or unknown oneof variant; is the peer newer?)")]
    EmptyPayload,
    /// An `AddWorkload` arrived without the netns fd.
    #[error("ZDS AddWorkload arrived without a network namespace file descriptor (SCM_RIGHTS)")]
    AddWithoutFd,
    /// An `AddWorkload` arrived without `workload_info` (upstream ztunnel exits on this).
    #[error("ZDS AddWorkload for pod {uid} has no workload_info; the node agent is too old or broken")]
    AddWithoutWorkloadInfo {
        /// Pod UID from the message.
        uid: String,
    },
    /// A file descriptor was attached to a message other than `AddWorkload` (it was closed).
    #[error("ZDS file descriptor attached to a message other than AddWorkload; it has been closed")]
    UnexpectedFd,
    /// More than one file descriptor was attached (all were closed).
    #[error("ZDS packet carried {0} file descriptors, at most one is allowed; all were closed")]
    TooManyFds(usize),
    /// A workload message had an empty UID.
    #[error("ZDS workload message has an empty pod UID")]
    EmptyUid,
    /// The fd attached to an `AddWorkload` is not a network namespace (it was closed).
    #[error(
        "ZDS AddWorkload for pod {uid} carried a file descriptor that is not a network namespace ({detail})"
    )]
    NotANetns {
        /// Pod UID from the message.
        uid: String,
        /// What the fd is instead.
        detail: String,
    },
    /// The node proxy sent data although no request was outstanding.
    #[error("the node proxy sent unsolicited data on an idle ZDS connection")]
    Unsolicited,
    /// A message to send encodes to more than [`MAX_MESSAGE`] bytes.
    #[error(
        "ZDS message would encode to {0} bytes, more than the {MAX_MESSAGE}-byte limit; shorten \
         the pod UID, name, namespace or service account"
    )]
    TooLarge(usize),
}

impl ProtocolError {
    /// Whether upstream ztunnel exits (status 1) after NACKing this violation.
    ///
    /// Only `AddWithoutWorkloadInfo` is fatal upstream (spec node-agent §3.5): it means the
    /// agent cannot be trusted to describe pods. Every other variant is a transport or
    /// decode problem after which upstream NACKs and reconnects. A proxy may still choose to
    /// treat a fatal error as a NACK + reconnect instead; this only reports upstream's choice.
    /// Keep-after-snapshot and a second SnapshotSent are also fatal upstream, but they are
    /// state errors the proxy's manager detects, not codec errors.
    pub fn is_fatal(&self) -> bool {
        matches!(self, ProtocolError::AddWithoutWorkloadInfo { .. })
    }
}

/// Why receiving a ZDS message failed.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    /// The socket failed (including timeouts, as `ErrorKind::TimedOut`, and an unexpected
    /// close of the connection, as `ErrorKind::UnexpectedEof`).
    #[error("ZDS socket error: {0}")]
    Io(#[from] io::Error),
    /// The peer sent an invalid message.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

impl Request {
    /// The pod UID the request is about, if any.
    pub fn uid(&self) -> Option<&str> {
        match self {
            Request::Add { uid, .. } | Request::Keep { uid } | Request::Del { uid } => Some(uid),
            Request::SnapshotSent => None,
        }
    }
}

impl Ack {
    /// A NACK with `reason` (an error's `Display`, typically).
    pub fn nack(reason: impl fmt::Display) -> Ack {
        Ack::Nack { reason: reason.to_string() }
    }

    /// Whether the request was applied.
    pub fn is_ok(&self) -> bool {
        matches!(self, Ack::Ok)
    }

    /// The NACK reason, if refused.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Ack::Ok => None,
            Ack::Nack { reason } => Some(reason),
        }
    }

    /// `Ok(())` for an ACK, `Err(reason)` for a NACK (for callers that propagate with `?`).
    pub fn into_result(self) -> Result<(), String> {
        match self {
            Ack::Ok => Ok(()),
            Ack::Nack { reason } => Err(reason),
        }
    }
}

/// `Ok(())` is an ACK, `Err(reason)` a NACK.
impl From<Result<(), String>> for Ack {
    fn from(result: Result<(), String>) -> Ack {
        match result {
            Ok(()) => Ack::Ok,
            Err(reason) => Ack::Nack { reason },
        }
    }
}

impl fmt::Display for Ack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ack::Ok => f.write_str("ACK"),
            Ack::Nack { reason } => write!(f, "NACK: {reason}"),
        }
    }
}

impl From<proto::WorkloadInfo> for WorkloadInfo {
    fn from(info: proto::WorkloadInfo) -> Self {
        WorkloadInfo { name: info.name, namespace: info.namespace, service_account: info.service_account }
    }
}

impl From<&WorkloadInfo> for proto::WorkloadInfo {
    fn from(info: &WorkloadInfo) -> Self {
        proto::WorkloadInfo {
            name: info.name.clone(),
            namespace: info.namespace.clone(),
            service_account: info.service_account.clone(),
        }
    }
}

/// Parses one received record (`bytes` + the fds that came with it) into a [`Request`].
///
/// Every fd that is not handed out inside `Request::Add` is closed before this returns.
pub fn decode_request(bytes: &[u8], mut fds: Vec<OwnedFd>) -> Result<Request, ProtocolError> {
    use proto::workload_request::Payload;

    if fds.len() > 1 {
        return Err(ProtocolError::TooManyFds(fds.len()));
    }
    let message = proto::WorkloadRequest::decode(bytes)?;
    let payload = message.payload.ok_or(ProtocolError::EmptyPayload)?;
    let fd = fds.pop();
    match payload {
        Payload::Add(add) => {
            let netns = fd.ok_or(ProtocolError::AddWithoutFd)?;
            let uid = non_empty(add.uid)?;
            let Some(info) = add.workload_info else {
                return Err(ProtocolError::AddWithoutWorkloadInfo { uid });
            };
            let netns = match Netns::from_fd(netns) {
                Ok(ns) => ns,
                Err(ambit_netns::NetnsError::NotANetns { detail, .. }) => {
                    return Err(ProtocolError::NotANetns { uid, detail });
                }
                Err(e) => return Err(ProtocolError::NotANetns { uid, detail: e.to_string() }),
            };
            Ok(Request::Add { uid, info: info.into(), netns })
        }
        _ if fd.is_some() => Err(ProtocolError::UnexpectedFd),
        Payload::Keep(keep) => Ok(Request::Keep { uid: non_empty(keep.uid)? }),
        Payload::Del(del) => Ok(Request::Del { uid: non_empty(del.uid)? }),
        Payload::SnapshotSent(_) => Ok(Request::SnapshotSent),
    }
}

/// Parses one received record into the proxy's [`Ack`].
pub fn decode_response(bytes: &[u8], fds: Vec<OwnedFd>) -> Result<Ack, ProtocolError> {
    use proto::workload_response::Payload;

    if fds.len() > 1 {
        return Err(ProtocolError::TooManyFds(fds.len()));
    }
    let message = proto::WorkloadResponse::decode(bytes)?;
    let Payload::Ack(ack) = message.payload.ok_or(ProtocolError::EmptyPayload)?;
    if !fds.is_empty() {
        return Err(ProtocolError::UnexpectedFd);
    }
    if ack.error.is_empty() { Ok(Ack::Ok) } else { Ok(Ack::Nack { reason: ack.error }) }
}

/// Parses a `ZdsHello` and returns its raw version number (1 = V1; not checked, as upstream).
pub fn decode_hello(bytes: &[u8], fds: Vec<OwnedFd>) -> Result<u32, ProtocolError> {
    if fds.len() > 1 {
        return Err(ProtocolError::TooManyFds(fds.len()));
    }
    let hello = proto::ZdsHello::decode(bytes)?;
    if !fds.is_empty() {
        return Err(ProtocolError::UnexpectedFd);
    }
    Ok(hello.version.cast_unsigned())
}

/// Encodes the client's `ZdsHello{V1}`.
pub fn encode_hello() -> Vec<u8> {
    proto::ZdsHello { version: proto::Version::V1 as i32 }.encode_to_vec()
}

/// Encodes an ack; a NACK reason is cut (at a char boundary) so the message fits.
pub fn encode_ack(ack: &Ack) -> Vec<u8> {
    let error = match ack {
        Ack::Ok => String::new(),
        // An empty error would read as success on the other side.
        Ack::Nack { reason } if reason.is_empty() => "unspecified error".to_owned(),
        Ack::Nack { reason } => truncate(reason, MAX_ACK_ERROR),
    };
    proto::WorkloadResponse { payload: Some(proto::workload_response::Payload::Ack(proto::Ack { error })) }
        .encode_to_vec()
}

/// Encodes an `AddWorkload` (the netns fd travels beside it).
pub fn encode_add(uid: &str, info: &WorkloadInfo) -> Result<Vec<u8>, ProtocolError> {
    use proto::workload_request::Payload;
    encode_request(Payload::Add(proto::AddWorkload {
        uid: non_empty(uid.to_owned())?,
        workload_info: Some(info.into()),
    }))
}

/// Encodes a `KeepWorkload`.
pub fn encode_keep(uid: &str) -> Result<Vec<u8>, ProtocolError> {
    use proto::workload_request::Payload;
    encode_request(Payload::Keep(proto::KeepWorkload { uid: non_empty(uid.to_owned())? }))
}

/// Encodes a `DelWorkload`.
pub fn encode_del(uid: &str) -> Result<Vec<u8>, ProtocolError> {
    use proto::workload_request::Payload;
    encode_request(Payload::Del(proto::DelWorkload { uid: non_empty(uid.to_owned())? }))
}

/// Encodes a `SnapshotSent`.
pub fn encode_snapshot_sent() -> Vec<u8> {
    proto::WorkloadRequest {
        payload: Some(proto::workload_request::Payload::SnapshotSent(proto::SnapshotSent {})),
    }
    .encode_to_vec()
}

/// Room for the error text in an ack: the envelope costs at most 2 tags + 2 two-byte lengths.
const MAX_ACK_ERROR: usize = MAX_MESSAGE - 6;

fn encode_request(payload: proto::workload_request::Payload) -> Result<Vec<u8>, ProtocolError> {
    let message = proto::WorkloadRequest { payload: Some(payload) };
    let len = message.encoded_len();
    if len > MAX_MESSAGE {
        return Err(ProtocolError::TooLarge(len));
    }
    Ok(message.encode_to_vec())
}

fn non_empty(uid: String) -> Result<String, ProtocolError> {
    if uid.is_empty() { Err(ProtocolError::EmptyUid) } else { Ok(uid) }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}
