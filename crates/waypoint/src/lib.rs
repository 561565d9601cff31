//! The Ambit waypoint, Istio's L7 proxy for ambient mode (Envoy in Istio): HBONE in from the
//! node proxies, HTTP authorization and routing, HBONE out to the endpoints' node proxies.
//!
//! - [`authz`]: AuthorizationPolicies as typed values and Envoy RBAC's evaluation (pure).
//! - [`config`]: the control plane's `ambit.waypoint.v1` resources parsed into a [`Snapshot`].
//! - [`Waypoint`]: the server. Build it with [`Waypoint::new`] from [`Settings`], the
//!   certificates and an HBONE [`ambit_hbone::Pool`]; give it a configuration with
//!   [`Waypoint::set_config`] (again on every change); run it on a listener with
//!   [`Waypoint::run`]; read its [`Counters`].
//!
//! - [`app`]: `ambit waypoint`, the process: settings, certificate, the xDS client that feeds
//!   [`Waypoint::set_config`], admin, metrics and readiness endpoints, drain.
//!
//! - access log: one line per request in Istio's default shape, target `access` (see `access.rs`).
//!
//! Not here yet: locality-aware balancing, JWT.

mod access;
pub mod app;
pub mod authz;
mod body;
pub mod config;
mod io;
mod metrics;
mod proxy;
mod route;
mod series;
mod server;
mod upgrade;
mod upstream;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use authz::{
    Action, Condition, Decision, DenyReason, Glob, Operation, PathError, Pattern, Policy, PolicySet, Request,
    Rule, Source, Unenforceable, UnsupportedAction, Verdict, normalize_path, remote_ip,
};
pub use config::{ConfigError, Snapshot};
pub use metrics::{Counters, Label, NO_ALLOW_MATCHED, RequestLabels};
pub use route::Balance;
pub use server::{Limits, Settings, Waypoint};
pub use upstream::{Body, BoxError};
