//! What every listener of one proxy instance shares.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use ambit_identity::{CertManager, Identity};
use ambit_zds::WorkloadInfo;

use crate::config::Config;
use crate::connections::ConnectionManager;
use crate::copy::Transferred;
use crate::drain::Drain;
use crate::limits::{FdPermit, Limits, PodPermit};
use crate::metrics::{ConnectionRecord, Metrics};
use crate::socket::SocketOptions;
use crate::state::{StateStore, Workload};
use ambit_hbone::Pool;

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
    /// Process-wide descriptor budget and per-peer caps.
    pub limits: Limits,
    /// This instance's share of the descriptor budget: held, never read, released when the
    /// instance is gone.
    pub _pod_fds: PodPermit,
    /// The xDS client (on-demand address lookups), when configured.
    pub xds: Option<crate::xds::Xds>,
}

/// How long a dial to an app or a plain TCP upstream may take.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// Dials a plain TCP upstream (marked; from `spoof` when given), bounded by
    /// [`UPSTREAM_CONNECT_TIMEOUT`], with a descriptor from the budget (keep the permit as long
    /// as the stream); the error is the access-log text.
    pub async fn dial(
        &self,
        target: SocketAddr,
        spoof: Option<IpAddr>,
    ) -> Result<(TcpStream, FdPermit), String> {
        let Some(permit) = self.limits.fds.try_acquire(1) else {
            return Err(format!(
                "connection failed: the proxy holds its whole descriptor budget ({} descriptors: RLIMIT_NOFILE minus AMBIT_FD_RESERVE)",
                self.limits.fds.dump().budget
            ));
        };
        match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, self.sockets.connect(target, spoof)).await {
            Ok(Ok(s)) => Ok((s, permit)),
            Ok(Err(e)) => Err(format!("connection failed: {e}")),
            Err(_) => Err("connection failed: timed out".to_owned()),
        }
    }

    /// Runs an established connection's copy to its end, or until a policy change revokes it
    /// (`revoked`) or the drain forces it closed; then records its end.
    pub async fn relay(
        &self,
        record: ConnectionRecord,
        copy: impl Future<Output = (Transferred, std::io::Result<()>)>,
        revoked: Option<&CancellationToken>,
    ) {
        let revoked = async {
            match revoked {
                Some(t) => t.cancelled().await,
                None => std::future::pending().await,
            }
        };
        // Biased, forced close first: the drain's force also ends the HBONE connection, so the
        // copy may fail with a broken stream in the same wake-up; the log must give the drain as
        // the reason, not the broken stream it caused.
        let (t, err) = tokio::select! {
            biased;
            _ = self.drain.forced() => (record.snapshot(), Some(self.drain.close_reason().to_owned())),
            _ = revoked => (record.snapshot(), Some("connection closed due to policy change".to_owned())),
            (t, res) = copy => (t, res.err().map(|e| e.to_string())),
        };
        record.finish(t, err.as_ref().map(|e| e as &dyn std::fmt::Display));
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
