//! A Kubernetes-like cluster on one Linux host, for `ambit up`, the end-to-end tests and the
//! benchmarks: one implementation of the topology they all build.
//!
//! - [`down`]: taking a cluster down, from its record or its tag alone, idempotently.
//! - [`ip`]: the `ip` commands that create and configure network namespaces and links, with
//!   errors that carry the command and what it printed.
//! - [`cni`]: a container runtime's CNI side, as libcni does it: the node's network list read
//!   from its CNI configuration directory, plugins found on `CNI_PATH` and run one by one with
//!   the `K8S_*` arguments kubelet passes, ADD / CHECK / DEL with the cached result.
//!
//! Everything here needs root (network namespaces, veths, bridges).

pub mod cni;
pub mod desired;
pub mod down;
pub mod ip;
pub mod node;
pub mod probe;
pub mod sandbox;
pub mod segment;
pub mod state;
pub mod supervise;
pub mod testing;
pub mod topology;
pub mod up;
