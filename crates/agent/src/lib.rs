//! The Ambit node agent: decides which pods are in the mesh, captures their traffic inside
//! their network namespaces and hands those namespaces to the node proxy over ZDS.
//!
//! Parts: the pod and namespace model (converted from `ambit-objects`' typed objects) and
//! Istio's enrollment rules; the sources (`ambit-objects`: a folder of YAML objects, or the
//! Kubernetes API); finding a running pod's network namespace from `/proc`, and checking the one
//! a CNI ADD names; the core that adds pods to and removes them from the mesh (capture through
//! `ambit-redirect`, the ZDS server); the redirection annotation, written as a report with
//! retries (to `pods/status`, or in local mode to the capture-state file); the CNI event server;
//! the CNI installer; `owner`, which tells an uninstall from an upgrade when the agent stops
//! (whether the plugin leaves the chain); and `app`, which wires them into `ambit agent`. The
//! plugin ⇄ agent contract (event, socket, enrollment cache, config keys) is `ambit-cni`'s
//! library, shared with the plugin.

pub mod addrs;
pub mod annotate;
pub mod app;
pub mod capture;
pub mod enroll;
pub mod install;
pub mod kube;
pub mod mesh;
pub mod model;
pub mod owner;
pub mod podns;
pub mod procfs;
pub mod server;
pub mod zds;

#[cfg(test)]
mod test_support;
