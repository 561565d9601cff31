//! A node's files, as on a real Kubernetes node: its CNI configuration directory (holding the
//! node network, which the node agent chains `ambit-cni` into), its CNI binary directory (where
//! the agent installs `ambit-cni`), the runtime's result cache and host-local's state, and the
//! agent's run directory and ZDS socket.

use std::path::{Path, PathBuf};

use crate::cni::{self, CniError, PluginPath, Runtime};
use crate::topology::Member;

/// The node network's file in the CNI configuration directory.
pub const NETWORK_FILE: &str = "10-ambit.conflist";
/// The node network's name.
pub const NETWORK_NAME: &str = "ambit";
/// The CNI bridge the node network's `bridge` plugin creates in the node namespace.
pub const CNI_BRIDGE: &str = "cni0";

/// Where a node keeps what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDirs {
    /// `<run>/nodes/<node>`.
    pub root: PathBuf,
}

impl NodeDirs {
    /// The directories of node `name` under `run_dir`.
    pub fn new(run_dir: &Path, name: &str) -> NodeDirs {
        NodeDirs { root: run_dir.join("nodes").join(name) }
    }

    /// The CNI configuration directory (`/etc/cni/net.d` on a node).
    pub fn conf_dir(&self) -> PathBuf {
        self.root.join("cni/net.d")
    }

    /// The CNI binary directory the agent installs `ambit-cni` into (`/opt/cni/bin`).
    pub fn bin_dir(&self) -> PathBuf {
        self.root.join("cni/bin")
    }

    /// The runtime's cache of ADD results (`/var/lib/cni/results`).
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cni/results")
    }

    /// host-local's state (`/var/lib/cni/networks`).
    pub fn ipam_dir(&self) -> PathBuf {
        self.root.join("cni/networks")
    }

    /// The agent's run directory (its CNI event socket; `/var/run/ambit`).
    pub fn agent_run_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    /// The agent's ZDS socket, which the node proxy connects to.
    pub fn zds_socket(&self) -> PathBuf {
        self.root.join("run/zds.sock")
    }
}

/// Why a node could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A directory or file could not be written.
    #[error("node {node}: {path}: {source}")]
    Io {
        /// The node.
        node: String,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The member has no pod CIDR (it is a host, not a node).
    #[error("{0} is not a node (it has no pod CIDR)")]
    NotANode(String),
    /// The reference plugins are missing.
    #[error(transparent)]
    Cni(#[from] CniError),
}

/// A node ready for its agent: files in place, the runtime that creates its pods.
#[derive(Clone, Debug)]
pub struct PreparedNode {
    /// The network member.
    pub member: Member,
    /// Its files.
    pub dirs: NodeDirs,
    /// Its CNI runtime (plugins: the reference ones, then the node's binary directory).
    pub runtime: Runtime,
}

/// Makes node `member`'s directories under `run_dir` and writes its network (the reference
/// bridge on [`CNI_BRIDGE`] with host-local addresses from its pod CIDR), unless the file is
/// there already (a node keeps its network, and what its agent chained in, across restarts).
/// The reference plugins are looked for in `plugin_dirs` ([`cni::PLUGIN_DIRS`] when empty).
pub fn prepare(run_dir: &Path, member: &Member, plugin_dirs: &[PathBuf]) -> Result<PreparedNode, NodeError> {
    let pods = member.pods.ok_or_else(|| NodeError::NotANode(member.name.clone()))?;
    let dirs = NodeDirs::new(run_dir, &member.name);
    let io = |path: &Path, source| NodeError::Io { node: member.name.clone(), path: path.to_owned(), source };
    for dir in [dirs.conf_dir(), dirs.bin_dir(), dirs.cache_dir(), dirs.ipam_dir(), dirs.agent_run_dir()] {
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    }
    let file = dirs.conf_dir().join(NETWORK_FILE);
    if !file.exists() {
        let network = cni::bridge_network(
            NETWORK_NAME,
            CNI_BRIDGE,
            &pods.cidr(),
            &pods.gateway.to_string(),
            &dirs.ipam_dir(),
        );
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&network).unwrap_or_default())
            .map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &file).map_err(|e| io(&file, e))?;
    }
    let runtime = Runtime {
        node_netns: Some(member.netns.clone()),
        conf_dir: dirs.conf_dir(),
        path: if plugin_dirs.is_empty() {
            PluginPath::with_reference_plugins(&[dirs.bin_dir()])?
        } else {
            PluginPath::with_reference_plugins_in(plugin_dirs, &[dirs.bin_dir()])?
        },
        cache_dir: dirs.cache_dir(),
        timeout: cni::PLUGIN_TIMEOUT,
    };
    Ok(PreparedNode { member: member.clone(), dirs, runtime })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::NetworkList;

    #[test]
    fn a_prepared_node_has_its_network_and_keeps_what_was_chained_in() {
        let net = crate::topology::sample_network();
        let tmp = tempfile::tempdir().expect("tmp");
        let node = match prepare(tmp.path(), &net.nodes[0], &[]) {
            Ok(n) => n,
            // Without the reference plugins the error names the package; nothing else to test.
            Err(NodeError::Cni(e)) => {
                assert!(e.to_string().contains("containernetworking-plugins"), "{e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let list = NetworkList::load_dir(&node.dirs.conf_dir()).expect("network");
        assert_eq!(list.types(), ["bridge"]);
        assert_eq!(list.plugins[0]["ipam"]["ranges"][0][0]["subnet"], "10.244.1.0/24");
        assert_eq!(list.plugins[0]["ipam"]["ranges"][0][0]["gateway"], "10.244.1.1");
        assert_eq!(node.runtime.node_netns.as_deref(), Some("ambit-node1"));
        assert_eq!(node.runtime.path.0.last(), Some(&node.dirs.bin_dir()));
        // An agent chains its plugin in; preparing again keeps it.
        let file = node.dirs.conf_dir().join(NETWORK_FILE);
        let chained = std::fs::read_to_string(&file).expect("read").replace("\"bridge\"", "\"bridge2\"");
        std::fs::write(&file, &chained).expect("write");
        prepare(tmp.path(), &net.nodes[0], &[]).expect("again");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), chained);
        assert!(
            matches!(prepare(tmp.path(), &net.hosts[0], &[]), Err(NodeError::NotANode(n)) if n == "control")
        );
    }
}
