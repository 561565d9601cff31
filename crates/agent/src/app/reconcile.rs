//! The agent's main loop: follow the pod source, reconcile what changed, retry what failed,
//! rewrite the enrollment cache, and keep the plugin's config naming the node's own pods.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ambit_cni::{AmbitKeys, SystemPod, SystemRole};
use serde_json::{Map, Value};

use super::AgentError;
use super::metrics::AgentMetrics;
use crate::annotate::Annotations;
use crate::install::Installer;
use crate::kube::KubeSourceError;
use crate::mesh::Mesh;
use crate::model::{Namespace, Pod};
use ambit_objects::file::FileSource;
use ambit_objects::kube::KubeSource;
use ambit_objects::{Change, Kind, Object};

/// Where pods and namespaces come from.
pub enum Source {
    /// A folder of YAML objects (local mode).
    Files(Box<FileSource>),
    /// The Kubernetes API.
    Kube(KubeSource),
}

impl Source {
    /// The changes since the last call.
    pub fn poll(&mut self) -> Vec<Change> {
        match self {
            Source::Files(f) => f.poll(),
            Source::Kube(k) => k.poll(),
        }
    }

    /// Resolves when the source can no longer serve (the API server refuses the agent).
    async fn failed(&self) -> KubeSourceError {
        match self {
            Source::Files(_) => std::future::pending().await,
            Source::Kube(k) => k.failed().await,
        }
    }
}

/// Applies the source's changes to the mesh core; the uids of the pods to reconcile. A pod
/// whose uid changed under the same name (recreated) replaces the old one, which is removed, and
/// so is a pod that no longer converts (no uid). `event` hears each change's type (`add`,
/// `update`, `delete`), for istio-cni's `nodeagent_reconcile_events_total`.
pub async fn apply(mesh: &Mesh, changes: Vec<Change>, event: &dyn Fn(&str)) -> HashSet<String> {
    let mut dirty = HashSet::new();
    for change in changes {
        event(match &change {
            Change::Delete(_) => "delete",
            Change::Upsert(Object::Pod(p))
                if mesh
                    .uid_of(
                        p.metadata.namespace.as_deref().unwrap_or_default(),
                        p.metadata.name.as_deref().unwrap_or_default(),
                    )
                    .is_none() =>
            {
                "add"
            }
            Change::Upsert(_) => "update",
        });
        match change {
            Change::Upsert(Object::Namespace(ns)) => match Namespace::from_k8s(&ns) {
                Ok(ns) => dirty.extend(mesh.upsert_namespace(ns)),
                Err(e) => tracing::warn!(error = %e, "namespace skipped"),
            },
            Change::Upsert(Object::Pod(p)) => {
                let m = &p.metadata;
                let (namespace, name) =
                    (m.namespace.as_deref().unwrap_or_default(), m.name.as_deref().unwrap_or_default());
                let pod = Pod::from_k8s(&p);
                let uid = pod.as_ref().ok().map(|p| p.uid.as_str());
                if let Some(old) = mesh.uid_of(namespace, name).filter(|old| Some(old.as_str()) != uid) {
                    remove(mesh, &old).await;
                }
                match pod {
                    Ok(pod) => {
                        let uid = pod.uid.clone();
                        if mesh.upsert_pod(pod) {
                            dirty.insert(uid);
                        }
                    }
                    Err(e) => tracing::warn!(pod = %format!("{namespace}/{name}"), error = %e, "pod skipped"),
                }
            }
            Change::Delete(key) if key.kind == Kind::Pod => {
                if let Some(uid) = mesh.uid_of(&key.namespace, &key.name) {
                    remove(mesh, &uid).await;
                }
            }
            // A deleted namespace's pods are deleted on their own.
            other => tracing::debug!(object = %other.key(), "change not used by the agent"),
        }
    }
    dirty
}

async fn remove(mesh: &Mesh, uid: &str) {
    if let Err(e) = mesh.delete_pod(uid).await {
        tracing::warn!(%uid, error = %e, "removing a deleted pod failed");
    }
}

/// Most `generateName`s kept per role (a DaemonSet renamed now and then).
const MAX_PER_ROLE: usize = 4;

/// The plugin's config entry, kept naming the node's own pods.
pub struct PluginEntry {
    installer: Installer,
    keys: AmbitKeys,
    /// Namespaces where a pod of each role may be recognised.
    allowed: Vec<(SystemRole, String)>,
    known: Vec<SystemPod>,
}

impl PluginEntry {
    /// `keys` without `system_pods`; those already in the installed config (from an earlier
    /// agent) are kept when they are in `allowed` namespaces, so a proxy pod that is not on the
    /// node right now is still admitted while no agent runs.
    pub fn new(installer: Installer, keys: AmbitKeys, allowed: Vec<(SystemRole, String)>) -> PluginEntry {
        let mut entry = PluginEntry { installer, keys, allowed, known: Vec::new() };
        let installed = entry
            .installer
            .installed_entry()
            .and_then(|m| serde_json::from_value::<AmbitKeys>(Value::Object(m)).ok())
            .and_then(|k| k.system_pods)
            .unwrap_or_default();
        entry.learn(installed);
        entry
    }

    /// The entry to write.
    pub fn entry(&self) -> Map<String, Value> {
        let mut keys = self.keys.clone();
        keys.system_pods = (!self.known.is_empty()).then(|| self.known.clone());
        match serde_json::to_value(&keys) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        }
    }

    /// The installer.
    pub fn installer(&self) -> &Installer {
        &self.installer
    }

    /// Adds newly seen system pods; true when the set changed.
    pub fn learn(&mut self, found: Vec<SystemPod>) -> bool {
        let mut changed = false;
        for pod in found {
            let allowed = self.allowed.iter().any(|(role, ns)| *role == pod.role && *ns == pod.namespace);
            if !allowed || pod.problem().is_some() || self.known.contains(&pod) {
                continue;
            }
            tracing::info!(role = %pod.role, namespace = %pod.namespace, generate_name = %pod.generate_name,
                "the plugin will admit this DaemonSet's pods without asking the agent");
            let same_role = self.known.iter().filter(|p| p.role == pod.role).count();
            if same_role >= MAX_PER_ROLE
                && let Some(oldest) = self.known.iter().position(|p| p.role == pod.role)
            {
                self.known.remove(oldest);
            }
            self.known.push(pod);
            changed = true;
        }
        changed
    }

    /// Writes the entry when the system pods changed.
    fn update(&mut self, found: Vec<SystemPod>) {
        if !self.learn(found) {
            return;
        }
        if let Err(e) = self.installer.set_entry(&self.entry()) {
            tracing::error!(error = %e, "cannot update the plugin entry");
        }
    }
}

/// Everything the loop works on.
pub struct Follower {
    /// Pods and namespaces.
    pub source: Source,
    /// The mesh core.
    pub mesh: Arc<Mesh>,
    /// Metrics to update.
    pub metrics: Arc<AgentMetrics>,
    /// The annotation worker's queue.
    pub annotations: Arc<Annotations>,
    /// `<run dir>/enrollment.json`.
    pub cache_path: PathBuf,
    /// How often the source is polled.
    pub poll: Duration,
    /// How often every enrolled pod's capture is verified (and repaired).
    pub verify_interval: Duration,
    /// The plugin's entry, when the agent installs the plugin.
    pub plugin: Option<PluginEntry>,
}

impl Follower {
    /// Runs until SIGTERM/SIGINT (`Ok`) or until the source fails (`Err`).
    pub async fn run(&mut self) -> Result<(), AgentError> {
        let mut cache_written = String::new();
        let mut dirty: HashSet<String> = self.mesh.pods().into_iter().collect();
        let mut stop = std::pin::pin!(ambit_admin::shutdown_signal());
        let mut next_verify = tokio::time::Instant::now() + self.verify_interval;
        loop {
            // Reconciling an enrolled pod verifies its capture (and repairs drift).
            if tokio::time::Instant::now() >= next_verify {
                dirty.extend(self.mesh.enrolled());
                next_verify = tokio::time::Instant::now() + self.verify_interval;
            }
            let changes = self.source.poll();
            if !changes.is_empty() {
                let metrics = &self.metrics;
                dirty.extend(apply(&self.mesh, changes, &|kind| metrics.istio.reconcile_event(kind)).await);
                if let Some(plugin) = &mut self.plugin {
                    plugin.update(self.mesh.system_pods());
                }
            }
            let mut failed = HashSet::new();
            for uid in dirty.drain() {
                if let Err(e) = self.mesh.reconcile(&uid).await {
                    tracing::warn!(%uid, error = %e, retry = e.retryable(), "reconcile failed");
                    if e.retryable() {
                        failed.insert(uid);
                    }
                }
            }
            dirty = failed;
            let cache = self.mesh.enrollment_cache().to_json();
            if cache != cache_written {
                match ambit_admin::write_atomic(&self.cache_path, cache.as_bytes()) {
                    Ok(()) => cache_written = cache,
                    Err(e) => {
                        tracing::warn!(file = %self.cache_path.display(), error = %e, "cannot write the enrollment cache")
                    }
                }
            }
            self.metrics.set_pods("enrolled", self.mesh.enrolled().len());
            self.metrics.set_pods("pending", dirty.len());
            self.metrics.annotations_pending.set(self.annotations.pending() as i64);
            let wait = if dirty.is_empty() { self.poll } else { Duration::from_secs(1).min(self.poll * 4) }
                .min(next_verify.saturating_duration_since(tokio::time::Instant::now()));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.mesh.source_wanted() => {}
                _ = &mut stop => return Ok(()),
                e = self.source.failed() => return Err(AgentError::Kube(e)),
            }
        }
    }
}
