//! The agent's enrollment cache (`<cni_agent_run_dir>/enrollment.json`), consulted only when the
//! agent cannot be reached, so that pods that are certainly not enrolled can still start.
//!
//! The agent rewrites the file (atomically) whenever a namespace's enrollment or the set of
//! enrolled pods changes: `{"namespaces": {"<ns>": <pods there may be enrolled>}, "enrolledPods":
//! ["<ns>/<name>", …]}`. A namespace is marked `true` when its labels enroll its pods, and also
//! when any of its pods is selected by its own labels (`istio.io/dataplane-mode=ambient` on the
//! pod): a new replica of such a pod, created while the agent is down, most likely carries the
//! same label. A pod may start without the agent only if its namespace is listed as `false` and
//! the pod is not listed as enrolled. Anything else — no file, a namespace the agent never saw, a
//! namespace marked `true`, an enrolled pod, a file that does not parse — fails closed.
//!
//! The remaining gap, documented: the *first* pod enrolled by its own label in a namespace where
//! no other pod is, created while the agent is down, starts uncaptured; the agent captures it as
//! soon as it is back (it re-adopts running pods at start). Closing that would need the plugin to
//! read pod labels from the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

/// File name in the agent's run dir.
pub const CACHE_FILE: &str = "enrollment.json";
/// Larger files are not read (a real cache is a few KiB per thousand namespaces).
const MAX_CACHE: u64 = 16 * 1024 * 1024;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Cache {
    namespaces: BTreeMap<String, bool>,
    #[serde(default)]
    enrolled_pods: BTreeSet<String>,
}

/// Whether the cache proves the pod is not enrolled (`Err` says why it cannot).
pub fn certainly_not_enrolled(run_dir: &Path, namespace: &str, name: &str) -> Result<(), String> {
    let path = run_dir.join(CACHE_FILE);
    let meta =
        std::fs::metadata(&path).map_err(|e| format!("no enrollment cache at {}: {e}", path.display()))?;
    if meta.len() > MAX_CACHE {
        return Err(format!("enrollment cache {} is too large", path.display()));
    }
    let text = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let cache: Cache = serde_json::from_slice(&text)
        .map_err(|e| format!("enrollment cache {} is invalid: {e}", path.display()))?;
    match cache.namespaces.get(namespace) {
        None => Err(format!("namespace {namespace} is not in the enrollment cache")),
        Some(true) => Err(format!(
            "namespace {namespace} is enrolled in the mesh, or some of its pods are (by their own label)"
        )),
        Some(false) if cache.enrolled_pods.contains(&format!("{namespace}/{name}")) => {
            Err(format!("pod {namespace}/{name} is enrolled in the mesh"))
        }
        Some(false) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(certainly_not_enrolled(dir.path(), "plain", "p").is_err(), "no file: fail closed");
        std::fs::write(
            dir.path().join(CACHE_FILE),
            r#"{"namespaces": {"plain": false, "demo": true}, "enrolledPods": ["plain/labelled"]}"#,
        )
        .expect("write");
        assert!(certainly_not_enrolled(dir.path(), "plain", "p").is_ok());
        assert!(certainly_not_enrolled(dir.path(), "plain", "labelled").is_err());
        assert!(certainly_not_enrolled(dir.path(), "demo", "p").is_err());
        assert!(certainly_not_enrolled(dir.path(), "unknown", "p").is_err());
        std::fs::write(dir.path().join(CACHE_FILE), "{garbage").expect("write");
        assert!(certainly_not_enrolled(dir.path(), "plain", "p").is_err(), "invalid file: fail closed");
    }
}
