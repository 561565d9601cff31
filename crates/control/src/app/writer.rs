//! The loop both Kubernetes writers of the control plane run ([`super::status`]: conditions on
//! AuthorizationPolicies; [`super::waypoints`]: what waypoint Gateways are deployed as): the
//! translation thread hands over the whole wanted set, keyed by `(namespace, name)`; one task
//! writes what differs from what it last wrote, forgets what is no longer wanted, and tries again
//! what failed after [`RETRY`] (or sooner, when the set changes). A refusal that lasts (RBAC) is
//! logged once, not at every retry; an object deleted meanwhile (404) is left to the change
//! that will say so.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// How long a failed write waits before it is tried again.
pub const RETRY: Duration = Duration::from_secs(5);

/// The wanted set: a value per `(namespace, name)`.
pub type Wanted<V> = BTreeMap<(String, String), V>;

/// Hands the wanted set to its writer task.
pub struct Writer<V>(watch::Sender<Arc<Wanted<V>>>);

/// What the writer says of itself in the log.
pub struct Messages {
    /// What a failed write could not do, e.g. `write the ZtunnelAccepted condition`.
    pub action: &'static str,
    /// The log field naming the object (`policy`, `gateway`).
    pub field: &'static str,
    /// Logged once writes succeed again after a failure.
    pub recovered: &'static str,
}

impl<V: PartialEq + Clone + Send + Sync + 'static> Writer<V> {
    /// Starts the task on the current runtime; `write` writes one object's value.
    pub fn spawn<F, Fut>(messages: Messages, write: F) -> Writer<V>
    where
        F: Fn(String, String, V) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), kube::Error>> + Send + 'static,
    {
        let (tx, rx) = watch::channel(Arc::new(Wanted::new()));
        tokio::spawn(run(rx, messages, write));
        Writer(tx)
    }

    /// The whole set wanted now.
    pub fn want(&self, wanted: Wanted<V>) {
        self.0.send_if_modified(|old| {
            let changed = **old != wanted;
            if changed {
                *old = Arc::new(wanted);
            }
            changed
        });
    }
}

async fn run<V, F, Fut>(mut rx: watch::Receiver<Arc<Wanted<V>>>, messages: Messages, write: F)
where
    V: PartialEq + Clone,
    F: Fn(String, String, V) -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let mut written: Wanted<V> = BTreeMap::new();
    let mut pending = false;
    let mut logged: Option<String> = None;
    loop {
        if pending {
            let _ = tokio::time::timeout(RETRY, rx.changed()).await;
        } else if rx.changed().await.is_err() {
            return;
        }
        let want = rx.borrow_and_update().clone();
        written.retain(|key, _| want.contains_key(key));
        pending = false;
        for (key, value) in want.iter() {
            if written.get(key) == Some(value) {
                continue;
            }
            let (namespace, name) = key;
            match write(namespace.clone(), name.clone(), value.clone()).await {
                Ok(()) => {
                    written.insert(key.clone(), value.clone());
                    if logged.take().is_some() {
                        tracing::info!("{}", messages.recovered);
                    }
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    let error = e.to_string();
                    if logged.as_deref() != Some(error.as_str()) {
                        tracing::warn!(
                            object = %format!("{namespace}/{name}"),
                            kind = messages.field,
                            "cannot {} ({error}); trying again every {RETRY:?}",
                            messages.action
                        );
                        logged = Some(error);
                    }
                    pending = true;
                }
            }
        }
    }
}
