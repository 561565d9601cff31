//! The Kubernetes source: watches this node's pods and all namespaces (kube-rs reflectors),
//! and writes the `ambient.istio.io/redirection` annotation through the `pods/status`
//! subresource (the narrowest permission that can).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1 as k8s;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::enroll::REDIRECTION;
use crate::mesh::Annotate;
use crate::model::{Namespace, Pod};
use crate::source::Inventory;

/// Reflectors of this node's pods and of namespaces.
pub struct KubeSource {
    pods: Store<k8s::Pod>,
    namespaces: Store<k8s::Namespace>,
    changed: Arc<AtomicBool>,
}

impl KubeSource {
    /// Starts the watches and waits until both have listed once.
    pub async fn start(client: kube::Client, node_name: Option<&str>) -> Result<KubeSource, String> {
        let changed = Arc::new(AtomicBool::new(true));
        let mut pod_cfg = watcher::Config::default();
        if let Some(node) = node_name {
            pod_cfg = pod_cfg.fields(&format!("spec.nodeName={node}"));
        }
        let pods = reflect(Api::<k8s::Pod>::all(client.clone()), pod_cfg, changed.clone(), "pods");
        let namespaces = reflect(
            Api::<k8s::Namespace>::all(client),
            watcher::Config::default(),
            changed.clone(),
            "namespaces",
        );
        pods.wait_until_ready().await.map_err(|e| format!("pod watch ended before its first list: {e}"))?;
        namespaces
            .wait_until_ready()
            .await
            .map_err(|e| format!("namespace watch ended before its first list: {e}"))?;
        Ok(KubeSource { pods, namespaces, changed })
    }

    /// The current inventory if anything changed since the last call.
    pub fn poll(&mut self) -> Option<Inventory> {
        if !self.changed.swap(false, Ordering::AcqRel) {
            return None;
        }
        Some(inventory(&self.pods.state(), &self.namespaces.state()))
    }
}

fn reflect<K>(api: Api<K>, cfg: watcher::Config, changed: Arc<AtomicBool>, what: &'static str) -> Store<K>
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
                Ok(_) => changed.store(true, Ordering::Release),
                Err(e) => {
                    tracing::warn!(watch = what, error = %e, "Kubernetes watch error; retrying with backoff")
                }
            }
        }
    });
    reader
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
    ) -> BoxFuture<'static, Result<(), String>> {
        let api: Api<k8s::Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let name = pod.name.clone();
        Box::pin(async move {
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(redirection_patch(value)))
                .await
            {
                Ok(_) => Ok(()),
                // The pod is gone: nothing to annotate.
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

#[cfg(test)]
mod tests;
