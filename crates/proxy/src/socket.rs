//! Socket plumbing: listeners, marks, original destination, transparent (spoofed-source) dials.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};

use ambit_netns::Netns;

/// Options applied to every socket the proxy creates or accepts, and the network namespace
/// the sockets are created in (a pod's, in shared mode).
#[derive(Clone, Debug, Default)]
pub struct SocketOptions {
    /// Create sockets in this namespace instead of the current one.
    pub netns: Option<Arc<Netns>>,
    /// `SO_MARK` on proxy sockets (`PACKET_MARK`), so capture rules let them through.
    pub mark: Option<u32>,
    /// TCP keepalive settings; `None` disables keepalive.
    pub keepalive: Option<Keepalive>,
    /// Also set `TCP_USER_TIMEOUT` = time + retries × interval.
    pub user_timeout: bool,
}

/// TCP keepalive probe timing.
#[derive(Clone, Copy, Debug)]
pub struct Keepalive {
    /// Idle time before the first probe.
    pub time: Duration,
    /// Interval between probes.
    pub interval: Duration,
    /// Probes before the connection is dropped.
    pub retries: u32,
}

/// Why a listener could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("failed to bind to address {addr}: {source}")]
pub struct BindError {
    /// The address that could not be bound.
    pub addr: SocketAddr,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

impl SocketOptions {
    /// Applies `SO_MARK` to a socket, if configured.
    pub fn mark(&self, sock: SockRef<'_>) -> io::Result<()> {
        match self.mark {
            Some(m) => sock.set_mark(m),
            None => Ok(()),
        }
    }

    /// Applies per-connection options (nodelay, keepalive, user timeout) to a connected socket.
    pub fn tune(&self, stream: &TcpStream) -> io::Result<()> {
        self.tune_raw(SockRef::from(stream))
    }

    /// [`SocketOptions::tune`] on any TCP socket. On a listener, Linux copies these options to
    /// every accepted socket, which then needs no setsockopt of its own.
    fn tune_raw(&self, sock: SockRef<'_>) -> io::Result<()> {
        sock.set_tcp_nodelay(true)?;
        if let Some(ka) = self.keepalive {
            let params =
                TcpKeepalive::new().with_time(ka.time).with_interval(ka.interval).with_retries(ka.retries);
            sock.set_tcp_keepalive(&params)?;
            if self.user_timeout {
                sock.set_tcp_user_timeout(Some(ka.time + ka.interval * ka.retries))?;
            }
        }
        Ok(())
    }

    /// Creates a non-blocking, close-on-exec socket (both set by `socket(2)` itself), in the
    /// configured namespace if any, marked.
    pub fn socket(&self, domain: Domain, ty: Type, protocol: Protocol) -> io::Result<Socket> {
        let ty = ty.nonblocking();
        let sock = match &self.netns {
            Some(ns) => ns.run(|| Socket::new(domain, ty, Some(protocol)))??,
            None => Socket::new(domain, ty, Some(protocol))?,
        };
        self.mark(SockRef::from(&sock))?;
        Ok(sock)
    }

    /// Binds a UDP socket (in the namespace, marked), optionally with `SO_REUSEPORT`.
    pub fn bind_udp(&self, addr: SocketAddr, reuse_port: bool) -> io::Result<UdpSocket> {
        let sock = self.socket(Domain::for_address(addr), Type::DGRAM, Protocol::UDP)?;
        if addr.is_ipv6() {
            sock.set_only_v6(true)?;
        }
        sock.set_reuse_address(true)?;
        if reuse_port {
            sock.set_reuse_port(true)?;
        }
        sock.bind(&addr.into())?;
        UdpSocket::from_std(sock.into())
    }

    /// Binds a listener with `SO_REUSEADDR`, optionally `SO_REUSEPORT`, the mark and the
    /// per-connection options of [`SocketOptions::tune`], which accepted sockets inherit.
    ///
    /// A `[::]` address is bound dual-stack.
    pub fn listen(&self, addr: SocketAddr, reuse_port: bool) -> Result<TcpListener, BindError> {
        let bind = || -> io::Result<TcpListener> {
            let sock = self.socket(Domain::for_address(addr), Type::STREAM, Protocol::TCP)?;
            self.tune_raw(SockRef::from(&sock))?;
            if addr.is_ipv6() {
                sock.set_only_v6(false)?;
            }
            sock.set_reuse_address(true)?;
            if reuse_port {
                sock.set_reuse_port(true)?;
            }
            sock.bind(&addr.into())?;
            sock.listen(1024)?;
            TcpListener::from_std(sock.into())
        };
        bind().map_err(|source| BindError { addr, source })
    }

    /// Dials `dst`, marked, optionally from a spoofed source address (`IP_TRANSPARENT`).
    pub async fn connect(&self, dst: SocketAddr, src: Option<IpAddr>) -> io::Result<TcpStream> {
        let raw = self.socket(Domain::for_address(dst), Type::STREAM, Protocol::TCP)?;
        let sock = TcpSocket::from_std_stream(raw.into());
        if let Some(src) = src {
            let src = canonical_ip(src);
            if src.is_ipv4() == dst.is_ipv4() {
                let s = SockRef::from(&sock);
                // IP_TRANSPARENT alone lets the socket bind a non-local address (the kernel's
                // nonlocal-bind check accepts transparent or freebind), so IP_FREEBIND would
                // only be another setsockopt per connection.
                if dst.is_ipv4() {
                    s.set_ip_transparent_v4(true)?;
                } else {
                    s.set_ip_transparent_v6(true)?;
                }
                sock.bind(SocketAddr::new(src, 0))?;
            }
        }
        let stream = sock.connect(dst).await?;
        self.tune(&stream)?;
        Ok(stream)
    }
}

/// Reads the pre-redirect destination of a captured connection (`SO_ORIGINAL_DST`), falling
/// back to the local address (TPROXY, or no redirect). Returns it with the local address
/// (canonical), which callers would otherwise ask the kernel for again.
pub fn original_dst(stream: &TcpStream) -> io::Result<(SocketAddr, SocketAddr)> {
    let sock = SockRef::from(stream);
    let local = stream.local_addr()?;
    let orig = if local.is_ipv4() || is_v4_mapped(local.ip()) {
        sock.original_dst_v4()
    } else {
        sock.original_dst_v6()
    };
    let addr = match orig.ok().and_then(|a| a.as_socket()) {
        Some(a) => a,
        None => local,
    };
    Ok((canonical(addr), canonical(local)))
}

/// How many of an app's first bytes [`ready_bytes`] takes: one HBONE record's payload.
pub const EARLY_MAX: usize = 16 * 1024 - 9;

/// The bytes the app has already sent on a connection, up to [`EARLY_MAX`], taken without
/// waiting: none when it has not spoken yet (a protocol whose server speaks first, or a client
/// still on its way) or has closed. Read with `MSG_DONTWAIT` on the socket itself, as tokio's
/// readiness of a socket just accepted is not known yet.
pub fn ready_bytes(stream: &TcpStream) -> io::Result<Vec<u8>> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.resize(EARLY_MAX, 0);
        let fd = std::os::fd::AsFd::as_fd(stream);
        match nix::sys::socket::recv(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            buf,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(n) => Ok(buf[..n].to_vec()),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    })
}

/// Whether the proxy can spoof source addresses here (`IP_TRANSPARENT` needs CAP_NET_ADMIN).
pub fn transparent_available() -> bool {
    Socket::new(Domain::IPV4, Type::STREAM, None).and_then(|s| s.set_ip_transparent_v4(true)).is_ok()
}

/// Unmaps v4-mapped IPv6 addresses, so `::ffff:10.0.0.1` and `10.0.0.1` compare equal. An IPv6
/// address keeps its scope id: a link-local destination cannot be dialed without it (EINVAL).
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => SocketAddr::V6(v6),
        },
        v4 @ SocketAddr::V4(_) => v4,
    }
}

/// See [`canonical`].
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn is_v4_mapped(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())
}

/// The unspecified address to bind "all interfaces" with, per IPv6 setting.
pub fn unspecified(ipv6: bool) -> IpAddr {
    if ipv6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) }
}

/// Whether an address is a loopback address (after unmapping).
pub fn is_loopback(ip: IpAddr) -> bool {
    canonical_ip(ip).is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::SocketAddrV6;

    #[test]
    fn canonical_unmaps_v4_and_keeps_the_ipv6_scope() {
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:80".parse().expect("addr");
        assert_eq!(canonical(mapped), "10.0.0.1:80".parse::<SocketAddr>().expect("addr"));
        let link_local = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().expect("ip"), 8080, 0, 7));
        assert_eq!(canonical(link_local), link_local);
        assert_eq!(canonical(link_local).to_string(), "[fe80::1%7]:8080");
    }

    /// Accepted sockets get nodelay, keepalive and the user timeout from the listener (Linux
    /// copies them on accept), so the accept path sets none of them itself.
    #[tokio::test]
    async fn accepted_sockets_inherit_the_listener_options() {
        let ka = Keepalive { time: Duration::from_secs(42), interval: Duration::from_secs(7), retries: 3 };
        let opts = SocketOptions { keepalive: Some(ka), user_timeout: true, ..Default::default() };
        let listener = opts.listen("127.0.0.1:0".parse().expect("addr"), false).expect("listen");
        let addr = listener.local_addr().expect("addr");
        let _client = TcpStream::connect(addr).await.expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        let sock = SockRef::from(&accepted);
        assert!(sock.tcp_nodelay().expect("nodelay"), "TCP_NODELAY not inherited");
        assert!(sock.keepalive().expect("keepalive"), "SO_KEEPALIVE not inherited");
        assert_eq!(sock.tcp_keepalive_time().expect("idle"), ka.time);
        assert_eq!(sock.tcp_keepalive_interval().expect("interval"), ka.interval);
        assert_eq!(sock.tcp_keepalive_retries().expect("retries"), ka.retries);
        assert_eq!(sock.tcp_user_timeout().expect("user timeout"), Some(ka.time + ka.interval * ka.retries));
    }
}
