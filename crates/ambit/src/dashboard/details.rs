//! What a click shows: a node's pods, identity, certificates, the policies that apply to it (in
//! the control plane's words, as `ambit inspect policies` shows them) and the last connections
//! denied into it; an edge's recent connections (the node proxies' access logs), its denials and
//! the policies that denied them, and its HTTP answers by code.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use super::collect::{Denial, Family, Snapshot, Workload, split_key};
use super::graph::{self, EXTERNAL, Graph};
use super::logs::{self, ip_of};

/// Istio's root namespace: a PeerAuthentication there is mesh-wide.
const ROOT_NAMESPACE: &str = "istio-system";

/// The name of the policy the control plane derives from STRICT PeerAuthentications.
const STATIC_STRICT: &str = "istio_converted_static_strict";

/// A policy in words.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// `AuthorizationPolicy` or `PeerAuthentication`.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `ALLOW`, `DENY`, `STRICT`, …
    pub action: String,
    /// What it applies to.
    pub applies_to: String,
    /// Who enforces it.
    pub enforced_by: String,
    /// What it does, one line per rule.
    pub rules: Vec<String>,
    /// What differs from what was written.
    pub warnings: Vec<String>,
}

/// A pod of a node.
#[derive(Debug, Serialize)]
pub struct Pod {
    name: String,
    node: String,
    ip: String,
    phase: String,
    enrolled: String,
}

/// A Service, for a workload's panel.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSummary {
    namespace: String,
    name: String,
    cluster_ip: String,
    ports: Vec<String>,
}

/// A node's panel.
#[derive(Debug, Serialize)]
pub struct NodeDetails {
    id: String,
    kind: String,
    namespace: String,
    name: String,
    identity: String,
    waypoint: Option<String>,
    pods: Vec<Pod>,
    certificates: Vec<super::collect::Certificate>,
    policies: Vec<Policy>,
    denials: Vec<Denial>,
    services: Vec<ServiceSummary>,
    workloads: Vec<String>,
}

/// One recent connection of an edge.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    time: String,
    reporter: String,
    direction: String,
    source_address: String,
    destination_address: String,
    service: String,
    identity: String,
    bytes_sent: u64,
    bytes_received: u64,
    duration: String,
    error: Option<String>,
}

/// HTTP answers of one code.
#[derive(Debug, Serialize)]
pub struct Answers {
    code: String,
    count: u64,
    flags: String,
}

/// An edge's panel.
#[derive(Debug, Serialize)]
pub struct EdgeDetails {
    id: String,
    source: String,
    target: String,
    connections: Vec<Connection>,
    denials: Vec<Denial>,
    policies: Vec<Policy>,
    requests: Vec<Answers>,
}

/// Most recent connections an edge's panel lists.
pub const MAX_CONNECTIONS: usize = 50;

/// Who is who in a snapshot: pods by address, by name and by workload; policy reports by
/// kind and name, and by the waypoints that enforce them. Built once per refresh, so that
/// what each of the graph's nodes asks costs a lookup, not a pass over every pod and report.
pub struct Index<'a> {
    s: &'a Snapshot,
    by_ip: BTreeMap<&'a str, &'a Workload>,
    by_pod: BTreeMap<(&'a str, &'a str), &'a Workload>,
    by_workload: BTreeMap<(&'a str, &'a str), Vec<&'a Workload>>,
    reports: BTreeMap<(&'a str, &'a str, &'a str), &'a Value>,
    at_waypoint: BTreeMap<&'a str, Vec<&'a Value>>,
}

impl<'a> Index<'a> {
    /// Indexes a snapshot.
    pub fn new(s: &'a Snapshot) -> Index<'a> {
        let mut by_ip = BTreeMap::new();
        let mut by_pod = BTreeMap::new();
        let mut by_workload: BTreeMap<_, Vec<_>> = BTreeMap::new();
        for w in &s.workloads {
            for a in &w.addresses {
                by_ip.insert(a.as_str(), w);
            }
            by_pod.insert((w.namespace.as_str(), w.pod.as_str()), w);
            by_workload.entry((w.namespace.as_str(), w.workload.as_str())).or_default().push(w);
        }
        let mut reports = BTreeMap::new();
        let mut at_waypoint: BTreeMap<_, Vec<_>> = BTreeMap::new();
        for r in &s.reports {
            if let (Some(kind), Some(ns), Some(name)) =
                (r["kind"].as_str(), r["namespace"].as_str(), r["name"].as_str())
            {
                reports.entry((kind, ns, name)).or_insert(r);
            }
            for w in r["waypoints"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                at_waypoint.entry(w).or_default().push(r);
            }
        }
        Index { s, by_ip, by_pod, by_workload, reports, at_waypoint }
    }

    /// The node of the workload at `ip`, else the outside.
    fn node_at(&self, ip: &str) -> String {
        self.by_ip
            .get(ip)
            .map_or_else(|| EXTERNAL.to_owned(), |w| graph::workload_id(&w.namespace, &w.workload))
    }

    /// The node of pod `namespace/pod`.
    fn node_of_pod(&self, key: &str) -> Option<String> {
        let (ns, pod) = split_key(key);
        self.by_pod.get(&(ns.as_str(), pod.as_str())).map(|w| graph::workload_id(&w.namespace, &w.workload))
    }

    /// The Service node of `hostname`, when drawn.
    fn service_of_host(&self, hostname: &str, graph: &Graph) -> Option<String> {
        let svc = self.s.services.iter().find(|s| s.hostname == hostname)?;
        let id = graph::service_id(&svc.namespace, &svc.name);
        graph.nodes.iter().any(|n| n.id == id && n.kind == "service").then_some(id)
    }

    /// The pods of a Service node.
    fn members(&self, service: &str) -> Vec<&'a Workload> {
        let Some((ns, name)) = service.strip_prefix("service/").and_then(|r| r.split_once('/')) else {
            return Vec::new();
        };
        let Some(svc) = self.s.services.iter().find(|s| s.namespace == ns && s.name == name) else {
            return Vec::new();
        };
        let key = format!("{}/{}", svc.namespace, svc.hostname);
        self.s.workloads.iter().filter(|w| w.services.contains(&key)).collect()
    }

    /// Whether traffic from node `src` through Service `svc` (if any) to node `dst` is on
    /// edge `from → to`.
    fn on_edge(&self, from: &str, to: &str, src: &str, svc: Option<&str>, dst: &str) -> bool {
        match svc {
            Some(svc) => (from == src && to == svc) || (from == svc && to == dst),
            None => from == src && to == dst,
        }
    }

    /// The policies that apply to node `id`, in words.
    pub fn policies(&self, id: &str) -> Vec<Policy> {
        let s = self.s;
        let mut out = Vec::new();
        if let Some((ns, name)) = id.strip_prefix("workload/").and_then(|r| r.split_once('/')) {
            let pods = self.by_workload.get(&(ns, name)).into_iter().flatten();
            let mut named: BTreeSet<&str> =
                pods.flat_map(|w| w.policies.iter().map(String::as_str)).collect();
            for (key, scope) in &s.scopes {
                let (pns, _) = split_key(key);
                if scope == "GLOBAL" || (scope == "NAMESPACE" && pns == ns) {
                    named.insert(key);
                }
            }
            for key in named {
                out.extend(self.published(key, ns));
            }
            // A waypoint enforces what targets it.
            let gateway = format!("{ns}/{name}");
            out.extend(self.at_waypoint(&gateway));
        } else if let Some((ns, name)) = id.strip_prefix("service/").and_then(|r| r.split_once('/')) {
            let svc = s.services.iter().find(|x| x.namespace == ns && x.name == name);
            if let Some(w) = svc.and_then(|x| x.waypoint.as_deref()) {
                out.extend(self.at_waypoint(w));
            }
        }
        out.dedup_by(|a, b| a.namespace == b.namespace && a.name == b.name && a.kind == b.kind);
        out
    }

    /// The reports of the policies a waypoint (`namespace/name`) enforces.
    fn at_waypoint(&self, gateway: &str) -> Vec<Policy> {
        self.at_waypoint.get(gateway).into_iter().flatten().map(|r| policy(r)).collect()
    }

    /// What a published policy (`namespace/name`) comes from, for a workload in `namespace`.
    fn published(&self, key: &str, namespace: &str) -> Vec<Policy> {
        let (ns, name) = split_key(key);
        let reports = &self.s.reports;
        let find = |kind: &str, ns: &str, name: &str| self.reports.get(&(kind, ns, name)).map(|r| policy(r));
        if name == STATIC_STRICT {
            let strict: Vec<Policy> = reports
                .iter()
                .filter(|r| r["kind"] == "PeerAuthentication" && r["action"] == "STRICT")
                .filter(|r| r["namespace"] == namespace || r["namespace"] == ROOT_NAMESPACE)
                .map(policy)
                .collect();
            if !strict.is_empty() {
                return strict;
            }
        }
        if let Some(pa) = name.strip_prefix("converted_peer_authentication_") {
            return find("PeerAuthentication", &ns, pa).into_iter().collect();
        }
        match find("AuthorizationPolicy", &ns, &name) {
            Some(p) => vec![p],
            None => vec![Policy {
                kind: "AuthorizationPolicy".into(),
                namespace: ns,
                name: name.clone(),
                action: String::new(),
                applies_to: String::new(),
                enforced_by: "node proxies".into(),
                rules: vec![ambit_control::translate::explain::origin(key)],
                warnings: Vec::new(),
            }],
        }
    }

    /// A node's panel; `None` when the graph has no such node.
    pub fn node(&self, id: &str, graph: &Graph) -> Option<NodeDetails> {
        let n = graph.nodes.iter().find(|n| n.id == id)?;
        let s = self.s;
        let pods: Vec<&Workload> = match n.kind {
            "service" => self.members(id),
            "external" => Vec::new(),
            _ => self.by_workload.get(&(n.namespace.as_str(), n.name.as_str())).cloned().unwrap_or_default(),
        };
        let pod_names: BTreeSet<String> = pods.iter().map(|w| format!("{}/{}", w.namespace, w.pod)).collect();
        let services = match n.kind {
            "service" => {
                s.services.iter().filter(|x| graph::service_id(&x.namespace, &x.name) == id).collect()
            }
            _ => s
                .services
                .iter()
                .filter(|x| {
                    pods.iter().any(|w| w.services.contains(&format!("{}/{}", x.namespace, x.hostname)))
                })
                .collect::<Vec<_>>(),
        };
        let mut certificates: Vec<_> = s
            .certificates
            .iter()
            .filter(|c| !n.identity.is_empty() && c.identity == n.identity)
            .cloned()
            .collect();
        certificates.sort_by(|a, b| a.node.cmp(&b.node));
        Some(NodeDetails {
            id: n.id.clone(),
            kind: n.kind.to_owned(),
            namespace: n.namespace.clone(),
            name: n.name.clone(),
            identity: n.identity.clone(),
            waypoint: n.waypoint.clone(),
            pods: pods
                .iter()
                .map(|w| {
                    let record = s.pods.get(&(w.namespace.clone(), w.pod.clone()));
                    Pod {
                        name: w.pod.clone(),
                        node: w.node.clone(),
                        ip: w.addresses.join(", "),
                        phase: record.map_or_else(|| w.status.clone(), |r| r.phase.clone()),
                        enrolled: match record {
                            Some(r) if !r.redirection.is_empty() => r.redirection.clone(),
                            _ if w.enrolled => "enabled".into(),
                            _ => "no".into(),
                        },
                    }
                })
                .collect(),
            certificates,
            policies: self.policies(id),
            denials: s.denials.iter().rev().filter(|d| pod_names.contains(&d.destination)).cloned().collect(),
            services: services
                .into_iter()
                .map(|x| ServiceSummary {
                    namespace: x.namespace.clone(),
                    name: x.name.clone(),
                    cluster_ip: x.addresses.join(", "),
                    ports: x.ports.clone(),
                })
                .collect(),
            workloads: if n.kind == "service" {
                let ids: BTreeSet<String> =
                    pods.iter().map(|w| graph::workload_id(&w.namespace, &w.workload)).collect();
                ids.into_iter().collect()
            } else {
                Vec::new()
            },
        })
    }

    /// An edge's panel; `None` when the graph has no such edge.
    pub fn edge(&self, id: &str, graph: &Graph) -> Option<EdgeDetails> {
        let e = graph.edges.iter().find(|e| e.id == id)?;
        let (from, to) = (e.source.as_str(), e.target.as_str());
        let s = self.s;
        let is_service = |n: &str| n.starts_with("service/");
        // Denials: source by address, destination by pod, through the Service when the edge
        // touches one that selects the destination.
        let denials: Vec<Denial> = s
            .denials
            .iter()
            .rev()
            .filter(|d| {
                let src = self.node_at(ip_of(&d.source_address));
                let Some(dst) = self.node_of_pod(&d.destination) else { return false };
                let via = [from, to].into_iter().find(|n| {
                    is_service(n)
                        && self
                            .members(n)
                            .iter()
                            .any(|w| format!("{}/{}", w.namespace, w.pod) == d.destination)
                });
                self.on_edge(from, to, &src, via, &dst)
            })
            .cloned()
            .collect();
        let mut policies = Vec::new();
        for d in &denials {
            let (ns, _) = split_key(&d.destination);
            for p in &d.policies {
                for x in self.published(p, &ns) {
                    if !policies.contains(&x) {
                        policies.push(x);
                    }
                }
            }
        }
        // Requests a waypoint denied on this edge: the policies it enforces.
        if e.requests > 0 && e.denied > 0 && is_service(to) {
            for x in self.policies(to) {
                if !policies.contains(&x) {
                    policies.push(x);
                }
            }
        }
        Some(EdgeDetails {
            id: e.id.clone(),
            source: from.to_owned(),
            target: to.to_owned(),
            connections: self.connections(from, to, graph),
            denials,
            policies,
            requests: self.requests(from, to),
        })
    }

    /// The edge's recent connections in the node proxies' access logs, newest first: the
    /// destination proxies' lines where there are any (each connection once), else the sources'.
    fn connections(&self, from: &str, to: &str, graph: &Graph) -> Vec<Connection> {
        let mut lines = Vec::new();
        for (node, path) in &self.s.logs {
            for l in logs::tail(node, path) {
                let src = self.node_at(ip_of(l.get("src.addr")));
                let hbone = l.get("dst.hbone_addr");
                let dst_ip = ip_of(if hbone.is_empty() { l.get("dst.addr") } else { hbone });
                let dst = self.node_at(dst_ip);
                // A failed connection's line names no Service: the edge's, if it selects the pod.
                let svc = self.service_of_host(l.get("dst.service"), graph).or_else(|| {
                    [from, to]
                        .into_iter()
                        .find(|n| self.members(n).iter().any(|w| w.addresses.iter().any(|a| a == dst_ip)))
                        .map(str::to_owned)
                });
                if self.on_edge(from, to, &src, svc.as_deref(), &dst) {
                    lines.push(l);
                }
            }
        }
        let inbound = lines.iter().any(|l| l.get("direction") == "inbound");
        lines.retain(|l| !inbound || l.get("direction") == "inbound");
        lines.sort_by(|a, b| b.time.cmp(&a.time));
        lines.truncate(MAX_CONNECTIONS);
        lines
            .into_iter()
            .map(|l| {
                let number = |k: &str| l.get(k).parse().unwrap_or(0);
                Connection {
                    reporter: l.node.clone(),
                    direction: l.get("direction").to_owned(),
                    source_address: l.get("src.addr").to_owned(),
                    destination_address: l.get("dst.addr").to_owned(),
                    service: l.get("dst.service").to_owned(),
                    identity: l.get("src.identity").to_owned(),
                    bytes_sent: number("bytes_sent"),
                    bytes_received: number("bytes_recv"),
                    duration: l.get("duration").to_owned(),
                    error: Some(l.get("error").to_owned()).filter(|e| !e.is_empty()),
                    time: l.time,
                }
            })
            .collect()
    }

    /// The waypoints' answers on edge `from → to`, by code.
    fn requests(&self, from: &str, to: &str) -> Vec<Answers> {
        let mut by: BTreeMap<(String, String), u64> = BTreeMap::new();
        let identities: BTreeMap<&str, String> = self
            .s
            .workloads
            .iter()
            .map(|w| (w.identity.as_str(), graph::workload_id(&w.namespace, &w.workload)))
            .collect();
        for x in self.s.series.iter().filter(|x| x.family == Family::Requests) {
            let src = identities.get(x.label("source_principal")).cloned().unwrap_or_else(|| EXTERNAL.into());
            let svc = graph::service_id(
                x.label("destination_service_namespace"),
                x.label("destination_service_name"),
            );
            let dst = graph::workload_id(
                x.label("destination_workload_namespace"),
                x.label("destination_workload"),
            );
            if (from == src && to == svc) || (from == svc && to == dst) {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let n = x.value.max(0.0) as u64;
                *by.entry((x.label("response_code").to_owned(), x.label("response_flags").to_owned()))
                    .or_default() += n;
            }
        }
        by.into_iter().map(|((code, flags), count)| Answers { code, count, flags }).collect()
    }
}

/// A control-plane policy report as the page shows it.
fn policy(r: &Value) -> Policy {
    let text = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
    let waypoints: Vec<String> = r["waypoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w.as_str().map(str::to_owned))
        .collect();
    let enforced_by = if r["enforced"] == true {
        "node proxies".to_owned()
    } else if !waypoints.is_empty() {
        format!("waypoint {}", waypoints.join(", "))
    } else {
        "nothing (see its warnings)".to_owned()
    };
    let mut rules: Vec<String> =
        r["rules"].as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)).collect();
    if rules.is_empty() && !waypoints.is_empty() {
        rules
            .push("its HTTP rules are enforced by the waypoint: `ambit inspect waypoints` lists them".into());
    }
    Policy {
        kind: text("kind"),
        namespace: text("namespace"),
        name: text("name"),
        action: text("action"),
        applies_to: text("appliesTo"),
        enforced_by,
        rules,
        warnings: r["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w["message"].as_str().map(str::to_owned))
            .collect(),
    }
}
