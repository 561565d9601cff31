//! Test helpers (never shipped): an in-process HBONE echo server and a pool that trusts it.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ambit_identity::{CertManager, CertSigner, FakeCa, Identity};
use bytes::Bytes;
use tokio::net::TcpListener;

use crate::drain::Drain;
use crate::hbone::pool::{Pool, PoolKey, Tunnel};
use crate::hbone::{H2Settings, server};
use crate::limits::{LimitMetrics, PeerConn, Peers, Refusal};
use crate::socket::SocketOptions;

/// The proxy's default configuration (shared mode, no state file read).
pub fn config() -> crate::config::Config {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: crate::config::ProxyArgs,
    }
    let cli = Cli::try_parse_from([
        "proxy",
        "--local-xds-path",
        "/dev/null",
        "--xds-address",
        "",
        "--fake-ca",
        "true",
    ])
    .expect("default arguments parse");
    crate::config::Config::from_args_env(&cli.args, &crate::config::Env::new())
        .expect("default configuration is valid")
}

/// ztunnel's default HTTP/2 settings.
pub fn settings() -> H2Settings {
    H2Settings {
        window_size: 4 << 20,
        connection_window_size: 16 << 20,
        frame_size: 1 << 20,
        max_streams: 100,
    }
}

/// An HBONE server on 127.0.0.1 that answers every CONNECT with 200 and echoes the stream.
pub struct EchoServer {
    /// Listening address.
    pub addr: SocketAddr,
    /// The server's identity.
    pub identity: Identity,
    /// Drain signal of every connection the server accepted.
    pub drain: Drain,
    /// TCP connections accepted so far.
    pub accepted: Arc<std::sync::atomic::AtomicUsize>,
}

impl EchoServer {
    /// Starts the server with a certificate from `ca`.
    pub async fn start(ca: &FakeCa, settings: H2Settings) -> EchoServer {
        let identity = Identity::new("cluster.local", "default", "server");
        let cert = ca.issue(&identity, Duration::from_secs(3600)).expect("test CA issues");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let config = cert.server_config();
        let drain = Drain::new();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (d, n) = (drain.clone(), accepted.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = tcp.set_nodelay(true);
                let (config, d) = (config.clone(), d.clone());
                tokio::spawn(async move {
                    let Ok(tls) = crate::hbone::tls::accept(&tcp, config).await else {
                        return;
                    };
                    let Ok(peer) = unlimited_peer(settings) else { return };
                    let cfg = server::ServerConfig::new(settings);
                    let _ =
                        server::serve(tcp, tls, cfg, peer, LimitMetrics::default(), d, |req| async move {
                            let stream = req.stream;
                            if stream.respond(200, &http::HeaderMap::new(), false).is_err() {
                                return;
                            }
                            while let Some(Ok(chunk)) = stream.recv().await {
                                if stream.send(&chunk).await.is_err() {
                                    return;
                                }
                            }
                            let _ = stream.finish();
                        })
                        .await;
                });
            }
        });
        EchoServer { addr, identity, drain, accepted }
    }
}

/// An HBONE server on 127.0.0.1 that relays every CONNECT stream to a TCP app through the
/// proxy's own copy loop ([`crate::copy::bidirectional`]), as the inbound handler does.
pub struct RelayServer {
    /// Listening address of the HBONE side.
    pub addr: SocketAddr,
    /// The server's identity.
    pub identity: Identity,
    /// Relays running now.
    pub relays: Arc<std::sync::atomic::AtomicUsize>,
    /// How each connection's `serve` ended, in order.
    pub ended: Arc<std::sync::Mutex<Vec<Result<server::Ended, String>>>>,
}

impl RelayServer {
    /// Starts the relay and a TCP echo app, with default deadlines and no per-peer caps.
    pub async fn start(ca: &FakeCa, settings: H2Settings) -> RelayServer {
        let echo_addr = echo_app().await;
        let peers = Peers::unlimited(settings.window_size, settings.connection_window_size);
        RelayServer::start_with(ca, server::ServerConfig::new(settings), peers, echo_addr).await
    }

    /// Starts the relay to `app` with deadlines `cfg` and the caps of `peers`.
    pub async fn start_with(
        ca: &FakeCa,
        cfg: server::ServerConfig,
        peers: Peers,
        app: SocketAddr,
    ) -> RelayServer {
        let identity = Identity::new("cluster.local", "default", "server");
        let cert = ca.issue(&identity, Duration::from_secs(3600)).expect("test CA issues");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let config = cert.server_config();
        let relays = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ended = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (relays2, ended2) = (relays.clone(), ended.clone());
        tokio::spawn(async move {
            while let Ok((tcp, client)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                let (config, peers, relays, ended) =
                    (config.clone(), peers.clone(), relays2.clone(), ended2.clone());
                tokio::spawn(async move {
                    let Ok(peer) = peers.connect(client.ip()) else { return };
                    let Ok(tls) = crate::hbone::tls::accept(&tcp, config).await else {
                        return;
                    };
                    let r = server::serve(
                        tcp,
                        tls,
                        cfg,
                        peer,
                        LimitMetrics::default(),
                        Drain::new(),
                        move |req| {
                            let relays = relays.clone();
                            async move {
                                let Ok(app) = tokio::net::TcpStream::connect(app).await else {
                                    return;
                                };
                                let _ = app.set_nodelay(true);
                                if req.stream.respond(200, &http::HeaderMap::new(), false).is_err() {
                                    return;
                                }
                                relays.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                                let counters = Arc::new(crate::copy::LiveCounters::default());
                                let _ = req.stream.relay(app, counters, true).await;
                                relays.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                            }
                        },
                    )
                    .await;
                    ended.lock().unwrap_or_else(|p| p.into_inner()).push(r.map_err(|e| e.to_string()));
                });
            }
        });
        RelayServer { addr, identity, relays, ended }
    }
}

/// A TCP app on 127.0.0.1 that echoes every connection until it ends.
pub async fn echo_app() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind echo app");
    let addr = l.local_addr().expect("echo addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A TLS connection to an HBONE server at `addr` (presenting `server`), with a certificate for
/// `default/client` from `ca`, through tokio-rustls: for hand-built HBONE clients (the `h2`
/// crate's, in interoperability tests).
pub async fn tls_client(
    ca: &FakeCa,
    addr: SocketAddr,
    server: &Identity,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let client = Identity::new("cluster.local", "default", "client");
    let cert = ca.issue(&client, Duration::from_secs(3600)).map_err(std::io::Error::other)?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    tokio_rustls::TlsConnector::from(cert.client_config(std::slice::from_ref(server)))
        .connect(rustls_pki_types::ServerName::IpAddress(addr.ip().into()), tcp)
        .await
}

/// A pool whose certificates come from `ca`, and the key to reach `server` as `client`.
pub fn pool_for(ca: Arc<FakeCa>, server: &EchoServer, settings: H2Settings) -> (Arc<Pool>, PoolKey) {
    pool_to(ca, server.addr, &server.identity, settings)
}

/// A pool whose certificates come from `ca`, and the key to reach the HBONE server at `addr`
/// (presenting `identity`) as `client`.
pub fn pool_to(
    ca: Arc<FakeCa>,
    addr: SocketAddr,
    identity: &Identity,
    settings: H2Settings,
) -> (Arc<Pool>, PoolKey) {
    let signer: Arc<dyn CertSigner> = ca;
    let certs = CertManager::new(signer, Duration::from_secs(3600));
    let sockets = SocketOptions::default();
    let pool =
        Pool::new(certs, sockets, settings, Duration::from_secs(300), crate::limits::FdBudget::unlimited());
    let key = PoolKey {
        src_identity: Identity::new("cluster.local", "default", "client"),
        dst_identities: vec![identity.clone()],
        dst: addr,
        src_ip: Ipv4Addr::LOCALHOST.into(),
    };
    (pool, key)
}

/// A peer connection with the windows of `settings` and no caps.
pub fn unlimited_peer(settings: H2Settings) -> Result<PeerConn, Refusal> {
    Peers::unlimited(settings.window_size, settings.connection_window_size)
        .connect(Ipv4Addr::LOCALHOST.into())
}

/// Sends a whole chunk on an `h2` stream, waiting for flow-control capacity (for tests that
/// speak to the proxy through the `h2` crate).
pub async fn send_all(send: &mut h2::SendStream<Bytes>, mut chunk: Bytes) -> Result<(), h2::Error> {
    while !chunk.is_empty() {
        send.reserve_capacity(chunk.len());
        let n = match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(n)) => n,
            Some(Err(e)) => return Err(e),
            None => return Err(h2::Error::from(h2::Reason::CANCEL)),
        };
        let part = chunk.split_to(n.min(chunk.len()));
        send.send_data(part, false)?;
    }
    Ok(())
}

/// Sends `payload` through the tunnel and reads the same number of bytes back.
pub async fn echo_once(t: &mut Tunnel, payload: &Bytes) {
    t.stream.send(payload).await.expect("send");
    let mut got = 0;
    while got < payload.len() {
        let chunk = t.stream.recv().await.expect("stream open").expect("data");
        got += chunk.len();
    }
}

// ---- xDS: a local config served as xDS resources (tests and benchmarks) ----

/// An `Any` holding `msg` under `type_url`.
pub fn any<M: prost::Message>(type_url: &str, msg: &M) -> prost_types::Any {
    prost_types::Any { type_url: type_url.to_owned(), value: msg.encode_to_vec() }
}

/// The `Address` resources istiod would serve for these workloads and services: a workload by
/// uid with its addresses as aliases (`network/ip`), a service by `ns/hostname` with its VIPs as
/// aliases and its member workloads sent along.
pub fn address_resources(
    workloads: &[crate::state::Workload],
    services: &[crate::state::Service],
) -> Vec<ambit_xds::server::ServerResource> {
    use ambit_api::workload as pb;
    let mut members: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
    for w in workloads {
        for key in w.services.keys() {
            members.entry(key.clone()).or_default().push(w.uid.clone());
        }
    }
    let mut out = Vec::with_capacity(workloads.len() + services.len());
    for w in workloads {
        let address = pb::Address { r#type: Some(pb::address::Type::Workload(w.into())) };
        out.push(ambit_xds::server::ServerResource {
            name: w.uid.clone(),
            aliases: w.workload_ips.iter().map(|ip| format!("{}/{ip}", w.network)).collect(),
            resource: any(ambit_api::type_url::ADDRESS, &address),
            also: Vec::new(),
            node: None,
        });
    }
    for s in services {
        let address = pb::Address { r#type: Some(pb::address::Type::Service(s.into())) };
        out.push(ambit_xds::server::ServerResource {
            name: s.key(),
            aliases: s.vips.iter().map(|v| format!("{}/{}", v.network, v.address)).collect(),
            resource: any(ambit_api::type_url::ADDRESS, &address),
            also: members.remove(&s.key()).unwrap_or_default(),
            node: None,
        });
    }
    out
}

/// The `Authorization` resources for these policies, by `ns/name`.
pub fn authorization_resources(
    policies: &[crate::authz::Authorization],
) -> Vec<ambit_xds::server::ServerResource> {
    policies
        .iter()
        .map(|p| ambit_xds::server::ServerResource {
            name: p.key(),
            aliases: Vec::new(),
            resource: any(ambit_api::type_url::AUTHORIZATION, &ambit_api::security::Authorization::from(p)),
            also: Vec::new(),
            node: None,
        })
        .collect()
}

/// What a test xDS server serving local configs has published: turns each new config into the
/// changes to publish (everything in it as upserts — an unchanged resource is no change to
/// `ambit_xds::server::Resources` — and the names that vanished as removals).
#[derive(Debug, Default)]
pub struct ServedConfig {
    addresses: std::collections::BTreeSet<String>,
    policies: std::collections::BTreeSet<String>,
}

impl ServedConfig {
    /// The changes that take the server from the last config to `cfg`.
    pub fn changes(&mut self, cfg: &crate::state::LocalConfig) -> Vec<ambit_xds::server::Changes> {
        let addresses = address_resources(&cfg.workloads, &cfg.services);
        let policies = authorization_resources(&cfg.policies);
        let names = |r: &[ambit_xds::server::ServerResource]| {
            r.iter().map(|r| r.name.clone()).collect::<std::collections::BTreeSet<_>>()
        };
        let (new_addresses, new_policies) = (names(&addresses), names(&policies));
        let removed_addresses = self.addresses.difference(&new_addresses).cloned().collect();
        let removed_policies = self.policies.difference(&new_policies).cloned().collect();
        self.addresses = new_addresses;
        self.policies = new_policies;
        vec![
            ambit_xds::server::Changes {
                type_url: ambit_api::type_url::ADDRESS.to_owned(),
                upserts: addresses,
                removals: removed_addresses,
            },
            ambit_xds::server::Changes {
                type_url: ambit_api::type_url::AUTHORIZATION.to_owned(),
                upserts: policies,
                removals: removed_policies,
            },
        ]
    }
}

/// A generated mesh for benchmarks and tests: `n` workloads of the shape istiod sends (every
/// field a pod has set, one IPv4 address, HBONE, a listed policy, locality).
pub mod generated {
    use std::collections::BTreeMap;
    use std::net::{IpAddr, Ipv4Addr};

    use crate::authz::{Action, Authorization, Scope};
    use crate::state::{
        HealthStatus, LocalConfig, Locality, NetworkAddress, NetworkMode, Protocol, Service, Visibility,
        Workload,
    };

    /// The node the benchmarked proxy runs on (1 workload in 1 000 is on it).
    pub const NODE: &str = "node-7";

    pub fn workload_ip(i: usize) -> IpAddr {
        Ipv4Addr::from(0x0a00_0000u32 + i as u32 + 1).into()
    }

    /// Workload `i`, an endpoint of service `i / 10`.
    pub fn workload(i: usize) -> Workload {
        workload_of(i, i / 10)
    }

    /// Workload `i`, an endpoint of service `svc` (in that service's namespace).
    pub fn workload_of(i: usize, svc: usize) -> Workload {
        let ns = svc % 100;
        let mut services = BTreeMap::new();
        services.insert(format!("ns{ns}/app-{svc}.ns{ns}.svc.cluster.local"), BTreeMap::from([(80, 8080)]));
        Workload {
            uid: format!("cluster1//v1/Pod/ns{ns}/app-{svc}-5d9c7b8f4-{i}"),
            name: format!("app-{svc}-5d9c7b8f4-{i}"),
            namespace: format!("ns{ns}"),
            workload_ips: vec![workload_ip(i)],
            protocol: Protocol::Hbone,
            trust_domain: "cluster.local".into(),
            service_account: format!("app-{svc}"),
            network: String::new(),
            waypoint: None,
            network_gateway: None,
            node: format!("node-{}", i % 1000),
            canonical_name: format!("app-{svc}"),
            canonical_revision: "v1".into(),
            workload_name: format!("app-{svc}"),
            workload_type: "deployment".into(),
            cluster_id: "cluster1".into(),
            authorization_policies: vec![format!("ns{ns}/allow-app-{ns}")],
            status: HealthStatus::Healthy,
            locality: Locality {
                region: "eu-west-1".into(),
                zone: "eu-west-1a".into(),
                subzone: String::new(),
            },
            capacity: 1,
            hostname: String::new(),
            network_mode: NetworkMode::Standard,
            native_tunnel: false,
            application_tunnel: None,
            services,
        }
    }

    /// Service `i`, in namespace `i % 100`, of workloads `10 i .. 10 i + 9`.
    pub fn service(i: usize) -> Service {
        let ns = i % 100;
        Service {
            name: format!("app-{i}"),
            namespace: format!("ns{ns}"),
            hostname: format!("app-{i}.ns{ns}.svc.cluster.local"),
            vips: vec![NetworkAddress {
                network: String::new(),
                address: Ipv4Addr::from(0x0b00_0000u32 + i as u32 + 1).into(),
            }],
            cidr_vips: vec![],
            ports: BTreeMap::from([(80, 8080)]),
            endpoints: Default::default(),
            subject_alt_names: vec![format!("spiffe://cluster.local/ns/ns{ns}/sa/app-{i}")],
            waypoint: None,
            weighted_waypoints: vec![],
            load_balancer: None,
            ip_families: None,
            canonical: false,
            visibility: Visibility::Public,
        }
    }

    pub fn policy(i: usize) -> Authorization {
        Authorization {
            name: format!("allow-app-{i}"),
            namespace: format!("ns{}", i % 100),
            scope: Scope::WorkloadSelector,
            action: Action::Allow,
            rules: vec![],
            dry_run: false,
        }
    }

    /// `workloads` workloads, `workloads / 10` services, 100 policies.
    pub fn mesh(workloads: usize) -> LocalConfig {
        LocalConfig {
            workloads: (0..workloads).map(workload).collect(),
            services: (0..workloads / 10).map(service).collect(),
            policies: (0..100).map(policy).collect(),
        }
    }

    /// `workloads` workloads spread round-robin over `services` services (at least one), 100
    /// policies.
    pub fn mesh_with(workloads: usize, services: usize) -> LocalConfig {
        let services = services.max(1);
        LocalConfig {
            workloads: (0..workloads).map(|i| workload_of(i, i % services)).collect(),
            services: (0..services).map(service).collect(),
            policies: (0..100).map(policy).collect(),
        }
    }
}
