//! Request telemetry: plain counters (by status, denials by policy, retries, timeouts) and
//! Istio's `istio_requests_total` with `reporter="waypoint"`, counted as each response head goes
//! out, off the locks of the configuration. [`Counters::register`] puts the family in a
//! Prometheus registry (the admin server's, once the waypoint has one).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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

/// The waypoint's counters.
#[derive(Debug, Default)]
pub struct Counters {
    requests: Family<RequestLabels, Counter>,
    responses: Mutex<BTreeMap<u16, u64>>,
    denials: Mutex<BTreeMap<String, u64>>,
    connection_denials: Mutex<BTreeMap<String, u64>>,
    retries: AtomicU64,
    timeouts: AtomicU64,
    tcp_connections: AtomicU64,
}

impl Counters {
    /// Registers `istio_requests_total` in `registry` (the family is shared: counting goes on
    /// in this struct).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "istio_requests",
            "Requests the waypoint answered, by source, destination and response",
            self.requests.clone(),
        );
    }

    pub(crate) fn request(&self, labels: &RequestLabels) {
        self.requests.get_or_create(labels).inc();
    }

    /// `istio_requests_total` for one label set.
    pub fn requests_total(&self, labels: &RequestLabels) -> u64 {
        self.requests.get(labels).map(|c| c.get()).unwrap_or(0)
    }

    pub(crate) fn response(&self, status: http::StatusCode) {
        *self.responses.lock().unwrap_or_else(|p| p.into_inner()).entry(status.as_u16()).or_default() += 1;
    }

    pub(crate) fn denial(&self, policy: Option<&str>) {
        let key = policy.unwrap_or(NO_ALLOW_MATCHED).to_owned();
        *self.denials.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default() += 1;
    }

    pub(crate) fn connection_denial(&self, policy: Option<&str>) {
        let key = policy.unwrap_or(NO_ALLOW_MATCHED).to_owned();
        *self.connection_denials.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default() += 1;
    }

    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn timeout(&self) {
        self.timeouts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn tcp_connection(&self) {
        self.tcp_connections.fetch_add(1, Ordering::Relaxed);
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
        self.denials.lock().unwrap_or_else(|p| p.into_inner()).get(policy).copied().unwrap_or(0)
    }

    /// TCP connections denied by `policy` (`namespace/name`, or [`NO_ALLOW_MATCHED`]).
    pub fn connection_denials(&self, policy: &str) -> u64 {
        self.connection_denials.lock().unwrap_or_else(|p| p.into_inner()).get(policy).copied().unwrap_or(0)
    }

    /// Attempts made after a request's first.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Requests answered 504 because a timeout ran out.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }

    /// TCP connections relayed.
    pub fn tcp_connections(&self) -> u64 {
        self.tcp_connections.load(Ordering::Relaxed)
    }
}
