//! The CA server (`control-plane.md` §6): key material and
//! `istio.v1.auth.IstioCertificateService/CreateCertificate`.

use std::sync::Arc;

use ambit_api::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ambit_api::ca::{IstioCertificateRequest, IstioCertificateResponse};
use ambit_identity::{SigningAuthority, TtlPolicy};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use time::OffsetDateTime;
use tonic::{Request, Response, Status};

use crate::auth::{AuthRequest, Authenticate, NodeAuthorizer};

pub mod material;

/// Status message of a request whose caller is not authenticated.
pub const AUTHENTICATE_FAILURE: &str = "request authenticate failure";
/// Status message of a refused `ImpersonatedIdentity`.
pub const IMPERSONATION_FAILURE: &str = "request impersonation authentication failure";
/// Request metadata key naming the identity a node proxy asks for.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";
/// Request metadata key selecting a signer (not supported; ignored).
pub const CERT_SIGNER: &str = "CertSigner";
/// Largest request the CA decodes (a CSR is a few KiB; istiod's gRPC limit is 4 MiB).
pub const MAX_REQUEST_BYTES: usize = 256 * 1024;

/// The CA service: authenticate, authorize impersonation, sign.
pub struct CaService {
    authority: Arc<SigningAuthority>,
    authenticator: Arc<dyn Authenticate>,
    node_authorizer: Option<Arc<NodeAuthorizer>>,
    ttl: TtlPolicy,
    metrics: CaMetrics,
}

/// Counters of the CA: certificates signed and requests refused by reason.
#[derive(Clone, Default)]
pub struct CaMetrics {
    signed: Counter,
    refused: Family<RefusedLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    reason: &'static str,
}

impl CaMetrics {
    /// Registers `ambit_ca_certificates_signed_total` and `ambit_ca_requests_refused_total{reason}`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "ambit_ca_certificates_signed",
            "Workload certificates signed",
            self.signed.clone(),
        );
        registry.register(
            "ambit_ca_requests_refused",
            "Certificate requests refused, by reason (authentication, impersonation, invalid_request, internal)",
            self.refused.clone(),
        );
    }

    /// Certificates signed so far.
    pub fn signed(&self) -> u64 {
        self.signed.get()
    }

    /// Requests refused for `reason` so far.
    pub fn refused(&self, reason: &'static str) -> u64 {
        self.refused.get_or_create(&RefusedLabels { reason }).get()
    }

    fn refuse(&self, reason: &'static str) {
        self.refused.get_or_create(&RefusedLabels { reason }).inc();
    }
}

impl CaService {
    /// A CA signing with `authority`, authenticating callers with `authenticator`;
    /// impersonation is refused unless a `node_authorizer` is given.
    pub fn new(
        authority: Arc<SigningAuthority>,
        authenticator: Arc<dyn Authenticate>,
        node_authorizer: Option<Arc<NodeAuthorizer>>,
        ttl: TtlPolicy,
    ) -> Self {
        CaService { authority, authenticator, node_authorizer, ttl, metrics: CaMetrics::default() }
    }

    /// The service's counters (register them on the owner's registry).
    pub fn metrics(&self) -> CaMetrics {
        self.metrics.clone()
    }

    /// The tonic service, with the request size bounded.
    pub fn into_server(self) -> IstioCertificateServiceServer<CaService> {
        IstioCertificateServiceServer::new(self).max_decoding_message_size(MAX_REQUEST_BYTES)
    }

    async fn create(&self, request: Request<IstioCertificateRequest>) -> Result<Vec<String>, Status> {
        let remote = AuthRequest::of(&request).peer.and_then(|p| p.remote);
        // 1. Authenticate.
        let caller = match self.authenticator.authenticate(AuthRequest::of(&request)).await {
            Ok(caller) => caller,
            Err(e) => {
                tracing::info!(?remote, "CA: refused an unauthenticated request: {e}");
                self.metrics.refuse("authentication");
                return Err(Status::unauthenticated(AUTHENTICATE_FAILURE));
            }
        };
        let request = request.into_inner();
        // 2. The certificate names whoever the caller authenticated as.
        let mut identities = caller.identities.clone();
        // 3. A node proxy asking for another identity.
        let fields = request.metadata.as_ref().map(|m| &m.fields);
        let string_field = |key: &str| match fields.and_then(|f| f.get(key)).and_then(|v| v.kind.as_ref()) {
            Some(prost_types::value::Kind::StringValue(s)) => s.as_str(),
            _ => "",
        };
        let impersonated = string_field(IMPERSONATED_IDENTITY);
        if !impersonated.is_empty() {
            let decision = match &self.node_authorizer {
                Some(authorizer) => {
                    authorizer.authorize_when_known(&caller, impersonated).await.map_err(|e| e.to_string())
                }
                None => Err("impersonation is disabled (no trusted node accounts)".to_owned()),
            };
            match decision {
                Ok(identity) => identities = vec![identity.to_string()],
                Err(why) => {
                    tracing::info!(
                        ?remote,
                        caller = ?caller.identities,
                        requested = %clip(impersonated),
                        "CA: refused impersonation: {why}"
                    );
                    self.metrics.refuse("impersonation");
                    return Err(Status::unauthenticated(IMPERSONATION_FAILURE));
                }
            }
        }
        // 4. Per-signer chains are not supported: sign with the one CA.
        if !string_field(CERT_SIGNER).is_empty() {
            tracing::debug!("CA: ignoring CertSigner {:?}", clip(string_field(CERT_SIGNER)));
        }
        // 5. Sign.
        let signed = self
            .ttl
            .validity(request.validity_duration, OffsetDateTime::now_utc(), self.authority.not_after())
            .and_then(|validity| self.authority.sign(&request.csr, &identities, validity));
        match signed {
            Ok(chain) => {
                self.metrics.signed.inc();
                tracing::debug!(?remote, ?identities, "CA: signed a certificate");
                Ok(chain)
            }
            Err(e) => {
                let code = e.grpc_code();
                tracing::info!(?remote, ?identities, "CA: signing failed: {e}");
                self.metrics.refuse(if code == tonic::Code::InvalidArgument {
                    "invalid_request"
                } else {
                    "internal"
                });
                Err(Status::new(code, format!("CSR signing error ({e})")))
            }
        }
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let cert_chain = self.create(request).await?;
        Ok(Response::new(IstioCertificateResponse { cert_chain }))
    }
}

/// Cuts a peer-supplied string for a log line.
fn clip(s: &str) -> String {
    s.chars().take(256).collect()
}

#[cfg(test)]
mod tests;
