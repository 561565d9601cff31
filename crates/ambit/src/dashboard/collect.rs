//! What the dashboard reads, and from where: the control plane's translated workloads, services
//! and policies (its monitoring endpoints, `/debug/config_dump` and `/debug/policies`, the same
//! ones `ambit inspect` reads), each node proxy's Istio metrics, denials and certificates, each
//! waypoint's `istio_requests_total`, and the node proxies' access logs. Everything read is
//! untrusted text: it is parsed into the types below, and whatever does not parse is left out
//! and said in `problems`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::SystemTime;

use ambit_cluster::state::ClusterState;
use ambit_cluster::up::{self, Layout};
use serde_json::Value;

use crate::inspect::get;

/// One pod the control plane publishes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    /// Namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The workload it belongs to (the Deployment's name for its pods), as metrics name it.
    pub workload: String,
    /// Its SPIFFE identity (empty without a service account).
    pub identity: String,
    /// Its addresses.
    pub addresses: Vec<String>,
    /// Its node.
    pub node: String,
    /// The Services it backs (`namespace/hostname`).
    pub services: Vec<String>,
    /// The policies published for it (`namespace/name`).
    pub policies: Vec<String>,
    /// Whether it is in the mesh (HBONE).
    pub enrolled: bool,
    /// Its status (`HEALTHY`, `UNHEALTHY`).
    pub status: String,
}

/// One Service the control plane publishes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Service {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `name.namespace.svc.cluster.local`.
    pub hostname: String,
    /// Its virtual IPs.
    pub addresses: Vec<String>,
    /// `port→target protocol`, as published.
    pub ports: Vec<String>,
    /// The waypoint its traffic goes through (`namespace/name` of the Gateway).
    pub waypoint: Option<String>,
}

/// Which metric a series belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// `istio_tcp_connections_opened_total`.
    Opened,
    /// `istio_tcp_connections_failed_total`.
    Failed,
    /// `istio_tcp_sent_bytes_total`.
    Sent,
    /// `istio_tcp_received_bytes_total`.
    Received,
    /// `istio_requests_total` (a waypoint's).
    Requests,
}

impl Family {
    const ALL: [(&'static str, Family); 5] = [
        ("istio_tcp_connections_opened_total", Family::Opened),
        ("istio_tcp_connections_failed_total", Family::Failed),
        ("istio_tcp_sent_bytes_total", Family::Sent),
        ("istio_tcp_received_bytes_total", Family::Received),
        ("istio_requests_total", Family::Requests),
    ];

    /// The family's metric name.
    pub fn metric(self) -> &'static str {
        Family::ALL.iter().find(|(_, f)| *f == self).map_or("", |(n, _)| n)
    }
}

/// One counter series.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Its metric.
    pub family: Family,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Series {
    /// A label's value (`""` when absent).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// Largest number of series one source contributes (a proxy that publishes more is cut, and
/// that is said in `problems`).
pub const MAX_SERIES: usize = 50_000;

/// The series of the families above in a Prometheus text exposition. Lines that do not parse
/// are counted, not guessed at.
pub fn parse_metrics(text: &str) -> (Vec<Series>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines() {
        let Some((family, rest)) = Family::ALL
            .iter()
            .find_map(|(name, f)| line.strip_prefix(name).filter(|r| r.starts_with('{')).map(|r| (*f, r)))
        else {
            continue;
        };
        match parse_series(rest) {
            Some((labels, value)) if out.len() < MAX_SERIES => out.push(Series { family, labels, value }),
            Some(_) => bad += 1,
            None => bad += 1,
        }
    }
    (out, bad)
}

/// `{k="v",…} value` into labels and the value.
fn parse_series(text: &str) -> Option<(BTreeMap<String, String>, f64)> {
    let mut labels = BTreeMap::new();
    let mut rest = text.strip_prefix('{')?;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            let value: f64 = after.split_whitespace().next()?.parse().ok()?;
            return value.is_finite().then_some((labels, value));
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        rest = &after[end + 1..];
    }
}

/// One connection a node proxy denied.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Denial {
    /// When (RFC 3339).
    pub time: String,
    /// The destination's node.
    pub node: String,
    /// The source's identity (empty for plaintext).
    pub source: String,
    /// The source's address.
    pub source_address: String,
    /// The destination pod (`namespace/pod`).
    pub destination: String,
    /// Why, as ztunnel words it.
    pub reason: String,
    /// The deciding policies (`namespace/name`).
    pub policies: Vec<String>,
}

/// One workload certificate a node proxy holds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Certificate {
    /// The node.
    pub node: String,
    /// The identity.
    pub identity: String,
    /// `Available`, `Initializing`, …
    pub state: String,
    /// The leaf's expiry (RFC 3339).
    pub expires: String,
}

/// A pod as the local cluster's record has it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodRecord {
    /// `Ready`, `Running`, `Failed`.
    pub phase: String,
    /// The agent's capture (`enabled`, `pending`, empty when not enrolled).
    pub redirection: String,
}

/// Everything one refresh read.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// When (RFC 3339).
    pub generated: String,
    /// Where from, for people.
    pub source: String,
    /// What could not be read.
    pub problems: Vec<String>,
    /// The pods the control plane publishes.
    pub workloads: Vec<Workload>,
    /// The Services it publishes.
    pub services: Vec<Service>,
    /// Its policy reports (`/debug/policies`: what each applies to, in words, warnings).
    pub reports: Vec<Value>,
    /// The published authorizations by `namespace/name` (their `scope`).
    pub scopes: BTreeMap<String, String>,
    /// Every counter series, the node proxies' and the waypoints'.
    pub series: Vec<Series>,
    /// The node proxies' recent denials.
    pub denials: Vec<Denial>,
    /// The node proxies' certificates.
    pub certificates: Vec<Certificate>,
    /// Pods by `(namespace, name)`, from the local cluster's record.
    pub pods: BTreeMap<(String, String), PodRecord>,
    /// The node proxies' logs (node, path), where their access-log lines are.
    pub logs: Vec<(String, PathBuf)>,
}

/// A local cluster's components, as `ambit up` recorded them.
pub struct Local {
    /// The cluster's record.
    pub state: ClusterState,
    /// Its run directory.
    pub layout: Layout,
}

impl Local {
    /// Reads everything once.
    pub fn collect(&self) -> Snapshot {
        let state = &self.state;
        let mut s = Snapshot {
            generated: ambit_identity::rfc3339(SystemTime::now()),
            source: format!("local cluster {}", self.layout.0.display()),
            ..Snapshot::default()
        };
        if !state.owner_alive() {
            s.problems.push(format!("the local cluster in {} is not running", self.layout.0.display()));
            return s;
        }
        let control = state.network.hosts.iter().find(|h| h.name == up::CONTROL_HOST);
        let monitoring = SocketAddr::from(([127, 0, 0, 1], up::CONTROL_MONITORING));
        match control {
            Some(c) => read_control(&mut s, Some(&c.netns), monitoring),
            None => s.problems.push("the cluster's record has no control plane".into()),
        }
        // The nodes at once: one proxy that answers slowly delays the refresh by its own
        // timeouts only.
        let parts: Vec<Snapshot> = std::thread::scope(|scope| {
            let running: Vec<_> = state
                .network
                .nodes
                .iter()
                .map(|n| {
                    scope.spawn(move || {
                        let ports = state.proxy(&n.name);
                        let admin = SocketAddr::from(([127, 0, 0, 1], ports.admin));
                        let stats = SocketAddr::from(([127, 0, 0, 1], ports.stats));
                        let mut part = Snapshot::default();
                        read_proxy(&mut part, &n.name, Some(&n.netns), admin, stats);
                        part
                    })
                })
                .collect();
            running.into_iter().filter_map(|t| t.join().ok()).collect()
        });
        for part in parts {
            s.problems.extend(part.problems);
            s.series.extend(part.series);
            s.denials.extend(part.denials);
            s.certificates.extend(part.certificates);
        }
        for n in &state.network.nodes {
            s.logs.push((n.name.clone(), self.layout.log(&format!("proxy/{}", n.name))));
        }
        for p in &state.pods {
            let key = (p.namespace.clone(), p.name.clone());
            s.pods.insert(key, PodRecord { phase: p.phase.clone(), redirection: String::new() });
        }
        for n in &state.network.nodes {
            let file = self.layout.capture().join(format!("{}.json", n.name));
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if let Ok(c) = serde_json::from_str::<ambit_objects::file::CaptureState>(&text) {
                for p in c.pods {
                    if let Some(r) = s.pods.get_mut(&(p.namespace, p.name)) {
                        r.redirection = p.redirection;
                    }
                }
            }
        }
        // Each waypoint's requests, read in its pod (its metrics port is the pod's 15020).
        let waypoints: Vec<(String, String)> =
            s.services.iter().filter_map(|svc| svc.waypoint.clone()).map(|w| split_key(&w)).collect();
        let pods: Vec<_> = s
            .workloads
            .iter()
            .filter(|w| waypoints.iter().any(|(ns, name)| *ns == w.namespace && *name == w.workload))
            .filter_map(|w| state.pods.iter().find(|p| p.namespace == w.namespace && p.name == w.pod))
            .collect();
        for p in pods {
            let what = format!("waypoint {}/{}", p.namespace, p.name);
            match get(Some(&p.netns), SocketAddr::from(([127, 0, 0, 1], 15020)), "/metrics") {
                Ok(text) => add_series(&mut s, &what, &text),
                Err(e) => s.problems.push(format!("{what}: {e}")),
            }
        }
        s
    }
}

/// `namespace/name` split (`("", key)` without a slash).
pub fn split_key(key: &str) -> (String, String) {
    match key.split_once('/') {
        Some((ns, name)) => (ns.to_owned(), name.to_owned()),
        None => (String::new(), key.to_owned()),
    }
}

fn get_json(netns: Option<&str>, addr: SocketAddr, path: &str) -> Result<Value, String> {
    crate::inspect::json_of(&get(netns, addr, path)?).map_err(|e| format!("GET {path}: {e}"))
}

fn add_series(s: &mut Snapshot, what: &str, text: &str) {
    let (series, bad) = parse_metrics(text);
    if bad > 0 {
        s.problems
            .push(format!("{what}: {bad} metric line(s) unreadable or past {MAX_SERIES} series, left out"));
    }
    s.series.extend(series);
}

/// The control plane's workloads, services and policies.
pub fn read_control(s: &mut Snapshot, netns: Option<&str>, addr: SocketAddr) {
    match get_json(netns, addr, "/debug/config_dump?type=address") {
        Ok(v) => {
            for a in v["addresses"].as_object().into_iter().flat_map(|m| m.values()) {
                if let Some(w) = a.get("workload") {
                    s.workloads.push(workload(w));
                } else if let Some(svc) = a.get("service") {
                    s.services.push(service(svc));
                }
            }
        }
        Err(e) => s.problems.push(format!("control plane: {e}")),
    }
    match get_json(netns, addr, "/debug/config_dump?type=authorization") {
        Ok(v) => {
            for (key, a) in v["authorizations"].as_object().into_iter().flatten() {
                s.scopes.insert(key.clone(), text(a, "scope"));
            }
        }
        Err(e) => s.problems.push(format!("control plane: {e}")),
    }
    match get_json(netns, addr, "/debug/policies") {
        Ok(Value::Array(reports)) => s.reports = reports,
        Ok(_) => s.problems.push("control plane: /debug/policies is not a list".into()),
        Err(e) => s.problems.push(format!("control plane: {e}")),
    }
}

/// One node proxy's metrics, denials and certificates.
pub fn read_proxy(s: &mut Snapshot, node: &str, netns: Option<&str>, admin: SocketAddr, stats: SocketAddr) {
    let what = format!("proxy on {node}");
    match get(netns, stats, "/metrics") {
        Ok(text) => add_series(s, &what, &text),
        Err(e) => s.problems.push(format!("{what}: {e}")),
    }
    match get_json(netns, admin, "/debug/denials") {
        Ok(v) => s.denials.extend(v.as_array().into_iter().flatten().map(|d| Denial {
            time: text(d, "time"),
            node: node.to_owned(),
            source: text(d, "srcIdentity"),
            source_address: text(d, "srcAddr"),
            destination: text(d, "dstWorkload"),
            reason: text(d, "reason"),
            policies: strings(&d["policies"]),
        })),
        Err(e) => s.problems.push(format!("{what}: {e}")),
    }
    match get_json(netns, admin, "/config_dump") {
        Ok(v) => {
            s.certificates.extend(v["certificates"].as_array().into_iter().flatten().map(|c| Certificate {
                node: node.to_owned(),
                identity: text(c, "identity"),
                state: text(c, "state"),
                expires: c["certChain"][0]["expirationTime"].as_str().unwrap_or_default().to_owned(),
            }))
        }
        Err(e) => s.problems.push(format!("{what}: {e}")),
    }
}

fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_owned()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)).collect()
}

/// A workload of the control plane's address dump.
fn workload(w: &Value) -> Workload {
    let namespace = text(w, "namespace");
    let pod = text(w, "name");
    let workload = Some(text(w, "workload_name")).filter(|n| !n.is_empty()).unwrap_or_else(|| pod.clone());
    let sa = text(w, "service_account");
    let trust =
        Some(text(w, "trust_domain")).filter(|t| !t.is_empty()).unwrap_or_else(|| "cluster.local".into());
    Workload {
        identity: if sa.is_empty() {
            String::new()
        } else {
            format!("spiffe://{trust}/ns/{namespace}/sa/{sa}")
        },
        addresses: strings(&w["addresses"]),
        node: text(w, "node"),
        services: w["services"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default(),
        policies: strings(&w["authorization_policies"]),
        enrolled: text(w, "tunnel_protocol") == "HBONE",
        status: text(w, "status"),
        namespace,
        pod,
        workload,
    }
}

/// A service of the control plane's address dump.
fn service(v: &Value) -> Service {
    let namespace = text(v, "namespace");
    // `hostname NS/HOST hbone PORT` (or `address NETWORK/IP hbone PORT`).
    let waypoint = v["waypoint"].as_str().and_then(|w| {
        let mut words = w.split_whitespace();
        match (words.next(), words.next()) {
            (Some("hostname"), Some(host)) => {
                let (ns, host) = host.split_once('/')?;
                Some(format!("{ns}/{}", host.split('.').next().unwrap_or(host)))
            }
            (Some("address"), Some(addr)) => Some(format!("address {addr}")),
            _ => None,
        }
    });
    Service {
        name: text(v, "name"),
        hostname: text(v, "hostname"),
        addresses: strings(&v["addresses"])
            .into_iter()
            .map(|a| a.rsplit('/').next().unwrap_or_default().to_owned())
            .collect(),
        ports: strings(&v["ports"]),
        waypoint,
        namespace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_lines_become_series_and_bad_ones_are_counted() {
        let text = "# HELP istio_tcp_connections_opened_total x\n\
            istio_tcp_connections_opened_total{reporter=\"destination\",source_workload=\"a\\\"b\",x=\"\"} 5\n\
            istio_tcp_connections_opened_total{reporter=\"destination\" 5\n\
            istio_tcp_connections_opened_totally{reporter=\"destination\"} 5\n\
            istio_requests_total{response_code=\"403\"} NaN\n\
            istio_requests_total{response_code=\"200\"} 7 1700000000\n\
            process_cpu_seconds_total 3\n";
        let (series, bad) = parse_metrics(text);
        assert_eq!(bad, 2, "the unterminated label set and the NaN");
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].family, Family::Opened);
        assert_eq!(series[0].label("source_workload"), "a\"b");
        assert_eq!(series[0].label("x"), "");
        assert_eq!(series[0].value, 5.0);
        assert_eq!(series[1].family, Family::Requests);
        assert_eq!(series[1].value, 7.0);
    }

    #[test]
    fn the_control_plane_s_dump_reads_into_workloads_and_services() {
        let w = workload(&serde_json::json!({
            "addresses": ["10.244.1.4"], "authorization_policies": ["demo/p"], "name": "server-0",
            "namespace": "demo", "node": "node1", "service_account": "server",
            "services": {"demo/server.demo.svc.cluster.local": ["80:8080"]}, "status": "HEALTHY",
            "tunnel_protocol": "HBONE", "workload_name": "server"
        }));
        assert_eq!(w.workload, "server");
        assert_eq!(w.identity, "spiffe://cluster.local/ns/demo/sa/server");
        assert_eq!(w.services, vec!["demo/server.demo.svc.cluster.local".to_owned()]);
        assert!(w.enrolled);
        let s = service(&serde_json::json!({
            "addresses": ["/10.96.0.20"], "hostname": "api.demo.svc.cluster.local", "name": "api",
            "namespace": "demo", "ports": ["80:8080 HTTP11"],
            "waypoint": "hostname demo/waypoint.demo.svc.cluster.local hbone 15008"
        }));
        assert_eq!(s.addresses, vec!["10.96.0.20".to_owned()]);
        assert_eq!(s.waypoint.as_deref(), Some("demo/waypoint"));
    }
}
