use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P384_SHA384,
    PKCS_RSA_SHA256, RsaKeySize,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::control::{ControlError, ControlPlaneConfig, RootSource, Service, TokenSource};
use crate::testing::{Behavior, TestCaServer};
use crate::{CertificateError, WorkloadCertificate, csr, peer_identity};

const TTL: Duration = Duration::from_secs(3600);

fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "default", sa)
}

/// Writes a self-signed CA made with `key` to DIR/root-cert.pem and DIR/root-key.pem.
fn write_root(dir: &Path, key: &KeyPair) {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "test root");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(key).expect("root");
    std::fs::write(dir.join("root-cert.pem"), cert.pem()).expect("write cert");
    std::fs::write(dir.join("root-key.pem"), key.serialize_pem()).expect("write key");
}

/// Two workload certificates from two CA instances loaded from the same directory trust each other.
async fn assert_instances_trust_each_other(dir: &Path) {
    let a = FakeCa::from_dir(dir).expect("instance a");
    let b = FakeCa::from_dir(dir).expect("instance b");
    let server = a.issue(&id("server"), TTL).expect("server");
    let client = b.issue(&id("client"), TTL).expect("client");
    let (c, s) = tokio::io::duplex(16 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config());
    let connector = tokio_rustls::TlsConnector::from(client.client_config(&[id("server")]));
    let name = rustls_pki_types::ServerName::try_from("0.0.0.0").expect("name");
    let (srv, cli) = tokio::join!(
        async {
            let mut tls = acceptor.accept(s).await?;
            let peer = tls.get_ref().1.peer_certificates().and_then(peer_identity);
            tls.write_all(b"x").await?;
            std::io::Result::Ok(peer)
        },
        async {
            let mut tls = connector.connect(name, c).await?;
            let mut buf = [0u8; 1];
            tls.read_exact(&mut buf).await?;
            std::io::Result::Ok(())
        }
    );
    cli.expect("client handshake");
    assert_eq!(srv.expect("server handshake"), Some(id("client")));
}

#[tokio::test]
async fn fake_ca_from_rsa_root_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = KeyPair::generate_rsa_for(&PKCS_RSA_SHA256, RsaKeySize::_2048).expect("rsa");
    write_root(dir.path(), &key);
    assert_instances_trust_each_other(dir.path()).await;
}

#[tokio::test]
async fn fake_ca_from_ecdsa_root_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384).expect("ecdsa");
    write_root(dir.path(), &key);
    assert_instances_trust_each_other(dir.path()).await;
}

#[test]
fn fake_ca_from_dir_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = FakeCa::from_dir(dir.path()).err().expect("missing files");
    assert!(matches!(err, CaError::ReadFile { .. }), "{err}");

    // A key that does not belong to the certificate.
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    write_root(dir.path(), &key);
    let other = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    std::fs::write(dir.path().join("root-key.pem"), other.serialize_pem()).expect("write");
    let err = FakeCa::from_dir(dir.path()).err().expect("mismatch");
    assert!(err.to_string().contains("does not belong"), "{err}");

    std::fs::write(dir.path().join("root-key.pem"), "garbage").expect("write");
    let err = FakeCa::from_dir(dir.path()).err().expect("garbage key");
    assert!(matches!(err, CaError::InvalidRoot { .. }), "{err}");
}

#[tokio::test]
async fn dev_ca_init_creates_a_shared_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_dir = dir.path().join("ca");
    dev_ca_init(&ca_dir, false).expect("init");
    let key_mode = std::fs::metadata(ca_dir.join("root-key.pem")).expect("key").permissions().mode();
    assert_eq!(key_mode & 0o777, 0o600);
    let first = std::fs::read_to_string(ca_dir.join("root-cert.pem")).expect("cert");

    let err = dev_ca_init(&ca_dir, false).expect_err("must not overwrite");
    assert!(matches!(err, CaError::Exists(_)), "{err}");
    assert_eq!(std::fs::read_to_string(ca_dir.join("root-cert.pem")).expect("cert"), first);

    std::fs::set_permissions(ca_dir.join("root-key.pem"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    dev_ca_init(&ca_dir, true).expect("force");
    let second = std::fs::read_to_string(ca_dir.join("root-cert.pem")).expect("cert");
    assert_ne!(first, second);
    let key_mode = std::fs::metadata(ca_dir.join("root-key.pem")).expect("key").permissions().mode();
    assert_eq!(key_mode & 0o777, 0o600);

    assert_instances_trust_each_other(&ca_dir).await;
}

#[test]
fn issued_certificate_fields_and_dump() {
    let ca = FakeCa::generate();
    let cert = ca.issue(&id("web"), TTL).expect("issue");
    assert_eq!(cert.identity(), &id("web"));
    let validity = cert.not_after().duration_since(cert.not_before()).expect("ordered");
    assert_eq!(validity, TTL);

    let dump = cert.dump();
    assert_eq!(dump.cert_chain.len(), 1);
    assert_eq!(dump.root_certs.len(), 1);
    let leaf = &dump.cert_chain[0];
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD.decode(&leaf.pem).expect("base64");
    let pem = String::from_utf8(pem).expect("utf8");
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\n"), "{pem}");
    assert!(leaf.serial_number.chars().all(|c| c.is_ascii_digit()));
    for t in [&leaf.valid_from, &leaf.expiration_time] {
        assert_eq!(t.len(), "2024-01-01T00:00:00Z".len(), "{t}");
        assert!(t.ends_with('Z'), "{t}");
    }
    let json = serde_json::to_value(&dump).expect("json");
    let entry = &json["certChain"][0];
    for key in ["pem", "serialNumber", "validFrom", "expirationTime"] {
        assert!(entry[key].is_string(), "{key} missing in {json}");
    }
    assert!(json["rootCerts"][0]["pem"].is_string(), "{json}");
}

fn client_config(server: &TestCaServer, dir: &Path, impersonate: bool) -> CaClientConfig {
    let token = dir.join("token");
    std::fs::write(&token, "secret-token\n").expect("token");
    let roots = match &server.tls_root_pem {
        Some(pem) => {
            let path = dir.join("ca-root.pem");
            std::fs::write(&path, pem).expect("root");
            RootSource::File(path)
        }
        None => RootSource::System,
    };
    CaClientConfig {
        control: ControlPlaneConfig {
            service: Service::Ca,
            address: server.address(),
            roots,
            alt_hostname: None,
            token: Some(TokenSource::File(token)),
            cluster_id: "Kubernetes".to_owned(),
            headers: vec![("X-Extra".to_owned(), "extra-value".to_owned())],
            mark: None,
        },
        impersonate,
    }
}

/// Signs a fresh CSR through `client` and builds the workload certificate.
async fn fetch(client: &CaClient, identity: &Identity) -> Result<WorkloadCertificate, CaError> {
    let csr = csr::generate(identity)?;
    let chain = client.sign(csr.pem, identity, TTL).await?;
    Ok(WorkloadCertificate::new(csr.key, &chain)?)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

async fn client_round_trip(server: TestCaServer) {
    let dir = tempfile::tempdir().expect("tempdir");
    let client = CaClient::new(client_config(&server, dir.path(), true)).expect("client");
    let cert = fetch(&client, &id("web")).await.expect("certificate");
    assert_eq!(cert.identity(), &id("web"));
    assert_eq!(cert.dump().root_certs.len(), 1);

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let req = &requests[0];
    assert_eq!(header(&req.headers, "authorization"), Some("Bearer secret-token"));
    assert_eq!(header(&req.headers, "clusterid"), Some("Kubernetes"));
    assert_eq!(header(&req.headers, "x-extra"), Some("extra-value"));
    assert_eq!(req.impersonated.as_deref(), Some("spiffe://cluster.local/ns/default/sa/web"));
    assert_eq!(req.validity_duration, 3600);

    // The token file is re-read per request.
    std::fs::write(dir.path().join("token"), "rotated").expect("token");
    fetch(&client, &id("api")).await.expect("second certificate");
    let requests = server.requests();
    assert_eq!(header(&requests[1].headers, "authorization"), Some("Bearer rotated"));
}

#[tokio::test]
async fn ca_client_plaintext() {
    let server = TestCaServer::start(Arc::new(FakeCa::generate())).await;
    client_round_trip(server).await;
}

#[tokio::test]
async fn ca_client_tls() {
    let server = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    assert!(server.address().starts_with("https://127.0.0.1:"));
    client_round_trip(server).await;
}

#[tokio::test]
async fn ca_client_tls_rejects_unknown_server_root() {
    let server = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = client_config(&server, dir.path(), true);
    let other = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(other.path(), FakeCa::generate().root_pem()).expect("write");
    cfg.control.roots = RootSource::File(other.path().to_owned());
    let client = CaClient::new(cfg).expect("client");
    let err = fetch(&client, &id("web")).await.expect_err("untrusted CA");
    assert!(matches!(err, CaError::Status { code: tonic::Code::Unavailable, .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "certificate request to the CA at {0} failed: Unavailable: TLS handshake with the CA at {0} failed: invalid peer certificate: UnknownIssuer; is CA_ROOT_CA the root that signed the CA's certificate?",
            server.address()
        )
    );
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn ca_client_dedicated_mode_sends_no_impersonation() {
    let server = TestCaServer::start(Arc::new(FakeCa::generate())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = client_config(&server, dir.path(), false);
    cfg.control.token = None;
    let client = CaClient::new(cfg).expect("client");
    fetch(&client, &id("web")).await.expect("certificate");
    let req = &server.requests()[0];
    assert_eq!(req.impersonated, None);
    assert_eq!(header(&req.headers, "authorization"), None);
    assert_eq!(header(&req.headers, "clusterid"), None, "clusterid only with a token");
    assert_eq!(header(&req.headers, "x-extra"), Some("extra-value"));
}

#[tokio::test]
async fn ca_client_rejects_wrong_san_when_impersonating() {
    let server = TestCaServer::start(Arc::new(FakeCa::generate())).await;
    server.set_behavior(Behavior::WrongSan(id("intruder")));
    let dir = tempfile::tempdir().expect("tempdir");
    let client = CaClient::new(client_config(&server, dir.path(), true)).expect("client");
    let err = fetch(&client, &id("web")).await.expect_err("wrong SAN");
    assert!(matches!(err, CaError::SanMismatch { .. }), "{err}");
    assert!(err.to_string().contains("did not find expected SAN"), "{err}");

    // Without impersonation (dedicated mode) the CA decides the identity and is not checked.
    let client = CaClient::new(client_config(&server, dir.path(), false)).expect("client");
    let cert = fetch(&client, &id("web")).await.expect("dedicated");
    assert_eq!(cert.identity(), &id("intruder"));
}

#[tokio::test]
async fn ca_client_rejects_short_chains_and_reports_status() {
    let server = TestCaServer::start(Arc::new(FakeCa::generate())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let client = CaClient::new(client_config(&server, dir.path(), true)).expect("client");

    server.set_behavior(Behavior::SingleElement);
    let err = fetch(&client, &id("web")).await.expect_err("single element");
    assert!(matches!(err, CaError::Certificate(CertificateError::NoRoots)), "{err}");

    server.set_behavior(Behavior::EmptyChain);
    let err = fetch(&client, &id("web")).await.expect_err("empty");
    assert!(matches!(err, CaError::Certificate(CertificateError::EmptyChain)), "{err}");

    server.set_behavior(Behavior::Fail(tonic::Code::Unauthenticated));
    let err = fetch(&client, &id("web")).await.expect_err("status");
    assert!(matches!(err, CaError::Status { code: tonic::Code::Unauthenticated, .. }), "{err}");
}

#[tokio::test]
async fn ca_client_token_errors() {
    let server = TestCaServer::start(Arc::new(FakeCa::generate())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = client_config(&server, dir.path(), true);
    let token = dir.path().join("token");
    std::fs::write(&token, "  \n").expect("write");
    let client = CaClient::new(cfg).expect("client");
    let err = fetch(&client, &id("web")).await.expect_err("empty token");
    assert!(matches!(err, CaError::Control(ControlError::EmptyToken(_))), "{err}");
    assert_eq!(err.to_string(), format!("the token file {} (AUTH_TOKEN) is empty", token.display()));
    std::fs::remove_file(&token).expect("rm");
    let err = fetch(&client, &id("web")).await.expect_err("missing token");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot read the token file {} (AUTH_TOKEN): No such file or directory (os error 2); is the projected service account token mounted?",
            token.display()
        )
    );
    assert!(server.requests().is_empty());
}

/// A literal AUTH_TOKEN (not a file) is sent as the bearer token, with the cluster id.
#[tokio::test]
async fn ca_client_sends_a_literal_token() {
    let server = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = client_config(&server, dir.path(), true);
    cfg.control.token = TokenSource::from_setting(Some("literal-token"));
    assert_eq!(cfg.control.token, Some(TokenSource::Literal("literal-token".to_owned())));
    let client = CaClient::new(cfg).expect("client");
    fetch(&client, &id("web")).await.expect("certificate");
    let req = &server.requests()[0];
    assert_eq!(header(&req.headers, "authorization"), Some("Bearer literal-token"));
    assert_eq!(header(&req.headers, "clusterid"), Some("Kubernetes"));
}

/// CA_ROOT_CA given inline (the PEM itself) works; ALT_CA_HOSTNAME is honoured.
#[tokio::test]
async fn ca_client_inline_roots_and_alternate_hostname() {
    let server =
        TestCaServer::start_tls_for(Arc::new(FakeCa::generate()), &["istiod.istio-system.svc"]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = client_config(&server, dir.path(), true);
    let pem = server.tls_root_pem.clone().expect("tls");
    cfg.control.roots = RootSource::parse(Service::Ca, &pem).expect("inline");
    assert!(matches!(cfg.control.roots, RootSource::Inline(_)));
    let client = CaClient::new(cfg.clone()).expect("client");
    let err = fetch(&client, &id("web")).await.expect_err("name mismatch");
    assert!(err.to_string().contains("set ALT_CA_HOSTNAME"), "{err}");
    cfg.control.alt_hostname = Some("istiod.istio-system.svc".to_owned());
    let client = CaClient::new(cfg).expect("client");
    fetch(&client, &id("web")).await.expect("certificate via the alternate name");
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn ca_client_config_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.pem");
    let err = RootSource::parse(Service::Ca, &missing.display().to_string()).expect_err("no root");
    assert_eq!(
        err.to_string(),
        format!(
            "CA_ROOT_CA={:?} is not an existing file, `SYSTEM`, or inline PEM certificates; set it to the file with the CA's root certificate (istiod's root-cert.pem)",
            missing.display().to_string()
        )
    );

    let mut cfg = CaClientConfig::plain("http://istiod:15012");
    cfg.control.headers = vec![("bad header".to_owned(), "v".to_owned())];
    let err = CaClient::new(cfg).err().expect("bad header");
    assert_eq!(
        err.to_string(),
        "CA_HEADER_bad header is not a valid gRPC metadata name with a visible ASCII value"
    );

    let err = CaClient::new(CaClientConfig::plain("ftp://istiod")).err().expect("bad scheme");
    assert_eq!(
        err.to_string(),
        "CA_ADDRESS=\"ftp://istiod\" is not a usable CA address: use https:// (or http:// for local development)"
    );

    let file = tempfile::NamedTempFile::new().expect("file");
    let mut cfg = CaClientConfig::plain("istiod.istio-system.svc:15012");
    cfg.control.roots = RootSource::File(file.path().to_owned());
    let err = CaClient::new(cfg).err().expect("empty root file");
    assert_eq!(
        err.to_string(),
        format!("CA_ROOT_CA ({}) holds no usable PEM certificate", file.path().display())
    );
}
