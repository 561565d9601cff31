//! The agent's core: the pod and namespace cache, enrollment decisions, and adding pods to and
//! removing them from the mesh (capture inside the pod netns, hand-off to the node proxy over
//! ZDS, the `ambient.istio.io/redirection` annotation).
//!
//! Ordering, as in istio-cni: capture first, then the proxy; a pod is marked `enabled` only
//! after the proxy acked it. If capture fails nothing is left half-applied (rules are removed
//! again) and the error is final for this attempt; if the proxy is missing or refuses, the pod
//! is marked `pending` and the attempt is retried (by the caller) — meanwhile its traffic is
//! captured with no proxy listening, so it cannot bypass the mesh (fail closed).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use ambit_netns::Netns;
use ambit_zds::WorkloadInfo;
use futures::future::BoxFuture;

use crate::enroll::{Decision, Enrollment};
use crate::event::PluginEvent;
use crate::model::{Namespace, Pod};
use crate::zds::{PodEntry, ZdsError, ZdsServer};

/// Installs and removes the capture rules inside a pod's network namespace.
pub trait Capture: Send + Sync + 'static {
    /// Installs (or repairs) the pod's capture; idempotent.
    fn apply(&self, netns: &Netns, pod: &Pod) -> Result<(), String>;
    /// Compares the pod's live capture with what it must be and re-applies it when it
    /// drifted; returns the differences found (empty: in sync, nothing done).
    fn repair(&self, netns: &Netns, pod: &Pod) -> Result<Vec<String>, String>;
    /// Removes the pod's capture; idempotent.
    fn remove(&self, netns: &Netns) -> Result<(), String>;
    /// Host side of an enrolled pod (probe SNAT entries for its IPs); idempotent.
    fn host_add(&self, _pod: &Pod) -> Result<(), String> {
        Ok(())
    }
    /// Removes the host side of a pod that left the mesh; idempotent.
    fn host_remove(&self, _pod: &Pod) -> Result<(), String> {
        Ok(())
    }
}

/// Records the agent's view on the pod object (Kubernetes: `pods/status` patch).
pub trait Annotate: Send + Sync + 'static {
    /// Sets `ambient.istio.io/redirection` to `value`, or removes it (`None`).
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> BoxFuture<'static, Result<(), String>>;
}

/// What a CNI ADD resulted in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddOutcome {
    /// Captured and acked by the proxy.
    Enrolled,
    /// The pod is not to be enrolled.
    NotEnrolled(String),
}

/// Why adding or removing a pod failed.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// The pod or its namespace is not known (yet).
    #[error("pod {0} is not known to the agent (yet); is the pod source in sync?")]
    UnknownPod(String),
    /// The pod's network namespace cannot be found or opened.
    #[error("cannot find the network namespace of pod {pod}: {error}")]
    Netns {
        /// `namespace/name`.
        pod: String,
        /// Why.
        error: String,
    },
    /// Capture could not be installed or removed.
    #[error("traffic capture for pod {pod} failed: {error}")]
    Capture {
        /// `namespace/name`.
        pod: String,
        /// Why.
        error: String,
    },
    /// The node proxy did not take the pod.
    #[error(transparent)]
    Proxy(#[from] ZdsError),
    /// The annotation could not be written.
    #[error("cannot annotate pod {pod}: {error}")]
    Annotate {
        /// `namespace/name`.
        pod: String,
        /// Why.
        error: String,
    },
}

impl MeshError {
    /// Whether trying again later can succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, MeshError::Proxy(_) | MeshError::Annotate { .. } | MeshError::UnknownPod(_))
    }
}

/// Where the agent finds things on the host.
#[derive(Clone, Debug)]
pub struct HostPaths {
    /// Prefix for netns paths from the CNI runtime (`/host` in a container, else empty).
    pub netns_prefix: PathBuf,
    /// The host's `/proc`.
    pub proc_root: PathBuf,
}

/// The agent's core state and operations.
pub struct Mesh {
    enrollment: Enrollment,
    zds: Arc<ZdsServer>,
    capture: Arc<dyn Capture>,
    annotate: Arc<dyn Annotate>,
    paths: HostPaths,
    state: Mutex<State>,
    /// Signalled after pods are stored (wakes CNI ADDs waiting for their pod).
    pods_stored: Notify,
    /// Signalled by a CNI ADD for an unknown pod (wakes the source loop).
    source_wanted: Notify,
}

/// How long a CNI ADD waits for the pod source to learn about its pod.
const UNKNOWN_POD_WAIT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct State {
    namespaces: HashMap<String, Namespace>,
    pods: HashMap<String, Pod>,
    by_name: HashMap<(String, String), String>,
    enrolled: HashMap<String, Enrolled>,
}

struct Enrolled {
    info: WorkloadInfo,
    netns: Option<Arc<Netns>>,
}

impl Mesh {
    /// A mesh core with empty caches.
    pub fn new(
        enrollment: Enrollment,
        zds: Arc<ZdsServer>,
        capture: Arc<dyn Capture>,
        annotate: Arc<dyn Annotate>,
        paths: HostPaths,
    ) -> Arc<Mesh> {
        Arc::new(Mesh {
            enrollment,
            zds,
            capture,
            annotate,
            paths,
            state: Mutex::new(State::default()),
            pods_stored: Notify::new(),
            source_wanted: Notify::new(),
        })
    }

    /// Stores a namespace; returns the uids of its pods when its enrollment changed (they must
    /// be reconciled).
    pub fn upsert_namespace(&self, ns: Namespace) -> Vec<String> {
        let mut st = self.lock();
        let changed = match st.namespaces.get(&ns.name) {
            Some(old) => self.enrollment.namespace_enrolls(old) != self.enrollment.namespace_enrolls(&ns),
            None => true,
        };
        let name = ns.name.clone();
        st.namespaces.insert(name.clone(), ns);
        if !changed {
            return Vec::new();
        }
        st.pods.values().filter(|p| p.namespace == name).map(|p| p.uid.clone()).collect()
    }

    /// Stores a pod (add or update); true when it is new or differs from the stored one (it
    /// must be reconciled).
    pub fn upsert_pod(&self, pod: Pod) -> bool {
        let mut st = self.lock();
        if st.pods.get(&pod.uid) == Some(&pod) {
            return false;
        }
        st.by_name.insert((pod.namespace.clone(), pod.name.clone()), pod.uid.clone());
        st.pods.insert(pod.uid.clone(), pod);
        drop(st);
        self.pods_stored.notify_waiters();
        true
    }

    /// Resolves when a CNI ADD is waiting for a pod the agent does not know yet: the source
    /// loop should read its source now instead of at the next poll.
    pub async fn source_wanted(&self) {
        self.source_wanted.notified().await
    }

    /// Forgets a deleted pod and removes it from the mesh (its netns is gone, so no rules are
    /// removed inside it).
    pub async fn delete_pod(&self, uid: &str) -> Result<(), MeshError> {
        let pod = {
            let mut st = self.lock();
            let pod = st.pods.remove(uid);
            if let Some(p) = &pod {
                st.by_name.remove(&(p.namespace.clone(), p.name.clone()));
            }
            pod
        };
        let was_enrolled = self.lock().enrolled.contains_key(uid);
        if was_enrolled {
            self.remove_from_mesh(uid, pod.as_ref(), true).await?;
        }
        Ok(())
    }

    /// Brings one pod to its desired state: enrolled pods captured and known to the proxy (a
    /// capture that drifted is re-applied), the others released. Idempotent.
    pub async fn reconcile(&self, uid: &str) -> Result<(), MeshError> {
        let (pod, ns, enrolled) = {
            let st = self.lock();
            let Some(pod) = st.pods.get(uid).cloned() else { return Ok(()) };
            let ns = st.namespaces.get(&pod.namespace).cloned();
            (pod, ns, st.enrolled.contains_key(uid))
        };
        let Some(ns) = ns else {
            return Err(MeshError::UnknownPod(format!("{}/{}", pod.namespace, pod.name)));
        };
        match self.enrollment.decide(&pod, &ns) {
            Decision::Enroll if !enrolled => {
                if pod.ips.is_empty() {
                    return Ok(()); // no IP yet: a later update (or the CNI ADD) brings it
                }
                self.add_to_mesh(&pod, None).await
            }
            Decision::Enroll => self.repair_capture(uid, &pod).await,
            Decision::Skip(reason) if enrolled => {
                tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), ?reason, "releasing pod from the mesh");
                let terminal = pod.phase.is_terminal();
                self.remove_from_mesh(uid, Some(&pod), terminal).await
            }
            Decision::Skip(_) => Ok(()),
        }
    }

    /// Verifies an enrolled pod's capture (rules, routing, `net.ipv4.tcp_migrate_req`) and
    /// re-applies it when something drifted, saying what was repaired.
    async fn repair_capture(&self, uid: &str, pod: &Pod) -> Result<(), MeshError> {
        let netns = self.lock().enrolled.get(uid).and_then(|e| e.netns.clone());
        let Some(netns) = netns else { return Ok(()) };
        let name = format!("{}/{}", pod.namespace, pod.name);
        let (capture, p) = (self.capture.clone(), pod.clone());
        let drift = tokio::task::spawn_blocking(move || capture.repair(&netns, &p))
            .await
            .unwrap_or_else(|e| Err(format!("capture task failed: {e}")))
            .map_err(|error| MeshError::Capture { pod: name.clone(), error })?;
        if !drift.is_empty() {
            tracing::warn!(pod = %name, ?drift, "capture drifted; re-applied");
        }
        Ok(())
    }

    /// A CNI ADD: looks the pod up (waiting briefly for the pod source to catch up), and
    /// enrolls it from the runtime's netns path when it must be enrolled.
    pub async fn cni_add(&self, ev: &PluginEvent) -> Result<AddOutcome, MeshError> {
        let key = (ev.pod_namespace.clone(), ev.pod_name.clone());
        // The runtime can be a little ahead of the pod source: ask the source to look now and
        // wake as soon as the pod (and its namespace) is stored, for up to UNKNOWN_POD_WAIT.
        let deadline = tokio::time::Instant::now() + UNKNOWN_POD_WAIT;
        let found = loop {
            let stored = self.pods_stored.notified();
            {
                let st = self.lock();
                if let Some(uid) = st.by_name.get(&key)
                    && let (Some(p), Some(ns)) = (st.pods.get(uid), st.namespaces.get(&ev.pod_namespace))
                {
                    break Some((p.clone(), ns.clone()));
                }
            }
            self.source_wanted.notify_one();
            if tokio::time::timeout_at(deadline, stored).await.is_err() {
                break None;
            }
        };
        let Some((mut pod, ns)) = found else {
            return Err(MeshError::UnknownPod(format!("{}/{}", ev.pod_namespace, ev.pod_name)));
        };
        if let Decision::Skip(reason) = self.enrollment.decide(&pod, &ns) {
            return Ok(AddOutcome::NotEnrolled(format!("{reason:?}")));
        }
        // The runtime's IPs are authoritative here: the pod status has none yet.
        if !ev.ips.is_empty() {
            pod.ips = ev.ips.clone();
        }
        let path = self.paths.netns_prefix.join(ev.netns.trim_start_matches('/'));
        self.add_to_mesh(&pod, Some(&path)).await?;
        Ok(AddOutcome::Enrolled)
    }

    /// The snapshot for a (re)connecting proxy: every enrolled pod, with its netns if held.
    pub fn snapshot(&self) -> Vec<PodEntry> {
        self.lock()
            .enrolled
            .iter()
            .map(|(uid, e)| PodEntry { uid: uid.clone(), info: e.info.clone(), netns: e.netns.clone() })
            .collect()
    }

    /// Uids of enrolled pods.
    pub fn enrolled(&self) -> HashSet<String> {
        self.lock().enrolled.keys().cloned().collect()
    }

    async fn add_to_mesh(&self, pod: &Pod, netns_path: Option<&Path>) -> Result<(), MeshError> {
        let name = format!("{}/{}", pod.namespace, pod.name);
        let netns = match netns_path {
            Some(p) => {
                Netns::open(p).map_err(|e| MeshError::Netns { pod: name.clone(), error: e.to_string() })?
            }
            None => self.find_netns(pod).map_err(|error| MeshError::Netns { pod: name.clone(), error })?,
        };
        let netns = Arc::new(netns);
        let (capture, fd, p) = (self.capture.clone(), netns.clone(), pod.clone());
        let applied = tokio::task::spawn_blocking(move || capture.apply(&fd, &p))
            .await
            .unwrap_or_else(|e| Err(format!("capture task failed: {e}")));
        if let Err(error) = applied {
            // Leave nothing half-applied.
            let (capture, fd) = (self.capture.clone(), netns.clone());
            let _ = tokio::task::spawn_blocking(move || capture.remove(&fd)).await;
            return Err(MeshError::Capture { pod: name, error });
        }
        let info = WorkloadInfo {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
        };
        let entry = PodEntry { uid: pod.uid.clone(), info: info.clone(), netns: Some(netns.clone()) };
        if let Err(e) = self.zds.add(entry).await {
            if netns_path.is_some() {
                // CNI ADD: the pod has not started and the runtime retries the whole sandbox,
                // so leave nothing behind in this namespace.
                let (capture, fd) = (self.capture.clone(), netns.clone());
                let _ = tokio::task::spawn_blocking(move || capture.remove(&fd)).await;
            } else {
                // A running pod being enrolled keeps its capture while the proxy is missing:
                // its traffic stops rather than bypassing the mesh (fail closed); retried.
                let _ = self.annotate.set_redirection(pod, Some("pending")).await;
            }
            return Err(e.into());
        }
        self.lock().enrolled.insert(pod.uid.clone(), Enrolled { info, netns: Some(netns) });
        if let Err(error) = self.capture.host_add(pod) {
            tracing::warn!(pod = %name, %error, "probe SNAT entry not added; kubelet probes may be refused under STRICT mTLS");
        }
        self.annotate
            .set_redirection(pod, Some("enabled"))
            .await
            .map_err(|error| MeshError::Annotate { pod: name.clone(), error })?;
        tracing::info!(pod = %name, "pod added to the mesh");
        Ok(())
    }

    async fn remove_from_mesh(&self, uid: &str, pod: Option<&Pod>, deleted: bool) -> Result<(), MeshError> {
        let name = pod.map(|p| format!("{}/{}", p.namespace, p.name)).unwrap_or_else(|| uid.to_owned());
        let netns = self.lock().enrolled.get(uid).and_then(|e| e.netns.clone());
        if !deleted && let Some(fd) = netns {
            let capture = self.capture.clone();
            tokio::task::spawn_blocking(move || capture.remove(&fd))
                .await
                .unwrap_or_else(|e| Err(format!("capture task failed: {e}")))
                .map_err(|error| MeshError::Capture { pod: name.clone(), error })?;
        }
        self.zds.del(uid).await?;
        self.lock().enrolled.remove(uid);
        if let Some(p) = pod
            && let Err(error) = self.capture.host_remove(p)
        {
            tracing::warn!(pod = %name, %error, "probe SNAT entry not removed");
        }
        let annotated = match pod {
            Some(p) => self.annotate.set_redirection(p, None).await,
            None => Ok(()),
        };
        if let Err(error) = annotated
            && !deleted
        {
            return Err(MeshError::Annotate { pod: name, error });
        }
        tracing::info!(pod = %name, "pod removed from the mesh");
        Ok(())
    }

    /// Finds a running pod's netns through its processes (pods enrolled after they started).
    fn find_netns(&self, pod: &Pod) -> Result<Netns, String> {
        let wanted: HashSet<String> = [pod.uid.clone()].into();
        let ips = pod.ips.clone();
        let found = crate::procfs::scan(&self.paths.proc_root, &wanted, |_, netns_path| {
            let pid_dir = netns_path.parent().and_then(Path::parent).unwrap_or(netns_path);
            let local = crate::addrs::local_addresses(pid_dir);
            ips.iter().any(|ip| local.contains(ip))
        });
        let f = found.get(&pod.uid).ok_or("no process of the pod found in /proc (is the pod running?)")?;
        Netns::open(&f.netns_path).map_err(|e| e.to_string())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests;

impl Mesh {
    /// Agent start: re-adopts a pod that must be enrolled and is already running (found through
    /// `/proc`): capture is re-applied (idempotent: unchanged rules are left alone) and the pod is
    /// recorded as enrolled so that the first proxy connection's snapshot contains it. Returns
    /// false when the pod's namespace could not be found (it is then handled like a new pod).
    pub fn adopt(&self, uid: &str) -> Result<bool, MeshError> {
        let (pod, ns) = {
            let st = self.lock();
            let Some(pod) = st.pods.get(uid).cloned() else { return Ok(false) };
            let Some(ns) = st.namespaces.get(&pod.namespace).cloned() else { return Ok(false) };
            (pod, ns)
        };
        if self.enrollment.decide(&pod, &ns) != Decision::Enroll || pod.ips.is_empty() {
            return Ok(false);
        }
        let name = format!("{}/{}", pod.namespace, pod.name);
        let netns = match self.find_netns(&pod) {
            Ok(fd) => fd,
            Err(error) => {
                tracing::info!(pod = %name, %error, "no running sandbox found yet; will enroll when it appears");
                return Ok(false);
            }
        };
        self.capture.apply(&netns, &pod).map_err(|error| MeshError::Capture { pod: name.clone(), error })?;
        let info = WorkloadInfo {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
        };
        self.lock().enrolled.insert(pod.uid.clone(), Enrolled { info, netns: Some(Arc::new(netns)) });
        if let Err(error) = self.capture.host_add(&pod) {
            tracing::warn!(pod = %name, %error, "probe SNAT entry not added");
        }
        tracing::info!(pod = %name, "running pod re-adopted into the mesh");
        Ok(true)
    }

    /// Uids of every known pod.
    pub fn pods(&self) -> Vec<String> {
        self.lock().pods.keys().cloned().collect()
    }

    /// Uids of known pods no longer in `current` (deleted while we were not looking).
    pub fn missing(&self, current: &HashSet<String>) -> Vec<String> {
        self.lock().pods.keys().filter(|u| !current.contains(*u)).cloned().collect()
    }
}

impl Mesh {
    /// The enrollment cache the CNI plugin reads when the agent is down (see `ambit-cni`'s
    /// `cache` module): namespaces with whether their labels enroll them, and enrolled pods.
    pub fn enrollment_cache(&self) -> serde_json::Value {
        let st = self.lock();
        // Namespaces where some pod is selected by its own labels: its siblings (e.g. a new
        // replica created while the agent is down) likely carry the same labels. One pass over
        // the pods; this runs on every turn of the source loop.
        let by_pod_label: HashSet<&str> = st
            .pods
            .values()
            .filter(|p| st.namespaces.get(&p.namespace).is_some_and(|ns| self.enrollment.selected(p, ns)))
            .map(|p| p.namespace.as_str())
            .collect();
        let namespaces: serde_json::Map<String, serde_json::Value> = st
            .namespaces
            .values()
            .map(|ns| {
                let may_enroll = !self.enrollment.excluded_namespaces.contains(&ns.name)
                    && (self.enrollment.namespace_enrolls(ns) || by_pod_label.contains(ns.name.as_str()));
                (ns.name.clone(), serde_json::Value::Bool(may_enroll))
            })
            .collect();
        let mut pods: Vec<String> = st
            .enrolled
            .keys()
            .filter_map(|uid| st.pods.get(uid))
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        pods.sort();
        serde_json::json!({ "namespaces": namespaces, "enrolledPods": pods })
    }
}
