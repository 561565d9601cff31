//! `ambit control`: istiod's ambient half.
//!
//! - [`translate`]: Kubernetes and Istio objects → `istio.workload.Address` (Workload, Service)
//!   and `istio.security.Authorization`, with istiod's semantics, incrementally.
//! - [`ca`]: `istio.v1.auth.IstioCertificateService/CreateCertificate` with node authorization.

pub mod app;
pub mod ca;
pub mod pods;
pub mod translate;
