//! Data-plane TLS: the HBONE crypto provider, mTLS configs and the SPIFFE-aware verifiers.

use std::fmt;
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{Resumption, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms, aws_lc_rs};
use rustls::server::ParsedCertificate;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{
    CertificateError as TlsCertError, DigitallySignedStruct, DistinguishedName, OtherError, RootCertStore,
    SignatureScheme,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::Identity;
use crate::cert::{CertificateError, SanError, spiffe_identity};

/// ALPN protocol spoken over HBONE.
const ALPN_H2: &[u8] = b"h2";

/// aws-lc-rs restricted to the HBONE TLS 1.3 suites, in ztunnel's order.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let mut provider = aws_lc_rs::default_provider();
            provider.cipher_suites = vec![
                aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
                aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
            ];
            Arc::new(provider)
        })
        .clone()
}

/// Loads our chain and key, checking that the key belongs to the leaf.
pub(crate) fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, CertificateError> {
    let certified =
        CertifiedKey::from_der(chain, key, &provider()).map_err(|e| CertificateError::Key(e.to_string()))?;
    Ok(Arc::new(certified))
}

/// Inbound HBONE: client certificate required, verified to `roots`, same trust domain.
pub(crate) fn server_config(
    key: &Arc<CertifiedKey>,
    roots: Arc<RootCertStore>,
    trust_domain: &str,
) -> Result<Arc<rustls::ServerConfig>, CertificateError> {
    let provider = provider();
    let inner = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| CertificateError::Tls(e.to_string()))?;
    let verifier = TrustDomainVerifier { inner, trust_domain: trust_domain.to_owned() };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| CertificateError::Tls(e.to_string()))?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(key.clone())));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    // No resumption: a resumed client presents no certificate, so an identity that expired or
    // was rotated since the first handshake would keep working. Every connection does a full
    // handshake with a client certificate (as ztunnel's, which builds a config per connection).
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    // The proxy protects HBONE records itself once rustls finished the handshake.
    config.enable_secret_extraction = true;
    Ok(Arc::new(config))
}

/// Outbound HBONE: our certificate, server verified to `roots` and matched against `expected`.
pub(crate) fn client_config(
    key: &Arc<CertifiedKey>,
    roots: Arc<RootCertStore>,
    expected: &[Identity],
) -> Arc<rustls::ClientConfig> {
    let provider = provider();
    let verifier = SpiffeServerVerifier {
        roots,
        expected: expected.to_vec(),
        algorithms: provider.signature_verification_algorithms,
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13]);
    // The provider is aws-lc-rs with TLS 1.3 suites, which always supports TLS 1.3.
    let builder = builder.expect("aws-lc-rs provider supports TLS 1.3");
    let mut config = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(key.clone())));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    config.enable_sni = false;
    config.resumption = Resumption::disabled();
    // The proxy protects HBONE records itself once rustls finished the handshake.
    config.enable_secret_extraction = true;
    Arc::new(config)
}

/// The server leaf's identity is not one the client expected.
#[derive(thiserror::Error)]
#[error("identity verification error: peer did not present the expected SAN ({}), got {got}", join(expected))]
pub(crate) struct SanMismatch {
    expected: Vec<Identity>,
    got: Identity,
}

// rustls prints certificate errors with `Debug`, so make it read like `Display`.
impl fmt::Debug for SanMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The client leaf's identity is not in our trust domain.
#[derive(thiserror::Error)]
#[error("identity verification error: peer is not in trust domain {trust_domain:?} (got {got})")]
pub(crate) struct TrustDomainMismatch {
    trust_domain: String,
    got: Identity,
}

impl fmt::Debug for TrustDomainMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The peer leaf does not name exactly one SPIFFE identity.
#[derive(thiserror::Error)]
#[error("identity verification error: {0}")]
pub(crate) struct NoSingleIdentity(SanError);

impl fmt::Debug for NoSingleIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn join(ids: &[Identity]) -> String {
    ids.iter().map(Identity::to_string).collect::<Vec<_>>().join(",")
}

fn other_error(e: impl std::error::Error + Send + Sync + 'static) -> rustls::Error {
    rustls::Error::InvalidCertificate(TlsCertError::Other(OtherError(Arc::new(e))))
}

/// The peer leaf's one SPIFFE identity: the identity used afterwards (authorization, telemetry)
/// is exactly the one checked here.
fn peer_id(der: &CertificateDer<'_>) -> Result<Identity, rustls::Error> {
    match spiffe_identity(der) {
        Ok(id) => Ok(id),
        Err(SanError::Parse(_)) => Err(rustls::Error::InvalidCertificate(TlsCertError::BadEncoding)),
        Err(e) => Err(other_error(NoSingleIdentity(e))),
    }
}

/// webpki client verification, then the leaf must name exactly one SPIFFE identity, in our trust
/// domain (ztunnel's `TrustDomainVerifier`, with the one-identity rule of X.509-SVIDs).
#[derive(Debug)]
struct TrustDomainVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
}

impl ClientCertVerifier for TrustDomainVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        let got = peer_id(end_entity)?;
        if got.trust_domain == self.trust_domain {
            Ok(verified)
        } else {
            Err(other_error(TrustDomainMismatch { trust_domain: self.trust_domain.clone(), got }))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Chain to our roots (server-auth usage, DNS names ignored), then the leaf's one SPIFFE identity
/// must be an expected one.
#[derive(Debug)]
struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    expected: Vec<Identity>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        let got = peer_id(end_entity)?;
        if self.expected.contains(&got) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(other_error(SanMismatch { expected: self.expected.clone(), got }))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
