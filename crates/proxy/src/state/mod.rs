//! Workloads, services and policies: the model, its sources (local YAML, xDS protos), an
//! indexed immutable snapshot, outbound/inbound routing decisions and the snapshot publisher.
//!
//! A [`State`] is never mutated once published; per-connection lookups go through its hash
//! indices without locks or allocation. Its maps are persistent (`imbl`): cloning a snapshot is
//! O(1) and [`State::apply`] makes the next one from a [`Delta`] in O(log n) per changed resource,
//! sharing everything else, so one xDS update never rebuilds the state. Every source goes through
//! `apply`, the local file too ([`State::from_config`]). [`StateStore`] swaps snapshots atomically.
//!
//! Not yet supported: double HBONE (cross-network through an east-west gateway) returns
//! [`RouteError::DoubleHboneUnsupported`], and workloads reachable only by DNS hostname return
//! [`RouteError::HostnameOnlyWorkload`].

mod config;
mod delta;
mod endpoints;
mod inbound;
mod model;
mod pieces;
mod proto;
mod route;
mod store;
mod to_proto;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use imbl::{HashMap, OrdMap};
use ipnet::IpNet;

use crate::authz::Authorization;

pub use config::{LocalConfig, LocalConfigError};
pub use delta::{Applied, Delta, Rejected};
pub use inbound::{Authority, InboundError};
#[cfg(any(test, feature = "testing"))]
pub use model::WorkloadSpec;
pub use model::{DEFAULT_SERVICE_ACCOUNT, EndpointSet, IpFamily, Protocol, Service, Workload};
// The generated meshes of `crate::testing` build these too.
#[cfg(any(test, feature = "testing"))]
pub use model::{HealthStatus, Locality, NetworkAddress, NetworkMode, Visibility};
pub use proto::{Address, ProtoError};
pub use route::{Route, RouteKind};
pub(crate) use store::{RELEASE_AFTER, release_freed};
pub use store::{StateStore, load_local_file, watch_local_file};

/// An index key (shared with the values it names, so a copied index node copies no string).
type Key = Arc<str>;

/// The items under one index key, sorted by the index's order; copied on change (an index key
/// holds a handful of items: the workloads at one address, the services with one VIP).
type List<T> = Arc<[Arc<T>]>;

/// Snapshot with indices (uid; (network, ip) with the rank rule of §1.6; service VIP exact +
/// CIDR; hostname; policies by key and by namespace/global; node-local index). Every map is
/// persistent: see the module docs.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// Workloads on this node are node-local; `None` makes every workload node-local.
    node_name: Option<Key>,
    /// By uid. The two maps with an entry per workload are B-trees (`OrdMap`: 64 entries to a
    /// node, about 40 bytes per entry), not hash tries (`HashMap`: a mostly empty 16- or 32-slot
    /// node per few entries at this size, 150–230 bytes per entry).
    workloads: OrdMap<Key, Arc<Workload>>,
    /// network → ip → every workload there, best by rank first (ties: lowest uid).
    workloads_by_addr: HashMap<Key, OrdMap<IpAddr, List<Workload>>>,
    /// hostname → uid → workload (for hostname gateways without a service).
    workloads_by_hostname: HashMap<Key, HashMap<Key, Arc<Workload>>>,
    /// Node-local workloads: namespace → (name, uid) → workload (without a node name every
    /// workload is node-local: one B-tree entry each, not a map per name).
    local_workloads: HashMap<Key, OrdMap<(Key, Key), Arc<Workload>>>,
    /// `ns/hostname` → service.
    services: HashMap<Key, Arc<Service>>,
    /// hostname → services (one per namespace), by namespace.
    services_by_hostname: HashMap<Key, List<Service>>,
    /// network → VIP → services, by `ns/hostname`.
    services_by_vip: HashMap<Key, HashMap<IpAddr, List<Service>>>,
    /// (network, range, service) for every CIDR VIP, by service key.
    services_by_cidr: Arc<Vec<(Key, IpNet, Arc<Service>)>>,
    /// Endpoints whose service is unknown: `ns/hostname` → uid → endpoint (any health).
    staged: HashMap<Key, EndpointSet>,
    /// Unhealthy endpoints of known services that keep only healthy ones, kept so that a
    /// service that starts allowing unhealthy endpoints gets them back.
    held: HashMap<Key, EndpointSet>,
    policies: HashMap<Key, Arc<Authorization>>,
    /// Namespace-scoped policies by namespace, global ones under ""; by key.
    policies_by_namespace: HashMap<Key, List<Authorization>>,
}

impl State {
    /// An empty snapshot; `node_name` restricts the node-local index (`None` = every workload
    /// is node-local).
    pub fn new(node_name: Option<&str>) -> State {
        State { node_name: node_name.map(Key::from), ..State::default() }
    }

    /// Builds a snapshot from a configuration (through [`State::apply`]); `node_name` restricts
    /// the node-local index (`None` = every workload is node-local). A configuration is taken
    /// whole or not at all: the first resource [`State::apply`] rejects is the error.
    pub fn from_config(cfg: LocalConfig, node_name: Option<&str>) -> Result<State, LocalConfigError> {
        let (state, applied) = State::new(node_name).apply(Delta::from(cfg));
        match applied.rejected.into_iter().next() {
            None => Ok(state),
            Some(r) => Err(r.into_config_error()),
        }
    }

    /// Workload by uid.
    pub fn workload_by_uid(&self, uid: &str) -> Option<Arc<Workload>> {
        self.workloads.get(uid).cloned()
    }

    /// Best workload (by the §1.6 rank) at `(network, ip)`; host-network workloads are not indexed.
    pub fn workload_by_addr(&self, network: &str, ip: IpAddr) -> Option<Arc<Workload>> {
        self.workloads_by_addr.get(network)?.get(&ip)?.first().cloned()
    }

    /// The proxy's own workload by (namespace, name, service account) among node-local workloads
    /// (the lowest uid if several match).
    pub fn find_local(&self, namespace: &str, name: &str, service_account: &str) -> Option<Arc<Workload>> {
        let service_account =
            if service_account.is_empty() { DEFAULT_SERVICE_ACCOUNT } else { service_account };
        let by_name = self.local_workloads.get(namespace)?;
        // Entries of one name are together, by uid.
        let first: (Key, Key) = (name.into(), "".into());
        lowest_uid(
            by_name
                .range(first..)
                .take_while(|((n, _), _)| &**n == name)
                .map(|(_, w)| w)
                .filter(|w| w.effective_service_account() == service_account),
        )
    }

    /// Policies that apply to a workload (namespace + global + its listed keys; unknown keys skipped).
    pub fn policies_for(&self, w: &Workload) -> Vec<Arc<Authorization>> {
        let mut out: Vec<Arc<Authorization>> = Vec::new();
        let scoped = [w.namespace.as_str(), ""]
            .into_iter()
            .filter_map(|ns| self.policies_by_namespace.get(ns))
            .flat_map(|list| list.iter());
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
        self.services_by_hostname.get(hostname).map_or(&[], |l| &l[..])
    }

    /// Service by namespace and hostname.
    pub fn service_by_name(&self, namespace: &str, hostname: &str) -> Option<Arc<Service>> {
        self.services_with_hostname(hostname).iter().find(|s| s.namespace == namespace).cloned()
    }

    /// Service by its key `"<namespace>/<hostname>"` (its xDS resource name).
    #[cfg(test)]
    pub fn service_by_key(&self, key: &str) -> Option<Arc<Service>> {
        self.services.get(key).cloned()
    }

    /// Best service with `hostname`, preferring `namespace`, then canonical, then the first.
    pub fn service_by_hostname(&self, hostname: &str, namespace: &str) -> Option<Arc<Service>> {
        best(self.services_with_hostname(hostname).iter(), |s| (s.namespace == namespace, s.canonical))
            .cloned()
    }

    /// Service whose VIP is `(network, ip)` as seen by a client in `client_namespace`: exact VIPs
    /// first (visible ones; same namespace, then canonical, then the lowest `ns/hostname`), then
    /// CIDR VIPs (same namespace, longest prefix, canonical).
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
                .filter(|(n, cidr, s)| **n == *network && cidr.contains(&ip) && visible(s)),
            |(_, cidr, s)| (same_ns(s), cidr.prefix_len(), s.canonical),
        )
        .map(|(_, _, s)| s.clone())
    }

    /// All services, sorted by hostname then namespace.
    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        let mut all: Vec<&Arc<Service>> = self.services.values().collect();
        all.sort_by(|a, b| (&a.hostname, &a.namespace).cmp(&(&b.hostname, &b.namespace)));
        all.into_iter()
    }

    /// All workloads (unordered).
    #[cfg(any(test, feature = "testing"))]
    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    /// All policies (unordered).
    #[cfg(any(test, feature = "testing"))]
    pub fn policies(&self) -> impl Iterator<Item = &Arc<Authorization>> {
        self.policies.values()
    }

    /// Number of workloads, services and policies.
    #[cfg(any(test, feature = "testing"))]
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.workloads.len(), self.services.len(), self.policies.len())
    }

    /// Whether anything authorization decisions read differs between two snapshots built
    /// independently (a whole local file replaced): the policy set, or a node-local workload's
    /// namespace, identity or policy list (the rule [`Applied::authorization_changed`]
    /// follows). O(n); an incremental update knows the answer
    /// from [`State::apply`] instead.
    #[cfg(test)]
    pub fn authorization_differs(&self, other: &State) -> bool {
        let policies_differ = self.policies.len() != other.policies.len()
            || self.policies.iter().any(|(k, p)| other.policies.get(k).is_none_or(|q| q != p));
        policies_differ
            || self.workloads.iter().any(|(uid, w)| {
                delta::authorization_inputs_differ(
                    &self.node_name,
                    Some(w),
                    other.workloads.get(uid).map(|w| &**w),
                )
            })
            || other.workloads.iter().any(|(uid, w)| {
                !self.workloads.contains_key(uid)
                    && delta::authorization_inputs_differ(&other.node_name, None, Some(w))
            })
    }

    /// JSON for /config_dump: workloads sorted by uid, services sorted by hostname, policies sorted by key (camelCase, as §7.3).
    pub fn dump(&self) -> serde_json::Value {
        let mut workloads: Vec<&Workload> = self.workloads.values().map(|w| &**w).collect();
        workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
        let services: Vec<&Service> = self.services().map(|s| &**s).collect();
        let mut policies: Vec<(&Key, &Authorization)> =
            self.policies.iter().map(|(k, p)| (k, &**p)).collect();
        policies.sort_by(|a, b| a.0.cmp(b.0));
        let policies: Vec<&Authorization> = policies.into_iter().map(|(_, p)| p).collect();
        let staged: BTreeMap<&str, &EndpointSet> = self.staged.iter().map(|(k, e)| (&**k, e)).collect();
        serde_json::json!({
            "workloads": workloads,
            "services": services,
            "policies": policies,
            "stagedServices": staged,
        })
    }

    /// A workload whose hostname and namespace match (for hostname gateways without a service).
    fn workload_by_hostname(&self, namespace: &str, hostname: &str) -> Option<Arc<Workload>> {
        lowest_uid(self.workloads_by_hostname.get(hostname)?.values().filter(|w| w.namespace == namespace))
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

/// The workload with the lowest uid (a deterministic choice among several that match).
fn lowest_uid<'a>(ws: impl Iterator<Item = &'a Arc<Workload>>) -> Option<Arc<Workload>> {
    ws.min_by(|a, b| a.uid.cmp(&b.uid)).cloned()
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
