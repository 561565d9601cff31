//! Request telemetry: plain counters (by status, denials by policy, retries, timeouts) and
//! Istio's `istio_requests_total`, `istio_request_duration_milliseconds`, `istio_request_bytes`
//! and `istio_response_bytes` with `reporter="waypoint"`, recorded as each answer ends (a gRPC
//! answer with the status of its trailers), off the locks of the configuration. [`Counters::register`] puts the family in a
//! Prometheus registry (the admin server's, once the waypoint has one).

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The label of a denial that no DENY policy made (ALLOW policies exist and none matched).
pub const NO_ALLOW_MATCHED: &str = "(no ALLOW policy matched)";

/// The labels of `istio_requests_total` the waypoint knows, in Istio's names; empty values render
/// `unknown`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Always `waypoint`.
    pub reporter: Label,
    /// The source identity's namespace.
    pub source_workload_namespace: Label,
    /// The source identity (`spiffe://…`).
    pub source_principal: Label,
    /// The destination Service's hostname.
    pub destination_service: Label,
    /// The destination Service's name.
    pub destination_service_name: Label,
    /// The destination Service's namespace.
    pub destination_service_namespace: Label,
    /// The endpoint's workload.
    pub destination_workload: Label,
    /// The endpoint's namespace.
    pub destination_workload_namespace: Label,
    /// The endpoint's identity.
    pub destination_principal: Label,
    /// `http` or `grpc`.
    pub request_protocol: Label,
    /// The HTTP status sent (a gRPC local answer counts its HTTP status).
    pub response_code: Label,
    /// `grpc-status` of a gRPC answer's head, when there is one there.
    pub grpc_response_status: Label,
    /// Envoy's response flags: `-`, `RBAC` (denied), `NR` (no route), `UH` (no healthy
    /// upstream), `UF` (upstream connect failure or reset), `UT` (upstream timeout).
    pub response_flags: Label,
    /// Always `mutual_tls` (HBONE).
    pub connection_security_policy: Label,
}

/// A label value that renders `unknown` when empty.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Label(pub String);

impl EncodeLabelValue for Label {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        if self.0.is_empty() { encoder.write_str("unknown") } else { encoder.write_str(&self.0) }
    }
}

impl From<&str> for Label {
    fn from(s: &str) -> Label {
        Label(s.to_owned())
    }
}

/// Envoy's default histogram buckets, which Istio's request duration and sizes use.
const ENVOY_BUCKETS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0,
    300000.0, 600000.0, 1800000.0, 3600000.0,
];

fn histogram() -> Histogram {
    Histogram::new(ENVOY_BUCKETS)
}

/// The four series of one label set.
#[derive(Debug)]
pub(crate) struct RequestSeries {
    requests: Counter,
    duration: Histogram,
    request_bytes: Histogram,
    response_bytes: Histogram,
}

impl RequestSeries {
    /// One answered request: its duration and its request's and response's sizes in bytes.
    pub(crate) fn record(&self, took: std::time::Duration, request: u64, response: u64) {
        self.requests.inc();
        self.duration.observe(took.as_secs_f64() * 1e3);
        self.request_bytes.observe(request as f64);
        self.response_bytes.observe(response as f64);
    }
}

/// The waypoint's counters.
#[derive(Debug)]
pub struct Counters {
    requests: Family<RequestLabels, Counter>,
    durations: Family<RequestLabels, Histogram, fn() -> Histogram>,
    request_bytes: Family<RequestLabels, Histogram, fn() -> Histogram>,
    response_bytes: Family<RequestLabels, Histogram, fn() -> Histogram>,
    responses: Mutex<BTreeMap<u16, u64>>,
    denials: Family<PolicyLabel, Counter>,
    connection_denials: Family<PolicyLabel, Counter>,
    retries: Counter,
    timeouts: Counter,
    tcp_connections: Counter,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            requests: Family::default(),
            durations: Family::new_with_constructor(histogram),
            request_bytes: Family::new_with_constructor(histogram),
            response_bytes: Family::new_with_constructor(histogram),
            responses: Mutex::default(),
            denials: Family::default(),
            connection_denials: Family::default(),
            retries: Counter::default(),
            timeouts: Counter::default(),
            tcp_connections: Counter::default(),
        }
    }
}

/// The policy that denied (`namespace/name`, or [`NO_ALLOW_MATCHED`]).
type PolicyLabel = [(&'static str, String); 1];

fn policy_label(policy: &str) -> PolicyLabel {
    [("policy", policy.to_owned())]
}

impl Counters {
    /// Registers `istio_requests_total` and the waypoint's own counters in `registry` (the
    /// families are shared: counting goes on in this struct): `ambit_waypoint_denials_total`
    /// and `ambit_waypoint_connection_denials_total` by policy (Envoy's RBAC `denied` stats, named
    /// after what decided), `ambit_waypoint_retries_total` (Envoy's `upstream_rq_retry`),
    /// `ambit_waypoint_timeouts_total` (`upstream_rq_timeout`) and
    /// `ambit_waypoint_tcp_connections_total`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "istio_requests",
            "Requests the waypoint answered, by source, destination and response",
            self.requests.clone(),
        );
        registry.register(
            "istio_request_duration_milliseconds",
            "Time from a request's head to its answer's end",
            self.durations.clone(),
        );
        registry.register(
            "istio_request_bytes",
            "Request sizes: head (headers and pseudo-headers) and body, trailers included",
            self.request_bytes.clone(),
        );
        registry.register(
            "istio_response_bytes",
            "Response sizes: head (headers and :status) and body, trailers included",
            self.response_bytes.clone(),
        );
        let ours = registry.sub_registry_with_prefix("ambit_waypoint");
        ours.register("denials", "HTTP requests denied (403), by the deciding policy", self.denials.clone());
        ours.register(
            "connection_denials",
            "TCP connections denied, by the deciding policy",
            self.connection_denials.clone(),
        );
        ours.register("retries", "Upstream attempts made after a request's first", self.retries.clone());
        ours.register("timeouts", "Requests answered 504 because a timeout ran out", self.timeouts.clone());
        ours.register("tcp_connections", "TCP connections relayed", self.tcp_connections.clone());
    }

    /// The series of one label set, shared with the families (what is recorded through them is
    /// what the registry shows); a stream keeps them for its requests' label sets, so a request
    /// neither builds nor hashes its labels.
    pub(crate) fn series(&self, labels: &RequestLabels) -> RequestSeries {
        RequestSeries {
            requests: self.requests.get_or_create(labels).clone(),
            duration: self.durations.get_or_create(labels).clone(),
            request_bytes: self.request_bytes.get_or_create(labels).clone(),
            response_bytes: self.response_bytes.get_or_create(labels).clone(),
        }
    }

    /// `istio_requests_total` for one label set.
    pub fn requests_total(&self, labels: &RequestLabels) -> u64 {
        self.requests.get(labels).map(|c| c.get()).unwrap_or(0)
    }

    pub(crate) fn response(&self, status: http::StatusCode) {
        *self.responses.lock().unwrap_or_else(|p| p.into_inner()).entry(status.as_u16()).or_default() += 1;
    }

    pub(crate) fn denial(&self, policy: Option<&str>) {
        self.denials.get_or_create(&policy_label(policy.unwrap_or(NO_ALLOW_MATCHED))).inc();
    }

    pub(crate) fn connection_denial(&self, policy: Option<&str>) {
        self.connection_denials.get_or_create(&policy_label(policy.unwrap_or(NO_ALLOW_MATCHED))).inc();
    }

    pub(crate) fn retry(&self) {
        self.retries.inc();
    }

    pub(crate) fn timeout(&self) {
        self.timeouts.inc();
    }

    pub(crate) fn tcp_connection(&self) {
        self.tcp_connections.inc();
    }

    /// Responses sent with `status` (local answers included: 403, 404, 503, 504…).
    pub fn responses(&self, status: u16) -> u64 {
        self.responses.lock().unwrap_or_else(|p| p.into_inner()).get(&status).copied().unwrap_or(0)
    }

    /// Every response status and its count.
    pub fn responses_by_status(&self) -> BTreeMap<u16, u64> {
        self.responses.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// HTTP requests denied by `policy` (`namespace/name`, or [`NO_ALLOW_MATCHED`]).
    pub fn denials(&self, policy: &str) -> u64 {
        self.denials.get(&policy_label(policy)).map_or(0, |c| c.get())
    }

    /// TCP connections denied by `policy` (`namespace/name`, or [`NO_ALLOW_MATCHED`]).
    pub fn connection_denials(&self, policy: &str) -> u64 {
        self.connection_denials.get(&policy_label(policy)).map_or(0, |c| c.get())
    }

    /// Attempts made after a request's first.
    pub fn retries(&self) -> u64 {
        self.retries.get()
    }

    /// Requests answered 504 because a timeout ran out.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.get()
    }

    /// TCP connections relayed.
    pub fn tcp_connections(&self) -> u64 {
        self.tcp_connections.get()
    }
}
