//! The Kubernetes source: watches this node's pods (`spec.nodeName=<NODE_NAME>`; the node name is
//! required, so the agent never watches, or enrolls, the whole cluster's pods) and all
//! namespaces with kube-rs reflectors, and writes the `ambient.istio.io/redirection` annotation
//! through the `pods/status` subresource (the narrowest permission that can).
//!
//! Start-up is observable and bounded: [`KubeSource::synced`] waits for both initial lists,
//! reports what it is waiting for (and the last error) to a callback that feeds `/readyz`, and
//! fails at once, naming the resource and the verb, when the API server refuses the agent's
//! credentials or permissions (401/403), or after `timeout`. A refusal later on (RBAC removed
//! while the agent runs) resolves [`KubeSource::failed`]. Other errors (connection refused, 5xx)
//! are retried with kube-rs's backoff; a watch that ends or expires (410 Gone) relists.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1 as k8s;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};

use crate::annotate::{Annotate, AnnotateError};
use crate::enroll::REDIRECTION;
use crate::model::{Namespace, Pod};
use crate::source::Inventory;

/// Reflectors of this node's pods and of namespaces.
pub struct KubeSource {
    pods: Store<k8s::Pod>,
    namespaces: Store<k8s::Namespace>,
    pod_watch: Arc<WatchState>,
    namespace_watch: Arc<WatchState>,
    changed: Arc<AtomicBool>,
    fatal: watch::Receiver<Option<KubeSourceError>>,
}

/// Why the Kubernetes source cannot serve the agent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KubeSourceError {
    /// 403: a permission is missing.
    #[error(
        "the Kubernetes API server refused to {verb} {resource} (403 {reason}: {message}); grant the \
         agent's service account the verbs get, list and watch on pods and namespaces (a ClusterRole \
         bound to it), and patch on pods/status"
    )]
    Forbidden {
        /// `pods` or `namespaces`.
        resource: &'static str,
        /// `list` or `watch`.
        verb: &'static str,
        /// The API server's reason.
        reason: String,
        /// The API server's message.
        message: String,
    },
    /// 401: the credentials are not accepted.
    #[error(
        "the Kubernetes API server did not accept the agent's credentials to {verb} {resource} (401: \
         {message}); check the service account token or the kubeconfig"
    )]
    Unauthorized {
        /// `pods` or `namespaces`.
        resource: &'static str,
        /// `list` or `watch`.
        verb: &'static str,
        /// The API server's message.
        message: String,
    },
    /// The initial lists did not complete in time.
    #[error(
        "the initial list of {pending} from the Kubernetes API server did not complete within {after:?}{last}"
    )]
    SyncTimeout {
        /// What was still missing.
        pending: String,
        /// The timeout.
        after: Duration,
        /// `; last error: …`, or empty.
        last: String,
    },
    /// A watch task ended (the runtime is shutting down).
    #[error("the {0} watch stopped")]
    Ended(&'static str),
}

/// What one watch has done so far.
#[derive(Default)]
struct WatchState {
    listed: AtomicBool,
    last_error: Mutex<Option<String>>,
    progress: Notify,
}

/// How often [`KubeSource::synced`] refreshes its report while it waits.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

impl KubeSource {
    /// Starts the watches of `node_name`'s pods and of all namespaces (they list, then watch,
    /// in the background); see [`KubeSource::synced`].
    pub fn start(client: kube::Client, node_name: &str) -> KubeSource {
        let changed = Arc::new(AtomicBool::new(true));
        let (fatal_tx, fatal) = watch::channel(None);
        let fatal_tx = Arc::new(fatal_tx);
        let pod_cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let pod_watch = Arc::new(WatchState::default());
        let namespace_watch = Arc::new(WatchState::default());
        let pods = reflect(
            Api::<k8s::Pod>::all(client.clone()),
            pod_cfg,
            Reporter {
                changed: changed.clone(),
                state: pod_watch.clone(),
                fatal: fatal_tx.clone(),
                what: "pods",
            },
        );
        let namespaces = reflect(
            Api::<k8s::Namespace>::all(client),
            watcher::Config::default(),
            Reporter {
                changed: changed.clone(),
                state: namespace_watch.clone(),
                fatal: fatal_tx,
                what: "namespaces",
            },
        );
        KubeSource { pods, namespaces, pod_watch, namespace_watch, changed, fatal }
    }

    /// Waits until both watches have listed once. `progress` is called at once and then every
    /// 250 ms with what is still awaited (and the last error); a 401/403 fails at once, and so
    /// does `timeout` passing.
    pub async fn synced(
        &self,
        timeout: Duration,
        mut progress: impl FnMut(&str),
    ) -> Result<(), KubeSourceError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut fatal = self.fatal.clone();
        loop {
            if let Some(e) = fatal.borrow_and_update().clone() {
                return Err(e);
            }
            let pending = self.pending();
            if pending.is_empty() {
                return Ok(());
            }
            let last = self.last_error().map(|e| format!("; last error: {e}")).unwrap_or_default();
            progress(&format!(
                "waiting for the initial list of {} from the Kubernetes API server{last}",
                pending.join(" and ")
            ));
            tokio::select! {
                r = fatal.changed() => {
                    if r.is_err() {
                        return Err(KubeSourceError::Ended(pending[0]));
                    }
                }
                _ = self.pod_watch.progress.notified() => {}
                _ = self.namespace_watch.progress.notified() => {}
                _ = tokio::time::sleep(PROGRESS_EVERY) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(KubeSourceError::SyncTimeout { pending: pending.join(" and "), after: timeout, last });
                }
            }
        }
    }

    /// Resolves when the API server refuses the agent (401/403) after start-up.
    pub async fn failed(&self) -> KubeSourceError {
        let mut fatal = self.fatal.clone();
        match fatal.wait_for(Option::is_some).await {
            Ok(e) => e.clone().unwrap_or(KubeSourceError::Ended("pods")),
            Err(_) => {
                // The reporters are gone: the runtime is shutting down.
                std::future::pending::<()>().await;
                KubeSourceError::Ended("pods")
            }
        }
    }

    /// The current inventory if anything changed since the last call.
    pub fn poll(&mut self) -> Option<Inventory> {
        if !self.changed.swap(false, Ordering::AcqRel) {
            return None;
        }
        Some(inventory(&self.pods.state(), &self.namespaces.state()))
    }

    fn pending(&self) -> Vec<&'static str> {
        let mut pending = Vec::new();
        if !self.pod_watch.listed.load(Ordering::Acquire) {
            pending.push("pods");
        }
        if !self.namespace_watch.listed.load(Ordering::Acquire) {
            pending.push("namespaces");
        }
        pending
    }

    fn last_error(&self) -> Option<String> {
        [&self.pod_watch, &self.namespace_watch]
            .iter()
            .find_map(|w| w.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// Where a watch task reports.
struct Reporter {
    changed: Arc<AtomicBool>,
    state: Arc<WatchState>,
    fatal: Arc<watch::Sender<Option<KubeSourceError>>>,
    what: &'static str,
}

impl Reporter {
    fn event<K>(&self, ev: &watcher::Event<K>) {
        self.changed.store(true, Ordering::Release);
        if matches!(ev, watcher::Event::InitDone) {
            if !self.state.listed.swap(true, Ordering::AcqRel) {
                tracing::info!(watch = self.what, "initial list from the Kubernetes API server done");
            }
            *self.state.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
            self.state.progress.notify_waiters();
        }
    }

    fn error(&self, e: &watcher::Error) {
        if let Some(fatal) = refusal(e, self.what) {
            tracing::error!(watch = self.what, error = %fatal, "the Kubernetes API server refuses the agent");
            self.fatal.send_replace(Some(fatal));
        } else {
            tracing::warn!(watch = self.what, error = %e, "Kubernetes watch error; retrying with backoff");
        }
        *self.state.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        self.state.progress.notify_waiters();
    }
}

fn reflect<K>(api: Api<K>, cfg: watcher::Config, reporter: Reporter) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, cfg).default_backoff());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => reporter.event(&ev),
                Err(e) => reporter.error(&e),
            }
        }
    });
    reader
}

/// A 401/403 from the API server, with the verb that was refused.
fn refusal(e: &watcher::Error, resource: &'static str) -> Option<KubeSourceError> {
    let (verb, status) = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s)) => ("list", s.as_ref()),
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => ("watch", s.as_ref()),
        watcher::Error::WatchError(s) => ("watch", s.as_ref()),
        _ => return None,
    };
    match status.code {
        401 => Some(KubeSourceError::Unauthorized { resource, verb, message: status.message.clone() }),
        403 => Some(KubeSourceError::Forbidden {
            resource,
            verb,
            reason: status.reason.clone(),
            message: status.message.clone(),
        }),
        _ => None,
    }
}

/// Converts API objects into the agent's model; objects that do not parse are skipped.
pub fn inventory(pods: &[Arc<k8s::Pod>], namespaces: &[Arc<k8s::Namespace>]) -> Inventory {
    let mut inv = Inventory::default();
    for ns in namespaces {
        match serde_json::to_value(ns.as_ref())
            .map_err(|e| e.to_string())
            .and_then(|v| Namespace::from_value(v).map_err(|e| e.to_string()))
        {
            Ok(n) => {
                inv.namespaces.insert(n.name.clone(), n);
            }
            Err(e) => tracing::warn!(error = %e, "namespace skipped"),
        }
    }
    for p in pods {
        match serde_json::to_value(p.as_ref())
            .map_err(|e| e.to_string())
            .and_then(|v| Pod::from_value(v).map_err(|e| e.to_string()))
        {
            Ok(p) => {
                inv.pods.insert(p.uid.clone(), p);
            }
            Err(e) => tracing::warn!(error = %e, "pod skipped"),
        }
    }
    inv
}

/// Writes the redirection annotation with a merge patch on `pods/status`.
pub struct KubeAnnotate {
    client: kube::Client,
}

impl KubeAnnotate {
    /// Annotates through `client`.
    pub fn new(client: kube::Client) -> KubeAnnotate {
        KubeAnnotate { client }
    }
}

/// The merge patch that sets (or, with `None`, removes) the annotation.
pub fn redirection_patch(value: Option<&str>) -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": { REDIRECTION: value } } })
}

impl Annotate for KubeAnnotate {
    fn set_redirection(
        &self,
        pod: &Pod,
        value: Option<&'static str>,
    ) -> BoxFuture<'static, Result<(), AnnotateError>> {
        let api: Api<k8s::Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let name = pod.name.clone();
        let pod = format!("{}/{}", pod.namespace, pod.name);
        Box::pin(async move {
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(redirection_patch(value)))
                .await
            {
                Ok(_) => Ok(()),
                // The pod is gone: nothing to annotate.
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(kube::Error::Api(s)) if matches!(s.code, 401 | 403) => {
                    Err(AnnotateError::Refused { pod, code: s.code, message: s.message.clone() })
                }
                Err(kube::Error::Api(s)) => {
                    Err(AnnotateError::Status { pod, code: s.code, message: s.message.clone() })
                }
                Err(e) => Err(AnnotateError::Transport { pod, detail: e.to_string() }),
            }
        })
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests;
