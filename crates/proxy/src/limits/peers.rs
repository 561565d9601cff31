//! What one peer of the HBONE listeners may hold, across every pod the process serves: open
//! connections (counted from the TCP accept, so TLS handshakes count too), open CONNECT streams,
//! and the HTTP/2 receive window granted to it, which is the most it can make the proxy buffer.
//!
//! A peer is a source address. The identity is known only after the TLS handshake, and one
//! identity is shared by every replica of a service account, so a cap per identity would cap a
//! whole Deployment; a pod has one or two addresses.
//!
//! The byte budget works on HTTP/2 flow control. The proxy releases a DATA frame's capacity only
//! once its bytes are written to the app, so a connection never holds more than its connection
//! window of received-but-unwritten bytes. Every connection of a peer gets the protocol's minimum
//! window (65 535 bytes, reserved for each of the peer's allowed connections) plus an extra share
//! taken from what the peer's budget has left: half of it, up to the configured window. Windows
//! offered to a peer therefore shrink as it nears its budget, and the sum of its windows, and so
//! of what it can make the proxy hold, never exceeds the budget. A connection returns its share
//! when it closes, and takes more when a stream opens and the budget has room again.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use ambit_hbone::Windows;
use serde::Serialize;

use super::{LimitMetrics, RefusalReason};
use crate::config::Config;

/// The HTTP/2 connection window every connection has before any WINDOW_UPDATE (RFC 9113 §6.9.2).
pub const MIN_WINDOW: u32 = 65_535;
/// Smallest extra share worth a WINDOW_UPDATE when a connection grows.
const MIN_GROWTH: u64 = 64 * 1024;

/// The per-peer caps.
#[derive(Clone, Copy, Debug)]
pub struct PeerLimits {
    /// Open HBONE connections per peer (all pods).
    pub max_connections: u32,
    /// Open CONNECT streams per peer (all connections).
    pub max_streams: u32,
    /// Receive window the peer's connections may hold in total (bytes).
    pub buffer_bytes: u64,
    /// Configured stream window (`HTTP2_STREAM_WINDOW_SIZE`).
    pub stream_window: u32,
    /// Configured connection window (`HTTP2_CONNECTION_WINDOW_SIZE`).
    pub connection_window: u32,
}

impl PeerLimits {
    /// The caps from the configuration. The budget must hold the minimum window of every allowed
    /// connection, so `max_connections` is at most `buffer_bytes / 65 535`.
    pub fn from_config(cfg: &Config) -> PeerLimits {
        let fit = u32::try_from(cfg.hbone_peer_buffer_bytes / u64::from(MIN_WINDOW)).unwrap_or(u32::MAX);
        PeerLimits {
            max_connections: cfg.hbone_max_connections_per_peer.min(fit).max(1),
            max_streams: cfg.hbone_max_streams_per_peer.max(1),
            buffer_bytes: cfg.hbone_peer_buffer_bytes.max(u64::from(MIN_WINDOW)),
            stream_window: cfg.window_size,
            connection_window: cfg.connection_window_size.max(MIN_WINDOW),
        }
    }

    /// The part of the budget shared out above the minimum windows.
    fn extra_budget(&self) -> u64 {
        self.buffer_bytes.saturating_sub(u64::from(self.max_connections) * u64::from(MIN_WINDOW))
    }
}

/// A peer over one of its caps.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    /// Too many connections.
    #[error(
        "peer {ip} already holds {max} HBONE connections (AMBIT_HBONE_MAX_CONNECTIONS_PER_PEER): connection closed"
    )]
    Connections {
        /// The peer.
        ip: IpAddr,
        /// The cap.
        max: u32,
    },
    /// Too many streams.
    #[error(
        "peer {ip} already holds {max} CONNECT streams (AMBIT_HBONE_MAX_STREAMS_PER_PEER): stream refused (REFUSED_STREAM)"
    )]
    Streams {
        /// The peer.
        ip: IpAddr,
        /// The cap.
        max: u32,
    },
}

impl Refusal {
    /// The metric label.
    pub fn reason(&self) -> RefusalReason {
        match self {
            Refusal::Connections { .. } => RefusalReason::peer_connections,
            Refusal::Streams { .. } => RefusalReason::peer_streams,
        }
    }
}

/// Every peer with an open inbound HBONE connection (cheap to clone).
#[derive(Clone)]
pub struct Peers(Arc<Inner>);

struct Inner {
    limits: Option<PeerLimits>,
    /// Windows when unlimited.
    windows: Windows,
    map: Mutex<HashMap<IpAddr, Arc<Peer>>>,
    metrics: LimitMetrics,
}

struct Peer {
    ip: IpAddr,
    /// Changed only under the map lock, so an entry is removed exactly when it is unused.
    connections: AtomicU32,
    streams: AtomicU32,
    /// Extra window still to share out.
    extra: AtomicU64,
}

/// One open connection of a peer (released on drop, with its window share).
pub struct PeerConn {
    peers: Peers,
    peer: Option<Arc<Peer>>,
    /// This connection's share above the minimum window.
    extra: u64,
}

/// One open stream of a peer (released on drop).
pub struct StreamSlot {
    peers: Peers,
    peer: Option<Arc<Peer>>,
}

/// The peers' figures, for `/config_dump`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeersDump {
    /// Source addresses with open connections.
    pub peers: usize,
    /// Windows granted to them, in bytes.
    pub window_bytes: i64,
    /// Per-peer connection cap in effect (after fitting the budget).
    pub max_connections_per_peer: Option<u32>,
}

impl Peers {
    /// Peers held to `limits`.
    pub fn new(limits: PeerLimits, metrics: LimitMetrics) -> Peers {
        let windows = Windows { stream: limits.stream_window, connection: limits.connection_window };
        Peers(Arc::new(Inner { limits: Some(limits), windows, map: Mutex::default(), metrics }))
    }

    /// Peers without caps that get the configured windows.
    #[cfg(test)]
    pub fn unlimited(stream_window: u32, connection_window: u32) -> Peers {
        let windows = Windows { stream: stream_window, connection: connection_window.max(MIN_WINDOW) };
        Peers(Arc::new(Inner {
            limits: None,
            windows,
            map: Mutex::default(),
            metrics: LimitMetrics::default(),
        }))
    }

    /// Counts a new connection from `ip`, or refuses it when the peer is at its cap.
    pub fn connect(&self, ip: IpAddr) -> Result<PeerConn, Refusal> {
        let Some(limits) = self.0.limits else {
            return Ok(PeerConn { peers: self.clone(), peer: None, extra: 0 });
        };
        let mut map = self.lock();
        let peer = map
            .entry(ip)
            .or_insert_with(|| {
                Arc::new(Peer {
                    ip,
                    connections: AtomicU32::new(0),
                    streams: AtomicU32::new(0),
                    extra: AtomicU64::new(limits.extra_budget()),
                })
            })
            .clone();
        if peer.connections.load(Ordering::Relaxed) >= limits.max_connections {
            return Err(Refusal::Connections { ip, max: limits.max_connections });
        }
        peer.connections.fetch_add(1, Ordering::Relaxed);
        self.0.metrics.peers.set(i64::try_from(map.len()).unwrap_or(i64::MAX));
        drop(map);
        self.0.metrics.peer_windows.inc_by(i64::from(MIN_WINDOW));
        Ok(PeerConn { peers: self.clone(), peer: Some(peer), extra: 0 })
    }

    /// The peers' figures.
    pub fn dump(&self) -> PeersDump {
        PeersDump {
            peers: self.lock().len(),
            window_bytes: self.0.metrics.peer_windows.get(),
            max_connections_per_peer: self.0.limits.map(|l| l.max_connections),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, Arc<Peer>>> {
        self.0.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets `peer` if nothing of it is open any more (called under no lock).
    fn forget_if_unused(&self, peer: &Arc<Peer>) {
        let mut map = self.lock();
        self.forget_locked(&mut map, peer);
    }

    fn forget_locked(&self, map: &mut HashMap<IpAddr, Arc<Peer>>, peer: &Arc<Peer>) {
        if peer.connections.load(Ordering::Relaxed) == 0
            && peer.streams.load(Ordering::Acquire) == 0
            && map.get(&peer.ip).is_some_and(|p| Arc::ptr_eq(p, peer))
        {
            map.remove(&peer.ip);
            self.0.metrics.peers.set(i64::try_from(map.len()).unwrap_or(i64::MAX));
        }
    }
}

impl PeerConn {
    /// The windows for this connection's HTTP/2 handshake: the minimum plus half of what the
    /// peer's budget has left, up to the configured windows. Call once, before the handshake.
    pub fn windows(&mut self) -> Windows {
        let (Some(peer), Some(limits)) = (&self.peer, self.peers.0.limits) else {
            return self.peers.0.windows;
        };
        let want = u64::from(limits.connection_window - MIN_WINDOW);
        self.extra = take_half(&peer.extra, want);
        self.peers.0.metrics.peer_windows.inc_by(i64::try_from(self.extra).unwrap_or(i64::MAX));
        self.current()
    }

    /// Takes more of the peer's budget when this connection's window is below the configured
    /// one and the budget has room again; returns the new windows to apply.
    pub fn grow(&mut self) -> Option<Windows> {
        let (Some(peer), Some(limits)) = (&self.peer, self.peers.0.limits) else {
            return None;
        };
        let want = u64::from(limits.connection_window - MIN_WINDOW).saturating_sub(self.extra);
        if want < MIN_GROWTH || peer.extra.load(Ordering::Relaxed) / 2 < MIN_GROWTH {
            return None;
        }
        let more = take_half(&peer.extra, want);
        if more == 0 {
            return None;
        }
        self.extra += more;
        self.peers.0.metrics.peer_windows.inc_by(i64::try_from(more).unwrap_or(i64::MAX));
        Some(self.current())
    }

    /// Counts a new CONNECT stream of this peer, or refuses it when the peer is at its cap.
    pub fn open_stream(&self) -> Result<StreamSlot, Refusal> {
        let (Some(peer), Some(limits)) = (&self.peer, self.peers.0.limits) else {
            return Ok(StreamSlot { peers: self.peers.clone(), peer: None });
        };
        let counted = peer
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limits.max_streams).then_some(n + 1));
        match counted {
            Ok(_) => Ok(StreamSlot { peers: self.peers.clone(), peer: Some(peer.clone()) }),
            Err(_) => Err(Refusal::Streams { ip: peer.ip, max: limits.max_streams }),
        }
    }

    fn current(&self) -> Windows {
        let connection = MIN_WINDOW.saturating_add(u32::try_from(self.extra).unwrap_or(u32::MAX));
        let stream = self.peers.0.limits.map_or(self.peers.0.windows.stream, |l| l.stream_window);
        Windows { stream: stream.min(connection), connection }
    }
}

/// The HBONE server's view of a peer connection: a stream over the peer's cap is refused, and
/// the refusal counted and logged.
impl ambit_hbone::PeerBudget for PeerConn {
    type Slot = StreamSlot;

    fn windows(&mut self) -> Windows {
        PeerConn::windows(self)
    }

    fn grow(&mut self) -> Option<Windows> {
        PeerConn::grow(self)
    }

    fn open_stream(&mut self) -> Option<StreamSlot> {
        match PeerConn::open_stream(self) {
            Ok(slot) => Some(slot),
            Err(refusal) => {
                self.peers.0.metrics.refused(&refusal, None);
                None
            }
        }
    }
}

impl Drop for PeerConn {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else { return };
        peer.extra.fetch_add(self.extra, Ordering::AcqRel);
        let granted = u64::from(MIN_WINDOW) + self.extra;
        self.peers.0.metrics.peer_windows.dec_by(i64::try_from(granted).unwrap_or(i64::MAX));
        let mut map = self.peers.lock();
        peer.connections.fetch_sub(1, Ordering::Relaxed);
        self.peers.forget_locked(&mut map, &peer);
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else { return };
        if peer.streams.fetch_sub(1, Ordering::AcqRel) == 1 && peer.connections.load(Ordering::Relaxed) == 0 {
            self.peers.forget_if_unused(&peer);
        }
    }
}

/// Takes half of `pool` (at most `want`); returns what was taken.
fn take_half(pool: &AtomicU64, want: u64) -> u64 {
    let mut taken = 0;
    let _ = pool.fetch_update(Ordering::AcqRel, Ordering::Acquire, |avail| {
        taken = (avail / 2).min(want);
        Some(avail - taken)
    });
    taken
}
