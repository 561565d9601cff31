//! Inbound HBONE (15008): TLS with the local workload's certificate, CONNECT validation,
//! authorization, then a connection to the app with the client's source IP preserved.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ambit_identity::Identity;
use http::{HeaderValue, StatusCode};
use tokio::net::TcpStream;

use crate::authz::{self, Connection, Decision};
use crate::copy::{self, H2Sink, H2Source, TcpSink, TcpSource};
use crate::hbone::H2Settings;
use crate::hbone::server::{self, ConnectRequest};
use crate::inputs::Inputs;
use crate::listener::is_illegal_port;
use crate::metrics::{self, ConnectionInfo, ConnectionRecord, Flag, Reporter};
use crate::state::{Authority, InboundError};

/// Serves one accepted TCP connection on 15008.
pub async fn serve_connection(inputs: Arc<Inputs>, stream: TcpStream, peer: SocketAddr) {
    let peer = crate::socket::canonical(peer);
    let dst = match stream.local_addr() {
        Ok(a) => crate::socket::canonical(a),
        Err(_) => return,
    };
    let _ = stream.set_nodelay(true);
    let fail = |e: &dyn std::fmt::Display| {
        tracing::warn!(target: "access",
            { src.addr = %peer, dst.addr = %dst, direction = "inbound", error = %e }, "connection failed");
    };
    let local = match inputs.local_workload().await {
        Ok(w) => w,
        Err(e) => return fail(&e),
    };
    let cert = match inputs.certs.fetch(&inputs.identity_of(&local)).await {
        Ok(c) => c,
        Err(e) => return fail(&format!("identity error: {e}")),
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config());
    let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return fail(&format!("tls error: {e}")),
        Err(_) => return fail(&"tls error: handshake timed out"),
    };
    let peer_identity = tls.get_ref().1.peer_certificates().and_then(ambit_identity::peer_identity);
    let settings = H2Settings {
        window_size: inputs.cfg.window_size,
        connection_window_size: inputs.cfg.connection_window_size,
        frame_size: inputs.cfg.frame_size,
        max_streams: inputs.cfg.pool_max_streams_per_conn,
    };
    let drain = inputs.drain.clone();
    let ctx = Arc::new(StreamCtx { inputs: inputs.clone(), peer, dst, peer_identity });
    let r = server::serve(tls, settings, drain, move |req| {
        let ctx = ctx.clone();
        async move { ctx.handle(req).await }
    })
    .await;
    if let Err(e) = r {
        tracing::debug!(src.addr = %peer, error = %e, "HBONE connection ended with an error");
    }
}

struct StreamCtx {
    inputs: Arc<Inputs>,
    peer: SocketAddr,
    dst: SocketAddr,
    peer_identity: Option<Identity>,
}

impl StreamCtx {
    async fn handle(&self, req: ConnectRequest) {
        let inputs = &self.inputs;
        let state = inputs.state.current();
        let mut info = ConnectionInfo {
            reporter: Reporter::destination,
            src_addr: self.peer,
            src_workload: state.workload_by_addr(&inputs.cfg.network, self.peer.ip()),
            src_identity: self.peer_identity.clone(),
            dst_addr: self.dst,
            hbone_addr: None,
            dst_service: None,
            dst_workload: None,
            dst_identity: None,
            mtls: true,
        };
        if req.request.method() != http::Method::CONNECT {
            let e = format!("expected method CONNECT, got {}", req.request.method());
            metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e);
            return req.reject(StatusCode::BAD_REQUEST);
        }
        let authority = match req.request.uri().authority().map(|a| Authority::from_str(a.as_str())) {
            Some(Ok(a)) => a,
            _ => {
                let e = format!("no valid authority pseudo header: {}", req.request.uri());
                metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e);
                return req.reject(StatusCode::BAD_REQUEST);
            }
        };
        let local = match inputs.local_workload().await {
            Ok(w) => w,
            Err(e) => {
                metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e);
                return req.reject(StatusCode::SERVICE_UNAVAILABLE);
            }
        };
        info.dst_workload = Some(local.clone());
        info.dst_identity = Some(inputs.identity_of(&local));
        let upstream = match state.inbound_upstream(&local, self.dst.ip(), &authority) {
            Ok(u) => u,
            Err(e) => {
                let status = match e {
                    InboundError::IpMismatch { .. } => StatusCode::BAD_REQUEST,
                    _ => StatusCode::SERVICE_UNAVAILABLE,
                };
                metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e);
                return req.reject(status);
            }
        };
        if let Authority::Addr(a) = authority {
            info.hbone_addr = Some(a);
        }
        info.dst_addr = upstream;
        info.dst_service = state.guess_service(&local, upstream.port());
        if is_illegal_port(upstream.port()) {
            metrics::record_failure(
                &inputs.metrics,
                &info,
                Flag::Connect,
                &"attempted recursive call to ourselves",
            );
            return req.reject(StatusCode::BAD_REQUEST);
        }
        let conn = Connection {
            src_ip: self.peer.ip(),
            src_identity: self.peer_identity.clone(),
            dst_ip: upstream.ip(),
            dst_port: upstream.port(),
        };
        let policies = state.policies_for(&local);
        if let Decision::Deny(reason) = authz::evaluate(policies.iter().map(|p| p.as_ref()), &conn) {
            let e = format!("connection closed due to policy rejection: {reason}");
            metrics::record_failure(&inputs.metrics, &info, Flag::Deny, &e);
            return req.reject(StatusCode::UNAUTHORIZED);
        }
        let spoof = (inputs.transparent && self.peer.ip() != upstream.ip()).then_some(self.peer.ip());
        let app = match inputs.dial(upstream, spoof).await {
            Ok(s) => s,
            Err(e) => {
                metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e);
                return req.reject(StatusCode::SERVICE_UNAVAILABLE);
            }
        };
        let registration = inputs.connections.register(conn, local.clone());
        let ConnectRequest { request, mut respond } = req;
        let mut resp = http::Response::builder().status(StatusCode::OK);
        if let Ok(v) = HeaderValue::from_str(&crate::outbound::baggage(&local)) {
            resp = resp.header("baggage", v);
        }
        let send = match respond.send_response(resp.body(()).unwrap_or_default(), false) {
            Ok(s) => s,
            Err(e) => {
                metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &format!("http2 error: {e}"));
                return;
            }
        };
        let record = ConnectionRecord::open(&inputs.metrics, info);
        let counters = record.counters.clone();
        let (ar, aw) = app.into_split();
        let recv = request.into_body();
        let copy =
            copy::bidirectional((H2Source(recv), H2Sink(send)), (TcpSource::new(ar), TcpSink(aw)), &counters);
        inputs.relay(record, copy, Some(&registration.closed)).await;
    }
}
