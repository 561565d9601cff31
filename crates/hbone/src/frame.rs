//! HTTP/2 frames (RFC 9113 §4 and §6): the frame header, error codes, settings, the writers of
//! every frame HBONE sends, and a streaming reader that takes decrypted bytes as they come (a
//! frame may span TLS records) and hands DATA payloads out without copying them.

use std::fmt;

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame header length.
pub const HEADER_LEN: usize = 9;
/// SETTINGS_MAX_FRAME_SIZE's floor and default.
pub const DEFAULT_MAX_FRAME: u32 = 16_384;
/// SETTINGS_MAX_FRAME_SIZE's ceiling.
pub const MAX_MAX_FRAME: u32 = (1 << 24) - 1;
/// The initial window of streams and connections (RFC 9113 §6.9.2).
pub const DEFAULT_WINDOW: u32 = 65_535;
/// The largest window.
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

/// Frame types.
pub mod kind {
    /// DATA.
    pub const DATA: u8 = 0;
    /// HEADERS.
    pub const HEADERS: u8 = 1;
    /// PRIORITY.
    pub const PRIORITY: u8 = 2;
    /// RST_STREAM.
    pub const RST_STREAM: u8 = 3;
    /// SETTINGS.
    pub const SETTINGS: u8 = 4;
    /// PUSH_PROMISE.
    pub const PUSH_PROMISE: u8 = 5;
    /// PING.
    pub const PING: u8 = 6;
    /// GOAWAY.
    pub const GOAWAY: u8 = 7;
    /// WINDOW_UPDATE.
    pub const WINDOW_UPDATE: u8 = 8;
    /// CONTINUATION.
    pub const CONTINUATION: u8 = 9;
}

/// Frame flags.
pub mod flag {
    /// DATA, HEADERS: the sender's last frame on the stream.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: an acknowledgement.
    pub const ACK: u8 = 0x1;
    /// HEADERS, CONTINUATION: the header block ends here.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS: padded.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: a priority block precedes the header block.
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS identifiers.
pub mod setting {
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub const HEADER_TABLE_SIZE: u16 = 1;
    /// SETTINGS_ENABLE_PUSH.
    pub const ENABLE_PUSH: u16 = 2;
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u16 = 3;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 4;
    /// SETTINGS_MAX_FRAME_SIZE.
    pub const MAX_FRAME_SIZE: u16 = 5;
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub const MAX_HEADER_LIST_SIZE: u16 = 6;
}

/// An HTTP/2 error code (RFC 9113 §7).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reason(pub u32);

impl Reason {
    /// Graceful shutdown, or no error.
    pub const NO_ERROR: Reason = Reason(0);
    /// A protocol error.
    pub const PROTOCOL_ERROR: Reason = Reason(1);
    /// An implementation fault.
    pub const INTERNAL_ERROR: Reason = Reason(2);
    /// Flow control violated.
    pub const FLOW_CONTROL_ERROR: Reason = Reason(3);
    /// SETTINGS not acknowledged in time.
    pub const SETTINGS_TIMEOUT: Reason = Reason(4);
    /// A frame on a half-closed stream.
    pub const STREAM_CLOSED: Reason = Reason(5);
    /// A frame of the wrong size.
    pub const FRAME_SIZE_ERROR: Reason = Reason(6);
    /// The stream was refused before any processing.
    pub const REFUSED_STREAM: Reason = Reason(7);
    /// The stream is no longer needed.
    pub const CANCEL: Reason = Reason(8);
    /// The header compression context is broken.
    pub const COMPRESSION_ERROR: Reason = Reason(9);
    /// The CONNECT's TCP connection failed.
    pub const CONNECT_ERROR: Reason = Reason(10);
    /// The peer generates excessive load.
    pub const ENHANCE_YOUR_CALM: Reason = Reason(11);
    /// Transport security too weak.
    pub const INADEQUATE_SECURITY: Reason = Reason(12);
    /// HTTP/1.1 required.
    pub const HTTP_1_1_REQUIRED: Reason = Reason(13);

    fn name(self) -> Option<&'static str> {
        const NAMES: [&str; 14] = [
            "NO_ERROR",
            "PROTOCOL_ERROR",
            "INTERNAL_ERROR",
            "FLOW_CONTROL_ERROR",
            "SETTINGS_TIMEOUT",
            "STREAM_CLOSED",
            "FRAME_SIZE_ERROR",
            "REFUSED_STREAM",
            "CANCEL",
            "COMPRESSION_ERROR",
            "CONNECT_ERROR",
            "ENHANCE_YOUR_CALM",
            "INADEQUATE_SECURITY",
            "HTTP_1_1_REQUIRED",
        ];
        NAMES.get(usize::try_from(self.0).ok()?).copied()
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown error code {:#x}", self.0),
        }
    }
}

impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Payload length.
    pub len: u32,
    /// Frame type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Stream identifier (the reserved bit cleared).
    pub stream: u32,
}

impl Head {
    /// Parses a frame header.
    pub fn parse(b: &[u8; HEADER_LEN]) -> Head {
        Head {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    /// Encodes the header into `out` (9 bytes).
    pub fn encode(&self, out: &mut [u8]) {
        let len = self.len.to_be_bytes();
        out[..3].copy_from_slice(&len[1..]);
        out[3] = self.kind;
        out[4] = self.flags;
        out[5..9].copy_from_slice(&(self.stream & 0x7fff_ffff).to_be_bytes());
    }

    fn push(&self, out: &mut Vec<u8>) {
        let mut b = [0u8; HEADER_LEN];
        self.encode(&mut b);
        out.extend_from_slice(&b);
    }

    fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }
}

/// One setting's new value.
pub type Setting = (u16, u32);

/// Checks a SETTINGS payload and returns its entries in order (unknown ones dropped, as RFC 9113
/// §6.5.2 requires).
pub fn parse_settings(payload: &[u8]) -> Result<Vec<Setting>, Reason> {
    if !payload.len().is_multiple_of(6) {
        return Err(Reason::FRAME_SIZE_ERROR);
    }
    let mut out = Vec::with_capacity(payload.len() / 6);
    for e in payload.chunks_exact(6) {
        let id = u16::from_be_bytes([e[0], e[1]]);
        let v = u32::from_be_bytes([e[2], e[3], e[4], e[5]]);
        match id {
            setting::ENABLE_PUSH if v > 1 => return Err(Reason::PROTOCOL_ERROR),
            setting::INITIAL_WINDOW_SIZE if i64::from(v) > MAX_WINDOW => {
                return Err(Reason::FLOW_CONTROL_ERROR);
            }
            setting::MAX_FRAME_SIZE if !(DEFAULT_MAX_FRAME..=MAX_MAX_FRAME).contains(&v) => {
                return Err(Reason::PROTOCOL_ERROR);
            }
            setting::HEADER_TABLE_SIZE..=setting::MAX_HEADER_LIST_SIZE => out.push((id, v)),
            _ => {}
        }
    }
    Ok(out)
}

/// Appends a SETTINGS frame.
pub fn settings(out: &mut Vec<u8>, entries: &[Setting]) {
    let len = u32::try_from(entries.len() * 6).unwrap_or(0);
    Head { len, kind: kind::SETTINGS, flags: 0, stream: 0 }.push(out);
    for (id, v) in entries {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Appends a SETTINGS acknowledgement.
pub fn settings_ack(out: &mut Vec<u8>) {
    Head { len: 0, kind: kind::SETTINGS, flags: flag::ACK, stream: 0 }.push(out);
}

/// Appends a WINDOW_UPDATE.
pub fn window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    Head { len: 4, kind: kind::WINDOW_UPDATE, flags: 0, stream }.push(out);
    out.extend_from_slice(&(increment & 0x7fff_ffff).to_be_bytes());
}

/// Appends a RST_STREAM.
pub fn rst_stream(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    Head { len: 4, kind: kind::RST_STREAM, flags: 0, stream }.push(out);
    out.extend_from_slice(&reason.0.to_be_bytes());
}

/// Appends a PING (or its acknowledgement).
pub fn ping(out: &mut Vec<u8>, payload: [u8; 8], ack: bool) {
    Head { len: 8, kind: kind::PING, flags: if ack { flag::ACK } else { 0 }, stream: 0 }.push(out);
    out.extend_from_slice(&payload);
}

/// Appends a GOAWAY.
pub fn goaway(out: &mut Vec<u8>, last_stream: u32, reason: Reason) {
    Head { len: 8, kind: kind::GOAWAY, flags: 0, stream: 0 }.push(out);
    out.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&reason.0.to_be_bytes());
}

/// Appends an empty DATA frame (the end of a stream).
pub fn data_end(out: &mut Vec<u8>, stream: u32) {
    Head { len: 0, kind: kind::DATA, flags: flag::END_STREAM, stream }.push(out);
}

/// Appends a header block as HEADERS and, past `max_frame` bytes, CONTINUATION frames.
pub fn headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end_stream: bool, max_frame: u32) {
    let max = usize::try_from(max_frame).unwrap_or(usize::MAX).max(1);
    let mut chunks = block.chunks(max).peekable();
    let first = chunks.next().unwrap_or(&[]);
    let mut flags = if end_stream { flag::END_STREAM } else { 0 };
    if chunks.peek().is_none() {
        flags |= flag::END_HEADERS;
    }
    let len = |c: &[u8]| u32::try_from(c.len()).unwrap_or(0);
    Head { len: len(first), kind: kind::HEADERS, flags, stream }.push(out);
    out.extend_from_slice(first);
    while let Some(c) = chunks.next() {
        let flags = if chunks.peek().is_none() { flag::END_HEADERS } else { 0 };
        Head { len: len(c), kind: kind::CONTINUATION, flags, stream }.push(out);
        out.extend_from_slice(c);
    }
}

/// Most payload bytes of a control frame the reader keeps whole (DATA streams through, header
/// blocks have their own bound, unknown types are skipped): a GOAWAY's debug data beyond this is
/// dropped.
const MAX_BUFFERED_PAYLOAD: usize = 16 * 1024;

/// Payload buffer a reader keeps between frames; a larger one, grown for a large frame, goes
/// back once the frame is handled.
const MAX_KEPT_PAYLOAD: usize = 1024;

/// What the reader found.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'p, 'i> {
    /// A DATA frame starts: `flow` bytes count against the windows (padding included).
    DataStart {
        /// Stream.
        stream: u32,
        /// Flow-controlled length.
        flow: u32,
    },
    /// Part of a DATA frame's payload.
    Data {
        /// Stream.
        stream: u32,
        /// The bytes.
        bytes: &'i [u8],
    },
    /// A DATA frame ended.
    DataEnd {
        /// Stream.
        stream: u32,
        /// Flow-controlled bytes never delivered: the pad length byte and the padding.
        undelivered: u32,
        /// END_STREAM was set.
        end_stream: bool,
    },
    /// Any other frame, whole (an unknown type has an empty payload: it is skipped).
    Frame(Head, &'p [u8]),
}

/// An error of the connection (RFC 9113 §5.4.1), with what broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    /// The GOAWAY code.
    pub reason: Reason,
    /// What happened.
    pub what: &'static str,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.what, self.reason)
    }
}

fn err(reason: Reason, what: &'static str) -> FrameError {
    FrameError { reason, what }
}

enum Body {
    /// Reading the 9-byte header.
    Head,
    /// Inside a DATA frame: the pad length byte is next.
    DataPad(Head),
    /// Inside a DATA frame: `data` bytes of payload, then `padding`; `undelivered` counts the
    /// pad length byte and the padding.
    Data { head: Head, data: u32, padding: u32, undelivered: u32 },
    /// Inside another frame: collecting its payload.
    Whole { head: Head, remaining: u32, keep: bool },
}

/// A streaming frame reader.
pub struct Reader {
    head: [u8; HEADER_LEN],
    head_len: usize,
    body: Body,
    payload: Vec<u8>,
    max_frame: u32,
    max_block: usize,
}

impl Reader {
    /// A reader for frames up to `max_frame` bytes (our SETTINGS_MAX_FRAME_SIZE), and header
    /// block fragments (HEADERS, CONTINUATION) up to `max_block` bytes each.
    pub fn new(max_frame: u32, max_block: usize) -> Reader {
        Reader {
            head: [0; HEADER_LEN],
            head_len: 0,
            body: Body::Head,
            payload: Vec::new(),
            max_frame,
            max_block,
        }
    }

    /// Whether the reader sits between frames.
    #[cfg(test)]
    pub fn at_boundary(&self) -> bool {
        matches!(self.body, Body::Head) && self.head_len == 0
    }

    /// The next event from `input`, consuming what it used; `None` when `input` is used up.
    pub fn next<'p, 'i>(&'p mut self, input: &mut &'i [u8]) -> Option<Result<Event<'p, 'i>, FrameError>> {
        if matches!(self.body, Body::Head) && self.payload.capacity() > MAX_KEPT_PAYLOAD {
            // A large frame is done with: its buffer goes back.
            self.payload = Vec::new();
        }
        loop {
            match self.body {
                Body::Head => {
                    if input.is_empty() {
                        return None;
                    }
                    let take = (HEADER_LEN - self.head_len).min(input.len());
                    self.head[self.head_len..self.head_len + take].copy_from_slice(&input[..take]);
                    *input = &input[take..];
                    self.head_len += take;
                    if self.head_len < HEADER_LEN {
                        return None;
                    }
                    self.head_len = 0;
                    let head = Head::parse(&self.head);
                    if head.len > self.max_frame {
                        return Some(Err(err(
                            Reason::FRAME_SIZE_ERROR,
                            "frame larger than SETTINGS_MAX_FRAME_SIZE",
                        )));
                    }
                    if head.kind == kind::DATA {
                        if head.stream == 0 {
                            return Some(Err(err(Reason::PROTOCOL_ERROR, "DATA on stream 0")));
                        }
                        self.body = if head.has(flag::PADDED) {
                            if head.len == 0 {
                                return Some(Err(err(
                                    Reason::FRAME_SIZE_ERROR,
                                    "padded DATA without a pad length",
                                )));
                            }
                            Body::DataPad(head)
                        } else {
                            Body::Data { head, data: head.len, padding: 0, undelivered: 0 }
                        };
                        return Some(Ok(Event::DataStart { stream: head.stream, flow: head.len }));
                    }
                    let keep = matches!(
                        head.kind,
                        kind::HEADERS
                            | kind::PRIORITY
                            | kind::RST_STREAM
                            | kind::SETTINGS
                            | kind::PUSH_PROMISE
                            | kind::PING
                            | kind::GOAWAY
                            | kind::WINDOW_UPDATE
                            | kind::CONTINUATION
                    );
                    self.payload.clear();
                    self.body = Body::Whole { head, remaining: head.len, keep };
                }
                Body::DataPad(head) => {
                    let [pad, rest @ ..] = *input else { return None };
                    *input = rest;
                    let pad = u32::from(*pad);
                    if pad >= head.len {
                        return Some(Err(err(Reason::PROTOCOL_ERROR, "DATA padding as long as the frame")));
                    }
                    self.body =
                        Body::Data { head, data: head.len - 1 - pad, padding: pad, undelivered: 1 + pad };
                }
                Body::Data { head, data, padding, undelivered } => {
                    if data > 0 {
                        if input.is_empty() {
                            return None;
                        }
                        let n = usize::try_from(data).unwrap_or(usize::MAX).min(input.len());
                        let (bytes, rest) = input.split_at(n);
                        *input = rest;
                        self.body = Body::Data { head, data: data - n as u32, padding, undelivered };
                        return Some(Ok(Event::Data { stream: head.stream, bytes }));
                    }
                    if padding > 0 {
                        if input.is_empty() {
                            return None;
                        }
                        let n = usize::try_from(padding).unwrap_or(usize::MAX).min(input.len());
                        *input = &input[n..];
                        self.body = Body::Data { head, data: 0, padding: padding - n as u32, undelivered };
                        continue;
                    }
                    self.body = Body::Head;
                    return Some(Ok(Event::DataEnd {
                        stream: head.stream,
                        undelivered,
                        end_stream: head.has(flag::END_STREAM),
                    }));
                }
                Body::Whole { head, remaining, keep } => {
                    if remaining > 0 {
                        if input.is_empty() {
                            return None;
                        }
                        let n = usize::try_from(remaining).unwrap_or(usize::MAX).min(input.len());
                        let limit = match head.kind {
                            kind::HEADERS | kind::CONTINUATION | kind::PUSH_PROMISE => self.max_block,
                            _ => MAX_BUFFERED_PAYLOAD,
                        };
                        let room = limit.saturating_sub(self.payload.len()).min(n);
                        if keep {
                            if head.kind != kind::GOAWAY && room < n {
                                return Some(Err(err(
                                    Reason::FRAME_SIZE_ERROR,
                                    "frame larger than this connection buffers",
                                )));
                            }
                            self.payload.extend_from_slice(&input[..room]);
                        }
                        *input = &input[n..];
                        self.body = Body::Whole { head, remaining: remaining - n as u32, keep };
                        continue;
                    }
                    self.body = Body::Head;
                    return Some(Ok(Event::Frame(head, &self.payload)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
