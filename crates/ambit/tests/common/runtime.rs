//! A fake container runtime: pod sandboxes (a network namespace plus a "pause" process in a
//! kubelet-style cgroup) and CNI network lists executed plugin by plugin exactly as libcni does.
//!
//! ADD runs each plugin with the previous plugin's result as `prevResult`; CHECK and DEL give
//! every plugin the list's final ADD result (libcni's cached result), DEL in reverse order. The
//! plugins run inside the *node* namespace (`ip netns exec <node> <plugin>`), so the reference
//! `bridge` plugin creates its bridge and host veths there. Loopback is its own one-plugin list,
//! as containerd and CRI-O run it.
//!
//! `ambit-cni` is built on first use with the cargo that builds this test (`env!("CARGO")`),
//! the same profile and target directory, because cargo only builds binaries of the package
//! under test (`ambit`), not of other workspace members: see [`ambit_cni_path`].

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::netns::NETNS_DIR;
use super::process::ChildGuard;
use super::{Node, Pod};

/// Where Debian's `containernetworking-plugins` installs the reference plugins.
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";
/// The CNI version of the network lists (the newest the Debian plugins 1.1 support).
pub const CNI_VERSION: &str = "1.0.0";

/// A CNI network list runner bound to one node.
pub struct CniRuntime {
    node_netns: String,
    /// The primary network list (bridge + host-local [+ ambit-cni]).
    list: Value,
    loopback: Value,
    cni_path: String,
    /// The bridge the primary plugin creates in the node namespace.
    pub bridge: String,
    /// The pod subnet (host-local range), e.g. `172.20.7.0/24`.
    pub subnet: String,
    /// The gateway (the bridge's address).
    pub gateway: Ipv4Addr,
    dir: tempfile::TempDir,
    tag: String,
    cgroup_root: PathBuf,
    next: AtomicUsize,
}

/// A pod as the runtime knows it: Kubernetes identity plus its sandbox.
pub struct Sandbox {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID (canonical 8-4-4-4-12 form).
    pub uid: String,
    /// The sandbox (infra) container id: 64 hex digits.
    pub container_id: String,
    /// `ip netns` name of the pod's network namespace.
    pub netns: String,
    /// The final ADD result of the primary list, once ADD succeeded.
    pub result: Option<Value>,
    /// Wall time of every plugin run for this sandbox: (command, plugin type, time), in order.
    pub timings: std::sync::Mutex<Vec<(String, String, std::time::Duration)>>,
    pause: Option<ChildGuard>,
    cgroup: PathBuf,
}

/// One plugin invocation that failed (boxed in results: it carries the plugin's output).
#[derive(Debug, Clone)]
pub struct CniFailure {
    /// Plugin type (`bridge`, `ambit-cni`, ...).
    pub plugin: String,
    /// CNI error code from the error JSON (`None` when stdout was not an error object).
    pub code: Option<u64>,
    /// `msg` of the error JSON (or a description of what went wrong).
    pub msg: String,
    /// `details` of the error JSON.
    pub details: String,
    /// Raw stdout.
    pub stdout: String,
    /// Raw stderr.
    pub stderr: String,
}

impl std::fmt::Display for CniFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed (code {:?}): {} [details: {}] [stderr: {}]",
            self.plugin,
            self.code,
            self.msg,
            self.details,
            self.stderr.trim()
        )
    }
}

/// The `ambit-cni` binary next to `ambit`, built once per test process with
/// `cargo build -p ambit-cni --bin ambit-cni` (same cargo, profile and target dir as this test).
pub fn ambit_cni_path() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let ambit = Path::new(env!("CARGO_BIN_EXE_ambit"));
        let profile_dir = ambit.parent().unwrap_or_else(|| panic!("{} has no parent", ambit.display()));
        let path = profile_dir.join("ambit-cni");
        let profile = profile_dir.file_name().and_then(|p| p.to_str()).unwrap_or("debug");
        let cargo_profile = if profile == "debug" { "dev" } else { profile };
        let target_dir = profile_dir.parent().unwrap_or(profile_dir);
        let out = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "ambit-cni", "--bin", "ambit-cni", "--profile", cargo_profile])
            .env("CARGO_TARGET_DIR", target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "cannot build ambit-cni (cargo build -p ambit-cni --profile {cargo_profile}): {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => panic!("cannot run cargo ({}) to build ambit-cni: {e}", env!("CARGO")),
        }
        assert!(path.is_file(), "cargo built ambit-cni but {} does not exist", path.display());
        path
    })
}

impl CniRuntime {
    /// A runtime for `node` whose primary list is bridge + host-local followed by `ambit-cni`
    /// configured with `ambit` (its keys: `cni_agent_run_dir`, `exclude_namespaces`, ...);
    /// `ambit: None` gives the same list without `ambit-cni` (benchmark baseline).
    pub fn new(node: &Node, ambit: Option<Value>) -> CniRuntime {
        let hex = format!("{:04x}", rand::random::<u16>());
        let dir = tempfile::tempdir().expect("tempdir for the CNI runtime");
        let third = rand::random::<u8>();
        let subnet = format!("172.20.{third}.0/24");
        let gateway = Ipv4Addr::new(172, 20, third, 1);
        let bridge = format!("cni{hex}");
        let mut plugins = vec![json!({
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet, "gateway": gateway.to_string()}]],
                // A default route through the node, for other nodes' pods and service VIPs.
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": dir.path().join("ipam"),
            },
        })];
        if let Some(mut conf) = ambit {
            conf["type"] = json!("ambit-cni");
            plugins.push(conf);
        }
        let list = json!({"cniVersion": CNI_VERSION, "name": "ambit-e2e", "plugins": plugins});
        let loopback =
            json!({"cniVersion": CNI_VERSION, "name": "cni-loopback", "plugins": [{"type": "loopback"}]});
        let cni_dir = ambit_cni_path().parent().map(Path::to_path_buf).unwrap_or_default();
        let cni_path = format!("{REFERENCE_PLUGINS}:{}", cni_dir.display());
        let tag = format!("amb{}-c{hex}", std::process::id());
        let cgroup_root = cgroup2_mount().join(format!("ambit-e2e-{}-{hex}", std::process::id()));
        CniRuntime {
            node_netns: node.netns.clone(),
            list,
            loopback,
            cni_path,
            bridge,
            subnet,
            gateway,
            dir,
            tag,
            cgroup_root,
            next: AtomicUsize::new(0),
        }
    }

    /// host-local's data directory for this runtime's network.
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir.path().join("ipam").join("ambit-e2e")
    }

    /// Creates a pod sandbox: a fresh netns and a pause process inside it whose cgroup path has
    /// kubelet's `pod<uid>` segment (so the agent can find the netns through /proc).
    pub fn sandbox(&self, namespace: &str, name: &str) -> Sandbox {
        self.sandbox_with_uid(namespace, name, &random_uid())
    }

    /// Like [`CniRuntime::sandbox`] for a known pod UID (the runtime retrying a pod's sandbox).
    pub fn sandbox_with_uid(&self, namespace: &str, name: &str, uid: &str) -> Sandbox {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let netns = format!("{}-{n}", self.tag);
        let out = Command::new("ip").args(["netns", "add", &netns]).output().expect("run ip netns add");
        assert!(out.status.success(), "ip netns add {netns}: {}", String::from_utf8_lossy(&out.stderr));
        let uid = uid.to_owned();
        let container_id: String = (0..4).map(|_| format!("{:016x}", rand::random::<u64>())).collect();
        let cgroup = self
            .cgroup_root
            .join(format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")))
            .join(format!("cri-containerd-{container_id}.scope"));
        let mut sandbox = Sandbox {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid,
            container_id,
            netns,
            result: None,
            timings: std::sync::Mutex::default(),
            pause: None,
            cgroup,
        };
        std::fs::create_dir_all(&sandbox.cgroup)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", sandbox.cgroup.display()));
        // Join the cgroup first, then enter the netns: the process is never seen half set up.
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"echo $$ > "$1/cgroup.procs" && exec ip netns exec "$2" sleep infinity"#)
            .arg("pause")
            .arg(&sandbox.cgroup)
            .arg(&sandbox.netns);
        sandbox.pause = Some(ChildGuard::spawn(&format!("pause {namespace}/{name}"), cmd));
        let pid = sandbox.pause_pid();
        let ready = super::wait_for(
            || {
                std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
                    != std::fs::read_link("/proc/self/ns/net").ok()
            },
            Duration::from_secs(5),
        );
        assert!(ready, "pause process of {namespace}/{name} never entered its netns");
        sandbox
    }

    /// CNI ADD: the loopback list, then the primary list plugin by plugin. On success the final
    /// result is stored in the sandbox and returned.
    pub fn add(&self, sb: &mut Sandbox) -> Result<Value, Box<CniFailure>> {
        self.run_list(&self.loopback, "ADD", sb, None)?;
        let result = self.run_list(&self.list, "ADD", sb, None)?;
        sb.result = Some(result.clone());
        Ok(result)
    }

    /// CNI CHECK with the cached ADD result as every plugin's `prevResult`.
    pub fn check(&self, sb: &Sandbox) -> Result<(), Box<CniFailure>> {
        let prev =
            sb.result.clone().unwrap_or_else(|| panic!("CHECK of {} before a successful ADD", sb.name));
        self.run_list(&self.loopback, "CHECK", sb, Some(json!({"cniVersion": CNI_VERSION})))?;
        self.run_list(&self.list, "CHECK", sb, Some(prev)).map(|_| ())
    }

    /// CNI DEL (reverse order, cached result as `prevResult` when there is one), then loopback.
    pub fn del(&self, sb: &Sandbox) -> Result<(), Box<CniFailure>> {
        self.run_list(&self.list, "DEL", sb, sb.result.clone())?;
        self.run_list(&self.loopback, "DEL", sb, None).map(|_| ())
    }

    fn run_list(
        &self,
        list: &Value,
        command: &str,
        sb: &Sandbox,
        cached: Option<Value>,
    ) -> Result<Value, Box<CniFailure>> {
        let plugins = list["plugins"].as_array().cloned().unwrap_or_default();
        let order: Vec<Value> = if command == "DEL" { plugins.into_iter().rev().collect() } else { plugins };
        let mut prev = cached.clone();
        for mut conf in order {
            conf["cniVersion"] = list["cniVersion"].clone();
            conf["name"] = list["name"].clone();
            let prev_for_plugin = if command == "ADD" { prev.clone() } else { cached.clone() };
            if let Some(p) = prev_for_plugin {
                conf["prevResult"] = p;
            }
            let out = self.exec(command, sb, &conf)?;
            if command == "ADD" {
                prev = Some(out);
            }
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// Runs one plugin in the node namespace; `Value::Null` when it printed nothing.
    fn exec(&self, command: &str, sb: &Sandbox, conf: &Value) -> Result<Value, Box<CniFailure>> {
        let plugin = conf["type"].as_str().unwrap_or_default().to_owned();
        let binary = self
            .cni_path
            .split(':')
            .map(|d| Path::new(d).join(&plugin))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("plugin {plugin} not found in CNI_PATH {}", self.cni_path));
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            sb.namespace, sb.name, sb.container_id, sb.uid
        );
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.node_netns])
            .arg(&binary)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &sb.container_id)
            .env("CNI_NETNS", sb.netns_path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_ARGS", args)
            .env("CNI_PATH", &self.cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = std::time::Instant::now();
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot exec {plugin}: {e}"));
        let stdin = serde_json::to_vec(conf).unwrap_or_default();
        if let Some(mut pipe) = child.stdin.take() {
            let _ = pipe.write_all(&stdin);
        }
        let out = child.wait_with_output().unwrap_or_else(|e| panic!("cannot wait for {plugin}: {e}"));
        if let Ok(mut t) = sb.timings.lock() {
            t.push((command.to_owned(), plugin.clone(), started.elapsed()));
        }
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let parsed: Option<Value> = serde_json::from_str(stdout.trim()).ok();
        if out.status.success() {
            return match parsed {
                Some(v) => Ok(v),
                None if stdout.trim().is_empty() => Ok(Value::Null),
                None => Err(Box::new(CniFailure {
                    plugin,
                    code: None,
                    msg: format!("{command} succeeded but stdout is not JSON"),
                    details: String::new(),
                    stdout,
                    stderr,
                })),
            };
        }
        let err = parsed.unwrap_or(Value::Null);
        Err(Box::new(CniFailure {
            plugin,
            code: err["code"].as_u64(),
            msg: err["msg"].as_str().map_or_else(|| format!("exit {}", out.status), str::to_owned),
            details: err["details"].as_str().unwrap_or_default().to_owned(),
            stdout,
            stderr,
        }))
    }
}

impl Drop for CniRuntime {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.cgroup_root);
    }
}

impl Sandbox {
    /// `CNI_NETNS`: the bind mount `ip netns` made.
    pub fn netns_path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.netns)
    }

    /// The pause process's pid.
    pub fn pause_pid(&self) -> u32 {
        self.pause.as_ref().map_or(0, ChildGuard::pid)
    }

    /// The pod's IPv4 address from the ADD result.
    pub fn ip4(&self) -> Ipv4Addr {
        let result = self.result.as_ref().unwrap_or_else(|| panic!("pod {} has no ADD result", self.name));
        result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str())
            .filter_map(|a| a.split('/').next()?.parse().ok())
            .next()
            .unwrap_or_else(|| panic!("no IPv4 in the ADD result of {}: {result}", self.name))
    }

    /// A harness pod handle (exec, connect, echo server) for this sandbox's netns.
    pub fn pod(&self) -> Pod {
        Pod {
            name: self.name.clone(),
            netns: self.netns.clone(),
            ip4: self.ip4(),
            ip6: std::net::Ipv6Addr::UNSPECIFIED,
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.pause.take();
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.netns]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).output();
        let _ = std::fs::remove_dir(&self.cgroup);
        if let Some(parent) = self.cgroup.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// A random pod UID in Kubernetes' form.
fn random_uid() -> String {
    let v: u128 = rand::random();
    let h = format!("{v:032x}");
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` or, on hybrid hosts,
/// `/sys/fs/cgroup/unified`).
fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f.get(1).copied().unwrap_or_default()))
        })
        .next()
        .unwrap_or_else(|| panic!("no cgroup2 mount: the agent finds running pods through cgroup paths"))
}
