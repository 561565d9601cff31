//! The graph the page draws, from one [`Snapshot`]: workloads (pods grouped by the workload
//! the control plane names them by, the Deployment for its pods), the Services between them,
//! waypoints marked, and edges from the node proxies' `istio_tcp_*` counters and the waypoints'
//! `istio_requests_total`.
//!
//! Each connection is counted once: by the destination's proxy when one reported the pair
//! (it knows the peer's verified identity and its own verdict), else by the source's (a
//! destination outside the mesh). A connection to a Service's address is drawn through the
//! Service: source → Service → the workload that served it. Rates are the growth since the
//! previous refresh.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde::Serialize;

use super::collect::{Family, Series, Snapshot, Workload};

/// A node's id: `workload/NS/NAME`, `service/NS/NAME` or `external/unknown`.
pub fn workload_id(namespace: &str, name: &str) -> String {
    format!("workload/{namespace}/{name}")
}

/// A Service's node id.
pub fn service_id(namespace: &str, name: &str) -> String {
    format!("service/{namespace}/{name}")
}

/// Traffic whose peer is not a known workload.
pub const EXTERNAL: &str = "external/unknown";

/// The page's graph.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Graph {
    /// When it was read.
    pub generated: String,
    /// Where from.
    pub source: String,
    /// Seconds between refreshes.
    pub interval: u64,
    /// What could not be read.
    pub problems: Vec<String>,
    /// Namespaces.
    pub namespaces: Vec<Namespace>,
    /// Workloads, waypoints, Services, the outside.
    pub nodes: Vec<Node>,
    /// Traffic.
    pub edges: Vec<Edge>,
}

/// A namespace.
#[derive(Clone, Debug, Serialize)]
pub struct Namespace {
    /// Name.
    pub name: String,
    /// Whether any of its pods is in the mesh.
    pub ambient: bool,
}

/// A node of the graph.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Its id.
    pub id: String,
    /// `workload`, `waypoint`, `service` or `external`.
    pub kind: &'static str,
    /// Namespace (`""` for the outside).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Pods (a Service's: the pods it selects).
    pub pods: usize,
    /// SPIFFE identity (workloads).
    pub identity: String,
    /// In the mesh.
    pub enrolled: bool,
    /// Policies that apply to it.
    pub policies: usize,
    /// Connections and requests denied into it.
    pub denied: u64,
    /// A Service's waypoint (`namespace/name`).
    pub waypoint: Option<String>,
}

/// Traffic from one node to another.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Edge {
    /// `SOURCE->TARGET`.
    pub id: String,
    /// Source node id.
    pub source: String,
    /// Target node id.
    pub target: String,
    /// Connections opened (since the proxies started).
    pub connections: u64,
    /// Connections opened per second, lately.
    pub connections_per_second: f64,
    /// Bytes both ways.
    pub bytes: u64,
    /// Bytes per second, lately.
    pub bytes_per_second: f64,
    /// HTTP requests through a waypoint.
    pub requests: u64,
    /// Requests per second, lately.
    pub requests_per_second: f64,
    /// Requests not answered with 1xx–3xx.
    pub errors: u64,
    /// Connections and requests denied by policy.
    pub denied: u64,
    /// `all`, `some` or `none` of its connections with mutual TLS.
    pub mtls: &'static str,
    /// The source identities seen.
    pub identities: Vec<String>,
    #[serde(skip)]
    mtls_count: f64,
    #[serde(skip)]
    plain_count: f64,
    #[serde(skip)]
    denied_mtls: f64,
    #[serde(skip)]
    denied_plain: f64,
}

/// The workload groups of a snapshot: `(namespace, workload)` → its pods.
pub fn groups(s: &Snapshot) -> BTreeMap<(String, String), Vec<&Workload>> {
    let mut out: BTreeMap<(String, String), Vec<&Workload>> = BTreeMap::new();
    for w in &s.workloads {
        out.entry((w.namespace.clone(), w.workload.clone())).or_default().push(w);
    }
    out
}

/// The waypoints' Gateways (`(namespace, name)`) of a snapshot.
pub fn waypoints(s: &Snapshot) -> BTreeSet<(String, String)> {
    s.services.iter().filter_map(|svc| svc.waypoint.as_deref()).map(super::collect::split_key).collect()
}

/// What one refresh keeps for the next one's rates.
#[derive(Debug, Default)]
pub struct Previous {
    at: Option<Instant>,
    totals: BTreeMap<String, (u64, u64, u64)>,
}

/// Builds the graph; `previous` turns totals into rates and is updated.
pub fn build(
    s: &Snapshot,
    policies: impl Fn(&str) -> usize,
    previous: &mut Previous,
    interval: u64,
) -> Graph {
    let groups = groups(s);
    let waypoints = waypoints(s);
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    for ((ns, name), pods) in &groups {
        let id = workload_id(ns, name);
        let kind = if waypoints.contains(&(ns.clone(), name.clone())) { "waypoint" } else { "workload" };
        nodes.insert(
            id.clone(),
            Node {
                kind,
                namespace: ns.clone(),
                name: name.clone(),
                pods: pods.len(),
                identity: pods
                    .iter()
                    .map(|p| p.identity.as_str())
                    .find(|i| !i.is_empty())
                    .unwrap_or("")
                    .into(),
                enrolled: pods.iter().any(|p| p.enrolled),
                policies: policies(&id),
                denied: 0,
                waypoint: None,
                id,
            },
        );
    }
    for svc in &s.services {
        // A waypoint's own Service stands for the waypoint, which is drawn.
        if waypoints.contains(&(svc.namespace.clone(), svc.name.clone())) {
            continue;
        }
        let key = format!("{}/{}", svc.namespace, svc.hostname);
        let members: Vec<&Workload> = s.workloads.iter().filter(|w| w.services.contains(&key)).collect();
        let id = service_id(&svc.namespace, &svc.name);
        nodes.insert(
            id.clone(),
            Node {
                kind: "service",
                namespace: svc.namespace.clone(),
                name: svc.name.clone(),
                pods: members.len(),
                identity: String::new(),
                enrolled: members.iter().any(|w| w.enrolled),
                policies: policies(&id),
                denied: 0,
                waypoint: svc.waypoint.clone(),
                id,
            },
        );
    }
    let mut edges: BTreeMap<String, Edge> = BTreeMap::new();
    let mut external = false;
    let known = |ns: &str, name: &str| groups.contains_key(&(ns.to_owned(), name.to_owned()));
    let mut node_of = |ns: &str, name: &str| {
        if known(ns, name) {
            workload_id(ns, name)
        } else {
            external = true;
            EXTERNAL.to_owned()
        }
    };
    // Which (source, destination) pairs a destination proxy reported.
    let l4: Vec<&Series> = s.series.iter().filter(|x| x.family != Family::Requests).collect();
    let mut reported_by_destination = BTreeSet::new();
    let mut keyed = Vec::new();
    for x in l4 {
        let src = node_of(x.label("source_workload_namespace"), x.label("source_workload"));
        let dst = node_of(x.label("destination_workload_namespace"), x.label("destination_workload"));
        let svc = service_node(
            &nodes,
            x.label("destination_service_namespace"),
            x.label("destination_service_name"),
        );
        if x.label("reporter") == "destination" {
            reported_by_destination.insert((src.clone(), dst.clone()));
        }
        keyed.push(((src, svc, dst), x));
    }
    for ((src, svc, dst), x) in keyed {
        // The source's proxy may not know the Service a pod's address belongs to; the
        // destination's does, and its view is the one drawn.
        if x.label("reporter") != "destination"
            && reported_by_destination.contains(&(src.clone(), dst.clone()))
        {
            continue;
        }
        let hops = match &svc {
            Some(svc) => vec![(src.clone(), svc.clone()), (svc.clone(), dst.clone())],
            None => vec![(src.clone(), dst.clone())],
        };
        for (i, (from, to)) in hops.into_iter().enumerate() {
            let e = edge(&mut edges, &from, &to);
            add_l4(e, x, i == 0);
        }
    }
    // The waypoints' requests: source (by identity) → Service → the workload that answered.
    let by_identity: BTreeMap<&str, BTreeSet<String>> =
        groups.iter().fold(BTreeMap::new(), |mut m, ((ns, n), pods)| {
            for p in pods.iter().filter(|p| !p.identity.is_empty()) {
                m.entry(p.identity.as_str()).or_insert_with(BTreeSet::new).insert(workload_id(ns, n));
            }
            m
        });
    for x in s.series.iter().filter(|x| x.family == Family::Requests) {
        let src = match by_identity.get(x.label("source_principal")) {
            Some(ids) if ids.len() == 1 => ids.iter().next().cloned().unwrap_or_default(),
            _ => {
                external = true;
                EXTERNAL.to_owned()
            }
        };
        let Some(svc) = service_node(
            &nodes,
            x.label("destination_service_namespace"),
            x.label("destination_service_name"),
        ) else {
            continue;
        };
        add_requests(edge(&mut edges, &src, &svc), x, true);
        let (dns, dname) = (x.label("destination_workload_namespace"), x.label("destination_workload"));
        if known(dns, dname) {
            add_requests(edge(&mut edges, &svc, &workload_id(dns, dname)), x, false);
        }
    }
    if external || edges.values().any(|e| e.source == EXTERNAL || e.target == EXTERNAL) {
        nodes.insert(
            EXTERNAL.to_owned(),
            Node {
                id: EXTERNAL.to_owned(),
                kind: "external",
                namespace: String::new(),
                name: "unknown".into(),
                pods: 0,
                identity: String::new(),
                enrolled: false,
                policies: 0,
                denied: 0,
                waypoint: None,
            },
        );
    }
    let now = Instant::now();
    let elapsed = previous.at.map(|at| now.duration_since(at).as_secs_f64()).filter(|s| *s > 0.0);
    let mut totals = BTreeMap::new();
    for e in edges.values_mut() {
        // What carried traffic decides; an edge of denied attempts only, what they were.
        let (mtls, plain) = if e.mtls_count + e.plain_count > 0.0 {
            (e.mtls_count, e.plain_count)
        } else {
            (e.denied_mtls, e.denied_plain)
        };
        e.mtls = match (mtls > 0.0, plain > 0.0) {
            (true, false) => "all",
            (true, true) => "some",
            _ => "none",
        };
        e.identities.sort();
        e.identities.dedup();
        let before = previous.totals.get(&e.id).copied();
        if let (Some(dt), Some((c, b, r))) = (elapsed, before) {
            #[allow(clippy::cast_precision_loss)]
            let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / dt;
            e.connections_per_second = rate(e.connections, c);
            e.bytes_per_second = rate(e.bytes, b);
            e.requests_per_second = rate(e.requests, r);
        }
        totals.insert(e.id.clone(), (e.connections, e.bytes, e.requests));
        if let Some(n) = nodes.get_mut(&e.target) {
            n.denied += e.denied;
        }
    }
    *previous = Previous { at: Some(now), totals };
    let mut namespaces: BTreeMap<String, bool> = BTreeMap::new();
    for n in nodes.values().filter(|n| !n.namespace.is_empty()) {
        *namespaces.entry(n.namespace.clone()).or_default() |= n.enrolled;
    }
    Graph {
        generated: s.generated.clone(),
        source: s.source.clone(),
        interval,
        problems: s.problems.clone(),
        namespaces: namespaces.into_iter().map(|(name, ambient)| Namespace { name, ambient }).collect(),
        nodes: nodes.into_values().collect(),
        edges: edges.into_values().collect(),
    }
}

/// The Service node a series names, when it is drawn.
fn service_node(nodes: &BTreeMap<String, Node>, ns: &str, name: &str) -> Option<String> {
    let id = service_id(ns, name);
    nodes.get(&id).filter(|n| n.kind == "service").map(|_| id)
}

fn edge<'a>(edges: &'a mut BTreeMap<String, Edge>, from: &str, to: &str) -> &'a mut Edge {
    let id = format!("{from}->{to}");
    edges.entry(id.clone()).or_insert_with(|| Edge {
        id,
        source: from.to_owned(),
        target: to.to_owned(),
        ..Edge::default()
    })
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn count(v: f64) -> u64 {
    v.max(0.0) as u64
}

/// A node proxy's series on an edge; `first` is the hop that carries the source's identity.
fn add_l4(e: &mut Edge, x: &Series, first: bool) {
    let mtls = x.label("connection_security_policy") == "mutual_tls";
    match x.family {
        Family::Opened => {
            e.connections += count(x.value);
            if mtls {
                e.mtls_count += x.value;
            } else {
                e.plain_count += x.value;
            }
        }
        Family::Failed if x.label("response_flags") == "DENY" => {
            e.denied += count(x.value);
            if mtls {
                e.denied_mtls += x.value;
            } else {
                e.denied_plain += x.value;
            }
        }
        Family::Sent | Family::Received => e.bytes += count(x.value),
        Family::Failed | Family::Requests => {}
    }
    let principal = x.label("source_principal");
    if first
        && !principal.is_empty()
        && principal != "unknown"
        && matches!(x.family, Family::Opened | Family::Failed)
    {
        e.identities.push(principal.to_owned());
    }
}

/// A waypoint's `istio_requests_total` series on an edge.
fn add_requests(e: &mut Edge, x: &Series, first: bool) {
    let n = count(x.value);
    e.requests += n;
    let code: u16 = x.label("response_code").parse().unwrap_or(0);
    if !(100..400).contains(&code) {
        e.errors += n;
    }
    if x.label("response_flags") == "RBAC" {
        e.denied += n;
    }
    if x.label("connection_security_policy") == "mutual_tls" {
        e.mtls_count += x.value;
    } else {
        e.plain_count += x.value;
    }
    let principal = x.label("source_principal");
    if first && !principal.is_empty() && principal != "unknown" {
        e.identities.push(principal.to_owned());
    }
}

#[cfg(test)]
mod tests;
