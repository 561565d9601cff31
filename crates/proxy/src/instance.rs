//! One proxy instance: the listeners and state serving one workload (the process's own in
//! dedicated mode, one per pod in shared mode), on top of what the whole process shares.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ambit_identity::CertManager;
use ambit_zds::WorkloadInfo;
use futures::future::BoxFuture;

use crate::config::{Config, ProxyMode};
use crate::connections::ConnectionManager;
use crate::dns::{DnsClient, DnsConfig, DnsProxy, UpstreamSockets};
use crate::drain::Drain;
use crate::inputs::Inputs;
use crate::limits::{CapacityError, Limits, Listener};
use crate::metrics::Metrics;
use crate::socket::{BindError, SocketOptions};
use crate::state::StateStore;
use ambit_hbone::{Dialed, Dialer, H2Settings, Pool};

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
    /// DNS proxy settings (resolvers from the proxy's resolv.conf), when the DNS proxy is on.
    pub dns: Option<Arc<DnsConfig>>,
    /// The descriptor budget and per-peer caps of the whole process.
    pub limits: Limits,
    /// The xDS client, when `XDS_ADDRESS` is set (on-demand lookups, `/config_dump`).
    pub xds: Option<crate::xds::Xds>,
}

/// Why an instance could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The descriptor budget has no room for another pod.
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    /// A listener could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
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

    /// Admits the instance to the descriptor budget, binds its listeners (in `sockets`'
    /// namespace) and starts serving `local`. Returns once every listener is bound; fails if the
    /// budget has no room or a listener cannot be bound.
    pub fn start(
        &self,
        local: WorkloadInfo,
        sockets: SocketOptions,
        drain: Drain,
    ) -> Result<Arc<Inputs>, StartError> {
        let pod_fds = self.limits.fds.admit_pod()?;
        let _rt = self.data.enter();
        let cfg = &self.cfg;
        let outbound = listen(&sockets, cfg.outbound_addr)?;
        let inbound = listen(&sockets, cfg.inbound_addr)?;
        let plaintext = listen(&sockets, cfg.inbound_plaintext_addr)?;
        let dns = match &self.dns {
            Some(base) => Some(self.dns_proxy(base, &local, &sockets)?),
            None => None,
        };
        let dialer = PoolDialer { sockets: sockets.clone(), fds: self.limits.fds.clone() };
        let pool = Pool::new(
            self.certs.clone(),
            Box::new(dialer),
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
            open: Default::default(),
            limits: self.limits.clone(),
            _pod_fds: pod_fds,
            xds: self.xds.clone(),
        });
        let i = inputs.clone();
        self.data.spawn(crate::listener::accept_loop(
            Listener::outbound,
            outbound,
            drain.clone(),
            inputs.open.clone(),
            self.limits.fds.clone(),
            move |s, p| crate::outbound::serve_connection(i.clone(), s, p),
        ));
        let i = inputs.clone();
        self.data.spawn(crate::listener::accept_loop(
            Listener::inbound,
            inbound,
            drain.clone(),
            inputs.open.clone(),
            self.limits.fds.clone(),
            move |s, p| crate::inbound::serve_connection(i.clone(), s, p),
        ));
        let i = inputs.clone();
        self.data.spawn(crate::listener::accept_loop(
            Listener::inbound_plaintext,
            plaintext,
            drain.clone(),
            inputs.open.clone(),
            self.limits.fds.clone(),
            move |s, p| crate::passthrough::serve_connection(i.clone(), s, p),
        ));
        if let Some((proxy, udp, tcp)) = dns {
            for u in udp {
                self.data.spawn(proxy.clone().serve_udp(u, drain.start_token()));
            }
            for t in tcp {
                self.data.spawn(proxy.clone().serve_tcp(t, drain.start_token()));
            }
        }
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

type DnsSockets = (Arc<DnsProxy>, Vec<tokio::net::UdpSocket>, Vec<tokio::net::TcpListener>);

impl Shared {
    /// The DNS proxy of one instance, bound on 127.0.0.1:15053 (and [::1]:15053 when IPv6 is
    /// on and available) in the instance's namespace.
    fn dns_proxy(
        &self,
        base: &DnsConfig,
        local: &WorkloadInfo,
        sockets: &SocketOptions,
    ) -> Result<DnsSockets, BindError> {
        let mut cfg = base.clone();
        if self.cfg.proxy_mode == ProxyMode::Shared {
            cfg.search_domains = DnsConfig::pod_search_domains(&local.namespace, &self.cfg.cluster_domain);
        }
        let client = DnsClient {
            namespace: local.namespace.clone(),
            network: self.cfg.network.clone(),
            workload: Some(local.clone()),
        };
        let proxy = DnsProxy::new(
            self.state.clone(),
            Arc::new(cfg),
            client,
            Arc::new(NetnsUpstream(sockets.clone())),
            self.metrics.dns().clone(),
        );
        let mut addrs = vec![SocketAddr::new(Ipv4Addr::LOCALHOST.into(), DNS_PORT)];
        if self.cfg.ipv6_enabled {
            addrs.push(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), DNS_PORT));
        }
        let (mut udp, mut tcp) = (Vec::new(), Vec::new());
        for (i, addr) in addrs.into_iter().enumerate() {
            let bound = sockets
                .bind_udp(addr, true)
                .map_err(|source| BindError { addr, source })
                .and_then(|u| Ok((u, sockets.listen(addr, true)?)));
            match bound {
                Ok((u, t)) => {
                    udp.push(u);
                    tcp.push(t);
                }
                // ::1 missing (IPv6 disabled on lo in the pod): serve IPv4 only.
                Err(e) if i > 0 && ipv6_unavailable(&e.source) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((proxy, udp, tcp))
    }
}

/// Port of the DNS proxy.
pub const DNS_PORT: u16 = 15053;

/// Upstream DNS sockets in the instance's namespace, marked so capture lets them through.
struct NetnsUpstream(SocketOptions);

impl UpstreamSockets for NetnsUpstream {
    fn udp(&self, upstream: SocketAddr) -> std::io::Result<tokio::net::UdpSocket> {
        let any =
            if upstream.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
        self.0.bind_udp(SocketAddr::new(any, 0), false)
    }

    fn tcp(&self, upstream: SocketAddr) -> BoxFuture<'_, std::io::Result<tokio::net::TcpStream>> {
        Box::pin(self.0.connect(upstream, None))
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
    matches!(e.raw_os_error(), Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL) | Some(libc::EINVAL))
}

/// Dials the outbound pool's HBONE connections in the instance's namespace; each holds a
/// descriptor of the data plane's budget for as long as it is open.
struct PoolDialer {
    sockets: SocketOptions,
    fds: crate::limits::FdBudget,
}

impl Dialer for PoolDialer {
    fn dial(&self, dst: SocketAddr) -> BoxFuture<'_, std::io::Result<Dialed>> {
        Box::pin(async move {
            let permit = self.fds.try_acquire(1).ok_or_else(|| {
                std::io::Error::other(
                    "the proxy holds its whole descriptor budget (RLIMIT_NOFILE minus AMBIT_FD_RESERVE)",
                )
            })?;
            let tcp = self.sockets.connect(dst, None).await?;
            Ok(Dialed { tcp, guard: Box::new(permit) })
        })
    }
}
