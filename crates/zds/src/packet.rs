//! One ZDS record on a `SOCK_SEQPACKET` socket: the message bytes plus `SCM_RIGHTS` fds.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use tokio_seqpacket::UnixSeqpacket;
use tokio_seqpacket::ancillary::{AncillaryMessageWriter, OwnedAncillaryMessage};

use crate::MAX_MESSAGE;
use crate::message::{ProtocolError, RecvError};

/// One received record.
pub(crate) struct Packet {
    pub(crate) bytes: Vec<u8>,
    pub(crate) fds: Vec<OwnedFd>,
}

/// Room for this many fds, so that a peer sending a few too many gets `TooManyFds` (every fd
/// received and closed) rather than `ControlTruncated` (where the excess is dropped by the kernel).
const RECV_FD_ROOM: usize = 16;

/// `CMSG_SPACE(RECV_FD_ROOM * 4)` is 80 on Linux; the headroom covers other ABIs.
const CONTROL_LEN: usize = 128;

/// The kernel writes `cmsghdr`s here and the reader takes references to them, so the
/// buffer must be aligned like `cmsghdr` (8 bytes on 64-bit Linux).
#[repr(C, align(16))]
struct ControlBuffer([u8; CONTROL_LEN]);

const _: () = assert!(CONTROL_LEN >= 16 + RECV_FD_ROOM * 4);

/// Receives one record; `Ok(None)` when the peer closed the connection.
///
/// Received fds are close-on-exec (`MSG_CMSG_CLOEXEC`) and are all closed again when the
/// record is rejected.
pub(crate) async fn recv(socket: &UnixSeqpacket) -> Result<Option<Packet>, RecvError> {
    let mut buf = [0u8; MAX_MESSAGE];
    let mut control = ControlBuffer([0u8; CONTROL_LEN]);
    let (info, ancillary) = socket.recv_with_ancillary(&mut buf, &mut control.0).await?;
    let had_ancillary = !ancillary.is_empty();
    let mut fds = Vec::new();
    let mut unexpected = None;
    // Take ownership of everything first so that every early return below closes the fds.
    for message in ancillary.into_messages() {
        if let OwnedAncillaryMessage::FileDescriptors(received) = message {
            fds.extend(received);
        } else if let OwnedAncillaryMessage::Other(other) = &message {
            unexpected = Some((other.cmsg_level(), other.cmsg_type()));
        } else {
            // Only reachable when tokio-seqpacket's `non-portable` feature adds credentials.
            unexpected = Some((nix::libc::SOL_SOCKET, nix::libc::SCM_CREDENTIALS));
        }
    }
    // A zero-length record without ancillary data cannot be told apart from EOF on a
    // seqpacket socket; no ZDS message encodes to zero bytes except an empty payload, which
    // would be rejected anyway, so treat it as the peer closing.
    if info.bytes_read() == 0 && !had_ancillary && !info.truncated() {
        return Ok(None);
    }
    if info.truncated() {
        return Err(ProtocolError::Truncated.into());
    }
    if info.ancillary_truncated() {
        return Err(ProtocolError::ControlTruncated.into());
    }
    if let Some((level, kind)) = unexpected {
        return Err(ProtocolError::UnexpectedControlMessage { level, kind }.into());
    }
    let bytes = buf.get(..info.bytes_read()).unwrap_or(&buf).to_vec();
    Ok(Some(Packet { bytes, fds }))
}

/// Sends one record, with `fds` as `SCM_RIGHTS` in the same `sendmsg`.
pub(crate) async fn send(socket: &UnixSeqpacket, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let sent = if fds.is_empty() {
        socket.send(bytes).await?
    } else {
        // CMSG_SPACE(n * 4) plus slack for the writer's own alignment.
        let mut control = vec![0u8; 32 + fds.len() * 4 + AncillaryMessageWriter::BUFFER_ALIGN];
        let mut writer = AncillaryMessageWriter::new(&mut control);
        writer.add_fds(fds.iter().copied())?;
        socket.send_with_ancillary(bytes, &mut writer).await?
    };
    if sent != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("ZDS record of {} bytes was sent only partially ({sent} bytes)", bytes.len()),
        ));
    }
    Ok(())
}
