//! The internal workload and service model, in the camelCase shape of ztunnel's local config.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use ambit_identity::Identity;

use crate::name::Name;
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplicationTunnel {
    /// Tunnel protocol.
    #[serde(default)]
    pub protocol: AppTunnelProtocol,
    /// Port to deliver to instead of the original one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// Application tunnel protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    #[serde(default)]
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

/// One endpoint of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// The workload.
    pub workload_uid: Arc<str>,
    /// This endpoint's service port → target port map.
    #[serde(default)]
    pub port: PortMap,
    /// Health.
    #[serde(default)]
    pub status: HealthStatus,
}

/// A service's endpoints by workload uid.
///
/// A persistent map: a copy of a service with one endpoint changed shares every other endpoint
/// with the original (O(log n) time and memory, never a copy of the set), so one workload update
/// does not copy a service of 10 000 endpoints. Serialised as a map sorted by uid.
#[derive(Clone, Default)]
pub struct EndpointSet(imbl::HashMap<Arc<str>, Arc<Endpoint>>);

impl EndpointSet {
    /// The endpoint of workload `uid`.
    pub fn get(&self, uid: &str) -> Option<&Endpoint> {
        self.0.get(uid).map(|e| &**e)
    }

    /// Whether workload `uid` is an endpoint.
    pub fn contains_key(&self, uid: &str) -> bool {
        self.0.contains_key(uid)
    }

    /// Adds or replaces the endpoint of workload `uid`; returns the one replaced.
    pub fn insert(
        &mut self,
        uid: impl Into<Arc<str>>,
        endpoint: impl Into<Arc<Endpoint>>,
    ) -> Option<Arc<Endpoint>> {
        self.0.insert(uid.into(), endpoint.into())
    }

    /// Removes the endpoint of workload `uid`.
    pub fn remove(&mut self, uid: &str) -> Option<Arc<Endpoint>> {
        self.0.remove(uid)
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no endpoint.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The endpoints' workload uids (unordered).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(|k| &**k)
    }

    /// The endpoints (unordered).
    pub fn values(&self) -> impl Iterator<Item = &Endpoint> {
        self.0.values().map(|e| &**e)
    }

    /// `(uid, endpoint)` pairs (unordered).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Endpoint)> {
        self.0.iter().map(|(k, e)| (&**k, &**e))
    }

    /// Keeps the endpoints for which `keep` holds.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &Endpoint) -> bool) {
        self.0.retain(|k, e| keep(k, e));
    }

    /// Whether both hold the same storage (then they are equal without looking further).
    pub(crate) fn ptr_eq(&self, other: &Self) -> bool {
        self.0.ptr_eq(&other.0)
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<Endpoint>)> {
        self.0.iter()
    }

    fn sorted(&self) -> BTreeMap<&str, &Endpoint> {
        self.iter().collect()
    }
}

impl PartialEq for EndpointSet {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || self.0 == other.0
    }
}

impl Eq for EndpointSet {}

impl fmt::Debug for EndpointSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.sorted()).finish()
    }
}

impl Serialize for EndpointSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.sorted().serialize(s)
    }
}

impl<'de> Deserialize<'de> for EndpointSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, Endpoint>::deserialize(d)?;
        Ok(map.into_iter().collect())
    }
}

impl<K: Into<Arc<str>>, E: Into<Arc<Endpoint>>> FromIterator<(K, E)> for EndpointSet {
    fn from_iter<I: IntoIterator<Item = (K, E)>>(iter: I) -> Self {
        EndpointSet(iter.into_iter().map(|(k, e)| (k.into(), e.into())).collect())
    }
}

/// Service port → target port (0: the named port, resolved per endpoint), sorted by service
/// port: a workload's few ports in one small shared slice, not a tree (a workload's map and its
/// endpoint's are the same allocation).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct PortMap(Arc<[(u16, u16)]>);

impl PortMap {
    /// The target port of service port `port`.
    pub fn get(&self, port: &u16) -> Option<&u16> {
        self.0.binary_search_by_key(port, |(s, _)| *s).ok().map(|i| &self.0[i].1)
    }

    /// `(service port, target port)` pairs, by service port.
    pub fn iter(&self) -> impl Iterator<Item = (&u16, &u16)> {
        self.0.iter().map(|(s, t)| (s, t))
    }

    /// The target ports, by service port.
    pub fn values(&self) -> impl Iterator<Item = &u16> {
        self.0.iter().map(|(_, t)| t)
    }

    /// Number of ports.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no port.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(u16, u16)> for PortMap {
    /// Sorted by service port; the last target of a service port listed twice wins (as a map).
    fn from_iter<I: IntoIterator<Item = (u16, u16)>>(iter: I) -> Self {
        BTreeMap::from_iter(iter).into()
    }
}

impl From<BTreeMap<u16, u16>> for PortMap {
    fn from(map: BTreeMap<u16, u16>) -> Self {
        PortMap(map.into_iter().collect())
    }
}

impl PartialEq<BTreeMap<u16, u16>> for PortMap {
    fn eq(&self, other: &BTreeMap<u16, u16>) -> bool {
        self.len() == other.len() && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl fmt::Debug for PortMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for PortMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for PortMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        BTreeMap::<u16, u16>::deserialize(d).map(PortMap::from)
    }
}

/// The services a workload is an endpoint of: `"<ns>/<hostname>"` (interned: shared by every
/// endpoint of the service) → this workload's port map, sorted by key. A workload is in a
/// handful of services, so a sorted vector, not a tree.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ServicePorts(Vec<(Name, PortMap)>);

impl ServicePorts {
    /// The port map of service `key`.
    pub fn get(&self, key: &str) -> Option<&PortMap> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    /// Whether the workload is an endpoint of service `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Adds or replaces service `key`; returns the port map replaced.
    pub fn insert(&mut self, key: impl Into<Name>, ports: impl Into<PortMap>) -> Option<PortMap> {
        let key = key.into();
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, ports.into())),
            Err(i) => {
                self.0.insert(i, (key, ports.into()));
                None
            }
        }
    }

    /// Removes every service.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// The service keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &Name> {
        self.0.iter().map(|(k, _)| k)
    }

    /// `(service key, port map)` pairs, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&Name, &PortMap)> {
        self.0.iter().map(|(k, p)| (k, p))
    }

    /// Number of services.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the workload is in no service.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }
}

impl std::ops::Index<&str> for ServicePorts {
    type Output = PortMap;

    fn index(&self, key: &str) -> &PortMap {
        self.get(key).expect("no such service key")
    }
}

impl<K: Into<Name>, P: Into<PortMap>> FromIterator<(K, P)> for ServicePorts {
    fn from_iter<I: IntoIterator<Item = (K, P)>>(iter: I) -> Self {
        let mut out = ServicePorts::default();
        for (k, p) in iter {
            out.insert(k, p);
        }
        out.0.shrink_to_fit();
        out
    }
}

impl fmt::Debug for ServicePorts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for ServicePorts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for ServicePorts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(BTreeMap::<String, PortMap>::deserialize(d)?.into_iter().collect())
    }
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
