//! Mesh-level helpers for the proxy e2e tests: a cluster with a shared dev CA, pods described
//! as workloads of a ztunnel-format local config, and proxy processes per pod.

#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::common::*;

mod world;
mod xds;
#[allow(unused_imports)]
pub use world::*;
#[allow(unused_imports)]
pub use xds::*;

/// A cluster plus what every proxy of the test shares: a dev CA root and the config file.
pub struct Mesh {
    /// The network.
    pub cluster: Cluster,
    dir: tempfile::TempDir,
    /// Proxies write their output to files here instead of into memory (benchmarks).
    log_dir: Option<PathBuf>,
    /// Proxies take their state from this xDS server instead of the config file.
    xds: Option<String>,
}

/// A pod that is a mesh workload.
#[derive(Clone)]
pub struct MeshPod {
    /// The pod.
    pub pod: Pod,
    /// Workload (Kubernetes pod) name in the config; the pod's name unless renamed.
    pub workload: String,
    /// Service account.
    pub sa: String,
    /// The node it runs on (the workload's `node`).
    pub node: String,
    policies: Vec<String>,
    services: Vec<(String, u16, u16)>,
}

/// A policy in ztunnel's local-config YAML (a list item).
#[derive(Clone, Copy)]
pub struct Policy {
    /// The YAML list item.
    pub yaml: &'static str,
}

/// Deny port 9090 (selected by B).
pub const DENY_9090: Policy = Policy {
    yaml: "- name: deny-9090\n  namespace: default\n  scope: WorkloadSelector\n  action: Deny\n  rules: [[[{destinationPorts: [9090]}]]]\n",
};
/// Allow only the `client` service account (selected by D).
pub const ONLY_CLIENT: Policy = Policy {
    yaml: "- name: only-client\n  namespace: default\n  scope: WorkloadSelector\n  action: Allow\n  rules: [[[{serviceAccounts: [{namespace: default, serviceAccount: client}]}]]]\n",
};
/// What istiod generates for STRICT PeerAuthentication: deny anything without a principal.
pub const STATIC_STRICT: Policy = Policy {
    yaml: "- name: istio_converted_static_strict\n  namespace: istio-system\n  scope: WorkloadSelector\n  action: Deny\n  rules: [[[{notPrincipals: [{Presence: []}]}]]]\n",
};

pub fn ambit() -> &'static str {
    env!("CARGO_BIN_EXE_ambit")
}

impl Mesh {
    /// A fresh cluster and a dev CA root.
    pub fn new() -> Mesh {
        let cluster = Cluster::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new(ambit())
            .args(["dev-ca", "init"])
            .arg(dir.path().join("ca"))
            .output()
            .expect("run ambit dev-ca init");
        assert!(out.status.success(), "dev-ca init failed: {}", String::from_utf8_lossy(&out.stderr));
        Mesh { cluster, dir, log_dir: None, xds: None }
    }

    /// Proxies started from now on take their state from the xDS server at `url` (serving
    /// [`Mesh::config_path`], see [`XdsServer`]) instead of reading the file themselves.
    pub fn use_xds(&mut self, url: &str) {
        self.xds = Some(url.to_owned());
    }

    /// The settings that give a proxy its state and certificates: the file or an xDS server,
    /// with the dev CA. (Proxies on `ambit control` run on `ambit up`: see `common::up`.)
    fn state_source(&self, cmd: &mut Command) {
        cmd.env("FAKE_CA", "true").env("FAKE_CA_ROOT", self.dir.path().join("ca"));
        match &self.xds {
            Some(url) => cmd.env("XDS_ADDRESS", url),
            // The local file only: the default XDS_ADDRESS would point at istiod.
            None => cmd.env("LOCAL_XDS_PATH", self.config_path()).env("XDS_ADDRESS", ""),
        };
    }

    /// Proxies started from now on write their output to `<dir>/<label>.log` instead of memory.
    pub fn log_to_files(&mut self, dir: &std::path::Path) {
        self.log_dir = Some(dir.to_owned());
    }

    fn spawn_proxy(&self, label: &str, cmd: Command) -> ChildGuard {
        match &self.log_dir {
            Some(dir) => {
                ChildGuard::spawn_to_file(label, cmd, &dir.join(format!("{}.log", label.replace(' ', "-"))))
            }
            None => ChildGuard::spawn(label, cmd),
        }
    }

    /// A captured pod that is a mesh workload with service account `sa` in namespace default.
    pub fn pod(&self, name: &str, sa: &str) -> MeshPod {
        self.pod_on(self.cluster.node(), name, sa)
    }

    /// Like [`Mesh::pod`], on another node.
    pub fn pod_on(&self, node: &Node, name: &str, sa: &str) -> MeshPod {
        let pod = node.add_pod(name);
        pod.capture();
        MeshPod {
            workload: name.to_owned(),
            pod,
            sa: sa.to_owned(),
            node: node.name.clone(),
            policies: Vec::new(),
            services: Vec::new(),
        }
    }

    /// A pod outside the mesh (no capture, no proxy, not in the config).
    pub fn outside_pod(&self, name: &str) -> Pod {
        self.cluster.add_pod(name)
    }

    /// An IPv4 address in a made-up service range, routed via the pods' default route.
    pub fn vip4(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 96, 77, host)
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("mesh.yaml")
    }

    /// Writes the local config (atomically, by rename) with these workloads, policies, services.
    pub fn write_config(&self, pods: &[&MeshPod], policies: &[Policy], services: &[&str]) {
        let mut y = String::from("workloads:\n");
        for p in pods {
            y.push_str(&p.yaml());
        }
        y.push_str("policies:\n");
        if policies.is_empty() {
            y.truncate(y.len() - 1);
            y.push_str(" []\n");
        }
        for p in policies {
            y.push_str(p.yaml);
        }
        y.push_str("services:\n");
        if services.is_empty() {
            y.truncate(y.len() - 1);
            y.push_str(" []\n");
        }
        for s in services {
            y.push_str(s);
        }
        self.write_raw(&y);
    }

    /// Replaces the config file with arbitrary text.
    pub fn write_raw(&self, text: &str) {
        let tmp = self.dir.path().join("mesh.yaml.tmp");
        std::fs::write(&tmp, text).expect("write config");
        std::fs::rename(&tmp, self.config_path()).expect("rename config");
    }

    /// Starts a dedicated proxy for `p` in its netns and waits until it is ready.
    pub fn start_proxy(&self, p: &MeshPod) -> ChildGuard {
        self.start_proxy_with(p, &[])
    }

    /// Like [`Mesh::start_proxy`] with extra environment variables.
    pub fn start_proxy_with(&self, p: &MeshPod, env: &[(&str, &str)]) -> ChildGuard {
        let mut child = self.spawn_proxy_unready(p, env);
        let readiness = env
            .iter()
            .find(|(k, _)| *k == "AMBIT_READINESS_ADDR")
            .and_then(|(_, v)| v.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(15021);
        let ready = wait_for(
            || {
                child.try_wait().is_none()
                    && p.pod.http_get(p.pod.addr4(readiness), "/healthz/ready").is_ok_and(|(s, _)| s == 200)
            },
            Duration::from_secs(20),
        );
        assert!(ready, "proxy in {} did not become ready:\n{}", p.pod.name, child.logs());
        child
    }

    /// Starts a dedicated proxy for `p` in its netns without waiting for it to be ready.
    pub fn spawn_proxy_unready(&self, p: &MeshPod, env: &[(&str, &str)]) -> ChildGuard {
        let mut cmd = p.pod.exec(ambit(), &["proxy"]);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PROXY_MODE", "dedicated")
            .env("PROXY_WORKLOAD_INFO", format!("default/{}/{}", p.pod.name, p.sa))
            .env("PACKET_MARK", "1337")
            .env("RUST_LOG", "info")
            .env("ZTUNNEL_WORKER_THREADS", "2");
        self.state_source(&mut cmd);
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.spawn_proxy(&format!("proxy {}", p.pod.name), cmd)
    }
}

impl MeshPod {
    /// Gives the workload another name than its pod namespace (a pod re-created in a new netns).
    pub fn named(mut self, workload: &str) -> MeshPod {
        self.workload = workload.to_owned();
        self
    }

    /// Lists policy keys in the workload's `authorizationPolicies`.
    pub fn with_policies(mut self, keys: &[&str]) -> MeshPod {
        self.policies = keys.iter().map(|k| (*k).to_owned()).collect();
        self
    }

    /// Makes the workload an endpoint of `ns/hostname` mapping `port` to `target`.
    pub fn in_service(mut self, key: &str, port: u16, target: u16) -> MeshPod {
        self.services.push((key.to_owned(), port, target));
        self
    }

    fn yaml(&self) -> String {
        let mut y = format!(
            "- uid: cluster1//v1/Pod/default/{name}\n  name: {name}\n  namespace: default\n  serviceAccount: {sa}\n  trustDomain: cluster.local\n  node: {node}\n  workloadIps: [\"{v4}\", \"{v6}\"]\n  protocol: HBONE\n",
            node = self.node,
            name = self.workload,
            sa = self.sa,
            v4 = self.pod.ip4,
            v6 = self.pod.ip6,
        );
        if !self.policies.is_empty() {
            y.push_str("  authorizationPolicies:\n");
            for k in &self.policies {
                y.push_str(&format!("  - {k}\n"));
            }
        }
        if !self.services.is_empty() {
            y.push_str("  services:\n");
            for (key, port, target) in &self.services {
                y.push_str(&format!("    \"{key}\":\n      {port}: {target}\n"));
            }
        }
        y
    }
}

/// The proxy's metrics, scraped from inside its pod.
pub fn metrics(p: &MeshPod) -> String {
    http_body(p, 15020, "/metrics")
}

/// GET a path on one of the pod's proxy ports and return the body (panics unless 200).
pub fn http_body(p: &MeshPod, port: u16, path: &str) -> String {
    let (status, body) = p.pod.http_get(p.pod.addr4(port), path).expect("GET from the proxy");
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// HTTP GET to 127.0.0.1:`port` from inside the node netns (a node proxy's admin ports).
pub fn node_http_get(node: &Node, port: u16, path: &str) -> std::io::Result<(u16, String)> {
    // Admin listens on 127.0.0.1 only; metrics and readiness on [::] (also reachable this way).
    let addr = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), port);
    node.run(|| http_get(addr, path))
}

/// Sum of a counter's samples with `reporter`.
pub fn counter(body: &str, name: &str, reporter: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("reporter=\"{reporter}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Connects from `from` to `dst` and checks a payload echoes back.
pub fn assert_echo(from: &Pod, dst: SocketAddr, what: &str) {
    let mut s = from.connect_tcp(dst).unwrap_or_else(|e| panic!("{what}: connect to {dst}: {e}"));
    let reply = echo_roundtrip(&mut s, super::MARKER).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(reply, super::MARKER, "{what}: payload did not echo back");
}

/// How long a denied connection may stay open before the proxy closes it.
pub const DENY_CLOSE_BOUND: Duration = Duration::from_secs(2);

/// Where the proxy that serves a destination publishes its metrics (port 15020).
#[derive(Clone, Copy)]
pub enum ProxyOf<'a> {
    /// A dedicated proxy running inside this pod.
    Pod(&'a MeshPod),
    /// A node (shared-mode) proxy running in this node's netns.
    Node(&'a Node),
}

impl ProxyOf<'_> {
    /// The proxy's `/metrics` text; panics (a broken setup) when the proxy does not answer.
    pub fn metrics(&self) -> String {
        match self {
            ProxyOf::Pod(p) => http_body(p, 15020, "/metrics"),
            ProxyOf::Node(n) => {
                let (status, body) = node_http_get(n, 15020, "/metrics")
                    .unwrap_or_else(|e| panic!("the node proxy of {} does not serve /metrics: {e}", n.name));
                assert_eq!(status, 200, "/metrics of the node proxy of {}: {body}", n.name);
                body
            }
        }
    }

    /// Connections this proxy refused, as the destination, because a policy denied them.
    pub fn denied(&self) -> u64 {
        denied_count(&self.metrics())
    }
}

/// Sum of `istio_tcp_connections_failed_total` samples with `reporter="destination"` and
/// `response_flags="DENY"`: what the destination's proxy counts for each policy denial.
pub fn denied_count(body: &str) -> u64 {
    body.lines()
        .filter(|l| {
            l.starts_with("istio_tcp_connections_failed_total{")
                && l.contains("reporter=\"destination\"")
                && l.contains("response_flags=\"DENY\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Reads `s` until the peer closes it (EOF or reset) and returns what arrived and how long
/// that took; an error if it is still open after `bound` (a silent peer is not a close).
pub fn expect_close(s: &mut std::net::TcpStream, bound: Duration) -> Result<(Vec<u8>, Duration), String> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(bound)).map_err(|e| format!("set_read_timeout: {e}"))?;
    let mut got = Vec::new();
    let outcome = s.read_to_end(&mut got);
    let elapsed = t0.elapsed();
    match outcome {
        Ok(_) => {}
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => {}
        Err(e) => return Err(format!("not closed within {bound:?} ({e}); {} bytes arrived", got.len())),
    }
    if elapsed > bound {
        return Err(format!("closed only after {elapsed:?} (bound {bound:?})"));
    }
    Ok((got, elapsed))
}

/// Proves that the destination's proxy denied a connection from `from` to `dst` by policy:
/// the connection is accepted (the capture hands it to a live proxy), closed within
/// [`DENY_CLOSE_BOUND`] with no payload back, and the destination proxy's deny counter rose by
/// exactly one. A refused connect, a silent connection or a close for any other reason (dead
/// proxy, no app, no route) fails.
pub fn assert_denied(from: &Pod, dst: SocketAddr, proxy: ProxyOf<'_>, what: &str) {
    let before = proxy.denied();
    let mut s = from.connect_tcp(dst).unwrap_or_else(|e| {
        panic!("{what}: connect to {dst} failed ({e}): a denied connection is accepted, then closed; is the proxy running?")
    });
    // The write may already fail if the proxy closed first; the close below is what counts.
    let _ = s.write_all(super::MARKER);
    let (reply, _) = expect_close(&mut s, DENY_CLOSE_BOUND).unwrap_or_else(|e| panic!("{what}: {dst}: {e}"));
    assert!(reply.is_empty(), "{what}: got {} bytes back from {dst}", reply.len());
    let after = proxy.denied();
    assert_eq!(
        after,
        before + 1,
        "{what}: the destination proxy counted {} DENY failures for this connection (expected 1): it was closed for another reason",
        after.saturating_sub(before)
    );
}

/// Writes `data` and reads the same number of bytes back.
pub fn roundtrip(s: &mut std::net::TcpStream, data: &[u8]) {
    s.write_all(data).expect("write");
    let mut buf = vec![0u8; data.len()];
    s.read_exact(&mut buf).expect("read echo");
    assert_eq!(buf, data);
}

impl Mesh {
    /// Starts a shared-mode (node) proxy in `node`'s netns, following the ZDS socket `uds`, and
    /// waits until its readiness endpoint (in the node netns) answers 200.
    pub fn start_node_proxy(&self, node: &Node, uds: &std::path::Path, env: &[(&str, &str)]) -> ChildGuard {
        self.start_node_proxy_cmd(node, node.exec(ambit(), &["proxy"]), uds, env)
    }

    /// Like [`Mesh::start_node_proxy`], in a new pid namespace whose pid 1 (a shell) stays in the
    /// test's own network namespace: the proxy then sees the test's namespace as the host's (pid
    /// 1's), as a node proxy that shares the host's pid namespace does. The whole pid namespace
    /// dies with the guard.
    pub fn start_node_proxy_in_pid_ns(
        &self,
        node: &Node,
        uds: &std::path::Path,
        env: &[(&str, &str)],
    ) -> ChildGuard {
        let mut cmd = Command::new("unshare");
        // Not `exec`: the shell must stay pid 1, in this namespace, while the proxy runs.
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child", "--", "sh", "-c"])
            .arg("ip netns exec \"$0\" \"$1\" proxy; exit $?")
            .arg(&node.netns)
            .arg(ambit());
        self.start_node_proxy_cmd(node, cmd, uds, env)
    }

    /// Like [`Mesh::start_node_proxy`] with the open-files limit (soft and hard) set to `nofile`
    /// (`prlimit`, which execs the proxy in place, so the guard's pid is the proxy's).
    pub fn start_node_proxy_with_nofile(
        &self,
        node: &Node,
        uds: &std::path::Path,
        env: &[(&str, &str)],
        nofile: u64,
    ) -> ChildGuard {
        let limit = format!("--nofile={nofile}:{nofile}");
        self.start_node_proxy_cmd(node, node.exec("prlimit", &[&limit, ambit(), "proxy"]), uds, env)
    }

    fn start_node_proxy_cmd(
        &self,
        node: &Node,
        mut cmd: Command,
        uds: &std::path::Path,
        env: &[(&str, &str)],
    ) -> ChildGuard {
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PROXY_MODE", "shared")
            .env("INPOD_UDS", uds)
            .env("RUST_LOG", "info")
            .env("ZTUNNEL_WORKER_THREADS", "2");
        self.state_source(&mut cmd);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = self.spawn_proxy(&format!("node proxy {}", node.name), cmd);
        let readiness = env
            .iter()
            .find(|(k, _)| *k == "AMBIT_READINESS_ADDR")
            .and_then(|(_, v)| v.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(15021);
        let ready = wait_for(
            || {
                child.try_wait().is_none()
                    && node_http_get(node, readiness, "/healthz/ready").is_ok_and(|(s, _)| s == 200)
            },
            Duration::from_secs(20),
        );
        assert!(ready, "node proxy in {} did not become ready:\n{}", node.name, child.logs());
        child
    }

    /// The shared dev CA directory (root-cert.pem, root-key.pem).
    pub fn ca_dir(&self) -> PathBuf {
        self.dir.path().join("ca")
    }
}
