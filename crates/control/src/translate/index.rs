//! The translator's own copy of the objects it reads, the indices the translation and the
//! incremental recomputation need, and what one change makes dirty.
//!
//! Every index is keyed so that a change finds what depends on it without a scan of the mesh:
//! objects per namespace, pods per node, candidate services per hostname, EndpointSlices per
//! Service and per referenced Pod.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ambit_objects::gateway::{Gateway, GatewayClass};
use ambit_objects::istio::{AuthorizationPolicy, PeerAuthentication, ServiceEntry, WorkloadEntry};
use ambit_objects::route::{GrpcRoute, HttpRoute, ParentReference, ReferenceGrant};
use ambit_objects::{EndpointSlice, Kind, Namespace, Node, Object, ObjectKey, Pod, Service};

use super::Settings;
use super::names::{self, Name, SERVICE_NAME_LABEL};

/// An object that produces workloads.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Source {
    Pod(Name),
    WorkloadEntry(Name),
    ServiceEntry(Name),
    EndpointSlice(Name),
}

/// An object that may publish a Service for a hostname.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ServiceSource {
    Service(Name),
    Entry(Name),
}

/// The names of one namespace's objects, per kind.
#[derive(Default, Debug)]
pub(crate) struct NsObjects {
    pub pods: BTreeSet<String>,
    pub services: BTreeSet<String>,
    pub slices: BTreeSet<String>,
    pub entries: BTreeSet<String>,
    pub workload_entries: BTreeSet<String>,
    pub auth: BTreeSet<String>,
    pub peer: BTreeSet<String>,
    pub gateways: BTreeSet<String>,
}

impl NsObjects {
    fn is_empty(&self) -> bool {
        self.pods.is_empty()
            && self.services.is_empty()
            && self.slices.is_empty()
            && self.entries.is_empty()
            && self.workload_entries.is_empty()
            && self.auth.is_empty()
            && self.peer.is_empty()
            && self.gateways.is_empty()
    }

    /// Every workload source of the namespace.
    pub(crate) fn sources(&self, ns: &str, out: &mut BTreeSet<Source>) {
        let n = |name: &String| Name::new(ns, name.as_str());
        out.extend(self.pods.iter().map(|p| Source::Pod(n(p))));
        out.extend(self.workload_entries.iter().map(|p| Source::WorkloadEntry(n(p))));
        out.extend(self.entries.iter().map(|p| Source::ServiceEntry(n(p))));
        out.extend(self.slices.iter().map(|p| Source::EndpointSlice(n(p))));
    }
}

/// The objects, by kind and name, with indices.
#[derive(Default, Debug)]
pub(crate) struct Store {
    pub namespaces: HashMap<String, Arc<Namespace>>,
    pub nodes: HashMap<String, Arc<Node>>,
    pub gateway_classes: HashMap<String, Arc<GatewayClass>>,
    pub pods: HashMap<Name, Arc<Pod>>,
    pub services: HashMap<Name, Arc<Service>>,
    pub slices: HashMap<Name, Arc<EndpointSlice>>,
    pub entries: HashMap<Name, Arc<ServiceEntry>>,
    pub workload_entries: HashMap<Name, Arc<WorkloadEntry>>,
    pub auth: HashMap<Name, Arc<AuthorizationPolicy>>,
    pub peer: HashMap<Name, Arc<PeerAuthentication>>,
    pub gateways: HashMap<Name, Arc<Gateway>>,
    pub http_routes: HashMap<Name, Arc<HttpRoute>>,
    pub grpc_routes: HashMap<Name, Arc<GrpcRoute>>,
    pub grants: HashMap<Name, Arc<ReferenceGrant>>,
    pub by_ns: HashMap<String, NsObjects>,
    pub pods_by_node: HashMap<String, BTreeSet<Name>>,
    /// Hostname → the Services and ServiceEntries that claim it.
    pub hosts: HashMap<String, BTreeSet<ServiceSource>>,
    /// Service → names of the EndpointSlices labelled with it (same namespace).
    pub slices_by_service: HashMap<Name, BTreeSet<String>>,
    /// Pod → names of the EndpointSlices with an endpoint whose targetRef names it.
    pub slices_by_pod: HashMap<Name, BTreeSet<String>>,
    domain_suffix: String,
}

/// What the changes of one `apply` make stale.
#[derive(Default, Debug)]
pub(crate) struct Dirty {
    /// The local network changed: everything.
    pub all: bool,
    /// Every workload (a root-namespace policy changed).
    pub all_workloads: bool,
    /// Every workload and every Service of these namespaces (a Namespace object changed).
    pub namespaces: BTreeSet<String>,
    /// Every workload of these namespaces (a Service, ServiceEntry or policy changed).
    pub workload_ns: BTreeSet<String>,
    pub sources: BTreeSet<Source>,
    pub hostnames: BTreeSet<String>,
    /// Waypoints whose users must be recomputed.
    pub waypoints: BTreeSet<Name>,
    pub auth: BTreeSet<Name>,
    /// Converted PeerAuthentications of these namespaces.
    pub peer_ns: BTreeSet<String>,
    pub all_peer: bool,
    pub static_strict: bool,
    /// Services (by object name) whose waypoint's configuration a route or policy changed.
    pub l7_services: BTreeSet<Name>,
    /// Gateways whose waypoint configuration a route or policy naming them changed.
    pub l7_gateways: BTreeSet<Name>,
    /// Every waypoint's configuration (a ReferenceGrant or a Namespace changed).
    pub l7_all: bool,
}

impl Store {
    pub(crate) fn new(settings: &Settings) -> Store {
        Store { domain_suffix: settings.domain_suffix.clone(), ..Store::default() }
    }

    pub(crate) fn ns(&self, ns: &str) -> Option<&NsObjects> {
        self.by_ns.get(ns)
    }

    /// Applies one change; returns the object it replaced or removed.
    pub(crate) fn apply(&mut self, change: ambit_objects::Change) -> Option<Object> {
        match change {
            ambit_objects::Change::Upsert(o) => {
                let old = self.remove(&o.key());
                self.insert(o);
                old
            }
            ambit_objects::Change::Delete(k) => self.remove(&k),
        }
    }

    fn insert(&mut self, o: Object) {
        let n = Name::of(o.metadata());
        match o {
            Object::Namespace(x) => {
                self.namespaces.insert(n.name, x);
            }
            Object::Node(x) => {
                self.nodes.insert(n.name, x);
            }
            Object::GatewayClass(x) => {
                self.gateway_classes.insert(n.name, x);
            }
            Object::Pod(x) => {
                if let Some(node) = x.spec.as_ref().and_then(|s| s.node_name.as_ref()) {
                    self.pods_by_node.entry(node.clone()).or_default().insert(n.clone());
                }
                self.by_ns.entry(n.ns.clone()).or_default().pods.insert(n.name.clone());
                self.pods.insert(n, x);
            }
            Object::Service(x) => {
                let host = names::service_hostname(&n, &self.domain_suffix);
                self.hosts.entry(host).or_default().insert(ServiceSource::Service(n.clone()));
                self.by_ns.entry(n.ns.clone()).or_default().services.insert(n.name.clone());
                self.services.insert(n, x);
            }
            Object::EndpointSlice(x) => {
                if let Some(svc) = names::labels(&x.metadata).get(SERVICE_NAME_LABEL) {
                    let key = Name::new(n.ns.clone(), svc.clone());
                    self.slices_by_service.entry(key).or_default().insert(n.name.clone());
                }
                for pod in slice_pods(&x) {
                    self.slices_by_pod
                        .entry(Name::new(n.ns.clone(), pod))
                        .or_default()
                        .insert(n.name.clone());
                }
                self.by_ns.entry(n.ns.clone()).or_default().slices.insert(n.name.clone());
                self.slices.insert(n, x);
            }
            Object::ServiceEntry(x) => {
                for host in &x.spec.hosts {
                    self.hosts.entry(host.clone()).or_default().insert(ServiceSource::Entry(n.clone()));
                }
                self.by_ns.entry(n.ns.clone()).or_default().entries.insert(n.name.clone());
                self.entries.insert(n, x);
            }
            Object::WorkloadEntry(x) => {
                self.by_ns.entry(n.ns.clone()).or_default().workload_entries.insert(n.name.clone());
                self.workload_entries.insert(n, x);
            }
            Object::AuthorizationPolicy(x) => {
                self.by_ns.entry(n.ns.clone()).or_default().auth.insert(n.name.clone());
                self.auth.insert(n, x);
            }
            Object::PeerAuthentication(x) => {
                self.by_ns.entry(n.ns.clone()).or_default().peer.insert(n.name.clone());
                self.peer.insert(n, x);
            }
            Object::Gateway(x) => {
                self.by_ns.entry(n.ns.clone()).or_default().gateways.insert(n.name.clone());
                self.gateways.insert(n, x);
            }
            Object::HttpRoute(x) => {
                self.http_routes.insert(n, x);
            }
            Object::GrpcRoute(x) => {
                self.grpc_routes.insert(n, x);
            }
            Object::ReferenceGrant(x) => {
                self.grants.insert(n, x);
            }
        }
    }

    fn remove(&mut self, k: &ObjectKey) -> Option<Object> {
        let n = Name::new(k.namespace.clone(), k.name.clone());
        let ns = self.by_ns.get_mut(&n.ns);
        let old = match k.kind {
            Kind::Namespace => self.namespaces.remove(&n.name).map(Object::Namespace),
            Kind::Node => self.nodes.remove(&n.name).map(Object::Node),
            Kind::GatewayClass => self.gateway_classes.remove(&n.name).map(Object::GatewayClass),
            Kind::Pod => {
                ns.map(|o| o.pods.remove(&n.name));
                let old = self.pods.remove(&n)?;
                if let Some(node) = old.spec.as_ref().and_then(|s| s.node_name.as_ref()) {
                    remove_from(&mut self.pods_by_node, node, &n);
                }
                Some(Object::Pod(old))
            }
            Kind::Service => {
                ns.map(|o| o.services.remove(&n.name));
                let old = self.services.remove(&n)?;
                let host = names::service_hostname(&n, &self.domain_suffix);
                remove_from(&mut self.hosts, &host, &ServiceSource::Service(n.clone()));
                Some(Object::Service(old))
            }
            Kind::EndpointSlice => {
                ns.map(|o| o.slices.remove(&n.name));
                let old = self.slices.remove(&n)?;
                if let Some(svc) = names::labels(&old.metadata).get(SERVICE_NAME_LABEL) {
                    remove_from(&mut self.slices_by_service, &Name::new(n.ns.clone(), svc.clone()), &n.name);
                }
                for pod in slice_pods(&old) {
                    remove_from(&mut self.slices_by_pod, &Name::new(n.ns.clone(), pod), &n.name);
                }
                Some(Object::EndpointSlice(old))
            }
            Kind::ServiceEntry => {
                ns.map(|o| o.entries.remove(&n.name));
                let old = self.entries.remove(&n)?;
                for host in &old.spec.hosts {
                    remove_from(&mut self.hosts, host, &ServiceSource::Entry(n.clone()));
                }
                Some(Object::ServiceEntry(old))
            }
            Kind::WorkloadEntry => {
                ns.map(|o| o.workload_entries.remove(&n.name));
                self.workload_entries.remove(&n).map(Object::WorkloadEntry)
            }
            Kind::AuthorizationPolicy => {
                ns.map(|o| o.auth.remove(&n.name));
                self.auth.remove(&n).map(Object::AuthorizationPolicy)
            }
            Kind::PeerAuthentication => {
                ns.map(|o| o.peer.remove(&n.name));
                self.peer.remove(&n).map(Object::PeerAuthentication)
            }
            Kind::Gateway => {
                ns.map(|o| o.gateways.remove(&n.name));
                self.gateways.remove(&n).map(Object::Gateway)
            }
            Kind::HttpRoute => self.http_routes.remove(&n).map(Object::HttpRoute),
            Kind::GrpcRoute => self.grpc_routes.remove(&n).map(Object::GrpcRoute),
            Kind::ReferenceGrant => self.grants.remove(&n).map(Object::ReferenceGrant),
        };
        if self.by_ns.get(&n.ns).is_some_and(NsObjects::is_empty) {
            self.by_ns.remove(&n.ns);
        }
        old
    }

    /// Marks what `o` (an old or a new version of a changed object) feeds.
    pub(crate) fn dirty(&self, settings: &Settings, o: &Object, d: &mut Dirty) {
        let n = Name::of(o.metadata());
        match o {
            Object::Namespace(_) => {
                if n.name == settings.system_namespace {
                    d.all = true;
                }
                // Its labels decide which waypoint listeners accept its routes (Selector).
                d.l7_all = true;
                d.namespaces.insert(n.name);
            }
            Object::Node(_) => {
                for p in self.pods_by_node.get(&n.name).into_iter().flatten() {
                    d.sources.insert(Source::Pod(p.clone()));
                }
            }
            Object::GatewayClass(_) => {
                for (gw_name, gw) in &self.gateways {
                    if gw.spec.gateway_class_name == n.name {
                        d.waypoints.insert(gw_name.clone());
                    }
                }
            }
            Object::Pod(_) => {
                d.sources.insert(Source::Pod(n));
            }
            Object::Service(_) => {
                d.hostnames.insert(names::service_hostname(&n, &settings.domain_suffix));
                d.workload_ns.insert(n.ns);
            }
            Object::EndpointSlice(x) => {
                for pod in slice_pods(x) {
                    d.sources.insert(Source::Pod(Name::new(n.ns.clone(), pod)));
                }
                d.sources.insert(Source::EndpointSlice(n));
            }
            Object::ServiceEntry(x) => {
                d.hostnames.extend(x.spec.hosts.iter().cloned());
                d.workload_ns.insert(n.ns.clone());
                // Named too: a deleted entry is no longer among its namespace's objects.
                d.sources.insert(Source::ServiceEntry(n));
            }
            Object::WorkloadEntry(_) => {
                d.sources.insert(Source::WorkloadEntry(n));
            }
            Object::AuthorizationPolicy(x) => {
                if x.spec.selector.is_some() {
                    if n.ns == settings.root_namespace {
                        d.all_workloads = true;
                    } else {
                        d.workload_ns.insert(n.ns.clone());
                    }
                }
                for t in x.spec.target_ref.iter().chain(&x.spec.target_refs) {
                    let target =
                        Name::new(if t.namespace.is_empty() { &n.ns } else { &t.namespace }, t.name.as_str());
                    match (t.group.as_str(), t.kind.as_str()) {
                        ("gateway.networking.k8s.io", "Gateway") => d.l7_gateways.insert(target),
                        ("" | "core", "Service") => d.l7_services.insert(target),
                        _ => false,
                    };
                }
                d.auth.insert(n);
            }
            Object::PeerAuthentication(_) => {
                d.static_strict = true;
                if n.ns == settings.root_namespace {
                    d.all_workloads = true;
                    d.all_peer = true;
                } else {
                    d.workload_ns.insert(n.ns.clone());
                    d.peer_ns.insert(n.ns);
                }
            }
            Object::Gateway(_) => {
                d.waypoints.insert(n.clone());
                d.l7_gateways.insert(n);
            }
            Object::HttpRoute(x) => l7_parents(&n.ns, &x.spec.parent_refs, d),
            Object::GrpcRoute(x) => l7_parents(&n.ns, &x.spec.parent_refs, d),
            Object::ReferenceGrant(_) => d.l7_all = true,
        }
    }
}

/// Whether the object counts for this control plane's revision (§0 revision filter). `None`
/// is the default revision, which takes objects labelled `default`.
pub(crate) fn in_revision(settings: &Settings, o: &Object) -> bool {
    let filtered = matches!(
        o.kind(),
        Kind::AuthorizationPolicy | Kind::PeerAuthentication | Kind::ServiceEntry | Kind::WorkloadEntry
    );
    if !filtered {
        return true;
    }
    match names::labels(o.metadata()).get(names::REVISION_LABEL) {
        None => true,
        Some(rev) => rev == settings.revision.as_deref().unwrap_or("default"),
    }
}

/// Marks the waypoint configuration a route's parents feed: Services and Gateways.
fn l7_parents(ns: &str, parents: &[ParentReference], d: &mut Dirty) {
    for p in parents {
        let name = Name::new(p.namespace.as_deref().unwrap_or(ns), p.name.as_str());
        match (p.group.as_deref(), p.kind.as_deref()) {
            (Some("" | "core"), Some("Service")) => d.l7_services.insert(name),
            (None | Some("gateway.networking.k8s.io"), None | Some("Gateway")) => d.l7_gateways.insert(name),
            _ => false,
        };
    }
}

/// Pods named by a slice's endpoint targetRefs (in the slice's namespace).
fn slice_pods(s: &EndpointSlice) -> impl Iterator<Item = String> + '_ {
    let ns = s.metadata.namespace.as_deref().unwrap_or_default();
    s.endpoints.iter().filter_map(move |e| {
        let r = e.target_ref.as_ref()?;
        let same_ns = r.namespace.as_deref().is_none_or(|n| n == ns);
        (r.kind.as_deref() == Some("Pod") && same_ns).then(|| r.name.clone()).flatten()
    })
}

fn remove_from<K, V>(map: &mut HashMap<K, BTreeSet<V>>, k: &K, v: &V)
where
    K: std::hash::Hash + Eq,
    V: Ord,
{
    if let Some(set) = map.get_mut(k) {
        set.remove(v);
        if set.is_empty() {
            map.remove(k);
        }
    }
}
