//! `ambit agent`: wires the sources, the mesh core, capture, the ZDS server, the CNI event
//! server, the installer, metrics and health into one process.
//!
//! Start-up order matters (node boot, agent restart):
//! 1. health and metrics bind first, `/readyz` answering 503 with the reason, so a probe sees
//!    what the agent waits for (an API server that refuses it, a list that does not come);
//! 2. the pod source is read (the Kubernetes source: both initial lists, bounded by
//!    `--kube-sync-timeout`; a 401/403 ends the agent with an error naming the resource and verb);
//! 3. pods that must be in the mesh and are already running are re-adopted (capture re-applied,
//!    recorded as enrolled) *before* the ZDS socket accepts a proxy, so the proxy's first
//!    snapshot is complete and no pod loses its proxy;
//! 4. the CNI event server starts, then the installer; readiness comes last.
//!
//! Modules by concern: [`args`] (settings), [`metrics`], [`health`] (HTTP servers and
//! readiness), [`reconcile`] (the main loop); capture is [`crate::capture`].

pub mod args;
pub mod health;
pub mod metrics;
pub mod reconcile;

use std::path::PathBuf;
use std::sync::Arc;

use ambit_cni::{AmbitKeys, SystemRole};
use ambit_objects::file::FileSource;
use ambit_objects::{Filter, Kind};
use ambit_redirect::{IptablesBackend, NftablesBackend, RuleBackend};
use prometheus_client::registry::Registry;

pub use args::AgentArgs;

use crate::annotate::{Annotate, Annotations, FileAnnotate, LogAnnotate, Retry};
use crate::capture::RedirectCapture;
use crate::install::{InstallError, Installer};
use crate::kube::KubeSourceError;
use crate::mesh::{HostPaths, Mesh};
use crate::podns::HostNamespaces;
use crate::zds::ZdsServer;
use health::Readiness;
use metrics::AgentMetrics;
use reconcile::{Follower, PluginEntry, Source};

/// A failure that stops the agent.
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
    /// No usable Kubernetes client configuration.
    #[error("no --source-dir and no usable Kubernetes config (in-cluster or KUBECONFIG): {0}")]
    KubeConfig(String),
    /// The Kubernetes source failed (refused, or its initial list timed out).
    #[error(transparent)]
    Kube(#[from] KubeSourceError),
    /// The CNI installer cannot be set up.
    #[error(transparent)]
    Install(#[from] InstallError),
}

/// Runs the agent until SIGTERM/SIGINT. It never removes capture on exit: pods stay captured
/// (and the CNI plugin fails closed) until an agent is back. The plugin leaves the CNI chain only
/// when [`crate::owner`] says this stop is an uninstall (or AMBIT_UNINSTALL_ON_EXIT is set).
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
    // Settings first: a bad one is a start-up error, before anything binds.
    args.check_ambient().map_err(AgentError::Config)?;
    let env = ambit_admin::environment();
    for line in AgentArgs::without_effect(&env) {
        tracing::info!("{line}");
    }
    let paths = args.paths();
    let enrollment = args.enrollment().map_err(AgentError::Config)?;
    let capture_state = args.capture_state().map_err(AgentError::Config)?;
    let node_name = match &args.source_dir {
        Some(_) => args.node_name.clone(),
        None => Some(args.required_node_name().map_err(AgentError::Config)?.to_owned()),
    };
    let backend: Box<dyn RuleBackend> = match args.backend().map_err(AgentError::Config)? {
        args::Backend::Nftables => Box::new(NftablesBackend::default()),
        args::Backend::Iptables => Box::new(IptablesBackend::detect(true)),
    };

    // 1. Health and metrics, so that probes see why the agent is not ready yet.
    let mut registry = Registry::default();
    let metrics = AgentMetrics::register(&mut registry);
    let readiness = Readiness::new("starting");
    let migrate_req = ambit_redirect::tcp_migrate_req_supported();
    metrics.migrate_req_supported.set(i64::from(migrate_req));
    if !migrate_req {
        tracing::warn!(
            sysctl = ambit_redirect::TCP_MIGRATE_REQ,
            "the sysctl cannot be set in pods: this kernel lacks it (Linux 5.14 and later have it) or \
             /proc/sys is read-only here and no procfs can be mounted (no CAP_SYS_ADMIN); pods are captured \
             and served, but a node proxy upgrade resets the connections still queued in the old proxy's \
             listeners"
        );
    }
    health::serve_health(args.health_addr, readiness.clone()).await?;
    health::serve_metrics(args.metrics_addr, Arc::new(registry)).await?;

    // 2. The pod source (and, on Kubernetes, the watch of the agent's own DaemonSet).
    let mut file_annotate = None;
    let mut owner = None;
    let (mut source, annotate): (Source, Arc<dyn Annotate>) = match &args.source_dir {
        Some(dir) => {
            let mut filter = Filter::kinds(&[Kind::Namespace, Kind::Pod]);
            filter.pod_node = node_name.clone();
            let annotate: Arc<dyn Annotate> = match capture_state {
                Some((state_dir, node)) => {
                    std::fs::create_dir_all(state_dir).map_err(|e| {
                        AgentError::Config(format!(
                            "cannot create the capture-state folder {}: {e}",
                            state_dir.display()
                        ))
                    })?;
                    let f = Arc::new(
                        FileAnnotate::new(state_dir, node).map_err(|e| AgentError::Config(e.to_string()))?,
                    );
                    file_annotate = Some(f.clone());
                    f
                }
                None => Arc::new(LogAnnotate),
            };
            (Source::Files(Box::new(FileSource::new(dir, filter))), annotate)
        }
        None => {
            let node = node_name.as_deref().unwrap_or_default();
            let client =
                kube::Client::try_default().await.map_err(|e| AgentError::KubeConfig(e.to_string()))?;
            let src = crate::kube::watch(client.clone(), node);
            owner = args
                .own_daemonset()
                .map(|(name, ns)| crate::owner::OwnerWatch::start(client.clone(), &ns, &name));
            if let Err(e) = src.synced(args.kube_sync_timeout, |reason| readiness.not_ready(reason)).await {
                readiness.not_ready(&e.to_string());
                return Err(e.into());
            }
            (Source::Kube(src), Arc::new(crate::kube::KubeAnnotate::new(client)))
        }
    };
    let capture = Arc::new(RedirectCapture::new(
        backend,
        args.dns_capture,
        args.ipv6,
        (metrics.capture_errors.clone(), metrics.capture_repairs.clone()),
        crate::capture::probe_snat(&paths.proc_root, &paths.host_netns, args.ipv6),
    ));
    let annotations = Annotations::new(annotate, Retry::default(), metrics.annotation_failures.clone());
    tokio::spawn(annotations.clone().run());
    let zds = ZdsServer::new(&args.zds_socket);
    let host = HostPaths {
        netns_prefix: paths.host_prefix.clone(),
        proc_root: paths.proc_root.clone(),
        host_namespaces: HostNamespaces::discover(&paths.host_netns, &paths.proc_root),
    };
    let mesh = Mesh::new(enrollment, zds.clone(), capture, annotations.clone(), host);

    // 3. Learn the world, re-adopt running pods.
    readiness.not_ready("re-adopting running pods");
    // Every pod is reconciled below and by the loop's first round.
    let _ = reconcile::apply(&mesh, source.poll(), &|kind| metrics.istio.reconcile_event(kind)).await;
    if let Some(f) = &file_annotate
        && let Err(e) = f.retain(&mesh.pods().into_iter().collect())
    {
        tracing::warn!(error = %e, "cannot drop deleted pods from the capture state");
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

    // 4. Serve the proxy (snapshot complete), then the CNI plugin.
    let zds_listener = ambit_zds::ZdsListener::bind(&args.zds_socket).map_err(|error| AgentError::Bind {
        what: "ZDS socket",
        where_: args.zds_socket.display().to_string(),
        error,
    })?;
    let m = mesh.clone();
    tokio::spawn(zds.clone().run(zds_listener, Arc::new(move || m.snapshot())));
    let event_path = paths.run_dir.join(ambit_cni::EVENT_SOCKET);
    let events = crate::server::bind(&event_path).map_err(|error| AgentError::Bind {
        what: "CNI event socket",
        where_: event_path.display().to_string(),
        error,
    })?;
    tokio::spawn(crate::server::serve(events, mesh.clone(), metrics.clone()));

    // 5. Install the plugin only now that the agent can answer it; ready once it is installed.
    let conf_dir = paths.cni_conf_dir.clone();
    let stop_installer = tokio_util::sync::CancellationToken::new();
    let plugin = match conf_dir {
        Some(dir) => {
            let mut plugin = plugin_entry(&args, &paths, dir)?;
            plugin.learn(mesh.system_pods());
            if plugin.installer().set_entry(&plugin.entry())? {
                tracing::debug!("plugin entry names the node's own pods");
            }
            let (i, stop) = (plugin.installer().clone(), stop_installer.clone());
            tokio::spawn(async move {
                if let Err(e) = i.run(stop).await {
                    tracing::error!(error = %e, "CNI installer stopped");
                }
            });
            Some(plugin)
        }
        None => None,
    };
    let (r, inst) = (readiness.clone(), plugin.as_ref().map(|p| p.installer().clone()));
    let (m, z) = (metrics.clone(), zds.clone());
    tokio::spawn(async move {
        loop {
            m.istio.ztunnel_connected.set(z.connected() as i64);
            m.istio.installer(inst.as_ref().is_none_or(|i| i.ready()));
            match &inst {
                Some(i) if !i.ready() => {
                    r.not_ready("the CNI plugin is not installed yet (is there a primary CNI config?)")
                }
                _ => r.ready(),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
    tracing::info!(source = ?args.source_dir, zds = %args.zds_socket.display(), events = %event_path.display(),
        "agent serving");

    // 6. Follow the source; reconcile what changed, retry what failed.
    let mut follower = Follower {
        source,
        mesh,
        metrics,
        annotations,
        cache_path: paths.run_dir.join(ambit_cni::cache::CACHE_FILE),
        poll: args.source_poll,
        verify_interval: args.capture_verify_interval,
        plugin,
    };
    let outcome = follower.run().await;
    stop_installer.cancel();
    if let Err(e) = &outcome {
        readiness.not_ready(&e.to_string());
        tracing::error!(error = %e, "agent stopping; pods keep their capture and proxy");
    }
    // The plugin stays in the chain for the next agent, unless this stop is an uninstall.
    if let Some(p) = &follower.plugin {
        crate::owner::on_stop(p.installer(), owner.as_ref(), args.uninstall_on_exit).await;
    }
    if outcome.is_ok() {
        tracing::info!("agent stopping; pods keep their capture and proxy");
    }
    outcome
}

/// The installer and the plugin's entry: Ambit's keys ([`AmbitKeys`], the type the plugin
/// reads), and the node's own pods as they become known.
fn plugin_entry(args: &AgentArgs, paths: &args::Paths, conf_dir: PathBuf) -> Result<PluginEntry, AgentError> {
    let binary = match &paths.cni_binary {
        Some(b) => b.clone(),
        None => std::env::current_exe()
            .map_err(|e| AgentError::Config(format!("cannot locate this executable: {e}")))?
            .with_file_name("ambit-cni"),
    };
    let keys = AmbitKeys {
        cni_agent_run_dir: Some(paths.run_dir.display().to_string()),
        exclude_namespaces: Some(args.excluded_namespaces().into_iter().collect()),
        pod_namespace: args.pod_namespace.clone().filter(|s| !s.is_empty()),
        system_pods: None,
        agent_timeout_ms: None,
    };
    let base = match serde_json::to_value(&keys) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let installer = Installer::new(crate::install::InstallConfig {
        cni_bin_dirs: vec![paths.cni_bin_dir.clone()],
        conf_dir,
        conf_name: args.cni_conf_name.clone(),
        chained: args.chained,
        plugin_binary: binary,
        plugin_name: "ambit-cni".into(),
        plugin_entry: base,
        conf_mode_group_read: args.cni_conf_group_read,
    })?;
    let mut allowed = Vec::new();
    if let Some(ns) = args.pod_namespace.clone().filter(|s| !s.is_empty()) {
        allowed.push((SystemRole::Agent, ns));
    }
    if let Some(ns) = args.proxy_namespace() {
        allowed.push((SystemRole::Proxy, ns));
    }
    // Only an agent that runs as a pod (its objects from the Kubernetes API) has pods of its own
    // to recognise; with a folder of objects (`ambit up`) it is a process of the node.
    if args.pod_name.as_deref().is_none_or(str::is_empty) && args.source_dir.is_none() {
        tracing::warn!(
            "POD_NAME or POD_NAMESPACE is not set: the plugin cannot recognise this agent's pods, so while \
             no agent runs a replacement agent pod starts only if the enrollment cache admits it"
        );
    }
    Ok(PluginEntry::new(installer, keys, allowed))
}
