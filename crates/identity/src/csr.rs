//! Certificate signing requests: a fresh ECDSA P-256 key and a CSR naming one SPIFFE identity.

use rcgen::{CertificateParams, DistinguishedName, KeyPair, PKCS_ECDSA_P256_SHA256, SanType};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::Identity;
use crate::ca::CaError;

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
}
