//! A fake node agent: the ZDS server side, driven by blocking calls from a test.
//!
//! It accepts node-proxy connections continuously (as the real agent does across proxy
//! restarts), sends every new connection the full snapshot of its pod table followed by
//! `SnapshotSent`, routes new Adds to the most recent connection and broadcasts Dels to all,
//! and records every ack it gets back.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ambit_zds::{Ack, WorkloadInfo, ZdsListener, ZdsServerConn};
use tokio::sync::{mpsc, oneshot};

use super::netns::NETNS_DIR;
use super::wait_for;

/// How often an idle connection is polled for EOF (the proxy reconnecting after a NACK).
const IDLE_POLL: Duration = Duration::from_millis(50);

/// The ZDS server of one node, on its own Tokio runtime; stops (closing every connection) when
/// dropped.
pub struct FakeAgent {
    path: PathBuf,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// One ack received from a proxy.
#[derive(Clone, Debug)]
pub struct AckRecord {
    /// Connection number (1 = the first connection the agent accepted).
    pub conn: usize,
    /// What the ack answered, e.g. `add uid-a`, `snapshot_sent`, `raw`.
    pub what: String,
    /// `Err` holds the NACK text (or the transport error when no ack arrived).
    pub result: Result<(), String>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<String, PodEntry>,
    /// Live connections, oldest first: (connection number, command queue).
    conns: Vec<(usize, mpsc::UnboundedSender<Command>)>,
    accepted: usize,
    snapshots_done: usize,
    acks: Vec<AckRecord>,
}

#[derive(Clone)]
struct PodEntry {
    info: WorkloadInfo,
    netns: PathBuf,
}

enum Command {
    Add { uid: String, pod: PodEntry, reply: oneshot::Sender<Result<(), String>> },
    Del { uid: String, reply: oneshot::Sender<Result<(), String>> },
    Raw { bytes: Vec<u8>, fd: Option<OwnedFd>, reply: oneshot::Sender<Result<(), String>> },
}

impl FakeAgent {
    /// Binds the ZDS socket at `path` and starts accepting; panics if it cannot.
    pub fn start(path: &Path) -> FakeAgent {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-agent")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot build the fake agent's runtime: {e}"));
        let listener = {
            let _guard = runtime.enter();
            ZdsListener::bind(path)
                .unwrap_or_else(|e| panic!("fake agent cannot bind {}: {e}", path.display()))
        };
        let shared = Arc::new(Shared::default());
        runtime.spawn(accept_loop(listener, Arc::clone(&shared)));
        FakeAgent { path: path.to_owned(), shared, runtime: Some(runtime) }
    }

    /// The socket path (the proxy's `INPOD_UDS`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records the pod and sends `AddWorkload` (with the fd of `/var/run/netns/<netns>`) to the
    /// most recent connection; returns the ack (`Err` = NACK text or "no proxy connection").
    pub fn add_pod(&self, uid: &str, info: WorkloadInfo, netns: &str) -> Result<(), String> {
        self.add_pod_at(uid, info, &Path::new(NETNS_DIR).join(netns))
    }

    /// [`FakeAgent::add_pod`] with the namespace at any path (e.g. `/proc/self/ns/net`, the
    /// test's own namespace).
    pub fn add_pod_at(&self, uid: &str, info: WorkloadInfo, netns: &Path) -> Result<(), String> {
        let pod = PodEntry { info, netns: netns.to_owned() };
        let (reply, rx) = oneshot::channel();
        let sent = {
            let mut state = self.shared.lock();
            state.pods.insert(uid.to_owned(), pod.clone());
            let cmd = Command::Add { uid: uid.to_owned(), pod, reply };
            send_newest(&state, cmd)
        };
        if !sent {
            return Err("no ztunnel connection".into());
        }
        wait_reply(rx)
    }

    /// Forgets the pod and sends `DelWorkload` to every live connection; errors are joined.
    pub fn del_pod(&self, uid: &str) -> Result<(), String> {
        let receivers: Vec<_> = {
            let mut state = self.shared.lock();
            state.pods.remove(uid);
            state
                .conns
                .iter()
                .filter_map(|(_, tx)| {
                    let (reply, rx) = oneshot::channel();
                    tx.send(Command::Del { uid: uid.to_owned(), reply }).ok().map(|()| rx)
                })
                .collect()
        };
        let errors: Vec<String> = receivers.into_iter().filter_map(|rx| wait_reply(rx).err()).collect();
        if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
    }

    /// Sends `bytes` (with `fd` as SCM_RIGHTS, if any) as one record on the most recent
    /// connection and returns the ack that follows; for bad-input tests.
    pub fn send_raw(&self, bytes: &[u8], fd: Option<OwnedFd>) -> Result<(), String> {
        let (reply, rx) = oneshot::channel();
        let sent = send_newest(&self.shared.lock(), Command::Raw { bytes: bytes.to_vec(), fd, reply });
        if !sent {
            return Err("no ztunnel connection".into());
        }
        wait_reply(rx)
    }

    /// Every ack received so far, in order.
    pub fn acks(&self) -> Vec<AckRecord> {
        self.shared.lock().acks.clone()
    }

    /// Connections whose snapshot (up to and including SnapshotSent) completed, ever.
    pub fn connections(&self) -> usize {
        self.shared.lock().snapshots_done
    }

    /// Connections currently open.
    pub fn live_connections(&self) -> usize {
        self.shared.lock().conns.len()
    }

    /// Waits until `n` connections in total have received their full snapshot.
    pub fn wait_connections(&self, n: usize, timeout: Duration) -> bool {
        wait_for(|| self.connections() >= n, timeout)
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, conn: usize, what: String, result: Result<(), String>) {
        self.lock().acks.push(AckRecord { conn, what, result });
    }
}

/// Queues `cmd` on the newest live connection (falling back to older ones, as the real agent).
fn send_newest(state: &State, mut cmd: Command) -> bool {
    for (_, tx) in state.conns.iter().rev() {
        match tx.send(cmd) {
            Ok(()) => return true,
            Err(mpsc::error::SendError(back)) => cmd = back,
        }
    }
    false
}

/// Blocks until the connection task answers (its socket calls time out after 5 s each).
fn wait_reply(rx: oneshot::Receiver<Result<(), String>>) -> Result<(), String> {
    rx.blocking_recv().unwrap_or_else(|_| Err("the ZDS connection closed before the proxy acked".into()))
}

async fn accept_loop(listener: ZdsListener, shared: Arc<Shared>) {
    loop {
        let conn = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("fake agent: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        // Register and copy the snapshot under one lock: an Add racing with the accept is
        // either in the snapshot or queued behind it.
        let (id, snapshot) = {
            let mut state = shared.lock();
            state.accepted += 1;
            let id = state.accepted;
            state.conns.push((id, tx));
            (id, state.pods.clone())
        };
        tokio::spawn(serve(Arc::clone(&shared), id, conn, snapshot, rx));
    }
}

async fn serve(
    shared: Arc<Shared>,
    id: usize,
    mut conn: ZdsServerConn,
    snapshot: BTreeMap<String, PodEntry>,
    mut rx: mpsc::UnboundedReceiver<Command>,
) {
    if let Err(e) = conn.recv_hello().await {
        eprintln!("fake agent: connection {id}: no hello: {e}");
        return close(&shared, id);
    }
    for (uid, pod) in &snapshot {
        let result = match add(&mut conn, uid, pod).await {
            Ok(result) => result,
            Err(e) => {
                eprintln!("fake agent: connection {id}: snapshot add {uid} failed: {e}");
                return close(&shared, id);
            }
        };
        shared.record(id, format!("add {uid}"), result);
    }
    match conn.snapshot_sent().await {
        Ok(ack) => {
            shared.record(id, "snapshot_sent".into(), ack.into_result());
            shared.lock().snapshots_done += 1;
        }
        Err(e) => {
            eprintln!("fake agent: connection {id}: SnapshotSent failed: {e}");
            return close(&shared, id);
        }
    }
    loop {
        tokio::select! {
            cmd = rx.recv() => {
                let Some(cmd) = cmd else { break };
                let (what, outcome, reply) = match cmd {
                    Command::Add { uid, pod, reply } => (format!("add {uid}"), add(&mut conn, &uid, &pod).await, reply),
                    Command::Del { uid, reply } => (format!("del {uid}"), conn.del(&uid).await.map(Ack::into_result).map_err(|e| e.to_string()), reply),
                    Command::Raw { bytes, fd, reply } => {
                        let fds: Vec<_> = fd.iter().map(AsFd::as_fd).collect();
                        let outcome = match conn.send_raw(&bytes, &fds).await {
                            Ok(()) => conn.recv_ack().await.map(Ack::into_result).map_err(|e| e.to_string()),
                            Err(e) => Err(e.to_string()),
                        };
                        ("raw".to_owned(), outcome, reply)
                    }
                };
                let failed = outcome.is_err();
                let result = outcome.unwrap_or_else(|e| Err(format!("transport error: {e}")));
                shared.record(id, what, result.clone());
                let _ = reply.send(result);
                if failed {
                    break;
                }
            }
            idle = conn.check_idle(IDLE_POLL) => match idle {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    eprintln!("fake agent: connection {id}: {e}");
                    break;
                }
            },
        }
    }
    close(&shared, id);
}

async fn add(conn: &mut ZdsServerConn, uid: &str, pod: &PodEntry) -> Result<Result<(), String>, String> {
    let fd = match ambit_netns::Netns::open(&pod.netns) {
        Ok(fd) => fd,
        // Not the proxy's fault and not a transport error: report it without closing.
        Err(e) => return Ok(Err(format!("fake agent: {e}"))),
    };
    conn.add(uid, &pod.info, fd.as_fd()).await.map(Ack::into_result).map_err(|e| e.to_string())
}

fn close(shared: &Shared, id: usize) {
    shared.lock().conns.retain(|(n, _)| *n != id);
}

/// A file descriptor of a regular file, for "fd that is not a netns" tests.
pub fn regular_file_fd(path: &Path) -> OwnedFd {
    let file = File::create(path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    OwnedFd::from(file)
}
