//! Certificate signing requests: a fresh ECDSA P-256 key and a CSR naming one SPIFFE identity
//! (the client side), and the checks a CA makes of a CSR it is sent (the server side).

use rcgen::{CertificateParams, DistinguishedName, KeyPair, PKCS_ECDSA_P256_SHA256, SanType};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateSigningRequestDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
};
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::Identity;
use crate::ca::CaError;

/// Largest PEM CSR a CA parses (an RSA 8192 CSR is about 2.5 KiB).
pub const MAX_CSR_BYTES: usize = 64 * 1024;
/// Smallest RSA modulus accepted.
pub const MIN_RSA_BITS: usize = 2048;
/// Largest RSA modulus accepted (verifying bigger keys costs the peers more than it buys).
pub const MAX_RSA_BITS: usize = 8192;
/// The key types a CA accepts, as error messages name them.
pub const ACCEPTED_KEYS: &str = "ECDSA P-256, ECDSA P-384, or RSA of 2048 to 8192 bits";

/// What a CA takes from a CSR it accepted.
pub(crate) struct ParsedCsr {
    /// The requester's public key.
    pub(crate) public_key: rcgen::SubjectPublicKeyInfo,
    /// Whether the subject has a common name (the leaf then gets CN = its first SAN).
    pub(crate) has_common_name: bool,
}

/// Why a CA refuses a CSR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// Larger than [`MAX_CSR_BYTES`].
    #[error("the CSR is {0} bytes, more than the {MAX_CSR_BYTES} accepted")]
    TooLarge(usize),
    /// No PEM `CERTIFICATE REQUEST` block.
    #[error("the CSR is not a PEM CERTIFICATE REQUEST")]
    NotPem,
    /// The DER is not a PKCS#10 request.
    #[error("the CSR cannot be parsed: {0}")]
    Parse(String),
    /// The self-signature does not verify.
    #[error("the CSR's signature does not verify with its own public key")]
    Signature,
    /// A key type the CA does not issue for.
    #[error("the CSR's public key is {0}; this CA issues certificates for {ACCEPTED_KEYS} keys")]
    KeyType(String),
}

/// A CSR in PEM and the private key it was made with.
pub(crate) struct Csr {
    /// PEM `CERTIFICATE REQUEST`.
    pub(crate) pem: String,
    /// PKCS#8 private key of the request.
    pub(crate) key: PrivateKeyDer<'static>,
}

/// Creates a CSR per ztunnel: empty subject and one critical SAN extension with the URI.
pub(crate) fn generate(identity: &Identity) -> Result<Csr, CaError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CaError::Csr)?;
    let mut params = CertificateParams::default();
    // rcgen marks the SAN extension critical because the subject is empty (RFC 5280 §4.2.1.6).
    params.distinguished_name = DistinguishedName::new();
    let uri = identity.to_string().try_into().map_err(CaError::Csr)?;
    params.subject_alt_names = vec![SanType::URI(uri)];
    let pem = params.serialize_request(&key).and_then(|csr| csr.pem()).map_err(CaError::Csr)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok(Csr { pem, key })
}

/// Parses and checks a PEM CSR: one PKCS#10 request, its signature verifies with its own key,
/// and the key is of an accepted type. The CSR's subject and extensions are not used (the
/// certificate names whoever the caller authenticated as).
pub(crate) fn parse(pem: &str) -> Result<ParsedCsr, CsrError> {
    if pem.len() > MAX_CSR_BYTES {
        return Err(CsrError::TooLarge(pem.len()));
    }
    let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes()).map_err(|_| CsrError::NotPem)?;
    let (rest, request) =
        X509CertificationRequest::from_der(der.as_ref()).map_err(|e| CsrError::Parse(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CsrError::Parse(format!("{} bytes after the request", rest.len())));
    }
    let info = &request.certification_request_info;
    check_key_type(&info.subject_pki)?;
    request.verify_signature().map_err(|_| CsrError::Signature)?;
    let public_key = rcgen::SubjectPublicKeyInfo::from_der(info.subject_pki.raw)
        .map_err(|e| CsrError::KeyType(format!("unusable ({e})")))?;
    let has_common_name = info.subject.iter_common_name().next().is_some();
    Ok(ParsedCsr { public_key, has_common_name })
}

/// ECDSA on P-256 or P-384, or RSA of 2048..=8192 bits: what Istio's agents and ztunnel
/// generate and every TLS stack in a mesh verifies. Ed25519 and P-521 are refused because
/// common peers (FIPS builds, ring) cannot use them, so a certificate for them would only fail
/// later in a handshake.
fn check_key_type(spki: &SubjectPublicKeyInfo<'_>) -> Result<(), CsrError> {
    let alg = &spki.algorithm.algorithm;
    if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki.algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok());
        return match curve {
            Some(c) if c == OID_EC_P256 || c == OID_NIST_EC_P384 => Ok(()),
            Some(c) => Err(CsrError::KeyType(format!("ECDSA on curve {c}"))),
            None => Err(CsrError::KeyType("ECDSA without a named curve".to_owned())),
        };
    }
    if *alg == OID_PKCS1_RSAENCRYPTION {
        let bits = match spki.parsed() {
            Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => modulus_bits(rsa.modulus),
            _ => return Err(CsrError::KeyType("an RSA key that cannot be parsed".to_owned())),
        };
        return if (MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
            Ok(())
        } else {
            Err(CsrError::KeyType(format!("RSA of {bits} bits")))
        };
    }
    let name = match alg.to_id_string().as_str() {
        "1.3.101.112" => "Ed25519".to_owned(),
        "1.3.101.113" => "Ed448".to_owned(),
        "1.2.840.113549.1.1.10" => "RSA-PSS".to_owned(),
        "1.2.840.10040.4.1" => "DSA".to_owned(),
        other => format!("of algorithm {other}"),
    };
    Err(CsrError::KeyType(name))
}

/// Bits of a big-endian unsigned modulus (leading zero bytes ignored).
pub(crate) fn modulus_bits(modulus: &[u8]) -> usize {
    let trimmed: &[u8] = match modulus.iter().position(|b| *b != 0) {
        Some(i) => &modulus[i..],
        None => &[],
    };
    match trimmed.first() {
        Some(first) => trimmed.len() * 8 - first.leading_zeros() as usize,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::CertificateSigningRequestDer;
    use rustls_pki_types::pem::PemObject;
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::cri_attributes::ParsedCriAttribute;
    use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension};

    #[test]
    fn csr_has_empty_subject_and_one_critical_uri_san() {
        let id = Identity::new("cluster.local", "default", "web");
        let csr = generate(&id).expect("csr");
        assert!(csr.pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        let der = CertificateSigningRequestDer::from_pem_slice(csr.pem.as_bytes()).expect("pem");
        let (_, req) = X509CertificationRequest::from_der(der.as_ref()).expect("parse");
        req.verify_signature().expect("self-signed CSR");
        let info = &req.certification_request_info;
        assert_eq!(info.subject.iter().count(), 0, "empty subject");
        let attrs: Vec<_> = info.iter_attributes().collect();
        assert_eq!(attrs.len(), 1, "one extensionRequest attribute");
        let ParsedCriAttribute::ExtensionRequest(req_ext) = attrs[0].parsed_attribute() else {
            panic!("not an extension request");
        };
        assert_eq!(req_ext.extensions.len(), 1);
        let ext = &req_ext.extensions[0];
        assert!(ext.critical, "SAN must be critical");
        let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() else {
            panic!("not a SAN");
        };
        assert_eq!(san.general_names, vec![GeneralName::URI("spiffe://cluster.local/ns/default/sa/web")]);
        assert!(matches!(csr.key, PrivateKeyDer::Pkcs8(_)));
    }

    proptest::proptest! {
        /// Arbitrary bytes as the body of a PEM CSR, or as the whole text: refused, never a panic.
        #[test]
        fn parsing_untrusted_csrs_never_panics(der in proptest::collection::vec(proptest::num::u8::ANY, 0..600), text in "\\PC{0,200}") {
            use base64::Engine;
            let body = base64::engine::general_purpose::STANDARD.encode(&der);
            let pem = format!("-----BEGIN CERTIFICATE REQUEST-----\n{body}\n-----END CERTIFICATE REQUEST-----\n");
            proptest::prop_assert!(parse(&pem).is_err());
            proptest::prop_assert!(parse(&text).is_err());
        }

        /// A real CSR with one byte changed anywhere: accepted only if unchanged in meaning,
        /// never a panic.
        #[test]
        fn mutated_csrs_never_panic(index in 0usize..1000, byte in proptest::num::u8::ANY) {
            let id = Identity::new("cluster.local", "default", "web");
            let csr = generate(&id).expect("csr");
            let mut der = CertificateSigningRequestDer::from_pem_slice(csr.pem.as_bytes()).expect("pem").as_ref().to_vec();
            let i = index % der.len();
            der[i] = byte;
            use base64::Engine;
            let body = base64::engine::general_purpose::STANDARD.encode(&der);
            let _ = parse(&format!("-----BEGIN CERTIFICATE REQUEST-----\n{body}\n-----END CERTIFICATE REQUEST-----\n"));
        }
    }
}
