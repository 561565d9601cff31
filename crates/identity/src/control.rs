//! The one way to reach the control plane (the Istio CA and xDS): its address, the roots that
//! verify it, the alternate TLS name, TLS as node-proxy.md §6.6 says, the bearer token and extra
//! headers. It builds a tonic [`Channel`] (TLS redone on every connect, roots re-read) and the
//! [`MetadataMap`] for each request or stream (the token file re-read each time).

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde::Serialize;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint, Uri};

mod connect;
mod settings;

pub use settings::{ControlSetting, ControlSettings};

use connect::{AltNameVerifier, ConnectTarget, Connector, PresentedCert, TlsConnect};

/// TCP connect (and TLS handshake) timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// TCP keepalive idle time, probe interval and probe count.
pub const TCP_KEEPALIVE: (Duration, Duration, u32) = (Duration::from_secs(300), Duration::from_secs(75), 9);
/// HTTP/2 keepalive ping interval.
pub const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// HTTP/2 keepalive ping timeout.
pub const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest token file read (a projected service account token is about 1 KiB).
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;
/// Largest root certificate file read.
pub const MAX_ROOTS_BYTES: u64 = 4 * 1024 * 1024;

/// Which control-plane service a connection is for; names the settings in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Service {
    /// The Istio CA (`CA_*` settings).
    Ca,
    /// The xDS server (`XDS_*` settings).
    Xds,
}

/// Where the roots that verify the control plane's TLS certificate come from.
#[derive(Clone, PartialEq, Eq, Serialize)]
pub enum RootSource {
    /// A PEM file, re-read on every connect.
    File(PathBuf),
    /// The operating system's trust store.
    System,
    /// PEM certificates given in the setting itself.
    Inline(String),
}

/// The bearer token sent to the control plane.
#[derive(Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// A file, re-read for every request or stream.
    File(PathBuf),
    /// The token itself.
    Literal(String),
}

/// Settings of a [`ControlPlane`] connection, as configured.
#[derive(Clone, Debug)]
pub struct ControlPlaneConfig {
    /// Which service this is (names the settings in errors).
    pub service: Service,
    /// `host:port`, `https://host:port`, or `http://host:port` (plaintext, local development).
    pub address: String,
    /// Roots for TLS (unused for `http://`).
    pub roots: RootSource,
    /// A name the server's certificate may carry instead of the address's host.
    pub alt_hostname: Option<String>,
    /// Bearer token; no `authorization` header when `None`.
    pub token: Option<TokenSource>,
    /// Sent as the `clusterid` header together with a token.
    pub cluster_id: String,
    /// Extra request headers, names without the `CA_HEADER_`/`XDS_HEADER_` prefix.
    pub headers: Vec<(String, String)>,
    /// `SO_MARK` on the connection's socket (`PACKET_MARK`): a proxy inside a captured pod marks
    /// its own control traffic so that the pod's capture rules let it out untouched.
    pub mark: Option<u32>,
}

/// A validated control-plane connection: builds channels and request metadata.
#[derive(Clone)]
pub struct ControlPlane {
    inner: Arc<Inner>,
}

struct Inner {
    service: Service,
    address: String,
    uri: Uri,
    tls: Option<TlsTarget>,
    mark: Option<u32>,
    token: Option<TokenSource>,
    cluster_id: Option<AsciiMetadataValue>,
    headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
}

struct TlsTarget {
    roots: RootSource,
    server_name: ServerName<'static>,
    alt_name: Option<ServerName<'static>>,
}

/// Why the control plane cannot be reached as configured.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The address is not a usable URI.
    #[error("{}={address:?} is not a usable {service} address: {reason}", .service.address_var())]
    Address {
        /// Which service.
        service: Service,
        /// The address as configured.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The roots setting is none of a file, `SYSTEM` or PEM.
    #[error(
        "{}={value:?} is not an existing file, `SYSTEM`, or inline PEM certificates; set it to the file with the {service}'s root certificate (istiod's root-cert.pem)",
        .service.root_var()
    )]
    RootSource {
        /// Which service.
        service: Service,
        /// The value as configured (cut to 100 characters).
        value: String,
    },
    /// The roots file cannot be read.
    #[error("cannot read the {service} root certificates {path} ({}): {source}", .service.root_var())]
    RootFile {
        /// Which service.
        service: Service,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The roots hold no usable certificate.
    #[error("{} ({origin}) holds no usable PEM certificate{detail}", .service.root_var())]
    NoRoots {
        /// Which service.
        service: Service,
        /// The file, "inline PEM" or "the OS trust store".
        origin: String,
        /// Why certificates were skipped, if any were.
        detail: String,
    },
    /// The alternate hostname is not a TLS server name.
    #[error("{}={value:?} is not a valid TLS server name (DNS name or IP address)", .service.alt_var())]
    AltHostname {
        /// Which service.
        service: Service,
        /// The value as configured.
        value: String,
    },
    /// An extra header is not valid gRPC metadata.
    #[error("{}{name} is not a valid gRPC metadata name with a visible ASCII value", .service.header_prefix())]
    Header {
        /// Which service.
        service: Service,
        /// The header name (without the prefix).
        name: String,
    },
    /// The cluster id cannot be sent as a header.
    #[error(
        "cluster id {0:?} (CLUSTER_ID / ISTIO_META_CLUSTER_ID) cannot be sent as the clusterid header: use visible ASCII"
    )]
    ClusterId(String),
    /// The token file cannot be read.
    #[error(
        "cannot read the token file {path} (AUTH_TOKEN): {source}; is the projected service account token mounted?"
    )]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The token file is larger than [`MAX_TOKEN_BYTES`].
    #[error(
        "the token file {0} (AUTH_TOKEN) is larger than {MAX_TOKEN_BYTES} bytes; is AUTH_TOKEN the token file?"
    )]
    TokenTooLarge(PathBuf),
    /// The token is empty.
    #[error("the token {0} (AUTH_TOKEN) is empty")]
    EmptyToken(String),
    /// The token cannot be sent in a header.
    #[error("the token {0} (AUTH_TOKEN) holds characters that are not allowed in an HTTP header")]
    InvalidToken(String),
    /// No TCP connection could be made.
    #[error("cannot connect to the {service} at {address}: {source}")]
    Connect {
        /// Which service.
        service: Service,
        /// The address.
        address: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The TLS handshake failed (e.g. the server's certificate is not trusted).
    #[error("TLS handshake with the {service} at {address} failed: {source}{hint}")]
    Handshake {
        /// Which service.
        service: Service,
        /// The address.
        address: String,
        /// The cause.
        source: std::io::Error,
        /// What the operator may do about it.
        hint: String,
    },
}

impl Service {
    /// The address setting.
    pub fn address_var(self) -> &'static str {
        match self {
            Service::Ca => "CA_ADDRESS",
            Service::Xds => "XDS_ADDRESS",
        }
    }

    /// The roots setting.
    pub fn root_var(self) -> &'static str {
        match self {
            Service::Ca => "CA_ROOT_CA",
            Service::Xds => "XDS_ROOT_CA",
        }
    }

    /// The alternate hostname setting.
    pub fn alt_var(self) -> &'static str {
        match self {
            Service::Ca => "ALT_CA_HOSTNAME",
            Service::Xds => "ALT_XDS_HOSTNAME",
        }
    }

    /// The prefix of the extra header settings.
    pub fn header_prefix(self) -> &'static str {
        match self {
            Service::Ca => "CA_HEADER_",
            Service::Xds => "XDS_HEADER_",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Service::Ca => "CA",
            Service::Xds => "xDS server",
        })
    }
}

impl RootSource {
    /// Reads a `CA_ROOT_CA`/`XDS_ROOT_CA` value as ztunnel does: an existing file is a PEM file,
    /// `SYSTEM` the OS trust store, anything else inline PEM (which must hold a certificate).
    pub fn parse(service: Service, value: &str) -> Result<RootSource, ControlError> {
        if !value.is_empty() && Path::new(value).is_file() {
            Ok(RootSource::File(PathBuf::from(value)))
        } else if value == "SYSTEM" {
            Ok(RootSource::System)
        } else if value.contains("-----BEGIN CERTIFICATE-----") {
            Ok(RootSource::Inline(value.to_owned()))
        } else {
            Err(ControlError::RootSource { service, value: value.chars().take(100).collect() })
        }
    }

    /// Loads the roots (file re-read, OS store loaded) into a store with at least one root.
    pub fn load(&self, service: Service) -> Result<RootCertStore, ControlError> {
        let mut store = RootCertStore::empty();
        let (origin, skipped) =
            match self {
                RootSource::File(path) => {
                    let pem = read_bounded(path, MAX_ROOTS_BYTES)
                        .map_err(|source| ControlError::RootFile { service, path: path.clone(), source })?;
                    (path.display().to_string(), add_pem(&mut store, &pem))
                }
                RootSource::Inline(pem) => ("inline PEM".to_owned(), add_pem(&mut store, pem.as_bytes())),
                RootSource::System => {
                    let found = rustls_native_certs::load_native_certs();
                    let mut skipped: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
                    let (_, bad) = store.add_parsable_certificates(found.certs);
                    if bad > 0 {
                        skipped.push(format!("{bad} unparsable certificates"));
                    }
                    ("the OS trust store".to_owned(), skipped)
                }
            };
        if store.is_empty() {
            let detail = if skipped.is_empty() { String::new() } else { format!(": {}", skipped.join("; ")) };
            return Err(ControlError::NoRoots { service, origin, detail });
        }
        for reason in skipped {
            tracing::warn!(service = %service, "{}: skipped a root certificate: {reason}", service.root_var());
        }
        Ok(store)
    }

    /// Modification time of a root file (`None` for other sources or when unreadable).
    pub fn modified(&self) -> Option<SystemTime> {
        match self {
            RootSource::File(path) => std::fs::metadata(path).and_then(|m| m.modified()).ok(),
            _ => None,
        }
    }
}

impl fmt::Debug for RootSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootSource::File(path) => f.debug_tuple("File").field(path).finish(),
            RootSource::System => f.write_str("System"),
            RootSource::Inline(pem) => write!(f, "Inline({} bytes of PEM)", pem.len()),
        }
    }
}

impl TokenSource {
    /// Default token file when `AUTH_TOKEN` is unset.
    pub const DEFAULT_PATH: &'static str = "./var/run/secrets/tokens/istio-token";

    /// Reads `AUTH_TOKEN` as ztunnel does: unset ⇒ the default file if it exists, else no token;
    /// an existing file ⇒ that file; any other value ⇒ the token itself. Empty ⇒ no token.
    pub fn from_setting(value: Option<&str>) -> Option<TokenSource> {
        match value {
            None => Path::new(Self::DEFAULT_PATH)
                .exists()
                .then(|| TokenSource::File(PathBuf::from(Self::DEFAULT_PATH))),
            Some("") => None,
            Some(v) if Path::new(v).exists() => Some(TokenSource::File(PathBuf::from(v))),
            Some(v) => Some(TokenSource::Literal(v.to_owned())),
        }
    }

    /// The `authorization` value, `Bearer <token>` (the file is read now).
    pub fn bearer(&self) -> Result<AsciiMetadataValue, ControlError> {
        let (token, origin) = match self {
            TokenSource::File(path) => {
                let bytes = read_bounded(path, MAX_TOKEN_BYTES).map_err(|source| {
                    if source.kind() == std::io::ErrorKind::FileTooLarge {
                        ControlError::TokenTooLarge(path.clone())
                    } else {
                        ControlError::TokenFile { path: path.clone(), source }
                    }
                })?;
                (String::from_utf8_lossy(&bytes).into_owned(), format!("file {}", path.display()))
            }
            TokenSource::Literal(token) => (token.clone(), "given literally".to_owned()),
        };
        let token = token.trim();
        if token.is_empty() {
            return Err(ControlError::EmptyToken(origin));
        }
        format!("Bearer {token}").parse().map_err(|_| ControlError::InvalidToken(origin))
    }
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::File(path) => f.debug_tuple("File").field(path).finish(),
            // Never print a credential.
            TokenSource::Literal(_) => f.write_str("Literal(<redacted>)"),
        }
    }
}

impl Serialize for TokenSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TokenSource::File(path) => s.serialize_newtype_variant("TokenSource", 0, "File", path),
            TokenSource::Literal(_) => s.serialize_newtype_variant("TokenSource", 1, "Literal", "<redacted>"),
        }
    }
}

impl ControlPlane {
    /// Validates the settings; for TLS the roots are loaded once now so that unusable roots stop
    /// the process at start rather than at its first request.
    pub fn new(cfg: ControlPlaneConfig) -> Result<ControlPlane, ControlError> {
        let service = cfg.service;
        let address = normalise_address(&cfg.address);
        let invalid = |reason: &str| ControlError::Address {
            service,
            address: cfg.address.clone(),
            reason: reason.to_owned(),
        };
        let uri: Uri = address.parse().map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        let host = uri.host().ok_or_else(|| invalid("it has no host"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let tls = match uri.scheme_str() {
            Some("https") => {
                let server_name = ServerName::try_from(host.clone())
                    .map_err(|_| invalid("its host is not a valid TLS server name"))?;
                let alt_name = match cfg.alt_hostname.as_deref().filter(|a| !a.is_empty()) {
                    Some(alt) => Some(
                        ServerName::try_from(alt.to_owned())
                            .map_err(|_| ControlError::AltHostname { service, value: alt.to_owned() })?,
                    ),
                    None => None,
                };
                cfg.roots.load(service)?;
                Some(TlsTarget { roots: cfg.roots.clone(), server_name, alt_name })
            }
            Some("http") => None,
            _ => return Err(invalid("use https:// (or http:// for local development)")),
        };
        let headers = cfg
            .headers
            .iter()
            .map(|(k, v)| {
                let key = k.to_ascii_lowercase().parse::<AsciiMetadataKey>();
                match (key, v.parse::<AsciiMetadataValue>()) {
                    (Ok(key), Ok(value)) => Ok((key, value)),
                    _ => Err(ControlError::Header { service, name: k.clone() }),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cluster_id = match cfg.cluster_id.as_str() {
            "" => None,
            id => Some(id.parse().map_err(|_| ControlError::ClusterId(id.to_owned()))?),
        };
        if let Some(TokenSource::Literal(_)) = &cfg.token {
            cfg.token.as_ref().map(TokenSource::bearer).transpose()?;
        }
        Ok(ControlPlane {
            inner: Arc::new(Inner {
                service,
                address,
                uri,
                tls,
                mark: cfg.mark,
                token: cfg.token,
                cluster_id,
                headers,
            }),
        })
    }

    /// The address in use (with its scheme).
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// Which service this connects to.
    pub fn service(&self) -> Service {
        self.inner.service
    }

    /// Modification time of the root file, to notice a rotated root.
    pub fn roots_modified(&self) -> Option<SystemTime> {
        self.inner.tls.as_ref().and_then(|t| t.roots.modified())
    }

    /// A channel that connects on first use, with TLS built now from freshly loaded roots.
    pub fn channel(&self) -> Result<Channel, ControlError> {
        let endpoint = self.endpoint();
        match self.connector(None)? {
            Some(connector) => Ok(endpoint.connect_with_connector_lazy(connector)),
            None => Ok(endpoint.connect_lazy()),
        }
    }

    /// A connected channel, with TLS built now from freshly loaded roots (for stream clients that
    /// want a failed connect reported at once).
    pub async fn connect(&self) -> Result<Channel, ControlError> {
        self.connect_presenting(None).await
    }

    /// Like [`ControlPlane::connect`], presenting `cert` as the TLS client certificate: the
    /// control plane then knows the caller by that identity (istiod's client-certificate
    /// authenticator), whatever the bearer token says. Over plaintext nothing is presented.
    pub async fn connect_as(&self, cert: &crate::WorkloadCertificate) -> Result<Channel, ControlError> {
        self.connect_presenting(Some(cert.key.clone())).await
    }

    async fn connect_presenting(&self, client: Option<Arc<CertifiedKey>>) -> Result<Channel, ControlError> {
        let endpoint = self.endpoint();
        let result = match self.connector(client)? {
            Some(connector) => endpoint.connect_with_connector(connector).await,
            None => endpoint.connect().await,
        };
        result.map_err(|e| self.connect_error(&e))
    }

    /// Metadata for one request or stream: `authorization: Bearer …` and `clusterid` when a token
    /// is configured (the file is read now), then the extra headers.
    pub fn metadata(&self) -> Result<MetadataMap, ControlError> {
        let mut md = MetadataMap::new();
        if let Some(token) = &self.inner.token {
            md.insert("authorization", token.bearer()?);
            if let Some(id) = &self.inner.cluster_id {
                md.insert("clusterid", id.clone());
            }
        }
        for (k, v) in &self.inner.headers {
            md.append(k.clone(), v.clone());
        }
        Ok(md)
    }

    fn endpoint(&self) -> Endpoint {
        let inner = &self.inner;
        // TLS is done by our connector, so tonic is handed an http:// endpoint (it would otherwise
        // insist on its own TLS); requests still carry the real https:// origin.
        let endpoint = match &inner.tls {
            Some(_) => {
                let mut parts = inner.uri.clone().into_parts();
                parts.scheme = Some(http::uri::Scheme::HTTP);
                let plain = Uri::from_parts(parts).unwrap_or_else(|_| inner.uri.clone());
                Endpoint::from(plain).origin(inner.uri.clone())
            }
            None => Endpoint::from(inner.uri.clone())
                .tcp_keepalive(Some(TCP_KEEPALIVE.0))
                .tcp_keepalive_interval(Some(TCP_KEEPALIVE.1))
                .tcp_keepalive_retries(Some(TCP_KEEPALIVE.2)),
        };
        endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(H2_KEEPALIVE_INTERVAL)
            .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT)
    }

    /// Our connector: always for TLS, and for plaintext when the socket must be marked
    /// (tonic's own connector cannot set `SO_MARK`).
    fn connector(&self, client: Option<Arc<CertifiedKey>>) -> Result<Option<Connector>, ControlError> {
        let inner = &self.inner;
        let Some(tls) = &inner.tls else {
            return Ok(inner.mark.map(|mark| Connector {
                target: Arc::new(ConnectTarget {
                    service: inner.service,
                    address: inner.address.clone(),
                    mark: Some(mark),
                    tls: None,
                }),
            }));
        };
        let roots = Arc::new(tls.roots.load(inner.service)?);
        let provider = crate::tls::provider();
        let webpki =
            WebPkiServerVerifier::builder_with_provider(roots, provider.clone()).build().map_err(|e| {
                ControlError::NoRoots {
                    service: inner.service,
                    origin: format!("{:?}", tls.roots),
                    detail: format!(": {e}"),
                }
            })?;
        let verifier = AltNameVerifier { inner: webpki, alt: tls.alt_name.clone() };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            // The provider is aws-lc-rs with TLS 1.3 suites, which always supports TLS 1.3.
            .expect("aws-lc-rs provider supports TLS 1.3")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let mut config = match client {
            Some(key) => builder.with_client_cert_resolver(Arc::new(PresentedCert(key))),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Some(Connector {
            target: Arc::new(ConnectTarget {
                service: inner.service,
                address: inner.address.clone(),
                mark: inner.mark,
                tls: Some(TlsConnect {
                    server_name: tls.server_name.clone(),
                    alt_set: tls.alt_name.is_some(),
                    connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
                }),
            }),
        }))
    }

    /// Turns a tonic connect error into ours when our connector produced it.
    fn connect_error(&self, e: &tonic::transport::Error) -> ControlError {
        if let Some(ours) = find_control_error(e).and_then(ControlError::clone_io) {
            return ours;
        }
        ControlError::Connect {
            service: self.inner.service,
            address: self.inner.address.clone(),
            source: std::io::Error::other(error_chain(e)),
        }
    }
}

impl fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlPlane")
            .field("service", &self.inner.service)
            .field("address", &self.inner.address)
            .finish_non_exhaustive()
    }
}

impl ControlError {
    /// A copy of a connect or handshake error carrying the same message (io errors are not
    /// `Clone`).
    fn clone_io(&self) -> Option<ControlError> {
        Some(match self {
            ControlError::Connect { service, address, source } => ControlError::Connect {
                service: *service,
                address: address.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            ControlError::Handshake { service, address, source, hint } => ControlError::Handshake {
                service: *service,
                address: address.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
                hint: hint.clone(),
            },
            _ => return None,
        })
    }
}

/// The first [`ControlError`] in an error's source chain (how our connector's errors travel
/// through tonic and hyper).
pub fn find_control_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a ControlError> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(ours) = err.downcast_ref::<ControlError>() {
            return Some(ours);
        }
        current = err.source();
    }
    None
}

/// An error and its causes, joined by ": ", skipping repeats.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        current = err.source();
    }
    parts.join(": ")
}

/// `https://` added when the address has no scheme.
fn normalise_address(address: &str) -> String {
    if address.contains("://") { address.to_owned() } else { format!("https://{address}") }
}

/// Reads at most `limit` bytes of a file; a larger file is `FileTooLarge`.
fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// Adds every PEM certificate; returns why some could not be used.
fn add_pem(store: &mut RootCertStore, pem: &[u8]) -> Vec<String> {
    let mut skipped = Vec::new();
    for (i, cert) in CertificateDer::pem_slice_iter(pem).enumerate() {
        match cert.map_err(|e| e.to_string()).and_then(|c| store.add(c).map_err(|e| e.to_string())) {
            Ok(()) => {}
            Err(e) => skipped.push(format!("certificate {i}: {e}")),
        }
    }
    skipped
}

#[cfg(test)]
mod tests;
