//! The agent on the Kubernetes API: the source of this node's pods and all namespaces
//! (`ambit_objects::kube::KubeSource`, with `spec.nodeName=<NODE_NAME>`; the node name is
//! required, so the agent never watches, or enrolls, the whole cluster's pods), and the
//! `ambient.istio.io/redirection` annotation written through the `pods/status` subresource (the
//! narrowest permission that can).

use ambit_objects::k8s_openapi::api::core::v1 as k8s;
use ambit_objects::kube::KubeSource;
use ambit_objects::{Filter, Kind};
use futures::future::BoxFuture;
use kube::api::{Api, Patch, PatchParams};

use crate::annotate::{Annotate, AnnotateError};
use crate::enroll::REDIRECTION;
use crate::model::Pod;

pub use ambit_objects::kube::KubeSourceError;

/// What a 403 tells the operator to grant the agent.
pub const GRANT: &str = "grant the agent's service account the verbs get, list and watch on pods and namespaces \
     (a ClusterRole bound to it), and patch on pods/status";

/// The objects the agent reads: namespaces, and the pods of `node`.
pub fn filter(node: &str) -> Filter {
    Filter::kinds(&[Kind::Namespace, Kind::Pod]).pods_on(node)
}

/// Starts watching `node`'s pods and all namespaces (see [`KubeSource::synced`]).
pub fn watch(client: kube::Client, node: &str) -> KubeSource {
    KubeSource::start(client, &filter(node), Some(GRANT.to_owned()))
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

#[cfg(test)]
mod tests;
