//! HTTP authorization as Istio's AuthorizationPolicy defines it and Envoy's RBAC filter enforces
//! it in a waypoint. So far: the value patterns policies use and the path normalization requests
//! go through before path matching.

mod path;
mod pattern;

pub use path::{PathError, normalize_path};
pub use pattern::{Glob, Pattern};
