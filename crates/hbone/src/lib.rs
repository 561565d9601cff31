//! HBONE: HTTP/2 CONNECT over mutual TLS 1.3 (port 15008), as ztunnel and Istio's waypoints
//! speak it, on Ambit's own TLS record layer and HTTP/2 engine (ARCHITECTURE.md, "The HBONE
//! byte path", says why they are our own and how they are held to rustls's and h2's rules).
//!
//! The face: the TLS handshake ([`accept`], [`connect`]), the server side of a connection
//! ([`serve`], with phase deadlines, a per-peer budget and a drain), the client side through the
//! [`Pool`], and the [`StreamHandle`] both hand out, which relays a tunnel to an app socket or,
//! as a [`StreamIo`], carries a protocol spoken over the tunnel itself (the waypoint's HTTP).
//! Everything else (records, frames, header blocks, the protocol machine) is private; tests and
//! benches reach helpers through the `testing` feature, the fuzz targets through `fuzzing`.

mod conn;
pub mod drain;
mod frame;
mod hpack;
mod lowat;
mod pool;
mod server;
mod tls;

use std::io;
use std::time::Duration;

pub use conn::{ConnError, ConnErrorKind, RelayCounters, StreamError, StreamHandle, StreamIo};
pub use drain::Drain;
pub use frame::Reason;
pub use hpack::{Decoded, HeaderError};
pub use pool::{Dialed, Dialer, Pool, PoolKey, Tunnel, TunnelError};
pub use server::{ConnectRequest, Ended, PeerBudget, ServeError, ServerConfig, Shutdown, Windows, serve};
pub use tls::{Established, TlsError, accept, connect};

/// HTTP/2 settings of the tunnel (ztunnel's defaults, configurable).
#[derive(Clone, Copy, Debug)]
pub struct H2Settings {
    /// Initial stream window.
    pub window_size: u32,
    /// Initial connection window.
    pub connection_window_size: u32,
    /// Max frame size.
    pub frame_size: u32,
    /// Client: streams per pooled connection.
    pub max_streams: u32,
}

/// First keepalive PING this long after the connection starts, and again after each PONG.
pub const PING_INTERVAL: Duration = Duration::from_secs(10);
/// No PONG within this long drops the connection.
pub const PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Port of the HBONE listener.
pub const HBONE_PORT: u16 = 15008;

/// The kind of error a relay reports when the other side is gone (the stream was reset or its
/// connection ended): the app's connection is then reset rather than finished.
pub const GONE: io::ErrorKind = io::ErrorKind::ConnectionAborted;

/// Errors that mean "the peer went away", not a failure of the relay.
pub fn is_benign(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotConnected
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
    )
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;

/// Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, never on in a normal build).
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    pub use crate::conn::fuzzing::plaintext;
    pub use crate::hpack::Encoder;
    pub use crate::tls::fuzzing::records;

    /// The frame writers, for the seed corpora.
    pub mod frame {
        pub use crate::frame::*;
    }
}
