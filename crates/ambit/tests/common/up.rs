//! A cluster built by `ambit up` itself (the binary under test), in a run directory and with a
//! namespace tag of the test's own (`ambc<pid><n>`, which the CI's leak check knows), driven as
//! a user drives it: `ambit apply|delete|restart|stop|start|status|down`, and
//! `ambit app client` run in a pod's namespace. Dropping it runs `ambit down`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ambit_cluster::probe;
use ambit_cluster::state::{ClusterState, PodState};
use serde_json::Value;

use super::ambit_cni_path;

/// The `ambit` binary under test.
pub fn ambit_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ambit")
}

/// A fresh tag: `ambc<pid><n>`.
pub fn cluster_tag() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("ambc{}{n}", std::process::id())
}

/// What a command printed, for assertions and failure messages.
pub struct Ran {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Ran {
    pub fn of(out: std::io::Result<Output>, what: &str) -> Ran {
        let out = out.unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        Ran {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}", self.code, self.stdout, self.stderr)
    }
}

/// A cluster's run directory and tag, and the commands on it.
pub struct LocalCluster {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The namespace tag.
    pub tag: String,
    /// The test's scratch directory (objects to apply, …).
    pub scratch: tempfile::TempDir,
    /// The context file every command of this cluster uses (`AMBIT_UP_CONTEXT`): the test's own,
    /// never the host's.
    pub context: PathBuf,
    up: bool,
}

impl LocalCluster {
    /// A run directory and tag, nothing built yet.
    pub fn new() -> LocalCluster {
        // ambit-cni next to ambit, where `ambit up` finds it.
        ambit_cni_path();
        let scratch = tempfile::tempdir().expect("tempdir");
        let context = scratch.path().join("context");
        LocalCluster { run_dir: scratch.path().join("run"), tag: cluster_tag(), scratch, context, up: false }
    }

    /// `ambit <args…>` on this cluster (its run directory and tag).
    pub fn ambit(&self, args: &[&str]) -> Ran {
        let out = Command::new(ambit_bin())
            .args(args)
            .env("AMBIT_UP_RUN_DIR", &self.run_dir)
            .env("AMBIT_UP_TAG", &self.tag)
            .env("AMBIT_UP_CONTEXT", &self.context)
            .output();
        Ran::of(out, &format!("ambit {}", args.join(" ")))
    }

    /// `ambit <args…>` as a user types it: no run directory or tag in the environment (only the
    /// test's context file), `stdin` as its standard input.
    pub fn typed(&self, args: &[&str], stdin: Option<&str>) -> Ran {
        use std::io::Write;
        let mut cmd = Command::new(ambit_bin());
        cmd.args(args)
            .env_remove("AMBIT_UP_RUN_DIR")
            .env_remove("AMBIT_UP_TAG")
            .env("AMBIT_UP_CONTEXT", &self.context)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let what = format!("ambit {}", args.join(" "));
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        if let Some(mut input) = child.stdin.take() {
            input.write_all(stdin.unwrap_or_default().as_bytes()).expect("stdin");
        }
        Ran::of(child.wait_with_output(), &what)
    }

    /// `ambit up <args…>` as a user types it (see [`LocalCluster::typed`]); `ambit down` runs
    /// when the test ends.
    pub fn up_typed(&mut self, args: &[&str]) -> Ran {
        self.up = true;
        let mut all = vec!["up"];
        all.extend_from_slice(args);
        self.typed(&all, None)
    }

    /// `ambit up --nodes N --config DIR`, which must succeed.
    pub fn up(&mut self, nodes: u16, config: &Path) -> Ran {
        self.up_with(nodes, config, &[])
    }

    /// `ambit up` of `config` on `nodes` nodes with `extra` flags, which must succeed.
    pub fn up_with(&mut self, nodes: u16, config: &Path, extra: &[&str]) -> Ran {
        self.up = true;
        let nodes = nodes.to_string();
        let mut args = vec!["up", "--nodes", &nodes, "--config", config.to_str().unwrap_or_default()];
        args.extend_from_slice(extra);
        let r = self.ambit(&args);
        assert_eq!(r.code, Some(0), "ambit up failed:\n{r}\n{}", self.logs());
        r
    }

    /// `ambit up --demo` (its outcome is the caller's to check).
    pub fn up_demo(&mut self) -> Ran {
        self.up_demo_with(&[])
    }

    /// `ambit up --demo` with `extra` flags (its outcome is the caller's to check).
    pub fn up_demo_with(&mut self, extra: &[&str]) -> Ran {
        self.up = true;
        let mut args = vec!["up", "--demo"];
        args.extend_from_slice(extra);
        self.ambit(&args)
    }

    /// Writes `text` to the scratch file `name` and returns its path.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.scratch.path().join(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("dir");
        }
        std::fs::write(&path, text).expect("write");
        path
    }

    /// The folder `ambit up --config` takes, holding `yaml` as its one file.
    pub fn config(&self, yaml: &str) -> PathBuf {
        let file = self.file("config/cluster.yaml", yaml);
        file.parent().map(Path::to_path_buf).unwrap_or(file)
    }

    /// `ambit apply -f` (or `delete`) of `text`, which must succeed.
    pub fn apply(&self, name: &str, text: &str) {
        let f = self.file(name, text);
        let r = self.ambit(&["apply", "-f", f.to_str().unwrap_or_default()]);
        assert_eq!(r.code, Some(0), "ambit apply -f {name}:\n{r}");
    }

    /// `ambit delete -f` of `text`, which must succeed.
    pub fn delete(&self, name: &str, text: &str) {
        let f = self.file(name, text);
        let r = self.ambit(&["delete", "-f", f.to_str().unwrap_or_default()]);
        assert_eq!(r.code, Some(0), "ambit delete -f {name}:\n{r}");
    }

    /// The cluster's record.
    pub fn state(&self) -> ClusterState {
        ClusterState::load(&self.run_dir).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `ambit status -o json`, parsed.
    pub fn status(&self) -> Value {
        let r = self.ambit(&["status", "-o", "json"]);
        assert_eq!(r.code, Some(0), "ambit status:\n{r}");
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("status is not JSON ({e}):\n{r}"))
    }

    /// Pod `namespace/name` of the record.
    pub fn pod(&self, name: &str) -> PodState {
        self.state()
            .pods
            .into_iter()
            .find(|p| format!("{}/{}", p.namespace, p.name) == name)
            .unwrap_or_else(|| panic!("no pod {name} in the record"))
    }

    /// Pod `name`'s `ip:port`.
    pub fn addr(&self, name: &str, port: u16) -> std::net::SocketAddr {
        let ip = self.pod(name).ip.unwrap_or_else(|| panic!("{name} has no IP"));
        std::net::SocketAddr::new(ip.into(), port)
    }

    /// `ambit app client ADDR --count N` in pod `from`'s namespace: one JSON line per connection.
    pub fn client(&self, from: &str, addr: &str, count: u32) -> Vec<Value> {
        let netns = self.pod(from).netns;
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &netns,
                ambit_bin(),
                "app",
                "client",
                addr,
                "--count",
                &count.to_string(),
            ])
            .output();
        let r = Ran::of(out, "ambit app client");
        let lines: Vec<Value> = r.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        assert_eq!(lines.len(), count as usize, "the client reported {} lines:\n{r}", lines.len());
        lines
    }

    /// The destination proxies' connection counters now.
    pub fn counters(&self) -> BTreeMap<String, f64> {
        probe::destination_counters(&self.state())
    }

    /// Node proxy `node`'s `/metrics`.
    pub fn proxy_metrics(&self, node: &str) -> String {
        let s = self.state();
        let netns = format!("{}-{node}", self.tag);
        match probe::http_get(&netns, s.proxy(node).stats, "/metrics") {
            Ok((200, body)) => body,
            other => panic!("proxy {node} /metrics: {other:?}"),
        }
    }

    /// A GET on `ambit control`'s monitoring port.
    pub fn control_get(&self, path: &str) -> (u16, String) {
        let netns = format!("{}-control", self.tag);
        probe::http_get(&netns, ambit_cluster::up::CONTROL_MONITORING, path)
            .unwrap_or_else(|e| panic!("GET {path} on ambit control: {e}"))
    }

    /// Node proxy `node`'s `/config_dump`, parsed (`Null` when it does not answer).
    pub fn proxy_dump(&self, node: &str) -> Value {
        let netns = format!("{}-{node}", self.tag);
        match probe::http_get(&netns, self.state().proxy(node).admin, "/config_dump") {
            Ok((200, body)) => serde_json::from_str(&body).unwrap_or_default(),
            _ => Value::Null,
        }
    }

    /// Whether node proxy `node` holds the workload of pod `namespace/name`.
    pub fn proxy_has(&self, node: &str, pod: &str) -> bool {
        let uid = format!("Kubernetes//Pod/{pod}");
        self.proxy_dump(node)["workloads"].as_array().into_iter().flatten().any(|w| w["uid"] == uid.as_str())
    }

    /// The tail of every log of the cluster, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let dir = self.run_dir.join("logs");
        let Ok(entries) = std::fs::read_dir(&dir) else { return out };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out +=
                &format!("--- {} ---\n{}\n", f.display(), lines[lines.len().saturating_sub(30)..].join("\n"));
        }
        out
    }

    /// The test took the cluster down itself: nothing to do when it ends.
    pub fn down_done(&mut self) {
        self.up = false;
    }

    /// `ambit down`, which must succeed.
    pub fn down(&mut self) -> Ran {
        self.up = false;
        let r = self.ambit(&["down"]);
        assert_eq!(r.code, Some(0), "ambit down:\n{r}");
        r
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if self.up {
            let r = self.ambit(&["down"]);
            if r.code != Some(0) {
                eprintln!("ambit down after the test: {r}");
            }
        }
    }
}

/// What the destination proxies counted for a flow: (allowed connections with mTLS, denials,
/// the source principals seen).
#[derive(Debug, Default, PartialEq)]
pub struct Counted {
    /// Opened with `connection_security_policy="mutual_tls"`.
    pub mtls: f64,
    /// Opened without mTLS.
    pub plaintext: f64,
    /// Failed with `response_flags="DENY"`.
    pub denied: f64,
    /// Source principals.
    pub principals: Vec<String>,
}

/// What grew between two readings of [`LocalCluster::counters`].
pub fn counted(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Counted {
    let mut c = Counted::default();
    for (k, d) in probe::growth(before, after) {
        let p = probe::label(&k, "source_principal");
        if k.contains("istio_tcp_connections_failed_total{") && k.contains("response_flags=\"DENY\"") {
            c.denied += d;
        } else if k.contains("istio_tcp_connections_opened_total{") {
            if probe::label(&k, "connection_security_policy") == "mutual_tls" {
                c.mtls += d;
            } else {
                c.plaintext += d;
            }
        } else {
            continue;
        }
        if !p.is_empty() && !c.principals.contains(&p) {
            c.principals.push(p);
        }
    }
    c
}

/// Waits up to `timeout` for the counters to have grown as `done` wants; returns what grew.
pub fn wait_counted(
    c: &LocalCluster,
    before: &BTreeMap<String, f64>,
    timeout: Duration,
    done: impl Fn(&Counted) -> bool,
) -> Counted {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let got = counted(before, &c.counters());
        if done(&got) || std::time::Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One connection from `from` to `to` (a pod name or `ip:port`): the client's line.
pub fn connect(c: &LocalCluster, from: &str, to: &str) -> Value {
    let addr = if to.contains(':') { to.to_owned() } else { c.addr(to, 8080).to_string() };
    c.client(from, &addr, 1).remove(0)
}

/// `from` → `to` is allowed over mTLS: the server answered, saw the client's own address, and the
/// destination proxy counted one mTLS connection from `identity`.
pub fn assert_mtls(c: &LocalCluster, from: &str, to: &str, identity: &str, what: &str) {
    let before = c.counters();
    let line = connect(c, from, to);
    assert!(line.get("reply").is_some(), "{what}: {from} → {to} got no reply: {line}\n{}", c.logs());
    let src = c.pod(from).ip.map(|i| i.to_string()).unwrap_or_default();
    let peer = line["reply"]["peer"].as_str().unwrap_or_default();
    assert!(peer.starts_with(&format!("{src}:")), "{what}: the server saw {peer}, not the client {src}");
    let got = wait_counted(c, &before, Duration::from_secs(3), |g| g.mtls >= 1.0);
    assert_eq!(got.mtls, 1.0, "{what}: {from} → {to} not counted as one mTLS connection: {got:?}");
    assert_eq!(got.principals, [identity], "{what}: the destination saw {got:?}");
}

/// `from` → `to` is denied: no reply, closed, and one denial counted by the destination proxy.
pub fn try_denied(c: &LocalCluster, from: &str, to: &str) -> Result<Value, String> {
    let before = c.counters();
    let t0 = Instant::now();
    let line = connect(c, from, to);
    if line.get("reply").is_some() {
        return Err(format!("allowed: {line}"));
    }
    let took = t0.elapsed();
    let got = wait_counted(c, &before, Duration::from_secs(2), |g| g.denied >= 1.0);
    if got.denied != 1.0 {
        return Err(format!("no reply ({line}) but the destination counted {got:?}"));
    }
    if took > Duration::from_secs(2) {
        return Err(format!("denied, but the close took {took:?}"));
    }
    Ok(line)
}

/// `from` → `to` is allowed in plaintext: the server answered; a destination in the mesh counted
/// one plaintext connection from an unknown peer, one out of it nothing.
pub fn assert_plaintext(c: &LocalCluster, from: &str, to: &str, what: &str) {
    let before = c.counters();
    let line = connect(c, from, to);
    assert!(line.get("reply").is_some(), "{what}: {from} → {to} got no reply: {line}");
    let in_mesh = enrolled(c, to);
    let got = wait_counted(c, &before, Duration::from_millis(if in_mesh { 3000 } else { 300 }), |g| {
        g.plaintext >= 1.0
    });
    let want = if in_mesh {
        Counted { plaintext: 1.0, principals: vec!["unknown".into()], ..Counted::default() }
    } else {
        Counted::default()
    };
    assert_eq!(got, want, "{what}: {from} → {to} (destination in the mesh: {in_mesh}) counted {got:?}");
}

pub fn pod_status(c: &LocalCluster, name: &str) -> Value {
    c.status()["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pod"] == name).cloned())
        .unwrap_or_else(|| panic!("no pod {name} in ambit status"))
}

pub fn enrolled(c: &LocalCluster, name: &str) -> bool {
    let p = pod_status(c, name);
    p["redirection"] == "enabled" && p["proxyListening"] == true
}

/// The desired folder's files: (name, content), sorted.
pub fn desired_files(c: &LocalCluster) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(c.run_dir.join("desired"))
        .expect("desired")
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

/// One echo connection to an `ambit app echo` server: its line, then our byte echoed.
pub fn app_echo(dst: std::net::SocketAddr) -> std::io::Result<()> {
    use std::io::{BufRead, BufReader, Write};
    let s = std::net::TcpStream::connect_timeout(&dst, super::CONNECT_TIMEOUT)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    if !line.contains("\"server\"") {
        return Err(std::io::Error::other(format!("no server line: {line:?}")));
    }
    (&s).write_all(b"x\n")?;
    line.clear();
    r.read_line(&mut line)?;
    if line == "x\n" { Ok(()) } else { Err(std::io::Error::other(format!("echo returned {line:?}"))) }
}

/// A pod's nftables ruleset (the capture), without its counters.
pub fn ruleset(c: &LocalCluster, pod: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &c.pod(pod).netns, "nft", "-s", "list", "ruleset"])
        .output()
        .expect("nft");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The identities of the pods the `ambit up` suites (up_e2e, up_containers) name.
pub const CLIENT: &str = "spiffe://cluster.local/ns/demo/sa/client";
pub const OTHER: &str = "spiffe://cluster.local/ns/demo/sa/other";
pub const PLAIN: &str = "spiffe://cluster.local/ns/plain/sa/default";

/// Denies `demo/client` at the pods labelled `app: server`.
pub const DENY_CLIENT: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-client, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  action: DENY
  rules:
  - from:
    - source: {principals: ["cluster.local/ns/demo/sa/client"]}
"#;
