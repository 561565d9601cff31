//! The node agent's ZDS server: hands pods' network namespaces to node proxies.
//!
//! Each proxy connection gets a snapshot (Add with the netns fd for every pod whose namespace
//! the agent holds, Keep for the others), then SnapshotSent, then Add/Del as pods change. New
//! pods go to the newest connection (the proxy that is taking over during an upgrade), deletes
//! go to every connection (a draining proxy must drop the pod too). Requests on one connection
//! are strictly sequential: each waits for its ack.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_netns::Netns;
use ambit_zds::{Ack, RecvError, WorkloadInfo, ZdsListener, ZdsServerConn};
use tokio::sync::{mpsc, oneshot};

/// One pod as the proxy must know it.
#[derive(Clone, Debug)]
pub struct PodEntry {
    /// Pod UID.
    pub uid: String,
    /// Name, namespace, service account.
    pub info: WorkloadInfo,
    /// The pod's network namespace, when the agent holds it.
    pub netns: Option<Arc<Netns>>,
}

/// Produces the current snapshot for a new connection.
pub type Snapshot = Arc<dyn Fn() -> Vec<PodEntry> + Send + Sync>;

/// Why a pod could not be handed to a proxy.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    /// No proxy is connected.
    #[error("no node proxy is connected to {0}; is `ambit proxy` running on this node?")]
    NoProxy(String),
    /// The proxy refused the pod.
    #[error("the node proxy refused pod {uid}: {reason}")]
    Nack {
        /// Pod UID.
        uid: String,
        /// The proxy's reason (several proxies' reasons joined with `; ` for a delete).
        reason: String,
    },
    /// The connection failed while the request was outstanding.
    #[error("the node proxy connection failed: {0}")]
    Connection(#[source] RecvError),
    /// The connection closed before the request was answered.
    #[error("the node proxy connection closed before it answered")]
    Closed,
}

/// The ZDS server.
pub struct ZdsServer {
    path: String,
    conns: Mutex<Vec<Conn>>,
    next_id: AtomicU64,
}

struct Conn {
    id: u64,
    ops: mpsc::Sender<Op>,
}

/// The proxy's answer, or why the connection failed before it came.
type Reply = oneshot::Sender<Result<Ack, RecvError>>;

enum Op {
    Add(PodEntry, Reply),
    Del(String, Reply),
}

const IDLE_CHECK: Duration = Duration::from_secs(5);

impl ZdsServer {
    /// A server with no connections yet.
    pub fn new(path: &Path) -> Arc<ZdsServer> {
        Arc::new(ZdsServer {
            path: path.display().to_string(),
            conns: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        })
    }

    /// Accepts proxy connections forever, serving each on its own task.
    pub async fn run(self: Arc<Self>, listener: ZdsListener, snapshot: Snapshot) {
        loop {
            match listener.accept().await {
                Ok(conn) => {
                    let server = self.clone();
                    let snapshot = snapshot.clone();
                    tokio::spawn(async move { server.serve(conn, snapshot).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a ZDS connection failed");
                    // Upstream limits accepts to 5/s: a misbehaving client cannot spin us.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Number of live proxy connections.
    pub fn connected(&self) -> usize {
        self.lock().len()
    }

    /// Hands a pod to the newest proxy connection and waits for its ack.
    pub async fn add(&self, pod: PodEntry) -> Result<(), ZdsError> {
        let uid = pod.uid.clone();
        let ops = self.lock().last().map(|c| c.ops.clone());
        let Some(ops) = ops else { return Err(ZdsError::NoProxy(self.path.clone())) };
        let (tx, rx) = oneshot::channel();
        if ops.send(Op::Add(pod, tx)).await.is_err() {
            return Err(ZdsError::Closed);
        }
        match rx.await {
            Ok(Ok(Ack::Ok)) => Ok(()),
            Ok(Ok(Ack::Nack { reason })) => Err(ZdsError::Nack { uid, reason }),
            Ok(Err(e)) => Err(ZdsError::Connection(e)),
            Err(_) => Err(ZdsError::Closed),
        }
    }

    /// Tells every proxy connection (concurrently) the pod is gone; succeeds trivially with none.
    pub async fn del(&self, uid: &str) -> Result<(), ZdsError> {
        let all: Vec<mpsc::Sender<Op>> = self.lock().iter().map(|c| c.ops.clone()).collect();
        let acks = all.into_iter().map(|ops| async move {
            let (tx, rx) = oneshot::channel();
            if ops.send(Op::Del(uid.to_owned(), tx)).await.is_err() {
                return None; // that connection is gone; nothing to tell it
            }
            match rx.await {
                Ok(Ok(Ack::Nack { reason })) => Some(reason),
                // A connection that fails now is gone: its proxy no longer serves the pod.
                Ok(Ok(Ack::Ok)) | Ok(Err(_)) | Err(_) => None,
            }
        });
        let errors: Vec<String> = futures::future::join_all(acks).await.into_iter().flatten().collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ZdsError::Nack { uid: uid.to_owned(), reason: errors.join("; ") })
        }
    }

    async fn serve(self: Arc<Self>, mut conn: ZdsServerConn, snapshot: Snapshot) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = conn.recv_hello().await {
            tracing::warn!(error = %e, "node proxy connected but sent no valid hello; closing");
            return;
        }
        // Register before the snapshot so that no add is lost in between: adds queue up and
        // run after SnapshotSent.
        let (tx, mut rx) = mpsc::channel(100);
        self.lock().push(Conn { id, ops: tx });
        let result = async {
            let pods = snapshot();
            let count = pods.len();
            for pod in pods {
                let ack = match &pod.netns {
                    Some(fd) => conn.add(&pod.uid, &pod.info, fd.as_fd()).await?,
                    None => conn.keep(&pod.uid).await?,
                };
                if let Ack::Nack { reason } = ack {
                    tracing::warn!(uid = %pod.uid, %reason, "node proxy refused a pod of the snapshot");
                }
            }
            if let Ack::Nack { reason } = conn.snapshot_sent().await? {
                tracing::warn!(%reason, "node proxy refused SnapshotSent");
            }
            tracing::info!(pods = count, "node proxy connected and has the snapshot");
            loop {
                let op = tokio::select! {
                    op = rx.recv() => op,
                    _ = tokio::time::sleep(IDLE_CHECK) => {
                        if !conn.check_idle(Duration::from_millis(10)).await? {
                            return Ok(());
                        }
                        continue;
                    }
                };
                let Some(op) = op else { return Ok(()) };
                match op {
                    Op::Add(pod, reply) => {
                        let ack = match &pod.netns {
                            Some(fd) => conn.add(&pod.uid, &pod.info, fd.as_fd()).await,
                            None => conn.keep(&pod.uid).await,
                        };
                        let failed = ack.is_err();
                        let _ = reply.send(ack);
                        if failed {
                            // Acks are matched by order: after a failure the stream is unreliable.
                            return Ok::<(), RecvError>(());
                        }
                    }
                    Op::Del(uid, reply) => {
                        let ack = conn.del(&uid).await;
                        let failed = ack.is_err();
                        let _ = reply.send(ack);
                        if failed {
                            return Ok(());
                        }
                    }
                }
            }
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "node proxy connection failed");
        }
        self.lock().retain(|c| c.id != id);
        tracing::info!("node proxy disconnected");
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests;
