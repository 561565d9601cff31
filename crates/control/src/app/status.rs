//! istiod's status conditions on the objects (Kubernetes source, `AMBIENT_ENABLE_STATUS`):
//! `ZtunnelAccepted` on every AuthorizationPolicy, with istiod's reasons and messages, from
//! the same evaluation the rest of Ambit reports ([`crate::translate::explain`]).
//!
//! The translation thread hands over the whole wanted set after each batch that touched a
//! policy; the writer ([`super::writer`]) writes what differs (a JSON merge patch of `status`)
//! and tries again what failed. Writing a status is itself a change the watch delivers; it
//! leaves the wanted set as it was, so nothing is written twice.

use std::time::SystemTime;

use ambit_objects::istio::AuthorizationPolicy;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::writer::{Messages, Writer};
use crate::translate::explain::{Accepted, Conditions, ZTUNNEL_ACCEPTED};

/// Hands the wanted conditions to the writer.
pub struct StatusWriter(Writer<(i64, Option<Accepted>)>);

impl StatusWriter {
    /// Starts the writer on the current runtime.
    pub fn spawn(client: kube::Client) -> StatusWriter {
        let messages = Messages {
            action: "write the ZtunnelAccepted condition",
            field: "AuthorizationPolicy",
            recovered: "ZtunnelAccepted conditions are written again",
        };
        StatusWriter(Writer::spawn(
            messages,
            move |namespace: String, name: String, (generation, accepted): (i64, Option<Accepted>)| {
                let client = client.clone();
                async move { write(&client, &namespace, &name, generation, accepted.as_ref()).await }
            },
        ))
    }

    /// The conditions every AuthorizationPolicy should carry now.
    pub fn want(&self, conditions: Conditions) {
        self.0.want(conditions);
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
