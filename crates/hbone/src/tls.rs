//! HBONE's TLS: rustls runs the handshake (certificates, identities, key schedule), then the
//! connection protects its records itself with the traffic secrets rustls hands over (its
//! "kernel connection" API, meant for kTLS). Owning the record layer lets records be sealed and
//! opened in place, in buffers the HTTP/2 layer also owns: bytes read from an app are encrypted
//! where they were read and written to the socket from there, and bytes read from the socket are
//! decrypted where they landed and written to the app from there. No copy through a TLS library's
//! buffers.
//!
//! Only TLS 1.3 with AES-GCM is spoken (what HBONE's configs allow). After the handshake the
//! record layer handles what TLS 1.3 can still send: application data, alerts (close_notify ends
//! the stream, others are fatal) and the post-handshake messages NewSessionTicket (passed to
//! rustls) and KeyUpdate (keys rotated through rustls, and answered when the peer asks).

use std::io;
use std::ops::Range;
use std::sync::Arc;

use aws_lc_rs::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use rustls::client::ClientConnectionData;
use rustls::client::UnbufferedClientConnection;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

/// Largest content of one record (RFC 8446 §5.1).
pub const MAX_CONTENT: usize = 16 * 1024;
/// Record header: type, legacy version, length.
pub const HEADER_LEN: usize = 5;
/// AEAD tag.
pub const TAG_LEN: usize = 16;
/// What a record adds around its content: header, inner content type, tag.
pub const OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;
/// Largest protected record on the wire (RFC 8446 §5.2: content + 256).
pub const MAX_RECORD: usize = HEADER_LEN + MAX_CONTENT + 256;
/// Handshake buffers: a whole handshake message (certificate chains) may need to sit in the
/// incoming buffer while rustls joins its fragments.
const MAX_HANDSHAKE_BUFFER: usize = 128 * 1024;
/// Post-handshake messages waiting for their last fragment.
const MAX_POST_HANDSHAKE: usize = 64 * 1024;
/// A key is replaced (KeyUpdate) after this many records, far below AES-GCM's confidentiality
/// limit for TLS 1.3 (2^24.5 records, RFC 8446 §5.5).
pub const KEY_UPDATE_AFTER: u64 = 1 << 23;

const TYPE_ALERT: u8 = 21;
const TYPE_HANDSHAKE: u8 = 22;
const TYPE_APPLICATION_DATA: u8 = 23;
const LEGACY_VERSION: [u8; 2] = [0x03, 0x03];
const HS_NEW_SESSION_TICKET: u8 = 4;
const HS_KEY_UPDATE: u8 = 24;
const ALERT_CLOSE_NOTIFY: u8 = 0;
const ALERT_USER_CANCELED: u8 = 90;

/// Why a TLS connection failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// rustls refused the handshake (certificates, identities, protocol).
    #[error("{0}")]
    Handshake(#[from] rustls::Error),
    /// The peer closed the connection before the handshake was done.
    #[error("the peer closed the connection during the TLS handshake")]
    ClosedInHandshake,
    /// The handshake needs more buffer than a handshake may take.
    #[error("TLS handshake message larger than {MAX_HANDSHAKE_BUFFER} bytes")]
    HandshakeTooLarge,
    /// The handshake settled on something this record layer does not protect.
    #[error("unsupported TLS session: {0}")]
    Unsupported(&'static str),
    /// A record failed to decrypt (tampered, or keys out of step).
    #[error("TLS record failed to decrypt (bad_record_mac)")]
    BadRecordMac,
    /// A record that breaks the protocol.
    #[error("malformed TLS record: {0}")]
    Malformed(&'static str),
    /// The peer sent a fatal alert.
    #[error("received fatal TLS alert {0}")]
    Alert(u8),
}

impl TlsError {
    /// As an I/O error (for the relays' error paths).
    pub fn into_io(self) -> io::Error {
        match self {
            TlsError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

/// AES-GCM key and IV of one direction (RFC 8446 §5.3).
struct Aead {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
}

impl Aead {
    fn new(secrets: &ConnectionTrafficSecrets) -> Result<Aead, TlsError> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            _ => return Err(TlsError::Unsupported("cipher suite other than AES-GCM")),
        };
        let key =
            UnboundKey::new(alg, key.as_ref()).map_err(|_| TlsError::Unsupported("AES-GCM key length"))?;
        let iv: [u8; NONCE_LEN] =
            iv.as_ref().try_into().map_err(|_| TlsError::Unsupported("AES-GCM IV length"))?;
        Ok(Aead { key: LessSafeKey::new(key), iv })
    }

    /// The per-record nonce: the IV XOR the 64-bit sequence number, right-aligned.
    fn nonce(&self, seq: u64) -> Nonce {
        let mut n = self.iv;
        for (b, s) in n[NONCE_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
            *b ^= s;
        }
        Nonce::assume_unique_for_key(n)
    }
}

/// The sending half of the record layer, with rustls's state (key updates and session tickets
/// go through it).
pub struct Sealer {
    aead: Aead,
    seq: u64,
    update_after: u64,
    kernel: Kernel,
}

impl Sealer {
    /// Seals the record laid out in `rec` in place: `rec` is `HEADER_LEN` bytes of room, the
    /// content, one byte of room for the inner content type and `TAG_LEN` bytes of room. The
    /// header, type and tag are written here.
    pub fn seal(&mut self, rec: &mut [u8]) -> Result<(), TlsError> {
        self.seal_typed(rec, TYPE_APPLICATION_DATA)
    }

    fn seal_typed(&mut self, rec: &mut [u8], typ: u8) -> Result<(), TlsError> {
        let total = rec.len();
        if total < OVERHEAD || total - OVERHEAD > MAX_CONTENT {
            return Err(TlsError::Malformed("record content out of bounds"));
        }
        let body = total - HEADER_LEN;
        let [hi, lo] =
            u16::try_from(body).map_err(|_| TlsError::Malformed("record too large"))?.to_be_bytes();
        let header = [TYPE_APPLICATION_DATA, LEGACY_VERSION[0], LEGACY_VERSION[1], hi, lo];
        rec[..HEADER_LEN].copy_from_slice(&header);
        rec[total - TAG_LEN - 1] = typ;
        let nonce = self.aead.nonce(self.seq);
        let (inner, tag) = rec[HEADER_LEN..].split_at_mut(body - TAG_LEN);
        let t = self
            .aead
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), inner)
            .map_err(|_| TlsError::Malformed("seal failed"))?;
        tag.copy_from_slice(t.as_ref());
        self.seq += 1;
        Ok(())
    }

    /// Seals a KeyUpdate (update_not_requested) with the current key into `out`, then moves to
    /// the next key. The record must be sent before anything sealed after it.
    pub fn key_update(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        let start = out.len();
        out.resize(start + OVERHEAD + 5, 0);
        out[start + HEADER_LEN..start + HEADER_LEN + 5].copy_from_slice(&[HS_KEY_UPDATE, 0, 0, 1, 0]);
        self.seal_typed(&mut out[start..], TYPE_HANDSHAKE)?;
        let (seq, secrets) = self.kernel.update(true)?;
        self.aead = Aead::new(&secrets)?;
        self.seq = seq;
        Ok(())
    }

    /// Seals a close_notify alert into `out`.
    pub fn close_notify(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        let start = out.len();
        out.resize(start + OVERHEAD + 2, 0);
        out[start + HEADER_LEN..start + HEADER_LEN + 2].copy_from_slice(&[1, ALERT_CLOSE_NOTIFY]);
        self.seal_typed(&mut out[start..], TYPE_ALERT)
    }

    /// Whether this key has sealed enough records to be replaced (see [`Sealer::key_update`]).
    pub fn wants_key_update(&self) -> bool {
        self.seq >= self.update_after
    }

    /// Records sealed with the current key.
    pub fn sequence(&self) -> u64 {
        self.seq
    }

    /// A sealer with a fixed key and no key schedule, for the fuzz targets.
    #[cfg(feature = "fuzzing")]
    pub fn for_fuzzing() -> Sealer {
        let secrets = ConnectionTrafficSecrets::Aes256Gcm {
            key: rustls::crypto::cipher::AeadKey::from([7u8; 32]),
            iv: rustls::crypto::cipher::Iv::new([1u8; NONCE_LEN]),
        };
        let aead = match Aead::new(&secrets) {
            Ok(a) => a,
            Err(e) => panic!("a fixed AES-256 key: {e}"),
        };
        Sealer { aead, seq: 0, update_after: KEY_UPDATE_AFTER, kernel: Kernel::None }
    }

    /// Replaces the key after `records` records instead of [`KEY_UPDATE_AFTER`] (tests, so a
    /// key update happens within a short transfer).
    pub fn set_key_update_after(&mut self, records: u64) {
        self.update_after = records;
    }
}

/// The receiving half of the record layer.
pub struct Opener {
    aead: Aead,
    seq: u64,
}

/// What one opened record holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Application data at this range of the record.
    Data(Range<usize>),
    /// Handshake bytes (post-handshake messages) at this range.
    Handshake(Range<usize>),
    /// close_notify (or user_canceled followed by it): no more data will come.
    CloseNotify,
    /// A warning alert other than close_notify that TLS 1.3 lets pass (user_canceled).
    Ignored,
}

impl Opener {
    /// Opens the whole record `rec` (as [`record_len`] measured it) in place.
    pub fn open(&mut self, rec: &mut [u8]) -> Result<Content, TlsError> {
        if rec.len() < HEADER_LEN + TAG_LEN + 1 {
            return Err(TlsError::Malformed("record shorter than its tag"));
        }
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&rec[..HEADER_LEN]);
        let nonce = self.aead.nonce(self.seq);
        let plain_len = {
            let plain = self
                .aead
                .key
                .open_in_place(nonce, Aad::from(header), &mut rec[HEADER_LEN..])
                .map_err(|_| TlsError::BadRecordMac)?;
            plain.len()
        };
        self.seq += 1;
        // TLSInnerPlaintext: content, type, zero padding.
        let inner = &rec[HEADER_LEN..HEADER_LEN + plain_len];
        let Some(end) = inner.iter().rposition(|&b| b != 0) else {
            return Err(TlsError::Malformed("record without a content type"));
        };
        if end > MAX_CONTENT {
            return Err(TlsError::Malformed("record content over 2^14 bytes"));
        }
        let content = HEADER_LEN..HEADER_LEN + end;
        match inner[end] {
            TYPE_APPLICATION_DATA => Ok(Content::Data(content)),
            TYPE_HANDSHAKE if !content.is_empty() => Ok(Content::Handshake(content)),
            TYPE_ALERT => match &rec[content] {
                [_, ALERT_CLOSE_NOTIFY] => Ok(Content::CloseNotify),
                [_, ALERT_USER_CANCELED] => Ok(Content::Ignored),
                [_, d] => Err(TlsError::Alert(*d)),
                _ => Err(TlsError::Malformed("alert of the wrong length")),
            },
            _ => Err(TlsError::Malformed("unexpected record content type")),
        }
    }
}

/// The length of the record at the start of `buf`, once its header is there; an error for a
/// header no TLS 1.3 peer sends after the handshake.
pub fn record_len(buf: &[u8]) -> Result<Option<usize>, TlsError> {
    let Some(h) = buf.get(..HEADER_LEN) else { return Ok(None) };
    if h[0] != TYPE_APPLICATION_DATA {
        return Err(TlsError::Malformed("outer record type is not application_data"));
    }
    if h[1] != LEGACY_VERSION[0] {
        return Err(TlsError::Malformed("record version"));
    }
    let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
    if len > MAX_RECORD - HEADER_LEN {
        return Err(TlsError::Malformed("record over 2^14 + 256 bytes"));
    }
    Ok(Some(HEADER_LEN + len))
}

/// rustls's side of an established connection: key updates and session tickets.
enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
    /// The fuzz targets' connections, which had no handshake: no key schedule.
    #[cfg(feature = "fuzzing")]
    None,
}

impl Kernel {
    fn update(&mut self, tx: bool) -> Result<(u64, ConnectionTrafficSecrets), TlsError> {
        Ok(match (self, tx) {
            (Kernel::Client(k), true) => k.update_tx_secret()?,
            (Kernel::Client(k), false) => k.update_rx_secret()?,
            (Kernel::Server(k), true) => k.update_tx_secret()?,
            (Kernel::Server(k), false) => k.update_rx_secret()?,
            #[cfg(feature = "fuzzing")]
            (Kernel::None, _) => return Err(TlsError::Unsupported("key update without a key schedule")),
        })
    }
}

/// What a post-handshake message asks of the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PostHandshake {
    /// The peer updated its keys and asked us to update ours: seal a KeyUpdate
    /// ([`Sealer::key_update`]) before the next record.
    pub update_requested: bool,
}

/// The receiving half of an established connection's record layer (the sending half, the
/// [`Sealer`], lives where the connection's writes are serialised).
pub struct Session {
    opener: Opener,
    /// Post-handshake bytes waiting for the rest of their message.
    pending: Vec<u8>,
}

impl Session {
    /// Handles the handshake bytes of one record (see [`Content::Handshake`]); rustls's state is
    /// in the sending half.
    pub fn handshake(&mut self, bytes: &[u8], sealer: &mut Sealer) -> Result<PostHandshake, TlsError> {
        if self.pending.len() + bytes.len() > MAX_POST_HANDSHAKE {
            return Err(TlsError::Malformed("post-handshake message too large"));
        }
        self.pending.extend_from_slice(bytes);
        let mut out = PostHandshake::default();
        let mut at = 0;
        while let [typ, a, b, c, ..] = self.pending[at..] {
            let len = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            let Some(body) = self.pending.get(at + 4..at + 4 + len) else { break };
            match typ {
                HS_NEW_SESSION_TICKET => {
                    if let Kernel::Client(k) = &mut sealer.kernel {
                        k.handle_new_session_ticket(body)?;
                    } else {
                        return Err(TlsError::Malformed("NewSessionTicket sent by a client"));
                    }
                }
                HS_KEY_UPDATE => {
                    // A KeyUpdate ends its record: keys change at the next one (RFC 8446 §5.1).
                    if at + 4 + len != self.pending.len() {
                        return Err(TlsError::Malformed("data after a KeyUpdate in its record"));
                    }
                    let requested = match body {
                        [0] => false,
                        [1] => true,
                        _ => return Err(TlsError::Malformed("KeyUpdate")),
                    };
                    let (seq, secrets) = sealer.kernel.update(false)?;
                    self.opener = Opener { aead: Aead::new(&secrets)?, seq };
                    out.update_requested |= requested;
                }
                _ => return Err(TlsError::Malformed("unexpected post-handshake message")),
            }
            at += 4 + len;
        }
        self.pending.drain(..at);
        Ok(out)
    }

    /// Opens the next record (see [`Opener::open`]).
    pub fn open(&mut self, rec: &mut [u8]) -> Result<Content, TlsError> {
        self.opener.open(rec)
    }
}

/// A finished handshake.
pub struct Established {
    /// The receiving half and rustls's state.
    pub session: Session,
    /// The sending half.
    pub sealer: Sealer,
    /// Bytes read past the handshake: the start of the first protected record(s).
    pub leftover: Vec<u8>,
    /// Application data rustls already decrypted while finishing the handshake.
    pub early: Vec<u8>,
    /// The peer's certificate chain (leaf first).
    pub peer_certificates: Vec<CertificateDer<'static>>,
    /// The peer already sent close_notify (right after its last handshake flight).
    pub peer_closed: bool,
}

/// One side of an unbuffered rustls connection.
trait Side {
    type Data;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn handshaking(&self) -> bool;
}

impl Side for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
}

impl Side for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn handshaking(&self) -> bool {
        self.is_handshaking()
    }
}

/// Runs the client side of the handshake on `tcp`.
pub async fn connect(
    tcp: &TcpStream,
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
) -> Result<Established, TlsError> {
    let mut conn = UnbufferedClientConnection::new(config, name)?;
    let done = drive(tcp, &mut conn).await?;
    let peer_certificates = conn.peer_certificates().map(<[_]>::to_vec).unwrap_or_default();
    let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
    established(secrets, Kernel::Client(kernel), done, peer_certificates)
}

/// Runs the server side of the handshake on `tcp`.
pub async fn accept(tcp: &TcpStream, config: Arc<rustls::ServerConfig>) -> Result<Established, TlsError> {
    let mut conn = UnbufferedServerConnection::new(config)?;
    let done = drive(tcp, &mut conn).await?;
    let peer_certificates = conn.peer_certificates().map(<[_]>::to_vec).unwrap_or_default();
    let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
    established(secrets, Kernel::Server(kernel), done, peer_certificates)
}

fn established(
    secrets: ExtractedSecrets,
    kernel: Kernel,
    done: Done,
    peer_certificates: Vec<CertificateDer<'static>>,
) -> Result<Established, TlsError> {
    let Done { leftover, early, peer_closed } = done;
    let (tx_seq, tx) = secrets.tx;
    let (rx_seq, rx) = secrets.rx;
    Ok(Established {
        session: Session { opener: Opener { aead: Aead::new(&rx)?, seq: rx_seq }, pending: Vec::new() },
        sealer: Sealer { aead: Aead::new(&tx)?, seq: tx_seq, update_after: KEY_UPDATE_AFTER, kernel },
        leftover,
        early,
        peer_certificates,
        peer_closed,
    })
}

/// What the handshake left for the record layer.
struct Done {
    leftover: Vec<u8>,
    early: Vec<u8>,
    peer_closed: bool,
}

enum Step {
    Again,
    Read,
    Write,
    Done,
}

/// Drives the handshake until rustls may send application data; returns the bytes read past it
/// and any application data rustls decrypted on the way.
async fn drive<S: Side>(tcp: &TcpStream, conn: &mut S) -> Result<Done, TlsError> {
    let mut incoming = vec![0u8; MAX_RECORD];
    let mut used = 0usize;
    let mut outgoing: Vec<u8> = Vec::new();
    let mut early = Vec::new();
    let mut peer_closed = false;
    loop {
        let handshaking = conn.handshaking();
        let UnbufferedStatus { discard, state } = conn.process(&mut incoming[..used]);
        let step = match state {
            Err(e) => {
                let _ = flush_alert(tcp, conn, &mut incoming[..used]).await;
                return Err(e.into());
            }
            Ok(ConnectionState::ReadTraffic(mut r)) => {
                while let Some(rec) = r.next_record() {
                    early.extend_from_slice(rec?.payload);
                }
                Step::Again
            }
            Ok(ConnectionState::EncodeTlsData(mut e)) => {
                encode(&mut outgoing, |buf| e.encode(buf))?;
                Step::Again
            }
            Ok(ConnectionState::TransmitTlsData(t)) => {
                t.done();
                Step::Write
            }
            Ok(ConnectionState::BlockedHandshake) => Step::Read,
            Ok(ConnectionState::WriteTraffic(_)) => Step::Done,
            // A peer may finish its handshake, send data and close at once: what it sent counts.
            Ok(ConnectionState::PeerClosed) if !handshaking => {
                peer_closed = true;
                Step::Again
            }
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                return Err(TlsError::ClosedInHandshake);
            }
            Ok(_) => return Err(TlsError::Unsupported("early data")),
        };
        incoming.copy_within(discard..used, 0);
        used -= discard;
        match step {
            Step::Again => {}
            Step::Write => {
                write_all(tcp, &outgoing).await?;
                outgoing.clear();
            }
            Step::Read => {
                if used == incoming.len() {
                    if incoming.len() >= MAX_HANDSHAKE_BUFFER {
                        return Err(TlsError::HandshakeTooLarge);
                    }
                    incoming.resize((incoming.len() * 2).min(MAX_HANDSHAKE_BUFFER), 0);
                }
                let n = read_some(tcp, &mut incoming[used..]).await?;
                if n == 0 {
                    return Err(TlsError::ClosedInHandshake);
                }
                used += n;
            }
            Step::Done => {
                if !outgoing.is_empty() {
                    write_all(tcp, &outgoing).await?;
                }
                incoming.truncate(used);
                return Ok(Done { leftover: incoming, early, peer_closed });
            }
        }
    }
}

/// After a handshake error rustls has queued its alert: send it, best effort, so the peer learns
/// why (a bad certificate, an unexpected identity).
async fn flush_alert<S: Side>(tcp: &TcpStream, conn: &mut S, incoming: &mut [u8]) -> Result<(), TlsError> {
    let mut outgoing = Vec::new();
    if let Ok(ConnectionState::EncodeTlsData(mut e)) = conn.process(incoming).state {
        encode(&mut outgoing, |buf| e.encode(buf))?;
    }
    if !outgoing.is_empty() {
        tokio::time::timeout(std::time::Duration::from_secs(1), write_all(tcp, &outgoing))
            .await
            .map_err(|_| TlsError::Io(io::ErrorKind::TimedOut.into()))??;
    }
    Ok(())
}

fn encode(
    out: &mut Vec<u8>,
    mut f: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>,
) -> Result<(), TlsError> {
    let start = out.len();
    let mut room = 4096;
    loop {
        out.resize(start + room, 0);
        match f(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(e)) if e.required_size <= MAX_HANDSHAKE_BUFFER => {
                room = e.required_size;
            }
            Err(_) => {
                out.truncate(start);
                return Err(TlsError::HandshakeTooLarge);
            }
        }
    }
}

async fn read_some(tcp: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        tcp.readable().await?;
        match tcp.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// Writes all of `buf` to `tcp`.
pub async fn write_all(tcp: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        tcp.writable().await?;
        match tcp.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
