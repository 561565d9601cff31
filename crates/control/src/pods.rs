//! The pod facts node authorization needs (`control-plane.md` §6.3): each pod's uid, service
//! account and node by namespace/name, and how many pods of each service account run on each
//! node. Fed from the same changes as the translation; read by the CA on every impersonation.
//!
//! As istiod's index: pods in phase `Failed` are left out (Pending and Succeeded pods still
//! count), and so are pods without a node or a service account.

use std::collections::HashMap;

use ambit_objects::{Change, Kind, Object, ObjectKey};

/// What the CA learns about one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.serviceAccountName`.
    pub service_account: String,
    /// `spec.nodeName`.
    pub node: String,
}

/// Pods by name, and pod counts by (namespace, service account, node).
#[derive(Debug, Default)]
pub struct NodePods {
    by_name: HashMap<(String, String), PodFacts>,
    on_node: HashMap<(String, String, String), usize>,
}

impl NodePods {
    /// Applies a batch of changes (kinds other than Pod are ignored).
    pub fn apply<'a>(&mut self, changes: impl IntoIterator<Item = &'a Change>) {
        for c in changes {
            match c {
                Change::Upsert(Object::Pod(p)) => {
                    let key = (
                        p.metadata.namespace.clone().unwrap_or_default(),
                        p.metadata.name.clone().unwrap_or_default(),
                    );
                    self.remove(&key);
                    let spec = p.spec.as_ref();
                    let facts = PodFacts {
                        uid: p.metadata.uid.clone().unwrap_or_default(),
                        service_account: spec
                            .and_then(|s| s.service_account_name.clone())
                            .unwrap_or_default(),
                        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
                    };
                    let failed = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
                    if failed || facts.service_account.is_empty() || facts.node.is_empty() {
                        continue;
                    }
                    *self
                        .on_node
                        .entry((key.0.clone(), facts.service_account.clone(), facts.node.clone()))
                        .or_default() += 1;
                    self.by_name.insert(key, facts);
                }
                Change::Delete(ObjectKey { kind: Kind::Pod, namespace, name }) => {
                    self.remove(&(namespace.clone(), name.clone()));
                }
                _ => {}
            }
        }
    }

    fn remove(&mut self, key: &(String, String)) {
        if let Some(old) = self.by_name.remove(key) {
            let k = (key.0.clone(), old.service_account, old.node);
            if let Some(n) = self.on_node.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.on_node.remove(&k);
                }
            }
        }
    }

    /// The pod `namespace/name`, if indexed.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodFacts> {
        self.by_name.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Whether a pod of service account `namespace/sa` runs on `node`.
    pub fn has_pod_on(&self, namespace: &str, sa: &str, node: &str) -> bool {
        self.on_node.contains_key(&(namespace.to_owned(), sa.to_owned(), node.to_owned()))
    }

    /// Pods indexed.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether no pod is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, sa: &str, node: &str, phase: &str) -> Change {
        let v = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"serviceAccountName": sa, "nodeName": node, "containers": []},
            "status": {"phase": phase}});
        Change::Upsert(Object::from_value(v).unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn counts_pods_per_account_and_node_and_follows_moves_and_deletes() {
        let mut idx = NodePods::default();
        idx.apply(&[
            pod("a", "web", "n1", "Running"),
            pod("b", "web", "n1", "Pending"),
            pod("c", "db", "n2", "Running"),
        ]);
        assert!(idx.has_pod_on("ns", "web", "n1"));
        assert!(!idx.has_pod_on("ns", "web", "n2"));
        assert!(!idx.has_pod_on("other", "web", "n1"));
        assert_eq!(idx.pod("ns", "a").map(|p| p.uid.as_str()), Some("uid-a"));
        // One of two web pods goes: still one on n1; the second goes: none.
        idx.apply(&[Change::Delete(ObjectKey::new(Kind::Pod, "ns", "a"))]);
        assert!(idx.has_pod_on("ns", "web", "n1"));
        idx.apply(&[pod("b", "web", "n2", "Running")]);
        assert!(!idx.has_pod_on("ns", "web", "n1"), "b moved to n2");
        assert!(idx.has_pod_on("ns", "web", "n2"));
        // Failed pods and pods without a node or account do not count; Succeeded ones do.
        idx.apply(&[
            pod("b", "web", "n2", "Failed"),
            pod("d", "", "n1", "Running"),
            pod("e", "batch", "", "Running"),
        ]);
        assert!(!idx.has_pod_on("ns", "web", "n2"));
        assert_eq!(idx.pod("ns", "b"), None);
        assert_eq!(idx.pod("ns", "d"), None);
        idx.apply(&[pod("f", "batch", "n1", "Succeeded")]);
        assert!(idx.has_pod_on("ns", "batch", "n1"));
        assert_eq!(idx.len(), 2);
    }
}
