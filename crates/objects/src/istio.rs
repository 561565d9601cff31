//! Istio's kinds, as far as ambient uses them: `security.istio.io/v1` AuthorizationPolicy and
//! PeerAuthentication, `networking.istio.io/v1` ServiceEntry and WorkloadEntry.
//!
//! Field names are the CRDs' (camelCase). How strictly they are read depends on where they come
//! from ([`crate::Decoding`]): from the Kubernetes API, unknown fields are ignored, so objects
//! written for a newer Istio still parse (the API server validated them against its schema); from
//! files, an unknown field is an error naming it, as `kubectl apply` reports it. Enum-like fields
//! stay strings (`action`, `mode`, `location`, `resolution`): files must hold one of the values
//! below (case-sensitive, as the CRD schemas require, [`ACTIONS`], [`MTLS_MODES`], [`LOCATIONS`],
//! [`RESOLUTIONS`]; the chart's CRDs carry the same lists); from the API, a value the translation
//! does not know still fails closed there.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// `AuthorizationPolicy.spec.action` (empty: `ALLOW`).
pub const ACTIONS: &[&str] = &["ALLOW", "DENY", "AUDIT", "CUSTOM"];
/// `PeerAuthentication.spec.mtls.mode` and `spec.portLevelMtls[port].mode` (empty: `UNSET`).
pub const MTLS_MODES: &[&str] = &["UNSET", "DISABLE", "PERMISSIVE", "STRICT"];
/// `ServiceEntry.spec.location` (empty: `MESH_EXTERNAL`).
pub const LOCATIONS: &[&str] = &["MESH_EXTERNAL", "MESH_INTERNAL"];
/// `ServiceEntry.spec.resolution` (empty: `NONE`); `DYNAMIC_DNS` is Istio's newest.
pub const RESOLUTIONS: &[&str] = &["NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN", "DYNAMIC_DNS"];

/// Implements k8s-openapi's `Resource`, `ListableResource` and `Metadata` for a namespaced custom
/// kind with `metadata`, so kube-rs can list and watch it.
macro_rules! custom_kind {
    ($ty:ident, $group:literal, $version:literal, $kind:literal, $plural:literal) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = k8s_openapi::NamespaceResourceScope;
        }

        impl k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use custom_kind;

/// `spec.selector` of the security kinds (`istio.type.v1beta1.WorkloadSelector`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Labels a workload must carry (all of them).
    pub match_labels: BTreeMap<String, String>,
}

/// `targetRef` / `targetRefs` (`istio.type.v1beta1.PolicyTargetReference`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PolicyTargetReference {
    /// API group of the target.
    pub group: String,
    /// Kind of the target.
    pub kind: String,
    /// Name of the target.
    pub name: String,
    /// Namespace of the target (empty: the policy's).
    pub namespace: String,
}

/// `security.istio.io/v1` AuthorizationPolicy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthorizationPolicy {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The policy.
    pub spec: AuthorizationPolicySpec,
}
custom_kind!(AuthorizationPolicy, "security.istio.io", "v1", "AuthorizationPolicy", "authorizationpolicies");

/// `AuthorizationPolicy.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    /// Workloads the policy applies to (absent: the namespace, or the mesh in the root namespace).
    pub selector: Option<WorkloadSelector>,
    /// Attach to one resource instead of a selector (waypoints only).
    pub target_ref: Option<PolicyTargetReference>,
    /// Attach to several resources (waypoints only).
    pub target_refs: Vec<PolicyTargetReference>,
    /// Rules (empty: matches nothing for ALLOW, so an ALLOW policy with no rules denies all).
    pub rules: Vec<Rule>,
    /// `ALLOW` (default, also when empty), `DENY`, `AUDIT` or `CUSTOM`.
    pub action: String,
    /// The extension provider of a CUSTOM policy.
    pub provider: Option<serde_json::Value>,
}

/// One rule: all of `from`, `to` and `when` must match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Rule {
    /// Sources (any one matches).
    pub from: Vec<RuleFrom>,
    /// Operations (any one matches).
    pub to: Vec<RuleTo>,
    /// Conditions (all must match).
    pub when: Vec<Condition>,
}

/// `rules[].from[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RuleFrom {
    /// The source.
    pub source: Source,
}

/// `rules[].to[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RuleTo {
    /// The operation.
    pub operation: Operation,
}

/// `rules[].from[].source`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Source {
    /// Peer identities (`<trust domain>/ns/<ns>/sa/<sa>`, `*`, prefix or suffix `*`).
    pub principals: Vec<String>,
    /// Negated `principals`.
    pub not_principals: Vec<String>,
    /// JWT principals (L7).
    pub request_principals: Vec<String>,
    /// Negated `request_principals` (L7).
    pub not_request_principals: Vec<String>,
    /// Peer namespaces.
    pub namespaces: Vec<String>,
    /// Negated `namespaces`.
    pub not_namespaces: Vec<String>,
    /// Peer service accounts (`<ns>/<sa>`, or `<sa>` in the policy's namespace).
    pub service_accounts: Vec<String>,
    /// Negated `service_accounts`.
    pub not_service_accounts: Vec<String>,
    /// Peer addresses (IP or CIDR).
    pub ip_blocks: Vec<String>,
    /// Negated `ip_blocks`.
    pub not_ip_blocks: Vec<String>,
    /// Original client addresses (L7: from X-Forwarded-For).
    pub remote_ip_blocks: Vec<String>,
    /// Negated `remote_ip_blocks` (L7).
    pub not_remote_ip_blocks: Vec<String>,
}

/// `rules[].to[].operation`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Operation {
    /// Hosts (L7).
    pub hosts: Vec<String>,
    /// Negated `hosts` (L7).
    pub not_hosts: Vec<String>,
    /// Destination ports, as strings of numbers.
    pub ports: Vec<String>,
    /// Negated `ports`.
    pub not_ports: Vec<String>,
    /// HTTP methods (L7).
    pub methods: Vec<String>,
    /// Negated `methods` (L7).
    pub not_methods: Vec<String>,
    /// HTTP paths (L7).
    pub paths: Vec<String>,
    /// Negated `paths` (L7).
    pub not_paths: Vec<String>,
}

/// `rules[].when[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Condition {
    /// The attribute (`source.ip`, `destination.port`, `request.headers[...]`, …).
    pub key: String,
    /// Values (any one matches).
    pub values: Vec<String>,
    /// Negated values.
    pub not_values: Vec<String>,
}

/// `security.istio.io/v1` PeerAuthentication.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PeerAuthentication {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The policy.
    pub spec: PeerAuthenticationSpec,
}
custom_kind!(PeerAuthentication, "security.istio.io", "v1", "PeerAuthentication", "peerauthentications");

/// `PeerAuthentication.spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    /// Workloads it applies to (absent: the namespace, or the mesh in the root namespace).
    pub selector: Option<WorkloadSelector>,
    /// The mode for every port not in `port_level_mtls`.
    pub mtls: Option<Mtls>,
    /// Per-port modes, keyed by the workload's port number.
    pub port_level_mtls: BTreeMap<u32, Mtls>,
}

/// `mtls` / `portLevelMtls[p]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Mtls {
    /// `UNSET` (inherit; also when empty), `DISABLE`, `PERMISSIVE` or `STRICT`.
    pub mode: String,
}

/// `networking.istio.io/v1` ServiceEntry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceEntry {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The entry.
    pub spec: ServiceEntrySpec,
    /// Status (auto-allocated addresses).
    pub status: Option<ServiceEntryStatus>,
}
custom_kind!(ServiceEntry, "networking.istio.io", "v1", "ServiceEntry", "serviceentries");

/// `ServiceEntry.spec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceEntrySpec {
    /// Host names (wildcards allowed).
    pub hosts: Vec<String>,
    /// Virtual IPs or CIDRs.
    pub addresses: Vec<String>,
    /// Ports.
    pub ports: Vec<ServicePort>,
    /// `MESH_EXTERNAL` or `MESH_INTERNAL`.
    pub location: String,
    /// `NONE`, `STATIC`, `DNS`, `DNS_ROUND_ROBIN` or `DYNAMIC_DNS`.
    pub resolution: String,
    /// Inline endpoints.
    pub endpoints: Vec<WorkloadEntrySpec>,
    /// Selects pods and WorkloadEntries of the same namespace as endpoints.
    pub workload_selector: Option<EntrySelector>,
    /// Namespaces the entry is visible in.
    pub export_to: Vec<String>,
    /// SANs the servers' certificates carry.
    pub subject_alt_names: Vec<String>,
}

/// `ServiceEntry.spec.workloadSelector` (`networking.istio.io` WorkloadSelector: `labels`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EntrySelector {
    /// Labels a workload must carry.
    pub labels: BTreeMap<String, String>,
}

/// `ServiceEntry.spec.ports[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServicePort {
    /// The port number.
    pub number: u32,
    /// `HTTP`, `HTTPS`, `GRPC`, `HTTP2`, `MONGO`, `TCP`, `TLS`, …
    pub protocol: String,
    /// The port's name.
    pub name: String,
    /// The endpoints' port (0: `number`).
    pub target_port: u32,
}

/// `ServiceEntry.status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceEntryStatus {
    /// Addresses the allocator assigned, per host.
    pub addresses: Vec<ServiceEntryAddress>,
}

/// `ServiceEntry.status.addresses[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ServiceEntryAddress {
    /// The address.
    pub value: String,
    /// The host it was allocated for.
    pub host: String,
}

/// `networking.istio.io/v1` WorkloadEntry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkloadEntry {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The entry.
    pub spec: WorkloadEntrySpec,
}
custom_kind!(WorkloadEntry, "networking.istio.io", "v1", "WorkloadEntry", "workloadentries");

/// `WorkloadEntry.spec`, also a ServiceEntry's inline endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadEntrySpec {
    /// IP address or host name (empty: reachable by uid only).
    pub address: String,
    /// Port overrides by service port name.
    pub ports: BTreeMap<String, u32>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Network (empty: the local one).
    pub network: String,
    /// `region/zone/subzone`.
    pub locality: String,
    /// Load-balancing weight (0: unset).
    pub weight: u32,
    /// Service account of the workload.
    pub service_account: String,
}
