//! The CA through a real tonic client over TLS (and plaintext), with the authentication chain,
//! node authorization, and the key material as `ambit control` wires them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use ambit_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use ambit_identity::{KeyAlgorithm, SigningAuthority, TtlPolicy};
use rcgen::{CertificateParams, DistinguishedName, KeyPair, PKCS_ECDSA_P256_SHA256, PKCS_ED25519};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::material::{self, MaterialConfig};
use super::*;
use crate::auth::{AuthChain, DEFAULT_AUDIENCE, KubeJwtAuthenticator, KubeJwtConfig, NodeTokens};
use crate::testing::{FakePods, FakeReviewer, FakeToken};
use crate::tls::{self, ServeSettings};

const TD: &str = "cluster.local";
const SERVER_NAME: &str = "istiod.istio-system.svc";
const WEB: &str = "spiffe://cluster.local/ns/default/sa/web";
const DB: &str = "spiffe://cluster.local/ns/default/sa/db";

/// A CA served on 127.0.0.1 as `ambit control` serves it; stops when dropped.
struct Running {
    addr: SocketAddr,
    authority: Arc<SigningAuthority>,
    metrics: CaMetrics,
    tokens: Arc<NodeTokens>,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn self_signed() -> Arc<SigningAuthority> {
    let (ca, _, _) =
        SigningAuthority::self_signed(TD, KeyAlgorithm::EcdsaP256, ambit_identity::SELF_SIGNED_ROOT_TTL)
            .expect("root");
    Arc::new(ca)
}

async fn start(authority: Arc<SigningAuthority>, use_tls: bool) -> Running {
    let reviewer = FakeReviewer::default();
    reviewer.insert(
        "ztunnel-token",
        FakeToken::service_account("istio-system", "ztunnel", DEFAULT_AUDIENCE, Some(("zt-a", "uid-zt-a"))),
    );
    reviewer.insert("web-token", FakeToken::service_account("default", "web", DEFAULT_AUDIENCE, None));
    reviewer.insert("vault-token", FakeToken::service_account("default", "web", "vault", None));
    let pods = FakePods::default();
    pods.insert("istio-system", "zt-a", "uid-zt-a", "ztunnel", "node-a");
    pods.insert("default", "web-1", "uid-web-1", "web", "node-a");
    pods.insert("default", "db-1", "uid-db-1", "db", "node-b");
    let pods = Arc::new(pods);

    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = Arc::new(
        NodeTokens::create(
            &dir.path().join("tokens"),
            ["node-a".to_owned(), "node-b".to_owned()],
            &ambit_identity::Identity::new(TD, "istio-system", "ztunnel"),
        )
        .expect("node tokens"),
    );
    let kube = KubeJwtAuthenticator::new(
        Arc::new(reviewer),
        KubeJwtConfig {
            audiences: vec![DEFAULT_AUDIENCE.to_owned()],
            trust_domain: TD.to_owned(),
            cluster_id: "Kubernetes".to_owned(),
            cluster_aliases: Vec::new(),
        },
    );
    let chain = AuthChain::new()
        .with_client_certificates()
        .with_node_tokens(tokens.clone())
        .with_kubernetes(Arc::new(kube));
    let authorizer = NodeAuthorizer::new("istio-system/ztunnel".parse().expect("accounts"), pods, TD);
    let service =
        CaService::new(authority.clone(), Arc::new(chain), Some(Arc::new(authorizer)), TtlPolicy::default());
    let metrics = service.metrics();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls_config = use_tls.then(|| {
        let names = tls::serving_names("istio-system", None, SERVER_NAME, &["127.0.0.1".to_owned()]);
        tls::server_config(&authority, &names).expect("serving config")
    });
    let routes = tonic::service::Routes::new(service.into_server());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        tls::serve(routes, listener, tls_config, &ServeSettings::default(), shutdown).await.expect("serve");
    });
    Running { addr, authority, metrics, tokens, _dir: dir, _stop: stop }
}

impl Running {
    /// A tonic client over TLS verifying the server as istiod, with an optional client
    /// certificate (PEM chain, PEM key).
    async fn client(
        &self,
        identity: Option<(String, String)>,
    ) -> Result<IstioCertificateServiceClient<Channel>, String> {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.authority.root_bundle_pem()))
            .domain_name(SERVER_NAME);
        if let Some((cert, key)) = identity {
            tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        let channel = Endpoint::from_shared(format!("https://{}", self.addr))
            .map_err(|e| e.to_string())?
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        Ok(IstioCertificateServiceClient::new(channel))
    }

    async fn plain_client(&self) -> IstioCertificateServiceClient<Channel> {
        let channel = Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        IstioCertificateServiceClient::new(channel)
    }

    fn node_token(&self, node: &str) -> String {
        std::fs::read_to_string(self.tokens.path(node)).expect("token file")
    }
}

fn csr(alg: &'static rcgen::SignatureAlgorithm) -> String {
    let key = KeyPair::generate_for(alg).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names =
        vec![rcgen::SanType::URI("spiffe://cluster.local/ns/kube-system/sa/admin".try_into().expect("uri"))];
    params.serialize_request(&key).expect("csr").pem().expect("pem")
}

fn request(
    csr: &str,
    ttl: i64,
    impersonate: Option<&str>,
    token: Option<&str>,
) -> tonic::Request<IstioCertificateRequest> {
    let metadata = impersonate.map(|id| prost_types::Struct {
        fields: BTreeMap::from([(
            IMPERSONATED_IDENTITY.to_owned(),
            prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(id.to_owned())) },
        )]),
    });
    let mut req = tonic::Request::new(IstioCertificateRequest {
        csr: csr.to_owned(),
        validity_duration: ttl,
        metadata,
    });
    if let Some(token) = token {
        req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
        req.metadata_mut().insert("clusterid", "Kubernetes".parse().expect("ascii"));
    }
    req
}

async fn call(
    client: &mut IstioCertificateServiceClient<Channel>,
    req: tonic::Request<IstioCertificateRequest>,
) -> Result<Vec<String>, (tonic::Code, String)> {
    client
        .create_certificate(req)
        .await
        .map(|r| r.into_inner().cert_chain)
        .map_err(|s| (s.code(), s.message().to_owned()))
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem")
}

/// The URI SANs of a PEM leaf.
fn uris(pem: &str) -> Vec<String> {
    let der = der(pem);
    let (_, cert) = X509Certificate::from_der(&der).expect("x509");
    let san = cert.subject_alternative_name().expect("san").expect("present");
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some((*u).to_owned()),
            _ => None,
        })
        .collect()
}

/// webpki verification of `chain` (leaf first) against the PEM `roots` as a client certificate.
fn verify(chain: &[String], roots: &str) -> Result<(), rustls::Error> {
    let mut store = rustls::RootCertStore::empty();
    for root in CertificateDer::pem_slice_iter(roots.as_bytes()) {
        store.add(root.expect("root")).expect("add");
    }
    let certs: Vec<_> = chain.iter().map(|p| der(p)).collect();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(store),
        Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    )
    .build()
    .expect("verifier");
    verifier.verify_client_cert(&certs[0], &certs[1..], rustls_pki_types::UnixTime::now()).map(|_| ())
}

const UNAUTHENTICATED: (tonic::Code, &str) = (tonic::Code::Unauthenticated, "request authenticate failure");
const IMPERSONATION_REFUSED: (tonic::Code, &str) =
    (tonic::Code::Unauthenticated, "request impersonation authentication failure");

fn status(code: tonic::Code, message: &str) -> Result<Vec<String>, (tonic::Code, String)> {
    Err((code, message.to_owned()))
}

#[tokio::test]
async fn an_unauthenticated_caller_is_refused() {
    let ca = start(self_signed(), true).await;
    let mut client = ca.client(None).await.expect("connect");
    let (code, msg) = UNAUTHENTICATED;
    assert_eq!(
        call(&mut client, request(&csr(&PKCS_ECDSA_P256_SHA256), 0, None, None)).await,
        status(code, msg)
    );
    assert_eq!(
        call(&mut client, request(&csr(&PKCS_ECDSA_P256_SHA256), 0, None, Some("forged"))).await,
        status(code, msg)
    );
    assert_eq!(ca.metrics.refused("authentication"), 2);
    assert_eq!(ca.metrics.signed(), 0);
}

#[tokio::test]
async fn a_token_for_the_wrong_audience_is_refused() {
    let ca = start(self_signed(), true).await;
    let mut client = ca.client(None).await.expect("connect");
    let (code, msg) = UNAUTHENTICATED;
    let got = call(&mut client, request(&csr(&PKCS_ECDSA_P256_SHA256), 0, None, Some("vault-token"))).await;
    assert_eq!(got, status(code, msg));
    // The same service account's token for istio-ca is accepted.
    let chain = call(&mut client, request(&csr(&PKCS_ECDSA_P256_SHA256), 0, None, Some("web-token")))
        .await
        .expect("signed");
    assert_eq!(uris(&chain[0]), [WEB], "a caller without impersonation gets its own identity, not the CSR's");
}

#[tokio::test]
async fn impersonation_needs_a_pod_of_that_identity_on_the_callers_node() {
    let ca = start(self_signed(), true).await;
    let mut client = ca.client(None).await.expect("connect");
    let csr = csr(&PKCS_ECDSA_P256_SHA256);
    // db runs on node-b only; the ztunnel token is bound to a pod on node-a.
    let (code, msg) = IMPERSONATION_REFUSED;
    assert_eq!(call(&mut client, request(&csr, 0, Some(DB), Some("ztunnel-token"))).await, status(code, msg));
    // A workload's own token may not impersonate either (not a trusted node account).
    assert_eq!(call(&mut client, request(&csr, 0, Some(WEB), Some("web-token"))).await, status(code, msg));
    assert_eq!(ca.metrics.refused("impersonation"), 2);

    // web has a pod on node-a: signed for exactly the impersonated identity.
    let chain = call(&mut client, request(&csr, 0, Some(WEB), Some("ztunnel-token"))).await.expect("signed");
    assert_eq!(uris(&chain[0]), [WEB]);
    assert_eq!(chain.len(), 2, "self-signed CA: [leaf, root]");
    assert_eq!(chain[1], ca.authority.root_bundle_pem());
    verify(&chain[..1], &chain[1]).expect("the leaf chains to the returned root");
    assert_eq!(ca.metrics.signed(), 1);
}

#[tokio::test]
async fn local_node_tokens_authenticate_the_node_proxy_of_their_node() {
    let ca = start(self_signed(), true).await;
    let mut client = ca.client(None).await.expect("connect");
    let csr = csr(&PKCS_ECDSA_P256_SHA256);
    let node_a = ca.node_token("node-a");
    let node_b = ca.node_token("node-b");
    let chain = call(&mut client, request(&csr, 0, None, Some(&node_a))).await.expect("own identity");
    assert_eq!(uris(&chain[0]), ["spiffe://cluster.local/ns/istio-system/sa/ztunnel"]);
    let chain = call(&mut client, request(&csr, 0, Some(WEB), Some(&node_a))).await.expect("web on node-a");
    assert_eq!(uris(&chain[0]), [WEB]);
    let chain = call(&mut client, request(&csr, 0, Some(DB), Some(&node_b))).await.expect("db on node-b");
    assert_eq!(uris(&chain[0]), [DB]);
    let (code, msg) = IMPERSONATION_REFUSED;
    assert_eq!(call(&mut client, request(&csr, 0, Some(DB), Some(&node_a))).await, status(code, msg));
}

#[tokio::test]
async fn an_unparseable_csr_or_a_refused_key_type_is_invalid_argument() {
    let ca = start(self_signed(), true).await;
    let mut client = ca.client(None).await.expect("connect");
    let invalid = tonic::Code::InvalidArgument;
    assert_eq!(
        call(&mut client, request("not a CSR", 0, None, Some("web-token"))).await,
        status(invalid, "CSR signing error (the CSR is not a PEM CERTIFICATE REQUEST)")
    );
    let garbage = "-----BEGIN CERTIFICATE REQUEST-----\nMAMCAQA=\n-----END CERTIFICATE REQUEST-----\n";
    let (code, msg) =
        call(&mut client, request(garbage, 0, None, Some("web-token"))).await.expect_err("refused");
    assert_eq!(code, invalid);
    assert!(msg.starts_with("CSR signing error (the CSR cannot be parsed: "), "{msg}");
    assert_eq!(
        call(&mut client, request(&csr(&PKCS_ED25519), 0, None, Some("web-token"))).await,
        status(
            invalid,
            "CSR signing error (the CSR's public key is Ed25519; this CA issues certificates for ECDSA P-256, ECDSA P-384, or RSA of 2048 to 8192 bits keys)"
        )
    );
    assert_eq!(ca.metrics.refused("invalid_request"), 3);
}

#[tokio::test]
async fn lifetimes_follow_istios_ttl_rules() {
    let ca = start(self_signed(), true).await;
    let mut client = ca.client(None).await.expect("connect");
    let csr = csr(&PKCS_ECDSA_P256_SHA256);
    assert_eq!(
        call(&mut client, request(&csr, 90 * 86400 + 1, None, Some("web-token"))).await,
        status(
            tonic::Code::InvalidArgument,
            "CSR signing error (requested TTL 2160h0m1s is greater than the max allowed TTL 2160h0m0s)"
        )
    );
    for (asked, want) in [(0, 86400), (3600, 3600), (90 * 86400, 90 * 86400)] {
        let chain = call(&mut client, request(&csr, asked, None, Some("web-token"))).await.expect("signed");
        let leaf = der(&chain[0]);
        let (_, cert) = X509Certificate::from_der(&leaf).expect("x509");
        let v = cert.validity();
        assert_eq!(
            v.not_after.timestamp() - v.not_before.timestamp(),
            want + 120,
            "asked {asked}: TTL plus the 2-minute backdate"
        );
    }
}

/// A client certificate for `identity` from `authority`: (PEM chain, PEM key).
fn client_cert(authority: &SigningAuthority, identity: &str) -> (String, String) {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let csr = CertificateParams::default().serialize_request(&key).expect("csr").pem().expect("pem");
    let validity = TtlPolicy::default()
        .validity(3600, time::OffsetDateTime::now_utc(), authority.not_after())
        .expect("validity");
    let chain = authority.sign(&csr, &[identity.to_owned()], validity).expect("sign");
    (chain[0].clone(), key.serialize_pem())
}

#[tokio::test]
async fn a_client_certificate_caller_gets_its_own_san() {
    let ca = start(self_signed(), true).await;
    let me = "spiffe://cluster.local/ns/team/sa/renewer";
    let mut client =
        ca.client(Some(client_cert(&ca.authority, me))).await.expect("connect with a certificate");
    let chain =
        call(&mut client, request(&csr(&PKCS_ECDSA_P256_SHA256), 0, None, None)).await.expect("signed");
    assert_eq!(uris(&chain[0]), [me]);
    // A client certificate cannot impersonate: it names no node.
    let (code, msg) = IMPERSONATION_REFUSED;
    assert_eq!(
        call(&mut client, request(&csr(&PKCS_ECDSA_P256_SHA256), 0, Some(WEB), None)).await,
        status(code, msg)
    );

    // A certificate from another CA does not pass the handshake.
    let foreign = self_signed();
    let got = ca.client(Some(client_cert(&foreign, me))).await;
    let refused = match got {
        Err(e) => e,
        Ok(mut client) => {
            call(&mut client, request(&csr(&PKCS_ECDSA_P256_SHA256), 0, None, None))
                .await
                .map(|_| "signed".to_owned())
                .expect_err("a foreign certificate must not authenticate")
                .1
        }
    };
    assert!(!refused.is_empty());
}

#[tokio::test]
async fn plaintext_serving_authenticates_tokens_only() {
    let ca = start(self_signed(), false).await;
    let mut client = ca.plain_client().await;
    let csr = csr(&PKCS_ECDSA_P256_SHA256);
    let chain = call(&mut client, request(&csr, 0, None, Some("web-token"))).await.expect("signed");
    assert_eq!(uris(&chain[0]), [WEB]);
    let (code, msg) = UNAUTHENTICATED;
    assert_eq!(call(&mut client, request(&csr, 0, None, None)).await, status(code, msg));
}

fn write_plugged(dir: &Path) -> (String, String) {
    use rcgen::{BasicConstraints, DnType, IsCa, Issuer, KeyUsagePurpose};
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "Corp Root");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let root = params.self_signed(&root_key).expect("root");
    let issuer = Issuer::new(params, root_key);
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, "Mesh Intermediate");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let inter = params.signed_by(&key, &issuer).expect("intermediate");
    std::fs::write(dir.join(material::CA_CERT), inter.pem()).expect("write");
    std::fs::write(dir.join(material::CA_KEY), key.serialize_pem()).expect("write");
    std::fs::write(dir.join(material::ROOT_CERT), root.pem()).expect("write");
    std::fs::write(dir.join(material::CERT_CHAIN), format!("{}{}", inter.pem(), root.pem())).expect("write");
    (root.pem(), inter.pem())
}

#[tokio::test]
async fn a_plugged_ca_signs_and_its_chain_is_returned() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (root, inter) = write_plugged(tmp.path());
    let cfg = MaterialConfig {
        cacerts_dir: tmp.path().to_owned(),
        state_dir: Some(tmp.path().join("state")),
        trust_domain: TD.to_owned(),
        algorithm: KeyAlgorithm::EcdsaP256,
    };
    let (authority, _) = material::load(&cfg).expect("plugged");
    let ca = start(Arc::new(authority), true).await;
    let mut client = ca.client(None).await.expect("TLS with the plugged root");
    let chain = call(&mut client, request(&csr(&PKCS_ECDSA_P256_SHA256), 0, None, Some("web-token")))
        .await
        .expect("signed");
    assert_eq!(chain.len(), 4, "leaf, cert-chain.pem split one per element, root bundle");
    assert_eq!(chain[1..], [inter.clone(), root.clone(), root.clone()]);
    verify(&chain[..2], &root).expect("leaf → plugged intermediate → plugged root");
}

#[tokio::test]
async fn a_self_signed_root_survives_a_restart() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = MaterialConfig {
        cacerts_dir: tmp.path().join("cacerts"),
        state_dir: Some(tmp.path().join("state")),
        trust_domain: TD.to_owned(),
        algorithm: KeyAlgorithm::EcdsaP256,
    };
    let csr = csr(&PKCS_ECDSA_P256_SHA256);
    let (first, _) = material::load(&cfg).expect("first start");
    let before = {
        let ca = start(Arc::new(first), true).await;
        let mut client = ca.client(None).await.expect("connect");
        call(&mut client, request(&csr, 0, None, Some("web-token"))).await.expect("signed")
    };
    let (second, source) = material::load(&cfg).expect("restart");
    assert_eq!(source, material::MaterialSource::Loaded(tmp.path().join("state")));
    let ca = start(Arc::new(second), true).await;
    let mut client =
        ca.client(None).await.expect("the restarted server's certificate chains to the same root");
    let after = call(&mut client, request(&csr, 0, None, Some("web-token"))).await.expect("signed");
    assert_eq!(after.last(), before.last(), "same root bundle");
    verify(&before[..1], after.last().expect("root"))
        .expect("a certificate from before the restart still verifies");
}

#[tokio::test]
async fn ambits_own_ca_client_in_shared_mode_gets_certificates() {
    use ambit_identity::control::{ControlPlaneConfig, RootSource, Service, TokenSource};
    let ca = start(self_signed(), true).await;
    let client = ambit_identity::CaClient::new(ambit_identity::CaClientConfig {
        control: ControlPlaneConfig {
            service: Service::Ca,
            address: format!("https://{}", ca.addr),
            roots: RootSource::Inline(ca.authority.root_bundle_pem().to_owned()),
            alt_hostname: None,
            token: Some(TokenSource::File(ca.tokens.path("node-a"))),
            cluster_id: "Kubernetes".to_owned(),
            headers: Vec::new(),
            mark: None,
        },
        impersonate: true,
    })
    .expect("client");
    let manager = ambit_identity::CertManager::new(Arc::new(client), std::time::Duration::from_secs(3600));
    let web = ambit_identity::Identity::new(TD, "default", "web");
    let cert = manager.fetch(&web).await.expect("certificate for web via the node token");
    assert_eq!(cert.identity(), &web);
    let db = ambit_identity::Identity::new(TD, "default", "db");
    let err = manager.fetch(&db).await.expect_err("db is not on node-a").to_string();
    assert!(err.contains("Unauthenticated") && err.contains(IMPERSONATION_FAILURE), "{err}");
}

#[tokio::test]
async fn tls12_clients_are_served() {
    let ca = start(self_signed(), true).await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.authority.roots()[0].clone()).expect("root");
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .expect("tls12")
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(ca.addr).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from(SERVER_NAME).expect("name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS 1.2 handshake");
    assert_eq!(tls.get_ref().1.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));
}
