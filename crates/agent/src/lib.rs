//! The Ambit node agent: decides which pods are in the mesh, captures their traffic inside
//! their network namespaces and hands those namespaces to the node proxy over ZDS.
//!
//! Built so far: the pod and namespace model and the enrollment rules, finding a running pod's
//! network namespace from `/proc`, and the ZDS server. The event sources, capture, CNI event
//! server, installer and reconcile loop come next (issue 4).

pub mod enroll;
pub mod event;
pub mod model;
pub mod procfs;
pub mod zds;
