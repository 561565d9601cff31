//! Inbound HBONE (15008): TLS with the local workload's certificate, CONNECT validation,
//! authorization, then a connection to the app with the client's source IP preserved.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;

use ambit_identity::Identity;
use http::{HeaderMap, StatusCode};
use tokio::net::TcpStream;

use crate::authz::{self, Connection, Decision};
use crate::inputs::Inputs;
use crate::limits::Phase;
use crate::listener::is_illegal_port;
use crate::metrics::{self, ConnectionInfo, ConnectionRecord, Flag, Reporter};
use crate::state::{Authority, InboundError};
use ambit_hbone::{ConnectRequest, Ended, H2Settings, ServeError, ServerConfig};

/// Serves one accepted TCP connection on 15008.
///
/// Every phase has a deadline: the TLS handshake (`AMBIT_HBONE_HANDSHAKE_TIMEOUT`, counted from
/// the accept), the HTTP/2 preface, the first CONNECT and idleness (see [`ambit_hbone::serve`]). The
/// source address must be under its connection cap before anything else happens.
pub async fn serve_connection(inputs: Arc<Inputs>, stream: TcpStream, peer: SocketAddr) {
    let peer = crate::socket::canonical(peer);
    let limits = &inputs.limits;
    let peer_conn = match limits.peers.connect(peer.ip()) {
        Ok(p) => p,
        Err(refusal) => return limits.metrics.refused(&refusal, None),
    };
    let dst = match stream.local_addr() {
        Ok(a) => crate::socket::canonical(a),
        Err(_) => return,
    };
    let fail = |e: &dyn std::fmt::Display| {
        tracing::warn!(target: "access",
            { src.addr = %peer, dst.addr = %dst, direction = "inbound", error = %e }, "connection failed");
    };
    let cfg = &inputs.cfg;
    let handshake = async {
        let local = inputs.local_workload().await.map_err(|e| e.to_string())?;
        let cert = inputs
            .certs
            .fetch(&inputs.identity_of(&local))
            .await
            .map_err(|e| format!("identity error: {e}"))?;
        ambit_hbone::accept(&stream, cert.server_config()).await.map_err(|e| format!("tls error: {e}"))
    };
    let tls = match tokio::time::timeout(cfg.hbone_handshake_timeout, handshake).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return fail(&e),
        Err(_) => {
            limits.metrics.timed_out(Phase::tls_handshake);
            return fail(&format!(
                "tls error: handshake not done within {:?} (AMBIT_HBONE_HANDSHAKE_TIMEOUT)",
                cfg.hbone_handshake_timeout
            ));
        }
    };
    let peer_identity = ambit_identity::peer_identity(&tls.peer_certificates);
    let server_cfg = ServerConfig {
        settings: H2Settings {
            window_size: cfg.window_size,
            connection_window_size: cfg.connection_window_size,
            frame_size: cfg.frame_size,
            max_streams: cfg.pool_max_streams_per_conn,
        },
        preface_timeout: cfg.hbone_preface_timeout,
        first_stream_timeout: cfg.hbone_first_stream_timeout,
        idle_timeout: cfg.hbone_idle_timeout,
    };
    let id = peer_identity.clone();
    let ctx = Arc::new(StreamCtx { inputs: inputs.clone(), peer, dst, peer_identity });
    let r = ambit_hbone::serve(stream, tls, server_cfg, peer_conn, &inputs.drain, move |req| {
        let ctx = ctx.clone();
        async move { ctx.handle(req).await }
    })
    .await;
    let id = id.map(|i| i.to_string()).unwrap_or_default();
    match r {
        Ok(Ended::Idle) => {
            limits.metrics.timed_out(Phase::idle);
            tracing::debug!(src.addr = %peer, src.identity = %id, "idle HBONE connection closed (AMBIT_HBONE_IDLE_TIMEOUT)");
        }
        Ok(_) => {}
        Err(e) => {
            match &e {
                ServeError::PrefaceTimeout(_) => limits.metrics.timed_out(Phase::preface),
                ServeError::FirstStreamTimeout(_) => limits.metrics.timed_out(Phase::first_stream),
                ServeError::Handshake(_) | ServeError::H2(_) => {}
            }
            tracing::debug!(src.addr = %peer, src.identity = %id, error = %e, "HBONE connection ended with an error");
        }
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
        let method = req.head.method.as_deref().unwrap_or_default();
        if method != "CONNECT" {
            let e = format!("expected method CONNECT, got {method:?}");
            metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e);
            return req.reject(StatusCode::BAD_REQUEST);
        }
        let authority = match req.head.authority.as_deref().map(Authority::from_str) {
            Some(Ok(a)) => a,
            _ => {
                let e = format!(
                    "no valid authority pseudo header: {}",
                    req.head.authority.as_deref().unwrap_or("(none)")
                );
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
            metrics::record_denial(&inputs.metrics, &info, &reason, policies.iter().map(|p| p.as_ref()));
            return req.reject(StatusCode::UNAUTHORIZED);
        }
        let spoof = (inputs.transparent && self.peer.ip() != upstream.ip()).then_some(self.peer.ip());
        // A stream the peer reset is never dialed, and a reset during the dial aborts it (the
        // reset is polled first, so one already received wins over a dial that is ready).
        let dialed = tokio::select! {
            biased;
            _ = std::future::poll_fn(|cx| req.stream.poll_gone(cx)) => None,
            r = inputs.dial(upstream, spoof) => Some(r),
        };
        let (app, _app_fd) = match dialed {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e);
                return req.reject(StatusCode::SERVICE_UNAVAILABLE);
            }
            None => {
                inputs.limits.metrics.reset_before_dial();
                let e = "the peer reset the stream before the connection to the app was established";
                return metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e);
            }
        };
        let registration = inputs.connections.register(conn, local.clone(), self.peer, upstream);
        let mut headers = HeaderMap::new();
        if let Some(v) = crate::outbound::baggage_header(&local) {
            headers.insert("baggage", v);
        }
        if let Err(e) = req.stream.respond(StatusCode::OK.as_u16(), &headers, false) {
            metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &format!("http2 error: {e}"));
            return;
        }
        let record = ConnectionRecord::open(&inputs.metrics, info);
        registration.count(&record.counters);
        // Bytes from the stream go to the app, the upstream here.
        let copy = crate::copy::hbone_relay(req.stream, app, record.counters.clone(), true);
        inputs.relay(record, copy, Some(&registration.closed)).await;
    }
}
