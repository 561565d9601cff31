//! gRPC client of the Istio CA API (`istio.v1.auth.IstioCertificateService`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ambit_api::ca::IstioCertificateRequest;
use ambit_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use futures::future::BoxFuture;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::{CaError, CertSigner};
use crate::Identity;
use crate::cert::{CertificateError, spiffe_identity};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const TCP_KEEPALIVE: Duration = Duration::from_secs(300);
const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of a [`CaClient`].
#[derive(Clone, Debug, Default)]
pub struct CaClientConfig {
    /// CA URI (`CA_ADDRESS`): `https://host:port`, or `http://` for local plaintext development.
    pub address: String,
    /// PEM file with the roots that verify the CA's TLS certificate (`CA_ROOT_CA`).
    pub root_cert: Option<PathBuf>,
    /// Bearer token file, re-read on every request (`AUTH_TOKEN`); no `authorization` header if unset.
    pub token_path: Option<PathBuf>,
    /// Sent as the `clusterid` header together with a token.
    pub cluster_id: String,
    /// Extra request headers (`CA_HEADER_<K>=<V>`).
    pub headers: Vec<(String, String)>,
    /// Shared mode: ask for the identity via `ImpersonatedIdentity` and check the returned SAN.
    pub impersonate: bool,
}

/// gRPC client of the Istio CA API (CA_ADDRESS).
pub struct CaClient {
    cfg: CaClientConfig,
    endpoint: Endpoint,
    tls_domain: Option<String>,
    headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    cluster_id: Option<AsciiMetadataValue>,
    /// Channel plus the root file's modification time it was built with.
    channel: tokio::sync::Mutex<Option<(Option<SystemTime>, Channel)>>,
}

impl CaClient {
    /// Validates the configuration; the connection is made on the first request.
    pub fn new(mut cfg: CaClientConfig) -> Result<Self, CaError> {
        if !cfg.address.contains("://") {
            cfg.address = format!("https://{}", cfg.address);
        }
        let invalid = |reason: String| CaError::InvalidAddress { address: cfg.address.clone(), reason };
        let uri: http::Uri = cfg.address.parse().map_err(|e| invalid(format!("{e}")))?;
        let host = uri
            .host()
            .ok_or_else(|| invalid("no host".to_owned()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let tls_domain = match uri.scheme_str() {
            Some("https") => {
                if cfg.root_cert.is_none() {
                    return Err(CaError::MissingRootCert(cfg.address.clone()));
                }
                Some(host)
            }
            Some("http") => None,
            other => {
                return Err(invalid(format!(
                    "scheme {other:?} is not supported; use https:// (or http:// for local development)"
                )));
            }
        };
        let endpoint = Endpoint::from(uri)
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_keepalive(Some(TCP_KEEPALIVE))
            .http2_keep_alive_interval(H2_KEEPALIVE_INTERVAL)
            .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT);
        let headers = cfg
            .headers
            .iter()
            .map(|(k, v)| {
                let key = k.to_ascii_lowercase().parse::<AsciiMetadataKey>();
                let value = v.parse::<AsciiMetadataValue>();
                match (key, value) {
                    (Ok(key), Ok(value)) => Ok((key, value)),
                    _ => Err(CaError::InvalidHeader(k.clone())),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cluster_id = cfg
            .cluster_id
            .parse::<AsciiMetadataValue>()
            .map_err(|_| CaError::InvalidHeader("clusterid".to_owned()))?;
        let client = CaClient {
            endpoint,
            tls_domain,
            headers,
            cluster_id: Some(cluster_id).filter(|_| !cfg.cluster_id.is_empty()),
            channel: tokio::sync::Mutex::new(None),
            cfg,
        };
        // Fail at startup, not on the first certificate, when the roots are unusable.
        if let Some(path) = client.tls_root_path() {
            load_roots(path)?;
        }
        Ok(client)
    }

    fn tls_root_path(&self) -> Option<&PathBuf> {
        self.tls_domain.as_ref().and(self.cfg.root_cert.as_ref())
    }

    /// The channel to the CA, rebuilt when the root file changed since it was made.
    async fn channel(&self) -> Result<Channel, CaError> {
        let mtime = match self.tls_root_path() {
            Some(path) => tokio::fs::metadata(path).await.and_then(|m| m.modified()).ok(),
            None => None,
        };
        let mut cached = self.channel.lock().await;
        if let Some((built_with, channel)) = cached.as_ref()
            && *built_with == mtime
        {
            return Ok(channel.clone());
        }
        let mut endpoint = self.endpoint.clone();
        if let (Some(domain), Some(path)) = (&self.tls_domain, self.tls_root_path()) {
            let pem = load_roots(path)?;
            let tls =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)).domain_name(domain.clone());
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|source| CaError::Transport { address: self.cfg.address.clone(), source })?;
        }
        let channel = endpoint.connect_lazy();
        *cached = Some((mtime, channel.clone()));
        Ok(channel)
    }

    async fn authorization(&self) -> Result<Option<AsciiMetadataValue>, CaError> {
        let Some(path) = &self.cfg.token_path else {
            return Ok(None);
        };
        let token = tokio::fs::read_to_string(path)
            .await
            .map_err(|source| CaError::Token { path: path.clone(), source })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(CaError::EmptyToken(path.clone()));
        }
        format!("Bearer {token}").parse().map(Some).map_err(|_| CaError::InvalidToken(path.clone()))
    }

    async fn create_certificate(
        &self,
        csr: String,
        identity: &Identity,
        ttl: Duration,
    ) -> Result<Vec<String>, CaError> {
        let metadata = self.cfg.impersonate.then(|| prost_types::Struct {
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
        let md = request.metadata_mut();
        if let Some(auth) = self.authorization().await? {
            md.insert("authorization", auth);
            if let Some(cluster_id) = &self.cluster_id {
                md.insert("clusterid", cluster_id.clone());
            }
        }
        for (k, v) in &self.headers {
            md.append(k.clone(), v.clone());
        }

        let mut client = IstioCertificateServiceClient::new(self.channel().await?);
        let chain = client
            .create_certificate(request)
            .await
            .map_err(|status| CaError::Status {
                address: self.cfg.address.clone(),
                code: status.code(),
                message: status.message().to_owned(),
            })?
            .into_inner()
            .cert_chain;
        match chain.as_slice() {
            [] => return Err(CertificateError::EmptyChain.into()),
            [_] => return Err(CertificateError::NoRoots.into()),
            _ => {}
        }
        if self.cfg.impersonate {
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

/// Reads a root PEM file and checks it holds at least one certificate.
fn load_roots(path: &PathBuf) -> Result<Vec<u8>, CaError> {
    let pem = std::fs::read(path).map_err(|source| CaError::ReadFile { path: path.clone(), source })?;
    let count = CertificateDer::pem_slice_iter(&pem).filter(Result::is_ok).count();
    if count == 0 {
        return Err(CaError::InvalidRoot {
            path: path.clone(),
            reason: "no PEM certificate in the file".to_owned(),
        });
    }
    Ok(pem)
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
