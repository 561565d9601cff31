//! The agent's Prometheus metrics (`ambit_agent_*`), served on `--metrics-addr` at `/metrics`.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `outcome` label of `ambit_agent_cni_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `enrolled`, `not_enrolled`, `bad_request`, `error`.
    pub outcome: String,
}

/// `state` label of `ambit_agent_pods`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `enrolled` or `pending`.
    pub state: String,
}

/// `response_code` label of `istio_cni_plugin_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseCodeLabel {
    /// The HTTP status the plugin got.
    pub response_code: String,
}

/// `type` label of `nodeagent_reconcile_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    /// `add`, `update` or `delete`.
    pub r#type: String,
}

/// `result` label of `istio_cni_installs_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `SUCCESS` (failed passes are logged and retried; they have no count).
    pub result: String,
}

/// istio-cni's metrics, under istio-cni's names, beside Ambit's, so that dashboards and alerts
/// written for istio-cni keep working after a drop-in.
pub struct IstioCniMetrics {
    /// `istio_cni_plugin_requests_total{response_code}`: CNI ADD requests served.
    pub plugin_requests: Family<ResponseCodeLabel, Counter>,
    /// `nodeagent_reconcile_events_total{type}`: pod and namespace changes processed.
    pub reconcile_events: Family<TypeLabel, Counter>,
    /// `ztunnel_connected`: node proxies connected over ZDS.
    pub ztunnel_connected: Gauge,
    /// `istio_cni_install_ready`: 1 while the plugin is installed and valid.
    pub install_ready: Gauge,
    /// `istio_cni_installs_total{result}`: passes that left the plugin installed.
    pub installs: Family<ResultLabel, Counter>,
}

impl IstioCniMetrics {
    fn register(registry: &mut Registry) -> IstioCniMetrics {
        let m = IstioCniMetrics {
            plugin_requests: Family::default(),
            reconcile_events: Family::default(),
            ztunnel_connected: Gauge::default(),
            install_ready: Gauge::default(),
            installs: Family::default(),
        };
        registry.register(
            "istio_cni_plugin_requests",
            "CNI plugin requests by response code",
            m.plugin_requests.clone(),
        );
        registry.register(
            "nodeagent_reconcile_events",
            "Pod and namespace changes processed",
            m.reconcile_events.clone(),
        );
        registry.register(
            "ztunnel_connected",
            "Node proxies connected over ZDS",
            m.ztunnel_connected.clone(),
        );
        registry.register(
            "istio_cni_install_ready",
            "1 while the CNI plugin is installed",
            m.install_ready.clone(),
        );
        registry.register("istio_cni_installs", "Install passes by result", m.installs.clone());
        m
    }

    /// One processed change of `kind` (`add`, `update`, `delete`).
    pub fn reconcile_event(&self, kind: &str) {
        self.reconcile_events.get_or_create(&TypeLabel { r#type: kind.into() }).inc();
    }

    /// The installer's state, polled: a change to installed counts one successful pass.
    pub fn installer(&self, ready: bool) {
        if ready && self.install_ready.get() == 0 {
            self.installs.get_or_create(&ResultLabel { result: "SUCCESS".into() }).inc();
        }
        self.install_ready.set(i64::from(ready));
    }
}

/// Every metric the agent exports.
pub struct AgentMetrics {
    /// istio-cni's names.
    pub istio: IstioCniMetrics,
    /// `ambit_agent_cni_events_total{outcome}`.
    pub events: Family<OutcomeLabel, Counter>,
    /// `ambit_agent_cni_add_duration_seconds`.
    pub add_latency: Histogram,
    /// `ambit_agent_pods{state}`.
    pub pods: Family<StateLabel, Gauge>,
    /// `ambit_agent_capture_errors_total`.
    pub capture_errors: Counter,
    /// `ambit_agent_capture_repairs_total`.
    pub capture_repairs: Counter,
    /// `ambit_agent_tcp_migrate_req_supported`.
    pub migrate_req_supported: Gauge,
    /// `ambit_agent_annotation_failures_total`.
    pub annotation_failures: Counter,
    /// `ambit_agent_annotations_pending`.
    pub annotations_pending: Gauge,
}

impl AgentMetrics {
    /// The metrics, registered under `ambit_agent_` in `registry` (istio-cni's at its names).
    pub fn register(registry: &mut Registry) -> Arc<AgentMetrics> {
        let istio = IstioCniMetrics::register(registry);
        let m = Arc::new(AgentMetrics {
            istio,
            events: Family::default(),
            add_latency: Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0]),
            pods: Family::default(),
            capture_errors: Counter::default(),
            capture_repairs: Counter::default(),
            migrate_req_supported: Gauge::default(),
            annotation_failures: Counter::default(),
            annotations_pending: Gauge::default(),
        });
        let r = registry.sub_registry_with_prefix("ambit_agent");
        r.register("cni_events", "CNI plugin events by outcome", m.events.clone());
        r.register(
            "cni_add_duration_seconds",
            "CNI ADD handling time for enrolled pods",
            m.add_latency.clone(),
        );
        r.register("pods", "Pods by mesh state", m.pods.clone());
        r.register("capture_errors", "Capture rule errors", m.capture_errors.clone());
        r.register(
            "capture_repairs",
            "Enrolled pods whose capture was found drifted and re-applied",
            m.capture_repairs.clone(),
        );
        r.register(
            "tcp_migrate_req_supported",
            "1 when net.ipv4.tcp_migrate_req can be set (it is, in every captured pod): the kernel has it and the agent can write it",
            m.migrate_req_supported.clone(),
        );
        r.register(
            "annotation_failures",
            "Failed writes of the ambient.istio.io/redirection annotation (each is retried)",
            m.annotation_failures.clone(),
        );
        r.register(
            "annotations_pending",
            "Pods whose redirection annotation is not written yet",
            m.annotations_pending.clone(),
        );
        m
    }

    /// Sets `ambit_agent_pods{state}`.
    pub fn set_pods(&self, state: &str, n: usize) {
        self.pods.get_or_create(&StateLabel { state: state.into() }).set(n as i64);
    }
}

impl crate::server::EventMetrics for AgentMetrics {
    fn observe(&self, outcome: &'static str, code: u16, seconds: f64) {
        self.istio
            .plugin_requests
            .get_or_create(&ResponseCodeLabel { response_code: code.to_string() })
            .inc();
        self.events.get_or_create(&OutcomeLabel { outcome: outcome.into() }).inc();
        if outcome == "enrolled" {
            self.add_latency.observe(seconds);
        }
    }
}
