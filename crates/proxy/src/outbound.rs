//! Outbound (15001): captured app connections, routed by original destination to HBONE,
//! plain TCP, or passthrough.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use tokio::net::TcpStream;

use crate::copy::{self, TcpSink, TcpSource};
use crate::inputs::Inputs;
use crate::listener::is_illegal_port;
use crate::metrics::{self, ConnectionInfo, ConnectionRecord, Flag, Reporter};
use crate::state::{Route, RouteKind, Workload};
use ambit_hbone::{PoolKey, TunnelError};

/// Serves one captured outbound connection.
pub async fn serve_connection(inputs: Arc<Inputs>, stream: TcpStream, peer: SocketAddr) {
    let peer = crate::socket::canonical(peer);
    let (orig, local_addr) = match crate::socket::original_dst(&stream) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(src.addr = %peer, error = %e, "no original destination");
            return;
        }
    };
    let mut info = ConnectionInfo {
        reporter: Reporter::source,
        src_addr: peer,
        src_workload: None,
        src_identity: None,
        dst_addr: orig,
        hbone_addr: None,
        dst_service: None,
        dst_workload: None,
        dst_identity: None,
        mtls: false,
    };
    if (crate::socket::is_loopback(orig.ip()) && is_illegal_port(orig.port())) || orig == local_addr {
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
    info.src_workload = Some(local.clone());
    let mut route = inputs.state.current().route_outbound(&local, &inputs.cfg.network, orig);
    // XDS_ON_DEMAND: an address the proxy does not know is asked for before it is routed as
    // unknown (bounded wait).
    if let (Ok(Route { kind: RouteKind::Passthrough { .. }, .. }), Some(xds)) = (&route, &inputs.xds)
        && xds.on_demand()
        && xds.demand_address(&inputs.cfg.network, orig.ip()).await
    {
        route = inputs.state.current().route_outbound(&local, &inputs.cfg.network, orig);
    }
    let route = match route {
        Ok(r) => r,
        Err(e) => return metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e),
    };
    info.dst_service = route.destination_service.clone();
    info.dst_workload = route.destination_workload.clone();
    match route.kind {
        RouteKind::Hbone { target, authority, expected } => {
            let src_identity = inputs.identity_of(&local);
            info.mtls = true;
            info.src_identity = Some(src_identity.clone());
            info.dst_addr = target;
            info.hbone_addr = Some(authority);
            info.dst_identity = info
                .dst_workload
                .as_deref()
                .map(|w| inputs.identity_of(w))
                .or_else(|| expected.first().cloned());
            let key = PoolKey { src_identity, dst_identities: expected, dst: target, src_ip: peer.ip() };
            let headers = request_headers(
                &local,
                peer,
                route.destination_service.as_deref().map(|s| s.hostname.as_str()),
            );
            // What the app already sent goes with the request head (one record, no round trip
            // before it); a failed stream drops it, as it drops the app's connection.
            let early = match crate::socket::ready_bytes(&stream) {
                Ok(b) => b,
                Err(e) => return metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e),
            };
            let tunnel = match inputs.pool.connect_early(&key, authority, &headers, &early).await {
                Ok(t) => t,
                Err(e) => return metrics::record_failure(&inputs.metrics, &info, flag_of(&e), &e),
            };
            let record = ConnectionRecord::open(&inputs.metrics, info);
            record.counters.add_sent(early.len());
            drop(early);
            // The app is the downstream here: its bytes count as sent.
            let copy = copy::hbone_relay(tunnel.stream, stream, record.counters.clone(), false);
            inputs.relay(record, copy, None).await;
        }
        RouteKind::Tcp { target } | RouteKind::Passthrough { target } => {
            info.dst_addr = target;
            let (up, _up_fd) = match inputs.dial(target, None).await {
                Ok(s) => s,
                Err(e) => return metrics::record_failure(&inputs.metrics, &info, Flag::Connect, &e),
            };
            let record = ConnectionRecord::open(&inputs.metrics, info);
            let counters = record.counters.clone();
            let (dr, dw) = stream.into_split();
            let (ur, uw) = up.into_split();
            let copy = copy::bidirectional(
                (TcpSource::new(dr), TcpSink(dw)),
                (TcpSource::new(ur), TcpSink(uw)),
                &counters,
            );
            inputs.relay(record, copy, None).await;
        }
    }
}

fn flag_of(e: &TunnelError) -> Flag {
    match e {
        TunnelError::ConnectTimeout(_) => Flag::NetworkPolicy,
        TunnelError::Tls(_) => Flag::TlsFailure,
        TunnelError::H2Handshake(_) => Flag::H2HandshakeFailure,
        TunnelError::Identity(_) => Flag::IdentityError,
        TunnelError::Status(s) if *s == http::StatusCode::UNAUTHORIZED => Flag::Deny,
        _ => Flag::Connect,
    }
}

/// Request headers of a CONNECT: baggage, forwarded, traceparent.
fn request_headers(src: &Arc<Workload>, client: SocketAddr, service_host: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(v) = baggage_header(src) {
        h.insert("baggage", v);
    }
    let mut fwd = format!("for=\"{client}\"");
    if let Some(host) = service_host {
        fwd.push_str(";host=");
        fwd.push_str(host);
    }
    if let Ok(v) = HeaderValue::from_str(&fwd) {
        h.insert("forwarded", v);
    }
    let trace: u128 = rand::random();
    let span: u64 = rand::random();
    if let Ok(v) = HeaderValue::from_str(&format!("00-{trace:032x}-{span:016x}-00")) {
        h.insert("traceparent", v);
    }
    h
}

/// Workloads whose `baggage` header a thread keeps ([`baggage_header`]).
const BAGGAGE_CACHED: usize = 16;

/// The `baggage` header of a workload's CONNECTs and their answers ([`baggage`] as a header
/// value; `None` if it is not a valid one). Both proxies of every connection send it, and its
/// text depends on the workload alone, so each thread keeps it for the last
/// [`BAGGAGE_CACHED`] workloads it served instead of formatting it per connection (nine small
/// allocations and a join). An entry holds its workload, so its address cannot be taken by
/// another workload while it is cached; a changed workload is a new object and misses.
pub fn baggage_header(w: &Arc<Workload>) -> Option<HeaderValue> {
    type Entries = (usize, Vec<(Arc<Workload>, Option<HeaderValue>)>);
    thread_local! {
        static CACHE: std::cell::RefCell<Entries> = const { std::cell::RefCell::new((0, Vec::new())) };
    }
    CACHE.with_borrow_mut(|(next, entries)| {
        if let Some((_, v)) = entries.iter().find(|(k, _)| Arc::ptr_eq(k, w)) {
            return v.clone();
        }
        let v = HeaderValue::from_str(&baggage(w)).ok();
        if entries.len() < BAGGAGE_CACHED {
            entries.push((w.clone(), v.clone()));
        } else {
            entries[*next] = (w.clone(), v.clone());
            *next = (*next + 1) % BAGGAGE_CACHED;
        }
        v
    })
}

/// The W3C baggage describing a workload (empty items omitted).
pub fn baggage(w: &Workload) -> String {
    let mut parts: Vec<String> = Vec::with_capacity(7);
    let mut push = |k: &str, v: &str| {
        if !v.is_empty() {
            parts.push(format!("{k}={v}"));
        }
    };
    push("k8s.cluster.name", &w.cluster_id);
    push("k8s.namespace.name", &w.namespace);
    if !w.workload_name.is_empty() {
        let kind = if w.workload_type.is_empty() {
            "deployment".to_owned()
        } else {
            w.workload_type.to_ascii_lowercase()
        };
        push(&format!("k8s.{kind}.name"), &w.workload_name);
    }
    push("service.name", &w.canonical_name);
    push("service.version", &w.canonical_revision);
    push("cloud.region", &w.locality.region);
    push("cloud.availability_zone", &w.locality.zone);
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(name: &str, namespace: &str, service: &str) -> Arc<Workload> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "name": name, "namespace": namespace, "workloadName": name,
                "canonicalName": service, "clusterId": "Kubernetes", "workloadIps": [],
            }))
            .expect("workload"),
        )
    }

    #[test]
    fn the_cached_baggage_is_each_workloads_own_across_evictions() {
        let first = workload("a", "ns-a", "svc-a");
        let want =
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=ns-a,k8s.deployment.name=a,service.name=svc-a";
        assert_eq!(baggage(&first), want);
        assert_eq!(baggage_header(&first).expect("valid").to_str().expect("ascii"), want);
        // A workload that changed is a new object with its own text, while the old one is cached.
        let changed = workload("a", "ns-b", "svc-a");
        assert_eq!(
            baggage_header(&changed).expect("valid").to_str().expect("ascii"),
            want.replace("ns-a", "ns-b")
        );
        // More workloads than the cache holds, twice round: every answer is its own workload's.
        let many: Vec<_> =
            (0..BAGGAGE_CACHED * 2 + 3).map(|i| workload(&format!("w{i}"), "ns", "s")).collect();
        for _ in 0..2 {
            for w in &many {
                assert_eq!(baggage_header(w).expect("valid").to_str().expect("ascii"), baggage(w));
            }
        }
        assert_eq!(baggage_header(&first).expect("valid").to_str().expect("ascii"), want);
    }

    #[test]
    fn a_baggage_that_is_no_header_value_is_left_out() {
        let w = workload("a", "ns", "bad\nname");
        assert_eq!(baggage_header(&w), None);
        assert!(!request_headers(&w, "10.0.0.1:5000".parse().expect("addr"), None).contains_key("baggage"));
    }
}
