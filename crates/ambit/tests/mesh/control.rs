//! A small cluster run by the real control plane: `ambit control` on a folder of YAML
//! (Namespaces, Nodes, Pods, Services and Istio policies, the same objects a user writes for
//! Kubernetes), and per node the real agent (file source on the same folder, capture state
//! published for the control plane) and a shared-mode `ambit proxy` that has only
//! `XDS_ADDRESS`/`CA_ADDRESS`, the mesh root and its node's token: no local config, no FAKE_CA.
//! Pods are created through each node's CNI chain (reference plugins, then `ambit-cni`).
//!
//! Layout: the control plane runs in a netns of its own on the cluster's L2 segment; each node
//! netns holds its CNI bridge with its own pod subnet, and routes to the other nodes' pod
//! subnets through their bridge addresses.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::super::common::*;
use super::{ControlEndpoint, Mesh, ambit, node_http_get, write_atomic};

/// `ambit control`'s gRPC TLS port (xDS + CA).
pub const CONTROL_GRPC: u16 = 15012;
/// `ambit control`'s monitoring port (`/metrics`, `/debug/...`).
pub const CONTROL_MONITORING: u16 = 15014;
/// `ambit control`'s readiness port (`/ready`).
pub const CONTROL_READY: u16 = 8080;
/// The name in the control plane's serving certificate that proxies verify.
pub const CONTROL_HOSTNAME: &str = "istiod.istio-system.svc";

/// One node: its CNI runtime, agent and proxy.
pub struct ClusterNode {
    // Dropped first: processes before the namespaces they run in.
    /// The node proxy, once started.
    pub proxy: Option<ChildGuard>,
    /// The agent, once started.
    pub agent: Option<ChildGuard>,
    /// The node's container runtime.
    pub rt: CniRuntime,
    /// The node's netns.
    pub node: Node,
    dir: PathBuf,
}

/// The cluster.
pub struct ControlCluster {
    /// The nodes (dropped before the control plane and the network).
    pub nodes: Vec<ClusterNode>,
    /// `ambit control`, once started.
    pub control: Option<ChildGuard>,
    /// The control plane's netns.
    pub control_node: Node,
    /// The network (and the proxies' settings).
    pub mesh: Mesh,
    dir: tempfile::TempDir,
}

/// A pod's description for its YAML.
#[derive(Clone, Debug)]
pub struct PodSpec {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Service account.
    pub sa: String,
    /// Labels.
    pub labels: Vec<(String, String)>,
}

impl PodSpec {
    /// A pod `namespace/name` with service account `sa` and label `app=<name>`.
    pub fn new(namespace: &str, name: &str, sa: &str) -> PodSpec {
        PodSpec {
            namespace: namespace.into(),
            name: name.into(),
            sa: sa.into(),
            labels: vec![("app".into(), name.into())],
        }
    }

    /// With label `k=v` (replacing any value `k` had).
    pub fn label(mut self, k: &str, v: &str) -> PodSpec {
        self.labels.retain(|(key, _)| key != k);
        self.labels.push((k.into(), v.into()));
        self
    }
}

/// A pod created through a node's CNI chain, with its YAML written.
pub struct ClusterPod {
    /// The description.
    pub spec: PodSpec,
    /// Index of its node.
    pub node: usize,
    /// The sandbox (netns, pause process, CNI result).
    pub sb: Sandbox,
}

impl ClusterPod {
    /// A harness handle for exec, connect and echo servers in the pod's netns.
    pub fn pod(&self) -> Pod {
        self.sb.pod()
    }

    /// Its IPv4 address.
    pub fn ip4(&self) -> Ipv4Addr {
        self.sb.ip4()
    }

    /// Its workload uid as istiod names it.
    pub fn uid(&self) -> String {
        format!("Kubernetes//Pod/{}/{}", self.spec.namespace, self.spec.name)
    }

    /// Its SPIFFE identity.
    pub fn identity(&self) -> String {
        format!("spiffe://cluster.local/ns/{}/sa/{}", self.spec.namespace, self.spec.sa)
    }
}

impl ControlCluster {
    /// `n` nodes (`node`, `node2`, …), routed to each other, and the control plane's netns.
    pub fn new(n: usize) -> ControlCluster {
        assert!(n >= 1);
        let mesh = Mesh::new();
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["config", "capture", "state"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("dirs");
        }
        let mut nodes: Vec<ClusterNode> = Vec::new();
        for i in 0..n {
            let node = if i == 0 {
                mesh.cluster.node().clone()
            } else {
                mesh.cluster.add_node(&format!("node{}", i + 1))
            };
            let ndir = dir.path().join(format!("n-{}", node.name));
            std::fs::create_dir_all(&ndir).expect("node dir");
            let conf = json!({
                "cni_agent_run_dir": ndir.join("run"),
                "exclude_namespaces": ["kube-system"],
                "pod_namespace": "istio-system",
                "agent_timeout_ms": 10000,
            });
            // Distinct pod subnets per node (the runtime picks a random one).
            let rt = loop {
                let rt = CniRuntime::new(&node, Some(conf.clone()));
                if nodes.iter().all(|o| o.rt.subnet != rt.subnet) {
                    break rt;
                }
            };
            nodes.push(ClusterNode { proxy: None, agent: None, rt, node, dir: ndir });
        }
        let control_node = mesh.cluster.add_node("control");
        let c = ControlCluster { nodes, control: None, control_node, mesh, dir };
        for (i, n) in c.nodes.iter().enumerate() {
            c.write(&format!("node-{}.yaml", n.node.name), &node_yaml(&n.node.name, i));
        }
        c
    }

    /// The YAML folder `ambit control` and the agents read.
    pub fn config_dir(&self) -> PathBuf {
        self.dir.path().join("config")
    }

    /// The agents' capture state, which the control plane reads.
    pub fn capture_dir(&self) -> PathBuf {
        self.dir.path().join("capture")
    }

    /// The control plane's state (its CA, the node tokens, the root bundle).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Writes (atomically) one file of the YAML folder.
    pub fn write(&self, file: &str, yaml: &str) {
        write_atomic(&self.config_dir().join(file), yaml);
    }

    /// Removes one file of the YAML folder.
    pub fn remove(&self, file: &str) {
        std::fs::remove_file(self.config_dir().join(file)).unwrap_or_else(|e| panic!("remove {file}: {e}"));
    }

    /// A Namespace, enrolled in the mesh or not.
    pub fn write_namespace(&self, name: &str, enrolled: bool) {
        let labels = if enrolled { "  labels:\n    istio.io/dataplane-mode: ambient\n" } else { "" };
        self.write(
            &format!("ns-{name}.yaml"),
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n{labels}"),
        );
    }

    /// Starts `ambit control` (default poll and debounce, as users run it) and waits until it is
    /// ready; points the proxies at it.
    pub fn start_control(&mut self) {
        self.start_control_with(&[]);
    }

    /// Like [`ControlCluster::start_control`] with more arguments.
    pub fn start_control_with(&mut self, extra: &[&str]) {
        assert!(self.control.is_none(), "control already running");
        let (config, capture, state) = (self.config_dir(), self.capture_dir(), self.state_dir());
        let grpc = format!("0.0.0.0:{CONTROL_GRPC}");
        let monitoring = format!("0.0.0.0:{CONTROL_MONITORING}");
        let ready = format!("0.0.0.0:{CONTROL_READY}");
        let mut args: Vec<&str> = vec![
            "control",
            "--config",
            config.to_str().unwrap_or_default(),
            "--capture-state-dir",
            capture.to_str().unwrap_or_default(),
            "--state-dir",
            state.to_str().unwrap_or_default(),
            "--secure-grpc-addr",
            &grpc,
            "--grpc-addr",
            "",
            "--monitoring-addr",
            &monitoring,
            "--http-addr",
            &ready,
        ];
        args.extend_from_slice(extra);
        let mut cmd = self.control_node.exec(ambit(), &args);
        cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("RUST_LOG", "info");
        let mut control = ChildGuard::spawn("control", cmd);
        let ok = wait_for(
            || {
                control.try_wait().is_none()
                    && node_http_get(&self.control_node, CONTROL_READY, "/ready").is_ok_and(|(s, _)| s == 200)
            },
            Duration::from_secs(30),
        );
        assert!(ok, "ambit control did not become ready:\n{}", control.logs());
        self.control = Some(control);
        self.mesh.use_control(ControlEndpoint {
            url: format!("https://{}:{CONTROL_GRPC}", self.control_node.ip4),
            root: self.state_dir().join("root-cert.pem"),
            token_dir: self.state_dir().join("tokens"),
            hostname: CONTROL_HOSTNAME.into(),
        });
    }

    /// Kills `ambit control` (SIGKILL) and returns its guard (for its logs).
    pub fn kill_control(&mut self) -> ChildGuard {
        let mut c = self.control.take().unwrap_or_else(|| panic!("control is not running"));
        c.kill();
        c
    }

    /// The control plane's logs.
    pub fn control_logs(&self) -> String {
        self.control.as_ref().map(ChildGuard::logs).unwrap_or_default()
    }

    /// A GET on the control plane's monitoring port.
    pub fn control_get(&self, path: &str) -> (u16, String) {
        node_http_get(&self.control_node, CONTROL_MONITORING, path)
            .unwrap_or_else(|e| panic!("GET {path} on ambit control: {e}"))
    }

    /// Starts node `i`'s agent (and waits for `/readyz`), then its proxy (and waits for
    /// readiness, which needs the control plane's xDS).
    pub fn start_node(&mut self, i: usize) {
        self.start_agent(i);
        self.start_proxy(i);
    }

    /// Starts node `i`'s agent.
    pub fn start_agent(&mut self, i: usize) {
        let config = self.config_dir();
        let capture = self.capture_dir();
        let n = &mut self.nodes[i];
        assert!(n.agent.is_none(), "agent already running");
        let (run, zds) = (n.dir.join("run"), n.dir.join("zds.sock"));
        let args: Vec<&str> = vec![
            "agent",
            "--source-dir",
            config.to_str().unwrap_or_default(),
            "--capture-state-dir",
            capture.to_str().unwrap_or_default(),
            "--node-name",
            &n.node.name,
            "--run-dir",
            run.to_str().unwrap_or_default(),
            "--zds-socket",
            zds.to_str().unwrap_or_default(),
            "--source-poll",
            "50ms",
            "--metrics-addr",
            "127.0.0.1:15014",
            "--health-addr",
            "127.0.0.1:8000",
            "--exclude-namespaces",
            "kube-system",
        ];
        let mut cmd = n.node.exec(ambit(), &args);
        cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("RUST_LOG", "info");
        let mut agent = ChildGuard::spawn(&format!("agent {}", n.node.name), cmd);
        let ready = wait_for(
            || {
                agent.try_wait().is_none()
                    && node_http_get(&n.node, 8000, "/readyz").is_ok_and(|(s, _)| s == 200)
            },
            Duration::from_secs(20),
        );
        assert!(ready, "agent on {} did not become ready:\n{}", n.node.name, agent.logs());
        n.agent = Some(agent);
    }

    /// Starts node `i`'s shared-mode proxy against the control plane.
    pub fn start_proxy(&mut self, i: usize) {
        assert!(self.mesh_has_control(), "start the control plane first");
        let zds = self.nodes[i].dir.join("zds.sock");
        let proxy = self.mesh.start_node_proxy(&self.nodes[i].node, &zds, &[]);
        self.nodes[i].proxy = Some(proxy);
    }

    fn mesh_has_control(&self) -> bool {
        self.control.is_some()
    }

    /// Creates pod `spec` on node `i`: writes its YAML (Pending, no IP), runs the CNI chain,
    /// then writes what kubelet reports (Running, Ready, its IP).
    pub fn add_pod(&self, i: usize, spec: PodSpec) -> ClusterPod {
        let n = &self.nodes[i];
        let mut sb = n.rt.sandbox(&spec.namespace, &spec.name);
        self.write_pod(&spec, &sb, &n.node.name, None);
        if let Err(e) = n.rt.add(&mut sb) {
            panic!(
                "CNI ADD of {}/{} on {} failed: {e}\n--- agent ---\n{}",
                spec.namespace,
                spec.name,
                n.node.name,
                n.agent.as_ref().map(ChildGuard::logs).unwrap_or_default()
            );
        }
        let ip = sb.ip4();
        self.write_pod(&spec, &sb, &n.node.name, Some(ip));
        ClusterPod { spec, node: i, sb }
    }

    /// Deletes a pod: its YAML, then CNI DEL.
    pub fn delete_pod(&self, p: ClusterPod) {
        self.remove(&pod_file(&p.spec));
        if let Err(e) = self.nodes[p.node].rt.del(&p.sb) {
            panic!("CNI DEL of {}: {e}", p.spec.name);
        }
    }

    fn write_pod(&self, spec: &PodSpec, sb: &Sandbox, node: &str, ip: Option<Ipv4Addr>) {
        let labels: String = spec.labels.iter().map(|(k, v)| format!("    {k}: \"{v}\"\n")).collect();
        let status = match ip {
            Some(ip) => format!(
                "status:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n  - ip: {ip}\n  conditions:\n  - type: Ready\n    status: \"True\"\n"
            ),
            None => "status:\n  phase: Pending\n".to_owned(),
        };
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  uid: {uid}\n  labels:\n{labels}spec:\n  nodeName: {node}\n  serviceAccountName: {sa}\n  containers:\n  - name: app\n    image: app\n    ports:\n    - name: echo\n      containerPort: 8080\n{status}",
            name = spec.name,
            ns = spec.namespace,
            uid = sb.uid,
            sa = spec.sa,
        );
        self.write(&pod_file(spec), &yaml);
    }

    /// Node `i`'s proxy `/config_dump`, parsed.
    pub fn proxy_dump(&self, i: usize) -> Value {
        match node_http_get(&self.nodes[i].node, 15000, "/config_dump") {
            Ok((200, body)) => serde_json::from_str(&body).unwrap_or_default(),
            _ => Value::Null,
        }
    }

    /// Whether node `i`'s proxy holds the workload with `uid`.
    pub fn proxy_has_workload(&self, i: usize, uid: &str) -> bool {
        self.proxy_dump(i).to_string().contains(&format!("\"{uid}\""))
    }

    /// Node `i`'s proxy `/metrics`.
    pub fn proxy_metrics(&self, i: usize) -> String {
        match node_http_get(&self.nodes[i].node, 15020, "/metrics") {
            Ok((200, body)) => body,
            other => panic!("node proxy {i} /metrics: {other:?}"),
        }
    }

    /// Logs of every process, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = format!("--- control ---\n{}\n", self.control_logs());
        for n in &self.nodes {
            for (what, p) in [("agent", &n.agent), ("proxy", &n.proxy)] {
                out.push_str(&format!(
                    "--- {what} {} ---\n{}\n",
                    n.node.name,
                    p.as_ref().map(ChildGuard::logs).unwrap_or_default()
                ));
            }
        }
        out
    }

    /// Adds routes between the nodes' pod subnets (call once every node exists).
    pub fn route_nodes(&self) {
        for a in &self.nodes {
            for b in &self.nodes {
                if a.node.name == b.node.name {
                    continue;
                }
                let via = b.node.ip4.to_string();
                let out =
                    a.node.exec("ip", &["route", "replace", &b.rt.subnet, "via", &via]).output().expect("ip");
                assert!(
                    out.status.success(),
                    "route {} via {via}: {}",
                    b.rt.subnet,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let out = a.node.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"]).output().expect("sysctl");
            assert!(out.status.success(), "ip_forward in {}", a.node.name);
        }
    }

    /// Where a pod's echo server listens.
    pub fn echo_addr(p: &ClusterPod, port: u16) -> SocketAddr {
        SocketAddr::new(p.ip4().into(), port)
    }

    /// The state directory path, for tests that read the control plane's files.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn pod_file(spec: &PodSpec) -> String {
    format!("pod-{}-{}.yaml", spec.namespace, spec.name)
}

/// A Node object with topology labels (region `r1`, zone `z<i>`).
fn node_yaml(name: &str, i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    topology.kubernetes.io/region: r1\n    topology.kubernetes.io/zone: z{i}\n"
    )
}
