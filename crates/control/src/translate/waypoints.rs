//! Waypoints and their binding to workloads and services (`control-plane.md` §2.5, §3.1).

use std::net::IpAddr;

use ambit_api::workload::{
    ApplicationTunnel, GatewayAddress, NamespacedHostname, NetworkAddress, WeightedWaypoint,
    application_tunnel, gateway_address,
};
use ambit_objects::gateway::Gateway;

use super::Ctx;
use super::names::{self, Labels, Name};

/// The HBONE port of every waypoint (istiod hard-codes it).
const WAYPOINT_HBONE_PORT: u32 = 15008;

/// A Gateway with a status address.
pub(crate) struct Waypoint<'a> {
    gw: &'a Gateway,
    name: Name,
    address: GatewayAddress,
    traffic: String,
}

/// What kind of client binds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum For {
    Workload,
    Service,
}

/// A service's waypoint fields.
#[derive(Default)]
pub(crate) struct ServiceWaypoint {
    pub waypoint: Option<GatewayAddress>,
    pub ingress_use_waypoint: bool,
    pub weighted: Vec<WeightedWaypoint>,
}

impl<'a> Waypoint<'a> {
    /// The Gateway.
    pub(crate) fn gateway(&self) -> &'a Gateway {
        self.gw
    }

    /// Where node proxies reach it (what bound Addresses name).
    pub(crate) fn address(&self) -> &GatewayAddress {
        &self.address
    }

    fn binds(&self, ctx: &Ctx<'_>, client_ns: &str, kind: For) -> bool {
        let traffic_ok = match kind {
            For::Workload => self.traffic == "workload" || self.traffic == "all",
            For::Service => self.traffic == "service" || self.traffic == "all",
        };
        traffic_ok && self.accepts(ctx, client_ns)
    }

    /// `allowedRoutes.namespaces` of the listener matching the inbound binding's port, else of
    /// the HBONE listener on 15008 (default `Same`).
    pub(crate) fn accepts(&self, ctx: &Ctx<'_>, client_ns: &str) -> bool {
        let binding_port = inbound_binding(ctx, self.gw).map(|t| t.port).filter(|p| *p != 0);
        let listeners = &self.gw.spec.listeners;
        let listener = binding_port
            .and_then(|p| listeners.iter().find(|l| u32::from(l.port) == p))
            .or_else(|| listeners.iter().find(|l| l.protocol == "HBONE" && l.port == 15008));
        let from = listener.and_then(|l| l.allowed_routes.as_ref()).and_then(|a| a.namespaces.as_ref());
        match from.map(|f| f.from.as_str()) {
            Some("All") => true,
            Some("Selector") => {
                let Some(sel) = from.and_then(|f| f.selector.as_ref()) else { return false };
                let mut labels = ctx
                    .store
                    .namespaces
                    .get(client_ns)
                    .map(|n| names::labels(&n.metadata).clone())
                    .unwrap_or_default();
                // The API server sets this label on every namespace; YAML often lacks it.
                labels.entry(names::METADATA_NAME_LABEL.to_owned()).or_insert_with(|| client_ns.to_owned());
                names::selector_matches(sel, &labels)
            }
            _ => client_ns == self.name.ns,
        }
    }
}

/// The waypoint `name`, if that Gateway exists and has an address.
pub(crate) fn waypoint<'a>(ctx: &Ctx<'a>, name: &Name) -> Option<Waypoint<'a>> {
    let gw = ctx.store.gateways.get(name)?;
    let addresses = &gw.status.as_ref()?.addresses;
    let address = if let Some(h) = addresses.iter().find(|a| a.kind == "Hostname") {
        gateway_address::Destination::Hostname(NamespacedHostname {
            namespace: name.ns.clone(),
            hostname: h.value.clone(),
        })
    } else {
        let ip = addresses
            .iter()
            .filter(|a| a.kind.is_empty() || a.kind == "IPAddress")
            .find_map(|a| a.value.parse::<IpAddr>().ok())?;
        gateway_address::Destination::Address(NetworkAddress {
            network: ctx.network.to_owned(),
            address: names::ip_bytes(ip),
            length: None,
        })
    };
    let class = ctx.store.gateway_classes.get(&gw.spec.gateway_class_name);
    let traffic = names::labels(&gw.metadata)
        .get(names::WAYPOINT_FOR)
        .or_else(|| class.and_then(|c| names::labels(&c.metadata).get(names::WAYPOINT_FOR)))
        .cloned()
        .unwrap_or_else(|| "service".to_owned());
    Some(Waypoint {
        gw,
        name: name.clone(),
        address: GatewayAddress { destination: Some(address), hbone_mtls_port: WAYPOINT_HBONE_PORT },
        traffic,
    })
}

/// The waypoint a labelled object asks for: `Some(None)` for `none`, `None` when it does not say.
fn requested(labels: &Labels, ns: &str, label: &str, ns_label: &str) -> Option<Option<Name>> {
    let v = labels.get(label)?;
    if v == "none" {
        return Some(None);
    }
    let wns = labels.get(ns_label).map_or(ns, String::as_str);
    Some(Some(Name::new(wns, v.as_str())))
}

fn namespace_labels<'a>(ctx: &Ctx<'a>, ns: &str) -> &'a Labels {
    ctx.store.namespaces.get(ns).map_or(&names::EMPTY, |n| names::labels(&n.metadata))
}

/// If a pod with these labels is an instance of a waypoint in its namespace: its application
/// tunnel (step 1 of §2.5), `Some(None)` when the waypoint names none.
pub(crate) fn instance(
    ctx: &Ctx<'_>,
    ns: &str,
    labels: &Labels,
    deps: &mut Vec<Name>,
) -> Option<Option<ApplicationTunnel>> {
    let gw = labels.get(names::GATEWAY_NAME_LABEL)?;
    let name = Name::new(ns, gw.as_str());
    deps.push(name.clone());
    let wp = waypoint(ctx, &name)?;
    Some(inbound_binding(ctx, wp.gw))
}

/// A workload's waypoint (§2.5 steps 2–4); `labels` are the object's own.
pub(crate) fn for_workload(
    ctx: &Ctx<'_>,
    ns: &str,
    labels: &Labels,
    deps: &mut Vec<Name>,
) -> Option<GatewayAddress> {
    let req = requested(labels, ns, names::USE_WAYPOINT, names::USE_WAYPOINT_NAMESPACE).or_else(|| {
        requested(namespace_labels(ctx, ns), ns, names::USE_WAYPOINT, names::USE_WAYPOINT_NAMESPACE)
    })??;
    deps.push(req.clone());
    let wp = waypoint(ctx, &req)?;
    wp.binds(ctx, ns, For::Workload).then(|| wp.address.clone())
}

/// A Service's or ServiceEntry's waypoint fields (§3.1 `waypoint`, `ingress_use_waypoint`,
/// `weighted_waypoints`).
pub(crate) fn for_service(
    ctx: &Ctx<'_>,
    ns: &str,
    labels: &Labels,
    annotations: &Labels,
    deps: &mut Vec<Name>,
) -> ServiceWaypoint {
    if matches!(
        labels.get(names::MANAGED_LABEL).map(String::as_str),
        Some("istio.io-mesh-controller" | "istio.io-eastwest-controller")
    ) {
        return ServiceWaypoint::default();
    }
    let ns_labels = namespace_labels(ctx, ns);
    let own = labels.contains_key(names::USE_WAYPOINT);
    let req = requested(labels, ns, names::USE_WAYPOINT, names::USE_WAYPOINT_NAMESPACE)
        .or_else(|| requested(ns_labels, ns, names::USE_WAYPOINT, names::USE_WAYPOINT_NAMESPACE))
        .flatten();
    let Some(req) = req else { return ServiceWaypoint::default() };
    deps.push(req.clone());
    let Some(wp) = waypoint(ctx, &req).filter(|w| w.binds(ctx, ns, For::Service)) else {
        return ServiceWaypoint::default();
    };
    let ingress = labels
        .get(names::INGRESS_USE_WAYPOINT)
        .or_else(|| ns_labels.get(names::INGRESS_USE_WAYPOINT))
        .and_then(|v| names::parse_bool(v))
        .unwrap_or(false);
    // The canary is read from the object that named the primary's fallback: the Service when
    // it has its own use-waypoint, else the Namespace.
    let canary_src = if own { labels } else { ns_labels };
    let canary_annotations = if own {
        Some(annotations)
    } else {
        ctx.store.namespaces.get(ns).map(|n| names::annotations(&n.metadata))
    };
    let weighted = canary(ctx, ns, canary_src, canary_annotations, &req, &wp, deps).unwrap_or_default();
    ServiceWaypoint { waypoint: Some(wp.address.clone()), ingress_use_waypoint: ingress, weighted }
}

/// `[{primary, 100 − w}, {canary, w}]`, or `None` when the canary is absent, equal to the
/// primary, unusable, or its weight is not 0–100.
fn canary(
    ctx: &Ctx<'_>,
    ns: &str,
    labels: &Labels,
    annotations: Option<&Labels>,
    primary: &Name,
    primary_wp: &Waypoint<'_>,
    deps: &mut Vec<Name>,
) -> Option<Vec<WeightedWaypoint>> {
    let canary = requested(labels, ns, names::USE_WAYPOINT_CANARY, names::USE_WAYPOINT_CANARY_NAMESPACE)??;
    if &canary == primary {
        return None;
    }
    deps.push(canary.clone());
    let weight = match annotations.and_then(|a| a.get(names::CANARY_WEIGHT_ANNOTATION)) {
        None => 0,
        Some(w) => w.parse::<u32>().ok().filter(|w| *w <= 100)?,
    };
    let cwp = waypoint(ctx, &canary).filter(|w| w.binds(ctx, ns, For::Service))?;
    Some(vec![
        WeightedWaypoint { destination: Some(primary_wp.address.clone()), weight: 100 - weight },
        WeightedWaypoint { destination: Some(cwp.address.clone()), weight },
    ])
}

/// `ambient.istio.io/waypoint-inbound-binding` on the Gateway, else its class:
/// `PROXY` | `NONE`, optionally `/<port>`.
fn inbound_binding(ctx: &Ctx<'_>, gw: &Gateway) -> Option<ApplicationTunnel> {
    let class = ctx.store.gateway_classes.get(&gw.spec.gateway_class_name);
    let v = names::annotations(&gw.metadata).get(names::INBOUND_BINDING_ANNOTATION).or_else(|| {
        class.and_then(|c| names::annotations(&c.metadata).get(names::INBOUND_BINDING_ANNOTATION))
    })?;
    let (proto, port) = match v.split_once('/') {
        Some((p, port)) => (p, port.parse::<u16>().ok()?),
        None => (v.as_str(), 0),
    };
    let protocol = match proto {
        "PROXY" => application_tunnel::Protocol::Proxy,
        "NONE" => application_tunnel::Protocol::None,
        _ => return None,
    };
    Some(ApplicationTunnel { protocol: protocol as i32, port: u32::from(port) })
}
