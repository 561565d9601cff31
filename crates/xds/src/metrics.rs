//! The xDS client's metrics, named as ztunnel names them.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;

/// Why an xDS stream ended (the `reason` label of `xds_connection_terminations`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue, Serialize)]
pub enum TerminationReason {
    /// Connecting or opening the stream failed.
    ConnectionError,
    /// A gRPC status other than the reconnect ones, or a local error.
    Error,
    /// The server asked for a reconnect (Unknown, Cancelled, DeadlineExceeded, closing transport).
    Reconnect,
    /// The server ended the stream cleanly.
    Complete,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: TerminationReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UrlLabels {
    url: String,
}

/// The xDS client's counters; cheap to clone (clones share the counters).
#[derive(Clone, Debug, Default)]
pub struct XdsMetrics {
    terminations: Family<ReasonLabels, Counter>,
    messages: Family<UrlLabels, Counter>,
    message_bytes: Family<UrlLabels, Counter>,
}

impl XdsMetrics {
    /// Creates the counters and registers them on `registry` (the proxy passes its
    /// `istio_`-prefixed one, so they scrape as `istio_xds_message_total` etc.).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "xds_connection_terminations",
            "The total number of completed connections to xds server (unstable)",
            m.terminations.clone(),
        );
        registry.register("xds_message", "Total number of messages received (unstable)", m.messages.clone());
        registry.register(
            "xds_message_bytes",
            "Total number of bytes received (unstable)",
            m.message_bytes.clone(),
        );
        m
    }

    pub(crate) fn terminated(&self, reason: TerminationReason) {
        self.terminations.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub(crate) fn message(&self, url: &str, bytes: u64) {
        let labels = UrlLabels { url: url.to_owned() };
        self.messages.get_or_create(&labels).inc();
        self.message_bytes.get_or_create(&labels).inc_by(bytes);
    }
}
