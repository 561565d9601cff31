//! Inbound plaintext (15006): captured connections to the pod that did not come over HBONE;
//! authorized without a peer identity (so policies requiring mTLS refuse them).
//!
//! A connection to the pod's IPv6 link-local address is refused: the proxy cannot hand it to the
//! app, because the in-pod capture routes the app's replies to proxy-made connections through
//! the loopback (fwmark 0x111, table 100), and a socket dialed on a link-local address is bound
//! to its interface, so the replies never match it (the dial would time out; without the scope
//! it fails with EINVAL, as in ztunnel). Mesh traffic uses the pods' routable addresses.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::authz::{self, Connection, Decision};
use crate::copy::{self, TcpSink, TcpSource};
use crate::inputs::Inputs;
use crate::listener::is_illegal_port;
use crate::metrics::{self, ConnectionInfo, ConnectionRecord, Flag, Reporter};

/// Why a captured inbound connection is refused before it is authorized.
#[derive(Debug, thiserror::Error)]
pub enum PassthroughError {
    /// The destination is the pod's IPv6 link-local address.
    #[error(
        "link-local destination {0}: the mesh serves pods on their routable addresses only (a \
         link-local address names a link, not a workload); connect to the pod's IP instead"
    )]
    LinkLocal(SocketAddr),
}

/// Serves one captured plaintext inbound connection.
pub async fn serve_connection(inputs: Arc<Inputs>, stream: TcpStream, peer: SocketAddr) {
    let peer = crate::socket::canonical(peer);
    let orig = match crate::socket::original_dst(&stream) {
        Ok((a, _)) => a,
        Err(_) => return,
    };
    let state = inputs.state.current();
    let mut info = ConnectionInfo {
        reporter: Reporter::destination,
        src_addr: peer,
        src_workload: state.workload_by_addr(&inputs.cfg.network, peer.ip()),
        src_identity: None,
        dst_addr: orig,
        hbone_addr: None,
        dst_service: None,
        dst_workload: None,
        dst_identity: None,
        mtls: false,
    };
    if let IpAddr::V6(ip) = orig.ip()
        && ip.is_unicast_link_local()
    {
        return metrics::record_failure(
            &inputs.metrics,
            &info,
            Flag::Connect,
            &PassthroughError::LinkLocal(orig),
        );
    }
    let local_addr = stream.local_addr().ok().map(crate::socket::canonical);
    if is_illegal_port(orig.port()) || Some(orig) == local_addr {
        return metrics::record_failure(
            &inputs.metrics,
            &info,
            Flag::Connect,
            &"attempted recursive call to ourselves",
        );
    }
    // The downstream socket inherited nodelay and keepalive from the listener.
    let local = match inputs.local_workload().await {
        Ok(w) => w,
        Err(e) => return metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e),
    };
    info.dst_workload = Some(local.clone());
    info.dst_service = state.guess_service(&local, orig.port());
    let conn = Connection { src_ip: peer.ip(), src_identity: None, dst_ip: orig.ip(), dst_port: orig.port() };
    let policies = state.policies_for(&local);
    if let Decision::Deny(reason) = authz::evaluate(policies.iter().map(|p| p.as_ref()), &conn) {
        return metrics::record_denial(&inputs.metrics, &info, &reason, policies.iter().map(|p| p.as_ref()));
    }
    drop(state);
    let spoof = (inputs.transparent && peer.ip() != orig.ip()).then_some(peer.ip());
    let (app, _app_fd) = match inputs.dial(orig, spoof).await {
        Ok(s) => s,
        Err(e) => return metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e),
    };
    let registration = inputs.connections.register(conn, local, peer, orig);
    let record = ConnectionRecord::open(&inputs.metrics, info);
    registration.count(&record.counters);
    let counters = record.counters.clone();
    let (dr, dw) = stream.into_split();
    let (ur, uw) = app.into_split();
    let copy =
        copy::bidirectional((TcpSource::new(dr), TcpSink(dw)), (TcpSource::new(ur), TcpSink(uw)), &counters);
    inputs.relay(record, copy, Some(&registration.closed)).await;
}
