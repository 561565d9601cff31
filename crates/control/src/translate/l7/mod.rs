//! Each waypoint's own configuration (`ambit.waypoint.v1` Destination and Policy), from the
//! published Address resources, HTTPRoutes, GRPCRoutes and the AuthorizationPolicies that target
//! the waypoint or its Services.
//!
//! A waypoint is a Gateway that [`waypoints::waypoint`] accepts (it has a status address) and
//! that is one by class or shape: class `istio-waypoint`, or a `HBONE` listener on 15008. What is
//! bound to it is read off the Address output (a Service's `waypoint` or `weighted_waypoints`, a
//! workload's `waypoint`), so the binding rule is the one node proxies were given, never a second
//! implementation.
//!
//! Resource names are `<gw ns>/<gw name>/<local name>` (see `proto/waypoint.proto`), so the xDS
//! server scopes them to the waypoint's identity by their first two segments.
//!
//! Incremental: each waypoint's result records the Address names it read (bound Services, their
//! member workloads, backends, bound workloads); a change of any of them, a change of what an
//! Address names as its waypoint, a route or policy naming one of its Services or its Gateway, or
//! the Gateway itself recomputes that waypoint only. A ReferenceGrant or a Namespace recomputes
//! every waypoint.

mod destinations;
mod policies;
mod routes;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use ambit_api::waypoint::{Destination, Policy};
use ambit_api::workload::{Address, GatewayAddress, Workload, address, gateway_address};

use super::Ctx;
use super::names::{self, Name};
use super::waypoints;

use ambit_objects::waypoint::WAYPOINT_CLASS;

/// Something in the objects that keeps part of a waypoint's configuration from being what was
/// written; shown in `/debug/config_errors`, never silently dropped.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct ConfigError {
    /// The waypoint (`<ns>/<name>` of its Gateway).
    pub waypoint: String,
    /// The object at fault (`HTTPRoute ns/name`).
    pub object: String,
    /// What is wrong and what the waypoint does instead.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (waypoint {})", self.object, self.message, self.waypoint)
    }
}

/// What the translator hands this module: the settings and objects, and the published state.
pub(crate) struct View<'c, 'a> {
    pub ctx: &'c Ctx<'a>,
    pub addresses: &'c HashMap<String, Address>,
    pub members: &'c HashMap<String, BTreeSet<String>>,
    /// Gateway address key → names of the Addresses bound to it.
    pub bound: &'c HashMap<String, BTreeSet<String>>,
}

impl View<'_, '_> {
    fn workload(&self, uid: &str) -> Option<&Workload> {
        match self.addresses.get(uid)?.r#type.as_ref()? {
            address::Type::Workload(w) => Some(w),
            address::Type::Service(_) => None,
        }
    }

    fn service(&self, key: &str) -> Option<&ambit_api::workload::Service> {
        match self.addresses.get(key)?.r#type.as_ref()? {
            address::Type::Service(s) => Some(s),
            address::Type::Workload(_) => None,
        }
    }
}

/// The waypoint configuration of every waypoint, and what each read.
#[derive(Debug, Default)]
pub(crate) struct State {
    destinations: HashMap<String, Destination>,
    policies: HashMap<String, Policy>,
    /// Waypoint → what it published and read.
    per_waypoint: HashMap<Name, Published>,
    /// Address name → the waypoints whose configuration read it.
    readers: HashMap<String, BTreeSet<Name>>,
}

#[derive(Debug, Default)]
struct Published {
    destinations: Vec<String>,
    policies: Vec<String>,
    inputs: Vec<String>,
    errors: Vec<ConfigError>,
}

/// One waypoint's computed configuration.
#[derive(Default)]
pub(super) struct Config {
    destinations: BTreeMap<String, Destination>,
    policies: BTreeMap<String, Policy>,
    /// Address names read.
    inputs: BTreeSet<String>,
    errors: Vec<ConfigError>,
}

/// The changes of one recomputation.
#[derive(Default)]
pub(crate) struct Changes {
    pub destinations: BTreeMap<String, Option<Destination>>,
    pub policies: BTreeMap<String, Option<Policy>>,
}

/// `<gw ns>/<gw name>/<local>`.
pub(super) fn scoped(wp: &Name, local: &str) -> String {
    format!("{}/{}/{local}", wp.ns, wp.name)
}

/// A gateway address as an index key.
pub(crate) fn gateway_key(a: &GatewayAddress) -> Option<String> {
    match a.destination.as_ref()? {
        gateway_address::Destination::Hostname(h) => Some(format!("host/{}/{}", h.namespace, h.hostname)),
        gateway_address::Destination::Address(n) => {
            Some(format!("ip/{}/{}", n.network, names::ip_of_bytes(&n.address)?))
        }
    }
}

/// The waypoint addresses an Address binds to (a Service's primary and weighted waypoints, a
/// workload's waypoint), as index keys.
pub(crate) fn bound_keys(a: &Address) -> Vec<String> {
    match &a.r#type {
        Some(address::Type::Service(s)) => s
            .waypoint
            .iter()
            .chain(s.weighted_waypoints.iter().filter_map(|w| w.destination.as_ref()))
            .filter_map(gateway_key)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        Some(address::Type::Workload(w)) => w.waypoint.iter().filter_map(gateway_key).collect(),
        None => Vec::new(),
    }
}

impl State {
    /// The published Destination named `name`.
    pub(crate) fn destination(&self, name: &str) -> Option<&Destination> {
        self.destinations.get(name)
    }

    /// Every published Destination.
    pub(crate) fn destinations(&self) -> impl Iterator<Item = (&String, &Destination)> {
        self.destinations.iter()
    }

    /// Every published Policy.
    pub(crate) fn policies(&self) -> impl Iterator<Item = (&String, &Policy)> {
        self.policies.iter()
    }

    /// Every waypoint's configuration errors, sorted.
    pub(crate) fn errors(&self) -> Vec<ConfigError> {
        let mut out: Vec<ConfigError> =
            self.per_waypoint.values().flat_map(|p| p.errors.iter().cloned()).collect();
        out.sort();
        out
    }

    /// The waypoints whose configuration read the Address `name`.
    pub(crate) fn readers_of(&self, name: &str) -> impl Iterator<Item = &Name> {
        self.readers.get(name).into_iter().flatten()
    }

    /// Every waypoint configured now.
    pub(crate) fn waypoints(&self) -> impl Iterator<Item = &Name> {
        self.per_waypoint.keys()
    }

    /// Recomputes `waypoints` and records what changed.
    pub(crate) fn recompute(&mut self, view: &View<'_, '_>, waypoints: &BTreeSet<Name>, out: &mut Changes) {
        for wp in waypoints {
            let computed = compute(view, wp);
            let is_waypoint = computed.is_some();
            let config = computed.unwrap_or_default();
            let old = self.per_waypoint.remove(wp).unwrap_or_default();
            for input in &old.inputs {
                if let Some(set) = self.readers.get_mut(input) {
                    set.remove(wp);
                    if set.is_empty() {
                        self.readers.remove(input);
                    }
                }
            }
            for name in old.destinations.iter().filter(|n| !config.destinations.contains_key(*n)) {
                if self.destinations.remove(name).is_some() {
                    out.destinations.insert(name.clone(), None);
                }
            }
            for name in old.policies.iter().filter(|n| !config.policies.contains_key(*n)) {
                if self.policies.remove(name).is_some() {
                    out.policies.insert(name.clone(), None);
                }
            }
            let mut published = Published { errors: config.errors, ..Published::default() };
            for (name, d) in config.destinations {
                published.destinations.push(name.clone());
                if self.destinations.get(&name) != Some(&d) {
                    out.destinations.insert(name.clone(), Some(d.clone()));
                    self.destinations.insert(name, d);
                }
            }
            for (name, p) in config.policies {
                published.policies.push(name.clone());
                if self.policies.get(&name) != Some(&p) {
                    out.policies.insert(name.clone(), Some(p.clone()));
                    self.policies.insert(name, p);
                }
            }
            for input in &config.inputs {
                self.readers.entry(input.clone()).or_default().insert(wp.clone());
            }
            published.inputs = config.inputs.into_iter().collect();
            // A waypoint with nothing bound yet still counts as configured (policy reports).
            if is_waypoint {
                self.per_waypoint.insert(wp.clone(), published);
            }
        }
    }
}

impl State {
    /// For each target of a policy's `targetRef` and `targetRefs`: the waypoints that enforce
    /// it there, or why none does.
    pub(crate) fn enforcement(
        &self,
        ctx: &Ctx<'_>,
        ap: &ambit_objects::istio::AuthorizationPolicy,
    ) -> Vec<crate::translate::explain::TargetStatus> {
        policies::targets(ap)
            .into_iter()
            .map(|t| match t {
                policies::Target::Gateway(g) if self.per_waypoint.contains_key(&g) => Ok(vec![g.to_string()]),
                policies::Target::Gateway(g) if ctx.store.gateways.contains_key(&g) => Err(format!(
                    "Gateway {g} is not a waypoint (it needs a status address, and class {WAYPOINT_CLASS} or an HBONE listener on 15008)"
                )),
                policies::Target::Gateway(g) => Err(format!("Gateway {g} does not exist")),
                policies::Target::Service(s) => {
                    let key = names::service_key(&s.ns, &names::service_hostname(&s, &ctx.settings.domain_suffix));
                    let wps: Vec<String> = self
                        .readers_of(&key)
                        .filter(|w| self.destinations.get(&scoped(w, &key)).is_some_and(|d| d.bound))
                        .map(ToString::to_string)
                        .collect();
                    if !wps.is_empty() {
                        Ok(wps)
                    } else if ctx.store.services.contains_key(&s) {
                        Err(format!("Service {s} is not bound to a waypoint (label istio.io/use-waypoint)"))
                    } else {
                        Err(format!("Service {s} does not exist"))
                    }
                }
                policies::Target::Other(what) => {
                    Err(format!("{what}: waypoints take policies for Gateways and Services only"))
                }
            })
            .collect()
    }
}

/// The Gateway `name` if it is a waypoint this module configures.
pub(super) fn waypoint_of<'a>(ctx: &Ctx<'a>, name: &Name) -> Option<waypoints::Waypoint<'a>> {
    let wp = waypoints::waypoint(ctx, name)?;
    let gw = wp.gateway();
    let hbone = gw.spec.listeners.iter().any(|l| l.protocol == "HBONE" && l.port == 15008);
    (gw.spec.gateway_class_name == WAYPOINT_CLASS || hbone).then_some(wp)
}

/// One waypoint's configuration, `None` when `name` is not a waypoint.
fn compute(view: &View<'_, '_>, name: &Name) -> Option<Config> {
    let wp = waypoint_of(view.ctx, name)?;
    let key = gateway_key(wp.address())?;
    let mut config = Config::default();
    let bound: Vec<&String> = view.bound.get(&key).into_iter().flatten().collect();
    let mut services: Vec<(String, &ambit_api::workload::Service)> = Vec::new();
    for n in bound {
        config.inputs.insert(n.clone());
        match view.addresses.get(n).and_then(|a| a.r#type.as_ref()) {
            Some(address::Type::Service(s)) => {
                config.inputs.extend(view.members.get(n).into_iter().flatten().cloned());
                let d = destinations::service(view, n, s, true);
                config.destinations.insert(scoped(name, n), d);
                services.push((n.clone(), s));
            }
            Some(address::Type::Workload(w)) => {
                config.destinations.insert(scoped(name, n), destinations::workload(view, w));
            }
            None => {}
        }
    }
    routes::attach(view, name, &wp, &services, &mut config);
    policies::attach(view, name, &services, &mut config);
    Some(config)
}
