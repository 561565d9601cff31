//! The Ambit waypoint, Istio's L7 proxy for ambient mode (Envoy in Istio).
//!
//! What exists now is its HTTP authorization engine, [`authz`]: AuthorizationPolicies as typed
//! values, the request attributes they read, Istio's path normalization (`pathNormalization:
//! BASE`) and Envoy RBAC's evaluation order. It is pure: no sockets, no configuration transport.
//! The rest of the waypoint (HBONE listener, HTTP proxying, routing, the xDS translation that
//! produces these policies) is to come.

pub mod authz;
pub mod config;

pub use authz::{
    Action, Condition, Decision, DenyReason, Glob, Operation, PathError, Pattern, Policy, PolicySet, Request,
    Rule, Source, Unenforceable, UnsupportedAction, Verdict, normalize_path, remote_ip,
};
pub use config::{ConfigError, Snapshot};
