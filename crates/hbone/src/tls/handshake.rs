//! The handshake: rustls (unbuffered API) runs it on the socket, then hands over its traffic
//! secrets and key schedule to the record layer.
//!
//! rustls is given the peer's records one at a time, and only until the handshake is done: a
//! record the peer sent right behind its Finished (application data, a KeyUpdate, close_notify)
//! stays in our buffer for the record layer. Had rustls processed it, it would have changed its
//! keys (a KeyUpdate) or taken its bytes, and the hand-over would lose what rustls still owed
//! (the KeyUpdate it answers with) or took.

use std::io;
use std::sync::Arc;

use rustls::client::UnbufferedClientConnection;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ExtractedSecrets, client::ClientConnectionData, server::ServerConnectionData};
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use super::{
    Aead, Alert, Established, HEADER_LEN, KEY_UPDATE_AFTER, Kernel, MAX_CONTENT, MAX_RECORD, Opener, Sealer,
    Session, TYPE_APPLICATION_DATA, TlsError,
};

/// Handshake buffers: a whole handshake message (certificate chains) may need to sit in the
/// incoming buffer while rustls joins its fragments.
pub(super) const MAX_HANDSHAKE_BUFFER: usize = 128 * 1024;

/// One side of an unbuffered rustls connection.
trait Side {
    type Data;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
}

impl Side for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
}

impl Side for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
}

/// Runs the client side of the handshake on `tcp`.
pub async fn connect(
    tcp: &TcpStream,
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
) -> Result<Established, TlsError> {
    let mut conn = UnbufferedClientConnection::new(config, name)?;
    let leftover = drive(tcp, &mut conn).await?;
    let peer_certificates = conn.peer_certificates().map(<[_]>::to_vec).unwrap_or_default();
    let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
    established(secrets, Kernel::Client(kernel), leftover, peer_certificates)
}

/// Runs the server side of the handshake on `tcp`.
pub async fn accept(tcp: &TcpStream, config: Arc<rustls::ServerConfig>) -> Result<Established, TlsError> {
    let mut conn = UnbufferedServerConnection::new(config)?;
    let leftover = drive(tcp, &mut conn).await?;
    let peer_certificates = conn.peer_certificates().map(<[_]>::to_vec).unwrap_or_default();
    let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
    established(secrets, Kernel::Server(kernel), leftover, peer_certificates)
}

fn established(
    secrets: ExtractedSecrets,
    kernel: Kernel,
    leftover: Vec<u8>,
    peer_certificates: Vec<CertificateDer<'static>>,
) -> Result<Established, TlsError> {
    let (tx_seq, tx) = secrets.tx;
    let (rx_seq, rx) = secrets.rx;
    Ok(Established {
        session: Session::new(Opener { aead: Aead::new(&rx)?, seq: rx_seq }),
        sealer: Sealer {
            aead: Aead::new(&tx)?,
            seq: tx_seq,
            update_after: KEY_UPDATE_AFTER,
            update_owed: false,
            kernel,
        },
        leftover,
        peer_certificates,
    })
}

enum Step {
    Again,
    Read,
    Write,
    Done,
}

/// What the peer's next record during the handshake is.
enum NextRecord {
    /// Not all here yet.
    Partial,
    /// Whole, ending here.
    Whole(usize),
    /// A plaintext record over 2^14 bytes (RFC 8446 §5.1: record_overflow).
    Overflow,
    /// A header rustls refuses on sight (its record limit): everything there is goes to it.
    Refused,
}

/// The record that starts at `at` in `buf`.
fn next_record(buf: &[u8], at: usize) -> NextRecord {
    let Some(h) = buf.get(at..at + HEADER_LEN) else { return NextRecord::Partial };
    let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
    if len >= RUSTLS_MAX_PAYLOAD {
        return NextRecord::Refused;
    }
    if h[0] != TYPE_APPLICATION_DATA && len > MAX_CONTENT {
        // rustls would take it (up to its own limit); RFC 8446 does not.
        return NextRecord::Overflow;
    }
    let end = at + HEADER_LEN + len;
    if end <= buf.len() { NextRecord::Whole(end) } else { NextRecord::Partial }
}

/// The largest record payload rustls reads before it refuses the header (2^14 + 2048).
const RUSTLS_MAX_PAYLOAD: usize = 16 * 1024 + 2048;
/// A record_overflow alert in the clear, for a ClientHello too large to answer.
const PLAIN_RECORD_OVERFLOW: [u8; 7] = [21, 3, 3, 0, 2, 2, 22];

/// Drives the handshake until rustls may send application data; returns the bytes read past
/// the records rustls was given.
async fn drive<S: Side>(tcp: &TcpStream, conn: &mut S) -> Result<Vec<u8>, TlsError> {
    let mut incoming = vec![0u8; MAX_RECORD];
    let mut used = 0usize;
    // rustls sees `incoming[..fed]`: whole records, one more each time it needs more (and the
    // header of the next one as soon as it is in, so that a bad header is refused at once);
    // `next` is where the first record it has not seen whole starts.
    let mut fed = 0usize;
    let mut next = 0usize;
    let mut outgoing: Vec<u8> = Vec::new();
    let mut wrote = false;
    loop {
        let UnbufferedStatus { discard, state } = conn.process(&mut incoming[..fed]);
        let step = match state {
            Err(e) => {
                let _ = flush_alert(tcp, conn, &mut incoming[..fed]).await;
                return Err(e.into());
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
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                return Err(TlsError::ClosedInHandshake);
            }
            // Application data inside the handshake: early data, which HBONE never enables.
            Ok(_) => return Err(TlsError::Unsupported("application data before the handshake finished")),
        };
        incoming.copy_within(discard..used, 0);
        used -= discard;
        fed -= discard;
        next = next.saturating_sub(discard);
        match step {
            Step::Again => {}
            Step::Write => {
                write_all(tcp, &outgoing).await?;
                outgoing.clear();
                wrote = true;
            }
            Step::Read => loop {
                match next_record(&incoming[..used], next) {
                    NextRecord::Whole(end) => {
                        fed = end;
                        next = end;
                        break;
                    }
                    NextRecord::Refused => {
                        fed = used;
                        break;
                    }
                    NextRecord::Overflow => {
                        if !wrote {
                            // Nothing of ours went out yet: the alert goes in the clear.
                            let _ = write_all(tcp, &PLAIN_RECORD_OVERFLOW).await;
                        }
                        return Err(TlsError::Peer {
                            alert: Alert::RECORD_OVERFLOW,
                            what: "handshake record over 2^14 bytes",
                        });
                    }
                    NextRecord::Partial => {
                        if used >= next + HEADER_LEN && fed < next + HEADER_LEN {
                            fed = next + HEADER_LEN;
                            break;
                        }
                    }
                }
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
            },
            Step::Done => {
                if !outgoing.is_empty() {
                    write_all(tcp, &outgoing).await?;
                }
                incoming.truncate(used);
                incoming.drain(..fed);
                return Ok(incoming);
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
