//! "Enter, create, leave": sockets created inside a network namespace from the test process.

use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockProtocol, SockType, SockaddrIn, SockaddrIn6, SockaddrStorage, bind, connect,
    setsockopt, socket, sockopt,
};

use super::CONNECT_TIMEOUT;
use super::netns::NETNS_DIR;

/// Runs `f` on a fresh thread that has entered namespace `netns` ("enter, create, leave": the
/// thread ends afterwards, sockets created in it stay in that namespace). Panics propagate.
pub fn run_in<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = Path::new(NETNS_DIR).join(netns);
    let file =
        File::open(&path).unwrap_or_else(|e| panic!("cannot open network namespace {}: {e}", path.display()));
    std::thread::scope(|scope| {
        let thread = scope.spawn(move || {
            setns(&file, CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns into {} failed: {e}", path.display()));
            f()
        });
        match thread.join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Binds a TCP listener inside namespace `netns`.
pub fn listen_tcp_in(netns: &str, addr: SocketAddr) -> io::Result<TcpListener> {
    run_in(netns, || TcpListener::bind(addr))
}

/// Connects from inside namespace `netns` (5 s timeout), setting `SO_MARK` first if given.
pub fn connect_tcp_in(netns: &str, addr: SocketAddr, mark: Option<u32>) -> io::Result<TcpStream> {
    run_in(netns, || match mark {
        None => TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT),
        Some(mark) => connect_with(addr, mark, None),
    })
}

/// The pre-NAT destination of a redirected connection (`SO_ORIGINAL_DST` /
/// `IP6T_SO_ORIGINAL_DST`).
pub fn original_dst(stream: &TcpStream) -> io::Result<SocketAddr> {
    match stream.local_addr()? {
        SocketAddr::V4(_) => {
            let raw = nix::sys::socket::getsockopt(stream, sockopt::OriginalDst)?;
            Ok(SocketAddr::from(SockaddrIn::from(raw)))
        }
        SocketAddr::V6(local) => {
            if local.ip().to_ipv4_mapped().is_some() {
                // A v4 connection accepted on a dual-stack socket still has v4 conntrack state.
                let raw = nix::sys::socket::getsockopt(stream, sockopt::OriginalDst)?;
                return Ok(SocketAddr::from(SockaddrIn::from(raw)));
            }
            let raw = nix::sys::socket::getsockopt(stream, sockopt::Ip6tOriginalDst)?;
            Ok(SocketAddr::from(SockaddrIn6::from(raw)))
        }
    }
}

/// Connects with `SO_MARK` set; with `source`, first binds it with `IP_TRANSPARENT` (which lets
/// a proxy use another host's address as its source, as in-pod inbound proxying does).
pub(super) fn connect_with(addr: SocketAddr, mark: u32, source: Option<IpAddr>) -> io::Result<TcpStream> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, SockProtocol::Tcp)?;
    setsockopt(&fd, sockopt::Mark, &mark)?;
    if let Some(source) = source {
        // IP_TRANSPARENT sets the inet socket flag shared by both families.
        setsockopt(&fd, sockopt::IpTransparent, &true)?;
        bind(fd.as_raw_fd(), &storage(SocketAddr::new(source, 0)))?;
    }
    // A blocking connect honours SO_SNDTIMEO; cleared again once connected.
    let timeout = nix::sys::time::TimeVal::new(i64::try_from(CONNECT_TIMEOUT.as_secs()).unwrap_or(5), 0);
    setsockopt(&fd, sockopt::SendTimeout, &timeout)?;
    connect(fd.as_raw_fd(), &storage(addr))?;
    let stream = TcpStream::from(fd);
    stream.set_write_timeout(None)?;
    Ok(stream)
}

fn storage(addr: SocketAddr) -> SockaddrStorage {
    match addr {
        SocketAddr::V4(v4) => SockaddrStorage::from(v4),
        SocketAddr::V6(v6) => SockaddrStorage::from(v6),
    }
}
