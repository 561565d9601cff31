use std::io;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, PKCS_ECDSA_P256_SHA256, SanType,
};
use rustls_pki_types::PrivatePkcs8KeyDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::*;
use crate::{FakeCa, WorkloadCertificate, peer_identity};

const TTL: Duration = Duration::from_secs(3600);

fn id(td: &str, sa: &str) -> Identity {
    Identity::new(td, "default", sa)
}

struct Outcome {
    server: io::Result<Option<Identity>>,
    client: io::Result<Option<Identity>>,
}

/// Runs a handshake over an in-memory pipe, then one byte each way; returns the peer identities.
async fn handshake(server: Arc<rustls::ServerConfig>, client: Arc<rustls::ClientConfig>) -> Outcome {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let server = async move {
        let mut tls = TlsAcceptor::from(server).accept(s).await?;
        let (_, conn) = tls.get_ref();
        assert_eq!(conn.alpn_protocol(), Some(&b"h2"[..]));
        assert_eq!(conn.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_3));
        let peer = conn.peer_certificates().and_then(peer_identity);
        tls.write_all(b"s").await?;
        let mut buf = [0u8; 1];
        tls.read_exact(&mut buf).await?;
        Ok(peer)
    };
    let client = async move {
        let name = ServerName::try_from("0.0.0.0").expect("name");
        let mut tls = TlsConnector::from(client).connect(name, c).await?;
        let (_, conn) = tls.get_ref();
        let peer = conn.peer_certificates().and_then(peer_identity);
        assert_eq!(
            conn.negotiated_cipher_suite().map(|s| s.suite()),
            Some(rustls::CipherSuite::TLS13_AES_256_GCM_SHA384)
        );
        tls.write_all(b"c").await?;
        let mut buf = [0u8; 1];
        tls.read_exact(&mut buf).await?;
        Ok(peer)
    };
    let (server, client) = tokio::join!(server, client);
    Outcome { server, client }
}

#[tokio::test]
async fn mtls_with_expected_identity() {
    let ca = FakeCa::generate();
    let server = ca.issue(&id("cluster.local", "server"), TTL).expect("server");
    let client = ca.issue(&id("cluster.local", "client"), TTL).expect("client");
    let out = handshake(
        server.server_config(),
        client.client_config(&[id("cluster.local", "other"), id("cluster.local", "server")]),
    )
    .await;
    assert_eq!(out.server.expect("server"), Some(id("cluster.local", "client")));
    assert_eq!(out.client.expect("client"), Some(id("cluster.local", "server")));
}

#[tokio::test]
async fn mtls_over_tcp() {
    let ca = FakeCa::generate();
    let server = ca.issue(&id("cluster.local", "server"), TTL).expect("server");
    let client = ca.issue(&id("cluster.local", "client"), TTL).expect("client");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = TlsAcceptor::from(server.server_config());
    let accept = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        let mut tls = acceptor.accept(tcp).await?;
        let peer = tls.get_ref().1.peer_certificates().and_then(peer_identity);
        tls.write_all(b"hello").await?;
        tls.shutdown().await?;
        io::Result::Ok(peer)
    });
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let connector = TlsConnector::from(client.client_config(&[id("cluster.local", "server")]));
    let mut tls = connector
        .connect(ServerName::try_from("0.0.0.0").expect("name"), tcp)
        .await
        .expect("client handshake");
    let mut got = Vec::new();
    tls.read_to_end(&mut got).await.expect("read");
    assert_eq!(got, b"hello");
    let peer = accept.await.expect("join").expect("server");
    assert_eq!(peer, Some(id("cluster.local", "client")));
}

#[tokio::test]
async fn wrong_expected_identity_is_rejected_with_both_lists() {
    let ca = FakeCa::generate();
    let server = ca.issue(&id("cluster.local", "server"), TTL).expect("server");
    let client = ca.issue(&id("cluster.local", "client"), TTL).expect("client");
    let expected = [id("cluster.local", "a"), id("cluster.local", "b")];
    let out = handshake(server.server_config(), client.client_config(&expected)).await;
    let err = out.client.expect_err("client must reject").to_string();
    assert!(
        err.contains(
            "identity verification error: peer did not present the expected SAN \
             (spiffe://cluster.local/ns/default/sa/a,spiffe://cluster.local/ns/default/sa/b), \
             got spiffe://cluster.local/ns/default/sa/server"
        ),
        "{err}"
    );
    assert!(out.server.is_err());
}

#[tokio::test]
async fn client_from_other_trust_domain_is_rejected() {
    let ca = FakeCa::generate();
    let server = ca.issue(&id("cluster.local", "server"), TTL).expect("server");
    let client = ca.issue(&id("evil.example", "client"), TTL).expect("client");
    let out = handshake(server.server_config(), client.client_config(&[id("cluster.local", "server")])).await;
    let err = out.server.expect_err("server must reject").to_string();
    assert!(err.contains("not in trust domain \"cluster.local\""), "{err}");
    assert!(err.contains("spiffe://evil.example/ns/default/sa/client"), "{err}");
}

#[tokio::test]
async fn client_from_other_root_is_rejected() {
    let server = FakeCa::generate().issue(&id("cluster.local", "server"), TTL).expect("server");
    let client = FakeCa::generate().issue(&id("cluster.local", "client"), TTL).expect("client");
    let out = handshake(server.server_config(), client.client_config(&[id("cluster.local", "server")])).await;
    // The client rejects the server first: neither trusts the other's root.
    let err = out.client.expect_err("client must reject").to_string();
    // Both dev roots share a subject name, so webpki finds the wrong issuer and reports a bad signature.
    assert!(err.contains("invalid peer certificate: BadSignature"), "{err}");
    assert!(out.server.is_err());
}

#[tokio::test]
async fn client_certificate_from_other_root_is_rejected_by_server() {
    let server_ca = FakeCa::generate();
    let server = server_ca.issue(&id("cluster.local", "server"), TTL).expect("server");
    let client = FakeCa::generate().issue(&id("cluster.local", "client"), TTL).expect("client");
    // A client that trusts the server's root but presents a certificate from another root.
    let config = client_config(&client.key, server.roots.clone(), &[id("cluster.local", "server")]);
    let out = handshake(server.server_config(), config).await;
    let err = out.server.expect_err("server must reject").to_string();
    // Both dev roots share a subject name, so webpki finds the wrong issuer and reports a bad signature.
    assert!(err.contains("invalid peer certificate: BadSignature"), "{err}");
}

#[tokio::test]
async fn client_without_certificate_is_rejected() {
    let ca = FakeCa::generate();
    let server = ca.issue(&id("cluster.local", "server"), TTL).expect("server");
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SpiffeServerVerifier {
            roots: server.roots.clone(),
            expected: vec![id("cluster.local", "server")],
            algorithms: provider().signature_verification_algorithms,
        }))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let out = handshake(server.server_config(), Arc::new(config)).await;
    let err = out.server.expect_err("server must reject").to_string();
    assert!(err.contains("peer sent no certificates"), "{err}");
}

/// root → intermediate → leaf, built by hand: (leaf key, chain as the CA API returns it).
fn chain_with_intermediate(
    root: &Issuer<'_, KeyPair>,
    root_pem: &str,
    identity: &Identity,
) -> (PrivateKeyDer<'static>, Vec<String>) {
    let int_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut int_params = CertificateParams::default();
    int_params.distinguished_name.push(DnType::CommonName, "intermediate");
    int_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let int_cert = int_params.signed_by(&int_key, root).expect("intermediate");
    let int_issuer = Issuer::new(int_params, int_key);

    let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name = DistinguishedName::new();
    leaf.subject_alt_names = vec![SanType::URI(identity.to_string().try_into().expect("uri"))];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let leaf_cert = leaf.signed_by(&leaf_key, &int_issuer).expect("leaf");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    (key, vec![leaf_cert.pem(), int_cert.pem(), root_pem.to_owned()])
}

#[tokio::test]
async fn intermediates_are_sent_and_verified() {
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut root_params = CertificateParams::default();
    root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let root_pem = root_params.self_signed(&root_key).expect("root").pem();
    let root = Issuer::new(root_params, root_key);

    let (skey, schain) = chain_with_intermediate(&root, &root_pem, &id("cluster.local", "server"));
    let (ckey, cchain) = chain_with_intermediate(&root, &root_pem, &id("cluster.local", "client"));
    let server = WorkloadCertificate::new(skey, &schain).expect("server cert");
    let client = WorkloadCertificate::new(ckey, &cchain).expect("client cert");
    assert_eq!(server.dump().cert_chain.len(), 2);
    assert_eq!(server.dump().root_certs.len(), 1);
    let out = handshake(server.server_config(), client.client_config(&[id("cluster.local", "server")])).await;
    assert_eq!(out.server.expect("server"), Some(id("cluster.local", "client")));
    assert_eq!(out.client.expect("client"), Some(id("cluster.local", "server")));
}

#[test]
fn server_config_is_cached() {
    let cert = FakeCa::generate().issue(&id("cluster.local", "server"), TTL).expect("cert");
    assert!(Arc::ptr_eq(&cert.server_config(), &cert.server_config()));
    let client = cert.client_config(&[]);
    assert!(!client.enable_sni);
    assert_eq!(client.alpn_protocols, vec![b"h2".to_vec()]);
}

/// A fresh root: (issuer, PEM).
fn test_root() -> (Issuer<'static, KeyPair>, String) {
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut root_params = CertificateParams::default();
    root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let root_pem = root_params.self_signed(&root_key).expect("root").pem();
    (Issuer::new(root_params, root_key), root_pem)
}

/// A leaf signed by `root` with these URI SANs: (its key for rustls, its DER).
fn leaf_with_uris(root: &Issuer<'_, KeyPair>, uris: &[&str]) -> (Arc<CertifiedKey>, CertificateDer<'static>) {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names =
        uris.iter().map(|u| SanType::URI((*u).to_owned().try_into().expect("uri"))).collect();
    params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, root).expect("leaf");
    let der = cert.der().clone();
    let pkcs8 = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (certified_key(vec![der.clone()], pkcs8).expect("certified key"), der)
}

const ADMIN_OTHER_TD: &str = "spiffe://evil.example/ns/kube-system/sa/admin";
const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";

/// A client leaf with two URI SANs (a foreign identity first, one of our trust domain second)
/// used to pass the trust-domain check on the second while the first became its identity. It
/// must name exactly one identity: the handshake is refused with a clear reason.
#[tokio::test]
async fn client_with_two_uri_sans_is_rejected() {
    let (root, root_pem) = test_root();
    let (skey, schain) = chain_with_intermediate(&root, &root_pem, &id("cluster.local", "server"));
    let server = WorkloadCertificate::new(skey, &schain).expect("server cert");
    let (ckey, _) = leaf_with_uris(&root, &[ADMIN_OTHER_TD, CLIENT]);
    let config = client_config(&ckey, server.roots.clone(), &[id("cluster.local", "server")]);
    let out = handshake(server.server_config(), config).await;
    let err = match out.server {
        Ok(peer) => panic!("the server accepted a two-identity client as {peer:?}"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!(
            "identity verification error: the certificate has 2 URI SANs ({ADMIN_OTHER_TD}, {CLIENT}); a \
             workload certificate carries exactly one SPIFFE id, so its identity is ambiguous and the \
             certificate is refused"
        )),
        "{err}"
    );
}

/// The client side applies the same rule to the server's leaf.
#[tokio::test]
async fn server_with_two_uri_sans_is_rejected() {
    let (root, root_pem) = test_root();
    let (ckey, cchain) = chain_with_intermediate(&root, &root_pem, &id("cluster.local", "client"));
    let client = WorkloadCertificate::new(ckey, &cchain).expect("client cert");
    let (skey, _) = leaf_with_uris(&root, &[SERVER, ADMIN_OTHER_TD]);
    let server = server_config(&skey, client.roots.clone(), "cluster.local").expect("server config");
    let out = handshake(server, client.client_config(&[id("cluster.local", "server")])).await;
    let err = match out.client {
        Ok(peer) => panic!("the client accepted a two-identity server as {peer:?}"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!(
            "identity verification error: the certificate has 2 URI SANs ({SERVER}, {ADMIN_OTHER_TD})"
        )),
        "{err}"
    );
}

/// A client leaf whose one URI SAN is not a SPIFFE id is refused with that reason.
#[tokio::test]
async fn client_with_a_non_spiffe_uri_is_rejected() {
    let (root, root_pem) = test_root();
    let (skey, schain) = chain_with_intermediate(&root, &root_pem, &id("cluster.local", "server"));
    let server = WorkloadCertificate::new(skey, &schain).expect("server cert");
    let (ckey, _) = leaf_with_uris(&root, &["https://example.com/client"]);
    let config = client_config(&ckey, server.roots.clone(), &[id("cluster.local", "server")]);
    let err = handshake(server.server_config(), config).await.server.expect_err("must reject").to_string();
    assert!(
        err.contains(
            "identity verification error: the certificate's URI SAN \"https://example.com/client\" is not of \
             the form spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
        ),
        "{err}"
    );
}

#[test]
fn peer_identity_needs_exactly_one_spiffe_uri() {
    let (root, _) = test_root();
    let one = leaf_with_uris(&root, &[CLIENT]).1;
    assert_eq!(peer_identity(std::slice::from_ref(&one)), Some(id("cluster.local", "client")));
    for uris in [&[ADMIN_OTHER_TD, CLIENT][..], &[CLIENT, CLIENT], &[], &["urn:x"]] {
        let der = leaf_with_uris(&root, uris).1;
        assert_eq!(peer_identity(&[der]), None, "{uris:?}");
    }
    // The error lists at most four URIs, each cut to a bounded length.
    let long = format!("spiffe://cluster.local/ns/default/sa/{}", "x".repeat(500));
    let many: Vec<&str> = std::iter::repeat_n(long.as_str(), 20).collect();
    let err = crate::cert::spiffe_identity(&leaf_with_uris(&root, &many).1).expect_err("20 URIs");
    let text = err.to_string();
    assert!(text.starts_with("the certificate has 20 URI SANs ("), "{text}");
    assert!(text.len() < 4 * 140 + 200, "{} bytes: {text}", text.len());
}

#[test]
fn own_certificate_with_two_uri_sans_is_refused() {
    let (root, root_pem) = test_root();
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.subject_alt_names =
        [CLIENT, SERVER].iter().map(|u| SanType::URI((*u).try_into().expect("uri"))).collect();
    let leaf = params.signed_by(&key, &root).expect("leaf");
    let pkcs8 = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let err = WorkloadCertificate::new(pkcs8, &[leaf.pem(), root_pem]).expect_err("two identities");
    assert!(matches!(&err, CertificateError::Identity(crate::SanError::ManyUris { count: 2, .. })), "{err}");
}
