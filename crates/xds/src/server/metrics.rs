//! The delta ADS server's metrics: istiod's names, labels and buckets where istiod has the metric
//! (`pilot/pkg/xds/monitoring.go`, `pkg/xds/monitoring.go`), `ambit_xds_*` where it has none.
//!
//! Everything is counted where it happens (a connect, a response handed to its stream, a NACK), so
//! a scrape reads a handful of atomics and never walks the streams.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ambit_api::type_url::{ADDRESS, AUTHORIZATION};
use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

/// istiod's `pilot_xds_push_time` buckets (seconds).
const PUSH_TIME_BUCKETS: [f64; 8] = [0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
/// istiod's `pilot_proxy_convergence_time` buckets (seconds).
const CONVERGENCE_BUCKETS: [f64; 8] = [0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
/// istiod's `pilot_xds_config_size_bytes` buckets (10 kB, 1 MB, the 4 MB gRPC default, 10 MB, 40 MB).
const CONFIG_SIZE_BUCKETS: [f64; 6] = [1.0, 10_000.0, 1_000_000.0, 4_000_000.0, 10_000_000.0, 40_000_000.0];
/// `ambit_xds_push_resources` buckets (resources in one response).
const RESOURCE_BUCKETS: [f64; 6] = [1.0, 10.0, 100.0, 1_000.0, 10_000.0, 100_000.0];

/// Distinct `version` labels of `pilot_xds` at once; streams of further versions count as
/// [`OTHER_VERSION`] (the version is what a proxy says, so it must not grow the label set).
pub const MAX_VERSIONS: usize = 32;
/// The `version` label of streams past [`MAX_VERSIONS`].
pub const OTHER_VERSION: &str = "other";
/// Longer `ISTIO_VERSION` values are cut to this many bytes for the label.
pub const MAX_VERSION_LEN: usize = 64;

/// Why the server refused a stream, or ended it for a limit: the `reason` label of
/// `ambit_xds_stream_refusals_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RefusalReason {
    /// The server was not ready (`not_ready`).
    NotReady,
    /// `max_streams` streams were open (`too_many_streams`).
    TooManyStreams,
    /// The new-stream rate limit (`rate_limited`).
    RateLimited,
    /// The authenticator refused the stream (`unauthenticated`).
    Unauthenticated,
    /// The authenticator did not answer within `authenticate_timeout` (`authentication_timeout`).
    AuthenticationTimeout,
    /// The first request carried no node or no node id (`missing_node`).
    MissingNode,
    /// The authorizer refused the node (`unauthorized`).
    Unauthorized,
    /// The stream subscribed to more than `max_subscribed_names` names and was ended
    /// (`too_many_names`).
    TooManyNames,
}

impl RefusalReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotReady => "not_ready",
            Self::TooManyStreams => "too_many_streams",
            Self::RateLimited => "rate_limited",
            Self::Unauthenticated => "unauthenticated",
            Self::AuthenticationTimeout => "authentication_timeout",
            Self::MissingNode => "missing_node",
            Self::Unauthorized => "unauthorized",
            Self::TooManyNames => "too_many_names",
        }
    }
}

impl EncodeLabelValue for RefusalReason {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// The short type istiod reports in a metric's `type` label (`GetMetricType`): `wds` for
/// Address (and Workload), `wads` for Authorization, the type URL itself for any other type.
pub fn metric_type(type_url: &str) -> &str {
    const WORKLOAD: &str = "type.googleapis.com/istio.workload.Workload";
    match type_url {
        ADDRESS | WORKLOAD => "wds",
        AUTHORIZATION => "wads",
        other => other,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: RefusalReason,
}

type Histograms = Family<TypeLabels, Histogram, fn() -> Histogram>;

/// The server's metrics; cheap to clone (clones share them). [`ServerMetrics::default`] counts
/// without being registered anywhere.
#[derive(Clone, Debug)]
pub struct ServerMetrics {
    streams: Family<VersionLabels, Gauge>,
    versions: Arc<Mutex<HashMap<String, i64>>>,
    pushes: Family<TypeLabels, Total>,
    rejects: Family<TypeLabels, Total>,
    expired_nonces: Family<TypeLabels, Total>,
    push_time: Histograms,
    config_size: Histograms,
    push_resources: Histograms,
    convergence: Histogram,
    refusals: Family<ReasonLabels, Counter>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self {
            streams: Family::default(),
            versions: Arc::default(),
            pushes: Family::default(),
            rejects: Family::default(),
            expired_nonces: Family::default(),
            push_time: Family::new_with_constructor(|| Histogram::new(PUSH_TIME_BUCKETS)),
            config_size: Family::new_with_constructor(|| Histogram::new(CONFIG_SIZE_BUCKETS)),
            push_resources: Family::new_with_constructor(|| Histogram::new(RESOURCE_BUCKETS)),
            convergence: Histogram::new(CONVERGENCE_BUCKETS),
            refusals: Family::default(),
        }
    }
}

impl ServerMetrics {
    /// Creates the metrics and registers them on `registry` under istiod's names (the control
    /// plane passes its unprefixed registry, so they scrape as `pilot_xds_pushes` etc.).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "pilot_xds",
            "xDS streams admitted and open, by the ISTIO_VERSION the proxy reports",
            m.streams.clone(),
        );
        registry.register(
            "pilot_xds_pushes",
            "xDS responses handed to a stream, by type (counts up; typed gauge to keep istiod's name)",
            m.pushes.clone(),
        );
        registry.register(
            "pilot_total_xds_rejects",
            "NACKs received, by type (counts up; typed gauge to keep istiod's name)",
            m.rejects.clone(),
        );
        registry.register(
            "pilot_xds_expired_nonce",
            "Requests ignored for a stale nonce, by type (counts up; typed gauge to keep istiod's name)",
            m.expired_nonces.clone(),
        );
        registry.register(
            "pilot_xds_push_time",
            "Seconds from starting to build an xDS response to handing it to its stream, by type",
            m.push_time.clone(),
        );
        registry.register(
            "pilot_proxy_convergence_time",
            "Seconds from the first published change of a debounced burst to the last response of its push handed to a stream",
            m.convergence.clone(),
        );
        registry.register(
            "pilot_xds_config_size_bytes",
            "Payload bytes of the resources in one xDS response, by type URL",
            m.config_size.clone(),
        );
        registry.register(
            "ambit_xds_push_resources",
            "Resources in one xDS response handed to a stream",
            m.push_resources.clone(),
        );
        registry.register(
            "ambit_xds_stream_refusals",
            "xDS streams refused at admission, or ended for a limit, by reason",
            m.refusals.clone(),
        );
        m
    }

    /// The per-type handles for `type_url`, looked up once so a push touches no map.
    pub(crate) fn for_type(&self, type_url: &str) -> TypeMetrics {
        let short = TypeLabels { r#type: metric_type(type_url).to_owned() };
        let full = TypeLabels { r#type: type_url.to_owned() };
        TypeMetrics {
            pushes: self.pushes.get_or_create(&short).clone(),
            rejects: self.rejects.get_or_create(&short).clone(),
            expired_nonces: self.expired_nonces.get_or_create(&short).clone(),
            push_time: self.push_time.get_or_create(&short).clone(),
            // istiod labels this one with the full type URL.
            config_size: self.config_size.get_or_create(&full).clone(),
            push_resources: self.push_resources.get_or_create(&short).clone(),
        }
    }

    pub(crate) fn refused(&self, reason: RefusalReason) {
        self.refusals.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// One sample of the time from the first change of a debounced burst being published to
    /// the last response of the push it caused being handed to a stream.
    pub(crate) fn converged(&self, took: Duration) {
        self.convergence.observe(took.as_secs_f64());
    }

    /// Counts an admitted stream of a proxy reporting `version` until the guard drops.
    pub(crate) fn connected(&self, version: Option<&str>) -> Connected {
        let mut label = cut(version.unwrap_or(""), MAX_VERSION_LEN).to_owned();
        let mut versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        if !versions.contains_key(&label) && label != OTHER_VERSION && versions.len() >= MAX_VERSIONS {
            label = OTHER_VERSION.to_owned();
        }
        let n = versions.entry(label.clone()).or_insert(0);
        *n += 1;
        self.streams.get_or_create(&VersionLabels { version: label.clone() }).set(*n);
        Connected { metrics: self.clone(), version: label }
    }

    fn disconnected(&self, version: &str) {
        let mut versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        let labels = VersionLabels { version: version.to_owned() };
        match versions.get_mut(version) {
            Some(n) if *n > 1 => {
                *n -= 1;
                self.streams.get_or_create(&labels).set(*n);
            }
            _ => {
                // The last stream of this version: drop the series, so versions that come and
                // go do not accumulate.
                versions.remove(version);
                self.streams.remove(&labels);
            }
        }
    }
}

/// An admitted stream, counted in `pilot_xds` while it lives.
pub(crate) struct Connected {
    metrics: ServerMetrics,
    version: String,
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.metrics.disconnected(&self.version);
    }
}

/// One type's handles (shared with the families they came from).
#[derive(Clone, Debug)]
pub(crate) struct TypeMetrics {
    pushes: Total,
    rejects: Total,
    expired_nonces: Total,
    push_time: Histogram,
    config_size: Histogram,
    push_resources: Histogram,
}

impl TypeMetrics {
    /// A response of `resources` resources (`bytes` payload bytes) was handed to its stream,
    /// `took` after the server started building it.
    pub(crate) fn sent(&self, resources: usize, bytes: usize, took: Duration) {
        self.pushes.0.inc();
        self.push_time.observe(took.as_secs_f64());
        self.config_size.observe(bytes as f64);
        self.push_resources.observe(resources as f64);
    }

    pub(crate) fn rejected(&self) {
        self.rejects.0.inc();
    }

    pub(crate) fn expired_nonce(&self) {
        self.expired_nonces.0.inc();
    }
}

/// A count that only rises, exposed under its bare name as istiod exposes its sums
/// (`pilot_xds_pushes`, not `pilot_xds_pushes_total`, so istiod's dashboards and alerts work
/// unchanged). OpenMetrics requires a counter's sample to end in `_total` and the Prometheus text
/// format has no `unknown` type, so it is typed `gauge`; `rate()` and `increase()` treat it as
/// they treat istiod's.
#[derive(Clone, Debug, Default)]
struct Total(Counter);

impl TypedMetric for Total {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for Total {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn type_labels_are_istiods() {
        assert_eq!(metric_type(ADDRESS), "wds");
        assert_eq!(metric_type("type.googleapis.com/istio.workload.Workload"), "wds");
        assert_eq!(metric_type(AUTHORIZATION), "wads");
        assert_eq!(metric_type("type.googleapis.com/test.A"), "type.googleapis.com/test.A");
    }

    #[test]
    fn version_labels_are_bounded_and_dropped_at_zero() {
        let m = ServerMetrics::default();
        let guards: Vec<_> = (0..MAX_VERSIONS + 3).map(|i| m.connected(Some(&format!("1.{i}")))).collect();
        assert_eq!(m.versions.lock().unwrap().len(), MAX_VERSIONS + 1);
        assert_eq!(m.versions.lock().unwrap()[OTHER_VERSION], 3);
        // 1 + 2k bytes: byte 64 falls inside a character, so the cut keeps 63.
        let long = format!("a{}", "é".repeat(MAX_VERSION_LEN));
        assert_eq!(cut(&long, MAX_VERSION_LEN), &long[..MAX_VERSION_LEN - 1]);
        assert_eq!(cut("1.24", MAX_VERSION_LEN), "1.24");
        drop(guards);
        assert!(m.versions.lock().unwrap().is_empty());
    }
}
