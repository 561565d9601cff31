//! A certificate signing request as `CreateCertificate` receives it: parsing, the signature and
//! key-type checks and signing never panic; a CSR that is accepted yields a chain of the leaf
//! and the root, and the leaf names exactly the identity the caller authenticated as.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use ambit_identity::{KeyAlgorithm, SigningAuthority, TtlPolicy};

fn authority() -> &'static SigningAuthority {
    static CA: OnceLock<SigningAuthority> = OnceLock::new();
    CA.get_or_init(|| {
        SigningAuthority::self_signed("cluster.local", KeyAlgorithm::EcdsaP256, Duration::from_secs(86_400))
            .map(|(ca, _, _)| ca)
            .unwrap_or_else(|e| panic!("a root: {e}"))
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(pem) = std::str::from_utf8(data) else { return };
    let ca = authority();
    let now = time::OffsetDateTime::now_utc();
    let Ok(validity) = TtlPolicy::default().validity(3600, now, ca.not_after()) else { return };
    let id = "spiffe://cluster.local/ns/demo/sa/web".to_owned();
    if let Ok(chain) = ca.sign(pem, std::slice::from_ref(&id), validity) {
        assert_eq!(chain.len(), 2);
        let leaf = rustls_pki_types::CertificateDer::from(
            pem_der(&chain[0]).unwrap_or_else(|| panic!("the leaf is not PEM")),
        );
        let names = ambit_identity::certificate_names(&leaf).unwrap_or_else(|e| panic!("leaf SANs: {e}"));
        assert_eq!(names, vec![id]);
    }
});

fn pem_der(pem: &str) -> Option<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).ok().map(|c| c.to_vec())
}
