//! The CNI side of a container runtime, as libcni runs it for containerd and CRI-O.
//!
//! - The node's network is the first file of its CNI configuration directory in lexical order
//!   (`*.conflist`, `*.conf`, `*.json`), read at every pod operation, so a plugin an agent
//!   chains into it (as `ambit agent` and istio-cni do) is used from the next pod on.
//! - ADD runs the loopback plugin (its own one-plugin list, as the runtimes do), then each
//!   plugin of the list in order with the previous plugin's result as `prevResult`; the final
//!   result is cached in a file per sandbox. CHECK and DEL give every plugin that cached result;
//!   DEL runs the list in reverse order, then loopback, and removes the cache.
//! - Plugins are found on `CNI_PATH` and run inside the node's network namespace with kubelet's
//!   `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_INFRA_CONTAINER_ID`,
//!   `K8S_POD_UID`), each bounded in time.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::ip;

/// The directories distributions install the reference plugins in, searched in this order.
pub const PLUGIN_DIRS: &[&str] = &["/opt/cni/bin", "/usr/lib/cni", "/usr/libexec/cni"];
/// The reference plugins a node's network list uses.
pub const REFERENCE_PLUGINS: &[&str] = &["loopback", "bridge", "host-local"];
/// The Debian package that ships them.
pub const PLUGINS_PACKAGE: &str = "containernetworking-plugins";
/// The CNI version of the lists written here (the newest the Debian 12 plugins support).
pub const CNI_VERSION: &str = "1.0.0";
/// How long one plugin may run before it is killed and the operation fails.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest configuration file read (a network list is a few KiB).
const MAX_CONF_BYTES: u64 = 1024 * 1024;
/// Largest plugin output kept (a result is a few KiB).
const MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// What went wrong running a network.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// A plugin is on no directory of `CNI_PATH`.
    #[error("CNI plugin {plugin:?} not found in {searched}{hint}")]
    PluginMissing {
        /// The plugin's `type`.
        plugin: String,
        /// The directories searched, `:`-separated.
        searched: String,
        /// What to install, for a reference plugin.
        hint: String,
    },
    /// The configuration directory holds no network.
    #[error("no CNI network configuration in {0} (*.conflist, *.conf or *.json)")]
    NoNetwork(PathBuf),
    /// A configuration file is unreadable or not a network.
    #[error("CNI configuration {path}: {problem}")]
    BadConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A plugin failed (non-zero exit, an error object, or output that is not JSON).
    #[error("{0}")]
    Plugin(Box<PluginFailure>),
    /// A plugin ran longer than [`PLUGIN_TIMEOUT`] and was killed.
    #[error("CNI {command} of {pod}: plugin {plugin} did not finish within {timeout:?}; killed")]
    Timeout {
        /// `ADD`, `CHECK` or `DEL`.
        command: &'static str,
        /// The pod.
        pod: String,
        /// The plugin's `type`.
        plugin: String,
        /// The bound.
        timeout: Duration,
    },
    /// A plugin could not be started or waited for.
    #[error("CNI {command} of {pod}: cannot run plugin {plugin}: {source}")]
    Exec {
        /// `ADD`, `CHECK` or `DEL`.
        command: &'static str,
        /// The pod.
        pod: String,
        /// The plugin's `type`.
        plugin: String,
        /// Why.
        source: std::io::Error,
    },
    /// CHECK of a sandbox that has no cached ADD result.
    #[error("CNI CHECK of {0}: no cached ADD result")]
    NotAdded(String),
    /// The result cache could not be written.
    #[error("CNI result cache {path}: {source}")]
    Cache {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What a failed plugin reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginFailure {
    /// `ADD`, `CHECK` or `DEL`.
    pub command: &'static str,
    /// The pod, `namespace/name`.
    pub pod: String,
    /// The plugin's `type`.
    pub plugin: String,
    /// The error object's `code`.
    pub code: Option<u64>,
    /// Its `msg` (or what went wrong).
    pub msg: String,
    /// Its `details`.
    pub details: String,
    /// What the plugin wrote on stderr (trimmed).
    pub stderr: String,
}

impl std::fmt::Display for PluginFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.plugin.is_empty() {
            // Not a plugin's own report (a failure wrapped as one): the message says it all.
            return f.write_str(&self.msg);
        }
        write!(f, "CNI {} of {}: plugin {} failed", self.command, self.pod, self.plugin)?;
        if let Some(code) = self.code {
            write!(f, " (code {code})")?;
        }
        write!(f, ": {}", self.msg)?;
        if !self.details.is_empty() {
            write!(f, " — {}", self.details)?;
        }
        if !self.stderr.is_empty() {
            write!(f, " [stderr: {}]", self.stderr)?;
        }
        Ok(())
    }
}

/// A network list: what one configuration file describes.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkList {
    /// The file it was read from (empty for a list built in code).
    pub path: PathBuf,
    /// `cniVersion`.
    pub cni_version: String,
    /// `name`.
    pub name: String,
    /// The plugin configurations, in order; each has a string `type`.
    pub plugins: Vec<Value>,
}

impl NetworkList {
    /// Parses a `.conflist` (a list) or a `.conf`/`.json` file (one plugin, or a list).
    pub fn parse(path: &Path, text: &str) -> Result<NetworkList, CniError> {
        let bad = |problem: String| CniError::BadConfig { path: path.to_owned(), problem };
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Value::Object(obj) = &v else { return Err(bad("not a JSON object".into())) };
        let string = |key: &str| obj.get(key).and_then(Value::as_str).map(str::to_owned);
        let name = string("name").filter(|n| !n.is_empty()).ok_or_else(|| bad("no \"name\"".into()))?;
        let cni_version = string("cniVersion").unwrap_or_else(|| "0.2.0".into());
        let plugins = match obj.get("plugins") {
            Some(Value::Array(list)) => list.clone(),
            Some(_) => return Err(bad("\"plugins\" is not a list".into())),
            // A single-plugin file is its own plugin.
            None => vec![v.clone()],
        };
        if plugins.is_empty() {
            return Err(bad("\"plugins\" is empty".into()));
        }
        for (i, p) in plugins.iter().enumerate() {
            if p.get("type").and_then(Value::as_str).is_none_or(str::is_empty) {
                return Err(bad(format!("plugin {i} has no \"type\"")));
            }
        }
        Ok(NetworkList { path: path.to_owned(), cni_version, name, plugins })
    }

    /// The network of a configuration directory: its first file in lexical order with a CNI
    /// extension (libcni's choice). A first file that does not parse is an error, not skipped:
    /// the runtime would otherwise run pods on another network than the node's.
    pub fn load_dir(dir: &Path) -> Result<NetworkList, CniError> {
        let read_dir = std::fs::read_dir(dir)
            .map_err(|e| CniError::BadConfig { path: dir.to_owned(), problem: e.to_string() })?;
        let mut files: Vec<PathBuf> = read_dir
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                matches!(p.extension().and_then(|e| e.to_str()), Some("conflist" | "conf" | "json"))
                    && p.is_file()
            })
            .collect();
        files.sort();
        let path = files.into_iter().next().ok_or_else(|| CniError::NoNetwork(dir.to_owned()))?;
        let text = read_bounded(&path)?;
        NetworkList::parse(&path, &text)
    }

    /// The plugin types, in order.
    pub fn types(&self) -> Vec<&str> {
        self.plugins.iter().filter_map(|p| p.get("type").and_then(Value::as_str)).collect()
    }
}

fn read_bounded(path: &Path) -> Result<String, CniError> {
    let bad = |problem: String| CniError::BadConfig { path: path.to_owned(), problem };
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mut text = String::new();
    file.take(MAX_CONF_BYTES + 1).read_to_string(&mut text).map_err(|e| bad(e.to_string()))?;
    if text.len() as u64 > MAX_CONF_BYTES {
        return Err(bad(format!("larger than {MAX_CONF_BYTES} bytes")));
    }
    Ok(text)
}

/// The node network a cluster node starts with (before an agent chains its plugin in): the
/// reference `bridge` plugin on `bridge` with `host-local` addresses from `subnet` (gateway
/// `gateway`, a default route through it, state in `ipam_dir`), plus `portmap`-free defaults.
pub fn bridge_network(name: &str, bridge: &str, subnet: &str, gateway: &str, ipam_dir: &Path) -> Value {
    json!({
        "cniVersion": CNI_VERSION,
        "name": name,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                // Other nodes' pods and service VIPs are reached through the node.
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": ipam_dir,
            },
        }],
    })
}

/// A `CNI_PATH`: directories searched in order for plugin binaries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginPath(pub Vec<PathBuf>);

impl PluginPath {
    /// The first of [`PLUGIN_DIRS`] that holds every reference plugin, then `extra` (where the
    /// agent installs `ambit-cni`). Without the reference plugins the error names the package.
    pub fn with_reference_plugins(extra: &[PathBuf]) -> Result<PluginPath, CniError> {
        let dirs: Vec<PathBuf> = PLUGIN_DIRS.iter().map(PathBuf::from).collect();
        PluginPath::with_reference_plugins_in(&dirs, extra)
    }

    /// Like [`PluginPath::with_reference_plugins`], searching `dirs` instead of [`PLUGIN_DIRS`]
    /// (a runtime's configured plugin directories).
    pub fn with_reference_plugins_in(dirs: &[PathBuf], extra: &[PathBuf]) -> Result<PluginPath, CniError> {
        let found = dirs.iter().find(|d| REFERENCE_PLUGINS.iter().all(|p| is_executable(&d.join(p))));
        match found {
            Some(dir) => Ok(PluginPath(std::iter::once(dir.clone()).chain(extra.iter().cloned()).collect())),
            None => {
                let missing = REFERENCE_PLUGINS
                    .iter()
                    .find(|p| !dirs.iter().any(|d| is_executable(&d.join(p))))
                    .copied()
                    .unwrap_or(REFERENCE_PLUGINS[0]);
                Err(CniError::PluginMissing {
                    plugin: missing.to_owned(),
                    searched: PluginPath(dirs.to_vec()).to_string(),
                    hint: format!(
                        " (install the {PLUGINS_PACKAGE} package: apt-get install {PLUGINS_PACKAGE})"
                    ),
                })
            }
        }
    }

    /// The binary of plugin `plugin`.
    pub fn find(&self, plugin: &str) -> Result<PathBuf, CniError> {
        let valid = !plugin.is_empty() && !plugin.contains('/') && plugin != "." && plugin != "..";
        let found = valid.then(|| self.0.iter().map(|d| d.join(plugin)).find(|p| is_executable(p))).flatten();
        found.ok_or_else(|| CniError::PluginMissing {
            plugin: plugin.to_owned(),
            searched: self.to_string(),
            hint: if REFERENCE_PLUGINS.contains(&plugin) {
                format!(" (install the {PLUGINS_PACKAGE} package)")
            } else {
                String::new()
            },
        })
    }
}

impl std::fmt::Display for PluginPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|d| d.display().to_string()).collect();
        f.write_str(&parts.join(":"))
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The pod a CNI operation is for, as kubelet describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// The sandbox (infra) container id.
    pub container_id: String,
    /// `CNI_NETNS`: the pod namespace's bind mount.
    pub netns: PathBuf,
}

impl PodRef {
    fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            self.namespace, self.name, self.container_id, self.uid
        )
    }
}

/// One plugin run, for latency figures.
#[derive(Clone, Debug)]
pub struct PluginRun {
    /// `ADD`, `CHECK` or `DEL`.
    pub command: &'static str,
    /// The plugin's `type`.
    pub plugin: String,
    /// Wall time, exec to exit.
    pub took: Duration,
}

/// A node's CNI runtime.
#[derive(Clone, Debug)]
pub struct Runtime {
    /// The node's network namespace (`ip netns` name) the plugins run in; `None`: this
    /// process's own.
    pub node_netns: Option<String>,
    /// The node's CNI configuration directory.
    pub conf_dir: PathBuf,
    /// Where plugins are found.
    pub path: PluginPath,
    /// Where each sandbox's ADD result is cached (`<container id>.json`).
    pub cache_dir: PathBuf,
    /// Bound on each plugin run.
    pub timeout: Duration,
}

impl Runtime {
    /// ADD: loopback, then the node's network; the result is cached and returned with the
    /// plugin runs.
    pub fn add(&self, pod: &PodRef) -> Result<(Value, Vec<PluginRun>), CniError> {
        let mut runs = Vec::new();
        self.run_list(&loopback(), "ADD", pod, None, &mut runs)?;
        let list = NetworkList::load_dir(&self.conf_dir)?;
        let result = self.run_list(&list, "ADD", pod, None, &mut runs)?;
        self.cache(pod, &list, &result)?;
        Ok((result, runs))
    }

    /// CHECK with the cached result.
    pub fn check(&self, pod: &PodRef) -> Result<Vec<PluginRun>, CniError> {
        let (list, cached) = self.cached(pod).ok_or_else(|| CniError::NotAdded(pod.label()))?;
        let mut runs = Vec::new();
        self.run_list(&loopback(), "CHECK", pod, Some(json!({"cniVersion": CNI_VERSION})), &mut runs)?;
        self.run_list(&list, "CHECK", pod, Some(cached), &mut runs)?;
        Ok(runs)
    }

    /// DEL: the network in reverse order with the cached result (the network of the cache, or
    /// the directory's when nothing was cached), then loopback; the cache is removed. Like the
    /// runtimes, a DEL is safe to repeat.
    pub fn del(&self, pod: &PodRef) -> Result<Vec<PluginRun>, CniError> {
        let (list, cached) = match self.cached(pod) {
            Some((list, cached)) => (list, Some(cached)),
            None => (NetworkList::load_dir(&self.conf_dir)?, None),
        };
        let mut runs = Vec::new();
        self.run_list(&list, "DEL", pod, cached, &mut runs)?;
        self.run_list(&loopback(), "DEL", pod, None, &mut runs)?;
        let _ = std::fs::remove_file(self.cache_path(pod));
        Ok(runs)
    }

    /// The cached ADD result of `pod`, if any.
    pub fn result(&self, pod: &PodRef) -> Option<Value> {
        self.cached(pod).map(|(_, r)| r)
    }

    fn cache_path(&self, pod: &PodRef) -> PathBuf {
        self.cache_dir.join(format!("{}.json", pod.container_id))
    }

    fn cache(&self, pod: &PodRef, list: &NetworkList, result: &Value) -> Result<(), CniError> {
        let path = self.cache_path(pod);
        let err = |source| CniError::Cache { path: path.clone(), source };
        std::fs::create_dir_all(&self.cache_dir).map_err(err)?;
        let entry = json!({
            "cniVersion": list.cni_version, "name": list.name, "plugins": list.plugins, "result": result,
        });
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, entry.to_string()).map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)
    }

    fn cached(&self, pod: &PodRef) -> Option<(NetworkList, Value)> {
        let path = self.cache_path(pod);
        let text = read_bounded(&path).ok()?;
        let mut v: Value = serde_json::from_str(&text).ok()?;
        let result = v.get_mut("result").map(Value::take)?;
        let list = NetworkList::parse(&path, &v.to_string()).ok()?;
        Some((list, result))
    }

    fn run_list(
        &self,
        list: &NetworkList,
        command: &'static str,
        pod: &PodRef,
        cached: Option<Value>,
        runs: &mut Vec<PluginRun>,
    ) -> Result<Value, CniError> {
        let order: Vec<&Value> = if command == "DEL" {
            list.plugins.iter().rev().collect()
        } else {
            list.plugins.iter().collect()
        };
        let mut prev = cached.clone();
        for plugin in order {
            let mut conf = plugin.clone();
            conf["cniVersion"] = json!(list.cni_version);
            conf["name"] = json!(list.name);
            let given = if command == "ADD" { prev.clone() } else { cached.clone() };
            if let Some(p) = given.filter(|p| !p.is_null()) {
                conf["prevResult"] = p;
            }
            let (out, run) = self.exec(command, pod, &conf)?;
            runs.push(run);
            if command == "ADD" {
                prev = Some(out);
            }
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// Runs one plugin in the node namespace; `Value::Null` when it printed nothing.
    fn exec(
        &self,
        command: &'static str,
        pod: &PodRef,
        conf: &Value,
    ) -> Result<(Value, PluginRun), CniError> {
        let plugin = conf["type"].as_str().unwrap_or_default().to_owned();
        let binary = self.path.find(&plugin)?;
        let exec_err = |source| CniError::Exec { command, pod: pod.label(), plugin: plugin.clone(), source };
        let mut cmd = match &self.node_netns {
            Some(netns) => ip::exec_in(netns, &binary, &[]),
            None => std::process::Command::new(&binary),
        };
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()))
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &pod.container_id)
            .env("CNI_NETNS", &pod.netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_ARGS", pod.cni_args())
            .env("CNI_PATH", self.path.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(exec_err)?;
        // Output is drained before the input is written: a plugin that answers before reading
        // all of its stdin never blocks on a full pipe.
        let out_reader = drain(child.stdout.take());
        let err_reader = drain(child.stderr.take());
        let input = serde_json::to_vec(conf).unwrap_or_default();
        if let Some(mut pipe) = child.stdin.take() {
            // On a thread of its own, so a plugin that never reads its stdin still meets the
            // time bound; one that exits without reading it is judged by its exit status.
            std::thread::spawn(move || {
                let _ = pipe.write_all(&input);
            });
        }
        let status = loop {
            match child.try_wait().map_err(exec_err)? {
                Some(status) => break status,
                None if started.elapsed() > self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(CniError::Timeout {
                        command,
                        pod: pod.label(),
                        plugin,
                        timeout: self.timeout,
                    });
                }
                None => std::thread::sleep(Duration::from_millis(2)),
            }
        };
        let run = PluginRun { command, plugin: plugin.clone(), took: started.elapsed() };
        let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
        let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).trim().to_owned();
        let parsed: Option<Value> = serde_json::from_str(stdout.trim()).ok();
        let failure = |code, msg, details| {
            CniError::Plugin(Box::new(PluginFailure {
                command,
                pod: pod.label(),
                plugin: plugin.clone(),
                code,
                msg,
                details,
                stderr: stderr.clone(),
            }))
        };
        if status.success() {
            return match parsed {
                Some(v) => Ok((v, run)),
                None if stdout.trim().is_empty() => Ok((Value::Null, run)),
                None => Err(failure(None, "succeeded but its output is not JSON".into(), String::new())),
            };
        }
        let err = parsed.unwrap_or(Value::Null);
        Err(failure(
            err["code"].as_u64(),
            err["msg"].as_str().map_or_else(|| format!("{status}"), str::to_owned),
            err["details"].as_str().unwrap_or_default().to_owned(),
        ))
    }
}

/// The loopback network the runtimes run before the node's.
fn loopback() -> NetworkList {
    NetworkList {
        path: PathBuf::new(),
        cni_version: CNI_VERSION.into(),
        name: "cni-loopback".into(),
        plugins: vec![json!({"type": "loopback"})],
    }
}

/// The first IPv4 address of a CNI result (`ips[].address`, CIDR form).
pub fn result_ipv4(result: &Value) -> Option<std::net::Ipv4Addr> {
    result["ips"]
        .as_array()?
        .iter()
        .filter_map(|ip| ip["address"].as_str())
        .find_map(|a| a.split('/').next()?.parse().ok())
}

/// Reads a child's pipe to its end (at most [`MAX_OUTPUT_BYTES`]) on a thread of its own, so
/// a plugin that fills one pipe never blocks on it while we wait for the other.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.by_ref().take(MAX_OUTPUT_BYTES as u64).read_to_end(&mut buf);
            // Whatever is beyond the bound is read and dropped, so the plugin never blocks.
            let _ = std::io::copy(&mut p, &mut std::io::sink());
        }
        buf
    })
}

#[cfg(test)]
mod tests;
