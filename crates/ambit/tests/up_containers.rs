//! Ambit's components run as Kubernetes would run them: on `ambit up`, the control plane and
//! node1's agent and proxy are podman containers from Ambit's images (built here by
//! `deploy/images/build.sh`), with the user, capabilities, seccomp and AppArmor settings,
//! read-only root, environment and volumes of the pods `helm template` renders, read from the
//! rendered manifests. node2's agent and proxy stay host processes. Then the mesh is driven as
//! in tests/up_e2e.rs: mTLS within node1 and across nodes, a DENY policy counted by the
//! container proxy, a namespace enrolled and released by the container agent, the agent
//! restarted, and the container proxy replaced under load without a failed connection; once per
//! capture: nftables, iptables-nft, and iptables-legacy on a node whose rules are legacy ones.
//!
//! What `ambit up` cannot give as a kubelet would, and what stands in for it (each named where
//! it is made): no API server, so the components keep `ambit up`'s object and capture folders
//! (mounted at their own paths) and their pod fields (`status.podIP`, ports of a proxy
//! generation) come from `ambit up`; the node's host network namespace is a named namespace, not
//! pid 1's; Secrets, ConfigMaps, tokens and emptyDirs are directories the test fills.
//!
//! Root, with buildah and podman (`.ci/run` installs them); under `CI=true` a missing one fails.

#[allow(dead_code)]
mod chart {
    pub mod pods;
    pub mod render;
    pub mod values;
}
mod common;
mod containers {
    pub mod inspect;
    pub mod launch;
}

use std::collections::BTreeMap;
use std::time::Duration;

use ambit_objects::k8s_openapi::api::core::v1::PodSpec;
use chart::render::{NAMESPACE, render};
use common::images::{build, run, tools};
use common::*;
use containers::inspect::{Cleanup, assert_privileges, container_named};
use containers::launch::{Extra, Launch, Stand, Word, launcher, lit};

const CONVERGE: Duration = Duration::from_secs(10);

/// Two nodes: in `demo` (enrolled) a client and a server on each; in `plain` a web server on
/// node1 (the container node) and an outsider on node2.
const CLUSTER: &str = r#"apiVersion: v1
kind: Namespace
metadata:
  name: demo
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: Namespace
metadata:
  name: plain
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: demo}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: other, namespace: demo}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: server, namespace: demo}
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
metadata: {name: other, namespace: demo, labels: {app: other}}
spec:
  nodeName: node2
  serviceAccountName: other
  containers: [{name: idle, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: server-a, namespace: demo, labels: {app: server}}
spec:
  nodeName: node1
  serviceAccountName: server
  containers:
  - {name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: server-b, namespace: demo, labels: {app: server}}
spec:
  nodeName: node2
  serviceAccountName: server
  containers:
  - {name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: outsider, namespace: plain, labels: {app: outsider}}
spec:
  nodeName: node2
  containers: [{name: idle, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: plain, labels: {app: web}}
spec:
  nodeName: node1
  containers:
  - {name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}
"#;

#[test]
fn the_chart_s_pods_run_in_containers_on_ambit_up_and_carry_the_mesh() {
    if !tools() {
        return;
    }
    let version = env!("CARGO_PKG_VERSION");
    let registry = format!("localhost/ambit-containers{}", std::process::id());
    let built = tempfile::tempdir().expect("tempdir");
    build(built.path(), &registry, None);
    let _images = Images(
        ["ambit", "ambit-agent", "ztunnel", "install-cni"].map(|n| format!("{registry}/{n}:{version}")),
    );
    // One after the other: all use the chart's fixed host paths (/var/run/ambit, /var/run/ztunnel).
    for capture in [Capture::Nftables, Capture::IptablesNft, Capture::IptablesLegacy] {
        eprintln!("capture {capture:?}");
        mesh_in_containers(&registry, capture);
    }
}

/// How node1's agent captures: the chart's backend, and for iptables the variant the node's
/// own rules make it pick (legacy where they are legacy ones, else nft).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Capture {
    Nftables,
    IptablesNft,
    IptablesLegacy,
}

impl Capture {
    fn backend(self) -> &'static str {
        match self {
            Capture::Nftables => "nftables",
            Capture::IptablesNft | Capture::IptablesLegacy => "iptables",
        }
    }

    /// What the launcher does first in node1's namespace: for legacy, a chain of the node's own
    /// in the legacy tables (both families), which makes the agent pick iptables-legacy.
    fn seed(self) -> Vec<String> {
        match self {
            Capture::IptablesLegacy => ["iptables-legacy", "ip6tables-legacy"]
                .map(|t| format!("{t} -w -t mangle -N AMBIT-NODE-RULE 2>/dev/null || {t} -w -t mangle -L AMBIT-NODE-RULE >/dev/null"))
                .to_vec(),
            Capture::Nftables | Capture::IptablesNft => Vec::new(),
        }
    }

    /// A pod's capture rules as this variant keeps them (without counters and dates).
    fn rules(self, c: &LocalCluster, pod: &str) -> String {
        match self {
            Capture::Nftables | Capture::IptablesNft => ruleset(c, pod),
            Capture::IptablesLegacy => {
                let out = std::process::Command::new("ip")
                    .args(["netns", "exec", &c.pod(pod).netns, "iptables-legacy-save"])
                    .output()
                    .expect("iptables-legacy-save");
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| !l.starts_with('#'))
                    .map(|l| l.split(" [").next().unwrap_or(l))
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        }
    }
}

/// Removes the test's images, whatever happened.
struct Images([String; 4]);

impl Drop for Images {
    fn drop(&mut self) {
        for i in &self.0 {
            let _ = run("podman", &["rmi", "--force", i]);
        }
    }
}

/// The cluster with the chart rendered for `mode`'s backend, driven through the mesh.
fn mesh_in_containers(registry: &str, mode: Capture) {
    let backend = mode.backend();
    let version = env!("CARGO_PKG_VERSION");
    let mut c = LocalCluster::new();
    let _cleanup = Cleanup { tag: c.tag.clone() };

    // What a user on this platform would render: the chart's images from the registry they
    // were built for, the node's CNI folders where this node keeps them.
    let node1 = c.run_dir.join("nodes/node1");
    let conf_dir = node1.join("cni/net.d");
    let bin_dir = node1.join("cni/bin");
    let sets = [
        format!("agent.captureBackend={backend}"),
        format!("image.registry={registry}"),
        format!("platform.cniConfDir={}", conf_dir.display()),
        format!("platform.cniBinDir={}", bin_dir.display()),
    ];
    let mut args: Vec<&str> = Vec::new();
    for s in &sets {
        args.extend(["--set", s]);
    }
    let r = render(&args).expect("renders");
    let spec = |name: &str| r.pod_spec(name).unwrap_or_else(|| panic!("no {name} in the rendering"));
    let (agent_pod, proxy_pod, control_pod) = (spec("ambit-agent"), spec("ztunnel"), spec("ambit-control"));
    let image_of = |p: &PodSpec| p.containers[0].image.clone().expect("image");
    assert_eq!(image_of(&proxy_pod), format!("{registry}/ambit:{version}"));
    assert_eq!(image_of(&agent_pod), format!("{registry}/ambit-agent:{version}"));

    let (objects, capture, control) =
        (c.run_dir.join("objects"), c.run_dir.join("capture"), c.run_dir.join("control"));
    let scratch = c.scratch.path().to_owned();
    let tag = c.tag.clone();
    let xds = chart::pods::env(&proxy_pod.containers[0], "XDS_ADDRESS").expect("XDS_ADDRESS").to_owned();
    let xds_host = xds.trim_start_matches("https://").rsplit_once(':').expect("host:port").0.to_owned();

    let launches = [
        Launch {
            process: "control".into(),
            pod_name: "ambit-control-0",
            container: lit(format!("{tag}-control")),
            container_spec: control_pod.containers[0].clone(),
            pod: control_pod.clone(),
            extra: Extra {
                keep: &[
                    "--config",
                    "--capture-state-dir",
                    "--secure-grpc-addr",
                    "--grpc-addr",
                    "--monitoring-addr",
                    "--http-addr",
                ],
                // AMBIT_CONTROL_STATE_DIR is rendered.
                drop: &["--state-dir"],
                same_path: vec![(objects.clone(), true), (capture.clone(), true)],
                env_override: Vec::new(),
                env_from_up: &[],
                stands: BTreeMap::from([
                    // No plugged-in CA: the control plane makes its own root in its state.
                    ("cacerts", Stand { dir: scratch.join("control-cacerts"), fill: Vec::new() }),
                    // The state emptyDir is `ambit up`'s control folder: the node tokens and the
                    // root the host processes of node2 read.
                    ("state", Stand { dir: control.clone(), fill: Vec::new() }),
                ]),
                before: Vec::new(),
                flags: Vec::new(),
            },
        },
        Launch {
            process: "agent/node1".into(),
            pod_name: "ambit-agent-node1",
            container: lit(format!("{tag}-agent-node1")),
            container_spec: agent_pod.containers[0].clone(),
            pod: agent_pod.clone(),
            extra: Extra {
                keep: &["--source-dir", "--capture-state-dir", "--source-poll"],
                // Set by the rendered environment (NODE_NAME, CNI_AGENT_RUN_DIR, ZTUNNEL_UDS_ADDRESS,
                // EXCLUDE_NAMESPACES, MOUNTED_CNI_NET_DIR, AMBIT_CNI_BIN_DIR, AMBIT_CNI_BINARY) or
                // the agent's defaults, which are the chart's ports.
                drop: &[
                    "--node-name",
                    "--run-dir",
                    "--zds-socket",
                    "--metrics-addr",
                    "--health-addr",
                    "--exclude-namespaces",
                    "--cni-conf-dir",
                    "--cni-bin-dir",
                    "--cni-binary",
                ],
                same_path: vec![(objects.clone(), true), (capture.clone(), false)],
                // The node's host network namespace is a named one on `ambit up`.
                env_override: vec![("AMBIT_HOST_NETNS", Word::Shell("/host/var/run/netns/$netns".into()))],
                env_from_up: &[],
                stands: BTreeMap::new(),
                before: mode.seed(),
                flags: Vec::new(),
            },
        },
        Launch {
            process: "proxy/node1".into(),
            pod_name: "ztunnel-node1",
            // Two generations run side by side while one replaces the other.
            container: Word::Shell(format!("{tag}-proxy-node1-${{AMBIT_ADMIN_ADDR##*:}}")),
            container_spec: proxy_pod.containers[0].clone(),
            pod: proxy_pod.clone(),
            extra: Extra {
                keep: &[],
                drop: &[],
                same_path: Vec::new(),
                env_override: Vec::new(),
                // The ports of the proxy's generation: during a replacement two proxies share
                // the node's namespace here, where Kubernetes gives each pod its own.
                env_from_up: &["AMBIT_ADMIN_ADDR", "AMBIT_STATS_ADDR", "AMBIT_READINESS_ADDR"],
                stands: BTreeMap::from([
                    (
                        "istio-token",
                        Stand {
                            dir: scratch.join("proxy-token"),
                            fill: vec![format!(
                                "cp '{}' '{}'",
                                control.join("tokens/node1.token").display(),
                                scratch.join("proxy-token/istio-token").display()
                            )],
                        },
                    ),
                    (
                        "istiod-ca-cert",
                        Stand {
                            dir: scratch.join("proxy-root"),
                            fill: vec![format!(
                                "cp '{}' '{}'",
                                control.join("root-cert.pem").display(),
                                scratch.join("proxy-root/root-cert.pem").display()
                            )],
                        },
                    ),
                ]),
                before: Vec::new(),
                // The Service name the chart's proxies dial, as cluster DNS would answer it.
                flags: vec![
                    lit("--add-host"),
                    Word::Shell(format!("{xds_host}:$(a=${{XDS_ADDRESS#https://}}; echo ${{a%:*}})")),
                ],
            },
        },
    ];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).to_string();
    let fields: BTreeMap<&str, Word> = BTreeMap::from([
        ("metadata.namespace", lit(NAMESPACE)),
        ("spec.nodeName", lit("node1")),
        ("status.podIP", Word::Shell("$INSTANCE_IP".into())),
        // No CPU limit: the node's cores, as the kubelet fills limits.cpu.
        ("limits.cpu", lit(cores)),
    ]);
    let cases: Vec<String> = launches.iter().map(|l| l.case(&image_of(&l.pod), &fields)).collect();
    let script = scratch.join("launcher.sh");
    std::fs::write(&script, launcher(&cases)).expect("launcher");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");

    let config = c.config(CLUSTER);
    let up = c.up_with(2, &config, &["--launcher", script.to_str().expect("path")]);
    assert!(up.stdout.contains("ambit up: ready in"), "{up}");

    // Three containers, each with what its rendered pod grants and nothing more.
    let running = container_named(&tag);
    assert_eq!(running.len(), 3, "{running:?}");
    let proxy_name = |gen_port: u16| format!("{tag}-proxy-node1-{gen_port}");
    let first_admin = c.state().proxy("node1").admin;
    for (l, name) in
        launches.iter().zip([format!("{tag}-control"), format!("{tag}-agent-node1"), proxy_name(first_admin)])
    {
        assert!(running.contains(&name), "{name} is not running: {running:?}");
        assert_privileges(&name, l, &image_of(&l.pod));
    }
    let status = c.status();
    assert_eq!(status["phase"], "ready", "{status}");
    for p in status["pods"].as_array().into_iter().flatten() {
        assert_eq!(p["phase"], "Ready", "{p}");
    }
    for n in status["nodes"].as_array().into_iter().flatten() {
        assert!(n["agentReady"] == true && n["proxyReady"] == true, "{n}");
    }
    // The container agent put ambit-cni into node1's chain from its image, and captured node1's
    // enrolled pods.
    let chain = std::fs::read_dir(&conf_dir)
        .expect("conf dir")
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<String>();
    assert!(chain.contains("ambit-cni"), "node1's CNI chain: {chain}");
    assert!(bin_dir.join("ambit-cni").is_file());
    for p in ["demo/client", "demo/server-a", "demo/other", "demo/server-b"] {
        assert!(enrolled(&c, p), "{p} is not captured: {}", pod_status(&c, p));
    }
    assert!(!enrolled(&c, "plain/web"));
    // The zero-loss handoff's sysctl, set in node1's pods by the container agent through a
    // procfs of its own (the container's /proc/sys is read-only).
    let node1_ns = format!("{tag}-node1");
    let (code, metrics) =
        ambit_cluster::probe::http_get(&node1_ns, 15014, "/metrics").expect("agent metrics");
    assert_eq!(code, 200);
    let supported = metrics.lines().find(|l| l.contains("tcp_migrate_req_supported") && !l.starts_with('#'));
    assert!(supported.is_some_and(|l| l.ends_with(" 1")), "{supported:?}");
    let sysctl = std::process::Command::new("ip")
        .args(["netns", "exec", &c.pod("demo/server-a").netns, "sysctl", "-n", "net.ipv4.tcp_migrate_req"])
        .output()
        .expect("sysctl");
    assert_eq!(String::from_utf8_lossy(&sysctl.stdout).trim(), "1", "server-a's tcp_migrate_req");

    // mTLS within node1, and both ways across nodes.
    assert_mtls(&c, "demo/client", "demo/server-a", CLIENT, "within the container node");
    assert_mtls(&c, "demo/client", "demo/server-b", CLIENT, "from the container node");
    assert_mtls(&c, "demo/other", "demo/server-a", OTHER, "to the container node");

    // A policy: the container proxy counts the denial.
    c.apply("deny.yaml", DENY_CLIENT);
    assert!(
        wait_for(|| try_denied(&c, "demo/client", "demo/server-a").is_ok(), CONVERGE),
        "the DENY policy was not in force on node1\n{}",
        c.logs()
    );
    assert_mtls(&c, "demo/other", "demo/server-a", OTHER, "the policy names only client");
    c.delete("deny.yaml", DENY_CLIENT);
    assert!(wait_for(|| connect(&c, "demo/client", "demo/server-a").get("reply").is_some(), CONVERGE));

    // Enrolled live by the container agent, then released.
    let plain_on = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: plain\n  labels:\n    istio.io/dataplane-mode: ambient\n";
    c.apply("plain.yaml", plain_on);
    assert!(
        wait_for(|| enrolled(&c, "plain/web") && enrolled(&c, "plain/outsider"), CONVERGE),
        "enrolling plain did not capture its pods:\n{}",
        c.ambit(&["status"])
    );
    // Both proxies learn the pods' new state from the control plane: until then a connection
    // may still go in plaintext.
    let mtls = wait_for(
        || {
            let before = c.counters();
            connect(&c, "plain/outsider", "plain/web").get("reply").is_some()
                && wait_counted(&c, &before, Duration::from_secs(1), |g| g.mtls >= 1.0).mtls == 1.0
        },
        CONVERGE,
    );
    assert!(mtls, "enrolled outsider → web is not mTLS\n{}", c.logs());
    assert_mtls(&c, "plain/outsider", "plain/web", PLAIN, "enrolled live on the container node");
    c.apply("plain.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: plain\n");
    assert!(
        wait_for(|| !enrolled(&c, "plain/web") && !enrolled(&c, "plain/outsider"), CONVERGE),
        "un-enrolling plain did not release its pods:\n{}",
        c.ambit(&["status"])
    );
    assert_plaintext(&c, "plain/outsider", "plain/web", "released live");

    // The container agent restarted: the new one finds node1's running pods through the host's
    // /proc (their namespaces: SYS_PTRACE) and keeps their capture.
    let rules_before = mode.rules(&c, "demo/server-a");
    let mark = if mode == Capture::IptablesLegacy { "ISTIO_PRERT" } else { "table" };
    assert!(rules_before.contains(mark), "no capture rules in server-a ({mode:?}):\n{rules_before}");
    let restarted = c.ambit(&["restart", "agent/node1"]);
    assert_eq!(restarted.code, Some(0), "{restarted}");
    assert!(
        wait_for(|| ambit_cluster::probe::ready(&node1_ns, 8000, "/readyz"), Duration::from_secs(20)),
        "the container agent did not become ready again\n{}",
        c.logs()
    );
    assert_eq!(mode.rules(&c, "demo/server-a"), rules_before, "the agent restart changed server-a's capture");
    assert_privileges(&format!("{tag}-agent-node1"), &launches[1], &image_of(&agent_pod));
    assert_mtls(&c, "demo/client", "demo/server-a", CLIENT, "after the agent restart");

    // The container proxy replaced under 200 connections/s: none fails; the new one is a
    // container too, with the same privileges.
    let load = Load::start(&c.pod("demo/client").netns, c.addr("demo/server-a", 8080), 200, 20, app_echo);
    assert!(wait_for(|| load.ok() >= 100, Duration::from_secs(10)), "the load made no progress");
    let replaced = c.ambit(&["restart", "proxy/node1"]);
    assert_eq!(replaced.code, Some(0), "{replaced}\n{}", c.logs());
    let at_replace = load.ok();
    assert!(
        wait_for(|| load.ok() >= at_replace + 200, Duration::from_secs(10)),
        "no progress after the replacement"
    );
    let (done, failures, _) = load.finish();
    eprintln!(
        "container proxy replaced: {done} connections, {} failed; {}",
        failures.len(),
        replaced.stdout.trim()
    );
    assert!(
        failures.is_empty(),
        "{} of {} connections failed: {:?}",
        failures.len(),
        done + failures.len(),
        &failures[..failures.len().min(10)]
    );
    let second = proxy_name(c.state().proxy("node1").admin);
    assert_ne!(second, proxy_name(first_admin));
    assert!(
        wait_for(|| container_named(&tag).len() == 3, Duration::from_secs(15)),
        "{:?}",
        container_named(&tag)
    );
    assert_privileges(&second, &launches[2], &image_of(&proxy_pod));
    assert_mtls(&c, "demo/other", "demo/server-a", OTHER, "after the replacement");

    // `ambit down` stops the containers.
    let down = c.down();
    assert_eq!(down.code, Some(0), "{down}");
    assert!(
        wait_for(|| container_named(&tag).is_empty(), Duration::from_secs(15)),
        "containers left after ambit down: {:?}",
        container_named(&tag)
    );
}
