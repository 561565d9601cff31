//! Wires one proxy process together: runtimes, state, certificates, listeners, admin, drain.
//!
//! Threads: the main thread runs a single-threaded runtime for the control path (state
//! reloads, certificate fetches, admin, metrics, readiness, policy re-evaluation); traffic runs
//! on a separate multi-threaded runtime, so an expensive scrape never delays the data path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ambit_identity::{CaClient, CaClientConfig, CertManager, CertSigner, FakeCa};
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

use crate::config::{CaSource, Config};
use crate::connections::ConnectionManager;
use crate::drain::Drain;
use crate::hbone::H2Settings;
use crate::hbone::pool::Pool;
use crate::inputs::Inputs;
use crate::metrics::Metrics;
use crate::state::{LocalConfig, State, StateStore};

/// A failure that stops the proxy from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The local config file is unusable.
    #[error("local config {path}: {error}")]
    LocalConfig {
        /// File.
        path: String,
        /// Why.
        error: crate::state::LocalConfigError,
    },
    /// A runtime could not be built.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// A data-plane listener could not be bound.
    #[error(transparent)]
    Bind(#[from] crate::socket::BindError),
    /// An admin/metrics/readiness port could not be bound.
    #[error("failed to bind to address {0}: {1}")]
    BindAdmin(SocketAddr, std::io::Error),
    /// The CA client could not be set up.
    #[error("certificate authority: {0}")]
    Ca(#[from] ambit_identity::CaError),
}

/// Runs the proxy until it is told to stop (SIGTERM, SIGINT, `/quitquitquit`) and has drained.
pub fn run(cfg: Config) -> Result<(), StartError> {
    raise_fd_limit();
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

    let path = cfg.local_xds_path.clone().unwrap_or_default();
    let node = cfg.local_node.clone();
    let initial = LocalConfig::load(&path)
        .and_then(|c| State::from_config(c, node.as_deref()))
        .map_err(|error| StartError::LocalConfig {
            path: path.display().to_string(),
            error,
        })?;
    let store = StateStore::new(initial);
    let data_rt = data.handle().clone();

    control.block_on(async move {
        let signer: Arc<dyn CertSigner> = match &cfg.ca {
            CaSource::Fake { root: Some(dir) } => Arc::new(FakeCa::from_dir(dir)?),
            CaSource::Fake { root: None } => Arc::new(FakeCa::generate()),
            CaSource::Remote {
                address,
                root_cert,
                token,
            } => Arc::new(CaClient::new(CaClientConfig {
                address: address.clone(),
                root_cert: root_cert.clone(),
                token_path: token.clone(),
                cluster_id: cfg.cluster_id.clone(),
                headers: prefixed_env("CA_HEADER_"),
                impersonate: false,
            })?),
        };
        let certs = CertManager::new(signer, cfg.secret_ttl);
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let registry = Arc::new(registry);
        let sockets = cfg.socket_options();
        let settings = H2Settings {
            window_size: cfg.window_size,
            connection_window_size: cfg.connection_window_size,
            frame_size: cfg.frame_size,
            max_streams: cfg.pool_max_streams_per_conn,
        };
        let pool = Pool::new(
            certs.clone(),
            sockets.clone(),
            settings,
            cfg.pool_unused_release_timeout,
        );
        let transparent = cfg
            .require_original_source
            .unwrap_or_else(crate::socket::transparent_available);
        let local = cfg.proxy_workload_information.clone().expect(
            "dedicated mode config always carries the workload (checked in Config::from_args)",
        );
        let drain = Drain::new();
        let inputs = Arc::new(Inputs {
            cfg: cfg.clone(),
            state: store.clone(),
            certs,
            metrics,
            sockets: sockets.clone(),
            pool: pool.clone(),
            drain: drain.clone(),
            connections: ConnectionManager::default(),
            transparent,
            local,
        });

        // Data-plane listeners: bound now (failure is fatal), accepting on the data runtime.
        let _guard = data_rt.enter();
        let outbound = sockets.listen(cfg.outbound_addr, true)?;
        let inbound = sockets.listen(cfg.inbound_addr, true)?;
        let plaintext = sockets.listen(cfg.inbound_plaintext_addr, true)?;
        drop(_guard);
        let i = inputs.clone();
        data_rt.spawn(crate::listener::accept_loop(
            "outbound",
            outbound,
            drain.clone(),
            move |s, p| crate::outbound::serve_connection(i.clone(), s, p),
        ));
        let i = inputs.clone();
        data_rt.spawn(crate::listener::accept_loop(
            "inbound",
            inbound,
            drain.clone(),
            move |s, p| crate::inbound::serve_connection(i.clone(), s, p),
        ));
        let i = inputs.clone();
        data_rt.spawn(crate::listener::accept_loop(
            "inbound_plaintext",
            plaintext,
            drain.clone(),
            move |s, p| crate::passthrough::serve_connection(i.clone(), s, p),
        ));

        // Control path.
        let ready = Arc::new(AtomicBool::new(false));
        let quit = Arc::new(Notify::new());
        let admin_l = bind_admin(cfg.admin_addr)?;
        let stats_l = bind_admin(cfg.stats_addr)?;
        let ready_l = bind_admin(cfg.readiness_addr)?;
        let (i, q) = (inputs.clone(), quit.clone());
        tokio::spawn(crate::admin::serve(admin_l, move |req| {
            crate::admin::admin(req, i.clone(), q.clone())
        }));
        let r = registry.clone();
        tokio::spawn(crate::admin::serve(stats_l, move |req| {
            crate::admin::metrics(req, r.clone())
        }));
        let (rd, d) = (ready.clone(), drain.clone());
        tokio::spawn(crate::admin::serve(ready_l, move |req| {
            crate::admin::readiness(req, rd.clone(), d.is_draining())
        }));
        if let Some(path) = cfg.local_xds_path.clone() {
            tokio::spawn(crate::state::watch_local_file(
                store.clone(),
                path,
                cfg.local_node.clone(),
                Duration::from_millis(500),
            ));
        }
        tokio::spawn(inputs.connections.clone().watch(store.clone()));
        let p = pool.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(30)).await;
                p.release_idle();
            }
        });
        ready.store(true, Ordering::Relaxed);
        tracing::info!(
            mode = ?cfg.proxy_mode,
            workload = ?cfg.proxy_workload_information,
            workers = cfg.num_worker_threads,
            "proxy ready: outbound {}, inbound {}, inbound plaintext {}",
            cfg.outbound_addr, cfg.inbound_addr, cfg.inbound_plaintext_addr
        );

        wait_for_stop(&quit).await;
        ready.store(false, Ordering::Relaxed);
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

fn prefixed_env(prefix: &str) -> Vec<(String, String)> {
    std::env::vars()
        .filter_map(|(k, v)| k.strip_prefix(prefix).map(|h| (h.to_ascii_lowercase(), v)))
        .collect()
}

fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// Sets up logging: `RUST_LOG` filter, plain or JSON lines on stderr.
pub fn init_logging(filter: &str, json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
    } else {
        builder.try_init()
    };
}
