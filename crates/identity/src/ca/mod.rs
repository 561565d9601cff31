//! Certificate authorities: the signer abstraction, the Istio CA gRPC client and the in-process fake CA.

use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::Identity;
use crate::cert::CertificateError;

mod authority;
mod client;
mod fake;

pub use authority::{
    AuthorityError, BACKDATE, DEFAULT_WORKLOAD_TTL, KeyAlgorithm, MAX_WORKLOAD_TTL, SELF_SIGNED_ROOT_TTL,
    ServerCertificate, SignError, SigningAuthority, TtlPolicy, Validity, go_duration,
};
pub use client::{CaClient, CaClientConfig};
pub use fake::{FakeCa, dev_ca_init};

/// Anything that signs a CSR for an identity and returns the PEM chain as the Istio CA API does
/// (leaf, intermediates..., root bundle last).
pub trait CertSigner: Send + Sync + 'static {
    /// Signs `csr_pem` for `identity`, asking for a certificate valid for `ttl`.
    fn sign(
        &self,
        csr_pem: String,
        identity: &Identity,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Vec<String>, CaError>>;
}

/// Why a certificate could not be obtained from a CA.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// Key or CSR generation failed.
    #[error("cannot create a certificate signing request: {0}")]
    Csr(rcgen::Error),
    /// The CA's response (or a certificate built from it) is unusable.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    /// The in-process CA received a CSR it cannot parse or verify.
    #[error("the certificate signing request is invalid: {0}")]
    InvalidCsr(crate::csr::CsrError),
    /// The in-process CA failed to sign.
    #[error("the in-process CA cannot sign the certificate: {0}")]
    Signing(SignError),
    /// The requested TTL cannot be represented in a certificate.
    #[error("requested certificate lifetime {0:?} is too large; lower SECRET_TTL")]
    Ttl(Duration),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `dev_ca_init` found an existing file.
    #[error("{0} already exists; remove it or force re-initialisation to replace the dev CA")]
    Exists(PathBuf),
    /// A root certificate or key file is unusable.
    #[error("cannot use {path} as a CA root: {reason}")]
    InvalidRoot {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The CA cannot be reached as configured (address, roots, token, headers, TLS).
    #[error(transparent)]
    Control(#[from] crate::control::ControlError),
    /// The CA answered with a gRPC error (or could not be reached).
    #[error("certificate request to the CA at {address} failed: {code:?}: {message}")]
    Status {
        /// The CA address.
        address: String,
        /// gRPC status code.
        code: tonic::Code,
        /// gRPC status message (or why the connection failed).
        message: String,
    },
    /// In shared mode the CA issued a certificate for another identity than the requested one.
    #[error("did not find expected SAN {expected} in the certificate issued by the CA (got {got})")]
    SanMismatch {
        /// The identity that was requested.
        expected: Identity,
        /// The identities in the returned leaf.
        got: String,
    },
}

#[cfg(test)]
mod tests;
