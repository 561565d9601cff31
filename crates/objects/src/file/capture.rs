//! Local mode's capture state: what each node agent would have written as pods'
//! `ambient.istio.io/redirection` annotation, one JSON file per node (`<dir>/<node>.json`).
//!
//! In Kubernetes the agent patches `pods/status` and istiod (or `ambit control`) reads the
//! annotation back from the Pod. In local mode the pods are YAML files the operator owns, which
//! the agent must not rewrite; so the agent writes its view here (atomically: a temporary file,
//! then a rename) and the file source lays it over the Pod objects it reads, and the translation
//! sees the same annotation in both modes.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use super::{FileError, Position, Problem, Stamp};

/// Largest capture-state file read.
const MAX_BYTES: u64 = 16 << 20;

/// One node's capture state (`<dir>/<node>.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaptureState {
    /// The node whose agent wrote it.
    pub node: String,
    /// Its pods that carry the annotation, sorted by namespace and name.
    pub pods: Vec<CapturedPod>,
}

/// One pod's annotation.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapturedPod {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid` (a recreated pod of the same name does not inherit the value).
    pub uid: String,
    /// The annotation's value (`enabled`, `pending`).
    pub redirection: String,
}

/// Why the capture state cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The node name cannot name a file.
    #[error("the node name {0:?} cannot name a capture-state file (empty, or has '/' or a leading '.')")]
    NodeName(String),
    /// Writing failed.
    #[error("cannot write the capture state {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl CaptureState {
    /// The state of `node`, no pods.
    pub fn new(node: impl Into<String>) -> CaptureState {
        CaptureState { node: node.into(), pods: Vec::new() }
    }

    /// `<dir>/<node>.json`.
    pub fn path(dir: &Path, node: &str) -> Result<PathBuf, CaptureError> {
        if node.is_empty() || node.contains('/') || node.starts_with('.') {
            return Err(CaptureError::NodeName(node.to_owned()));
        }
        Ok(dir.join(format!("{node}.json")))
    }

    /// Writes `<dir>/<node>.json` atomically: readers see the old or the new state, never part.
    pub fn write(&self, dir: &Path) -> Result<(), CaptureError> {
        let path = CaptureState::path(dir, &self.node)?;
        let tmp = dir.join(format!(".{}.json.tmp", self.node));
        let mut pods = self.pods.clone();
        pods.sort();
        let state = CaptureState { node: self.node.clone(), pods };
        let write = || -> std::io::Result<()> {
            let bytes = serde_json::to_vec_pretty(&state).map_err(std::io::Error::other)?;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|source| CaptureError::Write { path, source })
    }
}

/// The capture-state folder as the file source reads it.
pub(super) struct Overlay {
    dir: PathBuf,
    files: BTreeMap<PathBuf, CaptureState>,
    /// The version of each file last read, good or bad.
    stamps: BTreeMap<PathBuf, Stamp>,
    errors: BTreeMap<PathBuf, FileError>,
    /// `(namespace, name)` → entries of every node naming that pod.
    merged: HashMap<(String, String), Vec<(String, CapturedPod)>>,
    folder_error: Option<FileError>,
}

impl Overlay {
    pub(super) fn new(dir: PathBuf) -> Overlay {
        Overlay {
            dir,
            files: BTreeMap::new(),
            stamps: BTreeMap::new(),
            errors: BTreeMap::new(),
            merged: HashMap::new(),
            folder_error: None,
        }
    }

    /// Reads the files that changed; the pods whose entries changed.
    pub(super) fn poll(&mut self) -> Vec<(String, String)> {
        let paths = match json_files(&self.dir) {
            Ok(p) => {
                self.folder_error = None;
                p
            }
            Err(e) => {
                self.folder_error = Some(FileError {
                    path: self.dir.clone(),
                    at: None,
                    problem: Problem::Read(e.to_string()),
                });
                return Vec::new();
            }
        };
        let before = self.files.len();
        self.files.retain(|p, _| paths.contains(p));
        self.errors.retain(|p, _| paths.contains(p));
        self.stamps.retain(|p, _| paths.contains(p));
        let mut changed = self.files.len() != before;
        for path in paths {
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            let stamp = Stamp::of(&meta);
            if self.stamps.get(&path) == Some(&stamp) {
                continue;
            }
            self.stamps.insert(path.clone(), stamp);
            match read_state(&path, &meta) {
                Ok(state) => {
                    self.errors.remove(&path);
                    self.files.insert(path, state);
                    changed = true;
                }
                Err(error) => {
                    // Keep the last good state of this node.
                    tracing::warn!(%error, "bad capture-state file; keeping what it said before");
                    self.errors.insert(path, *error);
                }
            }
        }
        if !changed {
            return Vec::new();
        }
        let mut merged: HashMap<(String, String), Vec<(String, CapturedPod)>> = HashMap::new();
        for state in self.files.values() {
            for pod in &state.pods {
                merged
                    .entry((pod.namespace.clone(), pod.name.clone()))
                    .or_default()
                    .push((state.node.clone(), pod.clone()));
            }
        }
        let mut touched: Vec<(String, String)> =
            merged.iter().filter(|(k, v)| self.merged.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
        touched.extend(self.merged.keys().filter(|k| !merged.contains_key(*k)).cloned());
        self.merged = merged;
        touched
    }

    pub(super) fn errors(&self) -> impl Iterator<Item = FileError> + '_ {
        self.folder_error.iter().cloned().chain(self.errors.values().cloned())
    }

    /// The value the agent of the pod's node reports for this very pod (same uid).
    pub(super) fn redirection(&self, pod: &Pod) -> Option<&str> {
        let m = &pod.metadata;
        let key = (m.namespace.clone().unwrap_or_default(), m.name.clone().unwrap_or_default());
        let uid = m.uid.as_deref().filter(|u| !u.is_empty())?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref())?;
        self.merged
            .get(&key)?
            .iter()
            .find(|(n, p)| n == node && p.uid == uid)
            .map(|(_, p)| p.redirection.as_str())
    }
}

fn json_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !name.starts_with('.') && name.ends_with(".json") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn read_state(path: &Path, meta: &std::fs::Metadata) -> Result<CaptureState, Box<FileError>> {
    let fail = |at, problem| Box::new(FileError { path: path.to_owned(), at, problem });
    if meta.len() > MAX_BYTES {
        return Err(fail(None, Problem::TooLarge { size: meta.len(), limit: MAX_BYTES }));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(None, Problem::Read(e.to_string())))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        let at = (e.line() > 0).then(|| Position { line: e.line() as u64, column: e.column() as u64 });
        let message = e.to_string();
        let message = match at {
            Some(p) => {
                let suffix = format!(" at line {} column {}", p.line, p.column);
                message.strip_suffix(&suffix).map(str::to_owned).unwrap_or(message)
            }
            None => message,
        };
        fail(at, Problem::Object(format!("not a capture-state file: {message}")))
    })
}
