use std::path::Path;
use std::sync::Arc;

use ambit_api::ca::IstioCertificateRequest;
use ambit_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;

use super::*;
use crate::testing::TestCaServer;
use crate::{FakeCa, Identity};

fn config(server: &TestCaServer, roots: RootSource) -> ControlPlaneConfig {
    ControlPlaneConfig {
        service: Service::Xds,
        address: server.address(),
        roots,
        alt_hostname: None,
        token: None,
        cluster_id: "Kubernetes".to_owned(),
        headers: vec![("X-Extra".to_owned(), "extra".to_owned())],
        mark: None,
    }
}

fn root_file(server: &TestCaServer, dir: &Path) -> RootSource {
    let path = dir.join("root-cert.pem");
    std::fs::write(&path, server.tls_root_pem.as_ref().expect("TLS server")).expect("write root");
    RootSource::File(path)
}

// The test servers' roots share one subject name, so a wrong root fails its signature check
// (BadSignature) rather than the issuer lookup (UnknownIssuer, as against the OS store).

/// One CA call over the control plane's channel, with its metadata.
async fn call(control: &ControlPlane) -> Result<(), tonic::Status> {
    let csr = crate::csr::generate(&Identity::new("cluster.local", "default", "web")).expect("csr");
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr: csr.pem,
        validity_duration: 3600,
        metadata: None,
    });
    *request.metadata_mut() = control.metadata().expect("metadata");
    let channel = control.channel().expect("channel");
    IstioCertificateServiceClient::new(channel).create_certificate(request).await.map(|_| ())
}

fn header(server: &TestCaServer, index: usize, name: &str) -> Option<String> {
    server.requests()[index].headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

#[tokio::test]
async fn file_root_works_and_headers_are_sent() {
    let server = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let value = dir.path().join("root-cert.pem");
    std::fs::write(&value, server.tls_root_pem.as_ref().expect("tls")).expect("write");
    let roots = RootSource::parse(Service::Xds, &value.display().to_string()).expect("file");
    assert_eq!(roots, RootSource::File(value));
    let control = ControlPlane::new(config(&server, roots)).expect("valid");
    control.connect().await.expect("eager connect");
    call(&control).await.expect("call over TLS");
    assert_eq!(header(&server, 0, "x-extra").as_deref(), Some("extra"));
    assert_eq!(header(&server, 0, "authorization"), None);
    assert_eq!(header(&server, 0, "clusterid"), None, "clusterid goes with a token only");
}

#[tokio::test]
async fn inline_pem_works() {
    let server = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    let pem = server.tls_root_pem.clone().expect("tls");
    let roots = RootSource::parse(Service::Xds, &pem).expect("inline");
    assert_eq!(roots, RootSource::Inline(pem));
    let control = ControlPlane::new(config(&server, roots)).expect("valid");
    call(&control).await.expect("call over TLS");
}

#[tokio::test]
async fn system_roots_load_the_os_store_and_refuse_the_test_ca() {
    assert_eq!(RootSource::parse(Service::Xds, "SYSTEM").expect("system"), RootSource::System);
    let store = RootSource::System.load(Service::Xds).expect("the OS trust store has roots");
    assert!(store.len() > 10, "only {} roots in the OS store", store.len());

    let server = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    let control = ControlPlane::new(config(&server, RootSource::System)).expect("valid");
    let err = control.connect().await.expect_err("test CA is not a public root");
    assert_eq!(
        err.to_string(),
        format!(
            "TLS handshake with the xDS server at {0} failed: invalid peer certificate: UnknownIssuer; is XDS_ROOT_CA the root that signed the xDS server's certificate?",
            server.address()
        )
    );
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn a_wrong_root_is_refused() {
    let server = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    let other = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let control = ControlPlane::new(config(&server, root_file(&other, dir.path()))).expect("valid");
    let err = control.connect().await.expect_err("untrusted");
    assert!(matches!(err, ControlError::Handshake { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "TLS handshake with the xDS server at {0} failed: invalid peer certificate: BadSignature; is XDS_ROOT_CA the root that signed the xDS server's certificate?",
            server.address()
        )
    );
    // The lazy channel reports the same error through the gRPC status.
    let status = call(&control).await.expect_err("untrusted");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let ours = std::error::Error::source(&status).and_then(find_control_error).expect("our error");
    assert!(matches!(ours, ControlError::Handshake { .. }), "{ours:?}");
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn the_alternate_hostname_is_accepted_only_when_set() {
    let server =
        TestCaServer::start_tls_for(Arc::new(FakeCa::generate()), &["istiod.istio-system.svc"]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&server, root_file(&server, dir.path()));

    let err = ControlPlane::new(cfg.clone()).expect("valid").connect().await.expect_err("name mismatch");
    assert_eq!(
        err.to_string(),
        format!(
            "TLS handshake with the xDS server at {} failed: invalid peer certificate: certificate not valid for name \"127.0.0.1\"; certificate is only valid for DnsName(\"istiod.istio-system.svc\"); set ALT_XDS_HOSTNAME if the xDS server's certificate is issued for another name",
            server.address()
        )
    );

    cfg.alt_hostname = Some("other.istio-system.svc".to_owned());
    let err = ControlPlane::new(cfg.clone()).expect("valid").connect().await.expect_err("wrong alternate");
    assert_eq!(
        err.to_string(),
        format!(
            "TLS handshake with the xDS server at {} failed: invalid peer certificate: certificate not valid for name \"other.istio-system.svc\"; certificate is only valid for DnsName(\"istiod.istio-system.svc\"); neither the address's host nor ALT_XDS_HOSTNAME is in the certificate",
            server.address()
        )
    );

    cfg.alt_hostname = Some("istiod.istio-system.svc".to_owned());
    let control = ControlPlane::new(cfg).expect("valid");
    call(&control).await.expect("accepted via the alternate name");

    // The alternate name does not excuse an untrusted root.
    let other = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    let mut cfg = config(&server, root_file(&other, dir.path()));
    cfg.alt_hostname = Some("istiod.istio-system.svc".to_owned());
    let err = ControlPlane::new(cfg).expect("valid").connect().await.expect_err("untrusted");
    assert!(err.to_string().contains("BadSignature; is XDS_ROOT_CA the root"), "{err}");
}

#[tokio::test]
async fn literal_and_file_tokens_are_sent_as_bearer_with_the_cluster_id() {
    let server = TestCaServer::start_tls(Arc::new(FakeCa::generate())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&server, root_file(&server, dir.path()));

    cfg.token = TokenSource::from_setting(Some("literal-token"));
    assert_eq!(cfg.token, Some(TokenSource::Literal("literal-token".to_owned())));
    call(&ControlPlane::new(cfg.clone()).expect("valid")).await.expect("call");
    assert_eq!(header(&server, 0, "authorization").as_deref(), Some("Bearer literal-token"));
    assert_eq!(header(&server, 0, "clusterid").as_deref(), Some("Kubernetes"));

    let file = dir.path().join("istio-token");
    std::fs::write(&file, "file-token\n").expect("write");
    cfg.token = TokenSource::from_setting(Some(&file.display().to_string()));
    assert_eq!(cfg.token, Some(TokenSource::File(file.clone())));
    let control = ControlPlane::new(cfg).expect("valid");
    call(&control).await.expect("call");
    assert_eq!(header(&server, 1, "authorization").as_deref(), Some("Bearer file-token"));
    assert_eq!(header(&server, 1, "clusterid").as_deref(), Some("Kubernetes"));
    // Re-read per request.
    std::fs::write(&file, "rotated").expect("write");
    call(&control).await.expect("call");
    assert_eq!(header(&server, 2, "authorization").as_deref(), Some("Bearer rotated"));

    // Credentials never show in logs or dumps.
    let literal = TokenSource::Literal("s3cret".to_owned());
    assert_eq!(format!("{literal:?}"), "Literal(<redacted>)");
    assert_eq!(serde_json::to_string(&literal).expect("json"), r#"{"Literal":"<redacted>"}"#);
}

#[test]
fn token_setting_forms() {
    assert_eq!(TokenSource::from_setting(Some("")), None);
    // Unset: the default file only when it exists (it does not here, relative to the test's CWD).
    assert_eq!(TokenSource::from_setting(None), None);
}

fn plain(address: &str) -> ControlPlaneConfig {
    ControlPlaneConfig {
        service: Service::Ca,
        address: address.to_owned(),
        roots: RootSource::System,
        alt_hostname: None,
        token: None,
        cluster_id: String::new(),
        headers: Vec::new(),
        mark: None,
    }
}

fn error(cfg: ControlPlaneConfig) -> String {
    ControlPlane::new(cfg).expect_err("must be refused").to_string()
}

#[test]
fn addresses_are_normalised() {
    let c = ControlPlane::new(plain("istiod.istio-system.svc:15012")).expect("valid");
    assert_eq!(c.address(), "https://istiod.istio-system.svc:15012");
    let c = ControlPlane::new(plain("http://127.0.0.1:15012")).expect("valid");
    assert_eq!(c.address(), "http://127.0.0.1:15012");
    let c = ControlPlane::new(plain("https://[::1]:15012")).expect("valid");
    assert_eq!(c.address(), "https://[::1]:15012");
}

#[test]
fn each_bad_input_has_its_error() {
    assert_eq!(
        error(plain("ftp://istiod:15012")),
        "CA_ADDRESS=\"ftp://istiod:15012\" is not a usable CA address: use https:// (or http:// for local development)"
    );
    assert_eq!(error(plain("https://")), "CA_ADDRESS=\"https://\" is not a usable CA address: empty string");
    assert_eq!(
        error(plain("istiod svc:15012")),
        "CA_ADDRESS=\"istiod svc:15012\" is not a usable CA address: invalid uri character"
    );

    let mut cfg = plain("https://istiod:15012");
    cfg.alt_hostname = Some("bad name!".to_owned());
    assert_eq!(
        error(cfg),
        "ALT_CA_HOSTNAME=\"bad name!\" is not a valid TLS server name (DNS name or IP address)"
    );

    let mut cfg = plain("http://istiod:15012");
    cfg.headers = vec![("x-ok".to_owned(), "bad\nvalue".to_owned())];
    assert_eq!(error(cfg), "CA_HEADER_x-ok is not a valid gRPC metadata name with a visible ASCII value");

    let mut cfg = plain("http://istiod:15012");
    cfg.cluster_id = "bad\ncluster".to_owned();
    assert_eq!(
        error(cfg),
        "cluster id \"bad\\ncluster\" (CLUSTER_ID / ISTIO_META_CLUSTER_ID) cannot be sent as the clusterid header: use visible ASCII"
    );

    let mut cfg = plain("http://istiod:15012");
    cfg.token = Some(TokenSource::Literal("bad\ntoken".to_owned()));
    assert_eq!(
        error(cfg),
        "the token given literally (AUTH_TOKEN) holds characters that are not allowed in an HTTP header"
    );
    let mut cfg = plain("http://istiod:15012");
    cfg.token = Some(TokenSource::Literal("  ".to_owned()));
    assert_eq!(error(cfg), "the token given literally (AUTH_TOKEN) is empty");

    assert_eq!(
        RootSource::parse(Service::Xds, "not-a-file").expect_err("bad").to_string(),
        "XDS_ROOT_CA=\"not-a-file\" is not an existing file, `SYSTEM`, or inline PEM certificates; set it to the file with the xDS server's root certificate (istiod's root-cert.pem)"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").expect("write");
    let mut cfg = plain("https://istiod:15012");
    cfg.roots = RootSource::File(empty.clone());
    assert_eq!(error(cfg), format!("CA_ROOT_CA ({}) holds no usable PEM certificate", empty.display()));

    let mut cfg = plain("https://istiod:15012");
    let gone = dir.path().join("gone.pem");
    cfg.roots = RootSource::File(gone.clone());
    assert_eq!(
        error(cfg),
        format!(
            "cannot read the CA root certificates {} (CA_ROOT_CA): No such file or directory (os error 2)",
            gone.display()
        )
    );

    let mut cfg = plain("https://istiod:15012");
    cfg.roots =
        RootSource::Inline("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_owned());
    assert_eq!(
        error(cfg),
        "CA_ROOT_CA (inline PEM) holds no usable PEM certificate: certificate 0: invalid peer certificate: BadEncoding"
    );

    // Plaintext needs no roots.
    let mut cfg = plain("http://istiod:15012");
    cfg.roots = RootSource::File(gone);
    ControlPlane::new(cfg).expect("roots unused over http://");
}

#[test]
fn token_file_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big");
    std::fs::write(&big, vec![b'a'; MAX_TOKEN_BYTES as usize + 1]).expect("write");
    let err = TokenSource::File(big.clone()).bearer().expect_err("too large");
    assert_eq!(
        err.to_string(),
        format!(
            "the token file {} (AUTH_TOKEN) is larger than 65536 bytes; is AUTH_TOKEN the token file?",
            big.display()
        )
    );
    let bad = dir.path().join("bad");
    std::fs::write(&bad, "a\u{7}b").expect("write");
    let err = TokenSource::File(bad.clone()).bearer().expect_err("control character");
    assert_eq!(
        err.to_string(),
        format!(
            "the token file {} (AUTH_TOKEN) holds characters that are not allowed in an HTTP header",
            bad.display()
        )
    );
}
