//! `ambit control`: istiod's ambient half.
//!
//! - [`translate`]: Kubernetes and Istio objects → `istio.workload.Address` (Workload, Service)
//!   and `istio.security.Authorization`, with istiod's semantics, incrementally.
//! - [`ca`]: `istio.v1.auth.IstioCertificateService/CreateCertificate` with node authorization.
//! - [`auth`]: the authentication chain the CA and xDS share, and node authorization.
//! - [`tls`]: gRPC serving over TLS (with the verified client chain per request) or plaintext.

pub mod auth;
pub mod ca;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
pub mod translate;
