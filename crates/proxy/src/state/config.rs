//! The local static configuration file (`LOCAL_XDS_PATH`), in ztunnel's YAML format.
//!
//! A file is taken whole or not at all. Beyond YAML and shape errors it is refused when it is
//! empty (only whitespace or comments: an editor that truncates before writing leaves it so for a
//! moment; write `{}` for a config with nothing in it), when two workloads share a uid, when two
//! workloads share an address on one network (host-network workloads excepted), or when two
//! services or two policies share a key; each error names the file positions. It is parsed under
//! a budget sized for the largest mesh we serve from a local file ([`MAX_WORKLOADS`] workloads
//! with [`MAX_SERVICES`] services and [`MAX_POLICIES`] policies), see [`budget`].

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::model::{NetworkMode, Service, Workload};
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

/// The largest mesh the local file is sized for: workloads ...
pub const MAX_WORKLOADS: usize = 1_000_000;
/// ... services ...
pub const MAX_SERVICES: usize = 200_000;
/// ... and policies (see [`budget`]).
pub const MAX_POLICIES: usize = 40_000;

/// Most threads a large file is parsed on (see `pieces`).
const MAX_THREADS: usize = 4;

/// Largest local config file read, in bytes (the file is held in memory while it is parsed).
pub const MAX_FILE_BYTES: usize = 1024 * 1024 * 1024;

/// A position in the config file (1-based line and column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Line.
    pub line: u64,
    /// Column.
    pub column: u64,
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
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error(
        "the local config is {bytes} bytes, more than the {MAX_FILE_BYTES}-byte limit; is this the right \
         file?"
    )]
    TooLarge {
        /// Its size.
        bytes: u64,
    },
    /// The file holds no YAML document at all.
    #[error(
        "the local config is empty (only whitespace or comments), which would remove every workload, \
         service and policy; refusing it (an editor may have truncated it before writing). Write `{{}}` \
         for a config that is meant to be empty"
    )]
    Empty,
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
    /// A JSON file lists more items than a local file is sized for (a YAML one is held to the
    /// same sizes by its parser's budget).
    #[error(
        "the local config lists {count} {kind}, more than the {max} a local file is sized for; serve a \
         mesh this large over xDS"
    )]
    TooMany {
        /// `workloads`, `services` or `policies`.
        kind: &'static str,
        /// How many the file lists.
        count: usize,
        /// The most it may list.
        max: usize,
    },
    /// Two workloads have the same uid.
    #[error(
        "workload at {} has uid {uid:?}, which the workload at {} already has; every workload needs \
         its own uid",
        at(*position),
        at(*first)
    )]
    DuplicateUid {
        /// The uid.
        uid: String,
        /// Where the second one is.
        position: Position,
        /// Where the first one is.
        first: Position,
    },
    /// Two workloads (not host-network) have the same address on the same network.
    #[error(
        "workload {uid:?} at {} has address {address} on network {network:?}, which workload \
         {first_uid:?} at {} already has; two workloads cannot share an address on one network \
         (only host-network workloads may)",
        at(*position),
        at(*first)
    )]
    DuplicateAddress {
        /// The network.
        network: String,
        /// The address.
        address: IpAddr,
        /// The second workload's uid.
        uid: String,
        /// Where the second one is.
        position: Position,
        /// The first workload's uid.
        first_uid: String,
        /// Where the first one is.
        first: Position,
    },
    /// Two services have the same `namespace/hostname`.
    #[error("service {key} at {} is already defined at {}; define each service once", at(*position), at(*first))]
    DuplicateService {
        /// `namespace/hostname`.
        key: String,
        /// Where the second one is.
        position: Position,
        /// Where the first one is.
        first: Position,
    },
    /// Two policies have the same `namespace/name`.
    #[error("policy {key} at {} is already defined at {}; define each policy once", at(*position), at(*first))]
    DuplicatePolicy {
        /// `namespace/name`.
        key: String,
        /// Where the second one is.
        position: Position,
        /// Where the first one is.
        first: Position,
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
    /// Another resource the state refused.
    #[error(transparent)]
    Rejected(super::Rejected),
}

impl LocalConfigError {
    /// The file position the error is about, when it has one.
    pub fn position(&self) -> Option<Position> {
        match self {
            LocalConfigError::Yaml { line: Some(line), column, .. } => {
                Some(Position { line: *line, column: column.unwrap_or_default() })
            }
            LocalConfigError::DuplicateUid { position, .. }
            | LocalConfigError::DuplicateAddress { position, .. }
            | LocalConfigError::DuplicateService { position, .. }
            | LocalConfigError::DuplicatePolicy { position, .. } => Some(*position),
            _ => None,
        }
    }
}

impl LocalConfig {
    /// Parses ztunnel-format local config YAML, refusing empty input and duplicates.
    ///
    /// A file that is one JSON object (JSON is YAML too: ztunnel reads it as such) is read by
    /// the JSON parser, about ten times faster on a generated mesh (measured: BENCHMARKS.md,
    /// "node proxy memory at scale"); anything that is not valid JSON, a YAML flow mapping like
    /// `{workloads: []}` included, is read as YAML, so every error is the YAML parser's.
    pub fn parse(yaml: &str) -> Result<Self, LocalConfigError> {
        if yaml.len() > MAX_FILE_BYTES {
            return Err(LocalConfigError::TooLarge { bytes: yaml.len() as u64 });
        }
        if yaml.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#')) {
            return Err(LocalConfigError::Empty);
        }
        let json = yaml.trim_start().starts_with('{').then(|| serde_json::from_str::<LocalConfig>(yaml).ok());
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS));
        let config = match json.flatten() {
            Some(config) => config.within_sizes()?,
            None => match super::pieces::parse(yaml, threads, super::pieces::MIN_BYTES) {
                Some(config) => config.within_sizes()?,
                None => serde_saphyr::from_str_with_options(yaml, options()).map_err(yaml_error)?,
            },
        };
        // Positions are only needed for an error: find them with a second, cheap pass then.
        match config.duplicate() {
            None => Ok(config),
            Some(dup) => Err(dup.into_error(&Positions::of(yaml)?)),
        }
    }

    /// Refuses more items than a local file is sized for.
    fn within_sizes(self) -> Result<Self, LocalConfigError> {
        for (kind, count, max) in [
            ("workloads", self.workloads.len(), MAX_WORKLOADS),
            ("services", self.services.len(), MAX_SERVICES),
            ("policies", self.policies.len(), MAX_POLICIES),
        ] {
            if count > max {
                return Err(LocalConfigError::TooMany { kind, count, max });
            }
        }
        Ok(self)
    }

    /// The first duplicate uid, address, service key or policy key, by item index.
    fn duplicate(&self) -> Option<Duplicate> {
        let mut uids: HashMap<&str, usize> = HashMap::with_capacity(self.workloads.len());
        let mut addresses: HashMap<(&str, IpAddr), usize> = HashMap::with_capacity(self.workloads.len());
        for (i, w) in self.workloads.iter().enumerate() {
            if let Some(first) = uids.insert(&*w.uid, i) {
                return Some(Duplicate::Uid { uid: w.uid.to_string(), first, second: i });
            }
            if w.network_mode == NetworkMode::HostNetwork {
                continue;
            }
            for ip in &w.workload_ips {
                match addresses.entry((&w.network, *ip)) {
                    Entry::Vacant(v) => {
                        v.insert(i);
                    }
                    // The same address listed twice by one workload is harmless.
                    Entry::Occupied(o) if *o.get() == i => {}
                    Entry::Occupied(o) => {
                        let first = *o.get();
                        return Some(Duplicate::Address {
                            network: w.network.to_string(),
                            address: *ip,
                            first,
                            first_uid: self.workloads[first].uid.to_string(),
                            second: i,
                            uid: w.uid.to_string(),
                        });
                    }
                }
            }
        }
        let mut services: HashMap<String, usize> = HashMap::with_capacity(self.services.len());
        for (i, svc) in self.services.iter().enumerate() {
            if let Some(first) = services.insert(svc.key(), i) {
                return Some(Duplicate::Service { key: svc.key(), first, second: i });
            }
        }
        let mut policies: HashMap<String, usize> = HashMap::with_capacity(self.policies.len());
        for (i, p) in self.policies.iter().enumerate() {
            if let Some(first) = policies.insert(p.key(), i) {
                return Some(Duplicate::Policy { key: p.key(), first, second: i });
            }
        }
        None
    }
}

/// A duplicate found in a parsed config, by item index (positions come later).
enum Duplicate {
    Uid { uid: String, first: usize, second: usize },
    Address { network: String, address: IpAddr, first: usize, first_uid: String, second: usize, uid: String },
    Service { key: String, first: usize, second: usize },
    Policy { key: String, first: usize, second: usize },
}

impl Duplicate {
    fn into_error(self, at: &Positions) -> LocalConfigError {
        let pos = |list: &[Spanned<IgnoredAny>], i: usize| {
            list.get(i).map_or(Position { line: 0, column: 0 }, |s| Position {
                line: s.referenced.line(),
                column: s.referenced.column(),
            })
        };
        match self {
            Duplicate::Uid { uid, first, second } => LocalConfigError::DuplicateUid {
                uid,
                position: pos(&at.workloads, second),
                first: pos(&at.workloads, first),
            },
            Duplicate::Address { network, address, first, first_uid, second, uid } => {
                LocalConfigError::DuplicateAddress {
                    network,
                    address,
                    uid,
                    position: pos(&at.workloads, second),
                    first_uid,
                    first: pos(&at.workloads, first),
                }
            }
            Duplicate::Service { key, first, second } => LocalConfigError::DuplicateService {
                key,
                position: pos(&at.services, second),
                first: pos(&at.services, first),
            },
            Duplicate::Policy { key, first, second } => LocalConfigError::DuplicatePolicy {
                key,
                position: pos(&at.policies, second),
                first: pos(&at.policies, first),
            },
        }
    }
}

/// Where each item of the file starts (nothing else of it is kept).
#[derive(Deserialize)]
struct Positions {
    #[serde(default)]
    workloads: Vec<Spanned<IgnoredAny>>,
    #[serde(default)]
    services: Vec<Spanned<IgnoredAny>>,
    #[serde(default)]
    policies: Vec<Spanned<IgnoredAny>>,
}

impl Positions {
    fn of(yaml: &str) -> Result<Positions, LocalConfigError> {
        serde_saphyr::from_str_with_options(yaml, options()).map_err(yaml_error)
    }
}

/// Reads a local config file, refusing one larger than [`MAX_FILE_BYTES`] before reading it.
pub(super) fn read(path: &Path) -> Result<String, LocalConfigError> {
    let io = |source| LocalConfigError::Read { path: path.to_owned(), source };
    let bytes = std::fs::metadata(path).map_err(io)?.len();
    if bytes > MAX_FILE_BYTES as u64 {
        return Err(LocalConfigError::TooLarge { bytes });
    }
    std::fs::read_to_string(path).map_err(io)
}

fn options() -> serde_saphyr::Options {
    options_within(budget())
}

/// The parser's options for a document held to `budget`. Comments are read but not kept
/// (nothing uses them).
pub(super) fn options_within(budget: serde_saphyr::Budget) -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.emit_comments = false;
    options
}

fn yaml_error(e: serde_saphyr::Error) -> LocalConfigError {
    let loc = e.location();
    LocalConfigError::Yaml {
        line: loc.map(|l| l.line()),
        column: loc.map(|l| l.column()),
        source: Box::new(e),
    }
}

/// What one item may cost the YAML budget: about twice what a fully specified workload costs
/// (every string key set, dual-stack, a locality, a service entry and a listed policy: 51 nodes,
/// 63 parser events and 454 bytes of scalars, measured by the unit test
/// `budget_fits_the_largest_mesh`); a service or a policy costs less.
const NODES_PER_ITEM: usize = 100;
const EVENTS_PER_ITEM: usize = 128;
const SCALAR_BYTES_PER_ITEM: usize = 1024;

/// The YAML budget: [`MAX_WORKLOADS`] + [`MAX_SERVICES`] + [`MAX_POLICIES`] items at the
/// per-item allowances above (31 M nodes, 39.7 M events, 317 MB of scalars; serde-saphyr's default
/// of 250 000 nodes refused a 5 000-workload file). The other limits (depth 64, aliases,
/// anchors) keep serde-saphyr's defaults, which no config of ours comes near.
pub fn budget() -> serde_saphyr::Budget {
    item_budget(MAX_WORKLOADS + MAX_SERVICES + MAX_POLICIES)
}

/// The budget of `items` items at the per-item allowances.
pub(super) fn item_budget(items: usize) -> serde_saphyr::Budget {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = items * NODES_PER_ITEM;
    budget.max_events = items * EVENTS_PER_ITEM;
    budget.max_total_scalar_bytes = items * SCALAR_BYTES_PER_ITEM;
    budget
}

fn at(p: Position) -> String {
    format!("line {}, column {}", p.line, p.column)
}
