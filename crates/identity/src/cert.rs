//! Workload certificates: the CA response parsed into a leaf, intermediates, roots and key.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use rustls::RootCertStore;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Serialize;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::Identity;
use crate::tls;

/// A workload's certificate: leaf, intermediates, private key and the roots it trusts.
pub struct WorkloadCertificate {
    identity: Identity,
    not_before: SystemTime,
    not_after: SystemTime,
    pub(crate) roots: Arc<RootCertStore>,
    pub(crate) key: Arc<CertifiedKey>,
    server_config: Arc<rustls::ServerConfig>,
    dump: CertDump,
}

/// The certificates of a [`WorkloadCertificate`] as shown by the admin `/config_dump`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertDump {
    /// Leaf first, then intermediates.
    pub cert_chain: Vec<CertEntry>,
    /// Trusted roots.
    pub root_certs: Vec<CertEntry>,
}

/// One certificate in a [`CertDump`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertEntry {
    /// Base64 of the PEM text.
    pub pem: String,
    /// Serial number in decimal.
    pub serial_number: String,
    /// Start of validity, RFC 3339 UTC with seconds.
    pub valid_from: String,
    /// End of validity, RFC 3339 UTC with seconds.
    pub expiration_time: String,
}

/// Why a CA response or key cannot be turned into a [`WorkloadCertificate`].
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// The CA returned no certificates at all.
    #[error("the CA returned an empty certificate chain")]
    EmptyChain,
    /// The CA returned one element, so there is no root bundle to trust.
    #[error(
        "the CA returned a single certificate and no root bundle; an Istio-compatible CA returns the leaf, any intermediates, then the roots"
    )]
    NoRoots,
    /// An element of the chain holds no parsable PEM certificate.
    #[error("element {index} of the CA certificate chain holds no valid PEM certificate")]
    Pem {
        /// Position in the chain.
        index: usize,
    },
    /// No certificate of the root bundle could be used as a trust anchor.
    #[error("the root bundle returned by the CA holds no usable root certificate")]
    NoUsableRoot,
    /// The leaf certificate is not valid X.509.
    #[error("the leaf certificate cannot be parsed: {0}")]
    Parse(String),
    /// The leaf certificate does not name exactly one SPIFFE identity.
    #[error("the leaf certificate has no usable identity: {0}")]
    Identity(#[from] SanError),
    /// The certificate's validity already ended when it arrived.
    #[error("the CA issued a certificate that has already expired; check the clocks of the CA and this node")]
    Expired,
    /// The private key is not usable.
    #[error("the private key cannot be loaded: {0}")]
    Key(String),
    /// rustls refused the certificate, key or roots.
    #[error("the certificate cannot be used for TLS: {0}")]
    Tls(String),
}

/// Why a certificate does not name exactly one SPIFFE identity (an X.509-SVID carries exactly one
/// URI SAN, and Istio accepts no other shape).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SanError {
    /// The certificate is not valid X.509.
    #[error("the certificate cannot be parsed: {0}")]
    Parse(String),
    /// No URI SAN at all.
    #[error(
        "the certificate has no URI SAN; a workload certificate carries exactly one, \
         spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
    )]
    NoUri,
    /// More than one URI SAN: which one is the identity would be ambiguous.
    #[error(
        "the certificate has {count} URI SANs ({}); a workload certificate carries exactly one SPIFFE \
         id, so its identity is ambiguous and the certificate is refused",
        shown.join(", ")
    )]
    ManyUris {
        /// How many URI SANs.
        count: usize,
        /// The first few of them, each cut to a bounded length (they come from the peer).
        shown: Vec<String>,
    },
    /// The one URI SAN is not a SPIFFE workload id.
    #[error(
        "the certificate's URI SAN {0:?} is not of the form \
         spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
    )]
    NotSpiffe(String),
}

impl WorkloadCertificate {
    /// Builds a certificate from a private key (PEM) and a CA response chain (leaf, intermediates, root bundle).
    pub fn from_pem(private_key_pem: &str, chain: &[String]) -> Result<Self, CertificateError> {
        let key = PrivateKeyDer::from_pem_slice(private_key_pem.as_bytes())
            .map_err(|e| CertificateError::Key(e.to_string()))?;
        Self::new(key, chain)
    }

    /// Builds a certificate from a private key and a CA response chain (leaf, intermediates, root bundle).
    pub fn new(key: PrivateKeyDer<'static>, chain: &[String]) -> Result<Self, CertificateError> {
        let (certs, root_bundle) = match chain {
            [] => return Err(CertificateError::EmptyChain),
            [_] => return Err(CertificateError::NoRoots),
            [certs @ .., roots] => (certs, roots),
        };
        // Elements before the root bundle hold one certificate each, but tolerate a CA that
        // puts the leaf and its intermediates into one element.
        let mut own_chain = Vec::with_capacity(certs.len());
        for (index, pem) in certs.iter().enumerate() {
            let before = own_chain.len();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                own_chain.push(cert.map_err(|_| CertificateError::Pem { index })?);
            }
            if own_chain.len() == before {
                return Err(CertificateError::Pem { index });
            }
        }
        let mut roots = Vec::new();
        let mut store = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(root_bundle.as_bytes()) {
            match cert {
                Ok(cert) => match store.add(cert.clone()) {
                    Ok(()) => roots.push(cert),
                    Err(e) => tracing::warn!("skipping unusable root certificate from the CA: {e}"),
                },
                Err(e) => tracing::warn!("skipping unparsable root certificate from the CA: {e}"),
            }
        }
        if roots.is_empty() {
            return Err(CertificateError::NoUsableRoot);
        }

        let leaf = own_chain.first().ok_or(CertificateError::Pem { index: 0 })?;
        let info = CertInfo::parse(leaf)?;
        let identity = spiffe_identity(leaf)?;

        let key = tls::certified_key(own_chain.clone(), key)?;
        let roots_store = Arc::new(store);
        let server_config = tls::server_config(&key, roots_store.clone(), &identity.trust_domain)?;

        let mut cert_chain = vec![info.entry(leaf)];
        for cert in &own_chain[1..] {
            cert_chain.push(CertInfo::parse(cert)?.entry(cert));
        }
        let root_certs = roots.iter().filter_map(|c| CertInfo::parse(c).ok().map(|i| i.entry(c))).collect();

        Ok(WorkloadCertificate {
            identity,
            not_before: info.not_before,
            not_after: info.not_after,
            roots: roots_store,
            key,
            server_config,
            dump: CertDump { cert_chain, root_certs },
        })
    }

    /// The identity named by the leaf's one URI SAN.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Start of the leaf's validity.
    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    /// End of the leaf's validity.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// mTLS server config for inbound HBONE (client certificate required, same trust domain).
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server_config.clone()
    }

    /// mTLS client config for outbound HBONE that accepts a server presenting any of `expected`.
    pub fn client_config(&self, expected: &[Identity]) -> Arc<rustls::ClientConfig> {
        tls::client_config(&self.key, self.roots.clone(), expected)
    }

    /// The chain and roots for `/config_dump`.
    pub fn dump(&self) -> CertDump {
        self.dump.clone()
    }
}

impl fmt::Debug for WorkloadCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadCertificate")
            .field("identity", &self.identity.to_string())
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// The identity of the leaf of a peer's chain (as from rustls `peer_certificates()`): its one URI
/// SAN, a SPIFFE id; `None` for any other shape (the verifiers refuse those in the handshake).
pub fn peer_identity(chain: &[CertificateDer<'_>]) -> Option<Identity> {
    spiffe_identity(chain.first()?).ok()
}

/// The URI and DNS names of a certificate's SAN extension, in order (what Istio's CA takes as a
/// client certificate's identities).
pub fn certificate_names(der: &[u8]) -> Result<Vec<String>, SanError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| SanError::Parse(e.to_string()))?;
    let san = cert.subject_alternative_name().map_err(|e| SanError::Parse(e.to_string()))?;
    Ok(san
        .iter()
        .flat_map(|san| san.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(n) | GeneralName::DNSName(n) => Some((*n).to_owned()),
            _ => None,
        })
        .collect())
}

/// The SPIFFE identity of a certificate: exactly one URI SAN, and it must be a SPIFFE id.
pub(crate) fn spiffe_identity(der: &[u8]) -> Result<Identity, SanError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| SanError::Parse(e.to_string()))?;
    one_identity(&cert)
}

/// URI SANs listed in a [`SanError::ManyUris`], and the length each is cut to.
const SHOWN_URIS: usize = 4;
const SHOWN_URI_LEN: usize = 128;

fn one_identity(cert: &X509Certificate<'_>) -> Result<Identity, SanError> {
    let san = cert.subject_alternative_name().map_err(|e| SanError::Parse(e.to_string()))?;
    let uris: Vec<&str> = san
        .iter()
        .flat_map(|san| san.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [] => Err(SanError::NoUri),
        [uri] => uri.parse().map_err(|_| SanError::NotSpiffe(clip(uri))),
        _ => Err(SanError::ManyUris {
            count: uris.len(),
            shown: uris.iter().take(SHOWN_URIS).map(|u| clip(u)).collect(),
        }),
    }
}

/// Cuts a peer-supplied string for an error message (at a char boundary).
fn clip(s: &str) -> String {
    if s.len() <= SHOWN_URI_LEN {
        return s.to_owned();
    }
    let mut end = SHOWN_URI_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The parts of a certificate the dump and the manager need.
struct CertInfo {
    not_before: SystemTime,
    not_after: SystemTime,
    serial: String,
}

impl CertInfo {
    fn parse(der: &CertificateDer<'_>) -> Result<Self, CertificateError> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| CertificateError::Parse(e.to_string()))?;
        let validity = cert.validity();
        Ok(CertInfo {
            not_before: system_time(validity.not_before.timestamp()),
            not_after: system_time(validity.not_after.timestamp()),
            serial: cert.tbs_certificate.serial.to_string(),
        })
    }

    fn entry(&self, der: &CertificateDer<'_>) -> CertEntry {
        let pem = pem_encode(der);
        CertEntry {
            pem: base64::engine::general_purpose::STANDARD.encode(pem),
            serial_number: self.serial.clone(),
            valid_from: rfc3339(self.not_before),
            expiration_time: rfc3339(self.not_after),
        }
    }
}

fn system_time(unix_secs: i64) -> SystemTime {
    if unix_secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(unix_secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(unix_secs.unsigned_abs())
    }
}

/// `2024-01-02T03:04:05Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    };
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(dt) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            dt.year(),
            u8::from(dt.month()),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second()
        ),
        Err(_) => String::new(),
    }
}

/// RFC 3339 in UTC with milliseconds (`2026-01-02T03:04:05.678Z`), as access logs show times.
pub fn rfc3339_millis(t: SystemTime) -> String {
    let whole = rfc3339(t);
    let millis = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_millis());
    match whole.strip_suffix('Z') {
        Some(s) => format!("{s}.{millis:03}Z"),
        None => whole,
    }
}

/// PEM text of one DER certificate, 64 columns, trailing newline.
pub(crate) fn pem_encode(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 60);
    out.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        // base64 output is ASCII, so every chunk is valid UTF-8.
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_utc_seconds() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_700_000_000)), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn chain_shape_errors() {
        let key = || PrivateKeyDer::Pkcs8(Vec::new().into());
        assert!(matches!(WorkloadCertificate::new(key(), &[]), Err(CertificateError::EmptyChain)));
        assert!(matches!(WorkloadCertificate::new(key(), &["x".into()]), Err(CertificateError::NoRoots)));
        assert!(matches!(
            WorkloadCertificate::new(key(), &["x".into(), "y".into()]),
            Err(CertificateError::Pem { index: 0 })
        ));
    }

    proptest::proptest! {
        #[test]
        fn untrusted_bytes_never_panic(der in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            proptest::prop_assert_eq!(peer_identity(&[CertificateDer::from(der)]), None);
        }

        #[test]
        fn untrusted_chains_never_panic(chain in proptest::collection::vec("\\PC{0,64}", 0..4)) {
            let key = PrivateKeyDer::Pkcs8(Vec::new().into());
            proptest::prop_assert!(WorkloadCertificate::new(key, &chain).is_err());
        }
    }

    #[test]
    fn peer_identity_of_garbage_is_none() {
        assert_eq!(peer_identity(&[]), None);
        assert_eq!(peer_identity(&[CertificateDer::from(vec![1, 2, 3])]), None);
    }
}
