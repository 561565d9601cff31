//! gRPC client of the Istio CA API (`istio.v1.auth.IstioCertificateService`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use ambit_api::ca::IstioCertificateRequest;
use ambit_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use futures::future::BoxFuture;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tonic::transport::Channel;

use super::{CaError, CertSigner};
use crate::Identity;
use crate::cert::{CertificateError, spiffe_identity};
use crate::control::{
    ControlPlane, ControlPlaneConfig, RootSource, Service, error_chain, find_control_error,
};

/// Settings of a [`CaClient`].
#[derive(Clone, Debug)]
pub struct CaClientConfig {
    /// How to reach the CA (`CA_ADDRESS`, `CA_ROOT_CA`, `ALT_CA_HOSTNAME`, `AUTH_TOKEN`,
    /// `CA_HEADER_*`); its `service` should be [`Service::Ca`].
    pub control: ControlPlaneConfig,
    /// Shared mode: ask for the identity via `ImpersonatedIdentity` and check the returned SAN.
    pub impersonate: bool,
}

/// gRPC client of the Istio CA API (CA_ADDRESS).
pub struct CaClient {
    control: ControlPlane,
    impersonate: bool,
    /// Channel plus the root file's modification time it was built with.
    channel: tokio::sync::Mutex<Option<(Option<SystemTime>, Channel)>>,
}

impl CaClientConfig {
    /// A CA at `address` (roots from the system store, no token, no headers), for tests and
    /// plaintext development servers.
    pub fn plain(address: impl Into<String>) -> CaClientConfig {
        CaClientConfig {
            control: ControlPlaneConfig {
                service: Service::Ca,
                address: address.into(),
                roots: RootSource::System,
                alt_hostname: None,
                token: None,
                cluster_id: String::new(),
                headers: Vec::new(),
                mark: None,
            },
            impersonate: false,
        }
    }
}

impl CaClient {
    /// Validates the configuration (roots are loaded now); the connection is made on the first
    /// request.
    pub fn new(cfg: CaClientConfig) -> Result<Self, CaError> {
        let control = ControlPlane::new(cfg.control)?;
        Ok(CaClient { control, impersonate: cfg.impersonate, channel: tokio::sync::Mutex::new(None) })
    }

    /// The channel to the CA, rebuilt when the root file changed since it was made.
    async fn channel(&self) -> Result<Channel, CaError> {
        let mtime = self.control.roots_modified();
        let mut cached = self.channel.lock().await;
        if let Some((built_with, channel)) = cached.as_ref()
            && *built_with == mtime
        {
            return Ok(channel.clone());
        }
        let channel = self.control.channel()?;
        *cached = Some((mtime, channel.clone()));
        Ok(channel)
    }

    async fn create_certificate(
        &self,
        csr: String,
        identity: &Identity,
        ttl: Duration,
    ) -> Result<Vec<String>, CaError> {
        let metadata = self.impersonate.then(|| prost_types::Struct {
            fields: BTreeMap::from([(
                "ImpersonatedIdentity".to_owned(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(identity.to_string())),
                },
            )]),
        });
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            metadata,
        });
        *request.metadata_mut() = self.control.metadata()?;

        let mut client = IstioCertificateServiceClient::new(self.channel().await?);
        let chain = client
            .create_certificate(request)
            .await
            .map_err(|status| CaError::Status {
                address: self.control.address().to_owned(),
                code: status.code(),
                message: status_message(&status),
            })?
            .into_inner()
            .cert_chain;
        match chain.as_slice() {
            [] => return Err(CertificateError::EmptyChain.into()),
            [_] => return Err(CertificateError::NoRoots.into()),
            _ => {}
        }
        if self.impersonate {
            check_leaf_identity(&chain[0], identity)?;
        }
        Ok(chain)
    }
}

impl CertSigner for CaClient {
    fn sign(
        &self,
        csr_pem: String,
        identity: &Identity,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Vec<String>, CaError>> {
        let identity = identity.clone();
        Box::pin(async move { self.create_certificate(csr_pem, &identity, ttl).await })
    }
}

/// The status message, with our connector's error when the call failed to connect (tonic's
/// own message is then a bare "transport error").
fn status_message(status: &tonic::Status) -> String {
    use std::error::Error as _;
    match status.source().and_then(|s| find_control_error(s)) {
        Some(ours) => ours.to_string(),
        None => match status.source() {
            Some(source) if status.message().is_empty() || status.message() == "transport error" => {
                error_chain(source)
            }
            _ => status.message().to_owned(),
        },
    }
}

/// Shared mode: the leaf must name exactly the identity we asked to impersonate.
fn check_leaf_identity(leaf_pem: &str, expected: &Identity) -> Result<(), CaError> {
    let leaf = CertificateDer::from_pem_slice(leaf_pem.as_bytes())
        .map_err(|_| CertificateError::Pem { index: 0 })?;
    match spiffe_identity(&leaf) {
        Ok(got) if got == *expected => Ok(()),
        Ok(got) => Err(CaError::SanMismatch { expected: expected.clone(), got: got.to_string() }),
        Err(e) => Err(CaError::SanMismatch { expected: expected.clone(), got: e.to_string() }),
    }
}
