//! A peer's leaf certificate (DER) as the proxy reads its SPIFFE identity from the URI SANs.
#![no_main]

use rustls_pki_types::CertificateDer;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ambit_identity::peer_identity(&[CertificateDer::from(data)]);
});
