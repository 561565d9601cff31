//! The plugin's network configuration from stdin: standard CNI fields plus Ambit's keys.
//!
//! Keys read (all optional except `cniVersion` and `name`):
//!
//! | Key | Default | Meaning |
//! |---|---|---|
//! | `cni_agent_run_dir` | `/var/run/ambit` | directory holding the agent's `pluginevent.sock` |
//! | `exclude_namespaces` | `[]` (`null` allowed) | namespaces whose pods never wait for the agent |
//! | `pod_namespace` | none | namespace the agent runs in (istio-cni's key; informational) |
//! | `system_pods` | `[]` | the agent's and the node proxy's DaemonSet pods, which start without asking the agent (see [`crate::system`]) |
//! | `agent_timeout_ms` | `10000` | total time for one ADD request to the agent (1..=600000) |
//!
//! The node agent's installer writes these keys from the same struct, [`AmbitKeys`]. Other keys
//! (istio-cni's `ambient_enabled`, `enablement_selectors`, `plugin_log_level`, …) are accepted and
//! ignored: the agent, not the plugin, decides which pods are enrolled. Earlier versions read an
//! `agent_pod_prefix` key (default `ambit-agent-`) that nothing wrote; it is ignored now.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::event::EVENT_SOCKET;
use crate::system::SystemPod;
use crate::version::{CniVersion, UnsupportedVersion};

/// Default directory of the agent's plugin event socket.
pub const DEFAULT_AGENT_RUN_DIR: &str = "/var/run/ambit";
/// Default total timeout for the ADD request to the agent.
///
/// The agent answers only after capture rules are installed and the proxy acknowledged the pod,
/// so this leaves room for a busy node; the runtime retries a failed sandbox anyway.
pub const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest accepted `agent_timeout_ms` (10 minutes).
pub const MAX_AGENT_TIMEOUT_MS: u64 = 600_000;

/// A parsed, validated network configuration.
#[derive(Debug, Clone)]
pub struct NetConf {
    /// `cniVersion`: the version the runtime speaks for this invocation.
    pub cni_version: CniVersion,
    /// `name`: the network name.
    pub name: String,
    /// `prevResult`: the previous plugin's result, exactly as received.
    pub prev_result: Option<Box<RawValue>>,
    /// `cni_agent_run_dir`: directory of the agent's sockets.
    pub agent_run_dir: PathBuf,
    /// `exclude_namespaces`: pods here succeed without contacting the agent.
    pub exclude_namespaces: Vec<String>,
    /// `pod_namespace`: the agent's namespace, when the installer wrote it.
    pub pod_namespace: Option<String>,
    /// `system_pods`: the agent's and the proxy's pods; they start without asking the agent.
    pub system_pods: Vec<SystemPod>,
    /// `agent_timeout_ms`: total time allowed for the ADD request.
    pub agent_timeout: Duration,
}

/// Why stdin is not a usable configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    /// Not JSON, or truncated.
    #[error("network configuration on stdin is not valid JSON: {0}")]
    Syntax(#[source] serde_json::Error),
    /// JSON, but a known key has the wrong type.
    #[error("network configuration has a field of the wrong type: {0}")]
    Type(#[source] serde_json::Error),
    /// `cniVersion` missing.
    #[error("network configuration has no cniVersion")]
    MissingVersion,
    /// `cniVersion` not supported.
    #[error("network configuration: {0}")]
    UnsupportedVersion(#[from] UnsupportedVersion),
    /// `name` missing or empty.
    #[error("network configuration has no name")]
    MissingName,
    /// `name` has characters outside `[a-zA-Z0-9_.-]` or does not start alphanumeric.
    #[error(
        "network name {0:?} is invalid; use letters, digits, '_', '.' and '-', starting with a letter or digit"
    )]
    InvalidName(String),
    /// A key has a value outside its allowed range.
    #[error("network configuration key {key}: {reason}")]
    Invalid {
        /// The offending key.
        key: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

/// Ambit's keys of the plugin's config entry: the node agent's installer writes them, the
/// plugin reads them (one definition for both sides). `None` and empty lists are left out when
/// written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmbitKeys {
    /// `cni_agent_run_dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_agent_run_dir: Option<String>,
    /// `exclude_namespaces` (`null` reads as empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_namespaces: Option<Vec<String>>,
    /// `pod_namespace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    /// `system_pods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_pods: Option<Vec<SystemPod>>,
    /// `agent_timeout_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_timeout_ms: Option<u64>,
}

/// The standard keys; [`AmbitKeys`] are read from the same bytes in a second pass.
#[derive(Deserialize)]
struct RawConf {
    #[serde(rename = "cniVersion")]
    cni_version: Option<String>,
    name: Option<String>,
    #[serde(rename = "prevResult")]
    prev_result: Option<Box<RawValue>>,
}

// Longest path that fits `sockaddr_un.sun_path` (108 bytes including the NUL).
const MAX_SOCKET_PATH: usize = 107;

impl NetConf {
    /// Parses and validates the configuration bytes from stdin.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, ConfError> {
        let raw: RawConf = serde_json::from_slice(stdin)
            .map_err(|e| if e.is_data() { ConfError::Type(e) } else { ConfError::Syntax(e) })?;
        let keys: AmbitKeys = serde_json::from_slice(stdin).map_err(ConfError::Type)?;
        let cni_version: CniVersion = raw.cni_version.ok_or(ConfError::MissingVersion)?.parse()?;
        let name = raw.name.filter(|n| !n.is_empty()).ok_or(ConfError::MissingName)?;
        if !valid_name(&name) {
            return Err(ConfError::InvalidName(name));
        }
        let agent_run_dir =
            PathBuf::from(keys.cni_agent_run_dir.unwrap_or_else(|| DEFAULT_AGENT_RUN_DIR.to_owned()));
        if !agent_run_dir.is_absolute() {
            return Err(ConfError::Invalid {
                key: "cni_agent_run_dir",
                reason: format!("{} is not an absolute path", agent_run_dir.display()),
            });
        }
        let socket_len = agent_run_dir.join(EVENT_SOCKET).as_os_str().len();
        if socket_len > MAX_SOCKET_PATH {
            return Err(ConfError::Invalid {
                key: "cni_agent_run_dir",
                reason: format!(
                    "{} is too long: the socket path inside it must be at most {MAX_SOCKET_PATH} bytes",
                    agent_run_dir.display()
                ),
            });
        }
        let timeout_ms = keys.agent_timeout_ms.unwrap_or(DEFAULT_AGENT_TIMEOUT.as_millis() as u64);
        if !(1..=MAX_AGENT_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(ConfError::Invalid {
                key: "agent_timeout_ms",
                reason: format!("{timeout_ms} is outside 1..={MAX_AGENT_TIMEOUT_MS}"),
            });
        }
        let system_pods = keys.system_pods.unwrap_or_default();
        if let Some((pod, problem)) = system_pods.iter().find_map(|p| Some((p, p.problem()?))) {
            return Err(ConfError::Invalid {
                key: "system_pods",
                reason: format!("entry for the {} in namespace {:?}: {problem}", pod.role, pod.namespace),
            });
        }
        Ok(NetConf {
            cni_version,
            name,
            prev_result: raw.prev_result,
            agent_run_dir,
            exclude_namespaces: keys.exclude_namespaces.unwrap_or_default(),
            pod_namespace: keys.pod_namespace.filter(|ns| !ns.is_empty()),
            system_pods,
            agent_timeout: Duration::from_millis(timeout_ms),
        })
    }

    /// Path of the agent's plugin event socket.
    pub fn event_socket(&self) -> PathBuf {
        self.agent_run_dir.join(EVENT_SOCKET)
    }

    /// Directory of the agent's sockets.
    pub fn agent_run_dir(&self) -> &Path {
        &self.agent_run_dir
    }
}

/// libcni's `ValidateNetworkName`: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests;
