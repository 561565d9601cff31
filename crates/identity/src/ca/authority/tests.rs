use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_ECDSA_P521_SHA512, PKCS_ED25519};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::UnixTime;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::X509Certificate;

use super::*;
use crate::csr::MAX_CSR_BYTES;

const TD: &str = "cluster.local";

fn csr_with(key: &KeyPair, cn: Option<&str>) -> String {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    if let Some(cn) = cn {
        params.distinguished_name.push(DnType::CommonName, cn);
    }
    params.subject_alt_names = vec![rcgen::SanType::URI("spiffe://evil/ns/x/sa/y".try_into().expect("uri"))];
    params.serialize_request(key).expect("csr").pem().expect("pem")
}

fn p256_csr() -> String {
    csr_with(&KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key"), None)
}

fn root() -> SigningAuthority {
    SigningAuthority::self_signed(TD, KeyAlgorithm::EcdsaP256, SELF_SIGNED_ROOT_TTL).expect("root").0
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem")
}

fn validity(hours: u64) -> Validity {
    let now = OffsetDateTime::now_utc();
    Validity {
        not_before: sub(now, BACKDATE),
        not_after: add(now, Duration::from_secs(hours * 3600)).expect("t"),
    }
}

/// webpki client-certificate verification of `chain` (leaf first) against `roots`.
fn verifies(
    chain: &[CertificateDer<'static>],
    roots: &[CertificateDer<'static>],
) -> Result<(), rustls::Error> {
    let mut store = RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).expect("root");
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::new(store),
        Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    )
    .build()
    .expect("verifier");
    verifier.verify_client_cert(&chain[0], &chain[1..], UnixTime::now()).map(|_| ())
}

use std::sync::Arc;

#[test]
fn issued_leaf_has_istios_fields() {
    let ca = root();
    let ids =
        vec!["spiffe://cluster.local/ns/a/sa/b".to_owned(), "10.1.2.3".to_owned(), "istiod.svc".to_owned()];
    let chain = ca.sign(&p256_csr(), &ids, validity(24)).expect("sign");
    assert_eq!(chain.len(), 2, "self-signed: [leaf, root]");
    assert_eq!(chain[1], ca.root_bundle_pem());
    assert!(chain.iter().all(|c| c.ends_with('\n')));
    let leaf_der = der(&chain[0]);
    let (_, leaf) = X509Certificate::from_der(&leaf_der).expect("x509");

    assert_eq!(leaf.subject().iter().count(), 0, "empty subject (the CSR had no CN)");
    assert!(leaf.serial.bits() <= 128, "serial below 2^128");
    let v = leaf.validity();
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let nb = v.not_before.timestamp();
    assert!((now - 125..=now - 115).contains(&nb), "NotBefore now-2min, got {} s before now", now - nb);
    assert_eq!(v.not_after.timestamp() - nb, 24 * 3600 + 120);

    let mut seen = Vec::new();
    for ext in leaf.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                assert!(ext.critical, "SAN critical");
                assert_eq!(
                    san.general_names,
                    vec![
                        GeneralName::URI("spiffe://cluster.local/ns/a/sa/b"),
                        GeneralName::IPAddress(&[10, 1, 2, 3]),
                        GeneralName::DNSName("istiod.svc"),
                    ],
                    "the CSR's own SAN is ignored"
                );
                seen.push("san");
            }
            ParsedExtension::KeyUsage(ku) => {
                assert!(ku.digital_signature() && ku.key_encipherment());
                assert!(!ku.key_cert_sign());
                seen.push("ku");
            }
            ParsedExtension::ExtendedKeyUsage(eku) => {
                assert!(eku.server_auth && eku.client_auth);
                seen.push("eku");
            }
            ParsedExtension::BasicConstraints(bc) => {
                assert!(!bc.ca);
                seen.push("bc");
            }
            _ => {}
        }
    }
    seen.sort();
    assert_eq!(seen, ["bc", "eku", "ku", "san"]);
    verifies(&[leaf_der], ca.roots()).expect("leaf chains to the root");
}

#[test]
fn a_csr_with_a_common_name_gets_the_first_san_as_cn() {
    let ca = root();
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let csr = csr_with(&key, Some("whatever"));
    let short = ["spiffe://cluster.local/ns/a/sa/b".to_owned()];
    let chain = ca.sign(&csr, &short, validity(1)).expect("sign");
    let leaf = der(&chain[0]);
    let (_, cert) = X509Certificate::from_der(&leaf).expect("x509");
    let cn: Vec<_> = cert.subject().iter_common_name().filter_map(|c| c.as_str().ok()).collect();
    assert_eq!(cn, ["spiffe://cluster.local/ns/a/sa/b"]);
    // The SAN stays critical even with a subject.
    assert!(cert.extensions().iter().any(|e| e.oid.to_id_string() == "2.5.29.17" && e.critical));

    let long = [format!("spiffe://cluster.local/ns/{}/sa/b", "n".repeat(60))];
    let chain = ca.sign(&csr, &long, validity(1)).expect("sign");
    let leaf = der(&chain[0]);
    let (_, cert) = X509Certificate::from_der(&leaf).expect("x509");
    assert_eq!(cert.subject().iter().count(), 0, "a SAN over 64 characters is not a CN");
}

#[test]
fn csr_checks() {
    let ca = root();
    let ids = ["spiffe://cluster.local/ns/a/sa/b".to_owned()];
    let sign = |csr: &str| ca.sign(csr, &ids, validity(1)).err().map(|e| (e.grpc_code(), e.to_string()));
    let invalid = tonic::Code::InvalidArgument;
    assert_eq!(sign("not a csr"), Some((invalid, "the CSR is not a PEM CERTIFICATE REQUEST".to_owned())));
    let garbage = "-----BEGIN CERTIFICATE REQUEST-----\nAAECAwQ=\n-----END CERTIFICATE REQUEST-----\n";
    let (code, msg) = sign(garbage).expect("refused");
    assert_eq!(code, invalid);
    assert!(msg.starts_with("the CSR cannot be parsed: "), "{msg}");
    let big = "x".repeat(MAX_CSR_BYTES + 1);
    assert_eq!(
        sign(&big),
        Some((invalid, format!("the CSR is {} bytes, more than the 65536 accepted", MAX_CSR_BYTES + 1)))
    );

    // A flipped bit in the signature.
    let good = p256_csr();
    let mut bytes = rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(good.as_bytes())
        .expect("pem")
        .as_ref()
        .to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let tampered = pem_wrap("CERTIFICATE REQUEST", &bytes);
    assert_eq!(
        sign(&tampered),
        Some((invalid, "the CSR's signature does not verify with its own public key".to_owned()))
    );

    let key_type = |alg| {
        let key = KeyPair::generate_for(alg).expect("key");
        sign(&csr_with(&key, None))
    };
    let refused = |what: &str| {
        Some((
            invalid,
            format!(
                "the CSR's public key is {what}; this CA issues certificates for ECDSA P-256, ECDSA P-384, or RSA of 2048 to 8192 bits keys"
            ),
        ))
    };
    assert_eq!(key_type(&PKCS_ED25519), refused("Ed25519"));
    assert_eq!(key_type(&PKCS_ECDSA_P521_SHA512), refused("ECDSA on curve 1.3.132.0.35"));
    assert_eq!(key_type(&PKCS_ECDSA_P384_SHA384), None);
    assert_eq!(key_type(&PKCS_ECDSA_P256_SHA256), None);
    assert_eq!(key_type(&rcgen::PKCS_RSA_SHA256), None, "RSA 2048");
}

#[test]
fn rsa_modulus_bits() {
    assert_eq!(crate::csr::modulus_bits(&[0x00, 0x80, 0, 0]), 24);
    assert_eq!(crate::csr::modulus_bits(&[0x7f, 0xff]), 15);
    assert_eq!(crate::csr::modulus_bits(&[0, 0]), 0);
    assert_eq!(crate::csr::modulus_bits(&[]), 0);
}

#[test]
fn ttl_policy() {
    let policy = TtlPolicy::default();
    let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("t");
    let far = now + time::Duration::days(3650);
    for requested in [0, -5] {
        let v = policy.validity(requested, now, far).expect("default");
        assert_eq!(v.not_after - now, time::Duration::hours(24));
        assert_eq!(now - v.not_before, time::Duration::minutes(2));
    }
    let v = policy.validity(3600, now, far).expect("1h");
    assert_eq!(v.not_after - now, time::Duration::hours(1));
    let max = 90 * 24 * 3600;
    assert!(policy.validity(max, now, far).is_ok(), "exactly the max is allowed");
    let err = policy.validity(max + 1, now, far).expect_err("over the max");
    assert_eq!(err.grpc_code(), tonic::Code::InvalidArgument);
    assert_eq!(err.to_string(), "requested TTL 2160h0m1s is greater than the max allowed TTL 2160h0m0s");
    // Clamped to the signing certificate's end.
    let soon = now + time::Duration::hours(2);
    assert_eq!(policy.validity(0, now, soon).expect("clamped").not_after, soon);
    let err = policy.validity(0, now, now).expect_err("expired CA");
    assert_eq!(err.grpc_code(), tonic::Code::Internal);
}

#[test]
fn go_durations() {
    assert_eq!(go_duration(Duration::from_secs(86400)), "24h0m0s");
    assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
    assert_eq!(go_duration(Duration::from_secs(5)), "5s");
    assert_eq!(go_duration(Duration::ZERO), "0s");
}

/// A root and an intermediate signed by it: (root PEM, intermediate PEM, intermediate key PEM).
fn root_and_intermediate() -> (String, String, String) {
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::OrganizationName, "Example Corp");
    params.distinguished_name.push(DnType::CommonName, "Example Root");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let root_cert = params.self_signed(&root_key).expect("root");
    let root_issuer = Issuer::new(params, root_key);
    let inter_key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::OrganizationName, "Example Corp");
    params.distinguished_name.push(DnType::CommonName, "Mesh Intermediate");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.not_after = OffsetDateTime::now_utc() + time::Duration::days(700);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.use_authority_key_identifier_extension = true;
    let inter = params.signed_by(&inter_key, &root_issuer).expect("intermediate");
    (root_cert.pem(), inter.pem(), inter_key.serialize_pem())
}

#[test]
fn plugged_intermediate_chain_shape_and_verification() {
    let (root_pem, inter_pem, key_pem) = root_and_intermediate();
    let other_root = root();
    let bundle = format!("{root_pem}{}", other_root.root_bundle_pem());
    let chain_pem = format!("{inter_pem}{root_pem}");
    let ca = SigningAuthority::from_pem(&inter_pem, &key_pem, &chain_pem, &bundle).expect("plugged");
    assert_eq!(ca.algorithm(), KeyAlgorithm::EcdsaP384);
    let chain =
        ca.sign(&p256_csr(), &["spiffe://cluster.local/ns/a/sa/b".to_owned()], validity(1)).expect("sign");
    assert_eq!(chain.len(), 4, "leaf, the two cert-chain.pem elements, the root bundle");
    assert_eq!(chain[1], inter_pem);
    assert_eq!(chain[2], root_pem);
    assert_eq!(chain[3], bundle, "the whole bundle, both roots, as the last element");
    let certs: Vec<_> = chain[..2].iter().map(|p| der(p)).collect();
    verifies(&certs, &[der(&root_pem)]).expect("leaf → intermediate → root");
    let (_, leaf) = X509Certificate::from_der(&certs[0]).expect("x509");
    let inter_der = der(&inter_pem);
    let (_, inter) = X509Certificate::from_der(&inter_der).expect("x509");
    assert_eq!(leaf.issuer().as_raw(), inter.subject().as_raw(), "issuer name byte for byte");

    let server = ca
        .issue_server(&["b.svc".to_owned(), "a.svc".to_owned(), "b.svc".to_owned()], SELF_SIGNED_ROOT_TTL)
        .expect("server cert");
    assert_eq!(server.chain.len(), 3, "leaf and the chain elements");
    let (_, leaf) = X509Certificate::from_der(&server.chain[0]).expect("x509");
    let names: Vec<_> = leaf
        .subject_alternative_name()
        .expect("san")
        .expect("present")
        .value
        .general_names
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(names, ["DNSName(a.svc)", "DNSName(b.svc)"], "sorted, de-duplicated");
    assert_eq!(
        leaf.validity().not_after.timestamp(),
        ca.not_after().unix_timestamp(),
        "clamped to the intermediate"
    );
    assert_eq!(
        leaf.public_key()
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .map(|o| o.to_id_string())
            .as_deref(),
        Some("1.3.132.0.34"),
        "P-384 like the CA key"
    );
}

#[test]
fn unusable_key_material_is_refused() {
    let (root_pem, inter_pem, key_pem) = root_and_intermediate();
    let other = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key").serialize_pem();
    let err = |r: Result<SigningAuthority, AuthorityError>| r.err().map(|e| e.to_string()).expect("refused");
    assert_eq!(
        err(SigningAuthority::from_pem(&inter_pem, &other, "", &root_pem)),
        "the private key does not belong to the signing certificate"
    );
    assert!(
        err(SigningAuthority::from_pem(&inter_pem, &key_pem, "", root().root_bundle_pem()))
            .starts_with("the signing certificate does not chain to any certificate of the root bundle"),
    );
    assert_eq!(
        err(SigningAuthority::from_pem(&inter_pem, &key_pem, "", "")),
        "the root bundle holds no certificate"
    );
    assert!(err(SigningAuthority::from_pem(&inter_pem, "junk", "", &root_pem)).starts_with("not a PEM"));

    // A leaf is not a CA.
    let ca = root();
    let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let chain = ca.sign(&csr_with(&leaf_key, None), &["x.svc".to_owned()], validity(1)).expect("sign");
    assert_eq!(
        err(SigningAuthority::from_pem(&chain[0], &leaf_key.serialize_pem(), "", &chain[1])),
        "the signing certificate is not a CA certificate (basicConstraints CA:TRUE is required)"
    );
}

#[test]
fn rsa_self_signed_root_and_server_key() {
    let (ca, cert_pem, key_pem) =
        SigningAuthority::self_signed(TD, KeyAlgorithm::Rsa2048, SELF_SIGNED_ROOT_TTL).expect("rsa root");
    assert_eq!(ca.algorithm(), KeyAlgorithm::Rsa2048);
    let (_, cert) = X509Certificate::from_der(&ca.roots()[0]).expect("x509");
    assert_eq!(cert.subject().to_string(), "O=cluster.local", "O=<trust domain>, no CN");
    let reloaded = SigningAuthority::from_pem(&cert_pem, &key_pem, "", &cert_pem).expect("reload");
    let server =
        reloaded.issue_server(&["istiod.istio-system.svc".to_owned()], SELF_SIGNED_ROOT_TTL).expect("server");
    assert_eq!(server.chain.len(), 1);
    verifies(&server.chain, ca.roots()).expect("verifies");
}

fn pem_wrap(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("ascii"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}
