//! The HBONE connection: HTTP/2 over the TLS record layer of [`super::tls`], built for tunnels.
//!
//! One connection is a TCP socket, its TLS state and its streams, behind one lock. Nothing sits
//! between a tunnel's app socket and the TLS socket but this lock:
//!
//! - **Sending** (a stream's relay task): the app's bytes are read straight into the slots of a
//!   per-thread buffer laid out as TLS records, one DATA frame each (room for the record header,
//!   the frame header, the inner content type and the tag around every slot). Under the lock the
//!   frames are stamped and the records sealed in place; with the lock released they are written
//!   to the socket from there (see [`write`]: one task writes at a time, and what others seal
//!   meanwhile goes out with its next write): one read, one pass of AES-GCM and one write per
//!   128 KiB, no copy, and no other task involved.
//! - **Receiving** (the connection's driver): the socket is read into a per-thread 256 KiB buffer,
//!   records are opened in place, and a DATA payload is written to its stream's app socket from
//!   there. Only what the app does not take at once is copied, into the stream's queue, which its
//!   relay task writes out when the app drains; flow-control capacity goes back to the peer only
//!   once bytes reach the app, so the windows bound what a connection holds.
//!
//! A connection therefore holds no buffer while idle: a partial record waiting for its end, and
//! bytes a slow app or a full socket left behind, are all it keeps.
//!
//! The HTTP/2 side is what HBONE peers (ztunnel, Istio's h2-based proxies, Ambit) speak: CONNECT
//! streams, SETTINGS, flow control on streams and the connection, PING (answered, and sent as a
//! keepalive), GOAWAY both ways with its last-stream semantics, RST_STREAM, HEADERS with
//! CONTINUATION, padding and priority fields accepted, unknown frames ignored. Push is refused.
//! What one peer can make a connection hold or do is bounded: header blocks, queued output,
//! and control frames and early resets per interval.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::frame::{self, Event, FrameError, Head, Reason, flag, kind, setting};
use crate::hpack::{self, Decoded, HeaderError};
use crate::tls::{self, Content, Established, Sealer, Session, TlsError};

/// A connection's HTTP/2 settings and limits.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// SETTINGS_INITIAL_WINDOW_SIZE we grant.
    pub stream_window: u32,
    /// The connection window we grant.
    pub connection_window: u32,
    /// SETTINGS_MAX_FRAME_SIZE we accept.
    pub max_frame_size: u32,
    /// SETTINGS_MAX_CONCURRENT_STREAMS we accept (servers).
    pub max_concurrent_streams: Option<u32>,
    /// SETTINGS_MAX_HEADER_LIST_SIZE we accept.
    pub max_header_list_size: u32,
    /// Keepalive PINGs: every `interval` after the last answer; no answer in `timeout` ends the
    /// connection.
    pub keepalive: Option<Keepalive>,
}

/// Keepalive PINGs.
#[derive(Clone, Copy, Debug)]
pub struct Keepalive {
    /// Time between an answer and the next PING.
    pub interval: Duration,
    /// Time a PING may go unanswered.
    pub timeout: Duration,
}

/// Bytes waiting for the socket above which senders wait.
const OUT_HIGH: usize = 256 * 1024;
/// Bytes waiting for the socket above which the connection fails: only frames the peer makes us
/// answer (PING, SETTINGS, KeyUpdate) get past `OUT_HIGH`, so a peer that sends them without
/// reading is cut. Every path that queues bytes checks it.
const OUT_MAX: usize = 4 << 20;
/// DATA payload per record: one frame per record, filling it.
const SLOT_PAYLOAD: usize = tls::MAX_CONTENT - frame::HEADER_LEN;
/// A record slot of the send buffer.
const SLOT: usize = tls::OVERHEAD + frame::HEADER_LEN + SLOT_PAYLOAD;
/// Records per send: the most read from an app at once is `SLOTS * SLOT_PAYLOAD` (~128 KiB).
const SLOTS: usize = 8;
/// The receive buffer: one read takes up to this much ciphertext.
const RECV_BUF: usize = 256 * 1024;
/// A read shorter than this that ends inside a record is a record trickling in: the socket
/// then waits for the rest of it before it reads as ready.
const TRICKLE_READ: usize = 4096;
/// Reads per driver poll before it yields to other tasks.
const READS_PER_POLL: usize = 16;
/// The largest stream id.
const MAX_STREAM_ID: u32 = (1 << 31) - 1;
/// The PING payload of a graceful shutdown's round trip.
const DRAIN_PING: [u8; 8] = *b"goaway!!";
/// The interval of the flood counters.
const FLOOD_WINDOW: Duration = Duration::from_secs(10);
/// Frames we must answer or that carry nothing a peer may send per interval: PING and SETTINGS
/// and their acknowledgements, PRIORITY, empty DATA and CONTINUATION, frames on closed streams,
/// unknown types.
const MAX_CHATTER: u32 = 10_000;
/// Streams a client may reset before they were answered, per interval (rapid reset).
const MAX_EARLY_RESETS: u32 = 1_000;
/// Streams we may reset because of the peer's frames (a stream error: flow control, a malformed
/// or misplaced header block, DATA on a closed side) over a connection's life: h2's
/// `max_local_error_reset_streams` ("MadeYouReset").
const MAX_FAULT_RESETS: u32 = 1_024;
/// Streams we may end early because of what the peer asked, per interval: refused
/// (REFUSED_STREAM) or answered with an error before the peer finished (then reset with
/// NO_ERROR, RFC 9113 §8.1).
const MAX_REFUSALS: u32 = 1_024;

thread_local! {
    static SEND_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static RECV: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// How a connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnErrorKind {
    /// The socket failed or the peer closed it.
    Io,
    /// The TLS record layer failed.
    Tls,
    /// The peer broke the protocol (we sent GOAWAY with this code).
    Protocol(Reason),
    /// The peer ended the connection with GOAWAY and this error code.
    GoAway(Reason),
    /// The peer stopped answering PINGs.
    PeerDead,
    /// Closed (by us, or cleanly by the peer).
    Closed,
}

/// A connection's end, shared with every stream it had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConnError {
    /// What kind of end.
    pub kind: ConnErrorKind,
    /// What happened.
    pub message: String,
}

impl ConnError {
    fn new(kind: ConnErrorKind, message: impl Into<String>) -> ConnError {
        ConnError { kind, message: message.into() }
    }

    fn io(e: &io::Error) -> ConnError {
        ConnError::new(ConnErrorKind::Io, format!("connection error: {e}"))
    }

    fn protocol(reason: Reason, what: impl std::fmt::Display) -> ConnError {
        ConnError::new(ConnErrorKind::Protocol(reason), format!("http2 connection error: {what} ({reason})"))
    }

    fn closed() -> ConnError {
        ConnError::new(ConnErrorKind::Closed, "connection closed")
    }
}

impl From<TlsError> for ConnError {
    fn from(e: TlsError) -> ConnError {
        match e {
            TlsError::Io(e) => ConnError::io(&e),
            e => ConnError::new(ConnErrorKind::Tls, format!("tls error: {e}")),
        }
    }
}

impl From<FrameError> for ConnError {
    fn from(e: FrameError) -> ConnError {
        ConnError::protocol(e.reason, e.what)
    }
}

/// Why a stream failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The peer reset the stream.
    #[error("stream reset by the peer: {0}")]
    Reset(Reason),
    /// The peer's GOAWAY came before it processed the stream: safe to retry elsewhere.
    #[error("stream not processed: the peer is going away (GOAWAY)")]
    Refused,
    /// The connection ended.
    #[error("{0}")]
    Connection(ConnError),
    /// The peer's response head is malformed.
    #[error("{0}")]
    Headers(HeaderError),
    /// The stream is already closed on our side.
    #[error("stream already closed")]
    Closed,
    /// The connection takes no more streams (GOAWAY sent or received, stream ids used up).
    #[error("the connection takes no new streams")]
    NoNewStreams,
}

impl StreamError {
    /// Whether the peer never processed the stream, so a retry on another connection is safe.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StreamError::Refused | StreamError::NoNewStreams | StreamError::Reset(Reason::REFUSED_STREAM)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Client,
    Server,
}

/// Ciphertext waiting for the socket.
#[derive(Default)]
struct Out {
    buf: Vec<u8>,
    pos: usize,
}

impl Out {
    fn len(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn advance(&mut self, n: usize) {
        self.pos += n;
        if self.pos >= self.buf.len() {
            self.pos = 0;
            // An idle connection keeps no queue: what a burst needed goes back.
            if self.buf.capacity() > 4096 {
                self.buf = Vec::new();
            } else {
                self.buf.clear();
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct PeerSettings {
    initial_window: u32,
    max_frame: u32,
    max_concurrent: u32,
    header_table: u32,
}

impl Default for PeerSettings {
    fn default() -> PeerSettings {
        PeerSettings {
            initial_window: frame::DEFAULT_WINDOW,
            max_frame: frame::DEFAULT_MAX_FRAME,
            max_concurrent: u32::MAX,
            header_table: 4096,
        }
    }
}

#[derive(Default)]
struct Stream {
    send_window: i64,
    /// We sent END_STREAM or RST_STREAM.
    send_done: bool,
    recv_window: i64,
    recv_unacked: u32,
    queue: VecDeque<Bytes>,
    queued: usize,
    /// END_STREAM received.
    recv_done: bool,
    /// RST_STREAM received (or the stream failed here).
    reset: Option<Reason>,
    /// We reset the stream.
    local_reset: bool,
    /// GOAWAY arrived before the peer processed this stream.
    refused: bool,
    /// Client: the response head, once it arrived.
    head: Option<Result<Decoded, HeaderError>>,
    /// Server: we sent the response head.
    responded: bool,
    /// Server: the response head was not a success (2xx).
    error_answer: bool,
    send_waker: Option<Waker>,
    recv_waker: Option<Waker>,
    /// The relay's app socket, written to directly by the driver while the queue is empty.
    app: Option<Arc<TcpStream>>,
    /// The relay's byte counters.
    counters: Option<Arc<dyn RelayCounters>>,
    /// Writing to the app failed: received bytes are dropped.
    app_failed: bool,
    /// The app was sent its FIN (END_STREAM received, everything before it written), by the
    /// driver or the relay, whichever got there first.
    app_fin: bool,
}

impl Stream {
    /// END_STREAM arrived and everything before it was written: the app gets its FIN now, from
    /// the driver right behind the data (in the data's segment when the data went with MSG_MORE),
    /// not a task wake later. A client that closes as soon as it holds a whole answer then sees
    /// the server's FIN first, as it does without the mesh, instead of closing first and keeping
    /// the connection in TIME_WAIT, whose pile-up makes each of its connects search for a port.
    fn fin_to_app(&mut self) {
        if self.app_fin || self.app_failed || !self.recv_done || !self.queue.is_empty() {
            return;
        }
        if let Some(app) = &self.app {
            self.app_fin = true;
            // A failure shows to the relay as the app's error on its next read or write.
            let _ = socket2::SockRef::from(&**app).shutdown(std::net::Shutdown::Write);
        }
    }

    fn wake(&mut self) {
        if let Some(w) = self.send_waker.take() {
            w.wake();
        }
        if let Some(w) = self.recv_waker.take() {
            w.wake();
        }
    }

    fn count_received(&self, n: usize) {
        if let Some(c) = &self.counters {
            c.stream_to_app(n);
        }
    }
}

struct State {
    role: Role,
    sealer: Sealer,
    out: Out,
    /// Plaintext control frames waiting to be sealed (see [`State::seal_control`]).
    ctl: Vec<u8>,
    driver: Option<Waker>,
    streams: HashMap<u32, Stream>,
    /// Client: the next stream id.
    next_id: u32,
    /// Server: the highest stream id the peer opened.
    last_peer_id: u32,
    peer: PeerSettings,
    local_window: u32,
    local_max_concurrent: u32,
    conn_send: i64,
    conn_recv: i64,
    conn_unacked: u32,
    conn_target: u32,
    encoder: hpack::Encoder,
    goaway_received: Option<(u32, Reason)>,
    /// We sent GOAWAY: no new streams from us (a client), or the shutdown started (a server).
    goaway_sent: bool,
    /// Server: the last stream id of the final GOAWAY, sent once the drain PING came back.
    final_goaway: Option<u32>,
    closed: Option<ConnError>,
    send_waiters: Vec<Waker>,
    /// Client handles alive.
    handles: usize,
    /// Send capacity reserved by senders reading from their apps (see [`StreamHandle::relay`]):
    /// counted with the queue, so that senders together stay within [`OUT_HIGH`].
    reserved: usize,
    /// Streams reset because of the peer's frames (see [`MAX_FAULT_RESETS`]).
    fault_resets: u32,
    /// Streams refused or answered early (see [`MAX_REFUSALS`]).
    refusals: Windowed,
    /// A task is writing to the socket outside the lock: what is queued meanwhile is its to
    /// write, in its next write (see [`Shared::write_records`]).
    writing: bool,
    /// Bytes that task took from the queue (counted with it toward [`OUT_HIGH`] and
    /// [`OUT_MAX`]).
    in_flight: usize,
    /// The driver wants a wake when the writing task is done (it found the socket taken).
    driver_after_write: bool,
    /// Wakers of the streams the driver delivered to, woken once it released the lock (a task
    /// woken under it would wait for it on another thread).
    woken: Vec<Waker>,
}

/// Why we reset a stream: what counts against the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ResetCause {
    /// The peer's frames broke the stream's rules.
    Fault,
    /// The peer's request was refused or answered early.
    Refusal,
    /// Our side is done with the stream (its handle went away, its app failed).
    Ours,
}

/// What a connection's tasks share.
pub(crate) struct Shared {
    tcp: TcpStream,
    state: Mutex<State>,
    /// Writes made to the socket (tests count them).
    #[cfg(test)]
    writes: std::sync::atomic::AtomicUsize,
}
// ---------------------------------------------------------------------------------------------
// The driver

struct KeepaliveState {
    cfg: Keepalive,
    timer: Pin<Box<Sleep>>,
    outstanding: Option<[u8; 8]>,
    next_payload: u64,
}

/// Events counted per interval of [`FLOOD_WINDOW`].
#[derive(Default)]
struct Windowed {
    since: Option<Instant>,
    n: u32,
}

/// What the peer may send that costs us and carries nothing, per interval.
#[derive(Default)]
struct Flood {
    chatter: Windowed,
    early_resets: Windowed,
}

/// A header block being assembled.
struct Block {
    stream: u32,
    end_stream: bool,
    /// Its PRIORITY block names the stream itself (a stream error once the block is decoded).
    self_dependent: bool,
    buf: Vec<u8>,
    /// CONTINUATION frames so far.
    continuations: usize,
}

enum DataTarget {
    Stream(u32),
    Drop,
}

/// The HTTP/2 side of the driver.
struct Proto {
    role: Role,
    decoder: hpack::Decoder,
    block: Option<Block>,
    max_block: usize,
    max_header_list: usize,
    /// CONTINUATION frames one header block may take (h2's rule: what the header list limit
    /// needs at our frame size, plus a quarter, at least 5).
    max_continuations: usize,
    data_target: Option<DataTarget>,
    /// The flow-controlled length of the DATA frame being read.
    data_flow: u32,
    preface_left: usize,
    settings_seen: bool,
    preface_done_at: Option<Instant>,
    /// Server: streams the peer opened, not yet handed out.
    incoming: VecDeque<(u32, Decoded)>,
    flood: Flood,
    /// A PING acknowledgement arrived with this payload.
    pong: Option<[u8; 8]>,
}

/// Reads, decrypts and dispatches everything the peer sends, flushes what could not be written
/// at once, and runs the keepalive. A future: poll it (the client spawns it; the server polls it
/// through [`Server::poll_accept`]).
pub struct Driver {
    shared: Arc<Shared>,
    session: Session,
    reader: frame::Reader,
    proto: Proto,
    /// Records read with the end of the handshake, dispatched first.
    leftover: Vec<u8>,
    /// A record that arrived in part, sized to the whole record once its header is in: later
    /// reads land in its tail (see [`Driver::poll_read`]).
    stash: Vec<u8>,
    /// Bytes of `stash` filled.
    stashed: usize,
    /// The socket's SO_RCVLOWAT (see [`Driver::tune_lowat`]).
    lowat: usize,
    /// Wakers taken from [`State::woken`], woken outside the lock (kept for their room).
    woken: Vec<Waker>,
    keepalive: Option<KeepaliveState>,
    eof: bool,
    close_notify: bool,
    done: Option<Result<(), ConnError>>,
}

impl Future for Driver {
    type Output = Result<(), ConnError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().poll_drive(cx)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.finish(ConnError::closed());
    }
}

enum Read {
    Data,
    Eof,
}

/// One stream; dropping it resets the stream (CANCEL) unless it ended both ways.
pub struct StreamHandle {
    shared: Arc<Shared>,
    id: u32,
}

/// What a sender may do now.
enum Capacity {
    /// Send up to this many bytes (reserved from the windows).
    Bytes(usize),
    /// Wait (wakers registered).
    Wait,
}

mod driver;
mod handles;
mod proto;
mod state;
mod stream;
mod stream_io;
mod write;

pub use handles::{Client, Incoming, client, server};
use state::new_connection;
pub use stream::RelayCounters;
use stream::read_drained;
pub use stream_io::StreamIo;

/// Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, never on in a normal build).
#[cfg(feature = "fuzzing")]
pub mod fuzzing;

#[cfg(test)]
mod early_tests;
#[cfg(test)]
mod fin_tests;
#[cfg(test)]
mod red_team_tests;
#[cfg(test)]
mod stream_io_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_tests;
