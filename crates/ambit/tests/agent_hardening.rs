//! End-to-end tests of the node agent's and the plugin's failure handling (issue 8, points
//! 10–14): the real `ambit agent` and `ambit-cni` processes, pods created through a CNI chain,
//! and — for the Kubernetes source — a scripted API server (`ambit_objects::testing`)
//! speaking real HTTP list/watch/patch, reached through a kubeconfig file.
//!
//! Every test builds its own node network namespace, so the agent's health (8000) and metrics
//! (15014) ports and the API server's port never collide between tests. Needs root (under
//! `CI=true` a missing privilege fails instead of skipping). The tests run one at a time.

mod common;
mod mesh;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ambit_objects::testing::ScriptedApi;
use common::*;
use mesh::*;
use serde_json::{Value, json};

/// Used by the shared mesh helpers.
const MARKER: &[u8] = b"AMBIT-AGENT-HARDENING-5b1e";
const HEALTH: u16 = 8000;
const METRICS: u16 = 15014;
const NODE: &str = "node";
const REDIRECTION: &str = "ambient.istio.io/redirection";

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A node with the agent's directories, a primary CNI config for the installer, and optionally
/// the agent and the node proxy.
struct Bed {
    // Dropped first: processes before the namespaces they run in.
    proxy: Option<ChildGuard>,
    agent: Option<ChildGuard>,
    mesh: Mesh,
    dir: tempfile::TempDir,
}

impl Bed {
    fn new() -> Bed {
        let mesh = Mesh::new();
        mesh.write_raw("workloads: []\npolicies: []\nservices: []\n");
        let dir = tempfile::tempdir().expect("tempdir");
        for d in ["source", "run", "net.d", "bin"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        // The primary plugin's config, for the installer to chain into.
        std::fs::write(
            dir.path().join("net.d/10-primary.conflist"),
            r#"{"cniVersion": "1.0.0", "name": "primary", "plugins": [{"type": "bridge", "bridge": "cni0"}]}"#,
        )
        .expect("primary conflist");
        Bed { proxy: None, agent: None, mesh, dir }
    }

    fn node(&self) -> &Node {
        self.mesh.cluster.node()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The agent with the directories of this bed; `extra` flags and `env` on top. Only flags
    /// that older agents know too, so the tests can run against them.
    fn spawn_agent(&mut self, extra: &[&str], env: &[(&str, String)]) {
        assert!(self.agent.is_none(), "agent already running");
        let (run, zds, conf, bin) =
            (self.path("run"), self.path("zds.sock"), self.path("net.d"), self.path("bin"));
        let mut args: Vec<String> = [
            "agent",
            "--run-dir",
            run.to_str().unwrap_or_default(),
            "--zds-socket",
            zds.to_str().unwrap_or_default(),
            "--metrics-addr",
            "127.0.0.1:15014",
            "--health-addr",
            "127.0.0.1:8000",
            "--exclude-namespaces",
            "kube-system",
            "--source-poll",
            "50ms",
            "--cni-conf-dir",
            conf.to_str().unwrap_or_default(),
            "--cni-bin-dir",
            bin.to_str().unwrap_or_default(),
            "--cni-binary",
            ambit_cni_path().to_str().unwrap_or_default(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = self.node().exec(ambit(), &args);
        cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("RUST_LOG", "info");
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.agent = Some(ChildGuard::spawn("agent", cmd));
    }

    /// The agent with the file source on this bed's folder.
    fn spawn_file_agent(&mut self, env: &[(&str, String)]) {
        let src = self.path("source");
        self.spawn_agent(&["--source-dir", src.to_str().unwrap_or_default(), "--node-name", NODE], env);
    }

    /// The agent with the Kubernetes source on `api` (KUBECONFIG), this node's name in NODE_NAME.
    fn spawn_kube_agent(&mut self, api: &Api, node_name: bool) {
        let kubeconfig = self.path("kubeconfig");
        api.api.write_kubeconfig(&kubeconfig);
        let mut env = vec![("KUBECONFIG", kubeconfig.display().to_string())];
        if node_name {
            env.push(("NODE_NAME", NODE.to_owned()));
        }
        self.spawn_agent(&[], &env);
    }

    fn agent_logs(&self) -> String {
        self.agent.as_ref().map(ChildGuard::logs).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let ok = wait_for(
            || {
                self.agent.as_mut().is_some_and(|a| a.try_wait().is_none())
                    && node_http_get(self.node(), HEALTH, "/readyz").is_ok_and(|(s, _)| s == 200)
            },
            Duration::from_secs(20),
        );
        assert!(ok, "agent did not become ready:\n{}", self.agent_logs());
    }

    fn start_proxy(&mut self) {
        let proxy = self.mesh.start_node_proxy(self.node(), &self.path("zds.sock"), &[]);
        self.proxy = Some(proxy);
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let body = node_http_get(self.node(), METRICS, "/metrics").ok()?.1;
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
    }

    fn proxy_state(&self, uid: &str) -> Option<String> {
        let (_, body) = node_http_get(self.node(), 15000, "/config_dump").ok()?;
        let dump: Value = serde_json::from_str(&body).ok()?;
        dump["workloadState"][uid]["state"].as_str().map(str::to_owned)
    }

    /// The plugin entry the installer wrote into the primary config.
    fn installed_entry(&self) -> Option<Value> {
        let text = std::fs::read_to_string(self.path("net.d/10-primary.conflist")).ok()?;
        let list: Value = serde_json::from_str(&text).ok()?;
        list["plugins"].as_array()?.iter().find(|p| p["type"] == "ambit-cni").cloned()
    }

    /// `POST /cmdadd` straight to the agent's event socket: status and body.
    fn post_event(&self, body: &str) -> (u16, String) {
        let socket = self.path("run/pluginevent.sock");
        let mut s =
            UnixStream::connect(&socket).unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        s.set_read_timeout(Some(Duration::from_secs(15))).expect("timeout");
        let request = format!(
            "POST /cmdadd HTTP/1.1\r\nHost: unix\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).expect("send");
        let mut response = String::new();
        s.read_to_string(&mut response).expect("read the answer");
        let status = response.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        (status, body)
    }

    fn write_yaml(&self, name: &str, yaml: &str) {
        let path = self.path("source").join(name);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, yaml).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
    }
}

/// The scripted API server, listening inside a node's network namespace (where the agent runs).
struct Api {
    api: ScriptedApi,
    _rt: tokio::runtime::Runtime,
}

fn api_in(node: &Node) -> Api {
    let listener = node.run(|| std::net::TcpListener::bind("127.0.0.1:0")).expect("bind the API server");
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let api = {
        let _enter = rt.enter();
        ScriptedApi::start_on(listener)
    };
    Api { api, _rt: rt }
}

fn api_pod(namespace: &str, name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"nodeName": NODE, "serviceAccountName": "default", "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Pending"}
    })
}

/// `nft list tables` inside a netns; an exec failure fails the test.
fn nft_tables(netns: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "nft", "list", "tables"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run nft in {netns}: {e}"));
    assert!(out.status.success(), "nft in {netns} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn captured(netns: &str) -> bool {
    let t = nft_tables(netns);
    ["istio-ambient-nat", "istio-ambient-mangle", "istio-ambient-raw"].iter().all(|n| t.contains(n))
}

/// Waits for the agent to exit; its status and stderr.
fn wait_exit(agent: &mut ChildGuard, within: Duration) -> (std::process::ExitStatus, String) {
    match agent.wait_timeout(within) {
        Some(status) => (status, agent.logs()),
        None => panic!("the agent did not exit within {within:?}:\n{}", agent.logs()),
    }
}

/// Point 11: with the Kubernetes source, NODE_NAME is required; without it the agent would
/// watch and enroll every pod of the cluster. A start-up error, not a cluster-wide watch.
#[test]
fn kube_source_without_node_name_is_a_startup_error() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let mut b = Bed::new();
    let api = api_in(b.node());
    api.api.put_namespace("demo", &[]);
    b.spawn_kube_agent(&api, false);
    let mut agent = b.agent.take().expect("agent");
    let (status, logs) = wait_exit(&mut agent, Duration::from_secs(10));
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains("ambit agent: NODE_NAME (--node-name) is required with the Kubernetes source: without it the agent would watch, and enroll, every pod of the cluster"),
        "{logs}"
    );
    assert_eq!(api.api.count("list", "/api/v1/pods"), 0, "the agent listed pods without a node name");
}

/// Point 11: health answers before the initial list; `/readyz` says what the agent waits for
/// while the list is held back, and turns ready once it comes.
#[test]
fn kube_health_is_served_before_the_initial_list() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let mut b = Bed::new();
    let api = api_in(b.node());
    api.api.put_namespace("demo", &[]);
    api.api.hold_lists(true);
    b.spawn_kube_agent(&api, true);
    let listing = wait_for(|| api.api.count("list", "/api/v1/pods") > 0, Duration::from_secs(10));
    assert!(listing, "the agent never listed pods:\n{}", b.agent_logs());
    let pending = wait_for(|| node_http_get(b.node(), HEALTH, "/readyz").is_ok(), Duration::from_secs(5));
    assert!(pending, "health not bound while the initial list is pending:\n{}", b.agent_logs());
    assert_eq!(node_http_get(b.node(), HEALTH, "/healthz").expect("healthz"), (200, "ok\n".to_owned()));
    assert_eq!(
        node_http_get(b.node(), HEALTH, "/readyz").expect("readyz"),
        (
            503,
            "not ready: waiting for the initial list of namespaces and pods from the Kubernetes API server\n"
                .to_owned()
        )
    );
    api.api.hold_lists(false);
    b.wait_ready();
}

/// Point 11: a 403 on the pod list makes `ambit agent` exit non-zero at once, naming the
/// resource and the verb it was refused, instead of hanging with warnings.
#[test]
fn kube_forbidden_list_makes_the_agent_exit() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let mut b = Bed::new();
    let api = api_in(b.node());
    api.api.put_namespace("demo", &[]);
    api.api.forbid("pods", "list");
    b.spawn_kube_agent(&api, true);
    let mut agent = b.agent.take().expect("agent");
    let (status, logs) = wait_exit(&mut agent, Duration::from_secs(15));
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains(
            "ambit agent: the Kubernetes API server refused to list pods (403 Forbidden: pods is forbidden: User \
             \"system:serviceaccount:ambit-system:ambit-agent\" cannot list resource \"pods\" in API group \"\" at the \
             cluster scope); grant the agent's service account the verbs get, list and watch on pods and namespaces"
        ),
        "{logs}"
    );
}

/// Point 10: an API server that refuses every `pods/status` patch (a missing RBAC verb) does
/// not wedge pods: the ADD succeeds once the pod is captured and the proxy acked it, the patch
/// is retried, and `ambit_agent_annotation_failures_total` counts every refusal; once the
/// permission is granted the annotation is written.
#[test]
fn kube_refused_annotation_does_not_fail_the_add() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let mut b = Bed::new();
    let api = api_in(b.node());
    api.api.put_namespace("demo", &[("istio.io/dataplane-mode", "ambient")]);
    api.api.forbid("pods/status", "patch");
    let rt = CniRuntime::new(
        b.node(),
        Some(
            json!({"cni_agent_run_dir": b.path("run"), "exclude_namespaces": ["kube-system"], "agent_timeout_ms": 10000}),
        ),
    );
    let mut sb = rt.sandbox("demo", "web");
    api.api.put_pod(api_pod("demo", "web", &sb.uid));
    b.spawn_kube_agent(&api, true);
    b.wait_ready();
    b.start_proxy();
    if let Err(e) = rt.add(&mut sb) {
        panic!(
            "ADD failed although capture and ack are all that count: {e}\n--- agent ---\n{}",
            b.agent_logs()
        );
    }
    assert!(captured(&sb.netns), "pod not captured: {}", nft_tables(&sb.netns));
    assert_eq!(b.proxy_state(&sb.uid).as_deref(), Some("Up"), "the proxy does not serve the pod");
    let patch = "/api/v1/namespaces/demo/pods/web/status";
    let retried = wait_for(|| api.api.count("patch", patch) >= 2, Duration::from_secs(10));
    assert!(retried, "the refused patch was not retried:\n{}", b.agent_logs());
    // The counter equals the refusals the API server answered (between two retries).
    let counted = wait_for(
        || b.metric("ambit_agent_annotation_failures_total") == Some(api.api.count("patch", patch) as f64),
        Duration::from_secs(5),
    );
    assert!(
        counted,
        "failures {:?} vs refused patches {}",
        b.metric("ambit_agent_annotation_failures_total"),
        api.api.count("patch", patch)
    );
    assert_eq!(b.metric("ambit_agent_annotations_pending"), Some(1.0));
    // Nothing was rolled back or redone.
    assert!(captured(&sb.netns));
    assert_eq!(b.proxy_state(&sb.uid).as_deref(), Some("Up"));
    api.api.allow("pods/status", "patch");
    let written = wait_for(
        || api.api.pod("demo", "web").is_some_and(|p| p["metadata"]["annotations"][REDIRECTION] == "enabled"),
        Duration::from_secs(20),
    );
    assert!(written, "the annotation was never written after the permission came:\n{}", b.agent_logs());
    let refused = api.api.count("patch", patch) - 1;
    let settled = wait_for(
        || {
            b.metric("ambit_agent_annotation_failures_total") == Some(refused as f64)
                && b.metric("ambit_agent_annotations_pending") == Some(0.0)
        },
        Duration::from_secs(5),
    );
    assert!(settled, "failures {:?}, refused {refused}", b.metric("ambit_agent_annotation_failures_total"));
    rt.del(&sb).unwrap_or_else(|e| panic!("DEL: {e}"));
}

/// Point 12: the node cannot lock itself out. The installer writes the agent's and the node
/// proxy's DaemonSet identities (namespace + generateName, learned from their pod objects)
/// into the plugin config; with the agent killed and its enrollment cache gone (a reboot empties
/// the run dir), the agent's replacement pod and a new proxy pod start, while an enrolled pod
/// (and a look-alike name) still fails closed with code 11.
#[test]
fn system_pods_start_with_the_agent_down() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let mut b = Bed::new();
    b.write_yaml("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: mesh-system\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n  labels:\n    istio.io/dataplane-mode: ambient\n");
    b.write_yaml(
        "agent.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: node-agent-x7k2p\n  generateName: node-agent-\n  namespace: mesh-system\n  uid: 0a6c0b7e-0000-4000-8000-00000000a001\nspec:\n  nodeName: {NODE}\nstatus:\n  phase: Running\n"),
    );
    b.write_yaml(
        "proxy.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: node-proxy-b4n7q\n  generateName: node-proxy-\n  namespace: mesh-system\n  uid: 0a6c0b7e-0000-4000-8000-00000000a002\n  labels:\n    app: mesh-proxy\nspec:\n  nodeName: {NODE}\nstatus:\n  phase: Running\n"),
    );
    b.spawn_file_agent(&[
        ("POD_NAMESPACE", "mesh-system".to_owned()),
        ("POD_NAME", "node-agent-x7k2p".to_owned()),
        ("AMBIT_PROXY_POD_LABELS", "app=mesh-proxy".to_owned()),
    ]);
    b.wait_ready();
    let want = json!([
        {"role": "agent", "namespace": "mesh-system", "generateName": "node-agent-"},
        {"role": "proxy", "namespace": "mesh-system", "generateName": "node-proxy-"},
    ]);
    let written =
        wait_for(|| b.installed_entry().is_some_and(|e| e["system_pods"] == want), Duration::from_secs(10));
    assert!(
        written,
        "the installer did not write the node's own pods: {:?}\n{}",
        b.installed_entry(),
        b.agent_logs()
    );
    let entry = b.installed_entry().expect("entry");
    assert_eq!(entry["pod_namespace"], "mesh-system");

    // The agent crashes; the node reboots (the run dir, with the enrollment cache, is gone).
    b.agent.take().expect("agent").kill();
    std::fs::remove_file(b.path("run/enrollment.json")).expect("the agent had written its cache");
    let rt = CniRuntime::new(b.node(), Some(entry));
    for (ns, name) in [("mesh-system", "node-agent-q9zr2"), ("mesh-system", "node-proxy-c5v8w")] {
        let mut sb = rt.sandbox(ns, name);
        if let Err(e) = rt.add(&mut sb) {
            panic!(
                "{ns}/{name} could not start with the agent down: {e}\nplugin entry: {}",
                b.installed_entry().unwrap_or_default()
            );
        }
        assert!(!captured(&sb.netns), "{name} captured");
        rt.del(&sb).unwrap_or_else(|e| panic!("DEL {name}: {e}"));
    }
    for (ns, name) in [("demo", "web"), ("mesh-system", "node-agent-debug"), ("demo", "node-agent-q9zr2")] {
        let mut sb = rt.sandbox(ns, name);
        let err = rt.add(&mut sb).err().unwrap_or_else(|| panic!("{ns}/{name} started with the agent down"));
        assert_eq!((err.plugin.as_str(), err.code), ("ambit-cni", Some(11)), "{ns}/{name}: {err}");
        assert!(err.msg.starts_with("cannot reach the node agent on "), "{err}");
        assert!(err.details.contains("no enrollment cache at "), "{err}");
        assert!(!captured(&sb.netns));
        rt.del(&sb).unwrap_or_else(|e| panic!("DEL {name}: {e}"));
    }
}

/// Points 13 and 14 through the agent's event socket: a path that is not a network namespace,
/// a traversal path, a missing path, the agent's own and the host's namespace are refused with
/// 400 and the exact reason (and so through the plugin when `CNI_NETNS_OVERRIDE=1` skips its
/// own checks: code 999); a real pod namespace passes the check and, with no proxy connected,
/// gets the retryable 503 (the plugin's code 11).
#[test]
fn agent_refuses_netns_paths_that_are_not_a_pods() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let mut b = Bed::new();
    b.write_yaml("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n  labels:\n    istio.io/dataplane-mode: ambient\n");
    let rt = CniRuntime::new(
        b.node(),
        Some(
            json!({"cni_agent_run_dir": b.path("run"), "exclude_namespaces": ["kube-system"], "agent_timeout_ms": 10000}),
        ),
    );
    let mut sb = rt.sandbox("demo", "web");
    b.write_yaml(
        "web.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: demo\n  uid: {}\nspec:\n  nodeName: {NODE}\nstatus:\n  phase: Pending\n", sb.uid),
    );
    // The test process runs in what stands for the host's namespace here; name it explicitly.
    let host = format!("/proc/{}/ns/net", std::process::id());
    b.spawn_file_agent(&[("AMBIT_HOST_NETNS", host.clone())]);
    b.wait_ready();
    let file = b.path("hostname");
    std::fs::write(&file, "not a namespace").expect("write");
    let node_netns = format!("/var/run/netns/{}", b.node().netns);
    let event = |netns: &str| {
        json!({"Netns": netns, "PodName": "web", "PodNamespace": "demo",
            "IPs": [{"Interface": 0, "Address": {"IP": "172.20.0.9", "Mask": "////AA=="}, "Gateway": "172.20.0.1"}]})
        .to_string()
    };
    let refused = |path: &str, reason: &str| format!("refusing CNI_NETNS {path} of pod demo/web: {reason}\n");
    let cases = [
        (file.display().to_string(), refused(&file.display().to_string(), &format!("it is not a network namespace (it refers to {})", file.display()))),
        (
            "/var/run/netns/../../proc/1/ns/net".to_owned(),
            "CNI_NETNS \"/var/run/netns/../../proc/1/ns/net\" has a '.' or '..' component; the runtime must pass the namespace's own path, not one that walks elsewhere\n".to_owned(),
        ),
        ("/var/run/netns/ambit-test-missing".to_owned(), refused("/var/run/netns/ambit-test-missing", "it does not exist")),
        (node_netns.clone(), refused(&node_netns, "it is the node agent's own network namespace, not a pod's")),
        (host.clone(), refused(&host, &format!("it is the host's network namespace ({host}), not a pod's"))),
    ];
    let mut wrong = Vec::new();
    for (netns, want) in &cases {
        let got = b.post_event(&event(netns));
        if got != (400, want.clone()) {
            wrong.push(format!("{netns}:\n  got  {got:?}\n  want {:?}", (400, want)));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} refusals wrong:\n{}\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n"),
        b.agent_logs()
    );
    assert!(!captured(&b.node().netns), "capture was applied to the node's namespace");

    // The plugin with its checks skipped forwards the path; the agent's refusal comes back.
    let conf =
        json!({"cniVersion": "1.0.0", "name": "n", "type": "ambit-cni", "cni_agent_run_dir": b.path("run")});
    let out = b
        .node()
        .exec(ambit_cni_path(), &[])
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_NETNS", &file)
        .env("CNI_NETNS_OVERRIDE", "1")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().map(|mut s| s.write_all(conf.to_string().as_bytes()));
            c.wait_with_output()
        })
        .expect("run ambit-cni");
    let error: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(error["code"], 999, "{error}");
    assert_eq!(
        error["msg"].as_str().unwrap_or_default(),
        format!("node agent could not set up pod demo/web (HTTP 400): {}", cases[0].1.trim()),
    );

    // A real pod namespace passes the check; with no proxy the answer is retryable: 503 / 11.
    let t = Instant::now();
    let err = rt.add(&mut sb).err().unwrap_or_else(|| panic!("ADD succeeded with no proxy"));
    assert_eq!((err.plugin.as_str(), err.code), ("ambit-cni", Some(11)), "{err}");
    let zds = b.path("zds.sock");
    assert_eq!(
        err.msg,
        format!(
            "node agent could not set up pod demo/web (HTTP 503): no node proxy is connected to {}; is `ambit proxy` running on this node? (retryable: the runtime will retry the pod sandbox)",
            zds.display()
        )
    );
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert!(!captured(&sb.netns), "a failed ADD left capture behind");
    rt.del(&sb).unwrap_or_else(|e| panic!("DEL: {e}"));
}
