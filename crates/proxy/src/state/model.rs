//! The internal workload and service model, in the camelCase shape of ztunnel's local config.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use ambit_identity::Identity;

use crate::name::{Interner, Name};

pub(crate) use super::endpoints::unique_map;
pub use super::endpoints::{Endpoint, EndpointSet, ServicePorts};
use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Trust domain assumed when a workload does not name one.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// Service account assumed when a workload does not name one.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Cluster id assumed when an xDS workload does not name one.
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";
/// The HBONE port every mesh workload listens on.
pub const HBONE_PORT: u16 = 15008;

/// One endpoint: a pod, VM, WorkloadEntry or gateway.
///
/// What differs between the replicas of one deployment (uid, name, addresses, node, health,
/// hostname) is held here; the rest (namespace, identity, telemetry names, policies, services,
/// locality, …) is one [`Profile`], interned, that every replica with equal fields shares: at
/// 100 000 pods that is about 300 bytes less per workload. The profile's fields read as the
/// workload's own (`w.namespace`, through `Deref`); writing one (`w.namespace = …`, tests and
/// benchmarks) gives this workload its own copy of the profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "WorkloadSpec", into = "WorkloadSpec")]
pub struct Workload {
    /// Primary key, e.g. `cluster1//v1/Pod/default/web-0` (shared with the indexes and endpoints
    /// that name the workload).
    pub uid: Arc<str>,
    /// Pod name.
    pub name: Arc<str>,
    /// Addresses; `(network, ip)` is the address key.
    pub workload_ips: Vec<IpAddr>,
    /// Node name.
    pub node: Name,
    /// Health.
    pub status: HealthStatus,
    /// DNS name used when the workload has no usable address.
    pub hostname: Name,
    /// Locality for load balancing (interned: a node's pods share one).
    pub locality: Arc<Locality>,
    /// Everything else, shared by the replicas that have it equal.
    profile: Arc<Profile>,
}

/// The fields of a [`Workload`] that the replicas of one deployment have in common (not their
/// node or locality), interned.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Profile {
    /// Namespace.
    pub namespace: Name,
    /// Inbound protocol the workload accepts.
    pub protocol: Protocol,
    /// SPIFFE trust domain (may be empty in local config).
    pub trust_domain: Name,
    /// Kubernetes service account (may be empty in local config).
    pub service_account: Name,
    /// Network the addresses belong to.
    pub network: Name,
    /// Workload-attached waypoint.
    pub waypoint: Option<GatewayAddress>,
    /// East-west gateway for cross-network access.
    pub network_gateway: Option<GatewayAddress>,
    /// Canonical service (telemetry).
    pub canonical_name: Name,
    /// Canonical revision (telemetry).
    pub canonical_revision: Name,
    /// Owning workload name, e.g. the deployment (telemetry).
    pub workload_name: Name,
    /// Owning workload kind, lower case (`deployment`, `cronjob`, `pod`, `job`).
    pub workload_type: Name,
    /// Cluster id.
    pub cluster_id: Name,
    /// Selector-scoped policy keys (`ns/name`) that apply to this workload.
    pub authorization_policies: Vec<Name>,
    /// Load-balancing weight.
    pub capacity: u32,
    /// Host-network workloads are not indexed by address.
    pub network_mode: NetworkMode,
    /// The workload terminates HBONE itself (only affects certificate prefetch).
    pub native_tunnel: bool,
    /// The workload consumes tunnel metadata (e.g. a PROXY header).
    pub application_tunnel: Option<ApplicationTunnel>,
    /// Services this workload is an endpoint of: `"<ns>/<hostname>"` → service port → target port.
    pub services: ServicePorts,
}

static PROFILES: Interner<Profile> = Interner::new();
static LOCALITIES: Interner<Locality> = Interner::new();

impl std::ops::Deref for Workload {
    type Target = Profile;

    fn deref(&self) -> &Profile {
        &self.profile
    }
}

impl std::ops::DerefMut for Workload {
    /// This workload's own copy of its profile (no longer shared, nor interned).
    fn deref_mut(&mut self) -> &mut Profile {
        Arc::make_mut(&mut self.profile)
    }
}

impl Workload {
    /// The shared profile (its address tells whether two workloads share one).
    pub fn profile(&self) -> &Arc<Profile> {
        &self.profile
    }
}

impl From<WorkloadSpec> for Workload {
    fn from(w: WorkloadSpec) -> Workload {
        let profile = Profile {
            namespace: w.namespace,
            protocol: w.protocol,
            trust_domain: w.trust_domain,
            service_account: w.service_account,
            network: w.network,
            waypoint: w.waypoint,
            network_gateway: w.network_gateway,
            canonical_name: w.canonical_name,
            canonical_revision: w.canonical_revision,
            workload_name: w.workload_name,
            workload_type: w.workload_type,
            cluster_id: w.cluster_id,
            authorization_policies: w.authorization_policies,
            capacity: w.capacity,
            network_mode: w.network_mode,
            native_tunnel: w.native_tunnel,
            application_tunnel: w.application_tunnel,
            services: w.services,
        };
        let mut workload_ips = w.workload_ips;
        // Parsed lists grow in steps (four addresses' room for one); a workload keeps only what
        // it has.
        workload_ips.shrink_to_fit();
        Workload {
            uid: w.uid,
            name: w.name,
            workload_ips,
            node: w.node,
            status: w.status,
            hostname: w.hostname,
            locality: LOCALITIES.intern(&w.locality, |l| Arc::new(l.clone())),
            profile: PROFILES.intern(&profile, |p| Arc::new(p.clone())),
        }
    }
}

impl From<Workload> for WorkloadSpec {
    fn from(w: Workload) -> WorkloadSpec {
        let p = Arc::unwrap_or_clone(w.profile);
        WorkloadSpec {
            uid: w.uid,
            name: w.name,
            namespace: p.namespace,
            workload_ips: w.workload_ips,
            protocol: p.protocol,
            trust_domain: p.trust_domain,
            service_account: p.service_account,
            network: p.network,
            waypoint: p.waypoint,
            network_gateway: p.network_gateway,
            node: w.node,
            canonical_name: p.canonical_name,
            canonical_revision: p.canonical_revision,
            workload_name: p.workload_name,
            workload_type: p.workload_type,
            cluster_id: p.cluster_id,
            authorization_policies: p.authorization_policies,
            status: w.status,
            locality: Arc::unwrap_or_clone(w.locality),
            capacity: p.capacity,
            hostname: w.hostname,
            network_mode: p.network_mode,
            native_tunnel: p.native_tunnel,
            application_tunnel: p.application_tunnel,
            services: p.services,
        }
    }
}

/// A workload as written in ztunnel's local config (and built from an xDS `Workload`): every
/// field flat. Parsed into, and serialized from, [`Workload`], which holds the fields replicas
/// share in one interned [`Profile`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    /// Primary key, e.g. `cluster1//v1/Pod/default/web-0` (shared with the indexes and endpoints
    /// that name the workload).
    #[serde(default)]
    pub uid: Arc<str>,
    /// Pod name.
    #[serde(default)]
    pub name: Arc<str>,
    /// Namespace.
    pub namespace: Name,
    /// Addresses; `(network, ip)` is the address key.
    pub workload_ips: Vec<IpAddr>,
    /// Inbound protocol the workload accepts.
    #[serde(default)]
    pub protocol: Protocol,
    /// SPIFFE trust domain (may be empty in local config).
    #[serde(default)]
    pub trust_domain: Name,
    /// Kubernetes service account (may be empty in local config).
    #[serde(default)]
    pub service_account: Name,
    /// Network the addresses belong to.
    #[serde(default)]
    pub network: Name,
    /// Workload-attached waypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
    /// East-west gateway for cross-network access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_gateway: Option<GatewayAddress>,
    /// Node name.
    #[serde(default)]
    pub node: Name,
    /// Canonical service (telemetry).
    #[serde(default)]
    pub canonical_name: Name,
    /// Canonical revision (telemetry).
    #[serde(default)]
    pub canonical_revision: Name,
    /// Owning workload name, e.g. the deployment (telemetry).
    #[serde(default)]
    pub workload_name: Name,
    /// Owning workload kind, lower case (`deployment`, `cronjob`, `pod`, `job`).
    #[serde(default)]
    pub workload_type: Name,
    /// Cluster id.
    #[serde(default)]
    pub cluster_id: Name,
    /// Selector-scoped policy keys (`ns/name`) that apply to this workload.
    #[serde(default)]
    pub authorization_policies: Vec<Name>,
    /// Health.
    #[serde(default)]
    pub status: HealthStatus,
    /// Locality for load balancing.
    #[serde(default)]
    pub locality: Locality,
    /// Load-balancing weight.
    #[serde(default = "default_capacity")]
    pub capacity: u32,
    /// DNS name used when the workload has no usable address.
    #[serde(default)]
    pub hostname: Name,
    /// Host-network workloads are not indexed by address.
    #[serde(default)]
    pub network_mode: NetworkMode,
    /// The workload terminates HBONE itself (only affects certificate prefetch).
    #[serde(default)]
    pub native_tunnel: bool,
    /// The workload consumes tunnel metadata (e.g. a PROXY header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_tunnel: Option<ApplicationTunnel>,
    /// Services this workload is an endpoint of: `"<ns>/<hostname>"` → service port → target port.
    #[serde(default)]
    pub services: ServicePorts,
}

/// Inbound protocol of a workload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Protocol {
    /// Plain TCP.
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    /// HTTP/2 CONNECT over mTLS on port 15008.
    #[serde(rename = "HBONE")]
    Hbone,
}

/// Workload health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HealthStatus {
    /// Ready.
    #[default]
    Healthy,
    /// Not ready; dropped from load balancing unless the service allows all.
    Unhealthy,
}

/// Network mode of a workload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NetworkMode {
    /// Own pod network namespace.
    #[default]
    Standard,
    /// Host network: shares the node's addresses, so it is not indexed by address.
    HostNetwork,
}

/// Region, zone and subzone of a workload.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct Locality {
    /// Region.
    pub region: Name,
    /// Zone.
    pub zone: Name,
    /// Subzone.
    pub subzone: Name,
}

/// Tunnel metadata the workload expects in front of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ApplicationTunnel {
    /// Tunnel protocol.
    #[serde(default)]
    pub protocol: AppTunnelProtocol,
    /// Port to deliver to instead of the original one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// Application tunnel protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AppTunnelProtocol {
    /// Raw bytes.
    #[default]
    #[serde(rename = "NONE")]
    None,
    /// A PROXY v2 header precedes the bytes.
    #[serde(rename = "PROXY")]
    Proxy,
}

/// An address on a network; text form `"<network>/<ip>"` (empty network renders as `/ip`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkAddress {
    /// Network name.
    pub network: String,
    /// IP address.
    pub address: IpAddr,
}

/// A hostname in a namespace; text form `"<namespace>/<hostname>"`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedHostname {
    /// Namespace.
    pub namespace: String,
    /// Hostname.
    pub hostname: String,
}

/// Where a gateway or waypoint is: an address or a service hostname.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Destination {
    /// A workload or service VIP address.
    Address(NetworkAddress),
    /// A service (or workload) hostname.
    Hostname(NamespacedHostname),
}

/// A waypoint or east-west gateway reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    /// The gateway.
    pub destination: Destination,
    /// Its HBONE port.
    #[serde(default = "default_hbone_port")]
    pub hbone_mtls_port: u16,
}

/// A group of workloads behind VIPs and a hostname.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    /// Kubernetes service name.
    #[serde(default)]
    pub name: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// FQDN.
    pub hostname: String,
    /// Host VIPs; empty means headless.
    #[serde(default)]
    pub vips: Vec<NetworkAddress>,
    /// CIDR VIPs (longest prefix wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidr_vips: Vec<CidrVip>,
    /// Service port → target port (0 = named port, resolved per endpoint).
    #[serde(default, deserialize_with = "unique_map")]
    pub ports: BTreeMap<u16, u16>,
    /// Endpoints by workload uid (normally built from workloads' `services`).
    #[serde(default)]
    pub endpoints: EndpointSet,
    /// Extra SPIFFE ids accepted for the server certificate.
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    /// Service waypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
    /// Waypoints sampled by weight per connection; falls back to `waypoint` if empty or all zero.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weighted_waypoints: Vec<WeightedWaypoint>,
    /// Endpoint selection policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancer>,
    /// Address family restriction; none means automatic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_families: Option<IpFamily>,
    /// Tie-breaker when several services share a VIP or hostname.
    #[serde(default)]
    pub canonical: bool,
    /// Who may route to this service.
    #[serde(default)]
    pub visibility: Visibility,
}

/// A CIDR VIP.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CidrVip {
    /// Network name.
    #[serde(default)]
    pub network: String,
    /// The range.
    pub cidr: IpNet,
}

/// A waypoint with a sampling weight.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightedWaypoint {
    /// The waypoint.
    pub destination: GatewayAddress,
    /// Share = weight / sum of weights; 0 is never chosen.
    #[serde(default)]
    pub weight: u32,
}

/// Endpoint selection policy of a service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancer {
    /// Scopes to prefer, most important first.
    #[serde(default)]
    pub routing_preferences: Vec<LoadBalancerScope>,
    /// How the preferences apply.
    #[serde(default)]
    pub mode: LoadBalancerMode,
    /// Whether unhealthy endpoints are kept.
    #[serde(default)]
    pub health_policy: HealthPolicy,
}

/// A locality scope for load balancing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LoadBalancerScope {
    /// Same region.
    Region,
    /// Same zone.
    Zone,
    /// Same subzone.
    Subzone,
    /// Same node.
    Node,
    /// Same cluster.
    Cluster,
    /// Same network.
    Network,
}

/// How routing preferences apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LoadBalancerMode {
    /// Preferences ignored; any endpoint.
    #[default]
    Standard,
    /// Only endpoints matching every preference.
    Strict,
    /// Best-matching endpoints first, others when none match.
    Failover,
    /// No endpoint selection: connect to the original destination.
    Passthrough,
}

/// Which endpoints load balancing keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HealthPolicy {
    /// Healthy endpoints only.
    #[default]
    OnlyHealthy,
    /// Unhealthy endpoints too.
    AllowAll,
}

/// Address family restriction of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IpFamily {
    /// Both families.
    Dual,
    /// IPv4 only.
    IPv4,
    /// IPv6 only.
    IPv6,
}

/// Service visibility.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Visibility {
    /// Anyone may route to the service.
    #[default]
    Public,
    /// Only clients in the service's namespace.
    Namespace,
}

impl Workload {
    /// The workload's SPIFFE identity (empty trust domain / service account fall back to
    /// `cluster.local` / `default`, which local config may leave unset).
    pub fn identity(&self) -> Identity {
        Identity::new(self.effective_trust_domain(), &self.namespace, self.effective_service_account())
    }

    /// The trust domain, `cluster.local` when unset.
    pub fn effective_trust_domain(&self) -> &str {
        non_empty_or(&self.trust_domain, DEFAULT_TRUST_DOMAIN)
    }

    /// The service account, `default` when unset.
    pub fn effective_service_account(&self) -> &str {
        non_empty_or(&self.service_account, DEFAULT_SERVICE_ACCOUNT)
    }

    /// Whether the uid is a Kubernetes Pod uid (`<cluster>//Pod/...` or `.../v1/Pod/...`).
    pub fn is_pod(&self) -> bool {
        self.uid.contains("//Pod/") || self.uid.contains("/v1/Pod/")
    }

    /// Application tunnel port override, if any.
    pub fn app_tunnel_port(&self) -> Option<u16> {
        self.application_tunnel.and_then(|t| t.port).filter(|p| *p != 0)
    }
}

impl Service {
    /// The xDS resource name and endpoint key, `"<namespace>/<hostname>"`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }

    /// Whether load balancing is disabled (connect to the original destination).
    pub fn is_passthrough(&self) -> bool {
        self.load_balancer.as_ref().is_some_and(|lb| lb.mode == LoadBalancerMode::Passthrough)
    }

    /// Whether a client in `namespace` may route to this service.
    pub fn visible_to(&self, namespace: &str) -> bool {
        match self.visibility {
            Visibility::Public => true,
            Visibility::Namespace => self.namespace == namespace,
        }
    }

    /// Whether `ip` is allowed by the service's address family restriction.
    pub fn allows_family(&self, ip: IpAddr) -> bool {
        match self.ip_families {
            None | Some(IpFamily::Dual) => true,
            Some(IpFamily::IPv4) => ip.is_ipv4(),
            Some(IpFamily::IPv6) => ip.is_ipv6(),
        }
    }

    /// Whether unhealthy endpoints are kept.
    pub fn allows_unhealthy(&self) -> bool {
        self.load_balancer.as_ref().is_some_and(|lb| lb.health_policy == HealthPolicy::AllowAll)
    }
}

impl fmt::Display for NetworkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.address)
    }
}

impl fmt::Display for NamespacedHostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Address(a) => a.fmt(f),
            Destination::Hostname(h) => h.fmt(f),
        }
    }
}

impl fmt::Display for GatewayAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (port {})", self.destination, self.hbone_mtls_port)
    }
}

/// Why a `"<network>/<ip>"` or `"<namespace>/<hostname>"` string is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not of the form {expected}")]
pub struct AddressParseError {
    value: String,
    expected: &'static str,
}

impl FromStr for NetworkAddress {
    type Err = AddressParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err =
            || AddressParseError { value: s.to_owned(), expected: "\"<network>/<ip>\" (e.g. \"/10.0.0.1\")" };
        let (network, ip) = s.split_once('/').ok_or_else(err)?;
        let address = ip.parse().map_err(|_| err())?;
        Ok(NetworkAddress { network: network.to_owned(), address })
    }
}

impl FromStr for NamespacedHostname {
    type Err = AddressParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((namespace, hostname)) if !hostname.is_empty() && !hostname.contains('/') => {
                Ok(NamespacedHostname { namespace: namespace.to_owned(), hostname: hostname.to_owned() })
            }
            _ => Err(AddressParseError { value: s.to_owned(), expected: "\"<namespace>/<hostname>\"" }),
        }
    }
}

impl FromStr for Destination {
    type Err = AddressParseError;

    /// `"<network>/<ip>"` if the part after `/` is an IP, else `"<namespace>/<hostname>"`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.parse::<NetworkAddress>() {
            Ok(a) => Ok(Destination::Address(a)),
            Err(_) => s.parse().map(Destination::Hostname),
        }
    }
}

macro_rules! string_serde {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
string_serde!(NetworkAddress);
string_serde!(NamespacedHostname);
string_serde!(Destination);

fn default_capacity() -> u32 {
    1
}

fn default_hbone_port() -> u16 {
    HBONE_PORT
}

fn non_empty_or<'a>(s: &'a str, default: &'a str) -> &'a str {
    if s.is_empty() { default } else { s }
}
