//! `ambit waypoint`, the process: its certificate from the CA, its configuration over delta
//! ADS, HBONE on 15008, admin on 127.0.0.1:15000, metrics on 15020, readiness on 15021, and a
//! graceful drain on SIGTERM.
//!
//! Threads as the node proxy's: the main thread runs a current-thread runtime for the control
//! path (CA, xDS, admin, metrics, readiness, signals, drain); the data path runs on its own
//! multi-threaded runtime, so a scrape never delays a request.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ambit_admin::Readiness;
use ambit_hbone::{Dialed, Dialer, Drain, H2Settings, Pool};
use ambit_identity::control::Service;
use ambit_identity::{CaClient, CaClientConfig, CertManager, CertSigner, FakeCa};
use http::HeaderValue;
use prometheus_client::registry::Registry;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::{Settings, Waypoint};

mod admin;
mod args;
mod xds;

pub use args::{CaSource, Config, ConfigError, ENV_OUTSIDE_FLAGS, ENV_PREFIXES, WaypointArgs};

/// How long pooled upstream HBONE connections may stay unused (ztunnel's pool default).
const POOL_IDLE: Duration = Duration::from_secs(300);
/// First and longest wait between attempts at the waypoint's certificate at start.
const CERT_RETRY: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(15));

/// A failure that stops the waypoint from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A runtime could not be built.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// A port could not be bound.
    #[error("failed to bind to address {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    /// The xDS client could not be set up.
    #[error("xDS: {0}")]
    Xds(#[from] ambit_identity::control::ControlError),
    /// The CA client (or FAKE_CA_ROOT) could not be set up.
    #[error("certificate authority: {0}")]
    Ca(#[from] ambit_identity::CaError),
    /// The baggage built from the settings is no header value.
    #[error(
        "the waypoint's baggage {0:?} is not a valid header value; check CLUSTER_ID, POD_NAMESPACE and SERVICE_ACCOUNT"
    )]
    Baggage(String),
}

/// Runs the waypoint until SIGTERM, SIGINT or `/quitquitquit`, then drains and returns.
pub fn run(cfg: Config) -> Result<(), StartError> {
    let cfg = Arc::new(cfg);
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("ambit-control")
        .build()
        .map_err(StartError::Runtime)?;
    let data = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads.max(1))
        .thread_name("ambit-worker")
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    let data_rt = data.handle().clone();
    control.block_on(serve(cfg, data_rt))?;
    data.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

async fn serve(cfg: Arc<Config>, data: tokio::runtime::Handle) -> Result<(), StartError> {
    let signer: Arc<dyn CertSigner> = match &cfg.ca {
        CaSource::Fake { root: Some(dir) } => Arc::new(FakeCa::from_dir(dir)?),
        CaSource::Fake { root: None } => Arc::new(FakeCa::generate()),
        // The waypoint asks for its own identity, on the node's behalf only with a node's token.
        CaSource::Remote { control, impersonate } => Arc::new(CaClient::new(CaClientConfig {
            control: control.control_plane_config(Service::Ca),
            impersonate: *impersonate,
        })?),
    };
    let certs = CertManager::new(signer, cfg.secret_ttl);
    let h2 = H2Settings {
        window_size: 4 << 20,
        connection_window_size: 16 << 20,
        frame_size: 1 << 20,
        max_streams: 100,
    };
    let pool = Pool::new(certs.clone(), Box::new(Dial), h2, POOL_IDLE);
    let mut settings = Settings::new(cfg.identity.clone(), cfg.instance_ip);
    settings.baggage =
        Some(HeaderValue::from_str(&cfg.baggage).map_err(|_| StartError::Baggage(cfg.baggage.clone()))?);
    let waypoint = Waypoint::new(settings, certs.clone(), pool);

    let mut registry = Registry::default();
    waypoint.counters().register(&mut registry);
    let presented = cfg.xds_presents_cert.then(|| (certs.clone(), cfg.identity.clone()));
    let xds = xds::Xds::start(&cfg.xds, &cfg.node, presented, waypoint.clone(), &mut registry)?;
    let registry = Arc::new(registry);

    let readiness = Readiness::new("waiting for the certificate and the first xDS sync");
    let drain = Drain::new();
    let quit = Arc::new(Notify::new());
    // Bound now (a port held by anything but another waypoint stops the start), listening once
    // ready: a replacement started beside a running waypoint (SO_REUSEPORT) gets connections
    // only when it can serve them, and whoever replaces it can tell by its listening socket.
    let hbone = bind_shared(cfg.hbone_addr)?;
    let (admin_l, stats_l, ready_l) =
        (bind_here(cfg.admin_addr)?, bind_here(cfg.stats_addr)?, bind_here(cfg.readiness_addr)?);
    let ctx = Arc::new(admin::AdminCtx {
        cfg: cfg.clone(),
        certs: certs.clone(),
        xds: xds.clone(),
        drain: drain.clone(),
        quit: quit.clone(),
        waypoint: waypoint.clone(),
    });
    tokio::spawn(ambit_admin::serve(admin_l, move |req| admin::admin(req, ctx.clone())));
    tokio::spawn(ambit_admin::serve(stats_l, move |req| admin::metrics(req, registry.clone())));
    let r = readiness.clone();
    tokio::spawn(ambit_admin::serve(ready_l, move |req| admin::readiness(req, r.clone())));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(become_ready(certs, cfg.clone(), xds, readiness.clone(), ready_tx));

    // The HBONE socket listens once the waypoint is ready, accepts only on the data runtime,
    // and stops when the drain starts.
    let (w, d) = (waypoint.clone(), Arc::new(drain.clone()));
    let hbone_addr = cfg.hbone_addr;
    let accept = data.spawn(async move {
        if ready_rx.await.is_err() {
            return;
        }
        let listener = match hbone.listen(LISTEN_BACKLOG).and_then(|()| {
            let l: std::net::TcpListener = hbone.into();
            tokio::net::TcpListener::from_std(l)
        }) {
            Ok(l) => l,
            Err(e) => return tracing::error!(error = %e, addr = %hbone_addr, "HBONE listener unusable"),
        };
        tokio::select! {
            r = w.run(listener, d.clone()) => if let Err(e) = r {
                tracing::error!(error = %e, "HBONE listener failed");
            },
            () = d.started() => {}
        }
    });
    tracing::info!(
        identity = %cfg.identity,
        gateway = %cfg.gateway,
        hbone = %cfg.hbone_addr,
        xds = %cfg.xds.address,
        "waypoint started"
    );

    wait_for_stop(&quit).await;
    readiness.not_ready("draining");
    tracing::info!(deadline = ?cfg.drain_deadline, "draining");
    let left = drain.run(cfg.drain_deadline).await;
    accept.abort();
    if left > 0 {
        tracing::warn!(streams = left, "closed streams that did not finish before the drain deadline");
    }
    tracing::info!("drained, exiting");
    Ok(())
}

/// Ready once the waypoint's certificate is issued and the first xDS response of both types is
/// installed; the certificate is retried with backoff until it comes (the manager keeps it
/// renewed after that).
async fn become_ready(
    certs: Arc<CertManager>,
    cfg: Arc<Config>,
    xds: xds::Xds,
    readiness: Arc<Readiness>,
    listen: tokio::sync::oneshot::Sender<()>,
) {
    let mut wait = CERT_RETRY.0;
    loop {
        match certs.fetch(&cfg.identity).await {
            Ok(_) => break,
            Err(e) => {
                tracing::warn!(identity = %cfg.identity, error = %e, retry_in = ?wait, "no certificate yet");
                readiness.not_ready("waiting for the certificate");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(CERT_RETRY.1);
            }
        }
    }
    readiness.not_ready("waiting for the first xDS sync");
    xds.synced().await;
    tracing::info!("certificate and initial xDS sync in: ready");
    let _ = listen.send(());
    readiness.ready();
}

/// Dials endpoints' node proxies from the waypoint's own address (the kernel's choice in its
/// pod), with TCP_NODELAY as every HBONE peer.
struct Dial;

impl Dialer for Dial {
    fn dial(&self, dst: SocketAddr) -> Pin<Box<dyn Future<Output = std::io::Result<Dialed>> + Send + '_>> {
        Box::pin(async move {
            let tcp = TcpStream::connect(dst).await?;
            tcp.set_nodelay(true)?;
            Ok(Dialed { tcp, guard: Box::new(()) })
        })
    }
}

/// Pending connections a listener holds.
const LISTEN_BACKLOG: i32 = 1024;

/// A socket bound to `addr` with SO_REUSEPORT (and SO_REUSEADDR), not yet listening: a
/// replacement waypoint binds the same ports beside the running one. `[::]` falls back to
/// `0.0.0.0` where IPv6 is off.
fn bind_shared(addr: SocketAddr) -> Result<socket2::Socket, StartError> {
    let one = |addr: SocketAddr| -> std::io::Result<socket2::Socket> {
        let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        Ok(s)
    };
    match one(addr) {
        Err(_) if addr.is_ipv6() && addr.ip().is_unspecified() => {
            one(SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port()))
        }
        r => r,
    }
    .map_err(|e| StartError::Bind(addr, e))
}

/// A listening socket on `addr` (shared as [`bind_shared`]) for the current (control) runtime.
fn bind_here(addr: SocketAddr) -> Result<tokio::net::TcpListener, StartError> {
    let s = bind_shared(addr)?;
    s.listen(LISTEN_BACKLOG).map_err(|e| StartError::Bind(addr, e))?;
    let l: std::net::TcpListener = s.into();
    tokio::net::TcpListener::from_std(l).map_err(|e| StartError::Bind(addr, e))
}

async fn wait_for_stop(quit: &Notify) {
    tokio::select! {
        () = ambit_admin::shutdown_signal() => tracing::info!("SIGTERM or SIGINT received"),
        () = quit.notified() => tracing::info!("/quitquitquit received"),
    }
}
