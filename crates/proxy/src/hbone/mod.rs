//! HBONE: HTTP/2 CONNECT over mutual TLS, port 15008.

pub mod conn;
pub mod frame;
pub mod hpack;
pub mod pool;
pub mod server;
pub mod tls;

use std::time::Duration;

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

#[cfg(test)]
mod server_tests;
#[cfg(test)]
mod tests;
