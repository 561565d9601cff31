//! The objects Ambit reads, typed, and where they come from.
//!
//! Kubernetes kinds are k8s-openapi's types; the Istio kinds (`security.istio.io/v1`,
//! `networking.istio.io/v1`) and the Gateway API kinds Ambit needs for waypoints
//! (`gateway.networking.k8s.io`: Gateway, GatewayClass, HTTPRoute, GRPCRoute, ReferenceGrant)
//! are defined here with their real group/versions, and
//! implement k8s-openapi's `Resource` and `Metadata` traits, so kube-rs can list and watch them
//! like any built-in kind. [`Object`] holds one object of any kind, [`ObjectKey`] names it.
//!
//! Two sources deliver them, both as [`Change`]s through the [`Source`] interface: a folder of
//! YAML ([`file::FileSource`], local mode) and the Kubernetes API ([`kube::KubeSource`]). The
//! agent and the control plane both read objects through this crate: one model, one YAML
//! parser, one Kubernetes watcher.

pub mod file;
pub mod gateway;
pub mod istio;
#[cfg(feature = "kube")]
pub mod kube;
mod object;
pub mod route;
pub mod strict;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod waypoint;

use std::collections::BTreeSet;

pub use object::{Change, Kind, Object, ObjectError, ObjectKey, describe};
pub use strict::{Decoding, FieldError, FieldPath};

/// Re-exported Kubernetes types, so users name one crate.
pub use k8s_openapi;
pub use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
pub use k8s_openapi::api::discovery::v1::EndpointSlice;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

/// `ambient.istio.io/redirection`: the pod annotation the node agent sets to `enabled` once a
/// pod's traffic is captured and its proxy has it (istiod marks such a workload HBONE).
pub const REDIRECTION: &str = "ambient.istio.io/redirection";

/// What both sources offer their consumer: the changes since the last call, and whether the
/// first full state has been read.
pub trait Source: Send {
    /// The changes since the last call, at most one per object (empty: nothing changed).
    fn poll(&mut self) -> Vec<Change>;
    /// Whether every watched kind has been read completely once; from then on, everything
    /// polled so far is the source's full state.
    fn is_synced(&self) -> bool;
}

/// Which objects a source delivers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// The kinds (empty: every kind).
    pub kinds: BTreeSet<Kind>,
    /// Only pods with this `spec.nodeName` (the node agent's view); other kinds are unaffected.
    pub pod_node: Option<String>,
}

impl Filter {
    /// Every kind.
    pub fn all() -> Filter {
        Filter::default()
    }

    /// These kinds only.
    pub fn kinds(kinds: &[Kind]) -> Filter {
        Filter { kinds: kinds.iter().copied().collect(), pod_node: None }
    }

    /// Only the pods of `node` (other kinds are unaffected).
    pub fn pods_on(mut self, node: impl Into<String>) -> Filter {
        self.pod_node = Some(node.into());
        self
    }

    /// Whether objects of `kind` are delivered at all.
    pub fn wants(&self, kind: Kind) -> bool {
        self.kinds.is_empty() || self.kinds.contains(&kind)
    }

    /// The kinds delivered, in [`Kind::ALL`] order.
    pub fn wanted(&self) -> Vec<Kind> {
        Kind::ALL.iter().copied().filter(|k| self.wants(*k)).collect()
    }

    /// Whether `object` is delivered.
    pub fn admits(&self, object: &Object) -> bool {
        if !self.wants(object.kind()) {
            return false;
        }
        match (object, &self.pod_node) {
            (Object::Pod(p), Some(node)) => {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
            }
            _ => true,
        }
    }
}
