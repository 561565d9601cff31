//! Workload identity: SPIFFE ids, keys and CSRs, certificate verification, CA clients
//! and the certificate manager that keeps one certificate per identity fresh.

mod identity;

pub use identity::{Identity, IdentityError};
