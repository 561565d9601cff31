//! Workloads, services and policies: the model, its sources (local YAML, xDS protos), an
//! indexed immutable snapshot, outbound/inbound routing decisions and the snapshot publisher.
//!
//! A [`State`] is built once per configuration change and never mutated; per-connection
//! lookups go through its hash indices without locks or allocation. [`StateStore`] swaps
//! snapshots atomically.
//!
//! Not yet supported: double HBONE (cross-network through an east-west gateway) returns
//! [`RouteError::DoubleHboneUnsupported`], and workloads reachable only by DNS hostname return
//! [`RouteError::HostnameOnlyWorkload`].

mod config;
mod inbound;
mod model;
mod proto;
mod route;
mod store;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::authz::{Authorization, Scope};

pub use config::{
    LocalConfig, LocalConfigError, MAX_FILE_BYTES, MAX_POLICIES, MAX_SERVICES, MAX_WORKLOADS, Position,
};
pub use inbound::{Authority, AuthorityError, InboundError};
pub use model::{
    AddressParseError, AppTunnelProtocol, ApplicationTunnel, CidrVip, DEFAULT_CLUSTER_ID,
    DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN, Destination, Endpoint, GatewayAddress, HBONE_PORT,
    HealthPolicy, HealthStatus, IpFamily, LoadBalancer, LoadBalancerMode, LoadBalancerScope, Locality,
    NamespacedHostname, NetworkAddress, NetworkMode, Protocol, Service, Visibility, WeightedWaypoint,
    Workload,
};
pub use proto::{Address, ProtoError};
pub use route::{Route, RouteError, RouteKind};
pub use store::{StateStore, watch_local_file};

/// Immutable snapshot with indices (uid; (network, ip) with the rank rule of §1.6; service VIP
/// exact + CIDR; hostname; policies by key and by namespace/global; node-local identity index).
#[derive(Debug, Default)]
pub struct State {
    workloads: HashMap<String, Arc<Workload>>,
    /// network → ip → best workload by rank.
    workloads_by_addr: HashMap<String, HashMap<IpAddr, Arc<Workload>>>,
    /// hostname → workloads (for hostname gateways without a service).
    workloads_by_hostname: HashMap<String, Vec<Arc<Workload>>>,
    /// Node-local workloads: namespace → service account → workloads (sorted by uid).
    local_identities: HashMap<String, HashMap<String, Vec<Arc<Workload>>>>,
    /// All services sorted by (hostname, namespace).
    services: Vec<Arc<Service>>,
    /// hostname → services (one per namespace).
    services_by_hostname: HashMap<String, Vec<Arc<Service>>>,
    /// network → VIP → services (one per namespace).
    services_by_vip: HashMap<String, HashMap<IpAddr, Vec<Arc<Service>>>>,
    services_by_cidr: Vec<(String, IpNet, Arc<Service>)>,
    /// Endpoints whose service is unknown: `ns/hostname` → uid → endpoint.
    staged: BTreeMap<String, BTreeMap<String, Endpoint>>,
    policies: HashMap<String, Arc<Authorization>>,
    /// Namespace-scoped policies by namespace; global ones under "".
    policies_by_namespace: HashMap<String, Vec<Arc<Authorization>>>,
}

impl State {
    /// Builds a snapshot from a configuration; `node_name` restricts the node-local index
    /// (`None` = every workload is node-local).
    pub fn from_config(cfg: LocalConfig, node_name: Option<&str>) -> Result<State, LocalConfigError> {
        let mut state = State::default();

        // Services first, keyed by ns/hostname; a later duplicate replaces an earlier one.
        let mut services: BTreeMap<String, Service> = BTreeMap::new();
        for mut svc in cfg.services {
            if svc.hostname.is_empty() {
                return Err(LocalConfigError::EmptyHostname { namespace: svc.namespace, name: svc.name });
            }
            let allow_unhealthy = svc.allows_unhealthy();
            svc.endpoints.retain(|_, ep| allow_unhealthy || ep.status == HealthStatus::Healthy);
            services.insert(svc.key(), svc);
        }

        // Workloads: a later duplicate uid replaces an earlier one.
        let mut workloads: BTreeMap<String, Workload> = BTreeMap::new();
        for w in cfg.workloads {
            for key in w.services.keys() {
                if !key.contains('/') {
                    return Err(LocalConfigError::ServiceKey { uid: w.uid.clone(), key: key.clone() });
                }
            }
            workloads.insert(w.uid.clone(), w);
        }

        // Endpoints from workloads' service port maps (health-filtered), or staged.
        for w in workloads.values() {
            for (key, ports) in &w.services {
                let ep = Endpoint { workload_uid: w.uid.clone(), port: ports.clone(), status: w.status };
                match services.get_mut(key) {
                    Some(svc) => {
                        if ep.status == HealthStatus::Healthy || svc.allows_unhealthy() {
                            svc.endpoints.insert(w.uid.clone(), ep);
                        }
                    }
                    None => {
                        state.staged.entry(key.clone()).or_default().insert(w.uid.clone(), ep);
                    }
                }
            }
        }

        for (_, w) in workloads {
            state.insert_workload(Arc::new(w), node_name);
        }
        for (_, svc) in services {
            state.insert_service(Arc::new(svc));
        }
        state.services.sort_by(|a, b| (&a.hostname, &a.namespace).cmp(&(&b.hostname, &b.namespace)));
        for list in state.local_identities.values_mut().flat_map(|m| m.values_mut()) {
            list.sort_by(|a, b| a.uid.cmp(&b.uid));
        }

        for p in cfg.policies {
            let p = Arc::new(p);
            state.policies.insert(p.key(), p);
        }
        let mut keys: Vec<&String> = state.policies.keys().collect();
        keys.sort();
        for key in keys {
            let p = &state.policies[key];
            let ns = match p.scope {
                Scope::Global => "",
                Scope::Namespace => p.namespace.as_str(),
                Scope::WorkloadSelector => continue,
            };
            state.policies_by_namespace.entry(ns.to_owned()).or_default().push(p.clone());
        }
        Ok(state)
    }

    /// Workload by uid.
    pub fn workload_by_uid(&self, uid: &str) -> Option<Arc<Workload>> {
        self.workloads.get(uid).cloned()
    }

    /// Best workload (by the §1.6 rank) at `(network, ip)`; host-network workloads are not indexed.
    pub fn workload_by_addr(&self, network: &str, ip: IpAddr) -> Option<Arc<Workload>> {
        self.workloads_by_addr.get(network)?.get(&ip).cloned()
    }

    /// The proxy's own workload by (namespace, name, service account) among node-local workloads.
    pub fn find_local(&self, namespace: &str, name: &str, service_account: &str) -> Option<Arc<Workload>> {
        let service_account =
            if service_account.is_empty() { DEFAULT_SERVICE_ACCOUNT } else { service_account };
        self.local_identities.get(namespace)?.get(service_account)?.iter().find(|w| w.name == name).cloned()
    }

    /// Policies that apply to a workload (namespace + global + its listed keys; unknown keys skipped).
    pub fn policies_for(&self, w: &Workload) -> Vec<Arc<Authorization>> {
        let mut out: Vec<Arc<Authorization>> = Vec::new();
        let scoped = [w.namespace.as_str(), ""]
            .into_iter()
            .filter_map(|ns| self.policies_by_namespace.get(ns))
            .flatten();
        let listed = w.authorization_policies.iter().filter_map(|k| self.policies.get(k.as_str()));
        for p in scoped.chain(listed) {
            if !out.iter().any(|q| Arc::ptr_eq(p, q)) {
                out.push(p.clone());
            }
        }
        out
    }

    /// Every service named `hostname`, one per namespace, in namespace order.
    pub fn services_with_hostname(&self, hostname: &str) -> &[Arc<Service>] {
        self.services_by_hostname.get(hostname).map_or(&[], Vec::as_slice)
    }

    /// Service by namespace and hostname.
    pub fn service_by_name(&self, namespace: &str, hostname: &str) -> Option<Arc<Service>> {
        self.services_by_hostname.get(hostname)?.iter().find(|s| s.namespace == namespace).cloned()
    }

    /// Best service with `hostname`, preferring `namespace`, then canonical, then the first.
    pub fn service_by_hostname(&self, hostname: &str, namespace: &str) -> Option<Arc<Service>> {
        best(self.services_by_hostname.get(hostname)?.iter(), |s| (s.namespace == namespace, s.canonical))
            .cloned()
    }

    /// Service whose VIP is `(network, ip)` as seen by a client in `client_namespace`: exact VIPs
    /// first (visible ones; same namespace, then canonical, then first), then CIDR VIPs (same
    /// namespace, longest prefix, canonical).
    pub fn service_by_vip(&self, network: &str, ip: IpAddr, client_namespace: &str) -> Option<Arc<Service>> {
        self.lookup_vip(network, ip, Some(client_namespace))
    }

    /// VIP lookup; `client_namespace` = `None` ignores visibility and namespace preference
    /// (used for waypoint and gateway references, which are infrastructure).
    fn lookup_vip(&self, network: &str, ip: IpAddr, client_namespace: Option<&str>) -> Option<Arc<Service>> {
        let visible = |s: &Service| client_namespace.is_none_or(|ns| s.visible_to(ns));
        let same_ns = |s: &Service| client_namespace == Some(s.namespace.as_str());
        let exact = self
            .services_by_vip
            .get(network)
            .and_then(|m| m.get(&ip))
            .and_then(|list| best(list.iter().filter(|s| visible(s)), |s| (same_ns(s), s.canonical)));
        if let Some(s) = exact {
            return Some(s.clone());
        }
        best(
            self.services_by_cidr
                .iter()
                .filter(|(n, cidr, s)| n == network && cidr.contains(&ip) && visible(s)),
            |(_, cidr, s)| (same_ns(s), cidr.prefix_len(), s.canonical),
        )
        .map(|(_, _, s)| s.clone())
    }

    /// All services, sorted by hostname then namespace.
    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.iter()
    }

    /// All workloads (unordered).
    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    /// All policies (unordered).
    pub fn policies(&self) -> impl Iterator<Item = &Arc<Authorization>> {
        self.policies.values()
    }

    /// Whether two snapshots hold the same policy set (by key and content).
    pub fn same_policies(&self, other: &State) -> bool {
        self.policies.len() == other.policies.len()
            && self.policies.iter().all(|(k, p)| other.policies.get(k).is_some_and(|q| q == p))
    }

    /// JSON for /config_dump: workloads sorted by uid, services sorted by hostname, policies sorted by key (camelCase, as §7.3).
    pub fn dump(&self) -> serde_json::Value {
        let mut workloads: Vec<&Workload> = self.workloads.values().map(|w| &**w).collect();
        workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
        let services: Vec<&Service> = self.services.iter().map(|s| &**s).collect();
        let mut policies: Vec<(String, &Authorization)> =
            self.policies.iter().map(|(k, p)| (k.clone(), &**p)).collect();
        policies.sort_by(|a, b| a.0.cmp(&b.0));
        let policies: Vec<&Authorization> = policies.into_iter().map(|(_, p)| p).collect();
        serde_json::json!({
            "workloads": workloads,
            "services": services,
            "policies": policies,
            "stagedServices": self.staged,
        })
    }

    fn insert_workload(&mut self, w: Arc<Workload>, node_name: Option<&str>) {
        if w.network_mode != NetworkMode::HostNetwork {
            let by_ip = self.workloads_by_addr.entry(w.network.clone()).or_default();
            for ip in &w.workload_ips {
                match by_ip.get(ip) {
                    // Equal rank: the first inserted (lowest uid) stays, for determinism.
                    Some(existing) if address_rank(existing) >= address_rank(&w) => {}
                    _ => {
                        by_ip.insert(*ip, w.clone());
                    }
                }
            }
        }
        if !w.hostname.is_empty() {
            self.workloads_by_hostname.entry(w.hostname.clone()).or_default().push(w.clone());
        }
        if node_name.is_none_or(|n| n == w.node) {
            self.local_identities
                .entry(w.namespace.clone())
                .or_default()
                .entry(w.effective_service_account().to_owned())
                .or_default()
                .push(w.clone());
        }
        self.workloads.insert(w.uid.clone(), w);
    }

    fn insert_service(&mut self, svc: Arc<Service>) {
        let same_ns = |list: &mut Vec<Arc<Service>>, svc: &Arc<Service>| {
            list.retain(|s| s.namespace != svc.namespace);
            list.push(svc.clone());
        };
        same_ns(self.services_by_hostname.entry(svc.hostname.clone()).or_default(), &svc);
        for vip in &svc.vips {
            same_ns(
                self.services_by_vip.entry(vip.network.clone()).or_default().entry(vip.address).or_default(),
                &svc,
            );
        }
        for c in &svc.cidr_vips {
            self.services_by_cidr.push((c.network.clone(), c.cidr, svc.clone()));
        }
        self.services.push(svc);
    }

    /// A workload whose hostname and namespace match (for hostname gateways without a service).
    fn workload_by_hostname(&self, namespace: &str, hostname: &str) -> Option<Arc<Workload>> {
        self.workloads_by_hostname.get(hostname)?.iter().find(|w| w.namespace == namespace).cloned()
    }
}

/// §1.6 address rank: Pod with HBONE > Pod > HBONE > other.
fn address_rank(w: &Workload) -> u8 {
    match (w.is_pod(), w.protocol == Protocol::Hbone) {
        (true, true) => 3,
        (true, false) => 2,
        (false, true) => 1,
        (false, false) => 0,
    }
}

/// The first item with the greatest key.
fn best<T, K: Ord>(items: impl Iterator<Item = T>, key: impl Fn(&T) -> K) -> Option<T> {
    let mut best: Option<(K, T)> = None;
    for item in items {
        let k = key(&item);
        if best.as_ref().is_none_or(|(bk, _)| k > *bk) {
            best = Some((k, item));
        }
    }
    best.map(|(_, t)| t)
}
