//! What every listener of one proxy instance shares.

use std::sync::Arc;
use std::time::Duration;

use ambit_identity::{CertManager, Identity};

use crate::config::{Config, WorkloadInfo};
use crate::connections::ConnectionManager;
use crate::drain::Drain;
use crate::hbone::pool::Pool;
use crate::metrics::Metrics;
use crate::socket::SocketOptions;
use crate::state::{StateStore, Workload};

/// Shared inputs of one proxy instance (in dedicated mode, the only one).
pub struct Inputs {
    /// Resolved configuration.
    pub cfg: Arc<Config>,
    /// Mesh state.
    pub state: StateStore,
    /// Workload certificates.
    pub certs: Arc<CertManager>,
    /// Metric families.
    pub metrics: Metrics,
    /// Options for every socket.
    pub sockets: SocketOptions,
    /// Outbound HBONE pool.
    pub pool: Arc<Pool>,
    /// Drain signals and connection tracking.
    pub drain: Drain,
    /// Live inbound connections, re-checked when policies change.
    pub connections: ConnectionManager,
    /// Spoof client source IPs towards the app.
    pub transparent: bool,
    /// The workload this proxy serves.
    pub local: WorkloadInfo,
    /// Downstream connections being handled (all listeners of this instance).
    pub open: Arc<std::sync::atomic::AtomicUsize>,
}

/// How long a connection waits for the local workload to appear in state.
pub const LOCAL_WORKLOAD_WAIT: Duration = Duration::from_secs(5);

/// The local workload could not be found.
#[derive(Debug, thiserror::Error)]
#[error("failed to fetch information about local workload: {sa}.{ns} ({name})")]
pub struct LocalWorkloadError {
    sa: String,
    ns: String,
    name: String,
}

impl Inputs {
    /// The served workload, waiting up to 5 s for it to appear in state.
    pub async fn local_workload(&self) -> Result<Arc<Workload>, LocalWorkloadError> {
        let mut changes = self.state.subscribe();
        let find = || {
            self.state.current().find_local(
                &self.local.namespace,
                &self.local.name,
                &self.local.service_account,
            )
        };
        let wait = async {
            loop {
                if let Some(w) = find() {
                    return Some(w);
                }
                if changes.changed().await.is_err() {
                    return find();
                }
            }
        };
        match tokio::time::timeout(LOCAL_WORKLOAD_WAIT, wait).await {
            Ok(Some(w)) => Ok(w),
            _ => Err(LocalWorkloadError {
                sa: self.local.service_account.clone(),
                ns: self.local.namespace.clone(),
                name: self.local.name.clone(),
            }),
        }
    }

    /// A workload's SPIFFE identity, with the configured trust domain when it names none.
    pub fn identity_of(&self, w: &Workload) -> Identity {
        let mut id = w.identity();
        if id.trust_domain.is_empty() {
            id.trust_domain = self.cfg.trust_domain.clone();
        }
        if id.service_account.is_empty() {
            id.service_account = "default".into();
        }
        id
    }
}
