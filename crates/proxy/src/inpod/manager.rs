//! The per-pod proxy manager: follows the node agent over ZDS and keeps one proxy instance
//! per pod, with listeners bound inside the pod's network namespace.
//!
//! Protocol (per connection): hello, then a snapshot of Add/Keep until SnapshotSent (pods not
//! named in it are drained), then Add/Del as pods come and go; every message is acked, and an
//! Add is acked only once the pod's listeners are bound. Where ztunnel exits on a protocol
//! violation (a second SnapshotSent, Keep after the snapshot, Add without WorkloadInfo), this
//! manager never exits: a message that is bad for one pod only (no fd, an fd that is not a
//! netns, no WorkloadInfo, an empty uid) is NACKed and the stream goes on; a violation of the
//! stream itself (undecodable or truncated packets, a second SnapshotSent, Keep after the
//! snapshot) is NACKed and the proxy reconnects, and the fresh snapshot re-establishes the
//! agreed state. Either way the pods it serves keep their traffic.
//!
//! A network namespace belongs to one workload: an Add is refused when its namespace is the
//! proxy's own, the host's (pid 1's, when readable), or one already served for another pod uid
//! (two instances would bind the same ports with SO_REUSEPORT and split the pod's traffic
//! between two identities). The one exception is a snapshot that re-describes the node: there
//! a new uid takes over a namespace whose previous owner the snapshot has not named (yet), as
//! that owner will be drained at SnapshotSent anyway.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ambit_zds::{Ack, ProtocolError, RecvError, Request, WorkloadInfo, ZdsClient};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

use super::netns::{Netns, NetnsId};
use crate::drain::Drain;
use crate::inputs::Inputs;
use crate::instance::{Shared, StartError};
use crate::readiness::{Pending, Readiness};

/// Keeps one proxy instance per pod.
pub struct Manager {
    shared: Shared,
    drain: Drain,
    inner: Mutex<Inner>,
    metrics: ManagerMetrics,
    /// The host's network namespace (pid 1's), when this process can read it.
    host_netns: Option<NetnsId>,
}

/// Why an `AddWorkload` is refused; the `Display` is the NACK reason the node agent reports.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The namespace is the one this proxy process runs in.
    #[error(
        "pod {uid}: network namespace {netns} is the node proxy's own network namespace, not a pod's; \
         refusing to open pod listeners in it (is the node agent handing over the wrong namespace?)"
    )]
    OwnNetns {
        /// Pod UID.
        uid: String,
        /// The namespace.
        netns: NetnsId,
    },
    /// The namespace is the host's (pid 1's).
    #[error(
        "pod {uid}: network namespace {netns} is the host's network namespace (that of pid 1), not a \
         pod's; refusing to open pod listeners in it (is the node agent handing over the wrong namespace?)"
    )]
    HostNetns {
        /// Pod UID.
        uid: String,
        /// The namespace.
        netns: NetnsId,
    },
    /// Another pod uid is already served in this namespace.
    #[error(
        "pod {uid}: network namespace {netns} already belongs to pod {owner} ({workload}); one network \
         namespace serves one workload, so this Add is refused (if {owner} was replaced, send \
         DelWorkload {owner} first)"
    )]
    NetnsInUse {
        /// Pod UID of the refused Add.
        uid: String,
        /// The namespace.
        netns: NetnsId,
        /// The pod UID that holds it.
        owner: String,
        /// The holder's `namespace/name`.
        workload: String,
    },
    /// The proxy is out of descriptors for another pod: refused, not kept (the agent retries
    /// its ADD; the pods already served keep their share).
    #[error("pod {uid} refused: {source}")]
    Capacity {
        /// Pod UID.
        uid: String,
        /// The budget that has no room.
        #[source]
        source: crate::limits::CapacityError,
    },
    /// The pod's listeners could not be bound (the pod stays pending and is retried).
    #[error("pod {uid}: cannot start the proxy in the pod's network namespace: {source}")]
    Start {
        /// Pod UID.
        uid: String,
        /// Why.
        #[source]
        source: crate::socket::BindError,
    },
}

#[derive(Default)]
struct Inner {
    pods: HashMap<String, Pod>,
    connected: bool,
    snapshot_done: bool,
    seen: HashSet<String>,
    not_ready: Option<Pending>,
}

struct Pod {
    info: WorkloadInfo,
    netns: Arc<Netns>,
    state: PodState,
}

enum PodState {
    Up { inputs: Arc<Inputs>, drain: Drain },
    Pending { error: String },
}

#[derive(Clone, Default)]
struct ManagerMetrics {
    active: Gauge,
    pending: Gauge,
    started: Counter,
    stopped: Counter,
}

/// Where the host's namespace is read from: pid 1 in the proxy's view of `/proc`.
const PROC_ROOT: &str = "/proc";

/// A request that breaks the protocol's state machine (as opposed to a malformed packet).
#[derive(Debug, thiserror::Error)]
enum StateError {
    #[error("a second SnapshotSent on the same connection")]
    DuplicateSnapshot,
    #[error("KeepWorkload {0} after SnapshotSent")]
    KeepAfterSnapshot(String),
}

const RETRY_PENDING: Duration = Duration::from_secs(5);
const BACKOFF_START: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(15);

impl Manager {
    /// A manager with no pods; registers the `workload_manager_*` metrics.
    pub fn new(shared: Shared, drain: Drain, registry: &mut Registry) -> Arc<Manager> {
        let metrics = ManagerMetrics::default();
        let r = registry.sub_registry_with_prefix("workload_manager");
        r.register("active_proxy_count", "Pods with running proxies (unstable)", metrics.active.clone());
        r.register(
            "pending_proxy_count",
            "Pods whose proxies could not start yet (unstable)",
            metrics.pending.clone(),
        );
        r.register("proxies_started", "Pod proxies started (unstable)", metrics.started.clone());
        r.register("proxies_stopped", "Pod proxies stopped (unstable)", metrics.stopped.clone());
        let host_netns = host_netns(Path::new(PROC_ROOT));
        Arc::new(Manager { shared, drain, inner: Mutex::new(Inner::default()), metrics, host_netns })
    }

    /// Follows the node agent on `path` until the process drains: connects (with backoff),
    /// applies its requests, reconnects when the connection ends.
    pub async fn run(self: Arc<Self>, path: PathBuf, readiness: Readiness) {
        self.lock().not_ready = Some(readiness.pending("workload proxy manager"));
        let retry = self.clone();
        tokio::spawn(async move { retry.retry_pending().await });
        let mut backoff = BACKOFF_START;
        loop {
            let conn = tokio::select! {
                c = ZdsClient::connect(&path) => c,
                _ = self.drain.started() => return,
            };
            match conn {
                Ok(client) => {
                    tracing::info!(path = %path.display(), "connected to the node agent (ZDS)");
                    backoff = BACKOFF_START;
                    self.on_connect(&readiness);
                    let clean = tokio::select! {
                        c = self.serve(client) => c,
                        _ = self.drain.started() => return,
                    };
                    self.on_disconnect(&readiness);
                    if clean {
                        continue;
                    }
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, retry_in = ?backoff,
                        "cannot reach the node agent's ZDS socket; is the node agent running?");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.drain.started() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Serves one connection; returns true when it ended cleanly (EOF).
    async fn serve(&self, mut client: ZdsClient) -> bool {
        loop {
            let req = match client.recv().await {
                Ok(Some(r)) => r,
                Ok(None) => {
                    tracing::info!("node agent closed the ZDS connection");
                    return true;
                }
                // One pod's message is unusable but the stream is intact: refuse that pod only.
                Err(RecvError::Protocol(
                    e @ (ProtocolError::NotANetns { .. }
                    | ProtocolError::AddWithoutFd
                    | ProtocolError::AddWithoutWorkloadInfo { .. }
                    | ProtocolError::EmptyUid),
                )) => {
                    tracing::error!(error = %e, "refusing a pod from the node agent");
                    if let Err(e) = client.ack(Ack::nack(protocol_error(&e))).await {
                        tracing::warn!(error = %e, "cannot ack the node agent; reconnecting");
                        return false;
                    }
                    continue;
                }
                Err(RecvError::Protocol(e)) => {
                    self.protocol_violation(&mut client, protocol_error(&e)).await;
                    return false;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading from the node agent failed; reconnecting");
                    return false;
                }
            };
            let ack = match req {
                Request::Add { uid, info, netns } => match self.add(uid, info, netns) {
                    Ok(()) => Ack::Ok,
                    Err(e) => Ack::nack(e),
                },
                Request::Keep { uid } => match self.keep(&uid) {
                    Ok(()) => Ack::Ok,
                    Err(e) => {
                        self.protocol_violation(&mut client, e.to_string()).await;
                        return false;
                    }
                },
                Request::Del { uid } => {
                    self.del(&uid);
                    Ack::Ok
                }
                Request::SnapshotSent => match self.snapshot_sent() {
                    Ok(()) => Ack::Ok,
                    Err(e) => {
                        self.protocol_violation(&mut client, e.to_string()).await;
                        return false;
                    }
                },
            };
            if let Err(e) = client.ack(ack).await {
                tracing::warn!(error = %e, "cannot ack the node agent; reconnecting");
                return false;
            }
            self.update_readiness();
        }
    }

    async fn protocol_violation(&self, client: &mut ZdsClient, error: String) {
        tracing::error!(%error, "ZDS protocol violation by the node agent; NACKing and reconnecting (pods keep their proxies)");
        let _ = client.ack(Ack::nack(error)).await;
    }

    fn on_connect(&self, readiness: &Readiness) {
        let mut inner = self.lock();
        inner.connected = true;
        inner.snapshot_done = false;
        inner.seen.clear();
        if inner.not_ready.is_none() {
            inner.not_ready = Some(readiness.pending("workload proxy manager"));
        }
    }

    fn on_disconnect(&self, readiness: &Readiness) {
        let mut inner = self.lock();
        inner.connected = false;
        if inner.not_ready.is_none() {
            inner.not_ready = Some(readiness.pending("workload proxy manager"));
        }
    }

    fn update_readiness(&self) {
        let mut inner = self.lock();
        let pending = inner.pods.values().any(|p| matches!(p.state, PodState::Pending { .. }));
        if inner.connected && inner.snapshot_done && !pending {
            inner.not_ready = None;
        }
    }

    fn add(&self, uid: String, info: WorkloadInfo, netns: Netns) -> Result<(), AddError> {
        let id = netns.id();
        if netns.is_own() {
            let e = AddError::OwnNetns { uid, netns: id };
            tracing::error!(error = %e, "refusing a pod from the node agent");
            return Err(e);
        }
        if self.host_netns == Some(id) {
            let e = AddError::HostNetns { uid, netns: id };
            tracing::error!(error = %e, "refusing a pod from the node agent");
            return Err(e);
        }
        let mut inner = self.lock();
        let holder =
            inner.pods.iter().find(|(u, p)| **u != uid && p.netns.id() == id).map(|(u, _)| u.clone());
        if let Some(owner) = holder {
            // In a snapshot, an owner the agent has not named (yet) is stale: the snapshot is the
            // agent's whole view, and SnapshotSent drains it anyway. Replace it now, before the
            // new instance binds, so the two never share the namespace's ports.
            if !inner.snapshot_done && !inner.seen.contains(&owner) {
                tracing::info!(%uid, %owner, netns = %id,
                    "the snapshot gives a served network namespace to a new pod uid; replacing the old pod's proxy");
                if let Some(old) = inner.pods.remove(&owner) {
                    self.stop(&owner, old);
                }
            } else {
                let workload = inner
                    .pods
                    .get(&owner)
                    .map(|p| format!("{}/{}", p.info.namespace, p.info.name))
                    .unwrap_or_default();
                let e = AddError::NetnsInUse { uid, netns: id, owner, workload };
                tracing::error!(error = %e, "refusing a pod from the node agent");
                return Err(e);
            }
        }
        if !inner.snapshot_done {
            inner.seen.insert(uid.clone());
        }
        if let Some(existing) = inner.pods.get(&uid) {
            if existing.netns.id() == netns.id() {
                if let PodState::Up { .. } = existing.state {
                    return Ok(());
                }
            } else {
                tracing::info!(%uid, "pod has a new network namespace; replacing its proxy");
            }
            if let Some(old) = inner.pods.remove(&uid) {
                self.stop(&uid, old);
            }
        }
        let mut pod = Pod { info, netns: Arc::new(netns), state: PodState::Pending { error: String::new() } };
        let result = self.start(&uid, &mut pod);
        // Out of capacity: NACK without keeping the pod (the agent retries its ADD); the pods
        // already served keep their share of the budget.
        if let Err(e @ AddError::Capacity { .. }) = result {
            return Err(e);
        }
        inner.pods.insert(uid, pod);
        self.count(&inner);
        result
    }

    fn start(&self, uid: &str, pod: &mut Pod) -> Result<(), AddError> {
        let drain = self.drain.child();
        let mut sockets = self.shared.cfg.socket_options();
        sockets.netns = Some(pod.netns.clone());
        match self.shared.start(pod.info.clone(), sockets, drain.clone()) {
            Ok(inputs) => {
                // Warm the pod's certificate so its first connection does not wait for the CA.
                let state = self.shared.state.current();
                let id =
                    match state.find_local(&pod.info.namespace, &pod.info.name, &pod.info.service_account) {
                        Some(w) => inputs.identity_of(&w),
                        None => ambit_identity::Identity::new(
                            &self.shared.cfg.trust_domain,
                            &pod.info.namespace,
                            &pod.info.service_account,
                        ),
                    };
                if !id.namespace.is_empty() && !id.service_account.is_empty() {
                    self.shared.certs.prefetch(&id);
                }
                tracing::info!(%uid, workload = %format!("{}/{}", pod.info.namespace, pod.info.name),
                    netns = ?pod.netns.id(), "pod proxy started");
                self.metrics.started.inc();
                pod.state = PodState::Up { inputs, drain };
                Ok(())
            }
            Err(StartError::Capacity(source)) => {
                drain.close_now("the pod's proxy failed to start");
                self.shared.limits.metrics.pod_refused();
                let e = AddError::Capacity { uid: uid.to_owned(), source };
                tracing::warn!("{e}");
                pod.state = PodState::Pending { error: e.to_string() };
                Err(e)
            }
            Err(StartError::Bind(source)) => {
                drain.close_now("the pod's proxy failed to start");
                let e = AddError::Start { uid: uid.to_owned(), source };
                tracing::warn!("{e}; retrying every {}s", RETRY_PENDING.as_secs());
                pod.state = PodState::Pending { error: e.to_string() };
                Err(e)
            }
        }
    }

    fn stop(&self, uid: &str, pod: Pod) {
        if let PodState::Up { drain, .. } = pod.state {
            // The pod is gone (or replaced): no grace, close its listeners and connections now.
            drain.close_now("connection closed: the pod was removed from the mesh");
            self.metrics.stopped.inc();
            tracing::info!(%uid, "pod proxy stopped");
        }
    }

    fn keep(&self, uid: &str) -> Result<(), StateError> {
        let mut inner = self.lock();
        if inner.snapshot_done {
            return Err(StateError::KeepAfterSnapshot(uid.to_owned()));
        }
        inner.seen.insert(uid.to_owned());
        Ok(())
    }

    fn del(&self, uid: &str) {
        let mut inner = self.lock();
        if !inner.snapshot_done {
            inner.seen.remove(uid);
        }
        if let Some(pod) = inner.pods.remove(uid) {
            self.stop(uid, pod);
        }
        self.count(&inner);
    }

    fn snapshot_sent(&self) -> Result<(), StateError> {
        let mut inner = self.lock();
        if inner.snapshot_done {
            return Err(StateError::DuplicateSnapshot);
        }
        inner.snapshot_done = true;
        let stale: Vec<String> = inner.pods.keys().filter(|u| !inner.seen.contains(*u)).cloned().collect();
        for uid in stale {
            if let Some(pod) = inner.pods.remove(&uid) {
                tracing::info!(%uid, "pod not in the node agent's snapshot; stopping its proxy");
                self.stop(&uid, pod);
            }
        }
        self.count(&inner);
        Ok(())
    }

    async fn retry_pending(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PENDING) => {}
                _ = self.drain.started() => return,
            }
            let mut inner = self.lock();
            let uids: Vec<String> = inner
                .pods
                .iter()
                .filter(|(_, p)| matches!(p.state, PodState::Pending { .. }))
                .map(|(u, _)| u.clone())
                .collect();
            for uid in uids {
                if let Some(pod) = inner.pods.get_mut(&uid) {
                    let _ = self.start(&uid, pod);
                }
            }
            self.count(&inner);
            drop(inner);
            self.update_readiness();
        }
    }

    fn count(&self, inner: &Inner) {
        let pending = inner.pods.values().filter(|p| matches!(p.state, PodState::Pending { .. })).count();
        self.metrics.pending.set(pending as i64);
        self.metrics.active.set((inner.pods.len() - pending) as i64);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `workloadState` for `/config_dump`: uid → {state, info, netns, error?}.
    pub fn dump(&self, live: &[crate::connections::LiveConnection]) -> serde_json::Value {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct PodDump<'a> {
            state: &'static str,
            info: &'a WorkloadInfo,
            netns: NetnsId,
            #[serde(skip_serializing_if = "Option::is_none")]
            error: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            pooled_hbone_connections: Option<usize>,
            /// Connections being handled, both directions.
            #[serde(skip_serializing_if = "Option::is_none")]
            open_connections: Option<usize>,
            /// ztunnel's shape (istioctl's `WorkloadConnections`): the inbound connections to
            /// the pod; outbound ones are not tracked (the destination's proxy lists them).
            connections: Connections,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Connections {
            inbound: Vec<Conn>,
            outbound: Vec<Conn>,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Conn {
            src: String,
            original_dst: String,
            actual_dst: String,
            protocol: &'static str,
            src_identity: String,
            bytes_sent: u64,
            bytes_received: u64,
        }
        let connections = |info: &WorkloadInfo| Connections {
            inbound: live
                .iter()
                .filter(|c| c.dst_workload == format!("{}/{}", info.namespace, info.name))
                .map(|c| Conn {
                    src: c.src.clone(),
                    original_dst: c.dst.clone(),
                    actual_dst: c.dst.clone(),
                    protocol: if c.src_identity.is_empty() { "TCP" } else { "HBONE" },
                    src_identity: c.src_identity.clone(),
                    bytes_sent: c.bytes_sent,
                    bytes_received: c.bytes_received,
                })
                .collect(),
            outbound: Vec::new(),
        };
        let inner = self.lock();
        let mut map = serde_json::Map::new();
        let mut uids: Vec<&String> = inner.pods.keys().collect();
        uids.sort();
        for uid in uids {
            let Some(p) = inner.pods.get(uid) else { continue };
            let d = match &p.state {
                PodState::Up { inputs, .. } => PodDump {
                    state: "Up",
                    info: &p.info,
                    netns: p.netns.id(),
                    error: None,
                    pooled_hbone_connections: Some(inputs.pool.connections()),
                    open_connections: Some(inputs.open.load(std::sync::atomic::Ordering::Relaxed)),
                    connections: connections(&p.info),
                },
                PodState::Pending { error } => PodDump {
                    state: "Pending",
                    info: &p.info,
                    netns: p.netns.id(),
                    error: Some(error),
                    pooled_hbone_connections: None,
                    open_connections: None,
                    connections: connections(&p.info),
                },
            };
            map.insert(uid.clone(), serde_json::to_value(d).unwrap_or_default());
        }
        serde_json::Value::Object(map)
    }
}

/// The host's network namespace, or `None` when pid 1's namespace cannot be read, as in a
/// sandbox that hides pid 1's namespaces even from root; the proxy's own is refused anyway. That
/// is no fault (a node proxy without the host's pid namespace, as in its DaemonSet, or in a
/// node's namespace under `ambit up`, runs beside pods whose namespaces are never pid 1's), so it
/// is logged at info, not as a warning.
fn host_netns(proc_root: &Path) -> Option<NetnsId> {
    match ambit_netns::host_id(proc_root) {
        Ok(id) => {
            tracing::info!(netns = %id, "pods handed over in the host's network namespace (pid 1's) will be refused");
            Some(id)
        }
        Err(e) => {
            tracing::info!(path = %proc_root.join("1/ns/net").display(), error = %e,
                "cannot read the host's network namespace; only the proxy's own namespace can be refused as a pod's");
            None
        }
    }
}

fn protocol_error(e: &ProtocolError) -> String {
    if e.is_fatal() {
        format!("{e} (ztunnel would exit here; Ambit refuses this pod and keeps serving the others)")
    } else {
        e.to_string()
    }
}
