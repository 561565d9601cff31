//! The Gateway API kinds that define waypoints (`gateway.networking.k8s.io/v1` Gateway and
//! GatewayClass), reduced to the fields the waypoint binding reads (`control-plane.md` §2.5).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

use crate::istio::custom_kind;

/// `listeners[].allowedRoutes.namespaces.from` (empty: `Same`), as the Gateway API's schema has it.
pub const ROUTE_NAMESPACES_FROM: &[&str] = &["All", "Selector", "Same"];

/// `gateway.networking.k8s.io/v1` Gateway.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Gateway {
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// The gateway.
    pub spec: GatewaySpec,
    /// Status (the addresses a waypoint is reached at).
    pub status: Option<GatewayStatus>,
}
custom_kind!(Gateway, "gateway.networking.k8s.io", "v1", "Gateway", "gateways");

/// `Gateway.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The class (`istio-waypoint` for waypoints).
    pub gateway_class_name: String,
    /// Listeners.
    pub listeners: Vec<Listener>,
}

/// `Gateway.spec.listeners[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Listener {
    /// Name.
    pub name: String,
    /// Port.
    pub port: u16,
    /// `HBONE`, `HTTP`, `TCP`, …
    pub protocol: String,
    /// Which namespaces may attach.
    pub allowed_routes: Option<AllowedRoutes>,
}

/// `listeners[].allowedRoutes`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AllowedRoutes {
    /// The namespace rule.
    pub namespaces: Option<RouteNamespaces>,
}

/// `allowedRoutes.namespaces`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `All`, `Selector` or `Same` (default).
    pub from: String,
    /// With `Selector`: namespaces whose labels match.
    pub selector: Option<LabelSelector>,
}

/// `Gateway.status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayStatus {
    /// Where the gateway is reachable.
    pub addresses: Vec<GatewayAddress>,
}

/// `Gateway.status.addresses[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayAddress {
    /// `IPAddress` (default) or `Hostname`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The address.
    pub value: String,
}

/// `gateway.networking.k8s.io/v1` GatewayClass (cluster-scoped; only its labels are read).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayClass {
    /// Standard metadata.
    pub metadata: ObjectMeta,
}

impl k8s_openapi::Resource for GatewayClass {
    const API_VERSION: &'static str = "gateway.networking.k8s.io/v1";
    const GROUP: &'static str = "gateway.networking.k8s.io";
    const KIND: &'static str = "GatewayClass";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "gatewayclasses";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::ListableResource for GatewayClass {
    const LIST_KIND: &'static str = "GatewayClassList";
}

impl k8s_openapi::Metadata for GatewayClass {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
