//! The agent's core: the pod and namespace cache, enrollment decisions, and adding pods to and
//! removing them from the mesh (capture inside the pod netns, hand-off to the node proxy over
//! ZDS, the `ambient.istio.io/redirection` annotation).
//!
//! Ordering, as in istio-cni: capture first, then the proxy; a pod is marked `enabled` only
//! after the proxy acked it. If capture fails nothing is left half-applied (rules are removed
//! again) and the error is final for this attempt; if the proxy is missing or refuses, the pod
//! is marked `pending` and the attempt is retried (by the caller) — meanwhile its traffic is
//! captured with no proxy listening, so it cannot bypass the mesh (fail closed).
//!
//! The annotation is a report, not part of safety: the outcome of an ADD depends on capture and
//! the proxy's ack only, and the annotation is written afterwards, with retries, by
//! [`Annotations`] (unlike istio-cni, which fails the ADD when the patch fails).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use ambit_cni::{EnrollmentCache, PluginEvent};
use ambit_netns::{Netns, NetnsError};
use ambit_zds::WorkloadInfo;

use crate::annotate::Annotations;
use crate::capture::{Capture, CaptureError};
use crate::enroll::{Decision, Enrollment};
use crate::model::{Namespace, Pod};
use crate::podns::{HostNamespaces, NetnsRefusal};
use crate::zds::{PodEntry, ZdsError, ZdsServer};

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
    /// The network namespace a CNI ADD names is refused (not a pod's; see [`crate::podns`]).
    #[error("refusing CNI_NETNS {netns} of pod {pod}: {reason}")]
    InvalidNetns {
        /// `namespace/name`.
        pod: String,
        /// The path as the runtime sent it.
        netns: String,
        /// Why.
        reason: NetnsRefusal,
    },
    /// A running pod's network namespace cannot be found or opened.
    #[error("cannot find the network namespace of pod {pod}: {reason}")]
    Netns {
        /// `namespace/name`.
        pod: String,
        /// Why.
        reason: NetnsLookup,
    },
    /// Capture could not be installed or removed.
    #[error("traffic capture for pod {pod} failed: {source}")]
    Capture {
        /// `namespace/name`.
        pod: String,
        /// Why.
        #[source]
        source: CaptureError,
    },
    /// The node proxy did not take the pod.
    #[error(transparent)]
    Proxy(#[from] ZdsError),
}

/// Why a running pod's network namespace was not found through `/proc`.
#[derive(Debug, thiserror::Error)]
pub enum NetnsLookup {
    /// No process of the pod holds one of its addresses.
    #[error("no process of the pod found in /proc (is the pod running?)")]
    NotRunning,
    /// The pod's processes are there, but their namespaces may not be read.
    #[error(
        "the network namespace of the pod's {0} process(es) in /proc cannot be read (permission denied): \
         the agent needs CAP_SYS_PTRACE to read other processes' namespaces"
    )]
    Refused(usize),
    /// Found, but it does not open as a network namespace.
    #[error(transparent)]
    Open(#[from] NetnsError),
    /// The pod's processes run in the agent's or the host's namespace.
    #[error("its processes run in {0}")]
    Host(String),
}

impl MeshError {
    /// Whether trying again later can succeed (the event server answers 503 for these).
    pub fn retryable(&self) -> bool {
        matches!(self, MeshError::Proxy(_) | MeshError::UnknownPod(_))
    }
}

/// Where the agent finds things on the host.
#[derive(Clone, Debug)]
pub struct HostPaths {
    /// Prefix for netns paths from the CNI runtime (`/host` in a container, else empty).
    pub netns_prefix: PathBuf,
    /// The host's `/proc`.
    pub proc_root: PathBuf,
    /// Namespaces no pod may have: the agent's own and the host's.
    pub host_namespaces: HostNamespaces,
}

/// The agent's core state and operations.
pub struct Mesh {
    enrollment: Enrollment,
    zds: Arc<ZdsServer>,
    capture: Arc<dyn Capture>,
    annotations: Arc<Annotations>,
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
    /// A mesh core with empty caches; annotations are written through `annotations` (whose
    /// worker the caller runs).
    pub fn new(
        enrollment: Enrollment,
        zds: Arc<ZdsServer>,
        capture: Arc<dyn Capture>,
        annotations: Arc<Annotations>,
        paths: HostPaths,
    ) -> Arc<Mesh> {
        Arc::new(Mesh {
            enrollment,
            zds,
            capture,
            annotations,
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

    /// The uid of the pod stored under this namespace and name.
    pub fn uid_of(&self, namespace: &str, name: &str) -> Option<String> {
        self.lock().by_name.get(&(namespace.to_owned(), name.to_owned())).cloned()
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
        // Nothing to report on a pod that is gone.
        self.annotations.forget(uid);
        if was_enrolled {
            self.remove_from_mesh(uid, pod.as_ref(), Removal::Deleted).await?;
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
                let netns = self.find_netns(&pod).map_err(|reason| MeshError::Netns {
                    pod: format!("{}/{}", pod.namespace, pod.name),
                    reason,
                })?;
                self.add_to_mesh(&pod, netns, false).await
            }
            Decision::Enroll => self.repair_capture(uid, &pod).await,
            Decision::Skip(reason) if enrolled => {
                tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), ?reason, "releasing pod from the mesh");
                let removal = if pod.phase.is_terminal() { Removal::Terminated } else { Removal::Released };
                self.remove_from_mesh(uid, Some(&pod), removal).await
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
            .unwrap_or_else(|e| Err(CaptureError::Task(e.to_string())))
            .map_err(|source| MeshError::Capture { pod: name.clone(), source })?;
        if !drift.is_empty() {
            tracing::warn!(pod = %name, ?drift, "capture drifted; re-applied");
        }
        Ok(())
    }

    /// A CNI ADD: looks the pod up (waiting briefly for the pod source to catch up), and
    /// enrolls it from the runtime's netns path when it must be enrolled. The event's form was
    /// checked when it was parsed ([`PluginEvent::parse`]); what is at the path is checked here,
    /// before anything enters it (see [`crate::podns`]).
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
        let ips = ev.pod_ips();
        if !ips.is_empty() {
            pod.ips = ips;
        }
        let path = crate::podns::host_path(&self.paths.netns_prefix, &ev.netns);
        let netns =
            self.paths.host_namespaces.open_pod_netns(&path).map_err(|reason| MeshError::InvalidNetns {
                pod: format!("{}/{}", pod.namespace, pod.name),
                netns: ev.netns.clone(),
                reason,
            })?;
        self.add_to_mesh(&pod, netns, true).await?;
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

    /// Captures the pod and hands it to the proxy. `from_cni`: a CNI ADD (the sandbox has not
    /// started; on failure nothing is left behind), else a running pod being enrolled.
    async fn add_to_mesh(&self, pod: &Pod, netns: Netns, from_cni: bool) -> Result<(), MeshError> {
        let name = format!("{}/{}", pod.namespace, pod.name);
        let netns = Arc::new(netns);
        let (capture, fd, p) = (self.capture.clone(), netns.clone(), pod.clone());
        let applied = tokio::task::spawn_blocking(move || capture.apply(&fd, &p))
            .await
            .unwrap_or_else(|e| Err(CaptureError::Task(e.to_string())));
        if let Err(source) = applied {
            // Leave nothing half-applied.
            let (capture, fd) = (self.capture.clone(), netns.clone());
            let _ = tokio::task::spawn_blocking(move || capture.remove(&fd)).await;
            return Err(MeshError::Capture { pod: name, source });
        }
        let info = WorkloadInfo {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
        };
        let entry = PodEntry { uid: pod.uid.clone(), info: info.clone(), netns: Some(netns.clone()) };
        if let Err(e) = self.zds.add(entry).await {
            if from_cni {
                // CNI ADD: the pod has not started and the runtime retries the whole sandbox,
                // so leave nothing behind in this namespace.
                let (capture, fd) = (self.capture.clone(), netns.clone());
                let _ = tokio::task::spawn_blocking(move || capture.remove(&fd)).await;
            } else {
                // A running pod being enrolled keeps its capture while the proxy is missing:
                // its traffic stops rather than bypassing the mesh (fail closed); retried.
                self.annotations.set(pod, Some("pending"));
            }
            return Err(e.into());
        }
        self.lock().enrolled.insert(pod.uid.clone(), Enrolled { info, netns: Some(netns) });
        if let Err(error) = self.capture.host_add(pod) {
            tracing::warn!(pod = %name, %error, "probe SNAT entry not added; kubelet probes may be refused under STRICT mTLS");
        }
        // A report only: written (and retried) by the annotation worker, never failing the ADD.
        self.annotations.set(pod, Some("enabled"));
        tracing::info!(pod = %name, "pod added to the mesh");
        Ok(())
    }

    async fn remove_from_mesh(
        &self,
        uid: &str,
        pod: Option<&Pod>,
        removal: Removal,
    ) -> Result<(), MeshError> {
        let name = pod.map(|p| format!("{}/{}", p.namespace, p.name)).unwrap_or_else(|| uid.to_owned());
        let netns = self.lock().enrolled.get(uid).and_then(|e| e.netns.clone());
        if removal == Removal::Released
            && let Some(fd) = netns
        {
            let capture = self.capture.clone();
            tokio::task::spawn_blocking(move || capture.remove(&fd))
                .await
                .unwrap_or_else(|e| Err(CaptureError::Task(e.to_string())))
                .map_err(|source| MeshError::Capture { pod: name.clone(), source })?;
        }
        self.zds.del(uid).await?;
        self.lock().enrolled.remove(uid);
        if let Some(p) = pod
            && let Err(error) = self.capture.host_remove(p)
        {
            tracing::warn!(pod = %name, %error, "probe SNAT entry not removed");
        }
        if let Some(p) = pod
            && removal != Removal::Deleted
        {
            self.annotations.set(p, None);
        }
        tracing::info!(pod = %name, "pod removed from the mesh");
        Ok(())
    }

    /// Finds a running pod's netns through its processes (pods enrolled after they started).
    fn find_netns(&self, pod: &Pod) -> Result<Netns, NetnsLookup> {
        let wanted: HashSet<String> = [pod.uid.clone()].into();
        let ips = pod.ips.clone();
        let found = crate::procfs::scan(&self.paths.proc_root, &wanted, |_, netns_path| {
            let pid_dir = netns_path.parent().and_then(Path::parent).unwrap_or(netns_path);
            let local = crate::addrs::local_addresses(pid_dir);
            ips.iter().any(|ip| local.contains(ip))
        });
        let f = match found.found.get(&pod.uid) {
            Some(f) => f,
            None if found.refused > 0 => return Err(NetnsLookup::Refused(found.refused)),
            None => return Err(NetnsLookup::NotRunning),
        };
        let netns = Netns::open(&f.netns_path)?;
        match self.paths.host_namespaces.which(netns.id()) {
            Some(what) => Err(NetnsLookup::Host(what.to_owned())),
            None => Ok(netns),
        }
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
        self.capture
            .apply(&netns, &pod)
            .map_err(|source| MeshError::Capture { pod: name.clone(), source })?;
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
}

impl Mesh {
    /// The enrollment cache the CNI plugin reads when the agent is down (`ambit_cni::cache`):
    /// namespaces with whether pods there may be enrolled, and enrolled pods.
    pub fn enrollment_cache(&self) -> EnrollmentCache {
        let st = self.lock();
        // Namespaces where some pod is selected by its own labels: its siblings (e.g. a new
        // replica created while the agent is down) likely carry the same labels. One pass over
        // the pods; this runs on every turn of the source loop.
        let by_pod_label: HashSet<&str> = st
            .pods
            .values()
            .filter(|p| self.enrollment.system.role(p).is_none())
            .filter(|p| st.namespaces.get(&p.namespace).is_some_and(|ns| self.enrollment.selected(p, ns)))
            .map(|p| p.namespace.as_str())
            .collect();
        let namespaces = st
            .namespaces
            .values()
            .map(|ns| {
                let may_enroll = !self.enrollment.excluded_namespaces.contains(&ns.name)
                    && (self.enrollment.namespace_enrolls(ns) || by_pod_label.contains(ns.name.as_str()));
                (ns.name.clone(), may_enroll)
            })
            .collect();
        let enrolled_pods = st
            .enrolled
            .keys()
            .filter_map(|uid| st.pods.get(uid))
            .map(|p| EnrollmentCache::pod_key(&p.namespace, &p.name))
            .collect();
        EnrollmentCache { namespaces, enrolled_pods }
    }

    /// The node's own pods among the known ones (the agent's and the proxy's), with their
    /// `generateName`: what the plugin needs to admit their replacements without an agent.
    pub fn system_pods(&self) -> Vec<ambit_cni::SystemPod> {
        let st = self.lock();
        let mut found: Vec<ambit_cni::SystemPod> = st
            .pods
            .values()
            .filter(|p| !p.generate_name.is_empty())
            .filter_map(|p| {
                Some(ambit_cni::SystemPod {
                    role: self.enrollment.system.role(p)?,
                    namespace: p.namespace.clone(),
                    generate_name: p.generate_name.clone(),
                })
            })
            .collect();
        found.sort();
        found.dedup();
        found
    }
}

/// How a pod leaves the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Removal {
    /// It stays but is no longer enrolled: its rules are removed.
    Released,
    /// It terminated: its netns may be gone, rules are left alone; the annotation is removed.
    Terminated,
    /// The pod object is gone: nothing to remove in its netns, nothing to annotate.
    Deleted,
}
