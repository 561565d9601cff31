//! The accept loop shared by every listener: stops (and closes the socket) when a drain starts.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};

use crate::drain::Drain;
use crate::limits::{FdBudget, Listener};

/// Accepts until a drain starts, spawning `handle` for each connection as a tracked task;
/// `open` counts the connections being handled. Each accepted socket takes a descriptor from
/// `fds` for as long as it is handled; when the budget is exhausted the socket is closed at
/// once (shed, counted), so the data plane never runs the process into EMFILE.
pub async fn accept_loop<F, Fut>(
    name: Listener,
    listener: TcpListener,
    drain: Drain,
    open: Arc<AtomicUsize>,
    fds: FdBudget,
    handle: F,
) where
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let handle = Arc::new(handle);
    let local = listener.local_addr().ok();
    loop {
        tokio::select! {
            biased;
            _ = drain.started() => break,
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let Some(permit) = fds.try_acquire(1) else {
                        // Closing sends the client a prompt FIN instead of a hang.
                        drop(stream);
                        fds.metrics().shed(name, &fds, peer);
                        continue;
                    };
                    let h = handle.clone();
                    let guard = OpenGuard::new(open.clone());
                    drain.spawn(async move {
                        h(stream, peer).await;
                        drop((guard, permit));
                    });
                }
                Err(e) => {
                    // EMFILE and friends (descriptors outside the budget ran out): back off
                    // briefly instead of spinning.
                    tracing::warn!(listener = ?name, error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
    drop(listener);
    tracing::info!(listener = ?name, addr = ?local, "listener closed for drain");
}

struct OpenGuard(Arc<AtomicUsize>);

impl OpenGuard {
    fn new(n: Arc<AtomicUsize>) -> OpenGuard {
        n.fetch_add(1, Ordering::Relaxed);
        OpenGuard(n)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ports a connection must never be forwarded to (they would loop back into the proxy).
pub fn is_illegal_port(port: u16) -> bool {
    matches!(port, 15001 | 15006 | 15008)
}
