//! Wires one proxy process together: runtimes, state, certificates, listeners, admin, drain.
//!
//! Threads: the main thread runs a single-threaded runtime for the control path (state
//! reloads, certificate fetches, ZDS, admin, metrics, readiness, policy re-evaluation); traffic runs
//! on a separate multi-threaded runtime, so an expensive scrape never delays the data path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ambit_identity::control::{ControlPlaneConfig, Service};
use ambit_identity::{CaClient, CaClientConfig, CertManager, CertSigner, FakeCa};
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use crate::config::{CaSource, Config, ProxyMode};
use crate::connections::ConnectionManager;
use crate::dns::DnsConfig;
use crate::drain::Drain;
use crate::instance::Shared;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::state::{State, StateStore};

/// A failure that stops the proxy from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The local config file is unusable.
    #[error("local config {path}: {error}")]
    LocalConfig {
        /// File.
        path: String,
        /// Why.
        error: Box<crate::state::LocalConfigError>,
    },
    /// A runtime could not be built.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// The dedicated-mode instance could not start (a listener, or the descriptor budget).
    #[error(transparent)]
    Instance(#[from] crate::instance::StartError),
    /// An admin/metrics/readiness port could not be bound.
    #[error("failed to bind to address {0}: {1}")]
    BindAdmin(SocketAddr, std::io::Error),
    /// Shared mode lacks a capability.
    #[error("{0}")]
    Capabilities(std::io::Error),
    /// The xDS client could not be set up.
    #[error("xDS: {0}")]
    Xds(#[from] crate::xds::XdsStartError),
    /// The CA client could not be set up.
    #[error("certificate authority: {0}")]
    Ca(#[from] ambit_identity::CaError),
}

/// Runs the proxy until it is told to stop (SIGTERM, SIGINT, `/quitquitquit`) and has drained.
pub fn run(cfg: Config) -> Result<(), StartError> {
    let fd_limit = raise_fd_limit();
    let cfg = Arc::new(cfg);
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("ambit-control")
        .build()
        .map_err(StartError::Runtime)?;
    let data = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.num_worker_threads)
        .thread_name("ambit-worker")
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;

    let node = cfg.local_node.clone();
    let (initial, loaded) = match &cfg.local_xds_path {
        Some(path) => {
            let (state, loaded) = crate::state::load_local_file(path, node.as_deref()).map_err(|error| {
                StartError::LocalConfig { path: path.display().to_string(), error: Box::new(error) }
            })?;
            (state, Some(loaded))
        }
        None => (State::default(), None),
    };
    let store = StateStore::new(initial);
    let data_rt = data.handle().clone();

    control.block_on(async move {
        let shared_mode = cfg.proxy_mode == ProxyMode::Shared;
        if shared_mode {
            crate::inpod::netns::check_capabilities(cfg.packet_mark).map_err(StartError::Capabilities)?;
        }
        let signer: Arc<dyn CertSigner> = match &cfg.ca {
            CaSource::Fake { root: Some(dir) } => Arc::new(FakeCa::from_dir(dir)?),
            CaSource::Fake { root: None } => Arc::new(FakeCa::generate()),
            CaSource::Remote(ca) => Arc::new(CaClient::new(CaClientConfig {
                control: ControlPlaneConfig {
                    // A dedicated proxy's own CA calls must pass its pod's capture rules.
                    mark: cfg.packet_mark,
                    ..ca.control_plane_config(Service::Ca)
                },
                // Shared mode asks for pods' certificates on their behalf (node-scoped).
                impersonate: shared_mode,
            })?),
        };
        let certs = CertManager::new(signer, cfg.secret_ttl);
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        crate::metrics::register_process_and_runtime(&mut registry, data_rt.clone());
        let limits = Limits::new(&cfg, fd_limit, &mut registry);
        let xds = match &cfg.xds {
            Some(settings) => {
                Some(crate::xds::Xds::start(settings, store.clone(), cfg.packet_mark, &mut registry)?)
            }
            None => None,
        };
        let fd = limits.fds.dump();
        tracing::info!(
            rlimit_nofile = fd.limit,
            reserve = fd.reserve,
            data_plane = fd.budget,
            per_pod = fd.pod_fixed + fd.pod_headroom,
            pod_capacity = fd.pod_capacity,
            hbone_connections_per_peer = limits.peers.dump().max_connections_per_peer,
            "descriptor budget and per-peer limits"
        );
        let conns = u64::from(cfg.hbone_max_connections_per_peer);
        if conns * u64::from(crate::limits::peers::MIN_WINDOW) > cfg.hbone_peer_buffer_bytes {
            tracing::warn!(
                "AMBIT_HBONE_MAX_CONNECTIONS_PER_PEER={conns} does not fit AMBIT_HBONE_PEER_BUFFER_BYTES={} (each connection needs a 65535-byte window): the cap in effect is {:?}",
                cfg.hbone_peer_buffer_bytes,
                limits.peers.dump().max_connections_per_peer
            );
        }
        let shared = Shared {
            cfg: cfg.clone(),
            state: store.clone(),
            certs,
            metrics,
            connections: ConnectionManager::default(),
            transparent: cfg.require_original_source.unwrap_or_else(crate::socket::transparent_available),
            data: data_rt,
            dns: cfg.dns_proxy.then(|| {
                let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
                let mut dns = DnsConfig::from_resolv_conf(&text, &cfg.cluster_domain, cfg.ipv6_enabled);
                dns.preferred_namespace = cfg.prefered_service_namespace.clone();
                if dns.upstreams.is_empty() {
                    tracing::warn!(
                        "no nameserver in /etc/resolv.conf: the DNS proxy answers mesh names only"
                    );
                }
                Arc::new(dns)
            }),
            limits,
            xds: xds.clone(),
        };
        let drain = Drain::new();
        let readiness = Readiness::new();
        // Not ready until the first xDS response of every type is applied and ACKed.
        let state_manager = xds.as_ref().map(|_| readiness.pending("state manager"));
        let workloads = shared_mode
            .then(|| crate::inpod::Manager::new(shared.clone(), drain.clone(), &mut registry));
        let registry = Arc::new(registry);

        // Control path.
        let quit = Arc::new(Notify::new());
        let admin_l = bind_admin(cfg.admin_addr)?;
        let stats_l = bind_admin(cfg.stats_addr)?;
        let ready_l = bind_admin(cfg.readiness_addr)?;
        let ctx = Arc::new(crate::admin::AdminCtx {
            shared: shared.clone(),
            drain: drain.clone(),
            quit: quit.clone(),
            workloads: workloads.clone(),
        });
        tokio::spawn(crate::admin::serve(admin_l, move |req| crate::admin::admin(req, ctx.clone())));
        let r = registry.clone();
        tokio::spawn(crate::admin::serve(stats_l, move |req| crate::admin::metrics(req, r.clone())));
        let (rd, d) = (readiness.clone(), drain.clone());
        tokio::spawn(crate::admin::serve(ready_l, move |req| {
            crate::admin::readiness(req, rd.clone(), d.is_draining())
        }));
        if let Some(path) = cfg.local_xds_path.clone() {
            tokio::spawn(crate::state::watch_local_file(
                store.clone(),
                path,
                Duration::from_millis(500),
                loaded,
            ));
        }
        tokio::spawn(shared.connections.clone().watch(store.clone()));
        let stop = wait_for_stop(&quit);
        tokio::pin!(stop);
        // As ztunnel: the ZDS client (shared mode) and the listeners (dedicated mode) start only
        // once the first xDS state is in, so no pod is served from an empty state.
        if let Some(x) = &xds {
            tracing::info!(address = %x.status().connection.server, "waiting for the initial xDS sync");
            tokio::select! {
                () = x.synced() => tracing::info!("initial xDS sync complete"),
                () = &mut stop => {
                    tracing::info!("stopped before the initial xDS sync");
                    return Ok(());
                }
            }
        }
        match &workloads {
            Some(manager) => {
                tokio::spawn(manager.clone().run(cfg.inpod_uds.clone(), readiness.clone()));
            }
            None => {
                let local = cfg.proxy_workload_information.clone().expect(
                    "dedicated mode config always carries the workload (checked in Config::from_args)",
                );
                shared.start(local, cfg.socket_options(), drain.child())?;
            }
        }
        // Ready once the listeners are bound (dedicated) or the ZDS client runs (shared; it
        // holds readiness until its snapshot is in).
        drop(state_manager);
        tracing::info!(
            mode = ?cfg.proxy_mode,
            workload = ?cfg.proxy_workload_information,
            workers = cfg.num_worker_threads,
            xds = cfg.xds.as_ref().map(|x| x.control.address.as_str()),
            local_config = ?cfg.local_xds_path,
            "proxy started"
        );

        stop.await;
        tracing::info!(deadline = ?cfg.self_termination_deadline, "draining");
        let left = drain.run(cfg.self_termination_deadline).await;
        if left > 0 {
            tracing::warn!(
                connections = left,
                "closed connections that did not finish before the drain deadline"
            );
        }
        tracing::info!("drained, exiting");
        Ok::<(), StartError>(())
    })?;
    data.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

fn bind_admin(addr: SocketAddr) -> Result<tokio::net::TcpListener, StartError> {
    let std = match crate::admin::bind_std(addr) {
        Ok(l) => l,
        // `[::]` on a host without IPv6: fall back to IPv4.
        Err(_) if addr.ip().is_unspecified() && addr.is_ipv6() => {
            let v4 = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port());
            crate::admin::bind_std(v4).map_err(|e| StartError::BindAdmin(v4, e))?
        }
        Err(e) => return Err(StartError::BindAdmin(addr, e)),
    };
    tokio::net::TcpListener::from_std(std).map_err(|e| StartError::BindAdmin(addr, e))
}

async fn wait_for_stop(quit: &Notify) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    let term = async {
        match term.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    let int = async {
        match int.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = term => tracing::info!("SIGTERM received"),
        _ = int => tracing::info!("SIGINT received"),
        _ = quit.notified() => tracing::info!("/quitquitquit received"),
    }
}

/// Raises the soft open-files limit to the hard one; returns the limit in effect.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        // Linux's default soft limit.
        Err(_) => 1024,
    }
}
