//! One proxy instance: the listeners and state serving one workload (the process's own in
//! dedicated mode, one per pod in shared mode), on top of what the whole process shares.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ambit_identity::CertManager;

use crate::config::{Config, WorkloadInfo};
use crate::connections::ConnectionManager;
use crate::drain::Drain;
use crate::hbone::H2Settings;
use crate::hbone::pool::Pool;
use crate::inputs::Inputs;
use crate::metrics::Metrics;
use crate::socket::{BindError, SocketOptions};
use crate::state::StateStore;

/// What every instance of the process shares.
#[derive(Clone)]
pub struct Shared {
    /// Resolved configuration.
    pub cfg: Arc<Config>,
    /// Mesh state.
    pub state: StateStore,
    /// Workload certificates (one per identity, shared by pods of the same identity).
    pub certs: Arc<CertManager>,
    /// Metric families.
    pub metrics: Metrics,
    /// Live inbound connections of every instance (one policy watcher for all).
    pub connections: ConnectionManager,
    /// Spoof client source IPs towards apps.
    pub transparent: bool,
    /// The data-plane runtime.
    pub data: tokio::runtime::Handle,
}

impl Shared {
    /// HTTP/2 settings from the configuration.
    pub fn h2_settings(&self) -> H2Settings {
        H2Settings {
            window_size: self.cfg.window_size,
            connection_window_size: self.cfg.connection_window_size,
            frame_size: self.cfg.frame_size,
            max_streams: self.cfg.pool_max_streams_per_conn,
        }
    }

    /// Binds the instance's listeners (in `sockets`' namespace) and starts serving `local`.
    /// Returns once every listener is bound; fails if any cannot be.
    pub fn start(
        &self,
        local: WorkloadInfo,
        sockets: SocketOptions,
        drain: Drain,
    ) -> Result<Arc<Inputs>, BindError> {
        let _rt = self.data.enter();
        let cfg = &self.cfg;
        let outbound = listen(&sockets, cfg.outbound_addr)?;
        let inbound = listen(&sockets, cfg.inbound_addr)?;
        let plaintext = listen(&sockets, cfg.inbound_plaintext_addr)?;
        let pool = Pool::new(
            self.certs.clone(),
            sockets.clone(),
            self.h2_settings(),
            cfg.pool_unused_release_timeout,
        );
        let inputs = Arc::new(Inputs {
            cfg: cfg.clone(),
            state: self.state.clone(),
            certs: self.certs.clone(),
            metrics: self.metrics.clone(),
            sockets,
            pool: pool.clone(),
            drain: drain.clone(),
            connections: self.connections.clone(),
            transparent: self.transparent,
            local,
        });
        let i = inputs.clone();
        self.data.spawn(crate::listener::accept_loop("outbound", outbound, drain.clone(), move |s, p| {
            crate::outbound::serve_connection(i.clone(), s, p)
        }));
        let i = inputs.clone();
        self.data.spawn(crate::listener::accept_loop("inbound", inbound, drain.clone(), move |s, p| {
            crate::inbound::serve_connection(i.clone(), s, p)
        }));
        let i = inputs.clone();
        self.data.spawn(crate::listener::accept_loop(
            "inbound_plaintext",
            plaintext,
            drain.clone(),
            move |s, p| crate::passthrough::serve_connection(i.clone(), s, p),
        ));
        self.data.spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(30)) => pool.release_idle(),
                    _ = drain.started() => return,
                }
            }
        });
        Ok(inputs)
    }
}

/// Binds `addr`; a dual-stack `[::]` address falls back to IPv4 where IPv6 is unavailable
/// (a pod namespace with IPv6 disabled).
fn listen(sockets: &SocketOptions, addr: SocketAddr) -> Result<tokio::net::TcpListener, BindError> {
    match sockets.listen(addr, true) {
        Ok(l) => Ok(l),
        Err(e) if addr.is_ipv6() && addr.ip().is_unspecified() && ipv6_unavailable(&e.source) => {
            sockets.listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port()), true)
        }
        Err(e) => Err(e),
    }
}

fn ipv6_unavailable(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL))
}
