//! The `ambient.istio.io/redirection` annotation: a report of what the agent did to a pod
//! (`enabled`, `pending`, removed), never part of the decision whether a pod may start.
//!
//! The mesh core records the value it wants on a pod ([`Annotations::set`]) and goes on: a CNI
//! ADD answers as soon as capture is installed and the proxy acked, whatever the API server says
//! about the patch. One worker ([`Annotations::run`]) writes the wanted values through the
//! [`Annotate`] seam, one pod at a time and in the order they were wanted, each patch bounded by
//! a timeout. A refused or failed patch is counted (`ambit_agent_annotation_failures_total`),
//! logged with what the operator must grant, and retried with exponential backoff (1 s doubling
//! to 60 s by default) until it succeeds, a newer value replaces it, or the pod is deleted.
//!
//! istio-cni patches synchronously and fails the ADD when the patch fails; a missing RBAC verb
//! then turns every enrolled pod's sandbox into a retry loop, each attempt leaving capture and
//! proxy state behind. We differ on purpose (see ARCHITECTURE.md).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use ambit_objects::file::{CaptureError, CaptureState, CapturedPod};
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::model::Pod;

/// Writes the agent's view onto the pod object (Kubernetes: a `pods/status` merge patch).
pub trait Annotate: Send + Sync + 'static {
    /// Sets `ambient.istio.io/redirection` to `value`, or removes it (`None`).
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> BoxFuture<'static, Result<(), AnnotateError>>;

    /// The pod was deleted: forget whatever was written for it (where that is not the pod itself).
    fn forget(&self, _uid: &str) {}
}

/// Why an annotation could not be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotateError {
    /// The API server refused the request (401/403): a permission is missing.
    #[error(
        "the API server refused to patch pods/status of pod {pod} ({code}: {message}); grant the \
         agent's service account the verb `patch` on the resource `pods/status`"
    )]
    Refused {
        /// `namespace/name`.
        pod: String,
        /// The HTTP status.
        code: u16,
        /// The API server's message.
        message: String,
    },
    /// The API server answered with another error status.
    #[error("the API server failed to patch pods/status of pod {pod} ({code}: {message})")]
    Status {
        /// `namespace/name`.
        pod: String,
        /// The HTTP status.
        code: u16,
        /// The API server's message.
        message: String,
    },
    /// The request did not get an answer (connection, TLS, decoding).
    #[error("patching pods/status of pod {pod} failed: {detail}")]
    Transport {
        /// `namespace/name`.
        pod: String,
        /// What happened.
        detail: String,
    },
    /// Local mode: the capture-state file could not be written.
    #[error("cannot write the capture state for pod {pod}: {detail}")]
    CaptureState {
        /// `namespace/name`.
        pod: String,
        /// Why.
        detail: String,
    },
    /// No answer within the patch timeout.
    #[error("patching pods/status of pod {pod} got no answer within {after:?}")]
    Timeout {
        /// `namespace/name`.
        pod: String,
        /// The timeout.
        after: Duration,
    },
}

/// Local mode has no API to patch: the redirection state is logged.
pub struct LogAnnotate;

impl Annotate for LogAnnotate {
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> BoxFuture<'static, Result<(), AnnotateError>> {
        tracing::debug!(pod = %format!("{}/{}", pod.namespace, pod.name), redirection = value.unwrap_or("(removed)"),
            "ambient.istio.io/redirection");
        Box::pin(async { Ok(()) })
    }
}

/// Local mode with a capture-state folder: the value is written to `<dir>/<node>.json`
/// ([`ambit_objects::file::CaptureState`], atomically), where the control plane's file source
/// lays it over the pod as the annotation. The pods' YAML files are the operator's and are never
/// rewritten.
pub struct FileAnnotate {
    dir: PathBuf,
    state: Mutex<CaptureState>,
}

impl FileAnnotate {
    /// Writes `<dir>/<node>.json`, keeping what an earlier agent on this node wrote there (its
    /// pods keep their value across a restart; see [`FileAnnotate::retain`]).
    pub fn new(dir: &Path, node: &str) -> Result<FileAnnotate, CaptureError> {
        let path = CaptureState::path(dir, node)?;
        let earlier = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<CaptureState>(&b).ok())
            .filter(|s| s.node == node);
        let state = earlier.unwrap_or_else(|| CaptureState::new(node));
        state.write(dir)?;
        Ok(FileAnnotate { dir: dir.to_owned(), state: Mutex::new(state) })
    }

    /// Drops the entries of pods not in `uids` (deleted while no agent ran).
    pub fn retain(&self, uids: &HashSet<String>) -> Result<(), CaptureError> {
        let mut st = self.lock();
        let before = st.pods.len();
        st.pods.retain(|p| uids.contains(&p.uid));
        if st.pods.len() == before { Ok(()) } else { st.write(&self.dir) }
    }

    fn lock(&self) -> MutexGuard<'_, CaptureState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Annotate for FileAnnotate {
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> BoxFuture<'static, Result<(), AnnotateError>> {
        let mut st = self.lock();
        st.pods.retain(|p| p.uid != pod.uid);
        if let Some(v) = value {
            st.pods.push(CapturedPod {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                redirection: v.to_owned(),
            });
        }
        let result = st.write(&self.dir).map_err(|e| AnnotateError::CaptureState {
            pod: format!("{}/{}", pod.namespace, pod.name),
            detail: e.to_string(),
        });
        Box::pin(async move { result })
    }

    fn forget(&self, uid: &str) {
        let mut st = self.lock();
        let before = st.pods.len();
        st.pods.retain(|p| p.uid != uid);
        if st.pods.len() != before
            && let Err(error) = st.write(&self.dir)
        {
            tracing::warn!(%error, "cannot remove a deleted pod from the capture state");
        }
    }
}

/// Retry timing of failed patches.
#[derive(Clone, Copy, Debug)]
pub struct Retry {
    /// Wait after the first failure; doubles per failure up to `max`.
    pub first: Duration,
    /// Longest wait between two attempts.
    pub max: Duration,
    /// Longest wait for one patch's answer.
    pub timeout: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            first: Duration::from_secs(1),
            max: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
        }
    }
}

/// The wanted annotations and the worker that writes them.
pub struct Annotations {
    annotate: Arc<dyn Annotate>,
    retry: Retry,
    failures: Counter,
    wanted: Mutex<Wanted>,
    wake: Notify,
}

#[derive(Default)]
struct Wanted {
    by_uid: HashMap<String, Want>,
    /// Bumped on every `set`, so a finished patch only clears the value it wrote.
    next_generation: u64,
}

struct Want {
    pod: Pod,
    value: Option<&'static str>,
    generation: u64,
    failures: u32,
    due: Instant,
}

impl Annotations {
    /// Writes through `annotate`; `failures` counts failed patches.
    pub fn new(annotate: Arc<dyn Annotate>, retry: Retry, failures: Counter) -> Arc<Annotations> {
        Arc::new(Annotations {
            annotate,
            retry,
            failures,
            wanted: Mutex::new(Wanted::default()),
            wake: Notify::new(),
        })
    }

    /// Wants `value` on `pod` (replacing a value not written yet); the worker writes it soon.
    pub fn set(&self, pod: &Pod, value: Option<&'static str>) {
        let mut w = self.lock();
        w.next_generation += 1;
        let generation = w.next_generation;
        w.by_uid.insert(
            pod.uid.clone(),
            Want { pod: pod.clone(), value, generation, failures: 0, due: Instant::now() },
        );
        drop(w);
        self.wake.notify_one();
    }

    /// Drops whatever was wanted on a deleted pod.
    pub fn forget(&self, uid: &str) {
        self.lock().by_uid.remove(uid);
        self.annotate.forget(uid);
    }

    /// Pods whose wanted annotation is not written yet.
    pub fn pending(&self) -> usize {
        self.lock().by_uid.len()
    }

    /// Failed patches so far.
    pub fn failures(&self) -> u64 {
        self.failures.get()
    }

    /// Writes wanted values forever, retrying failures (see the module documentation).
    pub async fn run(self: Arc<Self>) {
        loop {
            let next = {
                let w = self.lock();
                w.by_uid
                    .iter()
                    .min_by_key(|(_, want)| (want.due, want.generation))
                    .map(|(uid, want)| (uid.clone(), want.due))
            };
            let Some((uid, due)) = next else {
                self.wake.notified().await;
                continue;
            };
            if due > Instant::now() {
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => {}
                    _ = self.wake.notified() => {}
                }
                continue;
            }
            self.write(&uid).await;
        }
    }

    async fn write(&self, uid: &str) {
        let Some((pod, value, generation)) =
            self.lock().by_uid.get(uid).map(|w| (w.pod.clone(), w.value, w.generation))
        else {
            return;
        };
        let name = format!("{}/{}", pod.namespace, pod.name);
        let timeout = self.retry.timeout;
        let result = match tokio::time::timeout(timeout, self.annotate.set_redirection(&pod, value)).await {
            Ok(r) => r,
            Err(_) => Err(AnnotateError::Timeout { pod: name.clone(), after: timeout }),
        };
        let mut w = self.lock();
        let Some(want) = w.by_uid.get_mut(uid) else { return };
        if want.generation != generation {
            return; // a newer value is wanted; it is due now
        }
        match result {
            Ok(()) => {
                if want.failures > 0 {
                    tracing::info!(pod = %name, redirection = value.unwrap_or("(removed)"), failures = want.failures,
                        "annotation written after earlier failures");
                }
                w.by_uid.remove(uid);
            }
            Err(error) => {
                self.failures.inc();
                want.failures = want.failures.saturating_add(1);
                let wait = backoff(self.retry, want.failures);
                want.due = Instant::now() + wait;
                tracing::warn!(pod = %name, redirection = value.unwrap_or("(removed)"), %error,
                    failures = want.failures, retry_in = ?wait,
                    "cannot write the redirection annotation; the pod is in the mesh regardless, retrying");
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Wanted> {
        self.wanted.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Wait after the `failures`-th failure.
fn backoff(retry: Retry, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    retry.first.saturating_mul(1 << doublings).min(retry.max)
}

#[cfg(test)]
mod tests;
