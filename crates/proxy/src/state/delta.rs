//! Changing a snapshot: a [`Delta`] in, the next [`State`] and what changed ([`Applied`]) out,
//! with the indexing rules of node-proxy.md §1.6.
//!
//! Every source goes through [`State::apply`]: the local file ([`State::from_config`] applies the
//! whole file to an empty state) and xDS (one response is one delta). Applying clones the
//! snapshot (O(1): persistent maps) and changes only what the delta names, O(log n) per
//! resource plus the handful of items under the index keys it touches:
//!
//! - a workload replaced by uid first leaves every index entry of its old version (addresses,
//!   hostname, node-local index, endpoints), so a workload moved to another IP leaves nothing
//!   behind; an unchanged resend is a no-op;
//! - the workloads at one address are all kept, best by rank first (§1.6, ties: lowest uid), so
//!   removing the best one leaves the next best, not a hole;
//! - an endpoint whose service is unknown is staged under `ns/hostname` and moves into the
//!   service when it arrives; a removed service's endpoints go back to staged; a service update
//!   carries its endpoints over (the set is shared, not copied);
//! - unhealthy endpoints of a service that keeps only healthy ones are held aside and come back
//!   if the service starts allowing them;
//! - updates apply before removals (§1.4); an address removal name is a workload uid, else
//!   `ns/hostname` (a name whose hostname part holds `/` names nothing);
//! - a resource that cannot apply (a service without hostname, a bad `services` key) is rejected
//!   with its reason in [`Applied::rejected`]; the rest of the delta applies.

use std::cmp::{Ordering, Reverse};
use std::hash::Hash;
use std::sync::Arc;

use ambit_api::security as pb_security;
use ambit_api::workload as pb;
use imbl::{HashMap, OrdMap};

use super::model::{Endpoint, EndpointSet, HealthStatus, NamespacedHostname, NetworkMode, Service, Workload};
use super::{Address, Key, List, LocalConfig, LocalConfigError, ProtoError, State, address_rank};
use crate::authz::{Authorization, ConvertError, Scope};
use crate::name::Name;

/// Changes to apply to a snapshot in one step (one xDS response, or a whole local file).
#[derive(Clone, Debug, Default)]
pub struct Delta {
    /// Workloads added or replaced (by uid).
    pub workloads: Vec<Workload>,
    /// Services added or replaced (by `ns/hostname`).
    pub services: Vec<Service>,
    /// Address resources removed: a workload uid, else a service's `ns/hostname`.
    pub removed_addresses: Vec<String>,
    /// Policies added or replaced (by `ns/name`).
    pub policies: Vec<Authorization>,
    /// Policies removed, by `ns/name`.
    pub removed_policies: Vec<String>,
}

/// What [`State::apply`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Whether the new snapshot differs from the old one at all.
    pub changed: bool,
    /// Whether anything authorization decisions read changed: a policy added, changed or removed,
    /// or a node-local workload added or removed with a policy list, or its namespace, identity
    /// or policy list changed. Only then must live connections be re-evaluated.
    pub authorization_changed: bool,
    /// Resources that were not applied, with why.
    pub rejected: Vec<Rejected>,
}

/// A resource refused, by its name (workload uid, `ns/hostname`, policy `ns/name`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {reason}")]
pub struct Rejected {
    /// The resource's name.
    pub name: String,
    /// Why.
    pub reason: RejectReason,
}

/// Why a resource was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RejectReason {
    /// An xDS Address resource does not convert.
    #[error(transparent)]
    Address(#[from] ProtoError),
    /// An xDS Authorization resource does not convert.
    #[error(transparent)]
    Policy(#[from] ConvertError),
    /// A service has an empty hostname.
    #[error("service {namespace}/{name}: hostname must not be empty")]
    EmptyHostname {
        /// Service namespace.
        namespace: String,
        /// Service name.
        name: String,
    },
    /// A workload's `services` key is not `<namespace>/<hostname>`.
    #[error("workload {uid:?}: services key {key:?} is not of the form \"<namespace>/<hostname>\"")]
    ServiceKey {
        /// The workload.
        uid: String,
        /// The bad key.
        key: String,
    },
}

impl Rejected {
    /// The local-config error for a resource of the file refused.
    pub(super) fn into_config_error(self) -> LocalConfigError {
        match self.reason {
            RejectReason::EmptyHostname { namespace, name } => {
                LocalConfigError::EmptyHostname { namespace, name }
            }
            RejectReason::ServiceKey { uid, key } => LocalConfigError::ServiceKey { uid, key },
            _ => LocalConfigError::Rejected(self),
        }
    }
}

impl Delta {
    /// Whether the delta changes nothing.
    pub fn is_empty(&self) -> bool {
        self.workloads.is_empty()
            && self.services.is_empty()
            && self.removed_addresses.is_empty()
            && self.policies.is_empty()
            && self.removed_policies.is_empty()
    }

    /// Converts one xDS `istio.workload.Address` resource named `name` into this delta, or says
    /// why it cannot be used (the resource is then NACKed; the rest of the response applies).
    pub fn add_address(&mut self, name: &str, resource: pb::Address) -> Result<(), Rejected> {
        match Address::try_from(resource) {
            Ok(Address::Workload(w)) => self.workloads.push(w),
            Ok(Address::Service(s)) => self.services.push(s),
            Err(e) => return Err(Rejected { name: name.to_owned(), reason: e.into() }),
        }
        Ok(())
    }

    /// Converts one xDS `istio.security.Authorization` resource named `name` into this delta,
    /// or says why it cannot be used.
    pub fn add_authorization(
        &mut self,
        name: &str,
        resource: &pb_security::Authorization,
    ) -> Result<(), Rejected> {
        let p = Authorization::try_from(resource)
            .map_err(|e| Rejected { name: name.to_owned(), reason: e.into() })?;
        self.policies.push(p);
        Ok(())
    }
}

impl From<LocalConfig> for Delta {
    fn from(cfg: LocalConfig) -> Delta {
        Delta { workloads: cfg.workloads, services: cfg.services, policies: cfg.policies, ..Delta::default() }
    }
}

impl State {
    /// The snapshot with `delta` applied (updates first, then removals), and what changed. `self`
    /// is untouched; both share every unchanged part.
    pub fn apply(&self, delta: Delta) -> (State, Applied) {
        let mut next = self.clone();
        let mut applied = Applied::default();
        // Workloads before services: a bulk load stages endpoints and hands each service its set
        // whole, instead of copying the service once per endpoint.
        for w in delta.workloads {
            next.upsert_workload(w, &mut applied);
        }
        for s in delta.services {
            next.upsert_service(s, &mut applied);
        }
        for p in delta.policies {
            next.upsert_policy(p, &mut applied);
        }
        for name in &delta.removed_addresses {
            next.remove_address(name, &mut applied);
        }
        for key in &delta.removed_policies {
            next.remove_policy(key, &mut applied);
        }
        (next, applied)
    }

    fn is_local(&self, w: &Workload) -> bool {
        self.node_name.as_deref().is_none_or(|n| n == w.node)
    }

    fn upsert_workload(&mut self, w: Workload, applied: &mut Applied) {
        if let Some(key) = w.services.keys().find(|k| !k.contains('/')) {
            let reason = RejectReason::ServiceKey { uid: w.uid.to_string(), key: key.to_string() };
            applied.rejected.push(Rejected { name: w.uid.to_string(), reason });
            return;
        }
        let old = self.workloads.get(&*w.uid).cloned();
        if old.as_deref() == Some(&w) {
            return;
        }
        applied.changed = true;
        applied.authorization_changed |=
            authorization_inputs_differ(&self.node_name, old.as_deref(), Some(&w));
        let uid: Key = w.uid.clone();
        let w = Arc::new(w);
        if let Some(old) = &old {
            self.unindex_workload(old);
            for key in old.services.keys().filter(|k| !w.services.contains_key(k)) {
                self.drop_endpoint(&key.shared(), &uid);
            }
        }
        self.index_workload(&w);
        for (key, ports) in w.services.iter() {
            let ep = Endpoint { workload_uid: w.uid.clone(), port: ports.clone(), status: w.status };
            self.put_endpoint(&key.shared(), &uid, ep);
        }
        self.workloads.insert(uid, w);
    }

    fn remove_address(&mut self, name: &str, applied: &mut Applied) {
        if let Some(w) = self.workloads.remove(name) {
            applied.changed = true;
            applied.authorization_changed |= authorization_inputs_differ(&self.node_name, Some(&w), None);
            self.unindex_workload(&w);
            for key in w.services.keys() {
                self.drop_endpoint(&key.shared(), &w.uid);
            }
            return;
        }
        if name.parse::<NamespacedHostname>().is_ok() && self.remove_service(name) {
            applied.changed = true;
        }
    }

    fn index_workload(&mut self, w: &Arc<Workload>) {
        if w.network_mode != NetworkMode::HostNetwork && !w.workload_ips.is_empty() {
            edit(&mut self.workloads_by_addr, &w.network.shared(), |by_ip| {
                for ip in &w.workload_ips {
                    edit(by_ip, ip, |list| {
                        *list = with(list, w.clone(), |x| x.uid == w.uid, by_rank);
                        true
                    });
                }
                true
            });
        }
        let uid: Key = w.uid.clone();
        if !w.hostname.is_empty() {
            edit(&mut self.workloads_by_hostname, &w.hostname.shared(), |by_uid| {
                by_uid.insert(uid.clone(), w.clone());
                true
            });
        }
        if self.is_local(w) {
            edit(&mut self.local_workloads, &w.namespace.shared(), |by_name| {
                by_name.insert((w.name.clone(), uid.clone()), w.clone());
                true
            });
        }
    }

    fn unindex_workload(&mut self, w: &Workload) {
        let drop = |list: &mut List<Workload>| without(list, |x| x.uid == w.uid);
        if w.network_mode != NetworkMode::HostNetwork && !w.workload_ips.is_empty() {
            edit(&mut self.workloads_by_addr, &w.network.shared(), |by_ip| {
                for ip in &w.workload_ips {
                    edit(by_ip, ip, drop);
                }
                !by_ip.is_empty()
            });
        }
        let drop_uid = |by_uid: &mut HashMap<Key, Arc<Workload>>| {
            by_uid.remove(&*w.uid);
            !by_uid.is_empty()
        };
        if !w.hostname.is_empty() {
            edit(&mut self.workloads_by_hostname, &w.hostname.shared(), drop_uid);
        }
        if self.is_local(w) {
            edit(&mut self.local_workloads, &w.namespace.shared(), |by_name| {
                by_name.remove(&(w.name.clone(), w.uid.clone()));
                !by_name.is_empty()
            });
        }
    }

    /// Adds (or replaces) workload `uid`'s endpoint of service `key`: into the service, held
    /// aside when unhealthy and the service keeps only healthy ones, or staged.
    fn put_endpoint(&mut self, key: &Key, uid: &Key, ep: Endpoint) {
        let Some(svc) = self.services.get(key).cloned() else {
            edit(&mut self.staged, key, |set| {
                set.insert(uid.clone(), ep);
                true
            });
            return;
        };
        if ep.status == HealthStatus::Healthy || svc.allows_unhealthy() {
            if svc.endpoints.get(uid) != Some(&ep) {
                let mut next = (*svc).clone();
                next.endpoints.insert(uid.clone(), ep);
                self.replace_service(&svc, Arc::new(next));
            }
            edit(&mut self.held, key, |set| {
                set.remove(uid);
                !set.is_empty()
            });
        } else {
            if svc.endpoints.contains_key(uid) {
                let mut next = (*svc).clone();
                next.endpoints.remove(uid);
                self.replace_service(&svc, Arc::new(next));
            }
            edit(&mut self.held, key, |set| {
                set.insert(uid.clone(), ep);
                true
            });
        }
    }

    /// Removes workload `uid`'s endpoint of service `key` wherever it is.
    fn drop_endpoint(&mut self, key: &Key, uid: &str) {
        let remove = |set: &mut EndpointSet| {
            set.remove(uid);
            !set.is_empty()
        };
        match self.services.get(key).cloned() {
            Some(svc) => {
                if svc.endpoints.contains_key(uid) {
                    let mut next = (*svc).clone();
                    next.endpoints.remove(uid);
                    self.replace_service(&svc, Arc::new(next));
                }
                edit(&mut self.held, key, remove);
            }
            None => edit(&mut self.staged, key, remove),
        }
    }

    fn upsert_service(&mut self, mut svc: Service, applied: &mut Applied) {
        if svc.hostname.is_empty() {
            let reason =
                RejectReason::EmptyHostname { namespace: svc.namespace.clone(), name: svc.name.clone() };
            applied.rejected.push(Rejected { name: svc.key(), reason });
            return;
        }
        let key = service_key(&svc);
        let given = std::mem::take(&mut svc.endpoints);
        let old = self.services.get(&key).cloned();
        // The endpoints it has: carried over from the old version (and those held aside), or
        // the staged ones (any health) when it is new.
        let (mut endpoints, mut held) = match &old {
            Some(o) => (o.endpoints.clone(), self.held.get(&key).cloned().unwrap_or_default()),
            None => (self.staged.get(&key).cloned().unwrap_or_default(), EndpointSet::default()),
        };
        let policy_changed = old.as_ref().is_none_or(|o| o.allows_unhealthy() != svc.allows_unhealthy());
        // Endpoints listed in the service itself (local config) unless a workload lists them.
        for (uid, ep) in given.entries() {
            if !endpoints.contains_key(uid) && !held.contains_key(uid) {
                endpoints.insert(uid.clone(), ep.clone());
            }
        }
        if policy_changed || !given.is_empty() {
            if svc.allows_unhealthy() {
                for (uid, ep) in held.entries() {
                    endpoints.insert(uid.clone(), ep.clone());
                }
                held = EndpointSet::default();
            } else {
                let unhealthy: Vec<(Key, Endpoint)> = endpoints
                    .entries()
                    .filter(|(_, ep)| ep.status != HealthStatus::Healthy)
                    .map(|(k, ep)| (k.clone(), ep.clone()))
                    .collect();
                for (uid, ep) in unhealthy {
                    endpoints.remove(&uid);
                    held.insert(uid, ep);
                }
            }
        }
        svc.endpoints = endpoints;
        if let Some(o) = &old
            && same_definition(o, &svc)
            && o.endpoints == svc.endpoints
        {
            return;
        }
        applied.changed = true;
        let svc = Arc::new(svc);
        match &old {
            Some(o) => self.replace_service(o, svc),
            None => {
                self.index_service(&svc);
                self.services.insert(key.clone(), svc);
                self.staged.remove(&key);
            }
        }
        if held.is_empty() {
            self.held.remove(&key);
        } else {
            self.held.insert(key, held);
        }
    }

    /// Removes service `key`; its endpoints (held ones too) go back to staged.
    fn remove_service(&mut self, key: &str) -> bool {
        let Some(svc) = self.services.remove(key) else {
            return false;
        };
        self.unindex_service(&svc);
        let mut staged = svc.endpoints.clone();
        if let Some(held) = self.held.remove(key) {
            for (uid, ep) in held.entries() {
                staged.insert(uid.clone(), ep.clone());
            }
        }
        if !staged.is_empty() {
            self.staged.insert(key.into(), staged);
        }
        true
    }

    /// Puts `new` where `old` (same key) was, in every index.
    fn replace_service(&mut self, old: &Service, new: Arc<Service>) {
        self.unindex_service(old);
        self.index_service(&new);
        self.services.insert(service_key(&new), new);
    }

    fn index_service(&mut self, svc: &Arc<Service>) {
        let same = |s: &Service| s.namespace == svc.namespace && s.hostname == svc.hostname;
        edit(&mut self.services_by_hostname, &Key::from(svc.hostname.as_str()), |list| {
            *list = with(list, svc.clone(), same, |a, b| a.namespace.cmp(&b.namespace));
            true
        });
        for vip in &svc.vips {
            edit(&mut self.services_by_vip, &Key::from(vip.network.as_str()), |by_ip| {
                edit(by_ip, &vip.address, |list| {
                    *list = with(list, svc.clone(), same, by_service_key);
                    true
                });
                true
            });
        }
        if !svc.cidr_vips.is_empty() {
            let cidrs = Arc::make_mut(&mut self.services_by_cidr);
            for c in &svc.cidr_vips {
                cidrs.push((c.network.as_str().into(), c.cidr, svc.clone()));
            }
            cidrs.sort_by(|a, b| by_service_key(&a.2, &b.2));
        }
    }

    fn unindex_service(&mut self, svc: &Service) {
        let same = |s: &Service| s.namespace == svc.namespace && s.hostname == svc.hostname;
        edit(&mut self.services_by_hostname, &Key::from(svc.hostname.as_str()), |list| without(list, same));
        for vip in &svc.vips {
            edit(&mut self.services_by_vip, &Key::from(vip.network.as_str()), |by_ip| {
                edit(by_ip, &vip.address, |list| without(list, same));
                !by_ip.is_empty()
            });
        }
        if !svc.cidr_vips.is_empty() {
            Arc::make_mut(&mut self.services_by_cidr).retain(|(_, _, s)| !same(s));
        }
    }

    fn upsert_policy(&mut self, p: Authorization, applied: &mut Applied) {
        let key: Key = p.key().into();
        let old = self.policies.get(&key).cloned();
        if old.as_deref() == Some(&p) {
            return;
        }
        applied.changed = true;
        applied.authorization_changed = true;
        if let Some(old) = &old {
            self.unindex_policy(old);
        }
        let p = Arc::new(p);
        if let Some(ns) = scope_key(&p) {
            edit(&mut self.policies_by_namespace, &Key::from(ns), |list| {
                *list =
                    with(list, p.clone(), |q| q.namespace == p.namespace && q.name == p.name, by_policy_key);
                true
            });
        }
        self.policies.insert(key, p);
    }

    fn remove_policy(&mut self, key: &str, applied: &mut Applied) {
        if let Some(p) = self.policies.remove(key) {
            applied.changed = true;
            applied.authorization_changed = true;
            self.unindex_policy(&p);
        }
    }

    fn unindex_policy(&mut self, p: &Authorization) {
        if let Some(ns) = scope_key(p) {
            edit(&mut self.policies_by_namespace, &Key::from(ns), |list| {
                without(list, |q| q.namespace == p.namespace && q.name == p.name)
            });
        }
    }
}

/// Whether replacing workload `old` by `new` (`None`: absent) can change an authorization
/// decision of this proxy: decisions are made for node-local workloads (under `node_name`) and
/// read their namespace, identity and policy list.
pub(super) fn authorization_inputs_differ(
    node_name: &Option<Key>,
    old: Option<&Workload>,
    new: Option<&Workload>,
) -> bool {
    let local = |w: &Workload| node_name.as_deref().is_none_or(|n| n == w.node);
    match (old, new) {
        (Some(a), Some(b)) => {
            (local(a) || local(b))
                && (a.namespace != b.namespace
                    || a.authorization_policies != b.authorization_policies
                    || a.effective_service_account() != b.effective_service_account()
                    || a.effective_trust_domain() != b.effective_trust_domain()
                    || local(a) != local(b))
        }
        (Some(w), None) | (None, Some(w)) => local(w) && !w.authorization_policies.is_empty(),
        (None, None) => false,
    }
}

/// A service's `"<namespace>/<hostname>"` as an index key, shared with the workloads that list it.
fn service_key(svc: &Service) -> Key {
    Name::from(svc.key()).shared()
}

/// Whether two versions of a service differ in anything but their endpoints.
fn same_definition(a: &Service, b: &Service) -> bool {
    let Service {
        name,
        namespace,
        hostname,
        vips,
        cidr_vips,
        ports,
        endpoints: _,
        subject_alt_names,
        waypoint,
        weighted_waypoints,
        load_balancer,
        ip_families,
        canonical,
        visibility,
    } = a;
    *name == b.name
        && *namespace == b.namespace
        && *hostname == b.hostname
        && *vips == b.vips
        && *cidr_vips == b.cidr_vips
        && *ports == b.ports
        && *subject_alt_names == b.subject_alt_names
        && *waypoint == b.waypoint
        && *weighted_waypoints == b.weighted_waypoints
        && *load_balancer == b.load_balancer
        && *ip_families == b.ip_families
        && *canonical == b.canonical
        && *visibility == b.visibility
}

/// The `policies_by_namespace` key of a policy; selector-scoped ones are found by key.
fn scope_key(p: &Authorization) -> Option<&str> {
    match p.scope {
        Scope::Global => Some(""),
        Scope::Namespace => Some(p.namespace.as_str()),
        Scope::WorkloadSelector => None,
    }
}

/// §1.6 rank order: best first, ties by uid.
fn by_rank(a: &Workload, b: &Workload) -> Ordering {
    (Reverse(address_rank(a)), &a.uid).cmp(&(Reverse(address_rank(b)), &b.uid))
}

/// Order of `"<namespace>/<hostname>"`, without building the strings.
fn by_service_key(a: &Service, b: &Service) -> Ordering {
    joined(&a.namespace, &a.hostname).cmp(joined(&b.namespace, &b.hostname))
}

/// Order of `"<namespace>/<name>"`, without building the strings.
fn by_policy_key(a: &Authorization, b: &Authorization) -> Ordering {
    joined(&a.namespace, &a.name).cmp(joined(&b.namespace, &b.name))
}

fn joined<'a>(a: &'a str, b: &'a str) -> impl Iterator<Item = u8> + 'a {
    a.bytes().chain(std::iter::once(b'/')).chain(b.bytes())
}

/// `list` with `item` in its place by `order`, after dropping what `same` selects.
fn with<T>(
    list: &[Arc<T>],
    item: Arc<T>,
    same: impl Fn(&T) -> bool,
    order: impl Fn(&T, &T) -> Ordering,
) -> List<T> {
    let mut items: Vec<Arc<T>> = Vec::with_capacity(list.len() + 1);
    items.extend(list.iter().filter(|x| !same(x)).cloned());
    let at = items.partition_point(|x| order(x, &item) != Ordering::Greater);
    items.insert(at, item);
    items.into()
}

/// Drops what `drop` selects from `list`; whether anything is left.
fn without<T>(list: &mut List<T>, drop: impl Fn(&T) -> bool) -> bool {
    if list.iter().any(|x| drop(x)) {
        *list = list.iter().filter(|x| !drop(x)).cloned().collect();
    }
    !list.is_empty()
}

/// Applies `f` to `map[key]` in place (a default value when absent); the key is removed when
/// `f` returns false (nothing left under it).
fn edit<K: Clone, V: Default, M: MapMut<K, V>>(map: &mut M, key: &K, f: impl FnOnce(&mut V) -> bool) {
    match map.value_mut(key) {
        Some(v) => {
            if !f(v) {
                map.delete(key);
            }
        }
        None => {
            let mut v = V::default();
            if f(&mut v) {
                map.put(key.clone(), v);
            }
        }
    }
}

/// The persistent maps [`edit`] changes in place (hash tries and B-trees).
trait MapMut<K, V> {
    fn value_mut(&mut self, key: &K) -> Option<&mut V>;
    fn put(&mut self, key: K, value: V);
    fn delete(&mut self, key: &K);
}

impl<K: Hash + Eq + Clone, V: Clone> MapMut<K, V> for HashMap<K, V> {
    fn value_mut(&mut self, key: &K) -> Option<&mut V> {
        self.get_mut(key)
    }

    fn put(&mut self, key: K, value: V) {
        self.insert(key, value);
    }

    fn delete(&mut self, key: &K) {
        self.remove(key);
    }
}

impl<K: Ord + Clone, V: Clone> MapMut<K, V> for OrdMap<K, V> {
    fn value_mut(&mut self, key: &K) -> Option<&mut V> {
        self.get_mut(key)
    }

    fn put(&mut self, key: K, value: V) {
        self.insert(key, value);
    }

    fn delete(&mut self, key: &K) {
        self.remove(key);
    }
}
