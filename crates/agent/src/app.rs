//! `ambit agent`: wires the sources, the mesh core, capture, the ZDS server, the CNI event
//! server, metrics and health into one process.
//!
//! Start-up order matters (node boot, agent restart): pods that must be in the mesh and are
//! already running are re-adopted (capture re-applied, recorded as enrolled) *before* the ZDS
//! socket accepts a proxy, so the proxy's first snapshot is complete and no pod loses its proxy;
//! the CNI event server starts next; readiness comes last.

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ambit_netns::Netns;
use ambit_redirect::{IptablesBackend, NftablesBackend, PodCapture, RuleBackend, Verification};
use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::enroll::{Enrollment, parse_selectors};
use crate::mesh::{Annotate, Capture, HostPaths, Mesh};
use crate::model::Pod;
use crate::source::FileSource;
use crate::zds::ZdsServer;

/// Command line and environment of `ambit agent` (istio-cni's names where they exist).
#[derive(Clone, Debug, clap::Args)]
pub struct AgentArgs {
    /// Local mode: read pods and namespaces from a folder of YAML Pod/Namespace objects (as
    /// `ambit up` writes them). Without it, the Kubernetes API (in-cluster config or
    /// KUBECONFIG) is watched.
    #[arg(long, env = "AMBIT_SOURCE_DIR")]
    pub source_dir: Option<PathBuf>,
    /// How often the source folder is checked for changes.
    #[arg(long, env = "AMBIT_SOURCE_POLL", default_value = "250ms", value_parser = parse_millis)]
    pub source_poll: Duration,
    /// How often every enrolled pod's capture (rules, routing, net.ipv4.tcp_migrate_req) is
    /// verified; what drifted is re-applied and logged.
    #[arg(long, env = "AMBIT_CAPTURE_VERIFY_INTERVAL", default_value = "30s", value_parser = parse_millis)]
    pub capture_verify_interval: Duration,
    /// This node's name: only its pods are handled.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Directory of the plugin event socket (`pluginevent.sock`).
    #[arg(long, env = "CNI_AGENT_RUN_DIR", default_value = "/var/run/ambit")]
    pub run_dir: PathBuf,
    /// ZDS socket the node proxy connects to.
    #[arg(long, env = "ZTUNNEL_UDS_ADDRESS", default_value = "/var/run/ztunnel/ztunnel.sock")]
    pub zds_socket: PathBuf,
    /// Namespaces never enrolled (comma separated).
    #[arg(long, env = "EXCLUDE_NAMESPACES", default_value = "kube-system")]
    pub exclude_namespaces: String,
    /// Enablement selectors (JSON list of {podSelector, namespaceSelector}); default: Istio's
    /// (pod or namespace label istio.io/dataplane-mode=ambient, pod opt-out =none).
    #[arg(long, env = "AMBIENT_ENABLEMENT_SELECTOR")]
    pub enablement_selectors: Option<String>,
    /// Redirect pods' DNS (port 53) to the proxy's DNS proxy (per-pod annotation
    /// ambient.istio.io/dns-capture overrides).
    #[arg(long, env = "AMBIENT_DNS_CAPTURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub dns_capture: bool,
    /// Capture IPv6 too.
    #[arg(long, env = "AMBIENT_IPV6", default_value_t = true, action = clap::ArgAction::Set)]
    pub ipv6: bool,
    /// Capture backend: `nftables` (programmed over netlink, no `nft` binary needed) or `iptables` (runs `iptables-restore`).
    #[arg(long, env = "AMBIT_CAPTURE_BACKEND", default_value = "nftables")]
    pub capture_backend: String,
    /// Prefix for netns paths given by the CNI runtime (`/host` when the agent runs in a container).
    #[arg(long, env = "AMBIT_HOST_PREFIX", default_value = "/")]
    pub host_prefix: PathBuf,
    /// The host's /proc (to find running pods' network namespaces).
    #[arg(long, env = "AMBIT_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// The host network namespace (for the kubelet probe SNAT rules).
    #[arg(long, env = "AMBIT_HOST_NETNS", default_value = "/proc/self/ns/net")]
    pub host_netns: PathBuf,
    /// Prometheus metrics address.
    #[arg(long, env = "AMBIT_AGENT_METRICS_ADDR", default_value = "[::]:15014")]
    pub metrics_addr: SocketAddr,
    /// Health address (`/healthz`, `/readyz`).
    #[arg(long, env = "AMBIT_AGENT_HEALTH_ADDR", default_value = "[::]:8000")]
    pub health_addr: SocketAddr,
    /// CNI conf dir to install the plugin into (kubelet's `/etc/cni/net.d`). Default: that path
    /// with the Kubernetes source, no installation in local mode.
    #[arg(long, env = "MOUNTED_CNI_NET_DIR")]
    pub cni_conf_dir: Option<PathBuf>,
    /// CNI bin dir the plugin binary is copied into.
    #[arg(long, env = "AMBIT_CNI_BIN_DIR", default_value = "/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,
    /// Primary CNI config file to chain into (default: the first one, kubelet's order).
    #[arg(long, env = "CNI_CONF_NAME")]
    pub cni_conf_name: Option<String>,
    /// Chain after the primary plugin (`false`: write a standalone config).
    #[arg(long, env = "CHAINED_CNI_PLUGIN", default_value_t = true, action = clap::ArgAction::Set)]
    pub chained: bool,
    /// The `ambit-cni` binary to install (default: next to this executable).
    #[arg(long, env = "AMBIT_CNI_BINARY")]
    pub cni_binary: Option<PathBuf>,
    /// The agent's own namespace (its pods may always start).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// Remove the plugin from the CNI config on exit. Only for a real uninstall: on a restart
    /// or upgrade the plugin must stay, so new pods wait for the agent instead of starting
    /// unmeshed.
    #[arg(long, env = "AMBIT_UNINSTALL_ON_EXIT", default_value_t = false, action = clap::ArgAction::Set)]
    pub uninstall_on_exit: bool,
    /// Log filter.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub rust_log: String,
}

/// A failure that stops the agent from starting.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Bad configuration.
    #[error("{0}")]
    Config(String),
    /// A socket or port could not be bound.
    #[error("cannot bind {what} {where_}: {error}")]
    Bind {
        /// What.
        what: &'static str,
        /// Where.
        where_: String,
        /// Why.
        error: std::io::Error,
    },
    /// The runtime failed.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

struct AgentMetrics {
    events: Family<OutcomeLabel, Counter>,
    add_latency: Histogram,
    pods: Family<StateLabel, Gauge>,
    capture_errors: Counter,
    capture_repairs: Counter,
    migrate_req_supported: Gauge,
}

impl crate::server::EventMetrics for AgentMetrics {
    fn observe(&self, outcome: &'static str, seconds: f64) {
        self.events.get_or_create(&OutcomeLabel { outcome: outcome.into() }).inc();
        if outcome == "enrolled" {
            self.add_latency.observe(seconds);
        }
    }
}

/// Capture through an `ambit-redirect` backend, per-pod settings from the pod's annotations,
/// and the host's probe SNAT entries when enabled.
struct RedirectCapture {
    backend: Box<dyn RuleBackend>,
    dns: bool,
    ipv6: bool,
    errors: Counter,
    repairs: Counter,
    probes: Option<(Netns, ambit_redirect::host::NftProbeSnat)>,
}

impl Capture for RedirectCapture {
    fn apply(&self, netns: &Netns, pod: &Pod) -> Result<(), String> {
        let capture = PodCapture::from_annotations(&pod.annotations, self.dns, self.ipv6);
        self.backend.apply(netns.as_fd(), &capture).map_err(|e| {
            self.errors.inc();
            e.to_string()
        })
    }

    fn repair(&self, netns: &Netns, pod: &Pod) -> Result<Vec<String>, String> {
        let capture = PodCapture::from_annotations(&pod.annotations, self.dns, self.ipv6);
        let failed = |e: ambit_redirect::RedirectError| {
            self.errors.inc();
            e.to_string()
        };
        let drift = match self.backend.verify(netns.as_fd(), &capture).map_err(failed)? {
            Verification::InSync => return Ok(Vec::new()),
            Verification::Absent => vec!["no capture rules present".to_owned()],
            Verification::Drift(drift) => drift,
        };
        self.backend.apply(netns.as_fd(), &capture).map_err(failed)?;
        self.repairs.inc();
        Ok(drift)
    }

    fn remove(&self, netns: &Netns) -> Result<(), String> {
        let capture = PodCapture::from_annotations(&Default::default(), self.dns, self.ipv6);
        self.backend.remove(netns.as_fd(), &capture).map_err(|e| {
            self.errors.inc();
            e.to_string()
        })
    }

    fn host_add(&self, pod: &Pod) -> Result<(), String> {
        let Some((host, probes)) = &self.probes else { return Ok(()) };
        for ip in &pod.ips {
            probes.upsert(host.as_fd(), *ip, &pod.uid).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn host_remove(&self, pod: &Pod) -> Result<(), String> {
        let Some((host, probes)) = &self.probes else { return Ok(()) };
        for ip in &pod.ips {
            probes.remove_for_pod(host.as_fd(), *ip, &pod.uid).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Installs the host probe SNAT (kubelet's probes to captured pods come from a link-local
/// address the in-pod rules let through), when a kubelet runs on this host.
fn probe_snat(args: &AgentArgs) -> Option<(Netns, ambit_redirect::host::NftProbeSnat)> {
    let uid = match ambit_redirect::host::kubelet_uid(&args.proc_root) {
        Ok(uid) => uid,
        Err(e) => {
            tracing::info!(error = %e, "no kubelet found: host probe SNAT not installed");
            return None;
        }
    };
    let host = match Netns::open(&args.host_netns) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the host network namespace: host probe SNAT not installed");
            return None;
        }
    };
    let probes = ambit_redirect::host::NftProbeSnat::new(args.ipv6, uid);
    match probes.install(host.as_fd()).and_then(|()| probes.flush_sets(host.as_fd())) {
        Ok(()) => Some((host, probes)),
        Err(e) => {
            tracing::warn!(error = %e, "installing the host probe SNAT failed; kubelet probes may be refused under STRICT mTLS");
            None
        }
    }
}

/// Local mode has no API to patch: the redirection state is logged.
struct LogAnnotate;

impl Annotate for LogAnnotate {
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> BoxFuture<'static, Result<(), String>> {
        tracing::debug!(pod = %format!("{}/{}", pod.namespace, pod.name), redirection = value.unwrap_or("(removed)"),
            "ambient.istio.io/redirection");
        Box::pin(async { Ok(()) })
    }
}

/// Where pods and namespaces come from.
enum Source {
    Files(FileSource),
    Kube(crate::kube::KubeSource),
}

impl Source {
    fn poll(&mut self) -> Option<crate::source::Inventory> {
        match self {
            Source::Files(f) => f.poll(),
            Source::Kube(k) => k.poll(),
        }
    }
}

/// Runs the agent until SIGTERM/SIGINT. It never removes capture on exit: pods stay captured
/// (and the CNI plugin fails closed) until an agent is back.
pub fn run(args: AgentArgs) -> Result<(), AgentError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("ambit-agent")
        .build()
        .map_err(AgentError::Runtime)?;
    rt.block_on(run_async(args))
}

async fn run_async(args: AgentArgs) -> Result<(), AgentError> {
    let selectors = match &args.enablement_selectors {
        Some(s) if !s.trim().is_empty() => {
            parse_selectors(s).map_err(|e| AgentError::Config(e.to_string()))?
        }
        _ => crate::enroll::default_selectors(),
    };
    let excluded: BTreeSet<String> = args
        .exclude_namespaces
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let enrollment = Enrollment { selectors, excluded_namespaces: excluded };
    let mut registry = Registry::default();
    let metrics = Arc::new(AgentMetrics {
        events: Family::default(),
        add_latency: Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0]),
        pods: Family::default(),
        capture_errors: Counter::default(),
        capture_repairs: Counter::default(),
        migrate_req_supported: Gauge::default(),
    });
    let r = registry.sub_registry_with_prefix("ambit_agent");
    r.register("cni_events", "CNI plugin events by outcome", metrics.events.clone());
    r.register(
        "cni_add_duration_seconds",
        "CNI ADD handling time for enrolled pods",
        metrics.add_latency.clone(),
    );
    r.register("pods", "Pods by mesh state", metrics.pods.clone());
    r.register("capture_errors", "Capture rule errors", metrics.capture_errors.clone());
    r.register(
        "capture_repairs",
        "Enrolled pods whose capture was found drifted and re-applied",
        metrics.capture_repairs.clone(),
    );
    r.register(
        "tcp_migrate_req_supported",
        "1 when the kernel has net.ipv4.tcp_migrate_req (set in every captured pod)",
        metrics.migrate_req_supported.clone(),
    );
    let migrate_req = ambit_redirect::tcp_migrate_req_supported();
    metrics.migrate_req_supported.set(i64::from(migrate_req));
    if !migrate_req {
        tracing::warn!(
            sysctl = ambit_redirect::TCP_MIGRATE_REQ,
            "this kernel lacks the sysctl (Linux 5.14 and later have it): pods are captured and served, \
             but a node proxy upgrade resets the connections still queued in the old proxy's listeners"
        );
    }
    let backend: Box<dyn RuleBackend> = match args.capture_backend.as_str() {
        "nftables" => Box::new(NftablesBackend::default()),
        "iptables" => Box::new(IptablesBackend::detect(true)),
        other => {
            return Err(AgentError::Config(format!(
                "AMBIT_CAPTURE_BACKEND={other:?}: use nftables or iptables"
            )));
        }
    };
    let capture = Arc::new(RedirectCapture {
        backend,
        dns: args.dns_capture,
        ipv6: args.ipv6,
        errors: metrics.capture_errors.clone(),
        repairs: metrics.capture_repairs.clone(),
        probes: probe_snat(&args),
    });
    let zds = ZdsServer::new(&args.zds_socket);
    let paths = HostPaths { netns_prefix: args.host_prefix.clone(), proc_root: args.proc_root.clone() };
    let (mut source, annotate): (Source, Arc<dyn Annotate>) = match &args.source_dir {
        Some(dir) => (Source::Files(FileSource::new(dir, args.node_name.clone())), Arc::new(LogAnnotate)),
        None => {
            let client = kube::Client::try_default().await.map_err(|e| {
                AgentError::Config(format!(
                    "no --source-dir and no usable Kubernetes config (in-cluster or KUBECONFIG): {e}"
                ))
            })?;
            let src = crate::kube::KubeSource::start(client.clone(), args.node_name.as_deref())
                .await
                .map_err(AgentError::Config)?;
            (Source::Kube(src), Arc::new(crate::kube::KubeAnnotate::new(client)))
        }
    };
    let mesh = Mesh::new(enrollment, zds.clone(), capture, annotate, paths);

    // 1. Learn the world, re-adopt running pods.
    let inv = source.poll().unwrap_or_default();
    for ns in inv.namespaces.into_values() {
        mesh.upsert_namespace(ns);
    }
    for pod in inv.pods.into_values() {
        mesh.upsert_pod(pod);
    }
    let mut adopted = 0;
    for uid in mesh.pods() {
        match mesh.adopt(&uid) {
            Ok(true) => adopted += 1,
            Ok(false) => {}
            Err(e) => tracing::warn!(%uid, error = %e, "re-adopting a running pod failed; will retry"),
        }
    }
    tracing::info!(adopted, "start-up reconcile done");

    // 2. Serve the proxy (snapshot complete), then the CNI plugin.
    let zds_listener = ambit_zds::ZdsListener::bind(&args.zds_socket).map_err(|error| AgentError::Bind {
        what: "ZDS socket",
        where_: args.zds_socket.display().to_string(),
        error,
    })?;
    let m = mesh.clone();
    tokio::spawn(zds.clone().run(zds_listener, Arc::new(move || m.snapshot())));
    let event_path = args.run_dir.join("pluginevent.sock");
    let events = crate::server::bind(&event_path).map_err(|error| AgentError::Bind {
        what: "CNI event socket",
        where_: event_path.display().to_string(),
        error,
    })?;
    tokio::spawn(crate::server::serve(events, mesh.clone(), metrics.clone()));

    // 3. Metrics and health.
    let ready = Arc::new(AtomicBool::new(false));
    let registry = Arc::new(registry);
    spawn_http(args.metrics_addr, "metrics", {
        let registry = registry.clone();
        move |path| {
            if path != "/metrics" {
                return (404, "not found\n".into());
            }
            let mut body = String::new();
            let _ = prometheus_client::encoding::text::encode(&mut body, &registry);
            (200, body)
        }
    })
    .await?;
    spawn_http(args.health_addr, "health", {
        let ready = ready.clone();
        move |path| match path {
            "/healthz" => (200, "ok\n".into()),
            "/readyz" if ready.load(Ordering::Relaxed) => (200, "ready\n".into()),
            "/readyz" => (
                503,
                "not ready: the CNI plugin is not installed yet (is there a primary CNI config?)\n".into(),
            ),
            _ => (404, "not found\n".into()),
        }
    })
    .await?;
    // 4. Install the plugin only now that the agent can answer it.
    let conf_dir =
        args.cni_conf_dir.clone().or_else(|| args.source_dir.is_none().then(|| "/etc/cni/net.d".into()));
    let stop_installer = tokio_util::sync::CancellationToken::new();
    let installer = match conf_dir {
        Some(dir) => {
            let installer = installer(&args, dir)?;
            let (i, stop) = (installer.clone(), stop_installer.clone());
            tokio::spawn(async move {
                if let Err(e) = i.run(stop).await {
                    tracing::error!(error = %e, "CNI installer stopped");
                }
            });
            Some(installer)
        }
        None => None,
    };
    let r = ready.clone();
    let inst = installer.clone();
    tokio::spawn(async move {
        // Ready once the plugin is installed (or immediately without installation).
        loop {
            if inst.as_ref().is_none_or(|i| i.ready()) {
                r.store(true, Ordering::Relaxed);
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    tracing::info!(source = ?args.source_dir, zds = %args.zds_socket.display(), events = %event_path.display(),
        "agent ready");

    // 4. Follow the source; reconcile what changed, retry what failed.
    let cache_path = args.run_dir.join("enrollment.json");
    let mut cache_written = String::new();
    let mut dirty: HashSet<String> = mesh.pods().into_iter().collect();
    let mut stop = std::pin::pin!(shutdown());
    let mut next_verify = tokio::time::Instant::now() + args.capture_verify_interval;
    loop {
        // Reconciling an enrolled pod verifies its capture (and repairs drift).
        if tokio::time::Instant::now() >= next_verify {
            dirty.extend(mesh.enrolled());
            next_verify = tokio::time::Instant::now() + args.capture_verify_interval;
        }
        if let Some(inv) = source.poll() {
            let current: HashSet<String> = inv.pods.keys().cloned().collect();
            for uid in mesh.missing(&current) {
                if let Err(e) = mesh.delete_pod(&uid).await {
                    tracing::warn!(%uid, error = %e, "removing a deleted pod failed");
                }
            }
            for ns in inv.namespaces.into_values() {
                dirty.extend(mesh.upsert_namespace(ns));
            }
            for pod in inv.pods.into_values() {
                let uid = pod.uid.clone();
                if mesh.upsert_pod(pod) {
                    dirty.insert(uid);
                }
            }
        }
        let mut failed = HashSet::new();
        for uid in dirty.drain() {
            if let Err(e) = mesh.reconcile(&uid).await {
                tracing::warn!(%uid, error = %e, retry = e.retryable(), "reconcile failed");
                if e.retryable() {
                    failed.insert(uid);
                }
            }
        }
        dirty = failed;
        let cache = mesh.enrollment_cache().to_string();
        if cache != cache_written {
            match write_atomic(&cache_path, cache.as_bytes()) {
                Ok(()) => cache_written = cache,
                Err(e) => {
                    tracing::warn!(file = %cache_path.display(), error = %e, "cannot write the enrollment cache")
                }
            }
        }
        let enrolled = mesh.enrolled().len();
        metrics.pods.get_or_create(&StateLabel { state: "enrolled".into() }).set(enrolled as i64);
        metrics.pods.get_or_create(&StateLabel { state: "pending".into() }).set(dirty.len() as i64);
        let wait = if dirty.is_empty() {
            args.source_poll
        } else {
            Duration::from_secs(1).min(args.source_poll * 4)
        }
        .min(next_verify.saturating_duration_since(tokio::time::Instant::now()));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = mesh.source_wanted() => {}
            _ = &mut stop => break,
        }
    }
    stop_installer.cancel();
    if args.uninstall_on_exit
        && let Some(i) = installer
    {
        match i.uninstall() {
            Ok(()) => tracing::info!("CNI plugin uninstalled"),
            Err(e) => tracing::error!(error = %e, "CNI plugin uninstall failed"),
        }
    }
    tracing::info!("agent stopping; pods keep their capture and proxy");
    Ok(())
}

fn installer(args: &AgentArgs, conf_dir: PathBuf) -> Result<crate::install::Installer, AgentError> {
    let binary = match &args.cni_binary {
        Some(b) => b.clone(),
        None => std::env::current_exe()
            .map_err(|e| AgentError::Config(format!("cannot locate this executable: {e}")))?
            .with_file_name("ambit-cni"),
    };
    let mut entry = serde_json::Map::new();
    entry.insert("cni_agent_run_dir".into(), args.run_dir.display().to_string().into());
    let excluded: Vec<serde_json::Value> = args
        .exclude_namespaces
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.into())
        .collect();
    entry.insert("exclude_namespaces".into(), excluded.into());
    if let Some(ns) = &args.pod_namespace {
        entry.insert("pod_namespace".into(), ns.clone().into());
    }
    crate::install::Installer::new(crate::install::InstallConfig {
        cni_bin_dirs: vec![args.cni_bin_dir.clone()],
        conf_dir,
        conf_name: args.cni_conf_name.clone(),
        chained: args.chained,
        plugin_binary: binary,
        plugin_name: "ambit-cni".into(),
        plugin_entry: entry,
        conf_mode_group_read: false,
    })
    .map_err(|e| AgentError::Config(e.to_string()))
}

fn parse_millis(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let ms = s
        .strip_suffix("ms")
        .map(str::parse::<u64>)
        .or_else(|| s.strip_suffix('s').map(|v| v.parse::<u64>().map(|v| v * 1000)));
    match ms {
        Some(Ok(ms)) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(format!("{s:?} is not a duration like 250ms or 1s")),
    }
}

fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

async fn shutdown() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// A tiny HTTP/1.1 server answering GETs by path.
async fn spawn_http(
    addr: SocketAddr,
    what: &'static str,
    handler: impl Fn(&str) -> (u16, String) + Send + Sync + Clone + 'static,
) -> Result<(), AgentError> {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(_) if addr.is_ipv6() && addr.ip().is_unspecified() => {
            let v4 = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port());
            tokio::net::TcpListener::bind(v4).await.map_err(|error| AgentError::Bind {
                what,
                where_: v4.to_string(),
                error,
            })?
        }
        Err(error) => return Err(AgentError::Bind { what, where_: addr.to_string(), error }),
    };
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let h = handler.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (status, body) = h(req.uri().path());
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .status(status)
                                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                                .unwrap_or_default(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(())
}
