use std::os::unix::fs::PermissionsExt;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use super::*;

fn config(cacerts: &Path, state: Option<&Path>) -> MaterialConfig {
    MaterialConfig {
        cacerts_dir: cacerts.to_owned(),
        state_dir: state.map(Path::to_owned),
        trust_domain: "cluster.local".to_owned(),
        algorithm: KeyAlgorithm::EcdsaP256,
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

#[test]
fn self_signed_root_is_created_once_and_reused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = tmp.path().join("state");
    let cfg = config(&tmp.path().join("no-cacerts"), Some(&state));
    let (first, source) = load(&cfg).expect("first start");
    assert_eq!(source, MaterialSource::Generated(Some(state.clone())));
    assert_eq!(mode(&state.join(CA_KEY)), 0o600);
    assert_eq!(mode(&state), 0o700);
    assert_eq!(fs::read_to_string(state.join(ROOT_CERT)).expect("root"), first.root_bundle_pem());
    assert!(first.cert_chain_pem().is_empty());

    let (second, source) = load(&cfg).expect("restart");
    assert_eq!(source, MaterialSource::Loaded(state.clone()));
    assert_eq!(second.root_bundle_pem(), first.root_bundle_pem(), "the same root after a restart");

    // A lost root-cert.pem is written again from the root.
    fs::remove_file(state.join(ROOT_CERT)).expect("rm");
    load(&cfg).expect("third start");
    assert_eq!(fs::read_to_string(state.join(ROOT_CERT)).expect("root"), first.root_bundle_pem());
}

#[test]
fn a_lost_key_refuses_to_start_and_a_lone_key_is_replaced() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = tmp.path().join("state");
    let cfg = config(&tmp.path().join("no-cacerts"), Some(&state));
    load(&cfg).expect("first start");
    fs::remove_file(state.join(CA_KEY)).expect("rm key");
    let err = load(&cfg).err().expect("key lost");
    assert_eq!(
        err.to_string(),
        format!(
            "{0}/ca-cert.pem exists but {0}/ca-key.pem does not: certificates were issued under that root; restore the key, or remove {0}/ca-cert.pem to start over with a new root (every workload then needs new certificates)",
            state.display()
        )
    );

    // A key without its certificate (a crash between the writes) is replaced by a new root.
    fs::remove_file(state.join(CA_CERT)).expect("rm cert");
    fs::write(state.join(CA_KEY), "half-written").expect("write");
    let (_, source) = load(&cfg).expect("regenerated");
    assert_eq!(source, MaterialSource::Generated(Some(state.clone())));
}

/// A root and an intermediate CA: (root PEM, intermediate PEM, intermediate key PEM).
fn plugged_pems() -> (String, String, String) {
    let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "Plugged Root");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let root = params.self_signed(&root_key).expect("root");
    let issuer = Issuer::new(params, root_key);
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "Plugged Intermediate");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let inter = params.signed_by(&key, &issuer).expect("intermediate");
    (root.pem(), inter.pem(), key.serialize_pem())
}

#[test]
fn plugged_ca_istio_layout() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cacerts = tmp.path().join("cacerts");
    fs::create_dir(&cacerts).expect("mkdir");
    let (root, inter, key) = plugged_pems();
    fs::write(cacerts.join(CA_CERT), &inter).expect("write");
    fs::write(cacerts.join(CA_KEY), &key).expect("write");
    fs::write(cacerts.join(ROOT_CERT), &root).expect("write");
    fs::write(cacerts.join(CERT_CHAIN), format!("{inter}{root}")).expect("write");
    let state = tmp.path().join("state");
    let (authority, source) = load(&config(&cacerts, Some(&state))).expect("plugged");
    assert!(matches!(source, MaterialSource::Plugged { .. }), "{source:?}");
    assert_eq!(authority.root_bundle_pem(), root);
    assert_eq!(authority.cert_chain_pem(), [inter.clone(), root.clone()]);
    assert!(!state.exists(), "no self-signed root is made when a CA is plugged in");
}

#[test]
fn plugged_ca_tls_secret_layout() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, inter, key) = plugged_pems();
    fs::write(tmp.path().join(TLS_CRT), &inter).expect("write");
    fs::write(tmp.path().join(TLS_KEY), &key).expect("write");
    fs::write(tmp.path().join(CA_CRT), &root).expect("write");
    let (authority, source) = load(&config(tmp.path(), None)).expect("plugged");
    assert!(matches!(source, MaterialSource::Plugged { .. }), "{source:?}");
    assert_eq!(authority.root_bundle_pem(), root);
    assert_eq!(authority.cert_chain_pem(), [inter, root], "chain = tls.crt + ca.crt");
}

#[test]
fn an_incomplete_bundle_names_the_missing_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, _, key) = plugged_pems();
    fs::write(tmp.path().join(CA_KEY), &key).expect("write");
    fs::write(tmp.path().join(ROOT_CERT), &root).expect("write");
    let err = load(&config(tmp.path(), None)).err().expect("incomplete");
    assert_eq!(
        err.to_string(),
        format!(
            "incomplete signing CA bundle in {}: missing ca-cert.pem, cert-chain.pem; provide all of ca-cert.pem, ca-key.pem, root-cert.pem and cert-chain.pem (or tls.crt, tls.key and ca.crt), or none of them to use a self-signed root",
            tmp.path().display()
        )
    );

    let tls = tempfile::tempdir().expect("tempdir");
    fs::write(tls.path().join(TLS_CRT), &root).expect("write");
    let err = load(&config(tls.path(), None)).err().expect("incomplete");
    assert!(
        matches!(&err, MaterialError::Incomplete { missing, .. } if missing == &["tls.key", "ca.crt"]),
        "{err}"
    );
}

#[test]
fn an_unusable_plugged_ca_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, inter, _) = plugged_pems();
    let other = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    fs::write(tmp.path().join(CA_CERT), &inter).expect("write");
    fs::write(tmp.path().join(CA_KEY), other.serialize_pem()).expect("write");
    fs::write(tmp.path().join(ROOT_CERT), &root).expect("write");
    fs::write(tmp.path().join(CERT_CHAIN), "").expect("write");
    let err = load(&config(tmp.path(), None)).err().expect("unusable");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot use the CA in {}: the private key does not belong to the signing certificate",
            tmp.path().display()
        )
    );
}
