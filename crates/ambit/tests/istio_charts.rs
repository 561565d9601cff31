//! Ambit dropped in under Istio's own charts: on a node of an `ambit up` cluster, the node's
//! agent and proxy are replaced by `install-cni` and `ztunnel` (both links to `ambit`, as in
//! Ambit's image) started with exactly the command, arguments and environment that Istio's `cni`
//! and `ztunnel` charts give their containers, and the host paths those charts mount (`/host`,
//! `/var/run/istio-cni`, `/var/run/ztunnel`, `/var/run/secrets/...`). They must serve: the agent
//! installs its plugin in place of a stale `istio-cni` entry, a new pod created through the
//! node's CNI chain is captured and handed to the proxy, and a flow between two pods is counted
//! by the proxy as mutual TLS with the client's identity.
//!
//! What the test adds to the charts' settings, and why: the test sources (`AMBIT_SOURCE_DIR`,
//! `AMBIT_CAPTURE_STATE_DIR`: there is no API server here), the control plane's address (the
//! chart's `caAddress`/`xdsAddress` values) with its TLS name (the chart's `env` value), and
//! the container's mounts, made in a private mount namespace: `/host/proc` holds only the
//! node's netns as pid 1's (the node's network namespace is this host's "host"; a real procfs
//! here would name the CI machine's own).
//!
//! Needs root (under `CI=true` a missing privilege fails instead of skipping). Creates `/host`,
//! `/run/istio-cni` and `/run/ztunnel` when missing (the paths Istio's charts use) and removes
//! them at the end.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ambit_cluster::probe;
use common::*;
use serde_json::Value;

const CLUSTER: &str = r#"apiVersion: v1
kind: Namespace
metadata:
  name: demo
  labels:
    istio.io/dataplane-mode: ambient
"#;

const PODS: &str = r#"apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: demo}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: demo, labels: {app: client}}
spec:
  nodeName: node1
  serviceAccountName: client
  containers: [{name: idle, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: demo, labels: {app: server}}
spec:
  nodeName: node1
  containers:
  - {name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}
"#;

/// `ambient.enablementSelectors` of istio-cni's chart, rendered as its ConfigMap does (YAML).
const SELECTORS: &str = ambit_agent::enroll::ISTIO_CHART_SELECTORS;

/// The environment istio-cni's chart gives its `install-cni` container (ConfigMap
/// `istio-cni-config` and the container's `env`, defaults of an ambient install).
fn istio_cni_env(node: &str) -> Vec<(&'static str, String)> {
    let v = |s: &str| s.to_owned();
    vec![
        ("CURRENT_AGENT_VERSION", v("1.26.0")),
        ("AMBIENT_ENABLED", v("true")),
        ("AMBIENT_ENABLEMENT_SELECTOR", v(SELECTORS)),
        ("AMBIENT_DNS_CAPTURE", v("true")),
        ("AMBIENT_IPV6", v("true")),
        ("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", v("true")),
        ("ENABLE_AMBIENT_DETECTION_RETRY", v("false")),
        ("ISTIO_OWNED_CNI_CONFIG", v("false")),
        ("CHAINED_CNI_PLUGIN", v("true")),
        ("EXCLUDE_NAMESPACES", v("kube-system")),
        ("REPAIR_ENABLED", v("true")),
        ("REPAIR_LABEL_PODS", v("false")),
        ("REPAIR_DELETE_PODS", v("false")),
        ("REPAIR_REPAIR_PODS", v("true")),
        ("REPAIR_INIT_CONTAINER_NAME", v("istio-validation")),
        ("REPAIR_BROKEN_POD_LABEL_KEY", v("cni.istio.io/uninitialized")),
        ("REPAIR_BROKEN_POD_LABEL_VALUE", v("true")),
        ("NATIVE_NFTABLES", v("false")),
        ("REPAIR_NODE_NAME", v(node)),
        ("NODE_NAME", v(node)),
        ("POD_NAME", v("istio-cni-node-x7k2p")),
        ("POD_NAMESPACE", v("istio-system")),
        ("REPAIR_RUN_AS_DAEMON", v("true")),
        ("REPAIR_SIDECAR_ANNOTATION", v("sidecar.istio.io/status")),
        ("GOMEMLIMIT", v("1073741824")),
        ("ALLOW_SWITCH_TO_HOST_NS", v("true")),
    ]
}

/// The environment ztunnel's chart gives its `istio-proxy` container; `control` is the
/// chart's `caAddress`/`xdsAddress` value.
fn ztunnel_env(node: &str, node_ip: &str, control: &str) -> Vec<(&'static str, String)> {
    let v = |s: &str| s.to_owned();
    vec![
        ("CA_ADDRESS", v(control)),
        ("XDS_ADDRESS", v(control)),
        ("RUST_LOG", v("info")),
        ("ISTIO_META_CLUSTER_ID", v("Kubernetes")),
        ("INPOD_ENABLED", v("true")),
        ("TERMINATION_GRACE_PERIOD_SECONDS", v("30")),
        ("POD_NAME", v("ztunnel-abcde")),
        ("POD_NAMESPACE", v("istio-system")),
        ("NODE_NAME", v(node)),
        ("INSTANCE_IP", v(node_ip)),
        ("SERVICE_ACCOUNT", v("ztunnel")),
        ("ZTUNNEL_CPU_LIMIT", v("2")),
    ]
}

/// Directories this test creates where Istio's charts mount them, removed at the end (only
/// those it created).
struct HostDirs(Vec<PathBuf>);

impl HostDirs {
    fn make(paths: &[&str]) -> HostDirs {
        let mut made = Vec::new();
        for p in paths {
            let p = PathBuf::from(p);
            if !p.exists() {
                std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
                made.push(p);
            }
        }
        HostDirs(made)
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            if let Err(e) = std::fs::remove_dir_all(p) {
                eprintln!("cannot remove {}: {e}", p.display());
            }
        }
    }
}

/// Runs `script` in node `netns` in a mount namespace of its own, with `env` only (and PATH).
fn in_node(netns: &str, script: &str, env: &[(&str, String)], cwd: &Path) -> Command {
    let mut cmd = Command::new("ip");
    // Slave propagation: what the host mounts later (a new pod's netns under /run/netns) reaches
    // the container's bind of it, as the chart's `mountPropagation: HostToContainer` does.
    cmd.args(["netns", "exec", netns, "unshare", "--mount", "--propagation", "slave", "sh", "-euc", script]);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()));
    cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str()))).current_dir(cwd);
    cmd
}

fn get(netns: &str, port: u16, path: &str) -> (u16, String) {
    probe::http_get(netns, port, path).unwrap_or((0, String::new()))
}

#[test]
fn ambit_serves_under_istio_s_cni_and_ztunnel_charts() {
    if !require_root() {
        return;
    }
    let mut c = LocalCluster::new();
    let config = c.config(CLUSTER);
    c.up(1, &config);
    let node = "node1";
    let netns = format!("{}-{node}", c.tag);
    for p in [format!("agent/{node}"), format!("proxy/{node}")] {
        let r = c.ambit(&["stop", &p]);
        assert_eq!(r.code, Some(0), "ambit stop {p}:\n{r}");
    }
    assert!(
        wait_for(
            || get(&netns, 8000, "/readyz").0 == 0 && get(&netns, 15021, "/healthz/ready").0 == 0,
            Duration::from_secs(10)
        ),
        "Ambit's own agent and proxy did not stop"
    );

    // The node as istio-cni left it: its entry last in the primary config.
    let node_dir = c.run_dir.join("nodes").join(node);
    let conf_dir = node_dir.join("cni/net.d");
    let conflist = std::fs::read_dir(&conf_dir)
        .expect("conf dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "conflist"))
        .expect("the node's primary conflist");
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&conflist).expect("read")).expect("json");
    let plugins = doc["plugins"].as_array_mut().expect("plugins");
    plugins.retain(|p| p["type"] != "ambit-cni");
    plugins.push(serde_json::json!({"type": "istio-cni", "name": "istio-cni",
        "cni_agent_run_dir": "/var/run/istio-cni", "plugin_log_level": "info"}));
    std::fs::write(&conflist, serde_json::to_string_pretty(&doc).expect("json")).expect("write");

    // The image: `ambit`, with `install-cni` and `ztunnel` linked to it, the plugin in /opt/cni/bin.
    let bin = c.scratch.path().join("image");
    std::fs::create_dir_all(&bin).expect("image dir");
    for name in ["install-cni", "ztunnel"] {
        std::os::unix::fs::symlink(ambit_bin(), bin.join(name)).expect("symlink");
    }
    let _dirs = HostDirs::make(&["/host", "/run/istio-cni", "/run/ztunnel"]);

    // install-cni, as istio-cni's DaemonSet runs it (command and args), with the chart's mounts.
    let host_netns = format!("/run/netns/{netns}");
    let agent_script = format!(
        "mount -t tmpfs tmpfs /host
         mkdir -p /host/proc/1/ns /host/etc/cni/net.d /host/opt/cni/bin /host/var/run/netns
         touch /host/proc/1/ns/net && mount --bind {host_netns} /host/proc/1/ns/net
         mount --bind {conf} /host/etc/cni/net.d
         mount --bind {bins} /host/opt/cni/bin
         mount --rbind /run/netns /host/var/run/netns
         mount -t tmpfs tmpfs /opt && mkdir -p /opt/cni/bin && touch /opt/cni/bin/ambit-cni
         mount --bind {plugin} /opt/cni/bin/ambit-cni
         exec {image}/install-cni --log_output_level=default:info",
        conf = conf_dir.display(),
        bins = node_dir.join("cni/bin").display(),
        plugin = ambit_cni_path().display(),
        image = bin.display(),
    );
    let mut agent_env = istio_cni_env(node);
    agent_env.push(("AMBIT_SOURCE_DIR", c.run_dir.join("objects").display().to_string()));
    agent_env.push(("AMBIT_CAPTURE_STATE_DIR", c.run_dir.join("capture").display().to_string()));
    let agent_log = c.scratch.path().join("install-cni.log");
    let mut agent = ChildGuard::spawn_to_file(
        "install-cni",
        in_node(&netns, &agent_script, &agent_env, c.scratch.path()),
        &agent_log,
    );

    // ztunnel, as its DaemonSet runs it (`proxy ztunnel`), with the token and root mounted where
    // the chart mounts them (relative to its working directory, `/` in the container).
    let root = c.scratch.path().join("ztunnel-root");
    let control = c.run_dir.join("control");
    for (dir, file, from) in [
        ("var/run/secrets/tokens", "istio-token", control.join("tokens").join(format!("{node}.token"))),
        ("var/run/secrets/istio", "root-cert.pem", control.join("root-cert.pem")),
    ] {
        std::fs::create_dir_all(root.join(dir)).expect("mkdir");
        std::fs::copy(&from, root.join(dir).join(file)).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
    let state = c.state();
    let member =
        |name: &str| state.network.member(name).unwrap_or_else(|| panic!("no member {name}")).clone();
    let (node_ip, control_ip) = (member(node).ip.to_string(), member("control").ip.to_string());
    let mut proxy_env = ztunnel_env(node, &node_ip, &format!("{control_ip}:15012"));
    // The chart's `env` value: the name on the control plane's certificate.
    proxy_env.push(("ALT_XDS_HOSTNAME", ambit_cluster::up::CONTROL_HOSTNAME.to_owned()));
    proxy_env.push(("ALT_CA_HOSTNAME", ambit_cluster::up::CONTROL_HOSTNAME.to_owned()));
    let proxy_log = c.scratch.path().join("ztunnel.log");
    let mut proxy = ChildGuard::spawn_to_file(
        "ztunnel",
        in_node(&netns, &format!("exec {}/ztunnel proxy ztunnel", bin.display()), &proxy_env, &root),
        &proxy_log,
    );
    let logs = || {
        format!(
            "--- install-cni ---\n{}\n--- ztunnel ---\n{}\n{}",
            std::fs::read_to_string(&agent_log).unwrap_or_default(),
            std::fs::read_to_string(&proxy_log).unwrap_or_default(),
            c.logs()
        )
    };

    // Both serve: the agent ready (plugin installed), the proxy ready (xDS and a certificate).
    let ready = wait_for(
        || get(&netns, 8000, "/readyz").0 == 200 && get(&netns, 15021, "/healthz/ready").0 == 200,
        Duration::from_secs(30),
    );
    assert!(
        ready,
        "install-cni or ztunnel not ready: agent {:?}, proxy {:?}\n{}",
        get(&netns, 8000, "/readyz"),
        get(&netns, 15021, "/healthz/ready"),
        logs()
    );
    assert!(agent.try_wait().is_none() && proxy.try_wait().is_none(), "{}", logs());

    // Istio's settings were read: the chart's repair settings are named as without effect, the
    // istio-cni entry is gone and ours points at istio-cni's run dir.
    let agent_text = std::fs::read_to_string(&agent_log).unwrap_or_default();
    assert!(agent_text.contains("REPAIR_ENABLED is istio-cni's and has no effect in Ambit"), "{agent_text}");
    let text = std::fs::read_to_string(&conflist).expect("read");
    let doc: Value = serde_json::from_str(&text).expect("json");
    let types: Vec<&str> =
        doc["plugins"].as_array().into_iter().flatten().filter_map(|p| p["type"].as_str()).collect();
    assert!(!types.contains(&"istio-cni"), "a stale istio-cni entry is left: {text}");
    assert_eq!(types.last(), Some(&"ambit-cni"), "{text}");
    let ours = doc["plugins"].as_array().and_then(|p| p.last()).cloned().unwrap_or_default();
    assert_eq!(ours["cni_agent_run_dir"], "/var/run/istio-cni", "{text}");

    // istio-cni's metric names, beside ours.
    let (code, metrics) = get(&netns, 15014, "/metrics");
    assert_eq!(code, 200, "{metrics}");
    assert_eq!(probe::metric_sum(&metrics, "istio_cni_install_ready", &[]), 1.0, "{metrics}");
    assert_eq!(probe::metric_sum(&metrics, "ztunnel_connected", &[]), 1.0, "{metrics}");
    assert_eq!(
        probe::metric_sum(&metrics, "istio_cni_installs_total", &[("result", "SUCCESS")]),
        1.0,
        "{metrics}"
    );

    // New pods, created through the node's CNI chain, are captured by install-cni and served
    // by ztunnel.
    c.apply("pods.yaml", PODS);
    let served = wait_for(
        || ["demo/client", "demo/server"].iter().all(|p| c.proxy_has(node, p)),
        Duration::from_secs(30),
    );
    assert!(served, "ztunnel does not hold the new pods: {}\n{}", c.status(), logs());
    let (_, metrics) = get(&netns, 15014, "/metrics");
    assert_eq!(
        probe::metric_sum(&metrics, "istio_cni_plugin_requests_total", &[("response_code", "200")]),
        2.0,
        "the two CNI ADDs: {metrics}"
    );
    assert!(wait_for(|| c.pod("demo/server").phase == "Ready", Duration::from_secs(30)), "{}", c.status());
    let before = c.counters();
    let addr = c.addr("demo/server", 8080).to_string();
    let line = c.client("demo/client", &addr, 1).remove(0);
    assert!(line.get("reply").is_some(), "client → server got no reply: {line}\n{}", logs());
    let got = wait_counted(&c, &before, Duration::from_secs(3), |g| g.mtls >= 1.0);
    assert_eq!(got.mtls, 1.0, "not counted as one mTLS connection by ztunnel: {got:?}\n{}", logs());
    assert_eq!(got.principals, ["spiffe://cluster.local/ns/demo/sa/client"], "{got:?}");
    eprintln!("under Istio's charts: client → server {line}, counted by ztunnel {got:?}");

    // Both stop on SIGTERM, as on a DaemonSet rollout.
    for (what, p) in [("ztunnel", &mut proxy), ("install-cni", &mut agent)] {
        let status = p.stop(Duration::from_secs(35));
        assert!(status.success(), "{what} exited with {status} on SIGTERM\n{}", logs());
    }
    c.down();
}
