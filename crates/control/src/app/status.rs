//! istiod's status conditions on the objects (Kubernetes source, `AMBIENT_ENABLE_STATUS`):
//! `ZtunnelAccepted` on every AuthorizationPolicy, with istiod's reasons and messages, from
//! the same evaluation the rest of Ambit reports ([`crate::translate::explain`]).
//!
//! The translation thread hands over the whole wanted set after each batch that touched a
//! policy; one task writes what differs from what it last wrote (a JSON merge patch of
//! `status`), and tries again what failed a few seconds later. Writing a status is itself a
//! change the watch delivers; it leaves the wanted set as it was, so nothing is written twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ambit_objects::istio::AuthorizationPolicy;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::translate::explain::{Accepted, Conditions, ZTUNNEL_ACCEPTED};

/// How long a failed write waits before it is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// Hands the wanted conditions to the writer.
pub struct StatusWriter(watch::Sender<Arc<Conditions>>);

impl StatusWriter {
    /// Starts the writer on the current runtime.
    pub fn spawn(client: kube::Client) -> StatusWriter {
        let (tx, rx) = watch::channel(Arc::new(Conditions::new()));
        tokio::spawn(run(client, rx));
        StatusWriter(tx)
    }

    /// The conditions every AuthorizationPolicy should carry now.
    pub fn want(&self, conditions: Conditions) {
        self.0.send_if_modified(|old| {
            let changed = **old != conditions;
            if changed {
                *old = Arc::new(conditions);
            }
            changed
        });
    }
}

async fn run(client: kube::Client, mut rx: watch::Receiver<Arc<Conditions>>) {
    let mut written: BTreeMap<(String, String), (i64, Option<Accepted>)> = BTreeMap::new();
    let mut pending = false;
    // The error last logged: a refusal that lasts (RBAC) is logged once, not every retry.
    let mut logged: Option<String> = None;
    loop {
        if pending {
            // A failed write is tried again after RETRY, or sooner when the set changes.
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
            match write(&client, namespace, name, value.0, value.1.as_ref()).await {
                Ok(()) => {
                    written.insert(key.clone(), value.clone());
                    if logged.take().is_some() {
                        tracing::info!("{ZTUNNEL_ACCEPTED} conditions are written again");
                    }
                }
                // Deleted meanwhile: its removal will arrive as a change.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    let error = e.to_string();
                    if logged.as_deref() != Some(error.as_str()) {
                        tracing::warn!(
                            policy = %format!("{namespace}/{name}"),
                            "cannot write the {ZTUNNEL_ACCEPTED} condition ({error}); trying again every {RETRY:?}"
                        );
                        logged = Some(error);
                    }
                    pending = true;
                }
            }
        }
    }
}

/// Patches one policy's status: its condition, or no conditions where istiod writes none.
async fn write(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    generation: i64,
    accepted: Option<&Accepted>,
) -> Result<(), kube::Error> {
    let api: Api<AuthorizationPolicy> = Api::namespaced(client.clone(), namespace);
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch(generation, accepted))).await?;
    Ok(())
}

/// The merge patch for one policy (istiod's condition shape: the generation as a string, as
/// Istio's status protos encode an int64).
fn patch(generation: i64, accepted: Option<&Accepted>) -> Value {
    let conditions = accepted.map(|a| {
        json!([{
            "type": ZTUNNEL_ACCEPTED,
            "status": if a.status { "True" } else { "False" },
            "reason": a.reason,
            "message": a.message,
            "observedGeneration": generation.to_string(),
            "lastTransitionTime": ambit_identity::rfc3339(SystemTime::now()),
        }])
    });
    json!({ "status": { "conditions": conditions } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_is_istiods_condition() {
        let a = Accepted { status: true, reason: "Accepted".into(), message: "attached to ztunnel".into() };
        let mut p = patch(3, Some(&a));
        let time = p["status"]["conditions"][0]["lastTransitionTime"].take();
        assert!(time.as_str().is_some_and(|t| t.ends_with('Z') && t.len() == 20), "{time}");
        assert_eq!(
            p,
            json!({"status": {"conditions": [{"type": "ZtunnelAccepted", "status": "True", "reason": "Accepted",
                "message": "attached to ztunnel", "observedGeneration": "3", "lastTransitionTime": null}]}})
        );
        assert_eq!(patch(1, None), json!({"status": {"conditions": null}}));
    }
}
