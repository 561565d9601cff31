//! A half-close-aware TCP echo server that records the peer address of every connection.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Echo server running on a background thread; stops accepting when dropped.
pub struct EchoServer {
    port: u16,
    ip4: Ipv4Addr,
    ip6: Ipv6Addr,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl EchoServer {
    /// Serves on `listener` (already bound in the pod); `ip4`/`ip6` are the pod's addresses.
    pub fn start(listener: TcpListener, ip4: Ipv4Addr, ip6: Ipv6Addr) -> EchoServer {
        let port = listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("echo listener has no local address: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("cannot make echo listener non-blocking: {e}"));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let peers = Arc::clone(&peers);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || accept_loop(&listener, &peers, &stop))
        };
        EchoServer { port, ip4, ip6, peers, stop, acceptor: Some(acceptor) }
    }

    /// Peer addresses of the accepted connections, in accept order (v4-mapped addresses are
    /// returned as plain IPv4).
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Peer IPs of the accepted connections.
    pub fn peer_ips(&self) -> Vec<IpAddr> {
        self.peers().iter().map(SocketAddr::ip).collect()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pod's IPv4 address with the echo port.
    pub fn addr4(&self) -> SocketAddr {
        SocketAddr::new(self.ip4.into(), self.port)
    }

    /// The pod's IPv6 address with the echo port.
    pub fn addr6(&self) -> SocketAddr {
        SocketAddr::new(self.ip6.into(), self.port)
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Writes `data`, half-closes, and reads the reply until EOF (10 s read timeout).
pub fn echo_roundtrip(stream: &mut TcpStream, data: &[u8]) -> io::Result<Vec<u8>> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(data)?;
    stream.shutdown(Shutdown::Write)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    Ok(reply)
}

fn accept_loop(listener: &TcpListener, peers: &Mutex<Vec<SocketAddr>>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
                peers.lock().unwrap_or_else(PoisonError::into_inner).push(peer);
                std::thread::spawn(move || {
                    let _ = echo(stream);
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn echo(mut stream: TcpStream) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    // Bounded so an abandoned connection cannot keep the thread forever.
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return stream.shutdown(Shutdown::Write);
        }
        stream.write_all(&buf[..n])?;
    }
}
