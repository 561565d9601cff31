//! The local static configuration file (`LOCAL_XDS_PATH`), in ztunnel's YAML format.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::model::{Service, Workload};
use crate::authz::Authorization;

/// Workloads, services and policies from a local YAML file (all keys optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalConfig {
    /// Workloads; each may list the services it is an endpoint of.
    #[serde(default)]
    pub workloads: Vec<Workload>,
    /// Services.
    #[serde(default)]
    pub services: Vec<Service>,
    /// Authorization policies.
    #[serde(default)]
    pub policies: Vec<Authorization>,
}

/// Why a local configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LocalConfigError {
    /// The file could not be read.
    #[error("cannot read local config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The YAML is malformed or does not match the expected shape.
    // The parser's report already names the line and column and shows the offending snippet.
    #[error("invalid local config YAML: {source}")]
    Yaml {
        /// 1-based line of the problem, when known.
        line: Option<u64>,
        /// 1-based column of the problem, when known.
        column: Option<u64>,
        /// The parser's report.
        source: Box<serde_saphyr::Error>,
    },
    /// A workload's `services` key is not `<namespace>/<hostname>`.
    #[error("workload {uid:?}: services key {key:?} is not of the form \"<namespace>/<hostname>\"")]
    ServiceKey {
        /// The workload.
        uid: String,
        /// The bad key.
        key: String,
    },
    /// A service has an empty hostname.
    #[error("service {namespace}/{name}: hostname must not be empty")]
    EmptyHostname {
        /// Service namespace.
        namespace: String,
        /// Service name.
        name: String,
    },
}

impl LocalConfig {
    /// Parses ztunnel-format local config YAML.
    pub fn parse(yaml: &str) -> Result<Self, LocalConfigError> {
        // An empty document (or only comments) is an empty config, as with ztunnel.
        if yaml.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#')) {
            return Ok(LocalConfig::default());
        }
        serde_saphyr::from_str(yaml).map_err(|e| {
            let loc = e.location();
            LocalConfigError::Yaml {
                line: loc.map(|l| l.line()),
                column: loc.map(|l| l.column()),
                source: Box::new(e),
            }
        })
    }

    /// Reads and parses a local config file.
    pub fn load(path: &Path) -> Result<Self, LocalConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| LocalConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(&text)
    }
}
