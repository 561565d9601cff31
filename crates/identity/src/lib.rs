//! Workload identity: SPIFFE ids, keys and CSRs, certificate verification, CA clients
//! and the certificate manager that keeps one certificate per identity fresh.

mod ca;
mod cert;
pub mod control;
mod csr;
mod identity;
mod manager;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod tls;

pub use ca::{CaClient, CaClientConfig, CaError, CertSigner, FakeCa, dev_ca_init};
pub use cert::{CertDump, CertEntry, CertificateError, SanError, WorkloadCertificate, peer_identity};
pub use identity::{Identity, IdentityError};
pub use manager::{CertError, CertManager, CertStateDump, Priority};
