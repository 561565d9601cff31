//! CNI config files: kubelet-compatible parsing and discovery, inserting and removing our entry.
//!
//! Everything here treats file contents as untrusted: a file that kubelet would not load is an
//! error value naming what is wrong, never a panic. The functions that change documents are pure
//! (document in, document out) so they can be property-tested.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// Config files larger than this are not read (kubelet's are a few hundred bytes).
pub(super) const MAX_CONF_BYTES: u64 = 1 << 20;

/// Top-level conflist key recording that we built the list from a single-plugin `.conf`, so that
/// uninstall can give the `.conf` back. libcni and the runtimes ignore unknown top-level keys.
pub(super) const CONVERTED_MARKER: &str = "ambit_converted_from_conf";

/// The two file kinds kubelet loads from the CNI conf dir.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// One plugin: a top-level `type`.
    Conf,
    /// A chain: `name` and a non-empty `plugins` array.
    ConfList,
}

/// Why kubelet would not load a config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    /// The file could not be read.
    #[error("cannot read it: {0}")]
    Read(#[source] io::Error),
    /// Not a regular file (a FIFO or device would block or never end).
    #[error("it is not a regular file")]
    NotFile,
    /// The file is larger than 1 MiB.
    #[error("it is larger than {MAX_CONF_BYTES} bytes")]
    TooLarge,
    /// The bytes are not JSON.
    #[error("it is not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The top level is not an object.
    #[error("its top level is not a JSON object")]
    NotObject,
    /// A `.conf` without a usable `type`.
    #[error("`type` is missing, empty or not a string")]
    NoType,
    /// A `.conflist` without a usable `name`.
    #[error("`name` is missing or not a string")]
    NoName,
    /// A `.conflist` whose `plugins` is missing or not an array.
    #[error("`plugins` is missing or not an array")]
    NoPlugins,
    /// A `.conflist` with no plugins.
    #[error("`plugins` is empty")]
    EmptyPlugins,
    /// A plugin entry that is not an object or has no usable `type`.
    #[error("plugin {0} of `plugins` is not an object with a non-empty string `type`")]
    BadPlugin(usize),
}

/// A config file as kubelet would load it.
#[derive(Clone, Debug)]
pub(super) struct ConfFile {
    /// Path in the conf dir.
    pub path: PathBuf,
    /// `.conf` or `.conflist`.
    pub kind: Kind,
    /// The whole document (checked by [`parse`]).
    pub doc: Map<String, Value>,
}

/// One file found in the conf dir, loadable or not.
#[derive(Debug)]
pub(super) struct Found {
    /// Path in the conf dir.
    pub path: PathBuf,
    /// The parsed file, or why kubelet would skip it.
    pub parsed: Result<ConfFile, ConfError>,
}

/// How our entry appears in a document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Chained {
    /// Exactly one entry of our type, equal to the desired entry.
    Yes,
    /// No entry of our type.
    Missing,
    /// Our type is present but differs from the desired entry, or appears more than once.
    Stale,
}

/// What is left of a conflist after removing our entry.
#[derive(Debug, PartialEq)]
pub(super) enum Unchained {
    /// No entry of ours was there.
    Untouched,
    /// Write this conflist back.
    List(Map<String, Value>),
    /// We had converted a `.conf`: write this `.conf` back and remove the conflist.
    Conf(Map<String, Value>),
    /// Nothing but our entries were in it: remove the file.
    Empty,
}

impl Kind {
    /// The kind of a file name, if kubelet would look at it.
    pub fn of(name: &str) -> Option<Self> {
        if name.ends_with(".conflist") {
            Some(Self::ConfList)
        } else if name.ends_with(".conf") {
            Some(Self::Conf)
        } else {
            None
        }
    }
}

impl ConfFile {
    /// Plugin types in chain order (a `.conf` has one).
    pub fn types(&self) -> Vec<&str> {
        match self.kind {
            Kind::Conf => self.doc.get("type").and_then(Value::as_str).into_iter().collect(),
            Kind::ConfList => {
                plugins(&self.doc).iter().filter_map(|p| p.get("type").and_then(Value::as_str)).collect()
            }
        }
    }

    /// Whether every plugin in the file is ours (such a file is no primary config).
    pub fn only(&self, ours: &str) -> bool {
        self.types().iter().all(|t| *t == ours)
    }

    /// How our entry appears in this file. An entry of a plugin we replace
    /// ([`REPLACED_TYPES`]) makes ours stale: the chain must be rewritten without it.
    pub fn chained(&self, ours: &str, desired: &Map<String, Value>) -> Chained {
        if self.kind == Kind::Conf {
            return Chained::Missing;
        }
        if plugins(&self.doc).iter().any(replaced) {
            return Chained::Stale;
        }
        let mut found =
            plugins(&self.doc).iter().filter(|p| p.get("type").and_then(Value::as_str) == Some(ours));
        match (found.next(), found.next()) {
            (None, _) => Chained::Missing,
            (Some(Value::Object(entry)), None) if entry == desired => Chained::Yes,
            _ => Chained::Stale,
        }
    }
}

/// Checks a file's bytes the way kubelet's CNI loader does.
pub(super) fn parse(kind: Kind, bytes: &[u8]) -> Result<Map<String, Value>, ConfError> {
    let Value::Object(doc) = serde_json::from_slice(bytes).map_err(ConfError::Json)? else {
        return Err(ConfError::NotObject);
    };
    match kind {
        Kind::Conf => {
            if !has_type(&doc) {
                return Err(ConfError::NoType);
            }
        }
        Kind::ConfList => {
            if !matches!(doc.get("name"), Some(Value::String(_))) {
                return Err(ConfError::NoName);
            }
            let Some(Value::Array(list)) = doc.get("plugins") else {
                return Err(ConfError::NoPlugins);
            };
            if list.is_empty() {
                return Err(ConfError::EmptyPlugins);
            }
            for (i, plugin) in list.iter().enumerate() {
                match plugin {
                    Value::Object(p) if has_type(p) => {}
                    _ => return Err(ConfError::BadPlugin(i)),
                }
            }
        }
    }
    Ok(doc)
}

/// Reads and parses one file, refusing anything over [`MAX_CONF_BYTES`].
pub(super) fn load(path: &Path, kind: Kind) -> Result<ConfFile, ConfError> {
    // Check before opening: opening a FIFO blocks until someone writes to it.
    if !fs::metadata(path).map_err(ConfError::Read)?.is_file() {
        return Err(ConfError::NotFile);
    }
    let file = fs::File::open(path).map_err(ConfError::Read)?;
    let mut bytes = Vec::new();
    file.take(MAX_CONF_BYTES + 1).read_to_end(&mut bytes).map_err(ConfError::Read)?;
    if bytes.len() as u64 > MAX_CONF_BYTES {
        return Err(ConfError::TooLarge);
    }
    let doc = parse(kind, &bytes)?;
    Ok(ConfFile { path: path.to_owned(), kind, doc })
}

/// Every `.conf`/`.conflist` in `dir`, in kubelet's order (lexicographic by file name).
///
/// A missing dir is an empty list: the primary CNI has not been installed yet.
pub(super) fn scan(dir: &Path) -> io::Result<Vec<Found>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry?;
        // Kubelet skips directories only; symlinks to files are read through.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if let Some(kind) = Kind::of(&name) {
            names.push((name, kind));
        }
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(names
        .into_iter()
        .map(|(name, kind)| {
            let path = dir.join(name);
            let parsed = load(&path, kind);
            Found { path, parsed }
        })
        .collect())
}

/// The document to write so that `file` chains `entry` last: a conflist either way.
///
/// A conflist keeps every other key and plugin; entries of our type, and of the plugins we
/// replace ([`REPLACED_TYPES`]), are removed first, in the same write. A `.conf`
/// becomes `{"cniVersion": <its>, "name": <its>, "plugins": [<it minus cniVersion>, <entry>]}`.
/// `fallback_name` names the list when the `.conf` has no `name`.
pub(super) fn chain(
    file: &ConfFile,
    ours: &str,
    entry: &Map<String, Value>,
    fallback_name: &str,
) -> Map<String, Value> {
    match file.kind {
        Kind::ConfList => {
            let mut doc = file.doc.clone();
            let mut list: Vec<Value> = plugins(&doc)
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) != Some(ours) && !replaced(p))
                .cloned()
                .collect();
            list.push(Value::Object(entry.clone()));
            doc.insert("plugins".into(), Value::Array(list));
            doc
        }
        Kind::Conf => {
            let mut plugin = file.doc.clone();
            let version = plugin.remove("cniVersion");
            let name = match plugin.get("name") {
                Some(Value::String(n)) if !n.is_empty() => n.clone(),
                _ => fallback_name.to_owned(),
            };
            let mut doc = Map::new();
            if let Some(version) = version {
                doc.insert("cniVersion".into(), version);
            }
            doc.insert("name".into(), Value::String(name));
            doc.insert(
                "plugins".into(),
                Value::Array(vec![Value::Object(plugin), Value::Object(entry.clone())]),
            );
            doc.insert(CONVERTED_MARKER.into(), Value::Bool(true));
            doc
        }
    }
}

/// Removes every entry of our type from a conflist document; with `restore`, a list we built
/// from a `.conf` that still holds just that plugin becomes the `.conf` again.
pub(super) fn unchain(doc: &Map<String, Value>, ours: &str, restore: bool) -> Unchained {
    let Some(Value::Array(list)) = doc.get("plugins") else {
        return Unchained::Untouched;
    };
    let kept: Vec<Value> =
        list.iter().filter(|p| p.get("type").and_then(Value::as_str) != Some(ours)).cloned().collect();
    if kept.len() == list.len() {
        return Unchained::Untouched;
    }
    let converted = doc.get(CONVERTED_MARKER) == Some(&Value::Bool(true));
    match kept.as_slice() {
        [] => Unchained::Empty,
        [Value::Object(only)] if converted && restore => {
            let mut conf = only.clone();
            if let Some(version) = doc.get("cniVersion") {
                conf.insert("cniVersion".into(), version.clone());
            }
            Unchained::Conf(conf)
        }
        _ => {
            let mut doc = doc.clone();
            doc.remove(CONVERTED_MARKER);
            doc.insert("plugins".into(), Value::Array(kept));
            Unchained::List(doc)
        }
    }
}

/// The bytes we write: 2-space pretty JSON, keys sorted, trailing newline.
pub(super) fn render(doc: &Map<String, Value>) -> Result<Vec<u8>, serde_json::Error> {
    let sorted = sort_keys(Value::Object(doc.clone()));
    let mut out = serde_json::to_vec_pretty(&sorted)?;
    out.push(b'\n');
    Ok(out)
}

/// Rebuilds maps in sorted key order, so output is the same whether or not some dependency turns
/// on serde_json's `preserve_order`.
fn sort_keys(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sort_keys(v))).collect())
        }
        Value::Array(list) => Value::Array(list.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

/// Plugin types Ambit's plugin takes the place of: a node migrating from istio-cni keeps no
/// `istio-cni` entry beside ours (its agent is gone, so the entry would fail every ADD, or,
/// before ours, capture pods twice). The entry is replaced in the one atomic write that adds
/// ours, so kubelet never sees a chain with neither.
pub const REPLACED_TYPES: &[&str] = &["istio-cni"];

fn replaced(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str).is_some_and(|t| REPLACED_TYPES.contains(&t))
}

fn has_type(obj: &Map<String, Value>) -> bool {
    matches!(obj.get("type"), Some(Value::String(t)) if !t.is_empty())
}

fn plugins(doc: &Map<String, Value>) -> &[Value] {
    match doc.get("plugins") {
        Some(Value::Array(list)) => list,
        _ => &[],
    }
}

#[cfg(test)]
mod tests;
