//! Live inbound connections, re-evaluated whenever the policy set changes: those now denied
//! are closed. Also what `/debug/connections` and the config dump's `workloadState` list.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

use tokio_util::sync::CancellationToken;

use crate::authz::{self, Connection, Decision};
use crate::state::{StateStore, Workload};

/// Registry of live inbound connections.
#[derive(Clone, Default)]
pub struct ConnectionManager {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Tracked>>,
}

struct Tracked {
    conn: Connection,
    workload_uid: String,
    workload: Arc<Workload>,
    close: CancellationToken,
    /// The peer's address (the source proxy's end of the HBONE connection, or the plaintext
    /// client).
    src: SocketAddr,
    /// The app's address the connection was made to.
    dst: SocketAddr,
    opened: SystemTime,
    /// The relay's byte counters, once it runs.
    counters: Option<Arc<crate::copy::LiveCounters>>,
}

/// One live inbound connection, as `/debug/connections` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveConnection {
    /// The peer's address.
    pub src: String,
    /// The peer's identity (empty: plaintext).
    pub src_identity: String,
    /// The app's address.
    pub dst: String,
    /// The destination workload `namespace/name`.
    pub dst_workload: String,
    /// Its uid.
    pub dst_uid: String,
    /// Bytes from the peer to the app so far.
    pub bytes_sent: u64,
    /// Bytes from the app to the peer so far.
    pub bytes_received: u64,
    /// When it was authorized (RFC 3339).
    pub opened: String,
}

/// Removes the connection from the registry when dropped.
pub struct Registration {
    id: u64,
    inner: Arc<Inner>,
    /// Cancelled when a policy change denies the connection.
    pub closed: CancellationToken,
}

impl Registration {
    /// Counts the connection's bytes from the relay's counters.
    pub fn count(&self, counters: &Arc<crate::copy::LiveCounters>) {
        let mut live = self.inner.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = live.get_mut(&self.id) {
            t.counters = Some(counters.clone());
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.inner.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

impl ConnectionManager {
    /// Tracks an authorized connection from `src` to `workload` at `dst`.
    pub fn register(
        &self,
        conn: Connection,
        workload: Arc<Workload>,
        src: SocketAddr,
        dst: SocketAddr,
    ) -> Registration {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let close = CancellationToken::new();
        let t = Tracked {
            conn,
            workload_uid: workload.uid.to_string(),
            workload,
            close: close.clone(),
            src,
            dst,
            opened: SystemTime::now(),
            counters: None,
        };
        self.inner.live.lock().unwrap_or_else(|p| p.into_inner()).insert(id, t);
        Registration { id, inner: self.inner.clone(), closed: close }
    }

    /// The live connections, oldest first.
    pub fn dump(&self) -> Vec<LiveConnection> {
        let live = self.inner.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(u64, LiveConnection)> = live
            .iter()
            .map(|(id, t)| {
                let bytes = t.counters.as_ref().map(|c| c.transferred()).unwrap_or_default();
                let c = LiveConnection {
                    src: t.src.to_string(),
                    src_identity: t.conn.src_identity.as_ref().map(ToString::to_string).unwrap_or_default(),
                    dst: t.dst.to_string(),
                    dst_workload: format!("{}/{}", t.workload.namespace, t.workload.name),
                    dst_uid: t.workload_uid.clone(),
                    bytes_sent: bytes.sent,
                    bytes_received: bytes.received,
                    opened: ambit_identity::rfc3339(t.opened),
                };
                (*id, c)
            })
            .collect();
        drop(live);
        out.sort_by_key(|(id, _)| *id);
        out.into_iter().map(|(_, c)| c).collect()
    }

    /// Number of tracked connections.
    pub fn len(&self) -> usize {
        self.inner.live.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Re-evaluates every tracked connection against the current policies; closes the denied.
    /// Returns how many were closed.
    pub fn reevaluate(&self, store: &StateStore) -> usize {
        let state = store.current();
        let live = self.inner.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut closed = 0;
        for t in live.values() {
            let w = state.workload_by_uid(&t.workload_uid).unwrap_or_else(|| t.workload.clone());
            let policies = state.policies_for(&w);
            if let Decision::Deny(reason) = authz::evaluate(policies.iter().map(|p| p.as_ref()), &t.conn) {
                tracing::info!(src = %t.conn.src_ip, dst.port = t.conn.dst_port, %reason,
                    "closing connection denied after a policy change");
                t.close.cancel();
                closed += 1;
            }
        }
        closed
    }

    /// Re-evaluates on every policy change until the store goes away.
    pub async fn watch(self, store: StateStore) {
        let mut rx = store.subscribe_policies();
        while rx.changed().await.is_ok() {
            self.reevaluate(&store);
        }
    }
}
