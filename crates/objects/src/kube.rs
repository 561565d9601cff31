//! The Kubernetes source: one kube-rs watcher per kind (pods optionally only of one node, with
//! the field selector `spec.nodeName=<node>`), delivering [`Change`]s.
//!
//! Each watcher lists, then watches from the list's resourceVersion, following bookmarks; when
//! the watch ends or expires (`410 Gone`) it lists again, and what the new list no longer holds
//! is delivered as a [`Change::Delete`] (the object vanished while no watch saw it). Objects that
//! come back unchanged (same resourceVersion) in a relist are not delivered again, so a relist of
//! 100 000 pods with one changed is one Upsert.
//!
//! Start-up is observable and bounded: [`KubeSource::synced`] waits for every kind's initial
//! list, reports what it is waiting for (and the last error) to a callback, and fails at once,
//! naming the resource and the verb, when the API server refuses our credentials or permissions
//! (401/403), or after its timeout. A refusal later on (RBAC removed while we run) resolves
//! [`KubeSource::failed`]. Other errors (connection refused, 5xx) are retried with kube-rs's
//! backoff. A kind the API server does not serve (`404` on the list: its CRD is not installed) is
//! logged and counts as listed and empty, and is watched for as it retries.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::gateway::{Gateway, GatewayClass};
use crate::istio::{AuthorizationPolicy, PeerAuthentication, ServiceEntry, WorkloadEntry};
use crate::route::{GrpcRoute, HttpRoute, ReferenceGrant};
use crate::{Change, Filter, Kind, Object, ObjectKey, Source};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Watchers of a set of kinds.
pub struct KubeSource {
    shared: Arc<Shared>,
    watches: Vec<Arc<WatchState>>,
    fatal: watch::Receiver<Option<KubeSourceError>>,
    tasks: Vec<JoinHandle<()>>,
}

/// Why the Kubernetes source cannot serve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KubeSourceError {
    /// 403: a permission is missing.
    #[error("the Kubernetes API server refused to {verb} {resource} (403 {reason}: {message}); {grant}")]
    Forbidden {
        /// The resource (`pods`, `authorizationpolicies.security.istio.io`).
        resource: String,
        /// `list` or `watch`.
        verb: &'static str,
        /// The API server's reason.
        reason: String,
        /// The API server's message.
        message: String,
        /// What to grant (see [`KubeSource::start`]).
        grant: String,
    },
    /// 401: the credentials are not accepted.
    #[error(
        "the Kubernetes API server did not accept the credentials to {verb} {resource} (401: {message}); \
         check the service account token or the kubeconfig"
    )]
    Unauthorized {
        /// The resource.
        resource: String,
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
        /// What was still missing (`pods and namespaces`).
        pending: String,
        /// The timeout.
        after: Duration,
        /// `; last error: …`, or empty.
        last: String,
    },
    /// A watch task ended (the runtime is shutting down).
    #[error("the {0} watch stopped")]
    Ended(String),
}

/// What the watchers share with the source.
struct Shared {
    state: Mutex<State>,
    /// Signalled when changes are queued, a list completes or an error is seen.
    progress: Notify,
    fatal: watch::Sender<Option<KubeSourceError>>,
    grant: String,
}

#[derive(Default)]
struct State {
    /// What the API server holds, as far as delivered.
    objects: HashMap<ObjectKey, Object>,
    /// Changes not polled yet, one per object (the latest wins).
    pending: BTreeMap<ObjectKey, Change>,
}

/// What one kind's watch has done so far.
struct WatchState {
    kind: Kind,
    resource: String,
    listed: AtomicBool,
    last_error: Mutex<Option<String>>,
}

/// How often [`KubeSource::synced`] refreshes its report while it waits.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

impl KubeSource {
    /// Starts one watch per kind `filter` wants (they list, then watch, in the background); see
    /// [`KubeSource::synced`]. `grant` ends a 403's message, telling the operator what to grant;
    /// `None`: "grant the service account the verbs list and watch on … (a ClusterRole bound to
    /// it)" naming every watched resource.
    pub fn start(client: kube::Client, filter: &Filter, grant: Option<String>) -> KubeSource {
        let kinds = filter.wanted();
        let resources: Vec<String> = kinds.iter().map(|k| resource(*k)).collect();
        let grant = grant.unwrap_or_else(|| {
            format!(
                "grant the service account the verbs list and watch on {} (a ClusterRole bound to it)",
                join(&resources)
            )
        });
        let (fatal_tx, fatal) = watch::channel(None);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            progress: Notify::new(),
            fatal: fatal_tx,
            grant,
        });
        let mut watches = Vec::new();
        let mut tasks = Vec::new();
        for (kind, resource) in kinds.into_iter().zip(resources) {
            let w = Arc::new(WatchState {
                kind,
                resource,
                listed: AtomicBool::new(false),
                last_error: Mutex::new(None),
            });
            let mut cfg = watcher::Config::default();
            if let (Kind::Pod, Some(node)) = (kind, &filter.pod_node) {
                cfg = cfg.fields(&format!("spec.nodeName={node}"));
            }
            let (c, s, st) = (client.clone(), shared.clone(), w.clone());
            tasks.push(match kind {
                Kind::Namespace => spawn::<Namespace>(c, cfg, st, s),
                Kind::Node => spawn::<Node>(c, cfg, st, s),
                Kind::Pod => spawn::<Pod>(c, cfg, st, s),
                Kind::Service => spawn::<Service>(c, cfg, st, s),
                Kind::EndpointSlice => spawn::<EndpointSlice>(c, cfg, st, s),
                Kind::ServiceEntry => spawn::<ServiceEntry>(c, cfg, st, s),
                Kind::WorkloadEntry => spawn::<WorkloadEntry>(c, cfg, st, s),
                Kind::AuthorizationPolicy => spawn::<AuthorizationPolicy>(c, cfg, st, s),
                Kind::PeerAuthentication => spawn::<PeerAuthentication>(c, cfg, st, s),
                Kind::Gateway => spawn::<Gateway>(c, cfg, st, s),
                Kind::GatewayClass => spawn::<GatewayClass>(c, cfg, st, s),
                Kind::HttpRoute => spawn::<HttpRoute>(c, cfg, st, s),
                Kind::GrpcRoute => spawn::<GrpcRoute>(c, cfg, st, s),
                Kind::ReferenceGrant => spawn::<ReferenceGrant>(c, cfg, st, s),
            });
            watches.push(w);
        }
        KubeSource { shared, watches, fatal, tasks }
    }

    /// Waits until every watch has listed once. `progress` is called at once and then every
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
            let notified = self.shared.progress.notified();
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
                join(&pending)
            ));
            tokio::select! {
                r = fatal.changed() => {
                    if r.is_err() {
                        return Err(KubeSourceError::Ended(pending[0].clone()));
                    }
                }
                _ = notified => {}
                _ = tokio::time::sleep(PROGRESS_EVERY) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(KubeSourceError::SyncTimeout { pending: join(&pending), after: timeout, last });
                }
            }
        }
    }

    /// Resolves when the API server refuses us (401/403) after start-up.
    pub async fn failed(&self) -> KubeSourceError {
        let mut fatal = self.fatal.clone();
        match fatal.wait_for(Option::is_some).await {
            Ok(e) => e.clone().unwrap_or_else(|| KubeSourceError::Ended("Kubernetes".into())),
            Err(_) => {
                // The sender lives in `shared`, which we hold: not reached.
                std::future::pending::<()>().await;
                KubeSourceError::Ended("Kubernetes".into())
            }
        }
    }

    /// Resolves when changes may be waiting to be polled.
    pub async fn changed(&self) {
        loop {
            let notified = self.shared.progress.notified();
            if !self.shared.lock().pending.is_empty() {
                return;
            }
            notified.await;
        }
    }

    /// The changes since the last call, at most one per object, namespaces first (in
    /// [`Kind`] order).
    pub fn poll(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.shared.lock().pending).into_values().collect()
    }

    fn pending(&self) -> Vec<String> {
        self.watches
            .iter()
            .filter(|w| !w.listed.load(Ordering::Acquire))
            .map(|w| w.resource.clone())
            .collect()
    }

    fn last_error(&self) -> Option<String> {
        self.watches.iter().find_map(|w| lock(&w.last_error).clone())
    }
}

impl Source for KubeSource {
    fn poll(&mut self) -> Vec<Change> {
        KubeSource::poll(self)
    }

    fn is_synced(&self) -> bool {
        self.pending().is_empty()
    }
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// How the API names a kind's resource in RBAC and errors: `pods`, or
/// `authorizationpolicies.security.istio.io` outside the core group.
pub fn resource(kind: Kind) -> String {
    let plural = match kind {
        Kind::Namespace => "namespaces",
        Kind::Node => "nodes",
        Kind::Pod => "pods",
        Kind::Service => "services",
        Kind::EndpointSlice => "endpointslices",
        Kind::ServiceEntry => "serviceentries",
        Kind::WorkloadEntry => "workloadentries",
        Kind::AuthorizationPolicy => "authorizationpolicies",
        Kind::PeerAuthentication => "peerauthentications",
        Kind::Gateway => "gateways",
        Kind::GatewayClass => "gatewayclasses",
        Kind::HttpRoute => "httproutes",
        Kind::GrpcRoute => "grpcroutes",
        Kind::ReferenceGrant => "referencegrants",
    };
    if kind.group().is_empty() { plural.to_owned() } else { format!("{plural}.{}", kind.group()) }
}

/// `a`, `a and b`, `a, b and c`.
fn join(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Stores and queues an object unless it is the version already delivered.
    fn upsert(&self, object: Object) {
        let key = object.key();
        let mut st = self.lock();
        if let Some(old) = st.objects.get(&key) {
            let (a, b) = (&old.metadata().resource_version, &object.metadata().resource_version);
            if a.is_some() && a == b {
                return;
            }
        }
        st.objects.insert(key.clone(), object.clone());
        st.pending.insert(key, Change::Upsert(object));
        drop(st);
        self.progress.notify_waiters();
    }

    fn delete(&self, key: ObjectKey) {
        let mut st = self.lock();
        if st.objects.remove(&key).is_some() {
            st.pending.insert(key.clone(), Change::Delete(key));
        }
        drop(st);
        self.progress.notify_waiters();
    }

    /// After a (re)list: deletes what of `kind` the list did not hold.
    fn keep_only(&self, kind: Kind, listed: &HashSet<ObjectKey>) {
        let mut st = self.lock();
        let gone: Vec<ObjectKey> =
            st.objects.keys().filter(|k| k.kind == kind && !listed.contains(*k)).cloned().collect();
        for key in gone {
            st.objects.remove(&key);
            st.pending.insert(key.clone(), Change::Delete(key));
        }
    }
}

/// Runs one kind's watcher, feeding `shared`.
fn spawn<T>(
    client: kube::Client,
    cfg: watcher::Config,
    state: Arc<WatchState>,
    shared: Arc<Shared>,
) -> JoinHandle<()>
where
    T: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    Object: From<T>,
{
    let api = Api::<T>::all(client);
    tokio::spawn(async move {
        let stream = watcher(api, cfg).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut relist: Option<HashSet<ObjectKey>> = None;
        let mut absent_reported = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => relist = Some(HashSet::new()),
                Ok(watcher::Event::InitApply(o)) => {
                    let o = Object::from(o);
                    if let Some(seen) = &mut relist {
                        seen.insert(o.key());
                    }
                    shared.upsert(o);
                }
                Ok(watcher::Event::InitDone) => {
                    shared.keep_only(state.kind, &relist.take().unwrap_or_default());
                    if !state.listed.swap(true, Ordering::AcqRel) {
                        tracing::info!(resource = %state.resource, "initial list from the Kubernetes API server done");
                    }
                    *lock(&state.last_error) = None;
                    shared.progress.notify_waiters();
                }
                Ok(watcher::Event::Apply(o)) => shared.upsert(Object::from(o)),
                Ok(watcher::Event::Delete(o)) => shared.delete(Object::from(o).key()),
                Err(e) => {
                    if let Some(fatal) = refusal(&e, &state.resource, &shared.grant) {
                        tracing::error!(resource = %state.resource, error = %fatal, "the Kubernetes API server refuses us");
                        shared.fatal.send_replace(Some(fatal));
                    } else if not_served(&e) {
                        // The CRD is not installed: nothing of that kind exists. Keep trying,
                        // so objects appear once it is installed.
                        if !absent_reported {
                            tracing::warn!(resource = %state.resource,
                                "the Kubernetes API server does not serve this resource (404; is its CRD installed?); \
                                 treating it as empty until it does");
                            absent_reported = true;
                        }
                        state.listed.store(true, Ordering::Release);
                    } else {
                        tracing::warn!(resource = %state.resource, error = %e, "Kubernetes watch error; retrying with backoff");
                    }
                    *lock(&state.last_error) = Some(e.to_string());
                    shared.progress.notify_waiters();
                }
            }
        }
    })
}

/// A 404 on the list: the API server does not know the resource.
fn not_served(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

/// A 401/403 from the API server, with the verb that was refused.
fn refusal(e: &watcher::Error, resource: &str, grant: &str) -> Option<KubeSourceError> {
    let (verb, status) = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s)) => ("list", s.as_ref()),
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => ("watch", s.as_ref()),
        watcher::Error::WatchError(s) => ("watch", s.as_ref()),
        _ => return None,
    };
    match status.code {
        401 => Some(KubeSourceError::Unauthorized {
            resource: resource.to_owned(),
            verb,
            message: status.message.clone(),
        }),
        403 => Some(KubeSourceError::Forbidden {
            resource: resource.to_owned(),
            verb,
            reason: status.reason.clone(),
            message: status.message.clone(),
            grant: grant.to_owned(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
