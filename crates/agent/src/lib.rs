//! The Ambit node agent: decides which pods are in the mesh, captures their traffic inside
//! their network namespaces and hands those namespaces to the node proxy over ZDS.
//!
//! Built so far: the pod and namespace model and the enrollment rules, finding a running pod's
//! network namespace from `/proc`, the ZDS server, the CNI plugin event, and the core that
//! adds pods to and removes them from the mesh. The event sources (Kubernetes and files), the
//! capture backend wiring, the CNI event server, the installer and the `ambit agent` command
//! come next (issue 4).

pub mod addrs;
pub mod app;
pub mod enroll;
pub mod event;
pub mod install;
pub mod kube;
pub mod mesh;
pub mod model;
pub mod procfs;
pub mod server;
pub mod source;
pub mod zds;
