//! The process that owns a local cluster (`ambit up`'s supervisor): it builds the network, runs
//! `ambit control` in a namespace of its own and, per node, `ambit agent` and a shared-mode
//! `ambit proxy` in the node's namespace, all supervised (restarted when they exit, logs in the
//! run directory); then it plays kubelet and the API server for the pods of the desired folder.
//!
//! The desired folder (`<run dir>/desired`, what `ambit up --config` and `ambit apply` put there)
//! is the user's YAML; the objects folder (`<run dir>/objects`) is what the control plane and the
//! agents read, as they would read the API server: the desired objects as written, the Nodes, and
//! each pod as kubelet reports it (first Pending on its node, then Running with its IP once the
//! CNI chain has run). A pod is created as a container runtime creates one: its sandbox (network
//! namespace, pause process), then CNI ADD through the node's chain (the reference plugins, then
//! `ambit-cni`, installed by the node's agent), then its containers as supervised processes in
//! its namespace; removal is the reverse (containers stopped, CNI DEL, sandbox removed).
//!
//! A change of the desired folder is applied only once the whole folder checks (see
//! [`crate::desired`]): a bad edit is reported in the record and nothing of it is used.
//!
//! Here: building, the loop, the record. `components`: the control plane's, agents' and
//! proxies' process specs (and a proxy's replacement); `pods`: the pods' lifecycle (and a
//! waypoint's replacement); `requests`: `ambit restart|stop|start`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::cni::NetworkList;
use crate::desired::{Desired, DesiredErrors, PodTemplate};
use crate::node::{self, NodeError, PreparedNode};
use crate::probe;
use crate::sandbox::{self, Sandbox, SandboxError};
use crate::state::{ClusterState, PodState, ProxyPorts, StateError, VERSION};
use crate::supervise::{Event, SuperviseError, Supervisor};
use crate::topology::{Network, NetworkError, NetworkSpec};

mod components;
mod pods;
mod requests;

pub use requests::{Reply, Request, submit};

/// The control plane's member name on the segment.
pub const CONTROL_HOST: &str = "control";
/// `ambit control`'s gRPC TLS port (xDS and CA).
pub const CONTROL_GRPC: u16 = 15012;
/// `ambit control`'s monitoring port.
pub const CONTROL_MONITORING: u16 = 15014;
/// `ambit control`'s readiness port (`/ready`).
pub const CONTROL_READY: u16 = 8080;
/// The name the proxies verify in the control plane's certificate (istiod's).
pub const CONTROL_HOSTNAME: &str = "istiod.istio-system.svc";
/// The agent's health port in its node namespace (`/readyz`).
pub const AGENT_HEALTH: u16 = 8000;
/// The agent's metrics port in its node namespace.
pub const AGENT_METRICS: u16 = 15014;
/// How long a replaced node proxy may drain its connections.
pub const PROXY_DRAIN: Duration = Duration::from_secs(5);
/// How long a replaced waypoint drains (its TERMINATION_DRAIN_DURATION default).
pub const WAYPOINT_DRAIN: Duration = Duration::from_secs(5);
/// The waypoint's HBONE port.
pub const WAYPOINT_HBONE_PORT: u16 = 15008;
/// How long each component may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a pod's containers may take to listen on their declared ports.
pub const POD_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the desired folder is looked at.
pub const POLL: Duration = Duration::from_millis(100);
/// How often every file of the desired folder is looked at when the folder itself did not change.
const FULL_STAMP_EVERY: Duration = Duration::from_secs(1);
/// How long a process is given between SIGTERM and SIGKILL when the cluster stops.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Pause before a pod whose creation failed is tried again.
pub const POD_RETRY: Duration = Duration::from_secs(5);
/// Largest request file read.
const MAX_REQUEST: u64 = 4096;
/// Events kept in the record.
pub const MAX_EVENTS: usize = 50;

/// What to build.
#[derive(Clone, Debug)]
pub struct UpConfig {
    /// The run directory (everything the cluster writes lives here).
    pub run_dir: PathBuf,
    /// The namespaces' prefix.
    pub tag: String,
    /// How many nodes (`node1` … `nodeN`).
    pub nodes: usize,
    /// The `ambit` binary the components and the `ambit` containers run.
    pub ambit: PathBuf,
    /// The `ambit-cni` binary the agents install.
    pub ambit_cni: PathBuf,
    /// The segment's second and third octets (`10.a.b.0/24`).
    pub segment: (u8, u8),
    /// The pod CIDRs' second octet (`10.p.<node>.0/24`).
    pub pods: u8,
    /// Where the reference CNI plugins are ([`crate::cni::PLUGIN_DIRS`] when empty).
    pub plugin_dirs: Vec<PathBuf>,
    /// A binary every node runs as its proxy instead of `ambit proxy` (the reference ztunnel,
    /// for interop and comparison): started as `<binary> proxy ztunnel`, as Istio's chart starts
    /// ztunnel, with the environment `ambit proxy` gets.
    pub node_proxy: Option<PathBuf>,
    /// A program each of the cluster's components (`control`, `agent/<node>`, `proxy/<node>`)
    /// is started through, as `<launcher> <name> <netns> <binary> <args…>` with the component's
    /// environment: it runs the component, or something standing for it, such as a container
    /// (tests/up_containers.rs runs one node's under podman with the chart's privileges).
    pub launcher: Option<PathBuf>,
}

/// The run directory's parts.
#[derive(Clone, Debug)]
pub struct Layout(pub PathBuf);

impl Layout {
    /// The user's objects (`ambit up --config`, `ambit apply`).
    pub fn desired(&self) -> PathBuf {
        self.0.join("desired")
    }
    /// What the control plane and the agents read.
    pub fn objects(&self) -> PathBuf {
        self.0.join("objects")
    }
    /// The agents' capture state, which the control plane reads.
    pub fn capture(&self) -> PathBuf {
        self.0.join("capture")
    }
    /// The control plane's state (its CA, the mesh root, the node tokens).
    pub fn control(&self) -> PathBuf {
        self.0.join("control")
    }
    /// The mesh root every proxy trusts.
    pub fn root_cert(&self) -> PathBuf {
        self.control().join("root-cert.pem")
    }
    /// Every process's log.
    pub fn logs(&self) -> PathBuf {
        self.0.join("logs")
    }
    /// The log of process `name` (`/` becomes `_`).
    pub fn log(&self, name: &str) -> PathBuf {
        self.logs().join(format!("{}.log", name.replace('/', "_")))
    }
    /// Requests to the cluster's owner (`ambit restart|stop|start`).
    pub fn requests(&self) -> PathBuf {
        self.0.join("requests")
    }
    /// The progress of the start, one line per step, for `ambit up` to show.
    pub fn progress(&self) -> PathBuf {
        self.0.join("progress")
    }
}

/// Why the cluster could not be started or run.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// The network.
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// A node's files or CNI plugins.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The record.
    #[error(transparent)]
    State(#[from] StateError),
    /// The desired folder.
    #[error("{0}")]
    Desired(#[from] DesiredErrors),
    /// A process.
    #[error(transparent)]
    Supervise(#[from] SuperviseError),
    /// The cgroup hierarchy.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// A component did not become ready.
    #[error("{what} did not become ready within {waited:?}; its log: {}", log.display())]
    NotReady {
        /// The component.
        what: String,
        /// How long was waited.
        waited: Duration,
        /// Its log.
        log: PathBuf,
    },
    /// A file of the run directory.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Stopped (SIGTERM) while starting.
    #[error("stopped while starting")]
    Stopped,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> UpError + '_ {
    move |source| UpError::Io { path: path.to_owned(), source }
}

/// Writes `text` to `path` through a hidden temporary file (readers never see half of it, and
/// the folder sources skip hidden files).
pub fn write_atomic(path: &Path, text: &str) -> Result<(), UpError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// A pod that exists (or is being retried).
struct RunningPod {
    template: PodTemplate,
    node: usize,
    sandbox: Sandbox,
    ip: Option<Ipv4Addr>,
    containers: Vec<String>,
    ready: bool,
    created: Instant,
    cni_add: Duration,
}

/// A local cluster, owned by this process.
pub struct Cluster {
    cfg: UpConfig,
    layout: Layout,
    net: Network,
    nodes: Vec<PreparedNode>,
    sup: Supervisor,
    pods: BTreeMap<(String, String), RunningPod>,
    failed: BTreeMap<(String, String), (Instant, String)>,
    /// Objects folder file → content, for what the desired folder passes on.
    passed: BTreeMap<String, String>,
    desired: Desired,
    desired_stamp: Vec<(PathBuf, SystemTime, u64)>,
    /// The desired folder's own modification time and when its files were last all looked at.
    folder_stamp: (Option<SystemTime>, Instant),
    state: ClusterState,
    events: Vec<String>,
    cgroup_root: PathBuf,
    /// Each node proxy's generation (its ports alternate between two sets).
    proxy_generation: Vec<u32>,
}

impl Cluster {
    /// Builds and starts everything; `progress` is told each step. On failure what was built
    /// is left for [`crate::down::down`] (the record names it).
    pub fn start(
        cfg: UpConfig,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Cluster, UpError> {
        let layout = Layout(cfg.run_dir.clone());
        for dir in [
            layout.desired(),
            layout.objects(),
            layout.capture(),
            layout.control(),
            layout.logs(),
            layout.requests(),
        ] {
            std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        }
        let node_names: Vec<String> = (1..=cfg.nodes).map(|i| format!("node{i}")).collect();
        // The folder is checked before anything is built.
        let desired = Desired::load(&layout.desired(), &node_names)?;
        let spec = NetworkSpec {
            tag: cfg.tag.clone(),
            nodes: node_names.clone(),
            hosts: vec![CONTROL_HOST.to_owned()],
            segment: cfg.segment,
            pods: cfg.pods,
        };
        let plan = spec.plan()?;
        let cgroup_root = sandbox::cgroup2_mount()?.join(format!("ambit-{}.slice", cfg.tag));
        let mut state = ClusterState {
            version: VERSION,
            run_dir: cfg.run_dir.clone(),
            owner: std::process::id(),
            network: plan,
            cgroup_root: cgroup_root.clone(),
            pods: Vec::new(),
            phase: "building the network".into(),
            processes: Vec::new(),
            errors: Vec::new(),
            events: Vec::new(),
            proxy_ports: BTreeMap::new(),
        };
        // Recorded first: a crash from here on leaves a record for `ambit down`.
        state.save()?;
        progress(&format!(
            "network: {} nodes on {}, the control plane's namespace, a fabric bridge",
            cfg.nodes, state.network.segment
        ));
        let net = spec.build()?;
        state.network = net.clone();
        let mut nodes = Vec::new();
        for m in &net.nodes {
            nodes.push(node::prepare(&cfg.run_dir, m, &cfg.plugin_dirs)?);
        }
        let mut cluster = Cluster {
            cfg,
            layout,
            net,
            nodes,
            sup: Supervisor::new(),
            pods: BTreeMap::new(),
            failed: BTreeMap::new(),
            passed: BTreeMap::new(),
            desired: Desired::default(),
            desired_stamp: Vec::new(),
            folder_stamp: (None, Instant::now()),
            state,
            events: Vec::new(),
            cgroup_root,
            proxy_generation: Vec::new(),
        };
        cluster.proxy_generation = vec![0; cluster.nodes.len()];
        cluster.write_nodes()?;
        cluster.desired_stamp = cluster.stamp();
        cluster.pass_objects(&desired)?;
        cluster.phase("starting the control plane")?;
        progress(&format!("control plane: ambit control at {}:{CONTROL_GRPC}", cluster.control_ip()));
        cluster.start_control()?;
        cluster.wait_ready(
            "ambit control",
            "control",
            &cluster.control_netns(),
            CONTROL_READY,
            "/ready",
            stop,
        )?;
        for i in 0..cluster.nodes.len() {
            let name = cluster.nodes[i].member.name.clone();
            cluster.phase(&format!("starting node {name}"))?;
            progress(&format!(
                "node {name}: ambit agent and ambit proxy in {}, pods on {}",
                cluster.nodes[i].member.netns,
                cluster.nodes[i].member.pods.map(|p| p.cidr()).unwrap_or_default()
            ));
            cluster.start_agent(i)?;
            let ns = cluster.nodes[i].member.netns.clone();
            cluster.wait_ready(
                &format!("ambit agent on {name}"),
                &format!("agent/{name}"),
                &ns,
                AGENT_HEALTH,
                "/readyz",
                stop,
            )?;
            cluster.wait_chained(i, stop)?;
            let spec = cluster.proxy_spec(i, 0);
            cluster.sup.start(spec)?;
            cluster.wait_ready(
                &format!("ambit proxy on {name}"),
                &format!("proxy/{name}"),
                &ns,
                ProxyPorts::of_generation(0).ready,
                "/healthz/ready",
                stop,
            )?;
        }
        cluster.phase("creating pods")?;
        progress(&format!("pods: {} through the CNI chain", desired.pods.len()));
        cluster.desired = desired;
        cluster.reconcile();
        let deadline = Instant::now() + POD_READY_TIMEOUT;
        loop {
            // Failed pods are retried (after POD_RETRY) as kubelet retries a sandbox.
            cluster.reconcile();
            cluster.check_pods();
            if stop.load(Ordering::Relaxed) {
                return Err(UpError::Stopped);
            }
            let waiting: Vec<String> = cluster
                .pods
                .values()
                .filter(|p| !p.ready)
                .map(|p| format!("{}/{}", p.template.namespace, p.template.name))
                .chain(cluster.failed.iter().map(|((ns, n), (_, why))| format!("{ns}/{n} ({why})")))
                .collect();
            if waiting.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                let log = cluster.layout.logs();
                return Err(UpError::NotReady {
                    what: format!("pods {}", waiting.join(", ")),
                    waited: POD_READY_TIMEOUT,
                    log,
                });
            }
            cluster.supervise();
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster.phase("waiting for every node proxy to know every pod")?;
        cluster.wait_converged(stop)?;
        cluster.phase("ready")?;
        Ok(cluster)
    }

    /// Waits until every node proxy holds every pod's address (from the control plane), so the
    /// first connection after `ambit up` already finds its destination.
    fn wait_converged(&mut self, stop: &AtomicBool) -> Result<(), UpError> {
        let want: BTreeSet<String> =
            self.pods.values().filter_map(|p| p.ip).map(|ip| ip.to_string()).collect();
        let deadline = Instant::now() + READY_TIMEOUT;
        for i in 0..self.nodes.len() {
            let netns = self.nodes[i].member.netns.clone();
            loop {
                let admin = ProxyPorts::of_generation(self.proxy_generation[i]).admin;
                let have: BTreeSet<String> = match probe::http_get(&netns, admin, "/config_dump") {
                    Ok((200, body)) => {
                        let dump: Value = serde_json::from_str(&body).unwrap_or_default();
                        dump["workloads"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .flat_map(|w| w["workloadIps"].as_array().cloned().unwrap_or_default())
                            .filter_map(|ip| ip.as_str().map(str::to_owned))
                            .collect()
                    }
                    _ => BTreeSet::new(),
                };
                if want.is_subset(&have) {
                    break;
                }
                if stop.load(Ordering::Relaxed) {
                    return Err(UpError::Stopped);
                }
                if Instant::now() > deadline {
                    let name = self.nodes[i].member.name.clone();
                    let missing: Vec<&String> = want.difference(&have).collect();
                    return Err(UpError::NotReady {
                        what: format!("the proxy on {name} (it lacks the workloads of {missing:?})"),
                        waited: READY_TIMEOUT,
                        log: self.layout.log(&format!("proxy/{name}")),
                    });
                }
                self.supervise();
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The network.
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// The run directory's layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The control plane's namespace.
    pub fn control_netns(&self) -> String {
        self.net.member(CONTROL_HOST).map(|m| m.netns.clone()).unwrap_or_default()
    }

    /// The control plane's address.
    pub fn control_ip(&self) -> Ipv4Addr {
        self.net.member(CONTROL_HOST).map_or(Ipv4Addr::UNSPECIFIED, |m| m.ip)
    }

    /// One round: processes supervised, the desired folder applied if it changed, pods checked,
    /// the record written.
    pub fn tick(&mut self) {
        self.supervise();
        // Every file's size and time are read when the folder's own time moved (a file added,
        // removed or renamed over, as `ambit apply` writes) or a second after the last full look
        // (an edit in place): a folder of thousands of objects is not stat'ed ten times a second.
        let folder = std::fs::metadata(self.layout.desired()).and_then(|m| m.modified()).ok();
        if folder != self.folder_stamp.0 || self.folder_stamp.1.elapsed() >= FULL_STAMP_EVERY {
            self.folder_stamp = (folder, Instant::now());
            self.apply_desired();
        }
        self.reconcile();
        self.check_pods();
        self.handle_requests();
        let _ = self.save();
    }

    /// The desired folder applied if a file of it changed (once the whole folder checks).
    fn apply_desired(&mut self) {
        let stamp = self.stamp();
        if stamp != self.desired_stamp {
            self.desired_stamp = stamp;
            let names: Vec<String> = self.nodes.iter().map(|n| n.member.name.clone()).collect();
            match Desired::load(&self.layout.desired(), &names) {
                Ok(d) => {
                    self.state.errors.clear();
                    if let Err(e) = self.pass_objects(&d) {
                        self.state.errors.push(e.to_string());
                    }
                    self.desired = d;
                    self.event("applied the desired folder".into());
                }
                Err(e) => {
                    self.state.errors = e.0.iter().map(ToString::to_string).collect();
                    self.event(format!(
                        "the desired folder has {} problem(s); nothing of it applied",
                        e.0.len()
                    ));
                }
            }
        }
    }

    /// Runs until `stop` is set, then stops everything.
    pub fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.tick();
            std::thread::sleep(POLL);
        }
        self.stop();
    }

    /// Stops everything: every pod deleted (containers, CNI DEL while the agents still run,
    /// sandbox), then the proxies, agents and control plane, then the network.
    pub fn stop(mut self) {
        let _ = self.phase("stopping");
        let keys: Vec<(String, String)> = self.pods.keys().cloned().collect();
        for k in keys {
            self.delete_pod(&k);
        }
        self.sup.stop_all(STOP_GRACE);
        for e in self.net.teardown() {
            tracing::warn!("{e}");
        }
        let _ = std::fs::remove_dir(&self.cgroup_root);
        let _ = self.phase("stopped");
    }

    fn phase(&mut self, phase: &str) -> Result<(), UpError> {
        self.state.phase = phase.to_owned();
        self.save()
    }

    fn save(&mut self) -> Result<(), UpError> {
        self.state.network = self.net.clone();
        self.state.processes = self.sup.status();
        self.state.events = self.events.clone();
        self.state.proxy_ports = self
            .nodes
            .iter()
            .zip(&self.proxy_generation)
            .map(|(n, g)| (n.member.name.clone(), ProxyPorts::of_generation(*g)))
            .collect();
        self.state.pods = self
            .pods
            .values()
            .map(|p| PodState {
                namespace: p.template.namespace.clone(),
                name: p.template.name.clone(),
                uid: p.sandbox.pod.uid.clone(),
                node: self.nodes[p.node].member.name.clone(),
                netns: p.sandbox.netns.clone(),
                container_id: p.sandbox.pod.container_id.clone(),
                ip: p.ip,
                service_account: p.template.service_account.clone(),
                phase: if p.ready { "Ready" } else { "Running" }.into(),
                message: String::new(),
                cni_add_ms: p.cni_add.as_secs_f64() * 1e3,
            })
            .chain(self.failed.iter().map(|((ns, name), (_, why))| PodState {
                namespace: ns.clone(),
                name: name.clone(),
                phase: "Failed".into(),
                message: why.clone(),
                ..PodState::default()
            }))
            .collect();
        Ok(self.state.save()?)
    }

    fn event(&mut self, what: String) {
        let at = humantime_now();
        tracing::info!("{what}");
        self.events.push(format!("{at} {what}"));
        if self.events.len() > MAX_EVENTS {
            self.events.remove(0);
        }
    }

    fn supervise(&mut self) {
        for e in self.sup.tick() {
            let text = match e {
                Event::Exited { name, status } => format!("{name} exited ({status})"),
                Event::Restarted { name, restarts } => format!("{name} restarted (restart #{restarts})"),
                Event::RestartFailed { name, error } => format!("{name} could not be restarted: {error}"),
            };
            self.event(text);
        }
    }

    /// The desired folder's files and their stamps.
    fn stamp(&self) -> Vec<(PathBuf, SystemTime, u64)> {
        crate::desired::yaml_files(&self.layout.desired())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| {
                let m = std::fs::metadata(&p).ok()?;
                Some((p, m.modified().ok()?, m.len()))
            })
            .collect()
    }

    fn write_nodes(&self) -> Result<(), UpError> {
        for (i, n) in self.nodes.iter().enumerate() {
            let obj = json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": n.member.name,
                    "labels": {
                        "kubernetes.io/hostname": n.member.name,
                        "topology.kubernetes.io/region": "local",
                        "topology.kubernetes.io/zone": format!("zone{}", i + 1),
                    },
                },
                "spec": { "podCIDR": n.member.pods.map(|p| p.cidr()) },
                "status": { "addresses": [{ "type": "InternalIP", "address": n.member.ip.to_string() }] },
            });
            let path = self.layout.objects().join(format!("node-{}.yaml", n.member.name));
            write_atomic(&path, &pretty(&obj))?;
        }
        Ok(())
    }

    /// Writes the desired objects that are handed on as written; removes those gone. The
    /// namespaces every cluster has (`default`, `istio-system`) are written too unless the
    /// folder defines them, as an API server always has them.
    fn pass_objects(&mut self, d: &Desired) -> Result<(), UpError> {
        let mut now: BTreeMap<String, String> = BTreeMap::new();
        for ns in [crate::desired::DEFAULT_NAMESPACE, crate::desired::SYSTEM_NAMESPACE] {
            if !d.passed.iter().any(|p| p.kind == ambit_objects::Kind::Namespace && p.name == ns) {
                let obj = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } });
                now.insert(format!("namespace-{ns}.yaml"), pretty(&obj));
            }
        }
        for p in &d.passed {
            let file = format!("{}-{}-{}.yaml", p.kind.name().to_ascii_lowercase(), p.namespace, p.name)
                .replace("--", "-");
            now.insert(file, pretty(&p.value));
        }
        for (file, text) in &now {
            if self.passed.get(file) != Some(text) {
                write_atomic(&self.layout.objects().join(file), text)?;
            }
        }
        for file in self.passed.keys() {
            if !now.contains_key(file) {
                let path = self.layout.objects().join(file);
                std::fs::remove_file(&path).map_err(io_err(&path))?;
            }
        }
        self.passed = now;
        Ok(())
    }

    /// Waits for `GET path` on `port` in `netns` to answer 200, supervising meanwhile.
    fn wait_ready(
        &mut self,
        what: &str,
        process: &str,
        netns: &str,
        port: u16,
        path: &str,
        stop: &AtomicBool,
    ) -> Result<(), UpError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        while !probe::ready(netns, port, path) {
            if stop.load(Ordering::Relaxed) {
                return Err(UpError::Stopped);
            }
            if Instant::now() > deadline {
                return Err(UpError::NotReady {
                    what: what.into(),
                    waited: READY_TIMEOUT,
                    log: self.layout.log(process),
                });
            }
            self.supervise();
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Waits until node `i`'s agent has chained `ambit-cni` into the node's network.
    fn wait_chained(&mut self, i: usize, stop: &AtomicBool) -> Result<(), UpError> {
        let plugin =
            self.cfg.ambit_cni.file_name().and_then(|n| n.to_str()).unwrap_or("ambit-cni").to_owned();
        let conf = self.nodes[i].dirs.conf_dir();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if NetworkList::load_dir(&conf).is_ok_and(|l| l.types().contains(&plugin.as_str())) {
                return Ok(());
            }
            if stop.load(Ordering::Relaxed) {
                return Err(UpError::Stopped);
            }
            if Instant::now() > deadline {
                let name = &self.nodes[i].member.name;
                return Err(UpError::NotReady {
                    what: format!("the CNI chain of {name} (the agent did not install {plugin})"),
                    waited: READY_TIMEOUT,
                    log: self.layout.log(&format!("agent/{name}")),
                });
            }
            self.supervise();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// Seconds since the epoch, for event lines.
fn humantime_now() -> String {
    let t = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let s = t.as_secs();
    format!("{:02}:{:02}:{:02}", (s / 3600) % 24, (s / 60) % 60, s % 60)
}

/// Runs the cluster in this process until `stop` is set: starts it, reports each step and the
/// outcome in the progress file (`ready`, or `failed: …`), then supervises it.
pub fn run(cfg: UpConfig, stop: &AtomicBool) -> Result<(), UpError> {
    let layout = Layout(cfg.run_dir.clone());
    std::fs::create_dir_all(&cfg.run_dir).map_err(io_err(&cfg.run_dir))?;
    let progress_path = layout.progress();
    let mut lines = String::new();
    let mut progress = |line: &str| {
        tracing::info!("{line}");
        lines.push_str(line);
        lines.push('\n');
        let _ = write_atomic(&progress_path, &lines);
    };
    match Cluster::start(cfg, stop, &mut progress) {
        Ok(cluster) => {
            progress("ready");
            cluster.run(stop);
            Ok(())
        }
        Err(e) => {
            progress(&format!("failed: {e}"));
            Err(e)
        }
    }
}

/// The host's cores (1 if unknown).
fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// `ZTUNNEL_WORKER_THREADS` of every node proxy: `ambit up`'s own environment value if it has
/// one, else the proxy's rule (a quarter of the node's cores, rounded up) applied to each node's
/// share of the host (`cores / nodes`), at least 1. Not the proxy's floor of 2: the nodes share
/// the host's cores, and on a small host two workers per proxy put more worker threads than
/// cores under every connection, which costs CPU and latency in hand-offs between threads
/// (measured in BENCHMARKS.md, issue 13).
fn proxy_workers(env: Option<String>, cores: usize, nodes: usize) -> String {
    match env.map(|v| v.trim().to_owned()) {
        Some(v) if !v.is_empty() => v,
        _ => (cores / nodes.max(1)).div_ceil(4).max(1).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::proxy_workers;

    #[test]
    fn node_proxies_get_a_quarter_of_their_share_of_the_host() {
        assert_eq!(proxy_workers(None, 2, 2), "1");
        assert_eq!(proxy_workers(None, 2, 1), "1");
        assert_eq!(proxy_workers(None, 1, 3), "1", "at least one");
        assert_eq!(proxy_workers(None, 16, 2), "2");
        assert_eq!(proxy_workers(None, 64, 2), "8");
        assert_eq!(proxy_workers(None, 8, 0), "2", "no division by zero");
        assert_eq!(proxy_workers(Some(" 4 ".into()), 2, 2), "4", "the user's setting wins");
        assert_eq!(proxy_workers(Some("50%".into()), 2, 2), "50%");
        assert_eq!(proxy_workers(Some(String::new()), 2, 2), "1", "empty means unset");
    }
}
