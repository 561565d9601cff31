//! The signing half of a certificate authority, shared by the dev CA (`FAKE_CA`) and the CA
//! server of `ambit control`: a signing certificate and key, the chain and root bundle that go
//! with it, and leaf issuance as Istio's CA does it (control-plane.md §6.2, §6.5, §7).

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_RSA_SHA256,
    PublicKeyData, SerialNumber, SignatureAlgorithm,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::csr::{self, CsrError};

/// How far before "now" an issued certificate starts, so that a peer whose clock is slightly
/// behind accepts it (Istio: 2 minutes).
pub const BACKDATE: Duration = Duration::from_secs(120);
/// Lifetime of a workload certificate when the request asks for none (`DEFAULT_WORKLOAD_CERT_TTL`).
pub const DEFAULT_WORKLOAD_TTL: Duration = Duration::from_secs(24 * 3600);
/// Longest workload certificate lifetime a request may ask for (`MAX_WORKLOAD_CERT_TTL`).
pub const MAX_WORKLOAD_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
/// Lifetime of a self-signed root (`CITADEL_SELF_SIGNED_CA_CERT_TTL`).
pub const SELF_SIGNED_ROOT_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Longest chain (signing certificate up to a root) checked at load time.
const MAX_CHAIN_DEPTH: usize = 8;
/// The SubjectAltName extension.
const OID_SAN: &[u64] = &[2, 5, 29, 17];
/// Longest common name X.509 allows (ub-common-name).
const MAX_CN_LEN: usize = 64;

/// Key algorithm of a key this CA generates (a self-signed root, the serving key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAlgorithm {
    /// ECDSA on P-256 with SHA-256.
    EcdsaP256,
    /// ECDSA on P-384 with SHA-384.
    EcdsaP384,
    /// RSA 2048 with PKCS#1 v1.5 SHA-256.
    Rsa2048,
}

/// The TTL rules of Istio's CA for workload certificates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TtlPolicy {
    /// Lifetime when the request asks for none (`validity_duration` ≤ 0).
    pub default_ttl: Duration,
    /// Longest lifetime a request may ask for; more is refused.
    pub max_ttl: Duration,
}

impl Default for TtlPolicy {
    fn default() -> Self {
        TtlPolicy { default_ttl: DEFAULT_WORKLOAD_TTL, max_ttl: MAX_WORKLOAD_TTL }
    }
}

/// A validity window: NotBefore, NotAfter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// Start.
    pub not_before: OffsetDateTime,
    /// End.
    pub not_after: OffsetDateTime,
}

/// A signing certificate with its key, the chain between it and the roots, and the roots.
pub struct SigningAuthority {
    issuer: Issuer<'static, KeyPair>,
    algorithm: KeyAlgorithm,
    signing_cert: CertificateDer<'static>,
    not_after: OffsetDateTime,
    cert_chain: Vec<String>,
    root_bundle: String,
    roots: Vec<CertificateDer<'static>>,
}

/// A server certificate issued by a [`SigningAuthority`]: chain (leaf first) and private key.
pub struct ServerCertificate {
    /// The leaf, then the authority's chain (without the roots).
    pub chain: Vec<CertificateDer<'static>>,
    /// PKCS#8 private key of the leaf.
    pub key: PrivateKeyDer<'static>,
}

/// Why a signing certificate, key, chain or root bundle cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    /// The private key is not a PEM key rcgen can sign with.
    #[error("not a PEM RSA, ECDSA or Ed25519 private key: {0}")]
    Key(String),
    /// A PEM file holds no certificate, or a certificate is not X.509.
    #[error("{what} is not a PEM X.509 certificate: {reason}")]
    Certificate {
        /// Which certificate.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The signing certificate is not a CA.
    #[error("the signing certificate is not a CA certificate (basicConstraints CA:TRUE is required)")]
    NotCa,
    /// The key does not belong to the signing certificate.
    #[error("the private key does not belong to the signing certificate")]
    KeyMismatch,
    /// The signing certificate's validity ended.
    #[error("the signing certificate expired at {0}; replace it")]
    Expired(OffsetDateTime),
    /// The root bundle holds no certificate.
    #[error("the root bundle holds no certificate")]
    NoRoots,
    /// The signing certificate does not chain to a root of the bundle.
    #[error("the signing certificate does not chain to any certificate of the root bundle: {0}")]
    Chain(String),
    /// The signing certificate's subject cannot be reproduced as an issuer name.
    #[error("the signing certificate's subject cannot be used as an issuer name: {0}")]
    Subject(String),
    /// A certificate could not be generated.
    #[error("cannot generate the certificate: {0}")]
    Generate(rcgen::Error),
    /// The requested root lifetime cannot be represented.
    #[error("a root lifetime of {0:?} cannot be represented in a certificate")]
    Lifetime(Duration),
}

/// Why a certificate was not issued. [`SignError::grpc_code`] gives Istio's status code.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The CSR is unusable.
    #[error(transparent)]
    Csr(#[from] CsrError),
    /// The request asks for a longer lifetime than allowed.
    #[error(
        "requested TTL {} is greater than the max allowed TTL {}",
        go_duration(*requested),
        go_duration(*max)
    )]
    TtlTooLong {
        /// What was asked for.
        requested: Duration,
        /// The limit.
        max: Duration,
    },
    /// The signing certificate expired.
    #[error(
        "the CA's signing certificate expired at {0}; the CA cannot issue certificates until it is replaced"
    )]
    Expired(OffsetDateTime),
    /// No identity to put in the certificate.
    #[error("no identity to issue the certificate for")]
    NoIdentity,
    /// An identity cannot be written as a SAN (not ASCII).
    #[error("identity {0:?} cannot be written as a subject alternative name")]
    San(String),
    /// rcgen failed.
    #[error("certificate generation failed: {0}")]
    Generate(rcgen::Error),
}

impl SignError {
    /// Istio's status code for this failure: bad requests are `InvalidArgument`, our own
    /// failures `Internal`.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            SignError::Csr(_) | SignError::TtlTooLong { .. } => tonic::Code::InvalidArgument,
            SignError::Expired(_) | SignError::NoIdentity | SignError::San(_) | SignError::Generate(_) => {
                tonic::Code::Internal
            }
        }
    }
}

impl TtlPolicy {
    /// The validity of a workload certificate asked for `requested_secs` (≤ 0: the default) at
    /// `now`, signed by a certificate valid until `ca_not_after`: starts [`BACKDATE`] before
    /// now, ends at now + TTL clamped to the signing certificate's end.
    pub fn validity(
        &self,
        requested_secs: i64,
        now: OffsetDateTime,
        ca_not_after: OffsetDateTime,
    ) -> Result<Validity, SignError> {
        let ttl = if requested_secs <= 0 {
            self.default_ttl
        } else {
            let requested = Duration::from_secs(requested_secs.unsigned_abs());
            if requested > self.max_ttl {
                return Err(SignError::TtlTooLong { requested, max: self.max_ttl });
            }
            requested
        };
        if ca_not_after <= now {
            return Err(SignError::Expired(ca_not_after));
        }
        let not_after = add(now, ttl).map_or(ca_not_after, |end| end.min(ca_not_after));
        Ok(Validity { not_before: sub(now, BACKDATE), not_after })
    }
}

impl SigningAuthority {
    /// An authority from PEM texts: the signing certificate and its key, the chain elements
    /// appended after every leaf (one certificate each), and the root bundle (one or more
    /// roots, returned as the last element as is). Checks that the certificate is a CA, the key
    /// is its own, it has not expired, it chains to a root through `chain`, and that a leaf it
    /// signs verifies.
    pub fn from_pem(
        signing_cert_pem: &str,
        key_pem: &str,
        cert_chain_pem: &str,
        root_bundle_pem: &str,
    ) -> Result<Self, AuthorityError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| AuthorityError::Key(e.to_string()))?;
        let signing_cert = first_cert(signing_cert_pem, "the signing certificate")?;
        let chain = all_certs(cert_chain_pem, "the certificate chain")?;
        let roots = all_certs(root_bundle_pem, "the root bundle")?;
        if roots.is_empty() {
            return Err(AuthorityError::NoRoots);
        }
        let mut root_bundle = root_bundle_pem.to_owned();
        if !root_bundle.ends_with('\n') {
            root_bundle.push('\n');
        }
        let cert_chain = chain.iter().map(|c| crate::cert::pem_encode(c)).collect();
        Self::build(key, signing_cert, &chain, cert_chain, roots, root_bundle)
    }

    /// A fresh self-signed root for `trust_domain` (subject `O=<trust domain>`, no CN, valid
    /// for `lifetime` from one hour ago), and the certificate and key PEM to persist.
    pub fn self_signed(
        trust_domain: &str,
        algorithm: KeyAlgorithm,
        lifetime: Duration,
    ) -> Result<(Self, String, String), AuthorityError> {
        let key = generate_key(algorithm).map_err(AuthorityError::Generate)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, trust_domain);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let now = OffsetDateTime::now_utc();
        params.not_before = sub(now, Duration::from_secs(3600));
        params.not_after = add(now, lifetime).ok_or(AuthorityError::Lifetime(lifetime))?;
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key).map_err(AuthorityError::Generate)?;
        let cert_pem = cert.pem();
        let key_pem = key.serialize_pem();
        let root = cert.der().clone();
        let authority = Self::build(key, root.clone(), &[], Vec::new(), vec![root], cert_pem.clone())?;
        Ok((authority, cert_pem, key_pem))
    }

    fn build(
        key: KeyPair,
        signing_cert: CertificateDer<'static>,
        chain: &[CertificateDer<'static>],
        cert_chain: Vec<String>,
        roots: Vec<CertificateDer<'static>>,
        root_bundle: String,
    ) -> Result<Self, AuthorityError> {
        let (_, cert) = X509Certificate::from_der(&signing_cert).map_err(|e| {
            AuthorityError::Certificate { what: "the signing certificate", reason: e.to_string() }
        })?;
        if !cert.is_ca() {
            return Err(AuthorityError::NotCa);
        }
        if cert.tbs_certificate.subject_pki.raw != key.subject_public_key_info().as_slice() {
            return Err(AuthorityError::KeyMismatch);
        }
        let not_after = cert.validity().not_after.to_datetime();
        if not_after <= OffsetDateTime::now_utc() {
            return Err(AuthorityError::Expired(not_after));
        }
        // rcgen re-encodes the issuer name from the subject; it cannot hold a multi-valued or
        // empty RDN (and panics on the latter), so refuse those here.
        for rdn in cert.subject().iter() {
            if rdn.iter().count() != 1 {
                return Err(AuthorityError::Subject(
                    "a relative distinguished name with other than one attribute".to_owned(),
                ));
            }
        }
        verify_chain(&cert, chain, &roots)?;
        let algorithm = match key.algorithm() {
            alg if alg == &PKCS_ECDSA_P384_SHA384 => KeyAlgorithm::EcdsaP384,
            alg if alg == &PKCS_ECDSA_P256_SHA256 => KeyAlgorithm::EcdsaP256,
            alg if is_rsa(alg) => KeyAlgorithm::Rsa2048,
            // Ed25519 or P-521 signing keys: serve with the most widely supported key.
            _ => KeyAlgorithm::EcdsaP256,
        };
        let issuer = Issuer::from_ca_cert_der(&signing_cert, key)
            .map_err(|e| AuthorityError::Subject(e.to_string()))?;
        let authority =
            SigningAuthority { issuer, algorithm, signing_cert, not_after, cert_chain, root_bundle, roots };
        authority.self_test()?;
        Ok(authority)
    }

    /// Issues a probe leaf and checks that it names our subject as issuer byte for byte and
    /// verifies with our key, so that a certificate we cannot sign correctly fails at start.
    fn self_test(&self) -> Result<(), AuthorityError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(AuthorityError::Generate)?;
        let now = OffsetDateTime::now_utc();
        let validity = Validity { not_before: now, not_after: now.min(self.not_after) };
        let leaf = self
            .leaf_params(&["spiffe://self.test/ns/a/sa/b".to_owned()], false, validity)
            .map_err(|e| AuthorityError::Subject(e.to_string()))?
            .signed_by(&key, &self.issuer)
            .map_err(AuthorityError::Generate)?;
        let (_, ca) = X509Certificate::from_der(&self.signing_cert)
            .map_err(|e| AuthorityError::Subject(e.to_string()))?;
        let (_, probe) =
            X509Certificate::from_der(leaf.der()).map_err(|e| AuthorityError::Subject(e.to_string()))?;
        if probe.issuer().as_raw() != ca.subject().as_raw() {
            return Err(AuthorityError::Subject(
                "its encoding (string types, attribute order or repeated attributes) would change in issued certificates"
                    .to_owned(),
            ));
        }
        probe
            .verify_signature(Some(ca.public_key()))
            .map_err(|e| AuthorityError::Subject(format!("a probe certificate does not verify: {e}")))
    }

    /// Signs `csr_pem` for `identities` (each a SAN: URI for `spiffe://…`, IP for an address,
    /// DNS otherwise) valid over `validity`. Returns the chain as Istio's CA answers it: the
    /// leaf, each chain element, then the root bundle.
    pub fn sign(
        &self,
        csr_pem: &str,
        identities: &[String],
        validity: Validity,
    ) -> Result<Vec<String>, SignError> {
        let request = csr::parse(csr_pem)?;
        if self.not_after <= OffsetDateTime::now_utc() {
            return Err(SignError::Expired(self.not_after));
        }
        let params = self.leaf_params(identities, request.has_common_name, validity)?;
        let leaf = params.signed_by(&request.public_key, &self.issuer).map_err(SignError::Generate)?;
        let mut chain = Vec::with_capacity(self.cert_chain.len() + 2);
        chain.push(leaf.pem());
        chain.extend(self.cert_chain.iter().cloned());
        chain.push(self.root_bundle.clone());
        Ok(chain)
    }

    /// Issues a server certificate for `dns_names` (sorted, de-duplicated) with a fresh key of
    /// the authority's key type, valid for `lifetime` (clamped to the signing certificate).
    pub fn issue_server(
        &self,
        dns_names: &[String],
        lifetime: Duration,
    ) -> Result<ServerCertificate, SignError> {
        let mut names = dns_names.to_vec();
        names.sort();
        names.dedup();
        let key = generate_key(self.algorithm).map_err(SignError::Generate)?;
        let now = OffsetDateTime::now_utc();
        if self.not_after <= now {
            return Err(SignError::Expired(self.not_after));
        }
        let not_after = add(now, lifetime).map_or(self.not_after, |end| end.min(self.not_after));
        let validity = Validity { not_before: sub(now, BACKDATE), not_after };
        let leaf = self
            .leaf_params(&names, false, validity)?
            .signed_by(&key, &self.issuer)
            .map_err(SignError::Generate)?;
        let mut chain = vec![leaf.der().clone()];
        for pem in &self.cert_chain {
            chain.extend(CertificateDer::pem_slice_iter(pem.as_bytes()).filter_map(Result::ok));
        }
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok(ServerCertificate { chain, key })
    }

    /// End of the signing certificate's validity.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// The root certificates (trust anchors for peers of this CA).
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    /// The root bundle as PEM, the last element of every chain.
    pub fn root_bundle_pem(&self) -> &str {
        &self.root_bundle
    }

    /// The chain elements appended after every leaf (empty for a self-signed root).
    pub fn cert_chain_pem(&self) -> &[String] {
        &self.cert_chain
    }

    /// The key type of the signing key (and of the keys it generates).
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    fn leaf_params(
        &self,
        identities: &[String],
        with_common_name: bool,
        validity: Validity,
    ) -> Result<CertificateParams, SignError> {
        let first = identities.first().ok_or(SignError::NoIdentity)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        if with_common_name && first.len() <= MAX_CN_LEN {
            dn.push(DnType::CommonName, first.as_str());
        }
        params.distinguished_name = dn;
        let mut san = CustomExtension::from_oid_content(OID_SAN, san_extension(identities)?);
        san.set_criticality(true);
        params.custom_extensions = vec![san];
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        params.serial_number = Some(random_serial());
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        Ok(params)
    }
}

/// Go's `time.Duration` text for whole seconds (`24h0m0s`, `1m30s`, `5s`), as Istio's messages
/// print durations.
pub fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// Generates a key of `algorithm`.
pub(crate) fn generate_key(algorithm: KeyAlgorithm) -> Result<KeyPair, rcgen::Error> {
    match algorithm {
        KeyAlgorithm::EcdsaP256 => KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256),
        KeyAlgorithm::EcdsaP384 => KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384),
        KeyAlgorithm::Rsa2048 => KeyPair::generate_for(&PKCS_RSA_SHA256),
    }
}

/// A positive serial number below 2^128.
pub(crate) fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

fn is_rsa(alg: &SignatureAlgorithm) -> bool {
    [&rcgen::PKCS_RSA_SHA256, &rcgen::PKCS_RSA_SHA384, &rcgen::PKCS_RSA_SHA512].contains(&alg)
}

fn add(t: OffsetDateTime, d: Duration) -> Option<OffsetDateTime> {
    time::Duration::try_from(d).ok().and_then(|d| t.checked_add(d))
}

fn sub(t: OffsetDateTime, d: Duration) -> OffsetDateTime {
    time::Duration::try_from(d).ok().and_then(|d| t.checked_sub(d)).unwrap_or(t)
}

fn first_cert(pem: &str, what: &'static str) -> Result<CertificateDer<'static>, AuthorityError> {
    all_certs(pem, what)?
        .into_iter()
        .next()
        .ok_or(AuthorityError::Certificate { what, reason: "no CERTIFICATE block".to_owned() })
}

fn all_certs(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, AuthorityError> {
    let mut out = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| AuthorityError::Certificate { what, reason: e.to_string() })?;
        X509Certificate::from_der(&cert)
            .map_err(|e| AuthorityError::Certificate { what, reason: e.to_string() })?;
        out.push(cert);
    }
    Ok(out)
}

/// The signing certificate must reach a root of the bundle through `chain`: each step's
/// signature verifies with the next certificate's key (a root itself is accepted as is).
fn verify_chain(
    signing: &X509Certificate<'_>,
    chain: &[CertificateDer<'static>],
    roots: &[CertificateDer<'static>],
) -> Result<(), AuthorityError> {
    if roots.iter().any(|r| r.as_ref() == signing.as_raw()) {
        return Ok(());
    }
    let mut current = signing.as_raw().to_vec();
    for _ in 0..MAX_CHAIN_DEPTH {
        let (_, cert) =
            X509Certificate::from_der(&current).map_err(|e| AuthorityError::Chain(e.to_string()))?;
        let signed_by = |candidate: &CertificateDer<'static>| {
            X509Certificate::from_der(candidate).is_ok_and(|(_, issuer)| {
                issuer.subject().as_raw() == cert.issuer().as_raw()
                    && cert.verify_signature(Some(issuer.public_key())).is_ok()
            })
        };
        if roots.iter().any(signed_by) {
            return Ok(());
        }
        match chain.iter().find(|c| c.as_ref() != current.as_slice() && signed_by(c)) {
            Some(next) => current = next.to_vec(),
            None => {
                return Err(AuthorityError::Chain(format!(
                    "no certificate of the chain or the roots issued {:?}",
                    cert.subject().to_string()
                )));
            }
        }
    }
    Err(AuthorityError::Chain(format!("longer than {MAX_CHAIN_DEPTH} certificates")))
}

/// DER of a GeneralNames SEQUENCE holding each identity as URI, IP or DNS name.
fn san_extension(identities: &[String]) -> Result<Vec<u8>, SignError> {
    let mut names = Vec::new();
    for id in identities {
        if !id.is_ascii() || id.is_empty() {
            return Err(SignError::San(id.clone()));
        }
        if id.starts_with("spiffe://") {
            der_push(&mut names, 0x86, id.as_bytes());
        } else if let Ok(ip) = id.parse::<IpAddr>() {
            match ip {
                IpAddr::V4(v4) => der_push(&mut names, 0x87, &v4.octets()),
                IpAddr::V6(v6) => der_push(&mut names, 0x87, &v6.octets()),
            }
        } else {
            der_push(&mut names, 0x82, id.as_bytes());
        }
    }
    let mut seq = Vec::with_capacity(names.len() + 6);
    der_push(&mut seq, 0x30, &names);
    Ok(seq)
}

/// Appends one DER TLV.
fn der_push(out: &mut Vec<u8>, tag: u8, value: &[u8]) {
    out.push(tag);
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests;
