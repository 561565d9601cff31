//! The Ambit waypoint, Istio's L7 proxy for ambient mode (Envoy in Istio).
//!
//! What exists now is the start of its HTTP authorization engine, [`authz`]: Istio's value
//! patterns and path normalization (`pathNormalization: BASE`). The rest of the waypoint is to
//! come.

pub mod authz;

pub use authz::{Glob, PathError, Pattern, normalize_path};
