//! The HBONE connection: HTTP/2 over the TLS record layer of [`super::tls`], built for tunnels.
//!
//! One connection is a TCP socket, its TLS state and its streams, behind one lock. Nothing sits
//! between a tunnel's app socket and the TLS socket but this lock:
//!
//! - **Sending** (a stream's relay task): the app's bytes are read straight into the slots of a
//!   per-thread buffer laid out as TLS records, one DATA frame each (room for the record header,
//!   the frame header, the inner content type and the tag around every slot). Under the lock the
//!   frames are stamped, the records sealed in place and, when nothing else is queued, written
//!   to the socket from there: one read, one pass of AES-GCM and one write per 128 KiB, no copy,
//!   and no other task involved.
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

use super::frame::{self, Event, FrameError, Head, Reason, flag, kind, setting};
use super::hpack::{self, Decoded, HeaderError};
use super::tls::{self, Content, Established, Sealer, Session, TlsError};
use crate::copy::LiveCounters;

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
/// answer (PING, SETTINGS) get past `OUT_HIGH`, so a peer that sends them without reading is cut.
const OUT_MAX: usize = 4 << 20;
/// DATA payload per record: one frame per record, filling it.
const SLOT_PAYLOAD: usize = tls::MAX_CONTENT - frame::HEADER_LEN;
/// A record slot of the send buffer.
const SLOT: usize = tls::OVERHEAD + frame::HEADER_LEN + SLOT_PAYLOAD;
/// Records per send: the most read from an app at once is `SLOTS * SLOT_PAYLOAD` (~128 KiB).
const SLOTS: usize = 8;
/// The receive buffer: one read takes up to this much ciphertext.
const RECV_BUF: usize = 256 * 1024;
/// Reads per driver poll before it yields to other tasks.
const READS_PER_POLL: usize = 16;
/// The largest stream id.
const MAX_STREAM_ID: u32 = (1 << 31) - 1;
/// The PING payload of a graceful shutdown's round trip.
const DRAIN_PING: [u8; 8] = *b"goaway!!";
/// The interval of the flood counters.
const FLOOD_WINDOW: Duration = Duration::from_secs(10);
/// Frames we must answer or that carry nothing (PING, SETTINGS, empty DATA, unknown types) a
/// peer may send per interval.
const MAX_CHATTER: u32 = 10_000;
/// Streams a client may reset before they were answered, per interval (rapid reset).
const MAX_EARLY_RESETS: u32 = 1_000;

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
    send_waker: Option<Waker>,
    recv_waker: Option<Waker>,
    /// The relay's app socket, written to directly by the driver while the queue is empty.
    app: Option<Arc<TcpStream>>,
    /// The relay's byte counters, and whether received bytes count as `sent` (the app is the
    /// upstream) or as `received`.
    counters: Option<(Arc<LiveCounters>, bool)>,
    /// Writing to the app failed: received bytes are dropped.
    app_failed: bool,
}

impl Stream {
    fn wake(&mut self) {
        if let Some(w) = self.send_waker.take() {
            w.wake();
        }
        if let Some(w) = self.recv_waker.take() {
            w.wake();
        }
    }

    fn count_received(&self, n: usize) {
        if let Some((c, app_is_upstream)) = &self.counters {
            if *app_is_upstream { c.add_sent(n) } else { c.add_received(n) }
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
}

impl State {
    fn new(role: Role, sealer: Sealer, cfg: &Config) -> State {
        State {
            role,
            sealer,
            out: Out::default(),
            ctl: Vec::new(),
            driver: None,
            streams: HashMap::new(),
            next_id: 1,
            last_peer_id: 0,
            peer: PeerSettings::default(),
            local_window: cfg.stream_window,
            local_max_concurrent: cfg.max_concurrent_streams.unwrap_or(u32::MAX),
            conn_send: i64::from(frame::DEFAULT_WINDOW),
            conn_recv: i64::from(cfg.connection_window),
            conn_unacked: 0,
            conn_target: cfg.connection_window,
            encoder: hpack::Encoder::default(),
            goaway_received: None,
            goaway_sent: false,
            final_goaway: None,
            closed: None,
            send_waiters: Vec::new(),
            handles: usize::from(role == Role::Client),
        }
    }

    fn fail(&mut self, e: ConnError) {
        if self.closed.is_none() {
            self.closed = Some(e);
        }
        for s in self.streams.values_mut() {
            s.wake();
        }
        self.wake_senders();
        if let Some(w) = self.driver.take() {
            w.wake();
        }
    }

    fn wake_senders(&mut self) {
        for w in self.send_waiters.drain(..) {
            w.wake();
        }
    }

    /// Seals the pending control frames into records.
    fn seal_control(&mut self) -> Result<(), ConnError> {
        if self.ctl.is_empty() {
            return Ok(());
        }
        let ctl = std::mem::take(&mut self.ctl);
        let r = self.seal_plain(&ctl);
        self.ctl = ctl;
        self.ctl.clear();
        r
    }

    fn seal_plain(&mut self, plain: &[u8]) -> Result<(), ConnError> {
        for chunk in plain.chunks(tls::MAX_CONTENT) {
            self.key_update_if_due()?;
            let start = self.out.buf.len();
            self.out.buf.resize(start + tls::OVERHEAD + chunk.len(), 0);
            self.out.buf[start + tls::HEADER_LEN..start + tls::HEADER_LEN + chunk.len()]
                .copy_from_slice(chunk);
            self.sealer.seal(&mut self.out.buf[start..])?;
        }
        if self.out.len() > OUT_MAX {
            return Err(ConnError::protocol(
                Reason::ENHANCE_YOUR_CALM,
                "the peer does not read what it makes us send",
            ));
        }
        Ok(())
    }

    fn key_update_if_due(&mut self) -> Result<(), ConnError> {
        if self.sealer.wants_key_update() {
            self.sealer.key_update(&mut self.out.buf)?;
        }
        Ok(())
    }

    /// `n` bytes of `id` reached the app (or were dropped): their window goes back to the peer
    /// when enough has gathered.
    fn release(&mut self, id: Option<u32>, n: usize) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if n == 0 {
            return;
        }
        self.conn_unacked = self.conn_unacked.saturating_add(n);
        if self.conn_unacked >= (self.conn_target / 2).max(1) {
            frame::window_update(&mut self.ctl, 0, self.conn_unacked);
            self.conn_recv += i64::from(self.conn_unacked);
            self.conn_unacked = 0;
        }
        let threshold = (self.local_window / 2).max(1);
        if let Some(s) = id.and_then(|id| self.streams.get_mut(&id).map(|s| (id, s))) {
            let (id, s) = s;
            if s.recv_done || s.reset.is_some() || s.local_reset {
                return;
            }
            s.recv_unacked = s.recv_unacked.saturating_add(n);
            if s.recv_unacked >= threshold {
                frame::window_update(&mut self.ctl, id, s.recv_unacked);
                s.recv_window += i64::from(s.recv_unacked);
                s.recv_unacked = 0;
            }
        }
    }

    /// Whether the connection accepts new streams from us.
    fn open_for_streams(&self) -> bool {
        self.closed.is_none()
            && self.goaway_received.is_none()
            && !self.goaway_sent
            && self.next_id < (1 << 31)
    }
}

/// What a connection's tasks share.
pub(crate) struct Shared {
    tcp: TcpStream,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Seals pending control frames and writes what is queued, now if the socket takes it; the
    /// driver finishes what it does not.
    fn flush(&self, st: &mut State) {
        if let Err(e) = st.seal_control() {
            st.fail(e);
            return;
        }
        if st.out.is_empty() {
            return;
        }
        match self.tcp.try_write(st.out.pending()) {
            Ok(n) => st.out.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                st.fail(ConnError::io(&e));
                return;
            }
        }
        if !st.out.is_empty()
            && let Some(w) = &st.driver
        {
            w.wake_by_ref();
        }
    }

    /// Writes sealed records `recs` after whatever is queued: straight from `recs` when nothing
    /// is, otherwise (and for what the socket does not take) through the queue.
    fn write_records(&self, st: &mut State, recs: &[u8]) {
        let mut rest = recs;
        if st.out.is_empty() {
            match self.tcp.try_write(recs) {
                Ok(n) => rest = &recs[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    st.fail(ConnError::io(&e));
                    return;
                }
            }
        }
        if !rest.is_empty() {
            st.out.buf.extend_from_slice(rest);
            if let Some(w) = &st.driver {
                w.wake_by_ref();
            }
        }
    }
}

/// The initial frames of a connection (after the client's preface).
fn initial_frames(cfg: &Config, role: Role, ctl: &mut Vec<u8>) {
    let mut s = Vec::new();
    if role == Role::Client {
        s.push((setting::ENABLE_PUSH, 0));
    }
    if let Some(m) = cfg.max_concurrent_streams {
        s.push((setting::MAX_CONCURRENT_STREAMS, m));
    }
    if cfg.stream_window != frame::DEFAULT_WINDOW {
        s.push((setting::INITIAL_WINDOW_SIZE, cfg.stream_window));
    }
    if cfg.max_frame_size != frame::DEFAULT_MAX_FRAME {
        s.push((setting::MAX_FRAME_SIZE, cfg.max_frame_size));
    }
    s.push((setting::MAX_HEADER_LIST_SIZE, cfg.max_header_list_size));
    frame::settings(ctl, &s);
    if cfg.connection_window > frame::DEFAULT_WINDOW {
        frame::window_update(ctl, 0, cfg.connection_window - frame::DEFAULT_WINDOW);
    }
}

fn new_connection(
    tcp: TcpStream,
    tls: Established,
    cfg: Config,
    role: Role,
) -> Result<(Arc<Shared>, Driver), ConnError> {
    let cfg = Config {
        max_frame_size: cfg.max_frame_size.clamp(frame::DEFAULT_MAX_FRAME, frame::MAX_MAX_FRAME),
        stream_window: cfg.stream_window.min(frame::MAX_WINDOW as u32),
        connection_window: cfg.connection_window.clamp(frame::DEFAULT_WINDOW, frame::MAX_WINDOW as u32),
        ..cfg
    };
    let Established { session, sealer, leftover, early, peer_closed, .. } = tls;
    let mut st = State::new(role, sealer, &cfg);
    if role == Role::Client {
        st.ctl.extend_from_slice(frame::PREFACE);
    }
    initial_frames(&cfg, role, &mut st.ctl);
    let shared = Arc::new(Shared { tcp, state: Mutex::new(st) });
    {
        let mut st = shared.lock();
        shared.flush(&mut st);
        if let Some(e) = &st.closed {
            return Err(e.clone());
        }
    }
    let max_block = Proto::max_block(&cfg);
    let driver = Driver {
        shared: shared.clone(),
        session,
        reader: frame::Reader::new(cfg.max_frame_size, max_block),
        proto: Proto::new(role, &cfg, max_block),
        stash: leftover,
        early,
        keepalive: cfg.keepalive.map(|k| KeepaliveState {
            cfg: k,
            timer: Box::pin(tokio::time::sleep(k.interval)),
            outstanding: None,
            next_payload: 1,
        }),
        eof: false,
        close_notify: peer_closed,
        done: None,
    };
    Ok((shared, driver))
}

/// The client side of a connection: opens CONNECT streams. Cheap to clone; the connection closes
/// (GOAWAY) once every handle and stream is gone.
pub struct Client {
    shared: Arc<Shared>,
}

impl Clone for Client {
    fn clone(&self) -> Client {
        self.shared.lock().handles += 1;
        Client { shared: self.shared.clone() }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.handles = st.handles.saturating_sub(1);
        if st.handles == 0
            && let Some(w) = &st.driver
        {
            w.wake_by_ref();
        }
    }
}

/// Starts the client side over an established TLS session: sends the preface and our settings.
/// The returned driver must be polled (spawned) for the connection to make progress.
pub fn client(tcp: TcpStream, tls: Established, cfg: Config) -> Result<(Client, Driver), ConnError> {
    let (shared, driver) = new_connection(tcp, tls, cfg, Role::Client)?;
    Ok((Client { shared }, driver))
}

impl Client {
    /// Opens a CONNECT stream to `authority` and waits for the response head.
    pub async fn connect(
        &self,
        authority: &str,
        headers: &HeaderMap,
    ) -> Result<(StreamHandle, Decoded), StreamError> {
        let id = {
            let mut st = self.shared.lock();
            if let Some(e) = &st.closed {
                return Err(StreamError::Connection(e.clone()));
            }
            if !st.open_for_streams() {
                return Err(StreamError::NoNewStreams);
            }
            let id = st.next_id;
            st.next_id += 2;
            let mut block = Vec::with_capacity(256);
            st.encoder.connect(&mut block, authority, headers);
            let max_frame = st.peer.max_frame;
            frame::headers(&mut st.ctl, id, &block, false, max_frame);
            let stream = Stream {
                send_window: i64::from(st.peer.initial_window),
                recv_window: i64::from(st.local_window),
                ..Stream::default()
            };
            st.streams.insert(id, stream);
            self.shared.flush(&mut st);
            id
        };
        let handle = StreamHandle { shared: self.shared.clone(), id };
        let head = std::future::poll_fn(|cx| handle.poll_response(cx)).await?;
        Ok((handle, head))
    }

    /// Whether the connection takes no more streams (closed, or GOAWAY either way).
    pub fn is_closed(&self) -> bool {
        !self.shared.lock().open_for_streams()
    }

    /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS.
    pub fn max_concurrent_streams(&self) -> u32 {
        self.shared.lock().peer.max_concurrent
    }
}

/// A new stream the peer opened.
pub struct Incoming {
    /// The request head.
    pub head: Decoded,
    /// The stream.
    pub stream: StreamHandle,
}

/// The server side of a connection.
pub struct Server {
    shared: Arc<Shared>,
    driver: Driver,
}

/// Starts the server side over an established TLS session: sends our settings. Poll
/// [`Server::poll_accept`] to drive the connection.
pub fn server(tcp: TcpStream, tls: Established, cfg: Config) -> Result<Server, ConnError> {
    let (shared, driver) = new_connection(tcp, tls, cfg, Role::Server)?;
    Ok(Server { shared, driver })
}

impl Server {
    /// Drives the connection; yields the streams the peer opens. `None` once the connection
    /// closed cleanly; an error once it failed.
    pub fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Incoming, ConnError>>> {
        if let Some(i) = self.next_incoming() {
            return Poll::Ready(Some(Ok(i)));
        }
        let r = self.driver.poll_drive(cx);
        if let Some(i) = self.next_incoming() {
            return Poll::Ready(Some(Ok(i)));
        }
        match r {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
        }
    }

    fn next_incoming(&mut self) -> Option<Incoming> {
        let (id, head) = self.driver.proto.incoming.pop_front()?;
        Some(Incoming { head, stream: StreamHandle { shared: self.shared.clone(), id } })
    }

    /// The next stream the peer opens (see [`Server::poll_accept`]).
    pub async fn accept(&mut self) -> Option<Result<Incoming, ConnError>> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// When the client's preface and first SETTINGS arrived.
    pub fn preface_received_at(&self) -> Option<Instant> {
        self.driver.proto.preface_done_at
    }

    /// Starts a graceful shutdown (RFC 9113 §6.8): a GOAWAY that stops new streams while
    /// admitting those already in flight, and a PING; when the PING comes back, the final
    /// GOAWAY names the last stream processed. The connection closes once its streams are done.
    pub fn graceful_shutdown(&self) {
        let mut st = self.shared.lock();
        if !st.goaway_sent && st.closed.is_none() {
            st.goaway_sent = true;
            frame::goaway(&mut st.ctl, MAX_STREAM_ID, Reason::NO_ERROR);
            frame::ping(&mut st.ctl, DRAIN_PING, false);
            self.shared.flush(&mut st);
            if let Some(w) = &st.driver {
                w.wake_by_ref();
            }
        }
    }

    /// Grows the windows granted to the peer (never shrinks them).
    pub fn grow_windows(&self, stream: u32, connection: u32) {
        let mut st = self.shared.lock();
        let stream = stream.min(frame::MAX_WINDOW as u32);
        if stream > st.local_window {
            let delta = i64::from(stream - st.local_window);
            st.local_window = stream;
            for s in st.streams.values_mut() {
                s.recv_window += delta;
            }
            frame::settings(&mut st.ctl, &[(setting::INITIAL_WINDOW_SIZE, stream)]);
        }
        let connection = connection.min(frame::MAX_WINDOW as u32);
        if connection > st.conn_target {
            let inc = connection - st.conn_target;
            st.conn_target = connection;
            st.conn_recv += i64::from(inc);
            frame::window_update(&mut st.ctl, 0, inc);
        }
        self.shared.flush(&mut st);
    }
}

// ---------------------------------------------------------------------------------------------
// Streams

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

impl StreamHandle {
    /// The stream id.
    pub fn id(&self) -> u32 {
        self.id
    }

    fn poll_response(&self, cx: &mut Context<'_>) -> Poll<Result<Decoded, StreamError>> {
        let mut st = self.shared.lock();
        let closed = st.closed.clone();
        let Some(s) = st.streams.get_mut(&self.id) else { return Poll::Ready(Err(StreamError::Closed)) };
        if let Some(head) = s.head.take() {
            return Poll::Ready(head.map_err(StreamError::Headers));
        }
        if s.refused {
            return Poll::Ready(Err(StreamError::Refused));
        }
        if let Some(r) = s.reset {
            return Poll::Ready(Err(StreamError::Reset(r)));
        }
        if let Some(e) = closed {
            return Poll::Ready(Err(StreamError::Connection(e)));
        }
        s.recv_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Runs `f` while our side of the stream is open (the connection up, no reset, no
    /// END_STREAM sent yet), then writes what it queued.
    fn while_open(&self, f: impl FnOnce(&mut State) -> Result<(), StreamError>) -> Result<(), StreamError> {
        let mut st = self.shared.lock();
        if let Some(e) = &st.closed {
            return Err(StreamError::Connection(e.clone()));
        }
        let st = &mut *st;
        let Some(s) = st.streams.get_mut(&self.id) else { return Err(StreamError::Closed) };
        if let Some(r) = s.reset {
            return Err(StreamError::Reset(r));
        }
        if s.send_done {
            return Err(StreamError::Closed);
        }
        let r = f(st);
        self.shared.flush(st);
        r
    }

    /// Sends the response head (server side); `end_stream` ends our side with it.
    pub fn respond(&self, status: u16, headers: &HeaderMap, end_stream: bool) -> Result<(), StreamError> {
        let id = self.id;
        self.while_open(|st| {
            let Some(s) = st.streams.get_mut(&id) else { return Err(StreamError::Closed) };
            if s.responded {
                return Err(StreamError::Closed);
            }
            s.responded = true;
            s.send_done = end_stream;
            let mut block = Vec::with_capacity(128);
            st.encoder.response(&mut block, status, headers);
            frame::headers(&mut st.ctl, id, &block, end_stream, st.peer.max_frame);
            Ok(())
        })
    }

    /// Resets the stream with `reason`.
    pub fn reset(&self, reason: Reason) {
        let mut st = self.shared.lock();
        let st = &mut *st;
        if let Some(s) = st.streams.get_mut(&self.id)
            && !s.local_reset
            && s.reset.is_none()
        {
            s.local_reset = true;
            s.send_done = true;
            if st.closed.is_none() {
                frame::rst_stream(&mut st.ctl, self.id, reason);
                self.shared.flush(st);
            }
        }
    }

    /// Ends our side of the stream (END_STREAM).
    pub fn finish(&self) -> Result<(), StreamError> {
        let id = self.id;
        self.while_open(|st| {
            if let Some(s) = st.streams.get_mut(&id) {
                s.send_done = true;
            }
            frame::data_end(&mut st.ctl, id);
            Ok(())
        })
    }

    /// Resolves when the peer resets the stream or the connection ends, with why.
    pub fn poll_gone(&self, cx: &mut Context<'_>) -> Poll<StreamError> {
        let mut st = self.shared.lock();
        let closed = st.closed.clone();
        let Some(s) = st.streams.get_mut(&self.id) else { return Poll::Ready(StreamError::Closed) };
        if let Some(r) = s.reset {
            return Poll::Ready(StreamError::Reset(r));
        }
        if let Some(e) = closed {
            return Poll::Ready(StreamError::Connection(e));
        }
        s.send_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Reserves send capacity: up to `want` bytes within both windows while the socket keeps
    /// up; registers the waker otherwise.
    fn poll_capacity(&self, cx: &mut Context<'_>, want: usize) -> Poll<Result<usize, StreamError>> {
        let mut st = self.shared.lock();
        match reserve(&mut st, self.id, want, Some(cx))? {
            Capacity::Bytes(n) => Poll::Ready(Ok(n)),
            Capacity::Wait => Poll::Pending,
        }
    }

    /// Sends `data` as DATA frames, waiting for flow-control capacity (a copy into the records;
    /// relays read into the records directly instead, see [`StreamHandle::relay`]).
    pub async fn send(&self, mut data: &[u8]) -> Result<(), StreamError> {
        while !data.is_empty() {
            let cap = std::future::poll_fn(|cx| self.poll_capacity(cx, data.len().min(SLOTS * SLOT_PAYLOAD)))
                .await?;
            let (now, rest) = data.split_at(cap);
            SEND_BUF.with_borrow_mut(|buf| {
                let buf = send_buf(buf);
                for (i, part) in now.chunks(SLOT_PAYLOAD).enumerate() {
                    let at = i * SLOT + tls::HEADER_LEN + frame::HEADER_LEN;
                    buf[at..at + part.len()].copy_from_slice(part);
                }
                let mut st = self.shared.lock();
                send_slots(&self.shared, &mut st, self.id, buf, cap, cap)
            })?;
            data = rest;
        }
        Ok(())
    }

    /// The next received bytes (`None` at END_STREAM); their window goes back to the peer.
    pub async fn recv(&self) -> Option<Result<Bytes, StreamError>> {
        std::future::poll_fn(|cx| {
            let mut st = self.shared.lock();
            let st = &mut *st;
            let closed = st.closed.clone();
            let Some(s) = st.streams.get_mut(&self.id) else {
                return Poll::Ready(Some(Err(StreamError::Closed)));
            };
            if let Some(b) = s.queue.pop_front() {
                s.queued -= b.len();
                let n = b.len();
                st.release(Some(self.id), n);
                self.shared.flush(st);
                return Poll::Ready(Some(Ok(b)));
            }
            if s.recv_done {
                return Poll::Ready(None);
            }
            if let Some(r) = s.reset {
                return Poll::Ready(Some(Err(StreamError::Reset(r))));
            }
            if let Some(e) = closed {
                return Poll::Ready(Some(Err(StreamError::Connection(e))));
            }
            s.recv_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Relays between the stream and `app` until both directions end, counting bytes in
    /// `counters` (`app_is_upstream`: bytes from the stream count as sent). Half-closes pass
    /// through (END_STREAM ⇄ FIN). A reset stream or a dead connection ends the relay at once
    /// and resets the app's connection; an app that fails resets the stream.
    pub async fn relay(
        self,
        app: TcpStream,
        counters: Arc<LiveCounters>,
        app_is_upstream: bool,
    ) -> (crate::copy::Transferred, io::Result<()>) {
        let app = Arc::new(app);
        {
            let mut st = self.shared.lock();
            if let Some(s) = st.streams.get_mut(&self.id) {
                s.app = Some(app.clone());
                s.counters = Some((counters.clone(), app_is_upstream));
            }
        }
        let up = self.app_to_stream(&app, &counters, app_is_upstream);
        let down = self.stream_to_app(&app);
        let res = tokio::try_join!(up, down).map(|_| ());
        {
            let mut st = self.shared.lock();
            if let Some(s) = st.streams.get_mut(&self.id) {
                s.app = None;
                s.counters = None;
            }
        }
        if let Err(e) = &res
            && e.kind() == crate::copy::GONE
        {
            // The other side is gone: reset the app rather than leave unsent bytes queued to it.
            let _ = socket2::SockRef::from(&*app).set_linger(Some(Duration::ZERO));
        }
        (counters.transferred(), res)
    }

    async fn app_to_stream(
        &self,
        app: &TcpStream,
        counters: &LiveCounters,
        app_is_upstream: bool,
    ) -> io::Result<()> {
        loop {
            // Wait for the app, watching for the stream to go (only while waiting: a stream
            // gone while the app has data shows when capacity is reserved).
            std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = app.poll_read_ready(cx) {
                    return Poll::Ready(r);
                }
                match self.poll_gone(cx) {
                    Poll::Ready(e) => Poll::Ready(Err(gone(e))),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await?;
            let cap =
                std::future::poll_fn(|cx| self.poll_capacity(cx, SLOTS * SLOT_PAYLOAD).map_err(gone)).await?;
            let read = SEND_BUF.with_borrow_mut(|buf| {
                let buf = send_buf(buf);
                let n = {
                    let mut slices: [io::IoSliceMut<'_>; SLOTS] =
                        std::array::from_fn(|_| io::IoSliceMut::new(&mut []));
                    let mut left = cap;
                    let mut used = 0;
                    for (slot, slice) in buf.chunks_mut(SLOT).zip(slices.iter_mut()) {
                        if left == 0 {
                            break;
                        }
                        let len = left.min(SLOT_PAYLOAD);
                        left -= len;
                        let at = tls::HEADER_LEN + frame::HEADER_LEN;
                        *slice = io::IoSliceMut::new(&mut slot[at..at + len]);
                        used += 1;
                    }
                    read_drained(app, &mut slices[..used], cap)
                };
                let mut st = self.shared.lock();
                match n {
                    Ok(0) => {
                        unreserve(&mut st, self.id, cap);
                        Ok(0)
                    }
                    Ok(n) => send_slots(&self.shared, &mut st, self.id, buf, n, cap).map(|_| n).map_err(gone),
                    Err(e) => {
                        unreserve(&mut st, self.id, cap);
                        Err(e)
                    }
                }
            });
            match read {
                Ok(0) => {
                    return match self.finish() {
                        Ok(()) | Err(StreamError::Closed) => Ok(()),
                        Err(e) => Err(gone(e)),
                    };
                }
                Ok(n) => {
                    if app_is_upstream {
                        counters.add_received(n)
                    } else {
                        counters.add_sent(n)
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if crate::copy::is_benign(&e) => {
                    let _ = self.finish();
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn stream_to_app(&self, app: &TcpStream) -> io::Result<()> {
        match std::future::poll_fn(|cx| self.poll_to_app(app, cx)).await {
            // The app went away (reset, broken pipe): this direction is over, not failed, as
            // in the plain relays; the stream is reset when the relay ends.
            Err(e) if crate::copy::is_benign(&e) => return Ok(()),
            r => r?,
        }
        // END_STREAM, and everything before it written: FIN to the app.
        match socket2::SockRef::from(app).shutdown(std::net::Shutdown::Write) {
            Err(e) if !crate::copy::is_benign(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// Writes the stream's queue to the app; ready at END_STREAM with the queue written.
    fn poll_to_app(&self, app: &TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.shared.lock();
        let st = &mut *st;
        let closed = st.closed.clone();
        let id = self.id;
        loop {
            let Some(s) = st.streams.get_mut(&id) else { return Poll::Ready(Err(gone(StreamError::Closed))) };
            if s.app_failed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "writing to the app failed",
                )));
            }
            if let Some(front) = s.queue.front_mut() {
                match app.try_write(front) {
                    Ok(n) => {
                        let _ = front.split_to(n);
                        if front.is_empty() {
                            s.queue.pop_front();
                        }
                        s.queued -= n;
                        s.count_received(n);
                        st.release(Some(id), n);
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.shared.flush(st);
                        let Some(s) = st.streams.get_mut(&id) else { continue };
                        if let Some(r) = s.reset {
                            return Poll::Ready(Err(gone(StreamError::Reset(r))));
                        }
                        if let Some(e) = &closed {
                            return Poll::Ready(Err(gone(StreamError::Connection(e.clone()))));
                        }
                        s.recv_waker = Some(cx.waker().clone());
                        match app.poll_write_ready(cx) {
                            Poll::Ready(Ok(())) => continue,
                            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                            Poll::Pending => return Poll::Pending,
                        }
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            self.shared.flush(st);
            let Some(s) = st.streams.get_mut(&id) else { return Poll::Ready(Err(gone(StreamError::Closed))) };
            if s.recv_done {
                return Poll::Ready(Ok(()));
            }
            if let Some(r) = s.reset {
                return Poll::Ready(Err(gone(StreamError::Reset(r))));
            }
            if let Some(e) = &closed {
                return Poll::Ready(Err(gone(StreamError::Connection(e.clone()))));
            }
            s.recv_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        let st = &mut *st;
        let Some(s) = st.streams.remove(&self.id) else { return };
        let ended = s.local_reset || s.reset.is_some() || (s.send_done && s.recv_done);
        if !ended && st.closed.is_none() {
            frame::rst_stream(&mut st.ctl, self.id, Reason::CANCEL);
        }
        // What the stream still held goes back to the connection window.
        st.release(None, s.queued);
        self.shared.flush(st);
        if st.streams.is_empty()
            && let Some(w) = &st.driver
        {
            w.wake_by_ref();
        }
    }
}

/// The "gone" error of the relays (see [`crate::copy::GONE`]).
fn gone(e: StreamError) -> io::Error {
    let what = match &e {
        StreamError::Reset(r) => format!("the HBONE stream was reset by the peer: {r}"),
        other => format!("the HBONE stream is gone: {other}"),
    };
    io::Error::new(crate::copy::GONE, what)
}

/// Reads from `sock` into `bufs` (`want` bytes of room). A short read means the socket's queue
/// was emptied: its readiness is cleared then, as tokio's own reads do, so the next wait needs no
/// extra read that would only find nothing.
fn read_drained(sock: &TcpStream, bufs: &mut [io::IoSliceMut<'_>], want: usize) -> io::Result<usize> {
    use std::io::Read;
    let mut n = 0;
    let r = sock.try_io(tokio::io::Interest::READABLE, || {
        n = (&*socket2::SockRef::from(sock)).read_vectored(bufs)?;
        if n > 0 && n < want { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
    });
    match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && n > 0 => Ok(n),
        r => r,
    }
}

fn send_buf(buf: &mut Vec<u8>) -> &mut [u8] {
    if buf.len() < SLOTS * SLOT {
        buf.resize(SLOTS * SLOT, 0);
    }
    &mut buf[..SLOTS * SLOT]
}

/// Reserves up to `want` bytes of both windows for stream `id`.
fn reserve(
    st: &mut State,
    id: u32,
    want: usize,
    cx: Option<&mut Context<'_>>,
) -> Result<Capacity, StreamError> {
    if let Some(e) = &st.closed {
        return Err(StreamError::Connection(e.clone()));
    }
    let conn_send = st.conn_send;
    let out_full = st.out.len() >= OUT_HIGH;
    let Some(s) = st.streams.get_mut(&id) else { return Err(StreamError::Closed) };
    if let Some(r) = s.reset {
        return Err(StreamError::Reset(r));
    }
    if s.send_done {
        return Err(StreamError::Closed);
    }
    let cap = s.send_window.min(conn_send).min(want as i64);
    if cap > 0 && !out_full {
        s.send_window -= cap;
        st.conn_send -= cap;
        return Ok(Capacity::Bytes(cap as usize));
    }
    if let Some(cx) = cx {
        s.send_waker = Some(cx.waker().clone());
        if conn_send <= 0 || out_full {
            st.send_waiters.push(cx.waker().clone());
        }
    }
    Ok(Capacity::Wait)
}

fn unreserve(st: &mut State, id: u32, n: usize) {
    let n = n as i64;
    st.conn_send += n;
    if let Some(s) = st.streams.get_mut(&id) {
        s.send_window += n;
    }
    if n > 0 {
        st.wake_senders();
    }
}

/// Frames and seals the first `n` payload bytes sitting in `buf`'s slots (capacity `reserved`
/// was taken for them) and writes the records.
fn send_slots(
    shared: &Shared,
    st: &mut State,
    id: u32,
    buf: &mut [u8],
    n: usize,
    reserved: usize,
) -> Result<(), StreamError> {
    unreserve(st, id, reserved - n);
    if let Some(e) = &st.closed {
        return Err(StreamError::Connection(e.clone()));
    }
    match st.streams.get(&id) {
        None => return Err(StreamError::Closed),
        Some(s) if s.reset.is_some() || s.send_done => {
            return Err(s.reset.map(StreamError::Reset).unwrap_or(StreamError::Closed));
        }
        Some(_) => {}
    }
    // Control frames queued before these records go first.
    if let Err(e) = st.seal_control().and_then(|()| st.key_update_if_due()) {
        st.fail(e.clone());
        return Err(StreamError::Connection(e));
    }
    let mut end = 0;
    let mut left = n;
    for slot in buf.chunks_mut(SLOT) {
        if left == 0 {
            break;
        }
        let len = left.min(SLOT_PAYLOAD);
        left -= len;
        let rec_len = tls::OVERHEAD + frame::HEADER_LEN + len;
        Head { len: len as u32, kind: kind::DATA, flags: 0, stream: id }
            .encode(&mut slot[tls::HEADER_LEN..tls::HEADER_LEN + frame::HEADER_LEN]);
        if let Err(e) = st.sealer.seal(&mut slot[..rec_len]) {
            let e = ConnError::from(e);
            st.fail(e.clone());
            return Err(StreamError::Connection(e));
        }
        end += rec_len;
    }
    shared.write_records(st, &buf[..end]);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The driver

struct KeepaliveState {
    cfg: Keepalive,
    timer: Pin<Box<Sleep>>,
    outstanding: Option<[u8; 8]>,
    next_payload: u64,
}

#[derive(Default)]
struct Flood {
    since: Option<Instant>,
    chatter: u32,
    early_resets: u32,
}

impl Flood {
    fn tick(&mut self) {
        let now = Instant::now();
        if self.since.is_none_or(|s| now.duration_since(s) > FLOOD_WINDOW) {
            *self = Flood { since: Some(now), ..Flood::default() };
        }
    }

    fn chatter(&mut self) -> Result<(), ConnError> {
        self.tick();
        self.chatter += 1;
        if self.chatter > MAX_CHATTER {
            return Err(ConnError::protocol(Reason::ENHANCE_YOUR_CALM, "too many control frames"));
        }
        Ok(())
    }

    fn early_reset(&mut self) -> Result<(), ConnError> {
        self.tick();
        self.early_resets += 1;
        if self.early_resets > MAX_EARLY_RESETS {
            return Err(ConnError::protocol(
                Reason::ENHANCE_YOUR_CALM,
                "too many streams reset before their response",
            ));
        }
        Ok(())
    }
}

/// A header block being assembled.
struct Block {
    stream: u32,
    end_stream: bool,
    buf: Vec<u8>,
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
    /// A partial record from the last read (or the handshake's leftover).
    stash: Vec<u8>,
    /// Plaintext rustls decrypted while finishing the handshake.
    early: Vec<u8>,
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

impl Driver {
    fn finish(&mut self, e: ConnError) {
        let mut st = self.shared.lock();
        st.fail(e);
        drop(st);
        let _ = socket2::SockRef::from(&self.shared.tcp).shutdown(std::net::Shutdown::Both);
    }

    fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnError>> {
        if let Some(r) = &self.done {
            return Poll::Ready(r.clone());
        }
        match self.drive(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                match &r {
                    Ok(()) => self.finish(ConnError::closed()),
                    Err(e) => {
                        // Tell the peer why, best effort.
                        if let ConnErrorKind::Protocol(reason) = e.kind {
                            let mut st = self.shared.lock();
                            let last = st.last_peer_id;
                            st.ctl.clear();
                            frame::goaway(&mut st.ctl, last, reason);
                            if st.seal_control().is_ok() {
                                let _ = self.shared.tcp.try_write(st.out.pending());
                            }
                        }
                        self.finish(e.clone());
                    }
                }
                self.done = Some(r.clone());
                Poll::Ready(r)
            }
        }
    }

    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnError>> {
        {
            let mut st = self.shared.lock();
            if !st.driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.driver = Some(cx.waker().clone());
            }
            if let Some(e) = &st.closed {
                return Poll::Ready(Err(e.clone()));
            }
        }
        if !self.early.is_empty() {
            let early = std::mem::take(&mut self.early);
            let shared = self.shared.clone();
            let mut st = shared.lock();
            let mut pending = Vec::new();
            let r = self.plaintext(&mut st, &early, &mut pending);
            deliver(&mut st, &pending);
            r?;
            shared.flush(&mut st);
        }
        if let Err(e) = self.poll_keepalive(cx) {
            return Poll::Ready(Err(e));
        }
        if !self.eof && !self.close_notify {
            match self.poll_read(cx) {
                Poll::Ready(Ok(Read::Eof)) => self.eof = true,
                Poll::Ready(Ok(Read::Data)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        // After close_notify nothing more comes, whether or not the peer closes its socket.
        self.eof |= self.close_notify;
        if let Poll::Ready(Err(e)) = self.poll_flush(cx) {
            return Poll::Ready(Err(e));
        }
        let st = self.shared.lock();
        if let Some(e) = &st.closed {
            return Poll::Ready(Err(e.clone()));
        }
        if self.eof {
            // The peer closed its side: nothing more will come.
            return Poll::Ready(if self.close_notify || st.streams.is_empty() {
                Ok(())
            } else {
                Err(ConnError::new(ConnErrorKind::Io, "connection closed by the peer"))
            });
        }
        let idle = st.streams.is_empty() && self.proto.incoming.is_empty();
        let client_gone = st.role == Role::Client && st.handles == 0;
        // A server's shutdown waits for its final GOAWAY: streams in flight still come in.
        let ours_done = match st.role {
            Role::Client => st.goaway_sent,
            Role::Server => st.final_goaway.is_some(),
        };
        let going_away = ours_done || st.goaway_received.is_some();
        if idle && (client_gone || going_away) && st.out.is_empty() {
            drop(st);
            return Poll::Ready(self.close_gracefully(client_gone));
        }
        Poll::Pending
    }

    /// Ends an idle connection: GOAWAY (unless sent), close_notify, FIN.
    fn close_gracefully(&mut self, send_goaway: bool) -> Result<(), ConnError> {
        let mut st = self.shared.lock();
        let st = &mut *st;
        if send_goaway && !st.goaway_sent {
            st.goaway_sent = true;
            let last = st.last_peer_id;
            frame::goaway(&mut st.ctl, last, Reason::NO_ERROR);
        }
        st.seal_control()?;
        st.sealer.close_notify(&mut st.out.buf)?;
        let _ = self.shared.tcp.try_write(st.out.pending());
        Ok(())
    }

    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> Result<(), ConnError> {
        if let Some(p) = self.proto.pong.take()
            && let Some(k) = &mut self.keepalive
            && k.outstanding == Some(p)
        {
            k.outstanding = None;
            k.timer.as_mut().reset(Instant::now() + k.cfg.interval);
        }
        let Some(k) = &mut self.keepalive else { return Ok(()) };
        while k.timer.as_mut().poll(cx).is_ready() {
            if k.outstanding.is_some() {
                return Err(ConnError::new(ConnErrorKind::PeerDead, "the peer stopped answering PINGs"));
            }
            let payload = k.next_payload.to_be_bytes();
            k.next_payload += 1;
            k.outstanding = Some(payload);
            k.timer.as_mut().reset(Instant::now() + k.cfg.timeout);
            let mut st = self.shared.lock();
            frame::ping(&mut st.ctl, payload, false);
            self.shared.flush(&mut st);
        }
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnError>> {
        let mut st = self.shared.lock();
        if let Err(e) = st.seal_control() {
            return Poll::Ready(Err(e));
        }
        while !st.out.is_empty() {
            if let Err(e) = ready!(self.shared.tcp.poll_write_ready(cx)) {
                return Poll::Ready(Err(ConnError::io(&e)));
            }
            match self.shared.tcp.try_write(st.out.pending()) {
                Ok(n) => st.out.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(ConnError::io(&e))),
            }
        }
        if !st.send_waiters.is_empty() {
            st.wake_senders();
        }
        Poll::Ready(Ok(()))
    }

    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<Read, ConnError>> {
        let shared = self.shared.clone();
        for _ in 0..READS_PER_POLL {
            if let Err(e) = ready!(shared.tcp.poll_read_ready(cx)) {
                return Poll::Ready(Err(ConnError::io(&e)));
            }
            let r = RECV.with_borrow_mut(|buf| {
                if buf.len() < RECV_BUF {
                    buf.resize(RECV_BUF, 0);
                }
                let kept = self.stash.len();
                buf[..kept].copy_from_slice(&self.stash);
                let room = buf.len() - kept;
                let n = match read_drained(&shared.tcp, &mut [io::IoSliceMut::new(&mut buf[kept..])], room) {
                    Ok(0) => return Ok(Some(Read::Eof)),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                    Err(e) => return Err(ConnError::io(&e)),
                };
                let mut st = shared.lock();
                let used = self.records(&mut st, &mut buf[..kept + n]);
                shared.flush(&mut st);
                drop(st);
                let used = used?;
                if used == kept + n {
                    // Nothing partial: the connection keeps no buffer.
                    self.stash = Vec::new();
                } else {
                    self.stash.clear();
                    self.stash.extend_from_slice(&buf[used..kept + n]);
                }
                Ok(Some(Read::Data))
            });
            match r {
                Ok(None) => {}
                Ok(Some(Read::Eof)) => {
                    if !self.stash.is_empty() && !self.close_notify {
                        return Poll::Ready(Err(ConnError::new(
                            ConnErrorKind::Io,
                            "connection closed inside a TLS record",
                        )));
                    }
                    return Poll::Ready(Ok(Read::Eof));
                }
                Ok(Some(Read::Data)) => {
                    if self.close_notify {
                        return Poll::Ready(Ok(Read::Eof));
                    }
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        // Fair to other tasks: come back after they ran.
        cx.waker().wake_by_ref();
        Poll::Ready(Ok(Read::Data))
    }

    /// Opens and dispatches the whole records at the start of `buf`; returns the bytes used.
    fn records(&mut self, st: &mut State, buf: &mut [u8]) -> Result<usize, ConnError> {
        let mut at = 0;
        let mut rest = buf;
        // DATA payloads of this read, written to their apps once the read is dispatched: one
        // write per stream and read, not one per record.
        let mut pending: Vec<(u32, &[u8])> = Vec::new();
        let r = loop {
            if self.close_notify {
                break Ok(());
            }
            let len = match tls::record_len(rest) {
                Ok(Some(len)) if len <= rest.len() => len,
                Ok(_) => break Ok(()),
                Err(e) => break Err(e.into()),
            };
            let (rec, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            at += len;
            let content = match self.session.open(rec) {
                Ok(c) => c,
                Err(e) => break Err(e.into()),
            };
            let rec: &[u8] = rec;
            let step = match content {
                Content::Data(r) => self.plaintext(st, &rec[r], &mut pending),
                Content::Handshake(r) => {
                    self.session.handshake(&rec[r], &mut st.sealer).map_err(ConnError::from).and_then(
                        |post| {
                            if post.update_requested {
                                st.seal_control()?;
                                st.sealer.key_update(&mut st.out.buf)?;
                            }
                            Ok(())
                        },
                    )
                }
                Content::CloseNotify => {
                    self.close_notify = true;
                    Ok(())
                }
                Content::Ignored => Ok(()),
            };
            if let Err(e) = step {
                break Err(e);
            }
        };
        deliver(st, &pending);
        r.map(|()| at)
    }

    /// Dispatches decrypted HTTP/2 bytes; DATA payloads are added to `pending`.
    fn plaintext<'i>(
        &mut self,
        st: &mut State,
        mut input: &'i [u8],
        pending: &mut Vec<(u32, &'i [u8])>,
    ) -> Result<(), ConnError> {
        let proto = &mut self.proto;
        if proto.preface_left > 0 {
            let n = proto.preface_left.min(input.len());
            let expect = &frame::PREFACE[frame::PREFACE.len() - proto.preface_left..][..n];
            if &input[..n] != expect {
                return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "not an HTTP/2 connection preface"));
            }
            proto.preface_left -= n;
            input = &input[n..];
        }
        while let Some(ev) = self.reader.next(&mut input) {
            proto.event(st, ev?, pending)?;
        }
        Ok(())
    }
}

/// Writes the DATA payloads of one read to their streams' apps, in order: each run of one
/// stream's payloads with one vectored write, straight from the receive buffer, when the stream
/// has an app and nothing queued; what the app does not take, and payloads of streams without
/// an app yet, are copied into the stream's queue.
fn deliver(st: &mut State, pending: &[(u32, &[u8])]) {
    let mut i = 0;
    while i < pending.len() {
        let id = pending[i].0;
        let mut j = i + 1;
        while j < pending.len() && pending[j].0 == id {
            j += 1;
        }
        deliver_run(st, id, &pending[i..j]);
        i = j;
    }
}

fn deliver_run(st: &mut State, id: u32, run: &[(u32, &[u8])]) {
    let total: usize = run.iter().map(|(_, b)| b.len()).sum();
    let Some(s) = st.streams.get_mut(&id) else {
        st.release(None, total);
        return;
    };
    if s.reset.is_some() || s.local_reset || s.app_failed {
        st.release(None, total);
        return;
    }
    let mut written = 0;
    if s.queue.is_empty()
        && let Some(app) = &s.app
    {
        const MAX_IOV: usize = 64;
        let mut slices = [io::IoSlice::new(&[]); MAX_IOV];
        let mut at = 0;
        while at < run.len() {
            let part = &run[at..(at + MAX_IOV).min(run.len())];
            for (slot, (_, b)) in slices.iter_mut().zip(part) {
                *slot = io::IoSlice::new(b);
            }
            let want: usize = part.iter().map(|(_, b)| b.len()).sum();
            match app.try_write_vectored(&slices[..part.len()]) {
                Ok(n) => {
                    written += n;
                    if n < want {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // The relay learns of it and ends; the bytes are dropped (those written
                    // before still count).
                    s.count_received(written);
                    s.app_failed = true;
                    s.wake();
                    st.release(None, total);
                    return;
                }
            }
            at += part.len();
        }
    }
    if written > 0 {
        s.count_received(written);
    }
    if written < total {
        let mut rest = bytes::BytesMut::with_capacity(total - written);
        let mut skip = written;
        for (_, b) in run {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            rest.extend_from_slice(&b[skip..]);
            skip = 0;
        }
        s.queued += rest.len();
        s.queue.push_back(rest.freeze());
        if let Some(w) = s.recv_waker.take() {
            w.wake();
        }
    }
    if written > 0 {
        st.release(Some(id), written);
    }
}

impl Proto {
    fn new(role: Role, cfg: &Config, max_block: usize) -> Proto {
        Proto {
            role,
            decoder: hpack::Decoder::default(),
            block: None,
            max_block,
            max_header_list: cfg.max_header_list_size as usize,
            data_target: None,
            data_flow: 0,
            preface_left: if role == Role::Server { frame::PREFACE.len() } else { 0 },
            settings_seen: false,
            preface_done_at: None,
            incoming: VecDeque::new(),
            flood: Flood::default(),
            pong: None,
        }
    }

    /// The largest header block a connection assembles: twice its header list limit.
    fn max_block(cfg: &Config) -> usize {
        (cfg.max_header_list_size as usize).saturating_mul(2).clamp(16 * 1024, 1 << 20)
    }

    fn event<'i>(
        &mut self,
        st: &mut State,
        ev: Event<'_, 'i>,
        pending: &mut Vec<(u32, &'i [u8])>,
    ) -> Result<(), ConnError> {
        if !self.settings_seen {
            match ev {
                Event::Frame(h, _) if h.kind == kind::SETTINGS && h.flags & flag::ACK == 0 => {
                    self.settings_seen = true;
                    self.preface_done_at = Some(Instant::now());
                }
                _ => {
                    return Err(ConnError::protocol(
                        Reason::PROTOCOL_ERROR,
                        "the first frame is not SETTINGS",
                    ));
                }
            }
        }
        if let Some(b) = &self.block {
            let continuation =
                matches!(ev, Event::Frame(h, _) if h.kind == kind::CONTINUATION && h.stream == b.stream);
            if !continuation {
                return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "frame inside a header block"));
            }
        }
        match ev {
            Event::DataStart { stream, flow } => self.data_start(st, stream, flow),
            Event::Data { stream: _, bytes } => {
                if let Some(DataTarget::Stream(id)) = self.data_target {
                    pending.push((id, bytes));
                }
                Ok(())
            }
            Event::DataEnd { stream, undelivered, end_stream } => {
                if self.data_flow == 0 && !end_stream {
                    // An empty DATA frame that does not end its stream carries nothing: chatter.
                    // (An empty one with END_STREAM is how a stream's sender ends it.)
                    self.flood.chatter()?;
                }
                let target = self.data_target.take();
                if let Some(DataTarget::Stream(id)) = target {
                    debug_assert_eq!(id, stream);
                    st.release(Some(id), undelivered as usize);
                    if end_stream && let Some(s) = st.streams.get_mut(&id) {
                        s.recv_done = true;
                        s.wake();
                    }
                }
                Ok(())
            }
            Event::Frame(h, payload) => self.frame(st, h, payload),
        }
    }

    fn data_start(&mut self, st: &mut State, id: u32, flow: u32) -> Result<(), ConnError> {
        self.data_flow = flow;
        st.conn_recv -= i64::from(flow);
        if st.conn_recv < 0 {
            return Err(ConnError::protocol(Reason::FLOW_CONTROL_ERROR, "DATA beyond the connection window"));
        }
        if self.is_idle(st, id) {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "DATA on an idle stream"));
        }
        let target = match st.streams.get_mut(&id) {
            None => None,
            Some(s) if s.recv_done => {
                frame::rst_stream(&mut st.ctl, id, Reason::STREAM_CLOSED);
                s.local_reset = true;
                s.send_done = true;
                s.reset = Some(Reason::STREAM_CLOSED);
                s.wake();
                None
            }
            Some(s) if s.reset.is_some() || s.local_reset => None,
            Some(s) => {
                s.recv_window -= i64::from(flow);
                if s.recv_window < 0 {
                    frame::rst_stream(&mut st.ctl, id, Reason::FLOW_CONTROL_ERROR);
                    s.local_reset = true;
                    s.send_done = true;
                    s.reset = Some(Reason::FLOW_CONTROL_ERROR);
                    s.wake();
                    None
                } else {
                    Some(id)
                }
            }
        };
        match target {
            Some(id) => self.data_target = Some(DataTarget::Stream(id)),
            None => {
                // Nobody takes these bytes: their connection window comes back at once.
                st.release(None, flow as usize);
                self.data_target = Some(DataTarget::Drop);
            }
        }
        Ok(())
    }

    /// A stream id the peer may not use yet (RFC 9113 §5.1: idle).
    fn is_idle(&self, st: &State, id: u32) -> bool {
        match self.role {
            Role::Client => id.is_multiple_of(2) || id >= st.next_id,
            Role::Server => id.is_multiple_of(2) || id > st.last_peer_id,
        }
    }

    fn frame(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        match h.kind {
            kind::HEADERS => self.headers(st, h, p),
            kind::CONTINUATION => {
                let Some(b) = &mut self.block else {
                    return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "CONTINUATION without HEADERS"));
                };
                if b.buf.len() + p.len() > self.max_block {
                    return Err(ConnError::protocol(Reason::ENHANCE_YOUR_CALM, "header block too large"));
                }
                b.buf.extend_from_slice(p);
                if h.flags & flag::END_HEADERS != 0
                    && let Some(b) = self.block.take()
                {
                    return self.header_block(st, b);
                }
                Ok(())
            }
            kind::PRIORITY => {
                if h.stream == 0 {
                    return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                if p.len() != 5 {
                    return Err(ConnError::protocol(Reason::FRAME_SIZE_ERROR, "PRIORITY of the wrong size"));
                }
                Ok(())
            }
            kind::RST_STREAM => self.rst_stream(st, h, p),
            kind::SETTINGS => self.settings(st, h, p),
            kind::PUSH_PROMISE => {
                Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "PUSH_PROMISE (push is disabled)"))
            }
            kind::PING => {
                if h.stream != 0 {
                    return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "PING on a stream"));
                }
                let payload: [u8; 8] = p
                    .try_into()
                    .map_err(|_| ConnError::protocol(Reason::FRAME_SIZE_ERROR, "PING of the wrong size"))?;
                if h.flags & flag::ACK != 0 {
                    if payload == DRAIN_PING && st.goaway_sent && st.final_goaway.is_none() {
                        // Streams the client opened before it saw our first GOAWAY are in.
                        let last = st.last_peer_id;
                        st.final_goaway = Some(last);
                        frame::goaway(&mut st.ctl, last, Reason::NO_ERROR);
                    } else {
                        self.pong = Some(payload);
                    }
                } else {
                    self.flood.chatter()?;
                    frame::ping(&mut st.ctl, payload, true);
                }
                Ok(())
            }
            kind::GOAWAY => self.goaway(st, h, p),
            kind::WINDOW_UPDATE => self.window_update(st, h, p),
            _ => self.flood.chatter(),
        }
    }

    fn headers(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        if h.stream == 0 {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        let mut p = p;
        let mut pad = 0usize;
        if h.flags & flag::PADDED != 0 {
            let [n, rest @ ..] = p else {
                return Err(ConnError::protocol(
                    Reason::FRAME_SIZE_ERROR,
                    "padded HEADERS without a pad length",
                ));
            };
            pad = usize::from(*n);
            p = rest;
        }
        if h.flags & flag::PRIORITY != 0 {
            p = p.get(5..).ok_or_else(|| {
                ConnError::protocol(Reason::FRAME_SIZE_ERROR, "HEADERS shorter than its priority")
            })?;
        }
        if pad > p.len() {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "HEADERS padding longer than the frame"));
        }
        let fragment = &p[..p.len() - pad];
        let block =
            Block { stream: h.stream, end_stream: h.flags & flag::END_STREAM != 0, buf: fragment.to_vec() };
        if h.flags & flag::END_HEADERS != 0 {
            self.header_block(st, block)
        } else {
            self.block = Some(block);
            Ok(())
        }
    }

    fn header_block(&mut self, st: &mut State, b: Block) -> Result<(), ConnError> {
        let id = b.stream;
        let decoded = match self.decoder.decode(&b.buf, self.max_header_list) {
            Err(HeaderError::Compression(e)) => {
                return Err(ConnError::protocol(Reason::COMPRESSION_ERROR, format!("header block: {e}")));
            }
            other => other,
        };
        if st.streams.contains_key(&id) {
            return self.stream_headers(st, id, b.end_stream, decoded);
        }
        match self.role {
            Role::Client => {
                if self.is_idle(st, id) {
                    return Err(ConnError::protocol(
                        Reason::PROTOCOL_ERROR,
                        "HEADERS on a stream we did not open",
                    ));
                }
                // A stream we already closed: nothing to do.
                Ok(())
            }
            Role::Server => {
                if id.is_multiple_of(2) || id <= st.last_peer_id {
                    return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "HEADERS reusing a stream id"));
                }
                st.last_peer_id = id;
                if st.final_goaway.is_some() || st.closed.is_some() {
                    // Past our final GOAWAY: ignored; the client retries elsewhere.
                    return Ok(());
                }
                let head = match decoded {
                    Ok(h) => h,
                    Err(_) => {
                        frame::rst_stream(&mut st.ctl, id, Reason::PROTOCOL_ERROR);
                        return Ok(());
                    }
                };
                if st.streams.len() >= st.local_max_concurrent as usize {
                    frame::rst_stream(&mut st.ctl, id, Reason::REFUSED_STREAM);
                    return Ok(());
                }
                let stream = Stream {
                    send_window: i64::from(st.peer.initial_window),
                    recv_window: i64::from(st.local_window),
                    recv_done: b.end_stream,
                    ..Stream::default()
                };
                st.streams.insert(id, stream);
                self.incoming.push_back((id, head));
                Ok(())
            }
        }
    }

    fn stream_headers(
        &mut self,
        st: &mut State,
        id: u32,
        end_stream: bool,
        decoded: Result<Decoded, HeaderError>,
    ) -> Result<(), ConnError> {
        let role = self.role;
        let Some(s) = st.streams.get_mut(&id) else { return Ok(()) };
        if s.recv_done {
            frame::rst_stream(&mut st.ctl, id, Reason::STREAM_CLOSED);
            return Ok(());
        }
        let awaiting = role == Role::Client && s.head.is_none() && !s.responded;
        if awaiting {
            match decoded {
                Ok(head) if head.status.is_some_and(|c| (100..200).contains(&c)) => {
                    // Informational: the final response follows.
                    if end_stream {
                        s.reset = Some(Reason::PROTOCOL_ERROR);
                        s.wake();
                        frame::rst_stream(&mut st.ctl, id, Reason::PROTOCOL_ERROR);
                    }
                    return Ok(());
                }
                Ok(head) if head.status.is_none() => {
                    s.head = Some(Err(HeaderError::Malformed("response without :status")));
                }
                other => s.head = Some(other),
            }
            // Mark that a head arrived even after it is taken.
            s.responded = true;
        } else if !end_stream {
            // Trailers must end the stream.
            s.reset = Some(Reason::PROTOCOL_ERROR);
            s.local_reset = true;
            s.wake();
            frame::rst_stream(&mut st.ctl, id, Reason::PROTOCOL_ERROR);
            return Ok(());
        }
        if end_stream {
            s.recv_done = true;
        }
        s.wake();
        Ok(())
    }

    fn rst_stream(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        if h.stream == 0 {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
        }
        let code: [u8; 4] = p
            .try_into()
            .map_err(|_| ConnError::protocol(Reason::FRAME_SIZE_ERROR, "RST_STREAM of the wrong size"))?;
        if self.is_idle(st, h.stream) {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "RST_STREAM on an idle stream"));
        }
        let reason = Reason(u32::from_be_bytes(code));
        let role = self.role;
        let Some(s) = st.streams.get_mut(&h.stream) else { return Ok(()) };
        if role == Role::Server && !s.responded {
            self.flood.early_reset()?;
        }
        if s.reset.is_none() {
            s.reset = Some(reason);
        }
        // Queued bytes will never be written: their window goes back.
        let queued = std::mem::take(&mut s.queued);
        s.queue.clear();
        s.wake();
        st.release(None, queued);
        st.wake_senders();
        Ok(())
    }

    fn settings(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        if h.stream != 0 {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        if h.flags & flag::ACK != 0 {
            if !p.is_empty() {
                return Err(ConnError::protocol(
                    Reason::FRAME_SIZE_ERROR,
                    "SETTINGS acknowledgement with a payload",
                ));
            }
            return Ok(());
        }
        self.flood.chatter()?;
        let entries = frame::parse_settings(p).map_err(|r| ConnError::protocol(r, "invalid SETTINGS"))?;
        for (id, v) in entries {
            match id {
                setting::HEADER_TABLE_SIZE if v != st.peer.header_table => {
                    st.peer.header_table = v;
                    st.encoder.table_size_changed();
                }
                setting::ENABLE_PUSH if self.role == Role::Client && v != 0 => {
                    return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "a server enabled push"));
                }
                setting::MAX_CONCURRENT_STREAMS => st.peer.max_concurrent = v,
                setting::INITIAL_WINDOW_SIZE => {
                    let delta = i64::from(v) - i64::from(st.peer.initial_window);
                    st.peer.initial_window = v;
                    for s in st.streams.values_mut() {
                        s.send_window += delta;
                        if s.send_window > frame::MAX_WINDOW {
                            return Err(ConnError::protocol(
                                Reason::FLOW_CONTROL_ERROR,
                                "a stream window over 2^31-1",
                            ));
                        }
                        if delta > 0 {
                            s.wake();
                        }
                    }
                }
                setting::MAX_FRAME_SIZE => st.peer.max_frame = v,
                _ => {}
            }
        }
        frame::settings_ack(&mut st.ctl);
        st.wake_senders();
        Ok(())
    }

    fn goaway(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        if h.stream != 0 {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
        }
        let Some(head) = p.get(..8) else {
            return Err(ConnError::protocol(Reason::FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes"));
        };
        let last = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff;
        let reason = Reason(u32::from_be_bytes([head[4], head[5], head[6], head[7]]));
        let last = st.goaway_received.map_or(last, |(prev, _)| prev.min(last));
        st.goaway_received = Some((last, reason));
        let ours = |id: u32| (id % 2 == 1) == (self.role == Role::Client);
        for (id, s) in st.streams.iter_mut() {
            if ours(*id) && *id > last && !s.responded {
                s.refused = true;
                s.wake();
            }
        }
        if reason != Reason::NO_ERROR {
            tracing::debug!(%reason, last_stream = last, "the HBONE peer sent GOAWAY with an error");
        }
        st.wake_senders();
        Ok(())
    }

    fn window_update(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        let inc: [u8; 4] = p
            .try_into()
            .map_err(|_| ConnError::protocol(Reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size"))?;
        let inc = i64::from(u32::from_be_bytes(inc) & 0x7fff_ffff);
        if h.stream == 0 {
            if inc == 0 {
                return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0"));
            }
            st.conn_send += inc;
            if st.conn_send > frame::MAX_WINDOW {
                return Err(ConnError::protocol(
                    Reason::FLOW_CONTROL_ERROR,
                    "the connection window over 2^31-1",
                ));
            }
            st.wake_senders();
            return Ok(());
        }
        if self.is_idle(st, h.stream) {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream"));
        }
        let Some(s) = st.streams.get_mut(&h.stream) else { return Ok(()) };
        let reason = if inc == 0 {
            Some(Reason::PROTOCOL_ERROR)
        } else {
            s.send_window += inc;
            (s.send_window > frame::MAX_WINDOW).then_some(Reason::FLOW_CONTROL_ERROR)
        };
        if let Some(r) = reason {
            s.reset = Some(r);
            s.local_reset = true;
            s.send_done = true;
            frame::rst_stream(&mut st.ctl, h.stream, r);
        }
        s.wake();
        Ok(())
    }
}

/// Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, never on in a normal build).
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use super::*;

    /// Feeds `data` to one side's protocol machinery as the plaintext it receives after the TLS
    /// handshake: a server when the first byte is even, a client otherwise; the next byte sizes
    /// the pieces it arrives in. Stops at the first connection error, as a connection does.
    pub fn plaintext(data: &[u8]) {
        let [first, step, rest @ ..] = data else { return };
        let role = if first % 2 == 0 { Role::Server } else { Role::Client };
        let cfg = Config {
            stream_window: 1 << 16,
            connection_window: 1 << 17,
            max_frame_size: frame::DEFAULT_MAX_FRAME,
            max_concurrent_streams: Some(100),
            max_header_list_size: 16 * 1024,
            keepalive: None,
        };
        let mut st = State::new(role, tls::Sealer::for_fuzzing(), &cfg);
        if role == Role::Client {
            // Streams 1, 3 and 5 are open and waiting for their response.
            for id in [1, 3, 5] {
                st.streams
                    .insert(id, Stream { send_window: 65_535, recv_window: 65_535, ..Stream::default() });
            }
            st.next_id = 7;
        }
        let max_block = Proto::max_block(&cfg);
        let mut reader = frame::Reader::new(cfg.max_frame_size, max_block);
        let mut proto = Proto::new(role, &cfg, max_block);
        for piece in rest.chunks(usize::from(*step).max(1)) {
            let mut input = piece;
            if proto.preface_left > 0 {
                let n = proto.preface_left.min(input.len());
                let expect = &frame::PREFACE[frame::PREFACE.len() - proto.preface_left..][..n];
                if &input[..n] != expect {
                    return;
                }
                proto.preface_left -= n;
                input = &input[n..];
            }
            let mut pending = Vec::new();
            while let Some(ev) = reader.next(&mut input) {
                let Ok(ev) = ev else { return };
                if proto.event(&mut st, ev, &mut pending).is_err() {
                    return;
                }
            }
            deliver(&mut st, &pending);
            // Streams the peer opened are answered and dropped, as a handler would.
            while let Some((id, _)) = proto.incoming.pop_front() {
                st.streams.remove(&id);
            }
            if st.seal_control().is_err() {
                return;
            }
            let n = st.out.len();
            st.out.advance(n);
        }
    }
}

#[cfg(test)]
mod tests;
