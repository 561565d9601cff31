//! gRPC serving for the control plane (control-plane.md §5.6, §7): a serving certificate from our
//! own CA, TLS ≥ 1.2 with client certificates requested, optional and verified against the mesh
//! roots, or plaintext (15010, local mode); the verified peer chain reaches every request as
//! [`PeerInfo`] in its extensions. [`serve`] runs a tonic [`Routes`] either way.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ambit_identity::SigningAuthority;
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::service::Routes;
use tonic::transport::server::Connected;

/// Lifetime of the serving certificate (istiod: 10 years, clamped to the CA's own end).
pub const SERVING_CERT_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Longest a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS handshakes in progress at once; the listener stops accepting while this many run.
pub const MAX_HANDSHAKES: usize = 1024;

/// What a request knows about its connection (a request extension).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The client's address.
    pub remote: Option<SocketAddr>,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// The client's certificate chain (leaf first), present only if the client sent one and it
    /// verified against the mesh roots during the handshake.
    pub verified_chain: Option<Arc<[CertificateDer<'static>]>>,
}

impl PeerInfo {
    /// The connection info of a tonic request served by [`serve`].
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&PeerInfo> {
        request.extensions().get::<PeerInfo>()
    }
}

/// gRPC server parameters (control-plane.md §5.6).
#[derive(Clone, Debug)]
pub struct ServeSettings {
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 keepalive ping interval.
    pub keepalive_interval: Duration,
    /// HTTP/2 keepalive ping timeout.
    pub keepalive_timeout: Duration,
    /// A connection is sent GOAWAY after this long, so clients spread over replicas.
    pub max_connection_age: Duration,
    /// How long in-flight calls may finish after that GOAWAY.
    pub max_connection_age_grace: Duration,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            max_concurrent_streams: 100_000,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(30 * 60),
            max_connection_age_grace: Duration::from_secs(10),
        }
    }
}

/// Why TLS serving cannot be set up or a server stopped.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The serving certificate could not be issued.
    #[error("cannot issue the control plane's serving certificate: {0}")]
    Issue(#[from] ambit_identity::SignError),
    /// rustls refused the certificate, key or roots.
    #[error("cannot build the TLS server configuration: {0}")]
    Config(String),
    /// The gRPC server failed.
    #[error("the gRPC server on {addr} failed: {source}")]
    Serve {
        /// The listening address.
        addr: String,
        /// The cause.
        source: tonic::transport::Error,
    },
}

/// The names on istiod's serving certificate (§7): the discovery address host,
/// `istiod.<ns>.svc`, `istiod-remote.<ns>.svc`, `istio-pilot.<ns>.svc`, `istiod-<rev>.<ns>.svc`
/// for a non-default revision, then each extra name (`ISTIOD_CUSTOM_HOST`; an IP address
/// becomes an IP SAN). Sorted and de-duplicated when issued.
pub fn serving_names(
    namespace: &str,
    revision: Option<&str>,
    discovery_host: &str,
    extra: &[String],
) -> Vec<String> {
    let mut names = vec![
        discovery_host.to_owned(),
        format!("istiod.{namespace}.svc"),
        format!("istiod-remote.{namespace}.svc"),
        format!("istio-pilot.{namespace}.svc"),
    ];
    if let Some(rev) = revision.filter(|r| !r.is_empty() && *r != "default") {
        names.push(format!("istiod-{rev}.{namespace}.svc"));
    }
    names.extend(extra.iter().filter(|n| !n.is_empty()).cloned());
    names.sort();
    names.dedup();
    names
}

/// A TLS server configuration with a serving certificate for `names` issued by `authority`:
/// TLS 1.2 and 1.3, ALPN `h2`, client certificates requested but optional and verified against
/// the authority's roots.
pub fn server_config(
    authority: &SigningAuthority,
    names: &[String],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cert = authority.issue_server(names, SERVING_CERT_TTL)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    for root in authority.roots() {
        roots.add(root.clone()).map_err(|e| TlsError::Config(format!("root certificate: {e}")))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(cert.chain, cert.key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `routes` on `listener` until `shutdown` resolves: over TLS with `tls`, plaintext
/// without. Every request carries a [`PeerInfo`] extension.
pub async fn serve(
    routes: Routes,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    settings: &ServeSettings,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), TlsError> {
    let addr = listener.local_addr().map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Conn>>(64);
    let acceptor = tokio::spawn(accept_loop(listener, tls.map(TlsAcceptor::from), tx));
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    let result = tonic::transport::Server::builder()
        .max_concurrent_streams(settings.max_concurrent_streams)
        .http2_keepalive_interval(Some(settings.keepalive_interval))
        .http2_keepalive_timeout(Some(settings.keepalive_timeout))
        .max_connection_age(settings.max_connection_age)
        .max_connection_age_grace(settings.max_connection_age_grace)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    acceptor.abort();
    result.map_err(|source| TlsError::Serve { addr, source })
}

/// Accepts connections and, for TLS, completes each handshake in its own task (bounded in
/// time and number), so a slow client never holds up the others.
async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    tx: tokio::sync::mpsc::Sender<io::Result<Conn>>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("control plane accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Some(acceptor) = tls.clone() else {
            drop(permit);
            let info = PeerInfo { remote: Some(remote), tls: false, verified_chain: None };
            if tx.send(Ok(Conn { io: Io::Plain(stream), info })).await.is_err() {
                return;
            }
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    let verified_chain =
                        stream.get_ref().1.peer_certificates().map(|chain| {
                            chain.iter().map(|c| c.clone().into_owned()).collect::<Vec<_>>().into()
                        });
                    let info = PeerInfo { remote: Some(remote), tls: true, verified_chain };
                    let _ = tx.send(Ok(Conn { io: Io::Tls(Box::new(stream)), info })).await;
                }
                Ok(Err(e)) => tracing::debug!(%remote, "control plane TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%remote, "control plane TLS handshake timed out"),
            }
        });
    }
}

/// One accepted connection, plaintext or TLS, with what the request handlers may know of it.
struct Conn {
    io: Io,
    info: PeerInfo,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
