//! The agent's enrollment cache (`<cni_agent_run_dir>/enrollment.json`), consulted only when the
//! agent cannot be reached, so that pods that are certainly not enrolled can still start.
//!
//! The agent writes [`EnrollmentCache`] (atomically) whenever a namespace's enrollment or the
//! set of enrolled pods changes; the plugin reads the same type: `{"namespaces": {"<ns>": <pods
//! there may be enrolled>}, "enrolledPods": ["<ns>/<name>", …]}`. A namespace is marked `true`
//! when its labels enroll its pods, and also when any of its pods is selected by its own labels
//! (`istio.io/dataplane-mode=ambient` on the pod): a new replica of such a pod, created while the
//! agent is down, most likely carries the same label. A pod may start without the agent only if
//! its namespace is listed as `false` and the pod is not listed as enrolled. Anything else — no
//! file, a namespace the agent never saw, a namespace marked `true`, an enrolled pod, a file that
//! does not parse — fails closed.
//!
//! The remaining gap, documented: the *first* pod enrolled by its own label in a namespace where
//! no other pod is, created while the agent is down, starts uncaptured; the agent captures it as
//! soon as it is back (it re-adopts running pods at start). Closing that would need the plugin to
//! read pod labels from the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File name in the agent's run dir.
pub const CACHE_FILE: &str = "enrollment.json";
/// Larger files are not read (a real cache is a few KiB per thousand namespaces).
pub const MAX_CACHE: u64 = 16 * 1024 * 1024;

/// The cache file's content, written by the agent and read by the plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentCache {
    /// Every namespace the agent knows: whether pods there may be enrolled.
    pub namespaces: BTreeMap<String, bool>,
    /// Enrolled pods, as `namespace/name`.
    #[serde(default)]
    pub enrolled_pods: BTreeSet<String>,
}

/// Why the cache does not let a pod start without the agent.
#[derive(Debug, thiserror::Error)]
pub enum NotAdmitted {
    /// The file is missing or unreadable.
    #[error("no enrollment cache at {path}: {source}")]
    Unreadable {
        /// The cache file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CACHE`].
    #[error("enrollment cache {0} is too large")]
    TooLarge(PathBuf),
    /// The file does not parse.
    #[error("enrollment cache {path} is invalid: {source}")]
    Invalid {
        /// The cache file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The agent never saw the namespace.
    #[error("namespace {0} is not in the enrollment cache")]
    UnknownNamespace(String),
    /// Pods of the namespace may be enrolled.
    #[error("namespace {0} is enrolled in the mesh, or some of its pods are (by their own label)")]
    NamespaceMayEnroll(String),
    /// The pod itself is enrolled.
    #[error("pod {0} is enrolled in the mesh")]
    PodEnrolled(String),
}

impl EnrollmentCache {
    /// The key of a pod in [`EnrollmentCache::enrolled_pods`].
    pub fn pod_key(namespace: &str, name: &str) -> String {
        format!("{namespace}/{name}")
    }

    /// Reads `<run_dir>/enrollment.json`.
    pub fn read(run_dir: &Path) -> Result<EnrollmentCache, NotAdmitted> {
        let path = run_dir.join(CACHE_FILE);
        let unreadable = |source| NotAdmitted::Unreadable { path: path.clone(), source };
        let meta = std::fs::metadata(&path).map_err(unreadable)?;
        if meta.len() > MAX_CACHE {
            return Err(NotAdmitted::TooLarge(path));
        }
        let text = std::fs::read(&path).map_err(unreadable)?;
        serde_json::from_slice(&text).map_err(|source| NotAdmitted::Invalid { path, source })
    }

    /// The file content.
    pub fn to_json(&self) -> String {
        // Maps of strings to booleans and a set of strings: serialization cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// `Ok` when the cache proves the pod is not enrolled (see the module documentation).
    pub fn admits(&self, namespace: &str, name: &str) -> Result<(), NotAdmitted> {
        match self.namespaces.get(namespace) {
            None => Err(NotAdmitted::UnknownNamespace(namespace.to_owned())),
            Some(true) => Err(NotAdmitted::NamespaceMayEnroll(namespace.to_owned())),
            Some(false) if self.enrolled_pods.contains(&Self::pod_key(namespace, name)) => {
                Err(NotAdmitted::PodEnrolled(Self::pod_key(namespace, name)))
            }
            Some(false) => Ok(()),
        }
    }
}

/// Whether the cache in `run_dir` proves the pod is not enrolled (`Err` says why it cannot).
pub fn certainly_not_enrolled(run_dir: &Path, namespace: &str, name: &str) -> Result<(), NotAdmitted> {
    EnrollmentCache::read(run_dir)?.admits(namespace, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let not = |ns: &str, p: &str| certainly_not_enrolled(dir.path(), ns, p);
        assert!(matches!(not("plain", "p"), Err(NotAdmitted::Unreadable { .. })), "no file: fail closed");
        std::fs::write(
            dir.path().join(CACHE_FILE),
            r#"{"namespaces": {"plain": false, "demo": true}, "enrolledPods": ["plain/labelled"]}"#,
        )
        .expect("write");
        assert!(not("plain", "p").is_ok());
        assert!(
            matches!(not("plain", "labelled"), Err(NotAdmitted::PodEnrolled(p)) if p == "plain/labelled")
        );
        assert!(matches!(not("demo", "p"), Err(NotAdmitted::NamespaceMayEnroll(_))));
        assert!(matches!(not("unknown", "p"), Err(NotAdmitted::UnknownNamespace(_))));
        std::fs::write(dir.path().join(CACHE_FILE), "{garbage").expect("write");
        assert!(matches!(not("plain", "p"), Err(NotAdmitted::Invalid { .. })), "invalid file: fail closed");
    }

    #[test]
    fn what_the_agent_writes_the_plugin_reads() {
        let cache = EnrollmentCache {
            namespaces: [("demo".to_owned(), true), ("plain".to_owned(), false)].into(),
            enrolled_pods: [EnrollmentCache::pod_key("demo", "web")].into(),
        };
        assert_eq!(
            cache.to_json(),
            r#"{"namespaces":{"demo":true,"plain":false},"enrolledPods":["demo/web"]}"#
        );
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(CACHE_FILE), cache.to_json()).expect("write");
        assert_eq!(EnrollmentCache::read(dir.path()).expect("read"), cache);
    }
}
