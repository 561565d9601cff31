//! A request's telemetry apart from its path through the waypoint: how it ended ([`Outcome`]),
//! its Istio labels, its head's size, and the series each CONNECT stream keeps for the label sets
//! of its requests, so that a request neither builds nor hashes its labels.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use http::Request;

use crate::body::header_bytes;
use crate::config::{Destination, Endpoint};
use crate::metrics::{Label, RequestLabels, RequestSeries};
use crate::proxy::Downstream;
use crate::server::{Shared, Source};

/// The series a stream keeps, by what decides their labels.
pub(crate) type Kept = Mutex<Vec<(SeriesKey, Arc<RequestSeries>)>>;

/// How many label sets one stream keeps the series of (more are looked up again).
const SERIES_KEPT: usize = 16;

/// What decides a request's labels beside its stream: the destination bound at the stream's
/// address (held, so that it is compared by identity) and how the request ended.
#[derive(Debug)]
pub(crate) struct SeriesKey {
    destination: Option<Arc<Destination>>,
    outcome: Outcome,
}

/// How one request ended, for its labels.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    /// The endpoint that answered (held, compared by identity).
    pub(crate) endpoint: Option<Arc<Endpoint>>,
    pub(crate) grpc: bool,
    pub(crate) status: http::StatusCode,
    pub(crate) flags: &'static str,
    /// `grpc-status` of a gRPC answer (its head's, else its trailers').
    pub(crate) grpc_status: Option<String>,
}

fn same<T>(a: Option<&Arc<T>>, b: Option<&Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

impl Outcome {
    fn same(&self, other: &Outcome) -> bool {
        same(self.endpoint.as_ref(), other.endpoint.as_ref())
            && self.grpc == other.grpc
            && self.status == other.status
            && self.flags == other.flags
            && self.grpc_status == other.grpc_status
    }
}

impl Downstream {
    pub(crate) fn new(source: Arc<Source>, addr: SocketAddr) -> Downstream {
        Downstream { source, addr, series: Mutex::default() }
    }

    /// The series of a request of this stream that ended as `outcome`.
    pub(crate) fn series(&self, shared: &Shared, outcome: &Outcome) -> Arc<RequestSeries> {
        let destination = shared.config.load().bound_destination(self.addr).cloned();
        let mut kept = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        let found = kept
            .iter()
            .find(|(k, _)| same(k.destination.as_ref(), destination.as_ref()) && k.outcome.same(outcome));
        if let Some((_, series)) = found {
            return series.clone();
        }
        let labels = request_labels(self, destination.as_deref(), outcome);
        let series = Arc::new(shared.counters.series(&labels));
        if kept.len() >= SERIES_KEPT {
            kept.clear();
        }
        kept.push((SeriesKey { destination, outcome: outcome.clone() }, series.clone()));
        series
    }
}

/// A request's head in bytes as Envoy's header map sizes it: its headers and the pseudo-headers
/// `:method`, `:path`, `:authority` (or `Host`, already a header) and `:scheme`.
pub(crate) fn request_head_bytes<B>(req: &Request<B>) -> u64 {
    let uri = req.uri();
    let pseudo = ":method".len()
        + req.method().as_str().len()
        + ":path".len()
        + uri.path_and_query().map_or(1, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| ":authority".len() + a.as_str().len())
        + uri.scheme_str().map_or(0, |s| ":scheme".len() + s.len());
    header_bytes(req.headers()) + pseudo as u64
}

/// `istio_requests_total`'s labels of one answered request.
fn request_labels(
    downstream: &Downstream,
    service: Option<&Destination>,
    outcome: &Outcome,
) -> RequestLabels {
    let principal = downstream.source.principal.as_deref().unwrap_or_default();
    let source_namespace =
        principal.split_once("/ns/").map(|(_, rest)| rest.split('/').next().unwrap_or(rest));
    let endpoint = outcome.endpoint.as_deref();
    let text = |s: Option<&str>| Label(s.unwrap_or_default().to_owned());
    RequestLabels {
        reporter: "waypoint".into(),
        source_workload_namespace: text(source_namespace),
        source_principal: principal.into(),
        destination_service: text(service.map(|d| d.hostname.as_str())),
        destination_service_name: text(service.map(|d| d.name.as_str())),
        destination_service_namespace: text(service.map(|d| d.namespace.as_str())),
        destination_workload: text(endpoint.map(|e| e.workload_name.as_str())),
        destination_workload_namespace: text(endpoint.map(|e| e.namespace.as_str())),
        destination_principal: Label(
            endpoint.and_then(|e| e.identity.as_ref()).map(|i| i.to_string()).unwrap_or_default(),
        ),
        request_protocol: if outcome.grpc { "grpc".into() } else { "http".into() },
        response_code: Label(outcome.status.as_u16().to_string()),
        grpc_response_status: text(outcome.grpc_status.as_deref()),
        response_flags: outcome.flags.into(),
        connection_security_policy: "mutual_tls".into(),
    }
}
