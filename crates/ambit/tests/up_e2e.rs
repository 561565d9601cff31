//! The end-to-end suite on `ambit up`: the cluster users run (two nodes, six pods created
//! through each node's CNI chain, `ambit control`, per node `ambit agent` and a shared-mode
//! `ambit proxy`), driven through the same commands users type. Every verdict is read from what
//! the destination node proxy counted (the source's SPIFFE identity, `mutual_tls`, denials) and
//! from what the client got, never from a timeout.
//!
//! Needs root (under `CI=true` a missing privilege fails instead of skipping).

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// How long a live change may take to be in force on both nodes.
const CONVERGE: Duration = Duration::from_secs(10);

/// Two nodes × six pods: an enrolled namespace (`demo`: a client, another client, a Deployment
/// of two servers), a plain one (`plain`: an outsider and a web server), a Service.
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
apiVersion: apps/v1
kind: Deployment
metadata: {name: server, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: server}}
  template:
    metadata: {labels: {app: server}}
    spec:
      serviceAccountName: server
      containers:
      - {name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  selector: {app: server}
  ports: [{name: tcp-echo, port: 80, targetPort: 8080}]
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
metadata: {name: outsider, namespace: plain, labels: {app: outsider}}
spec:
  nodeName: node1
  containers: [{name: idle, command: [sleep, infinity]}]
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: plain, labels: {app: web}}
spec:
  nodeName: node2
  containers:
  - {name: echo, command: [ambit, app, echo, --port, "8080"], ports: [{containerPort: 8080}]}
"#;

/// The README's demo: every verdict row as expected (exit 0), then `ambit down` leaves nothing.
#[test]
fn the_demo_passes_and_down_leaves_nothing() {
    if !require_root() {
        return;
    }
    let mut c = LocalCluster::new();
    let links = host_link_names();
    let r = c.up_demo();
    assert_eq!(r.code, Some(0), "ambit up --demo:\n{r}\n{}", c.logs());
    assert!(r.stdout.contains("every flow behaved as expected"), "{r}");
    let rows = r.stdout.lines().filter(|l| l.ends_with("  ok")).count();
    assert_eq!(rows, 10, "want 10 verdict rows ok (7 L4, 3 through the waypoint):\n{r}");
    assert!(!r.stdout.contains("DIFFERS"), "{r}");
    let state = c.state();
    let pids: Vec<u32> = state.processes.iter().filter_map(|p| p.pid).chain([state.owner]).collect();
    assert_eq!(pids.len(), 15, "the owner, control, 2 agents, 2 proxies, 9 containers: {pids:?}");
    let down = c.down();
    assert!(down.stdout.contains("stopped the cluster's owner"), "{down}");
    assert_nothing_left(&c, &state.cgroup_root, &pids, &links);
}

/// No namespace of the tag, no run directory, no cgroup, none of the processes, no new link in
/// the host namespace.
fn assert_nothing_left(c: &LocalCluster, cgroup_root: &std::path::Path, pids: &[u32], links: &[String]) {
    assert_eq!(ambit_cluster::ip::netns_with_prefix(&format!("{}-", c.tag)), Vec::<String>::new());
    assert!(!c.run_dir.exists(), "{} is left", c.run_dir.display());
    assert!(!cgroup_root.exists(), "{} is left", cgroup_root.display());
    for pid in pids {
        assert!(!ambit_cluster::state::pid_alive(*pid), "process {pid} is left");
    }
    assert_eq!(host_link_names(), links, "links changed in the host namespace");
}

#[test]
fn the_mesh_on_ambit_up() {
    if !require_root() {
        return;
    }
    let mut c = LocalCluster::new();
    let config = c.config(CLUSTER);
    let host_links = host_link_names();
    let t0 = Instant::now();
    let up = c.up(2, &config);
    let took_up = t0.elapsed();
    assert!(up.stdout.contains("ambit up: ready in"), "{up}");

    // Six pods, three per node, all ready; the enrolled ones captured with the proxy in them.
    let status = c.status();
    assert_eq!(status["phase"], "ready", "{status}");
    let pods = status["pods"].as_array().cloned().unwrap_or_default();
    assert_eq!(pods.len(), 6, "{status}");
    for p in &pods {
        assert_eq!(p["phase"], "Ready", "{p}");
    }
    for n in status["nodes"].as_array().into_iter().flatten() {
        assert!(n["agentReady"] == true && n["proxyReady"] == true, "{n}");
        assert_eq!(pods.iter().filter(|p| p["node"] == n["name"]).count(), 3, "{status}");
    }
    for p in ["demo/client", "demo/other", "demo/server-0", "demo/server-1"] {
        assert!(enrolled(&c, p), "{p} is not captured: {}", pod_status(&c, p));
    }
    for p in ["plain/outsider", "plain/web"] {
        let s = pod_status(&c, p);
        assert!(s["redirection"] == "" && s["proxyListening"] == false, "{p} is captured: {s}");
    }
    assert_eq!(c.pod("demo/server-0").node, "node1");
    assert_eq!(c.pod("demo/server-1").node, "node2");

    // `ambit up` twice: refused, naming the cluster that is up; nothing changed.
    let again = c.ambit(&["up", "--nodes", "2"]);
    assert_eq!(again.code, Some(1), "{again}");
    assert!(again.stderr.contains("a cluster is already up"), "{again}");
    assert_eq!(c.status()["phase"], "ready");

    // Same node and across nodes: mTLS with the client's identity.
    assert_mtls(&c, "demo/client", "demo/server-0", CLIENT, "same node");
    assert_mtls(&c, "demo/client", "demo/server-1", CLIENT, "across nodes");
    assert_mtls(&c, "demo/other", "demo/server-0", OTHER, "across nodes, the other way");
    // The Service VIP reaches both replicas.
    let lines = c.client("demo/client", "10.96.0.10:80", 20);
    let mut servers: Vec<&str> = lines.iter().filter_map(|l| l["reply"]["server"].as_str()).collect();
    servers.sort_unstable();
    servers.dedup();
    assert_eq!(servers, ["server-0", "server-1"], "{lines:?}");
    assert_plaintext(&c, "plain/outsider", "plain/web", "plain to plain");
    control_plane_checks(&c);

    // A policy added live denies, removed live allows again.
    // Timed: until the client's connection gets no answer (what the user sees); then the next
    // connection shows it is the policy's doing (a denial counted by the destination), outside
    // the timing, which reading the proxies' counters under load would otherwise stretch.
    c.apply("deny.yaml", DENY_CLIENT);
    let t = Instant::now();
    let refused = wait_for(|| connect(&c, "demo/client", "demo/server-1").get("reply").is_none(), CONVERGE);
    let took = t.elapsed();
    assert!(refused, "the DENY policy was not in force within {CONVERGE:?}\n{}", c.logs());
    eprintln!("DENY policy in force {took:?} after `ambit apply`");
    assert!(took <= Duration::from_secs(2), "the DENY policy took {took:?} to be in force (bound 2 s)");
    try_denied(&c, "demo/client", "demo/server-1").unwrap_or_else(|e| panic!("across nodes: {e}"));
    try_denied(&c, "demo/client", "demo/server-0").unwrap_or_else(|e| panic!("same node: {e}"));
    assert_mtls(&c, "demo/other", "demo/server-1", OTHER, "the policy names only client");
    let shown = c.ambit(&["status"]);
    assert!(shown.stdout.contains(&format!("{CLIENT} → demo/server-1")), "status shows no denial:\n{shown}");
    c.delete("deny.yaml", DENY_CLIENT);
    let allowed = wait_for(|| connect(&c, "demo/client", "demo/server-1").get("reply").is_some(), CONVERGE);
    assert!(allowed, "removing the policy did not allow again within {CONVERGE:?}");
    assert_mtls(&c, "demo/client", "demo/server-1", CLIENT, "after the policy");

    // PeerAuthentication STRICT refuses plaintext to the demo pods: the outsider (not in the
    // mesh) is allowed before, denied after; mTLS still passes.
    assert_plaintext(&c, "plain/outsider", "demo/server-0", "plaintext before STRICT");
    let strict = "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: strict, namespace: demo}\nspec:\n  mtls: {mode: STRICT}\n";
    c.apply("strict.yaml", strict);
    let refused = wait_for(|| try_denied(&c, "plain/outsider", "demo/server-0").is_ok(), CONVERGE);
    assert!(refused, "plaintext to a STRICT pod was not denied\n{}", c.logs());
    assert_mtls(&c, "demo/client", "demo/server-0", CLIENT, "mTLS to a STRICT pod");
    c.delete("strict.yaml", strict);
    assert!(wait_for(|| connect(&c, "plain/outsider", "demo/server-0").get("reply").is_some(), CONVERGE));

    // Enrolling a namespace live: its pods are captured and talk mTLS; un-enrolling releases them.
    let plain_on = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: plain\n  labels:\n    istio.io/dataplane-mode: ambient\n";
    c.apply("plain.yaml", plain_on);
    let captured = wait_for(|| enrolled(&c, "plain/outsider") && enrolled(&c, "plain/web"), CONVERGE);
    assert!(captured, "enrolling plain did not capture its pods:\n{}", c.ambit(&["status"]));
    let ok = wait_for(
        || {
            let before = c.counters();
            connect(&c, "plain/outsider", "plain/web").get("reply").is_some()
                && wait_counted(&c, &before, Duration::from_secs(1), |g| g.mtls >= 1.0).mtls == 1.0
        },
        CONVERGE,
    );
    assert!(ok, "enrolled outsider → web is not mTLS\n{}", c.logs());
    assert_mtls(&c, "plain/outsider", "plain/web", PLAIN, "enrolled live");
    c.apply("plain.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: plain\n");
    let released = wait_for(|| !enrolled(&c, "plain/outsider") && !enrolled(&c, "plain/web"), CONVERGE);
    assert!(released, "un-enrolling plain did not release its pods:\n{}", c.ambit(&["status"]));
    assert_plaintext(&c, "plain/outsider", "plain/web", "un-enrolled live");

    // Replacing node1's proxy while the client opens 200 connections/s to a server on node1:
    // no connection fails.
    let load = Load::start(&c.pod("demo/client").netns, c.addr("demo/server-0", 8080), 200, 20, app_echo);
    assert!(wait_for(|| load.ok() >= 100, Duration::from_secs(10)), "the load made no progress");
    let replaced = c.ambit(&["restart", "proxy/node1"]);
    assert_eq!(replaced.code, Some(0), "{replaced}\n{}", c.logs());
    let at_replace = load.ok();
    assert!(
        wait_for(|| load.ok() >= at_replace + 200, Duration::from_secs(10)),
        "no progress after the replacement"
    );
    let (ok, failures, ran) = load.finish();
    eprintln!(
        "proxy replacement: {ok} connections in {ran:.1?}, {} failed; {}",
        failures.len(),
        replaced.stdout.trim()
    );
    assert!(
        failures.is_empty(),
        "{} of {} connections failed across the replacement: {:?}",
        failures.len(),
        ok + failures.len(),
        &failures[..failures.len().min(10)]
    );
    assert!(c.state().proxy("node1").admin == 16000, "the new proxy's ports are not recorded");
    assert_mtls(&c, "demo/client", "demo/server-0", CLIENT, "after the proxy replacement");
    assert_mtls(&c, "demo/other", "demo/server-0", OTHER, "across nodes, after the proxy replacement");

    // Restarting node2's agent: no capture is lost (the rules stay; traffic stays mTLS).
    let rules_before = ruleset(&c, "demo/server-1");
    assert!(rules_before.contains("table"), "no capture rules in server-1:\n{rules_before}");
    let load = Load::start(&c.pod("demo/client").netns, c.addr("demo/server-1", 8080), 100, 10, app_echo);
    assert!(wait_for(|| load.ok() >= 50, Duration::from_secs(10)), "the load made no progress");
    let restarted = c.ambit(&["restart", "agent/node2"]);
    assert_eq!(restarted.code, Some(0), "{restarted}");
    let node2 = format!("{}-node2", c.tag);
    assert!(
        wait_for(|| ambit_cluster::probe::ready(&node2, 8000, "/readyz"), Duration::from_secs(20)),
        "the agent on node2 did not become ready again\n{}",
        c.logs()
    );
    let at = load.ok();
    assert!(
        wait_for(|| load.ok() >= at + 100, Duration::from_secs(10)),
        "no progress after the agent restart"
    );
    let (ok, failures, _) = load.finish();
    assert!(
        failures.is_empty(),
        "{} of {ok} connections failed across the agent restart: {failures:?}",
        failures.len()
    );
    assert_eq!(ruleset(&c, "demo/server-1"), rules_before, "the agent restart changed server-1's capture");
    assert!(enrolled(&c, "demo/server-1") && enrolled(&c, "demo/other"));
    assert_mtls(&c, "demo/client", "demo/server-1", CLIENT, "after the agent restart");

    // Killing `ambit control`: traffic keeps flowing on the last state; a change made meanwhile
    // arrives once it is back.
    let killed = c.ambit(&["stop", "control", "--kill"]);
    assert_eq!(killed.code, Some(0), "{killed}");
    let procs = c.status()["processes"].clone();
    let control =
        procs.as_array().and_then(|p| p.iter().find(|p| p["name"] == "control").cloned()).unwrap_or_default();
    assert_eq!(control["state"], "killed on request", "{procs}");
    for _ in 0..3 {
        assert_mtls(&c, "demo/client", "demo/server-1", CLIENT, "with the control plane down");
        assert_mtls(&c, "demo/client", "demo/server-0", CLIENT, "with the control plane down");
        std::thread::sleep(Duration::from_millis(300));
    }
    c.apply("deny.yaml", DENY_CLIENT);
    std::thread::sleep(Duration::from_secs(1));
    assert_mtls(&c, "demo/client", "demo/server-1", CLIENT, "a change made while the control plane is down");
    let started = c.ambit(&["start", "control"]);
    assert_eq!(started.code, Some(0), "{started}");
    let t = Instant::now();
    let resynced =
        wait_for(|| try_denied(&c, "demo/client", "demo/server-1").is_ok(), Duration::from_secs(30));
    assert!(resynced, "the proxies did not resync with the control plane\n{}", c.logs());
    eprintln!("resynced {:?} after the control plane was started again", t.elapsed());
    c.delete("deny.yaml", DENY_CLIENT);
    assert!(wait_for(|| connect(&c, "demo/client", "demo/server-1").get("reply").is_some(), CONVERGE));

    // Scaling the Deployment live: a third replica on the emptier node, then back to two.
    let scaled = CLUSTER
        .split("\n---\n")
        .find(|d| d.contains("kind: Deployment"))
        .unwrap_or_default()
        .replace("replicas: 2", "replicas: 3");
    c.apply("deploy.yaml", &scaled);
    assert!(
        wait_for(|| c.state().pods.iter().any(|p| p.name == "server-2" && p.phase == "Ready"), CONVERGE),
        "server-2 did not start\n{}",
        c.ambit(&["status"])
    );
    assert!(wait_for(|| enrolled(&c, "demo/server-2"), CONVERGE), "server-2 is not captured");
    let to = c.pod("demo/server-2");
    assert!(wait_for(|| connect(&c, "demo/client", "demo/server-2").get("reply").is_some(), CONVERGE));
    assert_mtls(&c, "demo/client", "demo/server-2", CLIENT, &format!("the new replica on {}", to.node));
    c.apply("deploy.yaml", &scaled.replace("replicas: 3", "replicas: 2"));
    assert!(wait_for(|| c.state().pods.iter().all(|p| p.name != "server-2"), CONVERGE), "server-2 stays");
    assert!(!ambit_cluster::ip::netns_exists(&to.netns), "server-2's namespace stays");

    // Deleting a pod removes it from both proxies (and its namespace from the host).
    let other = c.pod("demo/other");
    let other_yaml = CLUSTER
        .split("\n---\n")
        .find(|d| d.contains("name: other, namespace: demo, labels"))
        .unwrap_or_default();
    c.delete("other.yaml", other_yaml);
    for node in ["node1", "node2"] {
        assert!(
            wait_for(|| !c.proxy_has(node, "demo/other"), CONVERGE),
            "{node}'s proxy still has demo/other"
        );
        assert!(
            c.proxy_has(node, "demo/client") && c.proxy_has(node, "demo/server-1"),
            "{node} lost other pods"
        );
    }
    assert!(!ambit_cluster::ip::netns_exists(&other.netns), "demo/other's namespace stays");

    // Bad live input: nothing of it is applied, the message names the file and line.
    let desired_before = desired_files(&c);
    let bad = c.file("bad.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: [oops\n");
    let r = c.ambit(&["apply", "-f", bad.to_str().unwrap_or_default()]);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stderr.contains(&format!("{}:", bad.display())) && r.stderr.contains("not valid YAML"), "{r}");
    let orphan = c.file(
        "orphan.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: demo}\nspec: {ports: [{port: 1}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: nowhere}\nspec:\n  containers: [{name: c, command: [sleep, infinity]}]\n",
    );
    let r = c.ambit(&["apply", "-f", orphan.to_str().unwrap_or_default()]);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.stderr.contains(&format!(
            "{}:6: Pod nowhere/p is in namespace \"nowhere\", which no Namespace object defines",
            orphan.display()
        )),
        "{r}"
    );
    let unknown = c.file("cron.yaml", "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: x}\n");
    let r = c.ambit(&["apply", "-f", unknown.to_str().unwrap_or_default()]);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.stderr.contains(&format!(
            "{}:1: kind CronJob (batch/v1) is not one `ambit up` runs",
            unknown.display()
        )),
        "{r}"
    );
    assert_eq!(desired_files(&c), desired_before, "a refused apply changed the desired folder");
    assert!(c.state().errors.is_empty(), "{:?}", c.state().errors);

    // `ambit down`: nothing is left — no namespace, link, process, cgroup or file.
    let cgroup_root = c.state().cgroup_root;
    let pids: Vec<u32> = c.state().processes.iter().filter_map(|p| p.pid).chain([c.state().owner]).collect();
    let down = c.down();
    assert!(down.stdout.contains("stopped the cluster's owner"), "{down}");
    assert_nothing_left(&c, &cgroup_root, &pids, &host_links);
    let again = c.ambit(&["down"]);
    assert_eq!(again.code, Some(0), "{again}");
    assert!(again.stdout.contains("nothing was up"), "{again}");
    eprintln!("ambit up (2 nodes, 6 pods) ready in {took_up:.1?}");
}

/// What `ambit control` shows: the certificates it signed (none refused), both node proxies
/// connected with what they acked, the translated workloads, the xDS metrics.
fn control_plane_checks(c: &LocalCluster) {
    let (status, metrics) = c.control_get("/metrics");
    assert_eq!(status, 200);
    let sum = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let signed = sum("ambit_ca_certificates_signed_total");
    assert!(
        signed >= 4.0,
        "the control plane signed {signed} certificates (want one per enrolled pod):\n{metrics}"
    );
    let refused = sum("ambit_ca_requests_refused_total{reason=\"impersonation\"}");
    assert_eq!(refused, 0.0, "impersonation refused:\n{metrics}");
    assert!(sum("pilot_xds_pushes{") >= 4.0, "pilot_xds_pushes:\n{metrics}");
    assert!(metrics.contains("pilot_xds{"), "no pilot_xds gauge:\n{metrics}");
    let (status, body) = c.control_get("/debug/connections");
    assert_eq!(status, 200, "{body}");
    let conns: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(conns["connected"], 2, "{body}");
    let mut nodes: Vec<&str> =
        conns["streams"].as_array().into_iter().flatten().filter_map(|s| s["node_name"].as_str()).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, ["node1", "node2"], "{body}");
    for stream in conns["streams"].as_array().into_iter().flatten() {
        for t in stream["types"].as_array().into_iter().flatten() {
            assert!(!t["acked_nonces"].as_array().is_none_or(Vec::is_empty), "nothing acked on {t}");
        }
    }
    let client_ip = c.pod("demo/client").ip.map(|i| i.to_string()).unwrap_or_default();
    let (status, body) = c.control_get("/debug/config_dump?type=address&name=Kubernetes//Pod/demo/client");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&client_ip) && body.contains("HBONE"), "{body}");
    assert_eq!(c.control_get("/debug/config_dump?type=routes").0, 400);
}

/// Links of the host namespace whose names any cluster of ours could have made.
fn host_link_names() -> Vec<String> {
    let out = std::process::Command::new("ip").args(["-o", "link", "show"]).output().expect("ip link");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1).map(|n| n.split('@').next().unwrap_or(n).to_owned()))
        .filter(|n| n.starts_with("ambc") || n.starts_with("veth") || n.starts_with("cni") || n == "fabric")
        .collect();
    names.sort();
    names
}

/// Bad input is refused before anything is created, with the file and line.
#[test]
fn bad_input_is_refused_before_anything_is_built() {
    if !require_root() {
        return;
    }
    let c = LocalCluster::new();
    let cases: [(&str, &str, String); 3] = [
        (
            "broken.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: [oops\n",
            "not valid YAML".to_owned(),
        ),
        (
            "cron.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: batch/v1\nkind: CronJob\nmetadata: {name: x}\n",
            ":5: kind CronJob (batch/v1) is not one `ambit up` runs".to_owned(),
        ),
        (
            "orphan.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: nowhere}\nspec:\n  containers: [{name: c, command: [sleep, infinity]}]\n",
            ":1: Pod nowhere/p is in namespace \"nowhere\", which no Namespace object defines".to_owned(),
        ),
    ];
    for (name, text, want) in &cases {
        let dir = c.scratch.path().join(name.replace(".yaml", ""));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join(name), text).expect("write");
        let r = c.ambit(&["up", "--config", dir.to_str().unwrap_or_default()]);
        assert_eq!(r.code, Some(1), "{name}: {r}");
        assert!(
            r.stderr.contains(&format!("{}", dir.join(name).display())) && r.stderr.contains(want.as_str()),
            "{name}: want {want:?}\n{r}"
        );
        assert!(r.stderr.contains("nothing was applied"), "{r}");
        assert!(!c.run_dir.exists(), "{name}: the run dir was created");
        assert_eq!(
            ambit_cluster::ip::netns_with_prefix(&format!("{}-", c.tag)),
            Vec::<String>::new(),
            "{name}"
        );
    }
    // A missing CNI plugin: the error names it and the package.
    let empty = c.scratch.path().join("no-plugins");
    std::fs::create_dir_all(&empty).expect("dir");
    let r = c.ambit(&["up", "--cni-plugins-dir", empty.to_str().unwrap_or_default()]);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(
        r.stderr.contains(&format!("CNI plugin \"loopback\" not found in {}", empty.display()))
            && r.stderr.contains("apt-get install containernetworking-plugins"),
        "{r}"
    );
    assert!(!c.run_dir.exists());
    // Nothing up: `ambit down` says so and succeeds; `ambit status` fails naming the file.
    let r = c.ambit(&["down"]);
    assert_eq!(r.code, Some(0), "{r}");
    assert!(r.stdout.contains("nothing was up"), "{r}");
    let r = c.ambit(&["status"]);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stderr.contains("no cluster is up"), "{r}");
    let r = c.ambit(&["restart", "control"]);
    assert_eq!(r.code, Some(1), "{r}");
    assert!(r.stderr.contains("no cluster is up"), "{r}");
}

/// A killed `ambit up` (its owner SIGKILLed, everything it ran left behind): `ambit up` refuses
/// to start over it, `ambit status` says the owner is gone, and `ambit down` removes all of it.
#[test]
fn down_cleans_up_after_a_killed_owner() {
    if !require_root() {
        return;
    }
    let mut c = LocalCluster::new();
    let links = host_link_names();
    let config = c.file(
        "config/pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: idle}\nspec:\n  containers: [{name: idle, command: [sleep, infinity]}]\n",
    );
    c.up(1, config.parent().unwrap_or(&config));
    // A crashed component is restarted, and the restart is shown.
    let agent =
        c.state().processes.iter().find(|p| p.name == "agent/node1").and_then(|p| p.pid).expect("agent pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(agent).unwrap_or(i32::MAX)),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the agent");
    let restarted = wait_for(
        || {
            c.state()
                .processes
                .iter()
                .any(|p| p.name == "agent/node1" && p.running && p.restarts == 1 && p.pid != Some(agent))
        },
        Duration::from_secs(10),
    );
    assert!(restarted, "the agent was not restarted: {:?}", c.state().processes);
    let shown = c.ambit(&["status"]);
    assert!(
        shown.stdout.contains("agent/node1 exited (signal 9 (SIGKILL))")
            && shown.stdout.contains("agent/node1 restarted (restart #1)"),
        "{shown}"
    );
    let state = c.state();
    let pids: Vec<u32> = state.processes.iter().filter_map(|p| p.pid).chain([state.owner]).collect();
    assert_eq!(pids.len(), 5, "owner, control, agent, proxy, one container: {:?}", state.processes);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(state.owner).unwrap_or(i32::MAX)),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the owner");
    assert!(wait_for(|| !ambit_cluster::state::pid_alive(state.owner), Duration::from_secs(5)));
    let again = c.ambit(&["up"]);
    assert_eq!(again.code, Some(1), "{again}");
    // The hint names this cluster as it must be typed.
    assert_eq!(
        again.stderr,
        format!(
            "ambit up: {} holds a cluster whose owner is gone (a crash or a killed `ambit up`); remove what is left with `ambit down --run-dir {} --tag {}`\n",
            c.run_dir.display(),
            c.run_dir.display(),
            c.tag
        ),
        "{again}"
    );
    let status = c.ambit(&["status", "-o", "json"]);
    assert_eq!(status.code, Some(1), "{status}");
    assert!(status.stdout.contains("owner gone"), "{status}");
    let down = c.down();
    assert!(down.stdout.contains("network namespaces"), "{down}");
    assert_nothing_left(&c, &state.cgroup_root, &pids, &links);
}
