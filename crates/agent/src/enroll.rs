//! Which pods are in the mesh: Istio's ambient selection rules.
//!
//! A pod is enrolled when it is not host-network, carries no sidecar, is not in an excluded
//! namespace, is not terminated, and some enablement selector matches both the pod's labels and
//! its namespace's labels. The default selectors give Istio's behaviour: pod label
//! `istio.io/dataplane-mode=ambient`, or namespace label `istio.io/dataplane-mode=ambient` unless
//! the pod opts out with `istio.io/dataplane-mode=none`.
//!
//! The node's own pods — the agent's (by `POD_NAMESPACE`/`POD_NAME`) and the node proxy's (by
//! namespace and labels, like istio-cni's `app=ztunnel` rule) — are never enrolled, whatever
//! their namespace's labels say: capturing the proxy's own traffic would loop it into itself.

use std::collections::{BTreeMap, BTreeSet};

use ambit_cni::SystemRole;
use serde::Deserialize;

use crate::model::{Namespace, Pod};

/// The enrollment label (on pods and namespaces).
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";
/// Value of [`DATAPLANE_MODE`] that enrolls.
pub const AMBIENT: &str = "ambient";
/// Value of [`DATAPLANE_MODE`] that opts a pod out.
pub const NONE: &str = "none";
/// Annotation the agent sets on pods it captured (`enabled`) or is still capturing (`pending`).
pub use ambit_objects::REDIRECTION;
/// Annotation of sidecar-injected pods (never ambient).
pub const SIDECAR_STATUS: &str = "sidecar.istio.io/status";

/// A Kubernetes label selector (`matchLabels` AND `matchExpressions`); empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Exact label values.
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements.
    pub match_expressions: Vec<Requirement>,
}

/// One set-based requirement.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// Label key.
    pub key: String,
    /// Operator.
    pub operator: Operator,
    /// Values for `In` / `NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// Label selector operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Operator {
    /// Key present with one of the values.
    In,
    /// Key absent, or present with none of the values.
    NotIn,
    /// Key present.
    Exists,
    /// Key absent.
    DoesNotExist,
}

/// A pod selector and a namespace selector that must both match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct EnablementSelector {
    /// Matches the pod's labels.
    pub pod_selector: LabelSelector,
    /// Matches the pod's namespace's labels.
    pub namespace_selector: LabelSelector,
}

/// The enrollment decision for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Capture the pod.
    Enroll,
    /// Leave the pod alone, and why.
    Skip(SkipReason),
}

/// Why a pod is not enrolled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// One of the node's own pods (the agent's or the node proxy's).
    SystemPod(SystemRole),
    /// `hostNetwork: true`: there is no pod network namespace to capture in.
    HostNetwork,
    /// The pod has a sidecar.
    Sidecar,
    /// The namespace is excluded by configuration.
    ExcludedNamespace,
    /// The pod has terminated.
    Terminal,
    /// No selector matches.
    NotSelected,
}

/// Enrollment configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enrollment {
    /// Enablement selectors (any may match).
    pub selectors: Vec<EnablementSelector>,
    /// Namespaces never enrolled.
    pub excluded_namespaces: BTreeSet<String>,
    /// The node's own pods, never enrolled.
    pub system: SystemSelector,
}

/// How the agent recognises the node's own pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SystemSelector {
    /// The agent's own pod: `(POD_NAMESPACE, POD_NAME)`.
    pub agent: Option<(String, String)>,
    /// The node proxy's pods: their namespace and a label selector.
    pub proxy: Option<(String, LabelSelector)>,
}

impl SystemSelector {
    /// Whether `pod` is the agent's or a node proxy's pod.
    pub fn role(&self, pod: &Pod) -> Option<SystemRole> {
        if self.agent.as_ref().is_some_and(|(ns, name)| *ns == pod.namespace && *name == pod.name) {
            return Some(SystemRole::Agent);
        }
        let proxy = self
            .proxy
            .as_ref()
            .is_some_and(|(ns, sel)| *ns == pod.namespace && !sel.is_empty() && sel.matches(&pod.labels));
        proxy.then_some(SystemRole::Proxy)
    }
}

/// A selector list that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid enablement selectors: {0}")]
pub struct SelectorError(String);

impl Default for Enrollment {
    fn default() -> Self {
        Enrollment {
            selectors: default_selectors(),
            excluded_namespaces: ["kube-system".to_owned()].into(),
            system: SystemSelector::default(),
        }
    }
}

/// `ambient.enablementSelectors` of istio-cni's chart, as its ConfigMap renders them into
/// `AMBIENT_ENABLEMENT_SELECTOR` (YAML): the same list as [`default_selectors`].
pub const ISTIO_CHART_SELECTORS: &str = "- podSelector:
    matchLabels:
      istio.io/dataplane-mode: ambient
- podSelector:
    matchExpressions:
    - key: istio.io/dataplane-mode
      operator: NotIn
      values:
      - none
  namespaceSelector:
    matchLabels:
      istio.io/dataplane-mode: ambient
";

/// Istio's default enablement selectors.
pub fn default_selectors() -> Vec<EnablementSelector> {
    vec![
        EnablementSelector {
            pod_selector: LabelSelector {
                match_labels: [(DATAPLANE_MODE.to_owned(), AMBIENT.to_owned())].into(),
                match_expressions: Vec::new(),
            },
            namespace_selector: LabelSelector::default(),
        },
        EnablementSelector {
            pod_selector: LabelSelector {
                match_labels: BTreeMap::new(),
                match_expressions: vec![Requirement {
                    key: DATAPLANE_MODE.to_owned(),
                    operator: Operator::NotIn,
                    values: vec![NONE.to_owned()],
                }],
            },
            namespace_selector: LabelSelector {
                match_labels: [(DATAPLANE_MODE.to_owned(), AMBIENT.to_owned())].into(),
                match_expressions: Vec::new(),
            },
        },
    ]
}

/// Parses a selector list: YAML, as istio-cni's chart renders `ambient.enablementSelectors`,
/// or JSON (a YAML subset).
pub fn parse_selectors(text: &str) -> Result<Vec<EnablementSelector>, SelectorError> {
    let value = ambit_objects::file::yaml_value(text).map_err(SelectorError)?;
    serde_json::from_value(value).map_err(|e| SelectorError(e.to_string()))
}

impl LabelSelector {
    /// Parses `key=value[,key=value…]` into `matchLabels` (the form of `kubectl -l` without
    /// set operators).
    pub fn parse_equalities(s: &str) -> Result<LabelSelector, String> {
        let mut match_labels = BTreeMap::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let Some((k, v)) = term.split_once('=') else {
                return Err(format!("{term:?} is not key=value"));
            };
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() || v.contains('=') {
                return Err(format!("{term:?} is not key=value"));
            }
            match_labels.insert(k.to_owned(), v.to_owned());
        }
        Ok(LabelSelector { match_labels, match_expressions: Vec::new() })
    }

    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// Whether the selector has no terms (matches everything).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.key);
        match self.operator {
            Operator::In => v.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => v.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => v.is_some(),
            Operator::DoesNotExist => v.is_none(),
        }
    }
}

impl Enrollment {
    /// The selection predicate alone (host network and sidecars excluded; selectors).
    pub fn selected(&self, pod: &Pod, ns: &Namespace) -> bool {
        !pod.host_network
            && !pod.annotations.contains_key(SIDECAR_STATUS)
            && self
                .selectors
                .iter()
                .any(|s| s.pod_selector.matches(&pod.labels) && s.namespace_selector.matches(&ns.labels))
    }

    /// Whether a namespace's labels alone enroll its pods (a non-empty namespace selector matches).
    /// A change of this answer means every pod of the namespace must be re-evaluated.
    pub fn namespace_enrolls(&self, ns: &Namespace) -> bool {
        self.selectors
            .iter()
            .any(|s| !s.namespace_selector.is_empty() && s.namespace_selector.matches(&ns.labels))
    }

    /// The full decision for a pod in its namespace.
    pub fn decide(&self, pod: &Pod, ns: &Namespace) -> Decision {
        let skip = if let Some(role) = self.system.role(pod) {
            SkipReason::SystemPod(role)
        } else if pod.host_network {
            SkipReason::HostNetwork
        } else if pod.annotations.contains_key(SIDECAR_STATUS) {
            SkipReason::Sidecar
        } else if self.excluded_namespaces.contains(&pod.namespace) {
            SkipReason::ExcludedNamespace
        } else if pod.phase.is_terminal() {
            SkipReason::Terminal
        } else if self.selected(pod, ns) {
            return Decision::Enroll;
        } else {
            SkipReason::NotSelected
        };
        Decision::Skip(skip)
    }
}

#[cfg(test)]
mod tests;
