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

pub use ca::{
    AuthorityError, BACKDATE, CaClient, CaClientConfig, CaError, CertSigner, DEFAULT_WORKLOAD_TTL, FakeCa,
    KeyAlgorithm, MAX_WORKLOAD_TTL, SELF_SIGNED_ROOT_TTL, ServerCertificate, SignError, SigningAuthority,
    TtlPolicy, Validity, dev_ca_init, go_duration,
};
pub use cert::{
    CertDump, CertEntry, CertificateError, SanError, WorkloadCertificate, certificate_names, peer_identity,
    rfc3339, rfc3339_millis,
};
pub use csr::{ACCEPTED_KEYS, CsrError, MAX_CSR_BYTES, MAX_RSA_BITS, MIN_RSA_BITS};
pub use identity::{Identity, IdentityError};
pub use manager::{CertError, CertManager, CertStateDump, Priority};
