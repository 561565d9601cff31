//! A small netlink client: message and attribute encoding, one request with its ack, a dump, and
//! an nfnetlink batch (one atomic nf_tables transaction). Sockets are opened in the calling
//! thread's network namespace and bound there for life, so callers open them inside [`in_netns`].
//!
//! Everything read back from the kernel is parsed with bounds checks; a malformed message is an
//! error, never a panic.
//!
//! [`in_netns`]: crate::in_netns

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send, setsockopt,
    socket, sockopt,
};
use nix::sys::time::TimeVal;

use crate::RedirectError;

pub(crate) const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_REPLACE: u16 = 0x100;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
/// Flag bit marking a nested attribute.
pub(crate) const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// How long the kernel may take to answer before we call it a failure.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// A growing buffer of netlink attributes (type-length-value, 4-byte aligned).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Attrs {
    buf: Vec<u8>,
}

impl Attrs {
    /// Appends one attribute.
    pub(crate) fn put(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        let len = 4 + value.len();
        // Attribute values here are names and addresses: far below u16::MAX.
        self.buf.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    /// A big-endian u32 attribute (nf_tables numbers).
    pub(crate) fn be32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.put(kind, &value.to_be_bytes())
    }

    /// A native-endian u32 attribute (rtnetlink numbers).
    pub(crate) fn ne32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.put(kind, &value.to_ne_bytes())
    }

    /// A NUL-terminated string attribute.
    pub(crate) fn string(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut bytes = Vec::with_capacity(value.len() + 1);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
        self.put(kind, &bytes)
    }

    /// A nested attribute whose content `fill` writes.
    pub(crate) fn nested(&mut self, kind: u16, fill: impl FnOnce(&mut Attrs)) -> &mut Self {
        let mut inner = Attrs::default();
        fill(&mut inner);
        self.put(kind | NLA_F_NESTED, &inner.buf)
    }

    /// The encoded bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// One attribute read back: type without flag bits, whether it is flagged nested, and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attr<'a> {
    pub kind: u16,
    pub nested: bool,
    pub value: &'a [u8],
}

impl<'a> Attr<'a> {
    /// The value as a string without its NUL terminator.
    pub(crate) fn str(&self) -> Option<&'a str> {
        let v = self.value.strip_suffix(&[0]).unwrap_or(self.value);
        std::str::from_utf8(v).ok()
    }

    /// The value as a big-endian u32.
    pub(crate) fn be32(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.value.try_into().ok()?))
    }

    /// The value as a native-endian u32.
    pub(crate) fn ne32(&self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.value.try_into().ok()?))
    }

    /// The attributes nested in the value.
    pub(crate) fn attrs(&self) -> Result<Vec<Attr<'a>>, String> {
        parse_attrs(self.value)
    }
}

/// Splits `buf` into attributes; a length that does not fit is an error.
pub(crate) fn parse_attrs(mut buf: &[u8]) -> Result<Vec<Attr<'_>>, String> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let kind = u16::from_ne_bytes([buf[2], buf[3]]);
        if len < 4 || len > buf.len() {
            return Err(format!("attribute of type {kind} claims {len} bytes, {} left", buf.len()));
        }
        out.push(Attr { kind: kind & NLA_TYPE_MASK, nested: kind & NLA_F_NESTED != 0, value: &buf[4..len] });
        buf = buf.get(align(len)..).unwrap_or_default();
    }
    Ok(out)
}

/// The first attribute of `kind` in `attrs`.
pub(crate) fn find<'a>(attrs: &[Attr<'a>], kind: u16) -> Option<Attr<'a>> {
    attrs.iter().find(|a| a.kind == kind).copied()
}

/// A request: message type, flags, the fixed family header and attributes, plus a label that
/// names the operation in errors (`add rule inet T C …`).
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub kind: u16,
    pub flags: u16,
    pub header: Vec<u8>,
    pub attrs: Attrs,
    pub label: String,
}

impl Request {
    pub(crate) fn encode(&self, seq: u32, flags: u16, out: &mut Vec<u8>) {
        let start = out.len();
        let len = NLMSG_HDRLEN + align(self.header.len()) + self.attrs.buf.len();
        out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
        out.extend_from_slice(&self.kind.to_ne_bytes());
        out.extend_from_slice(&(self.flags | flags | NLM_F_REQUEST).to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(&self.header);
        out.resize(start + NLMSG_HDRLEN + align(self.header.len()), 0);
        out.extend_from_slice(&self.attrs.buf);
    }
}

/// An nf_tables request: type `NFT_MSG_*` for `family` (`NFPROTO_*`).
pub(crate) fn nft_request(msg: u8, family: u8, flags: u16, attrs: Attrs, label: String) -> Request {
    Request {
        kind: (NFNL_SUBSYS_NFTABLES << 8) | u16::from(msg),
        flags,
        header: vec![family, 0, 0, 0],
        attrs,
        label,
    }
}

/// A reply message: its type and payload after the netlink header.
pub(crate) struct Reply {
    pub kind: u16,
    pub payload: Vec<u8>,
}

/// A received message: type, flags, sequence number and payload.
pub(crate) type Received = (u16, u16, u32, Vec<u8>);

/// A netlink socket bound in the namespace it was opened in.
pub(crate) struct Netlink {
    fd: OwnedFd,
    seq: u32,
    what: &'static str,
    buf: Vec<u8>,
}

impl Netlink {
    /// Opens a `NETLINK_ROUTE` socket in the current thread's netns.
    pub(crate) fn route() -> Result<Self, RedirectError> {
        Self::open(SockProtocol::NetlinkRoute, "rtnetlink")
    }

    /// Opens a `NETLINK_NETFILTER` socket in the current thread's netns.
    pub(crate) fn netfilter() -> Result<Self, RedirectError> {
        Self::open(SockProtocol::NetlinkNetFilter, "nf_tables netlink")
    }

    fn open(protocol: SockProtocol, what: &'static str) -> Result<Self, RedirectError> {
        let io = |e: Errno| RedirectError::Netlink { what: what.into(), detail: format!("socket: {e}") };
        let fd =
            socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, protocol).map_err(io)?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(io)?;
        let timeout = TimeVal::new(REPLY_TIMEOUT.as_secs() as _, 0);
        setsockopt(&fd, sockopt::ReceiveTimeout, &timeout).map_err(io)?;
        // A sequence start that differs per socket keeps stale replies from matching.
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(1)
            | 1;
        Ok(Netlink { fd, seq, what, buf: vec![0; 64 * 1024] })
    }

    fn error(&self, detail: String) -> RedirectError {
        RedirectError::Netlink { what: self.what.into(), detail }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    fn send_all(&self, bytes: &[u8]) -> Result<(), RedirectError> {
        let sent = send(self.fd.as_raw_fd(), bytes, MsgFlags::empty())
            .map_err(|e| self.error(format!("send: {e}")))?;
        if sent != bytes.len() {
            return Err(self.error(format!("short send: {sent} of {} bytes", bytes.len())));
        }
        Ok(())
    }

    /// Receives one datagram and splits it into (type, flags, seq, payload) messages.
    fn receive(&mut self) -> Result<Vec<Received>, RedirectError> {
        self.receive_with(MsgFlags::empty())
    }

    fn receive_with(&mut self, flags: MsgFlags) -> Result<Vec<Received>, RedirectError> {
        let n = loop {
            match recv(self.fd.as_raw_fd(), &mut self.buf, flags) {
                Ok(n) => break n,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) if flags.contains(MsgFlags::MSG_DONTWAIT) => return Ok(Vec::new()),
                Err(Errno::EAGAIN) => {
                    return Err(self.error(format!("no reply from the kernel within {REPLY_TIMEOUT:?}")));
                }
                Err(e) => return Err(self.error(format!("recv: {e}"))),
            }
        };
        split_messages(&self.buf[..n])
            .map_err(|detail| RedirectError::Netlink { what: self.what.into(), detail })
    }

    /// Sends one request with `NLM_F_ACK` and waits for its ack; a kernel refusal is
    /// [`RedirectError::Kernel`] carrying the errno.
    pub(crate) fn call(&mut self, request: &Request) -> Result<(), RedirectError> {
        let seq = self.next_seq();
        let mut bytes = Vec::new();
        request.encode(seq, NLM_F_ACK, &mut bytes);
        self.send_all(&bytes)?;
        loop {
            for (kind, _, got, payload) in self.receive()? {
                if got != seq || kind != NLMSG_ERROR {
                    continue;
                }
                return match ack_errno(&payload) {
                    Some(0) => Ok(()),
                    Some(errno) => Err(kernel_error(&request.label, errno)),
                    None => Err(self.error("truncated or malformed ack".into())),
                };
            }
        }
    }

    /// Sends a dump request and collects every reply message up to `NLMSG_DONE`.
    pub(crate) fn dump(&mut self, request: &Request) -> Result<Vec<Reply>, RedirectError> {
        let seq = self.next_seq();
        let mut bytes = Vec::new();
        request.encode(seq, NLM_F_DUMP, &mut bytes);
        self.send_all(&bytes)?;
        let mut replies = Vec::new();
        loop {
            for (kind, flags, got, payload) in self.receive()? {
                if got != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(replies),
                    NLMSG_ERROR => {
                        return match ack_errno(&payload) {
                            Some(0) => Ok(replies),
                            Some(errno) => Err(kernel_error(&request.label, errno)),
                            None => Err(self.error("truncated or malformed error reply".into())),
                        };
                    }
                    _ => {
                        replies.push(Reply { kind, payload });
                        if flags & NLM_F_MULTI == 0 {
                            return Ok(replies);
                        }
                    }
                }
            }
        }
    }

    /// Runs `requests` as one nf_tables transaction (a batch): all of them take effect or none.
    /// The first refused request is reported by its label and errno.
    pub(crate) fn batch(&mut self, requests: &[Request]) -> Result<(), RedirectError> {
        if requests.is_empty() {
            return Ok(());
        }
        let marker = |kind| Request {
            kind,
            flags: 0,
            header: vec![0, 0, (NFNL_SUBSYS_NFTABLES >> 8) as u8, NFNL_SUBSYS_NFTABLES as u8],
            attrs: Attrs::default(),
            label: "nf_tables batch".into(),
        };
        let mut bytes = Vec::new();
        let begin = self.next_seq();
        marker(NFNL_MSG_BATCH_BEGIN).encode(begin, 0, &mut bytes);
        let first = self.seq.wrapping_add(1);
        for request in requests {
            let seq = self.next_seq();
            request.encode(seq, NLM_F_ACK, &mut bytes);
        }
        let end = self.next_seq();
        marker(NFNL_MSG_BATCH_END).encode(end, 0, &mut bytes);
        self.send_all(&bytes)?;

        let index = |seq: u32| {
            let i = seq.wrapping_sub(first) as usize;
            (i < requests.len()).then_some(i)
        };
        let mut acked = vec![false; requests.len()];
        let mut refused: Option<RedirectError> = None;
        while acked.iter().any(|a| !a) {
            // After a refusal the kernel may stop answering the rest (e.g. out of memory):
            // take what is already queued, then report the refusal instead of waiting.
            let received = if refused.is_some() {
                let queued = self.receive_with(MsgFlags::MSG_DONTWAIT)?;
                if queued.is_empty() {
                    break;
                }
                queued
            } else {
                self.receive()?
            };
            for (kind, _, seq, payload) in received {
                if kind != NLMSG_ERROR {
                    continue;
                }
                let errno =
                    ack_errno(&payload).ok_or_else(|| self.error("truncated or malformed ack".into()))?;
                match index(seq) {
                    Some(i) => {
                        acked[i] = true;
                        if errno != 0 && refused.is_none() {
                            refused = Some(kernel_error(&requests[i].label, errno));
                        }
                    }
                    // The batch framing itself was refused: nothing else will come.
                    None if (seq == begin || seq == end) && errno != 0 => {
                        return Err(kernel_error("nf_tables batch", errno));
                    }
                    None => {}
                }
            }
        }
        refused.map_or(Ok(()), Err)
    }
}

/// Splits one received datagram into (type, flags, seq, payload) messages; a length that does
/// not fit is an error.
pub(crate) fn split_messages(mut data: &[u8]) -> Result<Vec<Received>, String> {
    let mut out = Vec::new();
    while data.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if len < NLMSG_HDRLEN || len > data.len() {
            return Err(format!("malformed reply: message length {len}, {} bytes left", data.len()));
        }
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        let flags = u16::from_ne_bytes([data[6], data[7]]);
        let seq = u32::from_ne_bytes([data[8], data[9], data[10], data[11]]);
        out.push((kind, flags, seq, data[NLMSG_HDRLEN..len].to_vec()));
        data = data.get(align(len)..).unwrap_or_default();
    }
    Ok(out)
}

/// Largest errno the kernel reports (`MAX_ERRNO` in `include/linux/err.h`).
const MAX_ERRNO: i32 = 4095;

/// The errno of an `NLMSG_ERROR` payload (0 for an ack); `None` when the payload is shorter
/// than its code or the code is not a negated errno (the kernel sends 0 or -1..=-4095).
pub(crate) fn ack_errno(payload: &[u8]) -> Option<i32> {
    let code = i32::from_ne_bytes(payload.get(..4)?.try_into().ok()?);
    // `checked_neg`: -i32::MIN does not exist (found by the rtnetlink_reply fuzz target).
    let errno = code.checked_neg()?;
    (0..=MAX_ERRNO).contains(&errno).then_some(errno)
}

fn kernel_error(label: &str, errno: i32) -> RedirectError {
    RedirectError::Kernel { operation: label.to_owned(), errno: Errno::from_raw(errno) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_with_padding_and_nesting() {
        let mut a = Attrs::default();
        a.string(1, "lo").be32(2, 0x111).nested(3, |n| {
            n.put(1, &[7]);
        });
        assert_eq!(a.bytes().len() % 4, 0);
        let parsed = parse_attrs(a.bytes()).expect("parses");
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[0].str(), Some("lo"));
        assert_eq!(parsed[1].be32(), Some(0x111));
        assert!(parsed[2].nested);
        let inner = parsed[2].attrs().expect("nested parses");
        assert_eq!((inner[0].kind, inner[0].value), (1, &[7u8][..]));
    }

    #[test]
    fn malformed_attributes_are_errors_not_panics() {
        assert!(parse_attrs(&[200, 0, 1, 0, 0, 0]).is_err());
        assert!(parse_attrs(&[2, 0, 1, 0]).is_err());
        assert_eq!(parse_attrs(&[1, 2, 3]).expect("short tail ignored"), vec![]);
        for n in 0..64u8 {
            let junk: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37).wrapping_add(n)).collect();
            let _ = parse_attrs(&junk);
        }
    }

    /// Regression (fuzz target `rtnetlink_reply`, crash-cb2d8b5d…): an `NLMSG_ERROR` payload
    /// whose code is `i32::MIN` made `ack_errno` negate out of range (a panic with overflow
    /// checks, a negative errno without). A code that is no negated errno is malformed.
    #[test]
    fn ack_codes_outside_the_errno_range_are_malformed() {
        let ack = |code: i32| code.to_ne_bytes().to_vec();
        assert_eq!(ack_errno(&ack(0)), Some(0));
        assert_eq!(ack_errno(&ack(-17)), Some(17));
        assert_eq!(ack_errno(&ack(-4095)), Some(4095));
        for bad in [i32::MIN, -4096, 1, i32::MAX] {
            assert_eq!(ack_errno(&ack(bad)), None, "code {bad}");
        }
        assert_eq!(ack_errno(&[0, 0]), None, "shorter than a code");
        // The fuzzer's input: one message whose payload starts with i32::MIN (the fuzz entry
        // reads every message as an ack too).
        let crash: &[u8] = &[
            0x3c, 0, 0, 0, 0x20, 0, 0x03, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x02, 0xff, 0xff,
            0xff, 0x7f, 0, 0, 0x01, 0, 0, 0, 0, 0x08, 0, 0x06, 0, 0xfc, 0x7f, 0, 0, 0x08, 0, 0x0a, 0, 0x11,
            0x01, 0, 0, 0x08, 0, 0x10, 0, 0xff, 0x0f, 0, 0, 0x08, 0, 0x0f, 0, 0x64, 0, 0, 0,
        ];
        let messages = split_messages(crash).expect("well-framed");
        assert_eq!(messages.len(), 1);
        assert_eq!(ack_errno(&messages[0].3), None);
    }

    #[test]
    fn request_header_is_encoded_in_place() {
        let mut attrs = Attrs::default();
        attrs.string(1, "t");
        let r = nft_request(0, 1, NLM_F_CREATE, attrs, "add table".into());
        let mut out = Vec::new();
        r.encode(9, NLM_F_ACK, &mut out);
        assert_eq!(u32::from_ne_bytes(out[0..4].try_into().expect("4")) as usize, out.len());
        assert_eq!(u16::from_ne_bytes([out[4], out[5]]), 10 << 8);
        assert_eq!(u16::from_ne_bytes([out[6], out[7]]), NLM_F_CREATE | NLM_F_ACK | NLM_F_REQUEST);
        assert_eq!(u32::from_ne_bytes(out[8..12].try_into().expect("4")), 9);
        assert_eq!(&out[16..20], &[1, 0, 0, 0]);
    }
}
