//! The connection to the control plane: TCP (keepalive, no delay, an optional `SO_MARK`), then
//! TLS verified against the configured roots (with the alternate name), optionally presenting a
//! workload certificate.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::client::ResolvesClientCert;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError as TlsCertError, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;
use tonic::transport::Uri;

use super::{ControlError, Service, TCP_KEEPALIVE};

/// Standard webpki verification; a failed name check is retried against the alternate name.
#[derive(Debug)]
pub(super) struct AltNameVerifier {
    pub(super) inner: Arc<WebPkiServerVerifier>,
    pub(super) alt: Option<ServerName<'static>>,
}

impl ServerCertVerifier for AltNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let first = self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        match (first, &self.alt) {
            (
                Err(rustls::Error::InvalidCertificate(
                    TlsCertError::NotValidForName | TlsCertError::NotValidForNameContext { .. },
                )),
                Some(alt),
            ) => self.inner.verify_server_cert(end_entity, intermediates, alt, ocsp_response, now),
            (result, _) => result,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The one certificate a connection presents when the server asks for one.
#[derive(Debug)]
pub(super) struct PresentedCert(pub(super) Arc<CertifiedKey>);

impl ResolvesClientCert for PresentedCert {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// tonic connector: TCP (keepalive, no delay) then TLS to the configured server name.
#[derive(Clone)]
pub(super) struct Connector {
    pub(super) target: Arc<ConnectTarget>,
}

pub(super) struct ConnectTarget {
    pub(super) service: Service,
    pub(super) address: String,
    pub(super) mark: Option<u32>,
    pub(super) tls: Option<TlsConnect>,
}

/// The TLS half of a [`ConnectTarget`].
pub(super) struct TlsConnect {
    pub(super) server_name: ServerName<'static>,
    pub(super) alt_set: bool,
    pub(super) connector: tokio_rustls::TlsConnector,
}

impl tonic::codegen::Service<Uri> for Connector {
    type Response = TokioIo<Either<TlsStream<TcpStream>, TcpStream>>;
    type Error = ControlError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ControlError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ControlError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let target = self.target.clone();
        Box::pin(async move {
            let connect_err = |source| ControlError::Connect {
                service: target.service,
                address: target.address.clone(),
                source,
            };
            let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(443);
            let tcp = connect_marked(host, port, target.mark).await.map_err(connect_err)?;
            let keepalive = socket2::TcpKeepalive::new()
                .with_time(TCP_KEEPALIVE.0)
                .with_interval(TCP_KEEPALIVE.1)
                .with_retries(TCP_KEEPALIVE.2);
            let sock = socket2::SockRef::from(&tcp);
            sock.set_tcp_keepalive(&keepalive).map_err(connect_err)?;
            sock.set_tcp_nodelay(true).map_err(connect_err)?;
            let Some(tls) = &target.tls else {
                return Ok(TokioIo::new(Either::Right(tcp)));
            };
            let tls = tls.connector.connect(tls.server_name.clone(), tcp).await.map_err(|source| {
                let hint = handshake_hint(target.service, &source, tls.alt_set);
                ControlError::Handshake {
                    service: target.service,
                    address: target.address.clone(),
                    source,
                    hint,
                }
            })?;
            Ok(TokioIo::new(Either::Left(tls)))
        })
    }
}

/// Connects to `host:port` (each resolved address in turn), with `SO_MARK` set before the
/// connect when `mark` is given.
async fn connect_marked(host: &str, port: u16, mark: Option<u32>) -> std::io::Result<TcpStream> {
    let Some(mark) = mark else { return TcpStream::connect((host, port)).await };
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket =
            if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket2::SockRef::from(&socket).set_mark(mark)?;
        match socket.connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, format!("{host} resolves to no address"))
    }))
}

/// What an operator may do about a failed handshake.
fn handshake_hint(service: Service, e: &std::io::Error, alt_set: bool) -> String {
    let tls = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match tls {
        Some(rustls::Error::InvalidCertificate(
            TlsCertError::NotValidForName | TlsCertError::NotValidForNameContext { .. },
        )) if !alt_set => {
            format!("; set {} if the {service}'s certificate is issued for another name", service.alt_var())
        }
        Some(rustls::Error::InvalidCertificate(
            TlsCertError::NotValidForName | TlsCertError::NotValidForNameContext { .. },
        )) => format!("; neither the address's host nor {} is in the certificate", service.alt_var()),
        Some(rustls::Error::InvalidCertificate(TlsCertError::UnknownIssuer | TlsCertError::BadSignature)) => {
            format!("; is {} the root that signed the {service}'s certificate?", service.root_var())
        }
        _ => String::new(),
    }
}
