//! Live inbound connections, re-evaluated whenever the policy set changes: those now denied
//! are closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
}

/// Removes the connection from the registry when dropped.
pub struct Registration {
    id: u64,
    inner: Arc<Inner>,
    /// Cancelled when a policy change denies the connection.
    pub closed: CancellationToken,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.inner.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

impl ConnectionManager {
    /// Tracks an authorized connection to `workload`.
    pub fn register(&self, conn: Connection, workload: Arc<Workload>) -> Registration {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let close = CancellationToken::new();
        let t = Tracked { conn, workload_uid: workload.uid.clone(), workload, close: close.clone() };
        self.inner.live.lock().unwrap_or_else(|p| p.into_inner()).insert(id, t);
        Registration { id, inner: self.inner.clone(), closed: close }
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
