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
//! the stream, user_canceled is tolerated a few times, the rest are fatal) and the post-handshake
//! messages NewSessionTicket (a server's, passed to rustls) and KeyUpdate (keys rotated through
//! rustls; an update the peer asks for is owed once, sent before our next record).
//!
//! It holds the peer to what rustls holds it to, and answers a violation with the alert RFC 8446
//! names: records over 2^14 + 256 bytes or 2^14 bytes of content (record_overflow), records that
//! fail to decrypt (bad_record_mac), content types or handshake messages that have no place after
//! the handshake, a handshake message interleaved with other records, and more than
//! [`MAX_KEY_UPDATES`] KeyUpdates without application data, [`MAX_EMPTY_RECORDS`] empty records in
//! a row or [`MAX_WARNING_ALERTS`] user_canceled alerts (unexpected_message), malformed alerts and
//! messages (decode_error, illegal_parameter). rustls's own limits are the reference (its
//! `TemperCounters` and `ALLOWED_CONSECUTIVE_EMPTY_FRAGMENTS_MAX`).

use std::fmt;
use std::io;
use std::ops::Range;

use aws_lc_rs::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;
use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls_pki_types::CertificateDer;

mod handshake;

#[cfg(any(test, feature = "testing"))]
pub use handshake::write_all;
pub use handshake::{accept, connect};

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
/// A key is replaced (KeyUpdate) after this many records, far below AES-GCM's confidentiality
/// limit for TLS 1.3 (2^24.5 records, RFC 8446 §5.5).
pub const KEY_UPDATE_AFTER: u64 = 1 << 23;
/// KeyUpdate messages the peer may send without application data in between (rustls and
/// BoringSSL: 32).
pub const MAX_KEY_UPDATES: u8 = 32;
/// Records without content the peer may send in a row (rustls: 32).
pub const MAX_EMPTY_RECORDS: u8 = 32;
/// user_canceled warning alerts the peer may send on one connection (rustls and BoringSSL: 4).
pub const MAX_WARNING_ALERTS: u8 = 4;
/// The largest post-handshake message a server takes from its peer (a NewSessionTicket; rustls's
/// handshake message limit).
const MAX_POST_HANDSHAKE: usize = 0xffff;

const TYPE_CHANGE_CIPHER_SPEC: u8 = 20;
const TYPE_ALERT: u8 = 21;
const TYPE_HANDSHAKE: u8 = 22;
const TYPE_APPLICATION_DATA: u8 = 23;
const LEGACY_VERSION: [u8; 2] = [0x03, 0x03];
const HS_NEW_SESSION_TICKET: u8 = 4;
const HS_KEY_UPDATE: u8 = 24;
const LEVEL_WARNING: u8 = 1;
const LEVEL_FATAL: u8 = 2;

/// A TLS alert description (RFC 8446 §6).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Alert(pub u8);

impl Alert {
    /// close_notify.
    pub const CLOSE_NOTIFY: Alert = Alert(0);
    /// unexpected_message.
    pub const UNEXPECTED_MESSAGE: Alert = Alert(10);
    /// bad_record_mac.
    pub const BAD_RECORD_MAC: Alert = Alert(20);
    /// record_overflow.
    pub const RECORD_OVERFLOW: Alert = Alert(22);
    /// illegal_parameter.
    pub const ILLEGAL_PARAMETER: Alert = Alert(47);
    /// decode_error.
    pub const DECODE_ERROR: Alert = Alert(50);
    /// user_canceled.
    pub const USER_CANCELED: Alert = Alert(90);

    fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "close_notify",
            10 => "unexpected_message",
            20 => "bad_record_mac",
            22 => "record_overflow",
            40 => "handshake_failure",
            42 => "bad_certificate",
            45 => "certificate_expired",
            46 => "certificate_unknown",
            47 => "illegal_parameter",
            48 => "unknown_ca",
            50 => "decode_error",
            51 => "decrypt_error",
            70 => "protocol_version",
            80 => "internal_error",
            90 => "user_canceled",
            109 => "missing_extension",
            116 => "certificate_required",
            120 => "no_application_protocol",
            _ => return None,
        })
    }
}

impl fmt::Display for Alert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "alert {}", self.0),
        }
    }
}

impl fmt::Debug for Alert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

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
    #[error("TLS handshake message larger than {} bytes", handshake::MAX_HANDSHAKE_BUFFER)]
    HandshakeTooLarge,
    /// The handshake settled on something this record layer does not protect.
    #[error("unsupported TLS session: {0}")]
    Unsupported(&'static str),
    /// The peer broke the record protocol: the connection ends with `alert`.
    #[error("TLS protocol violation: {what} (alert {alert})")]
    Peer {
        /// The alert we send.
        alert: Alert,
        /// What the peer did.
        what: &'static str,
    },
    /// The peer sent a fatal alert.
    #[error("received fatal TLS alert {0}")]
    Alert(Alert),
}

impl TlsError {
    /// As an I/O error (for the relays' error paths).
    pub fn into_io(self) -> io::Error {
        match self {
            TlsError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }

    /// The alert that tells the peer why, when we end the connection because of it.
    pub fn alert(&self) -> Option<Alert> {
        match self {
            TlsError::Peer { alert, .. } => Some(*alert),
            _ => None,
        }
    }
}

fn peer(alert: Alert, what: &'static str) -> TlsError {
    TlsError::Peer { alert, what }
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
    /// The peer asked for a key update: one KeyUpdate is owed before our next record.
    update_owed: bool,
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
            return Err(TlsError::Unsupported("a record to seal out of bounds"));
        }
        let body = total - HEADER_LEN;
        let [hi, lo] = u16::try_from(body)
            .map_err(|_| TlsError::Unsupported("a record to seal out of bounds"))?
            .to_be_bytes();
        let header = [TYPE_APPLICATION_DATA, LEGACY_VERSION[0], LEGACY_VERSION[1], hi, lo];
        rec[..HEADER_LEN].copy_from_slice(&header);
        rec[total - TAG_LEN - 1] = typ;
        let nonce = self.aead.nonce(self.seq);
        let (inner, tag) = rec[HEADER_LEN..].split_at_mut(body - TAG_LEN);
        let t = self
            .aead
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), inner)
            .map_err(|_| TlsError::Unsupported("sealing failed"))?;
        tag.copy_from_slice(t.as_ref());
        self.seq += 1;
        Ok(())
    }

    /// Appends one record of `typ` holding `content` to `out`.
    fn seal_into(&mut self, out: &mut Vec<u8>, typ: u8, content: &[u8]) -> Result<(), TlsError> {
        let start = out.len();
        out.resize(start + OVERHEAD + content.len(), 0);
        out[start + HEADER_LEN..start + HEADER_LEN + content.len()].copy_from_slice(content);
        let r = self.seal_typed(&mut out[start..], typ);
        if r.is_err() {
            out.truncate(start);
        }
        r
    }

    /// Seals a KeyUpdate (update_not_requested) with the current key into `out`, then moves to
    /// the next key. The record must be sent before anything sealed after it. Pays an owed
    /// update.
    pub fn key_update(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        self.seal_into(out, TYPE_HANDSHAKE, &[HS_KEY_UPDATE, 0, 0, 1, 0])?;
        let (seq, secrets) = self.kernel.update(true)?;
        self.aead = Aead::new(&secrets)?;
        self.seq = seq;
        self.update_owed = false;
        Ok(())
    }

    /// Seals a close_notify alert into `out`.
    pub fn close_notify(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        self.seal_into(out, TYPE_ALERT, &[LEVEL_WARNING, Alert::CLOSE_NOTIFY.0])
    }

    /// Seals a fatal alert into `out`.
    pub fn fatal_alert(&mut self, out: &mut Vec<u8>, alert: Alert) -> Result<(), TlsError> {
        self.seal_into(out, TYPE_ALERT, &[LEVEL_FATAL, alert.0])
    }

    /// Whether a KeyUpdate must go out before the next record: the peer asked for one, or this
    /// key has sealed enough records to be replaced (see [`Sealer::key_update`]).
    pub fn wants_key_update(&self) -> bool {
        self.update_owed || self.seq >= self.update_after
    }

    /// Whether the peer's request for a key update is still to be answered.
    pub fn key_update_owed(&self) -> bool {
        self.update_owed
    }

    /// Records sealed with the current key.
    pub fn sequence(&self) -> u64 {
        self.seq
    }

    /// A sealer with a fixed key that a key update keeps, for the fuzz targets.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn for_fuzzing() -> Sealer {
        Sealer {
            aead: fuzzing::aead(),
            seq: 0,
            update_after: KEY_UPDATE_AFTER,
            update_owed: false,
            kernel: Kernel::None,
        }
    }

    /// Replaces the key after `records` records instead of [`KEY_UPDATE_AFTER`] (tests, so a
    /// key update happens within a short transfer).
    pub fn set_key_update_after(&mut self, records: u64) {
        self.update_after = records;
    }

    /// Seals one record of any inner content type holding `content` into `out`: for tests that
    /// play a peer breaking the protocol.
    #[cfg(any(test, feature = "testing"))]
    pub fn seal_raw(&mut self, out: &mut Vec<u8>, typ: u8, content: &[u8]) -> Result<(), TlsError> {
        self.seal_into(out, typ, content)
    }

    /// Seals one record whose TLSInnerPlaintext is `content`, `typ` and `padding` zero bytes,
    /// with no bound checked: for tests that play a peer breaking the protocol.
    #[cfg(any(test, feature = "testing", feature = "fuzzing"))]
    pub fn seal_padded(&mut self, out: &mut Vec<u8>, typ: u8, content: &[u8], padding: usize) {
        let body = content.len() + 1 + padding + TAG_LEN;
        let [hi, lo] = u16::try_from(body).unwrap_or(u16::MAX).to_be_bytes();
        let header = [TYPE_APPLICATION_DATA, LEGACY_VERSION[0], LEGACY_VERSION[1], hi, lo];
        let start = out.len();
        out.extend_from_slice(&header);
        out.extend_from_slice(content);
        out.push(typ);
        out.resize(out.len() + padding, 0);
        let nonce = self.aead.nonce(self.seq);
        let tag = self.aead.key.seal_in_place_separate_tag(
            nonce,
            Aad::from(header),
            &mut out[start + HEADER_LEN..],
        );
        if let Ok(tag) = tag {
            out.extend_from_slice(tag.as_ref());
        }
        self.seq += 1;
    }

    /// Seals a KeyUpdate asking the peer to update too (update_requested), then moves to the next
    /// key: for tests that play a peer.
    #[cfg(any(test, feature = "testing"))]
    pub fn request_key_update(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        self.seal_into(out, TYPE_HANDSHAKE, &[HS_KEY_UPDATE, 0, 0, 1, 1])?;
        let (seq, secrets) = self.kernel.update(true)?;
        self.aead = Aead::new(&secrets)?;
        self.seq = seq;
        Ok(())
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
    /// close_notify: no more data will come.
    CloseNotify,
    /// A user_canceled warning, which TLS 1.3 lets pass.
    UserCanceled,
}

impl Opener {
    /// Opens the whole record `rec` (as [`record_len`] measured it) in place.
    pub fn open(&mut self, rec: &mut [u8]) -> Result<Content, TlsError> {
        if rec.len() < HEADER_LEN + TAG_LEN + 1 {
            // Too short to hold a tag and a content type: it cannot decrypt.
            return Err(peer(Alert::BAD_RECORD_MAC, "record shorter than its tag"));
        }
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&rec[..HEADER_LEN]);
        let nonce = self.aead.nonce(self.seq);
        let plain_len = {
            let plain = self
                .aead
                .key
                .open_in_place(nonce, Aad::from(header), &mut rec[HEADER_LEN..])
                .map_err(|_| peer(Alert::BAD_RECORD_MAC, "record failed to decrypt"))?;
            plain.len()
        };
        self.seq += 1;
        if plain_len > MAX_CONTENT + 1 {
            // TLSInnerPlaintext, padding included, is at most 2^14 + 1 bytes (RFC 8446 §5.4).
            return Err(peer(Alert::RECORD_OVERFLOW, "record plaintext over 2^14 + 1 bytes"));
        }
        // TLSInnerPlaintext: content, type, zero padding (RFC 8446 §5.4).
        let inner = &rec[HEADER_LEN..HEADER_LEN + plain_len];
        let Some(end) = inner.iter().rposition(|&b| b != 0) else {
            return Err(peer(Alert::UNEXPECTED_MESSAGE, "record without a content type"));
        };
        if end > MAX_CONTENT {
            return Err(peer(Alert::RECORD_OVERFLOW, "record content over 2^14 bytes"));
        }
        let content = HEADER_LEN..HEADER_LEN + end;
        match inner[end] {
            TYPE_APPLICATION_DATA => Ok(Content::Data(content)),
            TYPE_HANDSHAKE if content.is_empty() => {
                Err(peer(Alert::UNEXPECTED_MESSAGE, "empty handshake record"))
            }
            TYPE_HANDSHAKE => Ok(Content::Handshake(content)),
            TYPE_ALERT => match rec[content] {
                [level, _] if level != LEVEL_WARNING && level != LEVEL_FATAL => {
                    Err(peer(Alert::ILLEGAL_PARAMETER, "alert of an unknown level"))
                }
                [_, 0] => Ok(Content::CloseNotify),
                [LEVEL_WARNING, 90] => Ok(Content::UserCanceled),
                [LEVEL_WARNING, _] => {
                    Err(peer(Alert::DECODE_ERROR, "warning alert other than user_canceled"))
                }
                [_, d] => Err(TlsError::Alert(Alert(d))),
                _ => Err(peer(Alert::DECODE_ERROR, "alert of the wrong length")),
            },
            _ => Err(peer(Alert::UNEXPECTED_MESSAGE, "unexpected record content type")),
        }
    }
}

/// The length of the record at the start of `buf`, once its header is there; an error for a
/// header no TLS 1.3 peer sends after the handshake (what rustls would refuse it with).
pub fn record_len(buf: &[u8]) -> Result<Option<usize>, TlsError> {
    let Some(h) = buf.get(..HEADER_LEN) else { return Ok(None) };
    if h[1] != LEGACY_VERSION[0] {
        return Err(peer(Alert::DECODE_ERROR, "record version"));
    }
    match h[0] {
        TYPE_APPLICATION_DATA => {}
        TYPE_CHANGE_CIPHER_SPEC => {
            return Err(peer(Alert::UNEXPECTED_MESSAGE, "change_cipher_spec after the handshake"));
        }
        // Not protected by the traffic key: it cannot decrypt.
        TYPE_ALERT | TYPE_HANDSHAKE => {
            return Err(peer(Alert::BAD_RECORD_MAC, "unprotected record after the handshake"));
        }
        _ => return Err(peer(Alert::DECODE_ERROR, "unknown record type")),
    }
    let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
    if len > MAX_RECORD - HEADER_LEN {
        return Err(peer(Alert::RECORD_OVERFLOW, "record over 2^14 + 256 bytes"));
    }
    Ok(Some(HEADER_LEN + len))
}

/// rustls's side of an established connection: key updates and session tickets.
enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
    /// The fuzz targets' connections, which had no handshake: no key schedule.
    #[cfg(any(test, feature = "fuzzing"))]
    None,
}

impl Kernel {
    fn update(&mut self, tx: bool) -> Result<(u64, ConnectionTrafficSecrets), TlsError> {
        Ok(match (self, tx) {
            (Kernel::Client(k), true) => k.update_tx_secret()?,
            (Kernel::Client(k), false) => k.update_rx_secret()?,
            (Kernel::Server(k), true) => k.update_tx_secret()?,
            (Kernel::Server(k), false) => k.update_rx_secret()?,
            #[cfg(any(test, feature = "fuzzing"))]
            (Kernel::None, _) => (0, fuzzing::secrets()),
        })
    }

    fn is_client(&self) -> bool {
        matches!(self, Kernel::Client(_))
    }
}

/// The receiving half of an established connection's record layer (the sending half, the
/// [`Sealer`], lives where the connection's writes are serialised), with the counters that
/// bound what a peer may send that carries nothing.
pub struct Session {
    opener: Opener,
    /// Post-handshake bytes waiting for the rest of their message.
    pending: Vec<u8>,
    /// KeyUpdates received since the last application data.
    key_updates: u8,
    /// Records without content received in a row.
    empty_records: u8,
    /// user_canceled alerts received.
    warnings: u8,
}

impl Session {
    fn new(opener: Opener) -> Session {
        Session { opener, pending: Vec::new(), key_updates: 0, empty_records: 0, warnings: 0 }
    }

    /// Opens the next record (see [`Opener::open`]) and applies the rules that span records:
    /// no other record inside a fragmented handshake message (RFC 8446 §5.1), and the limits on
    /// empty records and warnings.
    pub fn open(&mut self, rec: &mut [u8]) -> Result<Content, TlsError> {
        let content = self.opener.open(rec)?;
        if !self.pending.is_empty() && !matches!(content, Content::Handshake(_)) {
            return Err(peer(Alert::UNEXPECTED_MESSAGE, "a record inside a fragmented handshake message"));
        }
        match &content {
            Content::Data(r) if r.is_empty() => {
                self.empty_records += 1;
                if self.empty_records > MAX_EMPTY_RECORDS {
                    return Err(peer(Alert::UNEXPECTED_MESSAGE, "too many empty records in a row"));
                }
            }
            Content::Data(_) => {
                self.empty_records = 0;
                self.key_updates = 0;
            }
            Content::UserCanceled => {
                self.empty_records = 0;
                self.warnings += 1;
                if self.warnings > MAX_WARNING_ALERTS {
                    return Err(peer(Alert::UNEXPECTED_MESSAGE, "too many user_canceled alerts"));
                }
            }
            Content::Handshake(_) | Content::CloseNotify => self.empty_records = 0,
        }
        Ok(content)
    }

    /// Handles the handshake bytes of one record (see [`Content::Handshake`]): rustls's state is
    /// in the sending half. A requested key update is recorded there as owed
    /// ([`Sealer::wants_key_update`]); it is answered once, however often it was asked.
    pub fn handshake(&mut self, bytes: &[u8], sealer: &mut Sealer) -> Result<(), TlsError> {
        let client = sealer.kernel.is_client();
        let mut at = 0;
        let mut input = bytes;
        // Whole messages straight from the record; only a fragment is kept.
        if !self.pending.is_empty() {
            self.pending.extend_from_slice(bytes);
            input = &[];
        }
        loop {
            let buf: &[u8] = if self.pending.is_empty() { input } else { &self.pending };
            let Some(&[typ, a, b, c]) = buf.get(at..at + 4) else { break };
            let len = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
            // What a peer may still send after the handshake, and how large (a client's only
            // post-handshake message is KeyUpdate; a server also sends NewSessionTicket).
            match typ {
                HS_KEY_UPDATE if len != 1 => {
                    return Err(peer(Alert::DECODE_ERROR, "KeyUpdate of the wrong length"));
                }
                HS_KEY_UPDATE => {}
                HS_NEW_SESSION_TICKET if client && len <= MAX_POST_HANDSHAKE => {}
                HS_NEW_SESSION_TICKET if client => {
                    return Err(peer(Alert::DECODE_ERROR, "NewSessionTicket over 64 KiB"));
                }
                _ => return Err(peer(Alert::UNEXPECTED_MESSAGE, "unexpected post-handshake message")),
            }
            let Some(body) = buf.get(at + 4..at + 4 + len) else { break };
            match typ {
                HS_NEW_SESSION_TICKET => {
                    if let Kernel::Client(k) = &mut sealer.kernel {
                        k.handle_new_session_ticket(body)?;
                    }
                }
                _ => {
                    // A KeyUpdate ends its record: keys change at the next one (RFC 8446 §5.1).
                    if at + 4 + len != buf.len() {
                        return Err(peer(Alert::UNEXPECTED_MESSAGE, "data after a KeyUpdate in its record"));
                    }
                    self.key_updates += 1;
                    if self.key_updates > MAX_KEY_UPDATES {
                        return Err(peer(
                            Alert::UNEXPECTED_MESSAGE,
                            "too many KeyUpdates without application data",
                        ));
                    }
                    let requested = match body {
                        [0] => false,
                        [1] => true,
                        _ => return Err(peer(Alert::ILLEGAL_PARAMETER, "KeyUpdate request value")),
                    };
                    let (seq, secrets) = sealer.kernel.update(false)?;
                    self.opener = Opener { aead: Aead::new(&secrets)?, seq };
                    sealer.update_owed |= requested;
                }
            }
            at += 4 + len;
        }
        if self.pending.is_empty() {
            // Keep the fragment of a message the record did not finish.
            self.pending.extend_from_slice(&input[at..]);
        } else if at == self.pending.len() {
            // Done: a connection keeps no buffer for post-handshake messages.
            self.pending = Vec::new();
        } else {
            self.pending.drain(..at);
        }
        Ok(())
    }
}

/// A finished handshake.
pub struct Established {
    /// The receiving half and rustls's state.
    pub session: Session,
    /// The sending half.
    pub sealer: Sealer,
    /// Bytes read past the handshake: the start of the first protected record(s), which rustls
    /// never saw.
    pub leftover: Vec<u8>,
    /// The peer's certificate chain (leaf first).
    pub peer_certificates: Vec<CertificateDer<'static>>,
}

/// Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, never on in a normal build),
/// and the fixed-key sealer unit tests build connection states with.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing {
    use super::*;

    /// The fixed traffic secret of the fuzz targets' connections (both directions, every key).
    pub(super) fn secrets() -> ConnectionTrafficSecrets {
        ConnectionTrafficSecrets::Aes256Gcm {
            key: rustls::crypto::cipher::AeadKey::from([7u8; 32]),
            iv: rustls::crypto::cipher::Iv::new([1u8; NONCE_LEN]),
        }
    }

    pub(super) fn aead() -> Aead {
        match Aead::new(&secrets()) {
            Ok(a) => a,
            Err(e) => panic!("a fixed AES-256 key: {e}"),
        }
    }

    /// Seals each record `data` describes (a content type, a padding length, a 16-bit content
    /// length, the content) and opens it with a server's receiving half, as a connection's
    /// driver does: content types, alerts, padding and size limits, the limits on empty
    /// records, warnings and KeyUpdates, and post-handshake messages split over records
    /// anywhere. Stops at the first error, as a connection does.
    #[cfg(feature = "fuzzing")]
    pub fn records(data: &[u8]) {
        let mut sealer = Sealer::for_fuzzing();
        let mut peer = Sealer::for_fuzzing();
        let mut session = Session::new(Opener { aead: aead(), seq: 0 });
        let mut rest = data;
        while let &[typ, pad, hi, lo, ref tail @ ..] = rest {
            let len = usize::from(u16::from_be_bytes([hi, lo])).min(tail.len());
            let (content, next) = tail.split_at(len);
            rest = next;
            let mut rec = Vec::new();
            peer.seal_padded(&mut rec, typ, content, usize::from(pad));
            let Ok(Some(n)) = record_len(&rec) else { return };
            let Some(rec) = rec.get_mut(..n) else { return };
            match session.open(rec) {
                Ok(Content::Handshake(r)) => {
                    let bytes = rec[r].to_vec();
                    if session.handshake(&bytes, &mut sealer).is_err() {
                        return;
                    }
                    if sealer.wants_key_update() {
                        let mut out = Vec::new();
                        if sealer.key_update(&mut out).is_err() {
                            return;
                        }
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
