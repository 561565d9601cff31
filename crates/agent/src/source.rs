//! Where the agent learns about pods and namespaces. Local mode reads the same Kubernetes
//! objects from a folder of YAML files (what `ambit up` writes); the Kubernetes API source comes
//! with the Kubernetes deployment. Both produce the same typed objects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::model::{Namespace, Pod};

/// Everything a source knows at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Namespaces by name.
    pub namespaces: BTreeMap<String, Namespace>,
    /// Pods by uid (only this node's, when the source can tell).
    pub pods: BTreeMap<String, Pod>,
}

/// A folder of YAML files holding Namespace and Pod objects (several documents per file are fine).
pub struct FileSource {
    dir: PathBuf,
    node_name: Option<String>,
    /// Per file: the (mtime, size) it was parsed at and the objects it held. Only files whose
    /// stamp changed are parsed again, so a poll costs one `stat` per unchanged file.
    files: BTreeMap<PathBuf, ((SystemTime, u64), Vec<Object>)>,
}

/// One object read from a file.
#[derive(Clone, Debug)]
enum Object {
    Namespace(Namespace),
    Pod(Pod),
}

impl FileSource {
    /// Watches `dir`; with `node_name`, only pods whose `spec.nodeName` matches are kept.
    pub fn new(dir: &Path, node_name: Option<String>) -> FileSource {
        FileSource { dir: dir.to_owned(), node_name, files: BTreeMap::new() }
    }

    /// Reads the folder when something changed since the last call (`None`: unchanged).
    /// Unreadable files and objects are logged and skipped; the rest is still used.
    pub fn poll(&mut self) -> Option<Inventory> {
        let mut changed = false;
        let mut files = BTreeMap::new();
        for path in yaml_files(&self.dir) {
            let Ok(m) = std::fs::metadata(&path) else { continue };
            let stamp = (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len());
            let objects = match self.files.remove(&path) {
                Some((old, objects)) if old == stamp => objects,
                _ => {
                    changed = true;
                    self.parse(&path)
                }
            };
            files.insert(path, (stamp, objects));
        }
        changed |= !self.files.is_empty(); // files that disappeared
        self.files = files;
        if !changed {
            return None;
        }
        let mut inv = Inventory::default();
        for object in self.files.values().flat_map(|(_, objects)| objects) {
            match object {
                Object::Namespace(ns) => {
                    inv.namespaces.insert(ns.name.clone(), ns.clone());
                }
                Object::Pod(p) => {
                    inv.pods.insert(p.uid.clone(), p.clone());
                }
            }
        }
        Some(inv)
    }

    fn parse(&self, path: &Path) -> Vec<Object> {
        let mut objects = Vec::new();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot read");
                return objects;
            }
        };
        let docs: Vec<serde_json::Value> = match serde_saphyr::from_multiple(&text) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "not valid YAML; file skipped");
                return objects;
            }
        };
        for doc in docs {
            match doc.get("kind").and_then(|k| k.as_str()) {
                Some("Namespace") => match Namespace::from_value(doc) {
                    Ok(ns) => objects.push(Object::Namespace(ns)),
                    Err(e) => tracing::warn!(file = %path.display(), error = %e, "Namespace skipped"),
                },
                Some("Pod") => match Pod::from_value(doc) {
                    Ok(p) if self.node_name.as_ref().is_none_or(|n| *n == p.node_name) => {
                        objects.push(Object::Pod(p))
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(file = %path.display(), error = %e, "Pod skipped"),
                },
                _ => {}
            }
        }
        objects
    }
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_objects_and_notices_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("mesh.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo\n  labels:\n    istio.io/dataplane-mode: ambient\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: demo\n  uid: u1\nspec:\n  nodeName: n1\n\
             status:\n  podIP: 10.0.0.5\n---\nkind: Pod\nmetadata:\n  name: other\n  namespace: demo\n  uid: u2\nspec:\n  nodeName: n2\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("broken.yaml"), "kind: [unclosed").expect("write");
        std::fs::write(dir.path().join("notes.txt"), "ignored").expect("write");
        let mut src = FileSource::new(dir.path(), Some("n1".into()));
        let inv = src.poll().expect("first read");
        assert_eq!(inv.namespaces.len(), 1);
        assert_eq!(inv.pods.keys().collect::<Vec<_>>(), vec!["u1"], "only this node's pods");
        assert!(src.poll().is_none(), "unchanged");
        std::fs::write(dir.path().join("more.yaml"), "kind: Namespace\nmetadata:\n  name: other\n")
            .expect("write");
        assert_eq!(src.poll().expect("changed").namespaces.len(), 2);
        std::fs::remove_file(dir.path().join("more.yaml")).expect("remove");
        let inv = src.poll().expect("a removed file is a change");
        assert_eq!(inv.namespaces.len(), 1);
        assert_eq!(inv.pods.len(), 1, "objects of unchanged files are kept");
        assert!(src.poll().is_none(), "unchanged");
    }
}
