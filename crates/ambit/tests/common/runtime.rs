//! A container runtime for the tests, on `ambit-cluster`'s (one implementation with `ambit up`):
//! pod sandboxes (a network namespace plus a "pause" process in a kubelet-style cgroup) and the
//! node's CNI network run plugin by plugin as libcni does (see `ambit_cluster::cni`). The network
//! list is this runtime's configuration directory: bridge + host-local, then `ambit-cni` when
//! asked for. Plugins run inside the *node* namespace, so the reference `bridge` plugin creates
//! its bridge and host veths there.
//!
//! `ambit-cni` is built on first use with the cargo that builds this test (`env!("CARGO")`),
//! the same profile and target directory, because cargo only builds binaries of the package
//! under test (`ambit`), not of other workspace members: see [`ambit_cni_path`].

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use ambit_cluster::cni::{self, CniError, PluginFailure, PluginPath, Runtime};
use serde_json::{Value, json};

use super::{Node, Pod};

/// A CNI failure as the tests inspect it: the plugin, its error code, message and details.
pub type CniFailure = PluginFailure;

/// A CNI runtime bound to one node.
pub struct CniRuntime {
    rt: Runtime,
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

/// A pod as the runtime knows it: Kubernetes identity plus its sandbox (removed on drop).
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
    inner: ambit_cluster::sandbox::Sandbox,
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
    /// A runtime for `node` whose network is bridge + host-local followed by `ambit-cni`
    /// configured with `ambit` (its keys: `cni_agent_run_dir`, `exclude_namespaces`, ...);
    /// `ambit: None` gives the same list without `ambit-cni` (benchmark baseline).
    pub fn new(node: &Node, ambit: Option<Value>) -> CniRuntime {
        let hex = format!("{:04x}", rand::random::<u16>());
        let dir = tempfile::tempdir().expect("tempdir for the CNI runtime");
        let third = rand::random::<u8>();
        let subnet = format!("172.20.{third}.0/24");
        let gateway = Ipv4Addr::new(172, 20, third, 1);
        let bridge = format!("cni{hex}");
        let mut list = cni::bridge_network(
            "ambit-e2e",
            &bridge,
            &subnet,
            &gateway.to_string(),
            &dir.path().join("ipam"),
        );
        if let Some(mut conf) = ambit {
            conf["type"] = json!("ambit-cni");
            if let Some(plugins) = list["plugins"].as_array_mut() {
                plugins.push(conf);
            }
        }
        let conf_dir = dir.path().join("net.d");
        std::fs::create_dir_all(&conf_dir).expect("CNI conf dir");
        std::fs::write(conf_dir.join("10-ambit-e2e.conflist"), list.to_string())
            .expect("write the network list");
        let cni_dir = ambit_cni_path().parent().map(Path::to_path_buf).unwrap_or_default();
        let path = PluginPath::with_reference_plugins(&[cni_dir]).unwrap_or_else(|e| panic!("{e}"));
        let rt = Runtime {
            node_netns: Some(node.netns.clone()),
            conf_dir,
            path,
            cache_dir: dir.path().join("cache"),
            timeout: cni::PLUGIN_TIMEOUT,
        };
        let tag = format!("amb{}-c{hex}", std::process::id());
        let cgroup_root = ambit_cluster::sandbox::cgroup2_mount()
            .unwrap_or_else(|e| panic!("{e}"))
            .join(format!("ambit-e2e-{}-{hex}", std::process::id()));
        CniRuntime { rt, bridge, subnet, gateway, dir, tag, cgroup_root, next: AtomicUsize::new(0) }
    }

    /// host-local's data directory for this runtime's network.
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir.path().join("ipam").join("ambit-e2e")
    }

    /// Creates a pod sandbox: a fresh netns and a pause process inside it whose cgroup path has
    /// kubelet's `pod<uid>` segment (so the agent can find the netns through /proc).
    pub fn sandbox(&self, namespace: &str, name: &str) -> Sandbox {
        self.sandbox_with_uid(namespace, name, &ambit_cluster::sandbox::random_uid())
    }

    /// Like [`CniRuntime::sandbox`] for a known pod UID (the runtime retrying a pod's sandbox).
    pub fn sandbox_with_uid(&self, namespace: &str, name: &str, uid: &str) -> Sandbox {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let netns = format!("{}-{n}", self.tag);
        let inner =
            ambit_cluster::sandbox::Sandbox::create(&netns, namespace, name, Some(uid), &self.cgroup_root)
                .unwrap_or_else(|e| panic!("sandbox of {namespace}/{name}: {e}"));
        Sandbox {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: inner.pod.uid.clone(),
            container_id: inner.pod.container_id.clone(),
            netns,
            result: None,
            timings: std::sync::Mutex::default(),
            inner,
        }
    }

    /// CNI ADD: the loopback list, then the primary list plugin by plugin. On success the final
    /// result is stored in the sandbox and returned.
    pub fn add(&self, sb: &mut Sandbox) -> Result<Value, Box<CniFailure>> {
        let (result, runs) = self.rt.add(&sb.inner.pod).map_err(failure)?;
        sb.record(&runs);
        sb.result = Some(result.clone());
        Ok(result)
    }

    /// CNI CHECK with the cached ADD result as every plugin's `prevResult`.
    pub fn check(&self, sb: &Sandbox) -> Result<(), Box<CniFailure>> {
        assert!(sb.result.is_some(), "CHECK of {} before a successful ADD", sb.name);
        let runs = self.rt.check(&sb.inner.pod).map_err(failure)?;
        sb.record(&runs);
        Ok(())
    }

    /// CNI DEL (reverse order, cached result as `prevResult` when there is one), then loopback.
    pub fn del(&self, sb: &Sandbox) -> Result<(), Box<CniFailure>> {
        let runs = self.rt.del(&sb.inner.pod).map_err(failure)?;
        sb.record(&runs);
        Ok(())
    }
}

/// A plugin's own failure as it reported it; any other error (a missing plugin, a timeout) as
/// a failure without a code.
fn failure(e: CniError) -> Box<CniFailure> {
    match e {
        CniError::Plugin(f) => f,
        other => Box::new(PluginFailure {
            command: "",
            pod: String::new(),
            plugin: String::new(),
            code: None,
            msg: other.to_string(),
            details: String::new(),
            stderr: String::new(),
        }),
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
        self.inner.pod.netns.clone()
    }

    /// The pause process's pid.
    pub fn pause_pid(&self) -> u32 {
        self.inner.pause_pid()
    }

    /// The pod's IPv4 address from the ADD result.
    pub fn ip4(&self) -> Ipv4Addr {
        let result = self.result.as_ref().unwrap_or_else(|| panic!("pod {} has no ADD result", self.name));
        cni::result_ipv4(result)
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

    fn record(&self, runs: &[cni::PluginRun]) {
        if let Ok(mut t) = self.timings.lock() {
            t.extend(runs.iter().map(|r| (r.command.to_owned(), r.plugin.clone(), r.took)));
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.inner.remove();
    }
}
