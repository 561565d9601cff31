//! The record of a cluster that is up: `<run dir>/cluster.json`, written atomically by the
//! process that owns the cluster and read by `ambit status` and `ambit down`. It names
//! everything the cluster made outside the run directory (namespaces by tag, cgroups), so
//! `ambit down` can remove it all even after the owner was killed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::topology::Network;

/// The record's file name in the run directory.
pub const STATE_FILE: &str = "cluster.json";
/// Largest record read (a cluster of 250 nodes and thousands of pods is well below).
const MAX_STATE_BYTES: u64 = 16 * 1024 * 1024;

/// A cluster's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Format version of this file.
    pub version: u32,
    /// The run directory.
    pub run_dir: PathBuf,
    /// The pid of the process that owns the cluster (the supervisor).
    pub owner: u32,
    /// The network.
    pub network: Network,
    /// The cgroup directory every sandbox of the cluster lives under.
    pub cgroup_root: PathBuf,
    /// The pods: `namespace/name` → node, netns, IP.
    pub pods: Vec<PodState>,
    /// What the cluster is doing (`building the network`, `starting node node1`, `ready`,
    /// `stopping`).
    pub phase: String,
    /// The supervised processes (components and containers).
    #[serde(default)]
    pub processes: Vec<crate::supervise::ProcessStatus>,
    /// What is wrong with the desired folder now (nothing of a bad version is applied).
    #[serde(default)]
    pub errors: Vec<String>,
    /// Recent events (restarts, pods created and deleted), oldest first.
    #[serde(default)]
    pub events: Vec<String>,
    /// Each node proxy's ports now (a replacement takes the other set while the old one drains).
    #[serde(default)]
    pub proxy_ports: std::collections::BTreeMap<String, ProxyPorts>,
}

/// A node proxy's admin, metrics and readiness ports (in its node's namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyPorts {
    /// `/config_dump`, `/debug/connections` (on 127.0.0.1).
    pub admin: u16,
    /// `/metrics`.
    pub stats: u16,
    /// `/healthz/ready`.
    pub ready: u16,
}

impl ProxyPorts {
    /// The ports of generation `g` of a node's proxy: two sets, alternating.
    pub fn of_generation(g: u32) -> ProxyPorts {
        if g.is_multiple_of(2) {
            ProxyPorts { admin: 15000, stats: 15020, ready: 15021 }
        } else {
            ProxyPorts { admin: 16000, stats: 16020, ready: 16021 }
        }
    }
}

impl ClusterState {
    /// The ports of node `node`'s proxy (generation 0's when not recorded).
    pub fn proxy(&self, node: &str) -> ProxyPorts {
        self.proxy_ports.get(node).copied().unwrap_or_else(|| ProxyPorts::of_generation(0))
    }
}

/// One pod of the record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodState {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Its node.
    pub node: String,
    /// Its sandbox's `ip netns` name.
    pub netns: String,
    /// Its sandbox container id (the CNI cache key).
    pub container_id: String,
    /// Its IPv4 address, once CNI ADD succeeded.
    pub ip: Option<std::net::Ipv4Addr>,
    /// Its service account.
    #[serde(default)]
    pub service_account: String,
    /// `Running` (created), `Ready` (its declared ports listen) or `Failed` (see `message`).
    #[serde(default)]
    pub phase: String,
    /// Why it failed.
    #[serde(default)]
    pub message: String,
    /// How long its CNI ADD took, in milliseconds.
    #[serde(default)]
    pub cni_add_ms: f64,
}

/// The record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// No cluster is recorded in that run directory.
    #[error("no cluster is up (no {0})")]
    Missing(PathBuf),
    /// The file is unreadable.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a record of this version.
    #[error("{path} is not a cluster record this ambit understands: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
}

/// This format's version.
pub const VERSION: u32 = 1;

impl ClusterState {
    /// The record's path in `run_dir`.
    pub fn path(run_dir: &Path) -> PathBuf {
        run_dir.join(STATE_FILE)
    }

    /// Reads the record of `run_dir`.
    pub fn load(run_dir: &Path) -> Result<ClusterState, StateError> {
        use std::io::Read;
        let path = ClusterState::path(run_dir);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StateError::Missing(path)),
            Err(source) => return Err(StateError::Io { path, source }),
        };
        let mut text = String::new();
        if let Err(source) = file.take(MAX_STATE_BYTES + 1).read_to_string(&mut text) {
            return Err(StateError::Io { path, source });
        }
        if text.len() as u64 > MAX_STATE_BYTES {
            return Err(StateError::Invalid {
                path,
                problem: format!("larger than {MAX_STATE_BYTES} bytes"),
            });
        }
        let state: ClusterState = serde_json::from_str(&text)
            .map_err(|e| StateError::Invalid { path: path.clone(), problem: e.to_string() })?;
        if state.version != VERSION {
            return Err(StateError::Invalid {
                path,
                problem: format!("version {} (want {VERSION})", state.version),
            });
        }
        Ok(state)
    }

    /// Writes the record (temporary file, then rename: a reader never sees half of it).
    pub fn save(&self) -> Result<(), StateError> {
        let path = ClusterState::path(&self.run_dir);
        let tmp = path.with_extension("json.tmp");
        let io = |source| StateError::Io { path: path.clone(), source };
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    }

    /// Whether the owner still runs (a pid that exists and is not a zombie).
    pub fn owner_alive(&self) -> bool {
        pid_alive(self.owner)
    }
}

/// Whether process `pid` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state is the field after the parenthesised command name.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    matches!(state, Some(s) if s != "Z" && s != "X")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(dir: &Path) -> ClusterState {
        let network = crate::topology::sample_network();
        ClusterState {
            version: VERSION,
            run_dir: dir.to_owned(),
            owner: std::process::id(),
            network,
            cgroup_root: "/sys/fs/cgroup/ambit.slice".into(),
            pods: vec![PodState {
                namespace: "demo".into(),
                name: "web".into(),
                uid: "u".into(),
                node: "node1".into(),
                netns: "ambit-pod-1".into(),
                container_id: "c".into(),
                ip: Some("10.244.1.2".parse().expect("ip")),
                ..PodState::default()
            }],
            phase: "ready".into(),
            processes: Vec::new(),
            errors: Vec::new(),
            events: Vec::new(),
            proxy_ports: Default::default(),
        }
    }

    #[test]
    fn the_record_round_trips_and_names_its_owner() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = state(tmp.path());
        s.save().expect("save");
        let back = ClusterState::load(tmp.path()).expect("load");
        assert_eq!(back, s);
        assert!(back.owner_alive(), "this process runs");
        let dead = ClusterState { owner: u32::MAX - 1, ..back };
        assert!(!dead.owner_alive());
    }

    #[test]
    fn missing_and_foreign_records_are_clear_errors() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join(STATE_FILE);
        assert_eq!(
            ClusterState::load(tmp.path()).expect_err("none").to_string(),
            format!("no cluster is up (no {})", path.display())
        );
        std::fs::write(&path, "{\"version\": 1}").expect("write");
        let err = ClusterState::load(tmp.path()).expect_err("partial").to_string();
        assert!(
            err.starts_with(&format!(
                "{} is not a cluster record this ambit understands: missing field",
                path.display()
            )),
            "{err}"
        );
        let mut s = state(tmp.path());
        s.version = 7;
        s.save().expect("save");
        assert_eq!(
            ClusterState::load(tmp.path()).expect_err("version").to_string(),
            format!("{} is not a cluster record this ambit understands: version 7 (want 1)", path.display())
        );
    }
}
