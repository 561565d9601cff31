//! The objects Ambit reads, typed, and where they come from.
//!
//! Kubernetes kinds are k8s-openapi's types; the Istio kinds (`security.istio.io/v1`,
//! `networking.istio.io/v1`) and the Gateway API kinds Ambit needs for waypoints
//! (`gateway.networking.k8s.io/v1`) are defined here with their real group/versions, and
//! implement k8s-openapi's `Resource` and `Metadata` traits, so kube-rs can list and watch them
//! like any built-in kind. [`Object`] holds one object of any kind, [`ObjectKey`] names it.
//!
//! The agent and the control plane both read objects through this crate: one model, one YAML
//! parser, one Kubernetes watcher.

pub mod gateway;
pub mod istio;
mod object;

pub use object::{Change, Kind, Object, ObjectError, ObjectKey};

/// Re-exported Kubernetes types, so users name one crate.
pub use k8s_openapi;
pub use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
pub use k8s_openapi::api::discovery::v1::EndpointSlice;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
