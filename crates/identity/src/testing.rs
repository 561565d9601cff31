//! Test helpers: an Istio CA gRPC server backed by a [`FakeCa`], served on a 127.0.0.1 port.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_api::ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use ambit_api::ca::{IstioCertificateRequest, IstioCertificateResponse};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, PKCS_ECDSA_P256_SHA256, SanType,
};
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

use crate::{FakeCa, Identity};

/// How the test CA answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Behavior {
    /// Sign for the impersonated identity, or else the CSR's URI SAN.
    #[default]
    Normal,
    /// Sign for this identity whatever was asked.
    WrongSan(Identity),
    /// Return only the leaf, without the root bundle.
    SingleElement,
    /// Return an empty chain.
    EmptyChain,
    /// Fail with this gRPC code.
    Fail(tonic::Code),
}

/// What the test CA saw in one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// All ASCII request headers, lower-case names.
    pub headers: Vec<(String, String)>,
    /// `ImpersonatedIdentity` from the request metadata, if present.
    pub impersonated: Option<String>,
    /// Requested validity in seconds.
    pub validity_duration: i64,
}

/// A running in-test Istio CA; stops when dropped.
pub struct TestCaServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The CA that signs workload certificates.
    pub ca: Arc<FakeCa>,
    /// PEM root of the server's own TLS certificate (TLS servers only).
    pub tls_root_pem: Option<String>,
    shared: Arc<Shared>,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

#[derive(Default)]
struct Shared {
    behavior: Mutex<Behavior>,
    requests: Mutex<Vec<RecordedRequest>>,
}

impl TestCaServer {
    /// Starts a plaintext (`http://`) CA server.
    pub async fn start(ca: Arc<FakeCa>) -> Self {
        Self::spawn(ca, None).await
    }

    /// Starts a TLS (`https://`) CA server whose certificate is valid for 127.0.0.1 and localhost.
    pub async fn start_tls(ca: Arc<FakeCa>) -> Self {
        Self::start_tls_for(ca, &["localhost", "127.0.0.1"]).await
    }

    /// Starts a TLS CA server on 127.0.0.1 whose certificate names only `names` (DNS names or IPs).
    pub async fn start_tls_for(ca: Arc<FakeCa>, names: &[&str]) -> Self {
        let (root_pem, cert_pem, key_pem) = server_tls_cert(names);
        let identity = tonic::transport::Identity::from_pem(cert_pem, key_pem);
        let tls = ServerTlsConfig::new().identity(identity);
        Self::spawn(ca, Some((tls, root_pem))).await
    }

    async fn spawn(ca: Arc<FakeCa>, tls: Option<(ServerTlsConfig, String)>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared::default());
        let service = IstioCertificateServiceServer::new(Service { ca: ca.clone(), shared: shared.clone() });
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut builder = Server::builder();
        let mut tls_root_pem = None;
        if let Some((tls, root)) = tls {
            builder = builder.tls_config(tls).expect("server TLS config");
            tls_root_pem = Some(root);
        }
        let router = builder.add_service(service);
        tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        TestCaServer { addr, ca, tls_root_pem, shared, _shutdown: shutdown }
    }

    /// `http://` or `https://` URI of the server.
    pub fn address(&self) -> String {
        let scheme = if self.tls_root_pem.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Changes how the server answers from now on.
    pub fn set_behavior(&self, behavior: Behavior) {
        *self.shared.behavior.lock().expect("lock") = behavior;
    }

    /// Requests seen so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().expect("lock").clone()
    }
}

/// The test CA as a service to mount on another tonic server (istiod serves the CA and xDS on
/// one port), with the record of the requests it saw.
#[derive(Clone)]
pub struct TestCaService {
    /// The CA that signs workload certificates.
    pub ca: Arc<FakeCa>,
    shared: Arc<Shared>,
}

impl TestCaService {
    /// A service signing with `ca`.
    pub fn new(ca: Arc<FakeCa>) -> Self {
        TestCaService { ca, shared: Arc::new(Shared::default()) }
    }

    /// The tonic service to add to a router.
    pub fn server(&self) -> IstioCertificateServiceServer<impl IstioCertificateService> {
        IstioCertificateServiceServer::new(Service { ca: self.ca.clone(), shared: self.shared.clone() })
    }

    /// Requests seen so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().expect("lock").clone()
    }
}

/// A throwaway root and a server certificate for `names` (DNS names or IPs): (root PEM,
/// certificate PEM, key PEM).
pub fn server_certificate(names: &[&str]) -> (String, String, String) {
    server_tls_cert(names)
}

struct Service {
    ca: Arc<FakeCa>,
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl IstioCertificateService for Service {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let headers = request
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                    Some((k.to_string(), v.to_str().ok()?.to_owned()))
                }
                tonic::metadata::KeyAndValueRef::Binary(..) => None,
            })
            .collect();
        let req = request.into_inner();
        let impersonated =
            req.metadata.as_ref().and_then(|m| m.fields.get("ImpersonatedIdentity")).and_then(|v| {
                match &v.kind {
                    Some(prost_types::value::Kind::StringValue(s)) => Some(s.clone()),
                    _ => None,
                }
            });
        self.shared.requests.lock().expect("lock").push(RecordedRequest {
            headers,
            impersonated: impersonated.clone(),
            validity_duration: req.validity_duration,
        });
        let behavior = self.shared.behavior.lock().expect("lock").clone();
        let identity = match (&behavior, impersonated) {
            (Behavior::Fail(code), _) => return Err(Status::new(*code, "test CA told to fail")),
            (Behavior::WrongSan(id), _) => id.clone(),
            (_, Some(id)) => id.parse().map_err(|e| Status::invalid_argument(format!("{e}")))?,
            (_, None) => csr_identity(&req.csr)?,
        };
        let ttl = Duration::from_secs(req.validity_duration.max(1).unsigned_abs());
        let mut chain = self
            .ca
            .sign_csr(&req.csr, &identity, ttl)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        match behavior {
            Behavior::SingleElement => chain.truncate(1),
            Behavior::EmptyChain => chain.clear(),
            _ => {}
        }
        Ok(Response::new(IstioCertificateResponse { cert_chain: chain }))
    }
}

/// The first URI SAN of a PEM CSR, as an identity.
fn csr_identity(csr: &str) -> Result<Identity, Status> {
    let params = rcgen::CertificateSigningRequestParams::from_pem(csr)
        .map_err(|e| Status::invalid_argument(format!("bad CSR: {e}")))?;
    params
        .params
        .subject_alt_names
        .iter()
        .find_map(|san| match san {
            SanType::URI(uri) => uri.as_str().parse().ok(),
            _ => None,
        })
        .ok_or_else(|| Status::invalid_argument("CSR has no SPIFFE URI SAN"))
}

/// A throwaway root and a server certificate for `names`: (root PEM, cert PEM, key PEM).
fn server_tls_cert(names: &[&str]) -> (String, String, String) {
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("root key");
    let mut root = CertificateParams::default();
    root.distinguished_name.push(DnType::CommonName, "Ambit test CA server root");
    root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let root_cert = root.self_signed(&root_key).expect("root cert");
    let issuer = Issuer::new(root, root_key);

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("server key");
    let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .expect("server params");
    params.distinguished_name.push(DnType::CommonName, "istiod test");
    let cert = params.signed_by(&key, &issuer).expect("server cert");
    (root_cert.pem(), cert.pem(), key.serialize_pem())
}
