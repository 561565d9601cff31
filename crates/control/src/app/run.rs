//! Wiring: sources → translation → published xDS resources; the CA; the servers.
//!
//! Threads: a multi-threaded tokio runtime (`ambit-control`, two workers) serves gRPC (xDS and
//! the CA, TLS on 15012, plaintext on 15010 in local mode) and HTTP (monitoring on 15014,
//! readiness on 8080). The translation runs on a thread of its own (`ambit-translate`): it
//! owns the source and the translator, polls, translates, and publishes into the xDS server's
//! resource set, so a large batch (a relist of 100 000 pods) never stalls the servers. Debug
//! requests for the translated objects are answered by that thread between batches.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock, mpsc};
use std::time::{Duration, Instant};

use ambit_admin::Readiness;
use ambit_api::type_url::{ADDRESS, AUTHORIZATION, WAYPOINT_DESTINATION, WAYPOINT_POLICY};
use ambit_api::xds::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use ambit_identity::{Identity, KeyAlgorithm, TtlPolicy};
use ambit_objects::file::FileSource;
use ambit_objects::kube::KubeSource;
use ambit_objects::{Change, Filter, Kind, Object, ObjectKey, Source};
use ambit_xds::server::istio::NodeCheck;
use ambit_xds::server::{AdsServer, Hooks, Principal, ServerConfig, ServerMetrics};
use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use tonic::Status;

use super::args::ControlArgs;
use super::debug::{self, DebugRequest};
use super::publish::{self, Publisher};
use crate::auth::{
    AuthChain, AuthRequest, Authenticate, KubeJwtAuthenticator, KubeJwtConfig, KubeTokenReviewer,
};
use crate::auth::{CatchUp, NodeAuthorizer, NodeTokens, PodIndex, PodInfo, TrustedNodeAccounts};
use crate::ca::CaService;
use crate::ca::material::{self, MaterialConfig};
use crate::pods::NodePods;
use crate::tls::{self, ServeSettings};
use crate::translate::{Settings, Translator};

/// Why `ambit control` stopped.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A setting is wrong.
    #[error("{0}")]
    Config(String),
    /// The CA key material is unusable.
    #[error(transparent)]
    Material(#[from] material::MaterialError),
    /// The serving certificate or TLS configuration failed.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// What the listener serves.
        what: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// A file the control plane writes failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The node tokens could not be written.
    #[error(transparent)]
    Tokens(#[from] crate::auth::NodeTokenError),
    /// The Kubernetes API is unusable.
    #[error("Kubernetes: {0}")]
    Kube(String),
    /// The runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

/// Runs `ambit control` until SIGTERM or SIGINT.
pub fn run(args: ControlArgs) -> Result<(), ControlError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ambit-control")
        .enable_all()
        .build()
        .map_err(ControlError::Runtime)?;
    rt.block_on(serve(args))
}

/// The translation settings of `args`.
pub fn settings(args: &ControlArgs) -> Settings {
    Settings {
        cluster_id: args.cluster_id.clone(),
        domain_suffix: args.domain.clone(),
        root_namespace: args.root_namespace.clone(),
        trust_domain: args.trust_domain.clone(),
        system_namespace: args.namespace.clone(),
        revision: Some(args.revision.clone()).filter(|r| !r.is_empty() && r != "default"),
    }
}

async fn serve(args: ControlArgs) -> Result<(), ControlError> {
    let local = args.config.is_some();
    if !local && args.grpc_addr.0.is_some() && std::env::var_os("AMBIT_GRPC_ADDR").is_some() {
        return Err(ControlError::Config(
            "AMBIT_GRPC_ADDR (--grpc-addr, plaintext xDS without authentication) is for local mode \
             (--config) only; with the Kubernetes source proxies use the TLS port"
                .into(),
        ));
    }
    let readiness = Readiness::new("reading the objects");
    let mut registry = Registry::default();

    // Readiness first, so a probe always gets an answer.
    if let Some(addr) = args.http_addr.0 {
        let listener = bind(addr, "readiness")?;
        let r = readiness.clone();
        tokio::spawn(ambit_admin::serve(listener, move |req| {
            let r = r.clone();
            async move { ready(&req, &r) }
        }));
    }

    // CA key material, then the mesh root bundle for local proxies.
    let (authority, source) = material::load(&MaterialConfig {
        cacerts_dir: args.root_ca_dir.clone(),
        state_dir: Some(args.state_dir.join("ca")),
        trust_domain: args.trust_domain.clone(),
        algorithm: KeyAlgorithm::EcdsaP256,
    })?;
    tracing::info!(?source, "CA key material");
    let authority = Arc::new(authority);
    if local {
        write_file(&args.state_dir.join("root-cert.pem"), authority.root_bundle_pem().as_bytes())?;
    }

    // The source, and its first full state.
    let (mut source, kube_client) = open_source(&args, &readiness).await?;
    let mut first = Vec::new();
    let sync_started = Instant::now();
    loop {
        first.extend(source.source().poll());
        if source.source().is_synced() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pods = Arc::new(RwLock::new(NodePods::default()));
    pods.write().unwrap_or_else(PoisonError::into_inner).apply(&first);
    let (pod_updates, pod_updates_rx) = tokio::sync::watch::channel(0u64);

    // Authentication: client certificates, then node tokens (local) or Kubernetes tokens.
    let node_identity: Identity = format!("spiffe://{}/ns/{}/sa/ztunnel", args.trust_domain, args.namespace)
        .parse()
        .map_err(|e| ControlError::Config(format!("node proxy identity: {e}")))?;
    let mut chain = AuthChain::new().with_client_certificates();
    let tokens = if local {
        let nodes = first.iter().filter_map(|c| match c {
            Change::Upsert(o @ Object::Node(_)) => o.metadata().name.clone(),
            _ => None,
        });
        let tokens = Arc::new(NodeTokens::create(&args.state_dir.join("tokens"), nodes, &node_identity)?);
        chain = chain.with_node_tokens(tokens.clone());
        Some(tokens)
    } else {
        None
    };
    let status = kube_client
        .as_ref()
        .filter(|_| args.ambient_enable_status)
        .map(|client| super::status::StatusWriter::spawn(client.clone()));
    let waypoints = kube_client.as_ref().map(|client| {
        let settings = super::waypoints::WaypointSettings {
            image: args.waypoint_image.clone().filter(|i| !i.is_empty()),
            control_address: args
                .waypoint_control_address
                .clone()
                .unwrap_or_else(|| format!("ambit-control.{}.svc:15012", args.namespace)),
            domain: args.domain.clone(),
            root_pem: authority.root_bundle_pem().to_owned(),
        };
        super::waypoints::WaypointDeployer::spawn(client.clone(), settings)
    });
    if let Some(client) = kube_client {
        let reviewer = Arc::new(KubeTokenReviewer::new(client));
        let cfg = KubeJwtConfig {
            audiences: split(&args.token_audiences),
            trust_domain: args.trust_domain.clone(),
            cluster_id: args.cluster_id.clone(),
            cluster_aliases: Vec::new(),
        };
        chain = chain.with_kubernetes(Arc::new(KubeJwtAuthenticator::new(reviewer, cfg)));
    }
    let chain = Arc::new(chain);

    // The CA.
    let trusted = args.trusted_node_accounts.clone().unwrap_or_else(|| format!("{}/ztunnel", args.namespace));
    let trusted: TrustedNodeAccounts =
        trusted.parse().map_err(|e: crate::auth::TrustedNodeAccountsError| ControlError::Config(e.0))?;
    let catch_up = CatchUp { max_wait: args.ca_pod_wait, ..CatchUp::default() };
    let authorizer = Arc::new(
        NodeAuthorizer::new(trusted, Arc::new(SharedPods(pods.clone())), &args.trust_domain)
            .with_catch_up(pod_updates_rx, catch_up),
    );
    let ttl = TtlPolicy { default_ttl: args.default_cert_ttl, max_ttl: args.max_cert_ttl };
    let ca = CaService::new(authority.clone(), chain.clone(), Some(authorizer), ttl);
    ca.metrics().register(&mut registry);

    // xDS. The waypoint types are scoped: a stream receives only the resources of its verified
    // identity's `<namespace>/<service account>` (`NodeCheck::scope`), i.e. a waypoint only its
    // own Gateway's.
    let resources = publish::resources();
    let cfg = ServerConfig {
        debounce_after: args.debounce_after,
        debounce_max: args.debounce_max,
        new_streams_per_second: args.max_requests_per_second,
        ready: false,
        ..ServerConfig::default()
    };
    let xds_metrics = ServerMetrics::register(&mut registry);
    let secure_ads = AdsServer::new(
        resources.clone(),
        cfg.clone(),
        Hooks {
            authenticate: Some(Arc::new(XdsAuth(chain.clone()))),
            authorize: Some(Arc::new(NodeCheck::default())),
            metrics: xds_metrics.clone(),
        },
    );
    let plain_ads = AdsServer::new(
        resources.clone(),
        cfg,
        Hooks { authenticate: None, authorize: Some(Arc::new(NodeCheck::default())), metrics: xds_metrics },
    );

    // The translation thread: the first state now, then every change.
    let translator = Translator::new(settings(&args));
    let (debug_tx, debug_rx) = mpsc::channel::<DebugRequest>();
    let publisher = Publisher::new(resources.clone());
    let file_errors = Arc::new(Mutex::new(Vec::new()));
    let mut worker = Worker {
        translator,
        publisher,
        pods: pods.clone(),
        pod_updates,
        tokens,
        debug: debug_rx,
        poll: args.config_poll,
        file_errors: file_errors.clone(),
        status,
        waypoints,
    };
    worker.apply(first);
    tracing::info!(
        addresses = resources.len(ADDRESS),
        authorizations = resources.len(AUTHORIZATION),
        waypoint_destinations = resources.len(WAYPOINT_DESTINATION),
        waypoint_policies = resources.len(WAYPOINT_POLICY),
        took = ?sync_started.elapsed(),
        "initial state translated"
    );
    std::thread::Builder::new()
        .name("ambit-translate".into())
        .spawn(move || worker.run(source))
        .map_err(ControlError::Runtime)?;

    // Servers.
    let max_recv = args.max_recv_message_size;
    let settings = ServeSettings::default();
    let mut servers = tokio::task::JoinSet::new();
    if let Some(addr) = args.secure_grpc_addr.0 {
        let names = tls::serving_names(
            &args.namespace,
            Some(&args.revision),
            &format!("istiod.{}.svc", args.namespace),
            &split(args.custom_host.as_deref().unwrap_or_default()),
        );
        let tls_cfg = tls::server_config(&authority, &names)?;
        let mut routes = tonic::service::RoutesBuilder::default();
        routes.add_service(
            AggregatedDiscoveryServiceServer::new(secure_ads.clone()).max_decoding_message_size(max_recv),
        );
        routes.add_service(ca.into_server());
        let listener = bind(addr, "gRPC TLS (xDS and CA)")?;
        tracing::info!(%addr, ?names, "serving xDS and the CA over TLS");
        let s = settings.clone();
        servers.spawn(async move {
            tls::serve(routes.routes(), listener, Some(tls_cfg), &s, std::future::pending()).await
        });
    }
    if let Some(addr) = args.grpc_addr.0.filter(|_| local) {
        let mut routes = tonic::service::RoutesBuilder::default();
        routes.add_service(
            AggregatedDiscoveryServiceServer::new(plain_ads.clone()).max_decoding_message_size(max_recv),
        );
        let listener = bind(addr, "gRPC plaintext (xDS)")?;
        tracing::info!(%addr, "serving xDS in plaintext (local mode)");
        let s = settings.clone();
        servers.spawn(async move {
            tls::serve(routes.routes(), listener, None, &s, std::future::pending()).await
        });
    }
    if let Some(addr) = args.monitoring_addr.0 {
        let listener = bind(addr, "monitoring")?;
        let ctx = Arc::new(debug::Ctx {
            registry,
            streams: vec![secure_ads.clone(), plain_ads.clone()],
            resources: resources.clone(),
            translate: Mutex::new(debug_tx),
            file_errors,
        });
        tokio::spawn(ambit_admin::serve(listener, move |req| {
            let ctx = ctx.clone();
            async move { debug::handle(req, &ctx).await }
        }));
    }

    // Serving: now ready.
    secure_ads.set_ready(true);
    plain_ads.set_ready(true);
    readiness.ready();
    tracing::info!(took = ?sync_started.elapsed(), "ready");

    tokio::select! {
        Some(done) = servers.join_next() => match done {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(ControlError::Config(format!("a server task failed: {e}"))),
        },
        _ = ambit_admin::shutdown_signal() => {
            tracing::info!("shutting down");
            Ok(())
        }
    }
}

/// The source of `args`: the YAML folder (local mode) or the Kubernetes API (synced before
/// this returns, or the error naming what is missing).
async fn open_source(
    args: &ControlArgs,
    readiness: &Readiness,
) -> Result<(Objects, Option<kube::Client>), ControlError> {
    if let Some(dir) = &args.config {
        if !dir.is_dir() {
            return Err(ControlError::Config(format!(
                "the config folder {} does not exist (or is not a folder)",
                dir.display()
            )));
        }
        let mut s = FileSource::new(dir, Filter::all());
        if let Some(c) = &args.capture_state_dir {
            s = s.with_capture_state(c);
        }
        return Ok((Objects::Files(Box::new(s)), None));
    }
    let client = kube::Client::try_default().await.map_err(|e| {
        ControlError::Kube(format!(
            "no Kubernetes client configuration ({e}); run in a pod, set KUBECONFIG, or use --config for local mode"
        ))
    })?;
    let source = KubeSource::start(client.clone(), &Filter::all(), None);
    source
        .synced(args.kube_sync_timeout, |why| readiness.not_ready(why))
        .await
        .map_err(|e| ControlError::Kube(e.to_string()))?;
    Ok((Objects::Kube(source), Some(client)))
}

/// Where the objects come from.
enum Objects {
    /// Local mode.
    Files(Box<FileSource>),
    /// The Kubernetes API.
    Kube(KubeSource),
}

impl Objects {
    fn source(&mut self) -> &mut dyn Source {
        match self {
            Objects::Files(s) => s.as_mut(),
            Objects::Kube(s) => s,
        }
    }
}

/// Owns the source and the translation; publishes every batch.
struct Worker {
    translator: Translator,
    publisher: Publisher,
    pods: Arc<RwLock<NodePods>>,
    /// Bumped after each batch that changed a pod (node authorization waits on it).
    pod_updates: tokio::sync::watch::Sender<u64>,
    tokens: Option<Arc<NodeTokens>>,
    debug: mpsc::Receiver<DebugRequest>,
    poll: Duration,
    file_errors: Arc<Mutex<Vec<String>>>,
    /// Writes the policies' status conditions (Kubernetes source).
    status: Option<super::status::StatusWriter>,
    /// Deploys the waypoint Gateways (Kubernetes source).
    waypoints: Option<super::waypoints::WaypointDeployer>,
}

impl Worker {
    fn run(mut self, mut objects: Objects) {
        let mut reported = Vec::new();
        loop {
            let changes = objects.source().poll();
            if !changes.is_empty() {
                self.apply(changes);
            }
            if let Objects::Files(files) = &objects {
                report_file_errors(files, &mut reported, &self.file_errors);
            }
            let deadline = Instant::now() + self.poll;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match self.debug.recv_timeout(left) {
                    Ok(req) => req.answer(&self.translator),
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                    Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(left),
                }
            }
        }
    }

    fn apply(&mut self, changes: Vec<Change>) {
        let started = Instant::now();
        self.pods.write().unwrap_or_else(PoisonError::into_inner).apply(&changes);
        let pod_changed = |c: &Change| {
            matches!(c, Change::Upsert(Object::Pod(_)) | Change::Delete(ObjectKey { kind: Kind::Pod, .. }))
        };
        if changes.iter().any(pod_changed) {
            self.pod_updates.send_modify(|g| *g = g.wrapping_add(1));
        }
        if let Some(tokens) = &self.tokens {
            for c in &changes {
                if let Change::Upsert(o @ Object::Node(_)) = c
                    && let Some(name) = &o.metadata().name
                    && let Err(e) = tokens.add(name)
                {
                    tracing::warn!("no token for node {name}: {e}");
                }
            }
        }
        let n = changes.len();
        let policy_changed = changes.iter().any(|c| match c {
            Change::Upsert(o) => o.kind() == Kind::AuthorizationPolicy,
            Change::Delete(key) => key.kind == Kind::AuthorizationPolicy,
        });
        let gateway_changed = changes.iter().any(|c| match c {
            Change::Upsert(o) => o.kind() == Kind::Gateway,
            Change::Delete(key) => key.kind == Kind::Gateway,
        });
        let out = self.translator.apply(changes);
        if policy_changed && let Some(status) = &self.status {
            status.want(self.translator.ztunnel_conditions());
        }
        if gateway_changed && let Some(waypoints) = &self.waypoints {
            let gateways = self.translator.gateways().filter_map(super::waypoints::WantedGateway::of);
            waypoints.want(gateways);
        }
        let (addresses, authorizations) = (out.addresses.len(), out.authorizations.len());
        let (destinations, policies) = (out.destinations.len(), out.policies.len());
        self.publisher.publish(&self.translator, out);
        tracing::debug!(
            changes = n,
            addresses,
            authorizations,
            destinations,
            policies,
            took = ?started.elapsed(),
            "translated"
        );
    }
}

/// Logs each file error once (when it appears; and when it is gone), and keeps the current
/// list for `/debug/config_errors`.
fn report_file_errors(files: &FileSource, reported: &mut Vec<String>, shown: &Mutex<Vec<String>>) {
    let now: Vec<String> = files.errors().iter().map(ToString::to_string).collect();
    if now == *reported {
        return;
    }
    for e in now.iter().filter(|e| !reported.contains(e)) {
        tracing::warn!("{e} (the objects it held before stay in effect)");
    }
    for e in reported.iter().filter(|e| !now.contains(e)) {
        tracing::info!("resolved: {e}");
    }
    (*shown.lock().unwrap_or_else(PoisonError::into_inner)).clone_from(&now);
    *reported = now;
}

/// Node authorization's view of the pods.
struct SharedPods(Arc<RwLock<NodePods>>);

impl PodIndex for SharedPods {
    fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        let pods = self.0.read().unwrap_or_else(PoisonError::into_inner);
        pods.pod(namespace, name).map(|p| PodInfo {
            uid: p.uid.clone(),
            service_account: p.service_account.clone(),
            node: p.node.clone(),
        })
    }

    fn has_pod_on_node(&self, namespace: &str, service_account: &str, node: &str) -> bool {
        self.0.read().unwrap_or_else(PoisonError::into_inner).has_pod_on(namespace, service_account, node)
    }
}

/// The authentication chain as the xDS server asks for it.
struct XdsAuth(Arc<AuthChain>);

impl ambit_xds::server::Authenticate for XdsAuth {
    fn authenticate<'a>(&'a self, req: &'a tonic::Request<()>) -> BoxFuture<'a, Result<Principal, Status>> {
        Box::pin(async move {
            match self.0.authenticate(AuthRequest::of(req)).await {
                Ok(caller) => {
                    let identities: Vec<Identity> =
                        caller.identities.iter().filter_map(|i| i.parse().ok()).collect();
                    Ok(Principal { name: caller.identities.first().cloned().unwrap_or_default(), identities })
                }
                Err(e) => {
                    tracing::info!("xDS: refused an unauthenticated stream: {e}");
                    Err(Status::unauthenticated("authentication failure"))
                }
            }
        })
    }
}

fn ready(req: &http::Request<hyper::body::Incoming>, r: &Readiness) -> http::Response<ambit_admin::Body> {
    use http::StatusCode;
    match req.uri().path() {
        "/ready" | "/readyz" => match r.reason() {
            None => ambit_admin::text(StatusCode::OK, "ready\n"),
            Some(why) => ambit_admin::text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
        },
        "/healthz" => ambit_admin::text(StatusCode::OK, "ok\n"),
        _ => ambit_admin::text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn bind(addr: std::net::SocketAddr, what: &'static str) -> Result<tokio::net::TcpListener, ControlError> {
    ambit_admin::bind(addr).map_err(|source| ControlError::Bind { what, addr, source })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ControlError> {
    let err = |source| ControlError::Write { path: path.to_owned(), source };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    ambit_admin::write_atomic(path, bytes).map_err(err)
}

fn split(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()
}
