//! Objects → Address and Authorization (`control-plane.md` §1–§4), incrementally.
//!
//! [`Translator`] keeps its own copy of every object it is given and the indices the
//! translation needs. [`Translator::apply`] takes a batch of [`Change`]s, recomputes only what
//! depends on them and returns the resources whose translation changed (compared on the proto),
//! `None` for a resource that is gone. The queries the xDS server needs (§1.3: aliases, members
//! of a service, the node of a workload, name lookup) read the published state.
//!
//! What one change recomputes:
//!
//! | Change | Recomputed |
//! |---|---|
//! | Pod, WorkloadEntry | its workload |
//! | EndpointSlice | its endpoint workloads and the pods its targetRefs name |
//! | Node | the workloads of its pods (locality) |
//! | Service, ServiceEntry | the services of its hostnames (every namespace: deduplication and `canonical`), the workloads of its namespace |
//! | Namespace | the workloads and services of that namespace; the system namespace (local network): everything |
//! | Gateway, GatewayClass | the workloads and services that name the waypoint; the waypoint's configuration |
//! | AuthorizationPolicy | the policy; with a selector, the workloads of its namespace (root namespace: all); with targetRefs, the configuration of the waypoints of its targets |
//! | PeerAuthentication | the static policy, the converted policies and workloads of its namespace (root namespace: all) |
//! | HTTPRoute, GRPCRoute | the configuration of the waypoints of its parents (Services or the waypoint's Gateway) |
//! | ReferenceGrant | every waypoint's configuration |
//!
//! A Namespace change also recomputes every waypoint's configuration (its labels decide which
//! waypoint listeners accept its routes).
//!
//! Each waypoint's own configuration (`ambit.waypoint.v1`, module `l7`) follows the Address
//! output: a waypoint is recomputed when an Address it read or one that names it changed.
//!
//! [`Recomputed`] counts what the last `apply` evaluated, so tests can hold it to that table.

pub mod explain;
mod index;
mod l7;
mod names;
mod peer_auth;
mod policies;
pub mod render;
mod services;
mod waypoints;
mod workloads;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use ambit_api::security::Authorization;
use ambit_api::waypoint::{Destination, Policy};
use ambit_api::workload::{Address, Service, Workload, address};
use ambit_objects::Change;

use index::{Dirty, ServiceSource, Source, Store};
pub use l7::ConfigError;
use names::Name;

/// The global inputs every conversion uses (`control-plane.md` §0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Cluster ID (`CLUSTER_ID`, istiod's default `Kubernetes`): first segment of every uid.
    pub cluster_id: String,
    /// DNS domain suffix of Kubernetes Services (`cluster.local`).
    pub domain_suffix: String,
    /// The root namespace: mesh-wide policies (`istio-system`).
    pub root_namespace: String,
    /// The mesh trust domain (`cluster.local`).
    pub trust_domain: String,
    /// The control plane's own namespace; its `topology.istio.io/network` label names the local
    /// network (`istio-system`).
    pub system_namespace: String,
    /// The revision (`istio.io/rev`) whose policies and entries count; `None` is the default
    /// revision, which takes objects without the label or labelled `default`.
    pub revision: Option<String>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            cluster_id: "Kubernetes".into(),
            domain_suffix: "cluster.local".into(),
            root_namespace: "istio-system".into(),
            trust_domain: "cluster.local".into(),
            system_namespace: "istio-system".into(),
            revision: None,
        }
    }
}

/// What one `apply` changed: xDS resource name → new value, `None` when removed. Sorted by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    /// `istio.workload.Address` resources (workloads by uid, services by `ns/hostname`).
    pub addresses: Vec<(String, Option<Address>)>,
    /// `istio.security.Authorization` resources (`ns/name`).
    pub authorizations: Vec<(String, Option<Authorization>)>,
    /// `ambit.waypoint.v1.Destination` resources (`<gw ns>/<gw name>/<ns/hostname or uid>`).
    pub destinations: Vec<(String, Option<Destination>)>,
    /// `ambit.waypoint.v1.Policy` resources (`<gw ns>/<gw name>/<ns>/<name>`).
    pub policies: Vec<(String, Option<Policy>)>,
}

impl Output {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
            && self.authorizations.is_empty()
            && self.destinations.is_empty()
            && self.policies.is_empty()
    }
}

/// What the last `apply` evaluated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recomputed {
    /// Workload-producing objects translated (a Pod or WorkloadEntry is one workload; a
    /// ServiceEntry or EndpointSlice one object for all its endpoints).
    pub workloads: usize,
    /// Hostnames whose services were translated.
    pub services: usize,
    /// Policies translated (AuthorizationPolicies, converted PeerAuthentications, the static one).
    pub policies: usize,
    /// Waypoints whose configuration was computed.
    pub waypoints: usize,
}

/// Objects in, Address and Authorization out; see the module documentation.
#[derive(Debug)]
pub struct Translator {
    settings: Settings,
    store: Store,
    network: String,
    /// Hostname → namespace → the object that publishes it there (§3.5).
    winners: HashMap<String, BTreeMap<String, ServiceSource>>,
    addresses: HashMap<String, Address>,
    authorizations: HashMap<String, Authorization>,
    /// What each workload source and hostname published last.
    by_source: HashMap<Source, Vec<String>>,
    by_host: HashMap<String, Vec<String>>,
    /// Waypoint → the sources and hostnames that named it; and the reverse.
    waypoint_users: HashMap<Name, BTreeSet<User>>,
    user_waypoints: HashMap<User, Vec<Name>>,
    // Query indices over the published addresses.
    workloads_by_ip: HashMap<(String, IpAddr), BTreeSet<String>>,
    services_by_ip: HashMap<(String, IpAddr), BTreeSet<String>>,
    members: HashMap<String, BTreeSet<String>>,
    /// Waypoint address key (`l7::gateway_key`) → the Addresses bound to it.
    bound_to: HashMap<String, BTreeSet<String>>,
    /// The waypoints' own configuration.
    l7: l7::State,
    recomputed: Recomputed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum User {
    Source(Source),
    Host(String),
}

/// Read-only view the translation functions get.
pub(crate) struct Ctx<'a> {
    pub settings: &'a Settings,
    pub store: &'a Store,
    pub network: &'a str,
    pub winners: &'a HashMap<String, BTreeMap<String, ServiceSource>>,
}

impl Translator {
    /// An empty translator.
    pub fn new(settings: Settings) -> Translator {
        Translator {
            store: Store::new(&settings),
            settings,
            network: String::new(),
            winners: HashMap::new(),
            addresses: HashMap::new(),
            authorizations: HashMap::new(),
            by_source: HashMap::new(),
            by_host: HashMap::new(),
            waypoint_users: HashMap::new(),
            user_waypoints: HashMap::new(),
            workloads_by_ip: HashMap::new(),
            services_by_ip: HashMap::new(),
            members: HashMap::new(),
            bound_to: HashMap::new(),
            l7: l7::State::default(),
            recomputed: Recomputed::default(),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Applies a batch of changes and returns what changed in the translation.
    pub fn apply(&mut self, changes: impl IntoIterator<Item = Change>) -> Output {
        let mut dirty = Dirty::default();
        for change in changes {
            // An object of another revision counts as absent.
            let change = match change {
                Change::Upsert(o) if !index::in_revision(&self.settings, &o) => Change::Delete(o.key()),
                c => c,
            };
            if let Change::Upsert(o) = &change {
                self.store.dirty(&self.settings, o, &mut dirty);
            }
            if let Some(old) = self.store.apply(change) {
                self.store.dirty(&self.settings, &old, &mut dirty);
            }
        }
        self.recompute(dirty)
    }

    /// The published resource named `name` (uid or `ns/hostname`).
    pub fn address(&self, name: &str) -> Option<&Address> {
        self.addresses.get(name)
    }

    /// Every published Address, by name.
    pub fn addresses(&self) -> impl Iterator<Item = (&String, &Address)> {
        self.addresses.iter()
    }

    /// The published policy named `ns/name`.
    pub fn authorization(&self, name: &str) -> Option<&Authorization> {
        self.authorizations.get(name)
    }

    /// Every published Authorization, by name.
    pub fn authorizations(&self) -> impl Iterator<Item = (&String, &Authorization)> {
        self.authorizations.iter()
    }

    /// The published waypoint Destination named `name` (`<gw ns>/<gw name>/<local name>`).
    pub fn destination(&self, name: &str) -> Option<&Destination> {
        self.l7.destination(name)
    }

    /// Every published waypoint Destination, by name.
    pub fn destinations(&self) -> impl Iterator<Item = (&String, &Destination)> {
        self.l7.destinations()
    }

    /// Every published waypoint Policy, by name.
    pub fn waypoint_policies(&self) -> impl Iterator<Item = (&String, &Policy)> {
        self.l7.policies()
    }

    /// What keeps the waypoints' configuration from being what the objects say (invalid
    /// backends, regular expressions, unsupported filters and actions), sorted.
    pub fn waypoint_errors(&self) -> Vec<ConfigError> {
        self.l7.errors()
    }

    /// What each AuthorizationPolicy and PeerAuthentication means for node proxies, sorted by
    /// kind, namespace and name ([`explain`]).
    pub fn policy_reports(&self) -> Vec<explain::PolicyReport> {
        let root = self.settings.root_namespace.as_str();
        let mut out: Vec<explain::PolicyReport> = self
            .store
            .auth
            .values()
            .map(|ap| {
                let mut report = explain::authorization_policy(root, ap);
                if ap.spec.target_ref.is_some() || !ap.spec.target_refs.is_empty() {
                    report.at_waypoints(ap.spec.target_ref.is_some(), self.l7.enforcement(&self.ctx(), ap));
                }
                report
            })
            .chain(self.store.peer.values().map(|pa| explain::peer_authentication(root, pa)))
            .collect();
        out.sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
        out
    }

    /// Every Gateway there is.
    pub fn gateways(&self) -> impl Iterator<Item = &ambit_objects::gateway::Gateway> {
        self.store.gateways.values().map(|g| g.as_ref())
    }

    /// istiod's `ZtunnelAccepted` condition of each AuthorizationPolicy (`None` where istiod
    /// writes none), with the generation it was computed for, by `(namespace, name)`.
    pub fn ztunnel_conditions(&self) -> explain::Conditions {
        let root = self.settings.root_namespace.as_str();
        self.store
            .auth
            .iter()
            .map(|(n, ap)| {
                let generation = ap.metadata.generation.unwrap_or_default();
                let condition = explain::authorization_policy(root, ap).condition;
                ((n.ns.clone(), n.name.clone()), (generation, condition))
            })
            .collect()
    }

    /// The aliases of an address resource for on-demand responses (§1.3): `<network>/<ip>` per
    /// workload address, `<network>/<ip>[/<len>]` per service VIP.
    pub fn aliases(&self, name: &str) -> Vec<String> {
        match self.addresses.get(name).and_then(|a| a.r#type.as_ref()) {
            Some(address::Type::Workload(w)) => w
                .addresses
                .iter()
                .filter_map(|b| names::ip_of_bytes(b))
                .map(|ip| names::network_ip(&w.network, ip))
                .collect(),
            Some(address::Type::Service(s)) => s
                .addresses
                .iter()
                .filter_map(|a| {
                    let ip = names::ip_of_bytes(&a.address)?;
                    let base = names::network_ip(&a.network, ip);
                    Some(match a.length {
                        Some(len) => format!("{base}/{len}"),
                        None => base,
                    })
                })
                .collect(),
            None => Vec::new(),
        }
    }

    /// The uids of the workloads whose `services` name the service key `ns/hostname`, sorted.
    pub fn service_members(&self, key: &str) -> Vec<String> {
        self.members.get(key).map(|m| m.iter().cloned().collect()).unwrap_or_default()
    }

    /// The node a workload runs on (pods only).
    pub fn node_of(&self, uid: &str) -> Option<&str> {
        match self.addresses.get(uid)?.r#type.as_ref()? {
            address::Type::Workload(w) if !w.node.is_empty() => Some(&w.node),
            _ => None,
        }
    }

    /// The resources a requested name resolves to (§1.3): a workload by uid; else, split at the
    /// first `/` into network and IP, every workload with that address; else a service by key,
    /// or by (network, VIP), followed by its member workloads. Empty when nothing matches.
    pub fn lookup(&self, name: &str) -> Vec<String> {
        if let Some(Address { r#type: Some(address::Type::Workload(_)) }) = self.addresses.get(name) {
            return vec![name.to_owned()];
        }
        let Some((network, rest)) = name.split_once('/') else { return Vec::new() };
        let by_ip = rest.parse::<IpAddr>().ok().map(|ip| (network.to_owned(), ip));
        if let Some(uids) = by_ip.as_ref().and_then(|k| self.workloads_by_ip.get(k))
            && !uids.is_empty()
        {
            return uids.iter().cloned().collect();
        }
        let service = if matches!(
            self.addresses.get(name),
            Some(Address { r#type: Some(address::Type::Service(_)) })
        ) {
            Some(name.to_owned())
        } else {
            by_ip.as_ref().and_then(|k| self.services_by_ip.get(k)).and_then(|s| s.iter().next().cloned())
        };
        let Some(service) = service else { return Vec::new() };
        let mut out = vec![service.clone()];
        out.extend(self.service_members(&service));
        out
    }

    /// What the last `apply` evaluated.
    pub fn recomputed(&self) -> Recomputed {
        self.recomputed
    }

    fn recompute(&mut self, mut dirty: Dirty) -> Output {
        let mut out = Changed::default();
        let mut counts = Recomputed::default();
        if dirty.all {
            self.network = self
                .store
                .namespaces
                .get(&self.settings.system_namespace)
                .and_then(|n| names::labels(&n.metadata).get(names::NETWORK_LABEL).cloned())
                .unwrap_or_default();
        }
        let mut l7_gateways: BTreeSet<Name> = std::mem::take(&mut dirty.l7_gateways);
        l7_gateways.extend(dirty.waypoints.iter().cloned());
        // Users of changed waypoints.
        for wp in std::mem::take(&mut dirty.waypoints) {
            for user in self.waypoint_users.get(&wp).into_iter().flatten() {
                match user {
                    User::Source(s) => dirty.sources.insert(s.clone()),
                    User::Host(h) => dirty.hostnames.insert(h.clone()),
                };
            }
        }
        // 1. Services, per hostname (workloads read the winners).
        let mut hosts = std::mem::take(&mut dirty.hostnames);
        if dirty.all {
            hosts.extend(self.store.hosts.keys().cloned());
            hosts.extend(self.by_host.keys().cloned());
        }
        for ns in &dirty.namespaces {
            let Some(objects) = self.store.ns(ns) else { continue };
            for s in &objects.services {
                hosts.insert(names::service_hostname(
                    &Name::new(ns.as_str(), s.as_str()),
                    &self.settings.domain_suffix,
                ));
            }
            for e in &objects.entries {
                if let Some(se) = self.store.entries.get(&Name::new(ns.as_str(), e.as_str())) {
                    hosts.extend(se.spec.hosts.iter().cloned());
                }
            }
        }
        for host in hosts {
            counts.services += 1;
            let mut deps = Vec::new();
            let result = services::hostname(&self.ctx(), &host, &mut deps);
            self.set_users(User::Host(host.clone()), deps);
            if result.winners.is_empty() {
                self.winners.remove(&host);
            } else {
                self.winners.insert(host.clone(), result.winners.into_iter().collect());
            }
            let published: Vec<(String, Address)> = result
                .services
                .into_iter()
                .map(|s| {
                    (
                        names::service_key(&s.namespace, &s.hostname),
                        Address { r#type: Some(address::Type::Service(s)) },
                    )
                })
                .collect();
            let names: Vec<String> = published.iter().map(|(k, _)| k.clone()).collect();
            let old = self.by_host.remove(&host).unwrap_or_default();
            self.replace(old, published, &mut out);
            if !names.is_empty() {
                self.by_host.insert(host, names);
            }
        }
        // 2. Policies.
        self.policies(&dirty, &mut counts, &mut out);
        // 3. Workloads.
        let mut sources = std::mem::take(&mut dirty.sources);
        if dirty.all || dirty.all_workloads {
            for (ns, objects) in &self.store.by_ns {
                objects.sources(ns, &mut sources);
            }
            sources.extend(self.by_source.keys().cloned());
        } else {
            for ns in dirty.namespaces.iter().chain(&dirty.workload_ns) {
                if let Some(objects) = self.store.ns(ns) {
                    objects.sources(ns, &mut sources);
                }
            }
        }
        for source in sources {
            counts.workloads += 1;
            let mut deps = Vec::new();
            let workloads = self.workloads(&source, &mut deps);
            self.set_users(User::Source(source.clone()), deps);
            let mut seen = BTreeSet::new();
            let published: Vec<(String, Address)> = workloads
                .into_iter()
                .filter(|w| seen.insert(w.uid.clone()))
                .map(|w| (w.uid.clone(), Address { r#type: Some(address::Type::Workload(w)) }))
                .collect();
            let names: Vec<String> = published.iter().map(|(k, _)| k.clone()).collect();
            let old = self.by_source.remove(&source).unwrap_or_default();
            self.replace(old, published, &mut out);
            if !names.is_empty() {
                self.by_source.insert(source, names);
            }
        }
        // 4. The waypoints' own configuration, from what was just published.
        let waypoints = self.l7_dirty(&dirty, l7_gateways, &out);
        counts.waypoints = waypoints.len();
        let mut l7_out = l7::Changes::default();
        let ctx = Ctx {
            settings: &self.settings,
            store: &self.store,
            network: &self.network,
            winners: &self.winners,
        };
        let view =
            l7::View { ctx: &ctx, addresses: &self.addresses, members: &self.members, bound: &self.bound_to };
        self.l7.recompute(&view, &waypoints, &mut l7_out);
        self.recomputed = counts;
        Output {
            addresses: out.addresses.into_iter().collect(),
            authorizations: out.authorizations.into_iter().collect(),
            destinations: l7_out.destinations.into_iter().collect(),
            policies: l7_out.policies.into_iter().collect(),
        }
    }

    /// The waypoints whose configuration this recomputation may have changed.
    fn l7_dirty(&self, dirty: &Dirty, gateways: BTreeSet<Name>, out: &Changed) -> BTreeSet<Name> {
        let mut wps = gateways;
        if dirty.all || dirty.l7_all {
            wps.extend(self.store.gateways.keys().cloned());
            wps.extend(self.l7.waypoints().cloned());
            return wps;
        }
        // Waypoints by the address their bound Addresses name.
        let mut by_key: Option<HashMap<String, Vec<Name>>> = None;
        let mut naming = |a: &Address, wps: &mut BTreeSet<Name>| {
            let keys = l7::bound_keys(a);
            if keys.is_empty() {
                return;
            }
            let index = by_key.get_or_insert_with(|| {
                let ctx = self.ctx();
                let mut m: HashMap<String, Vec<Name>> = HashMap::new();
                for n in self.store.gateways.keys() {
                    if let Some(k) = waypoints::waypoint(&ctx, n).and_then(|w| l7::gateway_key(w.address())) {
                        m.entry(k).or_default().push(n.clone());
                    }
                }
                m
            });
            for k in keys {
                wps.extend(index.get(&k).into_iter().flatten().cloned());
            }
        };
        let mut names: Vec<String> = out.addresses.keys().cloned().collect();
        for s in &dirty.l7_services {
            names.push(names::service_key(&s.ns, &names::service_hostname(s, &self.settings.domain_suffix)));
        }
        for name in &names {
            wps.extend(self.l7.readers_of(name).cloned());
            let Some(a) = self.addresses.get(name) else { continue };
            naming(a, &mut wps);
            if let Some(address::Type::Workload(w)) = &a.r#type {
                for key in w.services.keys() {
                    wps.extend(self.l7.readers_of(key).cloned());
                }
            }
        }
        wps
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx { settings: &self.settings, store: &self.store, network: &self.network, winners: &self.winners }
    }

    fn workloads(&self, source: &Source, deps: &mut Vec<Name>) -> Vec<Workload> {
        let ctx = self.ctx();
        match source {
            Source::Pod(n) => {
                self.store.pods.get(n).and_then(|p| workloads::pod(&ctx, n, p, deps)).into_iter().collect()
            }
            Source::WorkloadEntry(n) => self
                .store
                .workload_entries
                .get(n)
                .map(|we| workloads::workload_entry(&ctx, n, we, deps))
                .into_iter()
                .collect(),
            Source::ServiceEntry(n) => self
                .store
                .entries
                .get(n)
                .map(|se| workloads::service_entry(&ctx, n, se, deps))
                .unwrap_or_default(),
            Source::EndpointSlice(n) => {
                self.store.slices.get(n).map(|s| workloads::endpoint_slice(&ctx, n, s)).unwrap_or_default()
            }
        }
    }

    fn policies(&mut self, dirty: &Dirty, counts: &mut Recomputed, out: &mut Changed) {
        let ctx = self.ctx();
        let mut results: Vec<(String, Option<Authorization>)> = Vec::new();
        for n in &dirty.auth {
            counts.policies += 1;
            let policy = self.store.auth.get(n).and_then(|ap| policies::convert(&ctx, n, ap));
            results.push((n.to_string(), policy));
        }
        let mut pas: BTreeSet<Name> = BTreeSet::new();
        if dirty.all_peer || dirty.all {
            pas.extend(self.store.peer.keys().cloned());
        } else {
            for ns in &dirty.peer_ns {
                for name in self.store.ns(ns).map(|o| &o.peer).into_iter().flatten() {
                    pas.insert(Name::new(ns.as_str(), name.as_str()));
                }
            }
        }
        // Converted names of deleted PAs are withdrawn too.
        let prefix_names: Vec<String> = self
            .authorizations
            .keys()
            .filter(|k| {
                k.split_once('/').is_some_and(|(ns, name)| {
                    name.starts_with("converted_peer_authentication_")
                        && (dirty.all_peer || dirty.all || dirty.peer_ns.contains(ns))
                })
            })
            .cloned()
            .collect();
        let mut seen = BTreeSet::new();
        for n in &pas {
            counts.policies += 1;
            let name = peer_auth::converted_name(n).to_string();
            let pa = self.store.peer.get(n);
            if let Some(pa) = pa {
                peer_auth::warn_unknown_modes(n, pa);
            }
            let policy = pa.and_then(|pa| peer_auth::converted(&ctx, n, pa));
            seen.insert(name.clone());
            results.push((name, policy));
        }
        results.extend(prefix_names.into_iter().filter(|k| !seen.contains(k)).map(|k| (k, None)));
        if dirty.static_strict || dirty.all {
            counts.policies += 1;
            let policy = (!self.store.peer.is_empty()).then(|| peer_auth::static_strict(&ctx));
            results.push((names::service_key(&self.settings.root_namespace, names::STATIC_STRICT), policy));
        }
        for (name, policy) in results {
            let old = match policy {
                Some(p) => {
                    self.authorizations.insert(name.clone(), p.clone()).filter(|o| *o == p).map(|_| ())
                }
                None => self.authorizations.remove(&name).is_none().then_some(()),
            };
            if old.is_none() {
                out.authorizations.insert(name.clone(), self.authorizations.get(&name).cloned());
            }
        }
    }

    /// Replaces what one source published (`old` names) by `new`, recording every difference.
    fn replace(&mut self, old: Vec<String>, new: Vec<(String, Address)>, out: &mut Changed) {
        let kept: BTreeSet<&String> = new.iter().map(|(k, _)| k).collect();
        for name in old.iter().filter(|n| !kept.contains(n)) {
            if let Some(prev) = self.addresses.remove(name) {
                self.unindex(name, &prev);
                out.addresses.insert(name.clone(), None);
            }
        }
        for (name, a) in new {
            if self.addresses.get(&name) == Some(&a) {
                continue;
            }
            if let Some(prev) = self.addresses.remove(&name) {
                self.unindex(&name, &prev);
            }
            self.index(&name, &a);
            out.addresses.insert(name.clone(), Some(a.clone()));
            self.addresses.insert(name, a);
        }
    }

    fn index(&mut self, name: &str, a: &Address) {
        match &a.r#type {
            Some(address::Type::Workload(w)) => {
                for ip in w.addresses.iter().filter_map(|b| names::ip_of_bytes(b)) {
                    self.workloads_by_ip.entry((w.network.clone(), ip)).or_default().insert(name.to_owned());
                }
                for key in w.services.keys() {
                    self.members.entry(key.clone()).or_default().insert(name.to_owned());
                }
            }
            Some(address::Type::Service(s)) => {
                for (network, ip) in service_ips(s) {
                    self.services_by_ip.entry((network, ip)).or_default().insert(name.to_owned());
                }
            }
            None => {}
        }
        for k in l7::bound_keys(a) {
            self.bound_to.entry(k).or_default().insert(name.to_owned());
        }
    }

    fn unindex(&mut self, name: &str, a: &Address) {
        fn drop_from<K: std::hash::Hash + Eq>(m: &mut HashMap<K, BTreeSet<String>>, k: K, name: &str) {
            if let Some(set) = m.get_mut(&k) {
                set.remove(name);
                if set.is_empty() {
                    m.remove(&k);
                }
            }
        }
        match &a.r#type {
            Some(address::Type::Workload(w)) => {
                for ip in w.addresses.iter().filter_map(|b| names::ip_of_bytes(b)) {
                    drop_from(&mut self.workloads_by_ip, (w.network.clone(), ip), name);
                }
                for key in w.services.keys() {
                    drop_from(&mut self.members, key.clone(), name);
                }
            }
            Some(address::Type::Service(s)) => {
                for k in service_ips(s) {
                    drop_from(&mut self.services_by_ip, k, name);
                }
            }
            None => {}
        }
        for k in l7::bound_keys(a) {
            drop_from(&mut self.bound_to, k, name);
        }
    }

    fn set_users(&mut self, user: User, deps: Vec<Name>) {
        let old = self.user_waypoints.remove(&user).unwrap_or_default();
        for wp in old {
            if let Some(set) = self.waypoint_users.get_mut(&wp) {
                set.remove(&user);
                if set.is_empty() {
                    self.waypoint_users.remove(&wp);
                }
            }
        }
        if deps.is_empty() {
            return;
        }
        for wp in &deps {
            self.waypoint_users.entry(wp.clone()).or_default().insert(user.clone());
        }
        self.user_waypoints.insert(user, deps);
    }
}

/// Changes collected during one recomputation (a name may be touched more than once).
#[derive(Default)]
struct Changed {
    addresses: BTreeMap<String, Option<Address>>,
    authorizations: BTreeMap<String, Option<Authorization>>,
}

/// A service's (network, VIP) pairs; CIDR VIPs are found by their base address only.
fn service_ips(s: &Service) -> impl Iterator<Item = (String, IpAddr)> + '_ {
    s.addresses.iter().filter_map(|a| names::ip_of_bytes(&a.address).map(|ip| (a.network.clone(), ip)))
}
