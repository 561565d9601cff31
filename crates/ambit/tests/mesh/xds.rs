//! An xDS server for the end-to-end tests, built on `ambit-xds`: it serves the mesh's config file
//! (ztunnel's local-config YAML, the same file the file-based tests write) as `Address` and
//! `Authorization` resources and republishes what changed whenever the file changes. Optionally
//! TLS with a bearer token (as istiod's 15012) and the Istio CA service on the same port.
//!
//! Each run has its own runtime, so [`XdsServer::kill`] drops every connection at once, as a
//! killed process would; [`XdsServer::restart`] serves again on the same address with state read
//! afresh from the file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ambit_api::type_url::{ADDRESS, AUTHORIZATION};
use ambit_api::xds::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use ambit_xds::server::{AdsServer, Authenticate, Hooks, Principal, Resources, ServerConfig, StreamStatus};
use tonic::transport::{Identity, Server, ServerTlsConfig};

use super::super::common::Node;

/// What the server asks of its clients and serves besides xDS.
#[derive(Clone, Default)]
pub struct XdsOptions {
    /// TLS certificate and key (PEM) of the server; plaintext when `None`.
    pub tls: Option<(String, String)>,
    /// Bearer token every stream must present (`Unauthenticated` otherwise).
    pub token: Option<String>,
    /// Serve the Istio CA API (`CreateCertificate`) on the same port, signing with this CA.
    pub ca: Option<Arc<ambit_identity::testing::TestCaService>>,
    /// Push debounce (default 10 ms).
    pub debounce: Option<Duration>,
}

/// A running (or killed) test xDS server.
pub struct XdsServer {
    /// Where it listens (inside the node's netns).
    pub addr: SocketAddr,
    config: PathBuf,
    node: Node,
    opts: XdsOptions,
    run: Option<Run>,
}

struct Run {
    rt: tokio::runtime::Runtime,
    ads: AdsServer,
    resources: Resources,
}

/// How often the config file is checked for changes.
const POLL: Duration = Duration::from_millis(50);

impl XdsServer {
    /// Serves `config` on `node`'s bridge address, port `port`.
    pub fn start(node: &Node, port: u16, config: PathBuf, opts: XdsOptions) -> XdsServer {
        let addr = SocketAddr::new(node.ip4.into(), port);
        let mut s = XdsServer { addr, config, node: node.clone(), opts, run: None };
        s.restart();
        s
    }

    /// `http://ip:port` or `https://ip:port`.
    pub fn url(&self) -> String {
        let scheme = if self.opts.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Drops the listener and every connection at once.
    pub fn kill(&mut self) {
        if let Some(run) = self.run.take() {
            run.rt.shutdown_background();
        }
    }

    /// Kills the server if it runs, then serves again on the same address from the file as it is now.
    pub fn restart(&mut self) {
        self.kill();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("xDS server runtime");
        let listener = self
            .node
            .run(|| std::net::TcpListener::bind(self.addr))
            .unwrap_or_else(|e| panic!("bind the test xDS server on {}: {e}", self.addr));
        listener.set_nonblocking(true).expect("nonblocking");
        let resources = Resources::new([ADDRESS, AUTHORIZATION]);
        let debounce = self.opts.debounce.unwrap_or(Duration::from_millis(10));
        let cfg = ServerConfig { debounce_after: debounce, ..ServerConfig::default() };
        let auth = self.opts.token.clone().map(|t| Arc::new(Token(t)) as Arc<dyn Authenticate>);
        let ads = AdsServer::new(resources.clone(), cfg, Hooks { authenticate: auth, ..Hooks::default() });
        let mut builder = Server::builder();
        if let Some((cert, key)) = &self.opts.tls {
            builder = builder
                .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
                .expect("server TLS config");
        }
        let mut router = builder.add_service(AggregatedDiscoveryServiceServer::new(ads.clone()));
        if let Some(ca) = &self.opts.ca {
            router = router.add_service(ca.server());
        }
        let config = self.config.clone();
        rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(e) = router.serve_with_incoming(incoming).await {
                eprintln!("test xDS server stopped: {e}");
            }
        });
        rt.spawn(watch(config, resources.clone()));
        self.run = Some(Run { rt, ads, resources });
    }

    /// Publishes resources beside the file's (what the file watcher did not publish, it never
    /// removes).
    pub fn publish(&self, changes: Vec<ambit_xds::server::Changes>) {
        let run = self.run.as_ref().expect("the server runs");
        run.resources.publish(changes).expect("both types are registered");
    }

    /// The open streams (node id, subscriptions, ACKs and NACKs).
    pub fn streams(&self) -> Vec<StreamStatus> {
        self.run.as_ref().map(|r| r.ads.status()).unwrap_or_default()
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Publishes the file's resources whenever its content changes (what vanished is removed).
async fn watch(config: PathBuf, resources: Resources) {
    let mut last_text: Option<String> = None;
    let mut served = ambit_proxy::testing::ServedConfig::default();
    loop {
        if let Ok(text) = tokio::fs::read_to_string(&config).await
            && last_text.as_deref() != Some(text.as_str())
        {
            match ambit_proxy::testing::LocalConfig::parse(&text) {
                Ok(cfg) => {
                    let changes = served.changes(&cfg);
                    resources.publish(changes).expect("both types are registered");
                }
                Err(e) => eprintln!("test xDS server: bad config file, keeping the last one: {e}"),
            }
            last_text = Some(text);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Accepts streams whose `authorization` is `Bearer <token>`.
struct Token(String);

impl Authenticate for Token {
    fn authenticate<'a>(
        &'a self,
        req: &'a tonic::Request<()>,
    ) -> ambit_xds::BoxFuture<'a, Result<Principal, tonic::Status>> {
        let expected = format!("Bearer {}", self.0);
        let outcome = match req.metadata().get("authorization").and_then(|v| v.to_str().ok()) {
            Some(v) if v == expected => {
                Ok(Principal { name: "test-token".to_owned(), identities: Vec::new() })
            }
            _ => Err(tonic::Status::unauthenticated("authentication failure")),
        };
        Box::pin(std::future::ready(outcome))
    }
}
