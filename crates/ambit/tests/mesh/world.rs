//! A node as a runtime sees it: the real node agent (`ambit agent`, file source), the shared-mode
//! node proxy, a CNI runtime that runs the reference plugins followed by `ambit-cni`, and the
//! agent's folder of Pod/Namespace objects. Used by the agent/CNI tests, the handoff test and the
//! end-to-end benchmark.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::super::common::*;
use super::{Mesh, ambit, node_http_get};

/// The agent's health port (inside the node netns).
pub const AGENT_HEALTH: u16 = 8000;
/// The agent's metrics port (inside the node netns).
pub const AGENT_METRICS: u16 = 15014;
/// The node name the agent is started with (and the pods are written with).
pub const NODE: &str = "node";

/// A node with the agent, the node proxy, a CNI runtime and the agent's source folder.
pub struct World {
    // Dropped first: processes before the namespaces they run in.
    /// The node proxy, once started.
    pub proxy: Option<ChildGuard>,
    /// The agent, once started.
    pub agent: Option<ChildGuard>,
    /// The container runtime of the node.
    pub rt: CniRuntime,
    /// The cluster, dev CA and the proxy's local config.
    pub mesh: Mesh,
    dir: tempfile::TempDir,
    poll: &'static str,
}

impl World {
    pub fn new(poll: &'static str) -> World {
        let mesh = Mesh::new();
        mesh.write_raw("workloads: []\npolicies: []\nservices: []\n");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("source")).expect("source dir");
        let conf = json!({
            "cni_agent_run_dir": dir.path().join("run"),
            "exclude_namespaces": ["kube-system"],
            "pod_namespace": "ambit-system",
            "agent_timeout_ms": 10000,
        });
        let rt = CniRuntime::new(mesh.cluster.node(), Some(conf));
        World { proxy: None, agent: None, rt, mesh, dir, poll }
    }

    pub fn node(&self) -> &Node {
        self.mesh.cluster.node()
    }

    pub fn source(&self) -> PathBuf {
        self.dir.path().join("source")
    }

    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    pub fn zds(&self) -> PathBuf {
        self.dir.path().join("zds.sock")
    }

    /// Starts the agent in the node netns and waits for `/readyz`.
    pub fn start_agent(&mut self) {
        self.start_agent_with(&[]);
    }

    /// Like [`World::start_agent`] with more command-line arguments.
    pub fn start_agent_with(&mut self, extra: &[&str]) {
        assert!(self.agent.is_none(), "agent already running");
        let dir = self.dir.path();
        let (src, run, zds) = (self.source(), self.run_dir(), self.zds());
        let args: Vec<&str> = vec![
            "agent",
            "--source-dir",
            src.to_str().unwrap_or_default(),
            "--node-name",
            NODE,
            "--run-dir",
            run.to_str().unwrap_or_default(),
            "--zds-socket",
            zds.to_str().unwrap_or_default(),
            "--source-poll",
            self.poll,
            "--metrics-addr",
            "127.0.0.1:15014",
            "--health-addr",
            "127.0.0.1:8000",
            "--exclude-namespaces",
            "kube-system",
        ];
        let args: Vec<&str> = args.into_iter().chain(extra.iter().copied()).collect();
        let mut cmd = self.node().exec(ambit(), &args);
        cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("RUST_LOG", "info");
        let mut agent = ChildGuard::spawn("agent", cmd);
        let ready = wait_for(
            || {
                agent.try_wait().is_none()
                    && node_http_get(self.node(), AGENT_HEALTH, "/readyz").is_ok_and(|(s, _)| s == 200)
            },
            Duration::from_secs(20),
        );
        assert!(ready, "agent did not become ready (dir {}):\n{}", dir.display(), agent.logs());
        self.agent = Some(agent);
    }

    pub fn agent(&mut self) -> &mut ChildGuard {
        self.agent.as_mut().unwrap_or_else(|| panic!("the agent is not running"))
    }

    pub fn agent_logs(&self) -> String {
        self.agent.as_ref().map(ChildGuard::logs).unwrap_or_default()
    }

    pub fn proxy_logs(&self) -> String {
        self.proxy.as_ref().map(ChildGuard::logs).unwrap_or_default()
    }

    /// Stops the agent with `signal` (SIGTERM: waits for a clean exit; SIGKILL: at once).
    pub fn stop_agent(&mut self, signal: Signal) -> ChildGuard {
        let mut agent = self.agent.take().unwrap_or_else(|| panic!("the agent is not running"));
        if signal == Signal::SIGKILL {
            agent.kill();
        } else {
            agent.signal(signal);
            let status = agent.wait_timeout(Duration::from_secs(10));
            assert!(
                status.is_some_and(|s| s.success()),
                "agent did not exit cleanly on {signal}: {status:?}"
            );
        }
        agent
    }

    /// Starts the node proxy on the agent's ZDS socket and waits for readiness.
    pub fn start_proxy(&mut self) {
        assert!(self.proxy.is_none(), "proxy already running");
        let proxy = self.mesh.start_node_proxy(self.node(), &self.zds(), &[]);
        self.proxy = Some(proxy);
    }

    pub fn stop_proxy(&mut self) {
        if let Some(mut p) = self.proxy.take() {
            p.stop(Duration::from_secs(5));
        }
    }

    pub fn write_namespace(&self, name: &str, enrolled: bool) {
        let labels = if enrolled { "  labels:\n    istio.io/dataplane-mode: ambient\n" } else { "" };
        let yaml = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n{labels}");
        write_atomic(&self.source().join(format!("ns-{name}.yaml")), &yaml);
    }

    /// Writes the Pod object; `ip` as kubelet reports it once the sandbox has one.
    pub fn write_pod(&self, sb: &Sandbox, ip: Option<Ipv4Addr>) {
        let status = match ip {
            Some(ip) => format!("status:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n"),
            None => "status:\n  phase: Pending\n".to_owned(),
        };
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {}\n  namespace: {}\n  uid: {}\nspec:\n  nodeName: {NODE}\n  serviceAccountName: default\n{status}",
            sb.name, sb.namespace, sb.uid
        );
        write_atomic(&self.pod_file(sb), &yaml);
    }

    pub fn remove_pod(&self, sb: &Sandbox) {
        std::fs::remove_file(self.pod_file(sb)).unwrap_or_else(|e| panic!("remove pod {}: {e}", sb.name));
    }

    pub fn pod_file(&self, sb: &Sandbox) -> PathBuf {
        self.source().join(format!("pod-{}-{}.yaml", sb.namespace, sb.name))
    }

    /// A sandbox with its Pod object written (no IP yet, as before the CNI ADD).
    pub fn new_pod(&self, namespace: &str, name: &str) -> Sandbox {
        let sb = self.rt.sandbox(namespace, name);
        self.write_pod(&sb, None);
        sb
    }

    /// CNI ADD that must succeed; then kubelet's status update (the pod's IP) is written.
    pub fn add_ok(&self, sb: &mut Sandbox) {
        if let Err(e) = self.rt.add(sb) {
            panic!(
                "CNI ADD of {}/{} failed: {e}\n--- agent ---\n{}",
                sb.namespace,
                sb.name,
                self.agent_logs()
            );
        }
        self.write_pod(sb, Some(sb.ip4()));
    }

    /// The proxy's local config: these pods as HBONE workloads.
    pub fn mesh_config(&self, pods: &[&Sandbox]) {
        let mut y = String::from("workloads:\n");
        for sb in pods {
            y.push_str(&format!(
                "- uid: cluster1//v1/Pod/{ns}/{name}\n  name: {name}\n  namespace: {ns}\n  serviceAccount: default\n  trustDomain: cluster.local\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n",
                ns = sb.namespace,
                name = sb.name,
                ip = sb.ip4()
            ));
        }
        if pods.is_empty() {
            y = "workloads: []\n".into();
        }
        y.push_str("policies: []\nservices: []\n");
        self.mesh.write_raw(&y);
        if let Some(last) = pods.last() {
            let needle = format!("\"{}\"", last.ip4());
            let seen = wait_for(
                || {
                    node_http_get(self.node(), 15000, "/config_dump")
                        .is_ok_and(|(s, b)| s == 200 && b.contains(&needle))
                },
                Duration::from_secs(10),
            );
            assert!(seen, "the node proxy never loaded the config with {needle}");
        }
    }

    /// The proxy's pods (uid → state) from `/config_dump`.
    pub fn proxy_pods(&self) -> BTreeMap<String, String> {
        let Ok((200, body)) = node_http_get(self.node(), 15000, "/config_dump") else {
            return BTreeMap::new();
        };
        let dump: Value = serde_json::from_str(&body).unwrap_or_default();
        dump["workloadState"]
            .as_object()
            .map(|m| {
                m.iter().map(|(k, v)| (k.clone(), v["state"].as_str().unwrap_or("?").to_owned())).collect()
            })
            .unwrap_or_default()
    }

    pub fn wait_proxy_state(&self, uid: &str, want: Option<&str>, what: &str) {
        let ok = wait_for(|| self.proxy_pods().get(uid).map(String::as_str) == want, Duration::from_secs(10));
        assert!(
            ok,
            "{what}: proxy state of {uid} is {:?}, want {want:?}\n--- agent ---\n{}\n--- proxy ---\n{}",
            self.proxy_pods().get(uid),
            self.agent_logs(),
            self.proxy_logs()
        );
    }

    pub fn agent_metric(&self, name: &str) -> Option<f64> {
        metric(&node_http_get(self.node(), AGENT_METRICS, "/metrics").ok()?.1, name)
    }

    pub fn proxy_metric(&self, name: &str) -> Option<f64> {
        metric(&node_http_get(self.node(), 15020, "/metrics").ok()?.1, name)
    }

    pub fn enrollment_cache(&self) -> Value {
        let text = std::fs::read_to_string(self.run_dir().join("enrollment.json")).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or_default()
    }
}

pub fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

/// First sample of a Prometheus metric (`name` may include labels, e.g. `x{state="enrolled"}`).
pub fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

/// Log text without ANSI colour escapes.
pub fn plain(logs: &str) -> String {
    let mut out = String::with_capacity(logs.len());
    let mut chars = logs.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ params final-byte
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether a TCP socket listens on `port` in the netns of `pid` (read from /proc, no exec).
pub fn listening(pid: u32, port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.get(1).is_some_and(|a| a.ends_with(&want)) && cols.get(3) == Some(&"0A")
            })
        })
    })
}
