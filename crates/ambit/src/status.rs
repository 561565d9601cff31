//! `ambit status`: the cluster's record read with what its components say now: the cluster's
//! phase from its components, each pod's phase from its containers, its capture (the agents'
//! capture state) and whether the node proxy listens inside it, every component's ports, each
//! node proxy's certificates and the connections it denied (when, and by which policy), the
//! services and policies of the desired folder (policies in words, with what node proxies do
//! not enforce as written), recent events and what is wrong with the folder.
//!
//! `-o json` and `-o yaml` carry the same report as objects; the table is for people.

pub(crate) mod waypoints;

use std::collections::BTreeMap;

use ambit_cluster::desired::Desired;
use ambit_cluster::probe;
use ambit_cluster::state::ClusterState;
use ambit_cluster::up::{self, Layout};
use ambit_control::translate::explain::{self, PolicyReport};
use ambit_objects::Kind;
use serde::Serialize;
use serde_json::Value;

/// The node proxy's in-pod listeners (outbound, inbound plaintext, inbound HBONE).
const INPOD_PORTS: [u16; 3] = [15001, 15006, 15008];

/// Everything `ambit status` shows.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The cluster's phase: `ready`, `degraded` (see `problems`), what it is doing while it
    /// starts or stops, or `owner gone (was: …)` when its owner died.
    pub phase: String,
    /// Why the cluster is not `ready` although it was built.
    pub problems: Vec<String>,
    /// The owner's pid.
    pub owner: u32,
    /// The run directory.
    pub run_dir: String,
    /// Where the owner serves the dashboard (`http://…/`), or why it does not.
    pub dashboard: String,
    /// The supervised processes, with the ports of the components.
    pub processes: Vec<Process>,
    /// The nodes.
    pub nodes: Vec<NodeReport>,
    /// The pods.
    pub pods: Vec<PodReport>,
    /// Services.
    pub services: Vec<ServiceReport>,
    /// AuthorizationPolicies and PeerAuthentications: what each means for node proxies.
    pub policies: Vec<PolicyReport>,
    /// Each node proxy's certificates.
    pub certificates: Vec<Certificate>,
    /// The waypoints (Gateways of class `istio-waypoint`) and what each counted.
    pub waypoints: Vec<waypoints::WaypointReport>,
    /// The last connections each node proxy denied, with the policies that decided.
    pub denials: Vec<Denial>,
    /// Denied connections counted per source and destination (`istio_tcp_connections_failed_total`
    /// with the DENY flag, as each destination proxy counted them).
    pub denied_totals: Vec<DeniedTotal>,
    /// What is wrong with the desired folder (nothing of it applied).
    pub errors: Vec<String>,
    /// Recent events, oldest first.
    pub events: Vec<Event>,
}

/// One supervised process.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    /// Its name (`control`, `agent/node1`, `pod/demo/client/app`).
    pub name: String,
    /// `running`, or how it last ended.
    pub state: String,
    /// Stopped on request (`ambit stop`): not restarted until `ambit start`.
    pub held: bool,
    /// Restarts.
    pub restarts: u32,
    /// Whether it keeps exiting soon after being started (see `ProcessStatus::crash_loop`).
    pub crash_loop: bool,
    /// How its last run ended, if it ended.
    pub last_exit: Option<String>,
    /// Its pid while running.
    pub pid: Option<u32>,
    /// The network namespace it runs in (components only).
    pub netns: String,
    /// Where it listens now (components only).
    pub ports: Vec<Port>,
}

/// A port a component listens on.
#[derive(Debug, Serialize)]
pub struct Port {
    /// What it serves.
    pub name: &'static str,
    /// `address:port` in the component's network namespace.
    pub address: String,
}

/// One node.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// Name.
    pub name: String,
    /// Namespace.
    pub netns: String,
    /// Address on the cluster segment.
    pub ip: String,
    /// Pod CIDR.
    pub pod_cidr: String,
    /// The agent's readiness.
    pub agent_ready: bool,
    /// The proxy's readiness.
    pub proxy_ready: bool,
}

/// One pod.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    /// `namespace/name`.
    pub pod: String,
    /// Node.
    pub node: String,
    /// IPv4 address.
    pub ip: String,
    /// `Ready`, `Running`, `Failed`, or `CrashLoopBackOff` when a container exited and waits to
    /// be started again.
    pub phase: String,
    /// Restarts of its containers, summed.
    pub restarts: u32,
    /// Why it failed, or how its crashing container last ended.
    pub message: String,
    /// The agent's capture (`enabled`, `pending`, or empty when not enrolled).
    pub redirection: String,
    /// Whether the node proxy listens inside the pod (15001, 15006, 15008).
    pub proxy_listening: bool,
    /// Its SPIFFE identity.
    pub identity: String,
    /// Its namespace.
    pub netns: String,
}

/// One Service of the desired folder.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceReport {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its virtual IP (`None` for a headless Service).
    pub cluster_ip: Option<String>,
    /// Its ports.
    pub ports: Vec<ServicePort>,
    /// The pods it selects.
    pub selector: BTreeMap<String, String>,
}

/// One port of a Service.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Its name, if any.
    pub name: String,
    /// The Service's port.
    pub port: u16,
    /// The pods' port (a number or a port name).
    pub target_port: String,
}

/// One certificate a node proxy holds.
#[derive(Debug, Serialize)]
pub struct Certificate {
    /// The node.
    pub node: String,
    /// The identity.
    pub identity: String,
    /// `Available`, `Initializing`, `Unavailable: …`.
    pub state: String,
    /// The leaf's expiry (RFC 3339).
    pub expires: String,
}

/// One denied connection, as the destination's node proxy recorded it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Denial {
    /// The destination's node.
    pub node: String,
    /// When (RFC 3339).
    pub time: String,
    /// The source's identity (empty for plaintext).
    pub source: String,
    /// The source's address.
    pub source_address: String,
    /// The destination workload (`namespace/name`).
    pub destination: String,
    /// Why, as ztunnel words it.
    pub reason: String,
    /// The DENY policy that matched, or the ALLOW policies none of which allowed it.
    pub policies: Vec<String>,
}

/// Denied connections of one source and destination.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeniedTotal {
    /// The destination's node.
    pub node: String,
    /// The source's identity (empty for plaintext).
    pub source: String,
    /// The destination workload (`namespace/name`).
    pub destination: String,
    /// How many.
    pub count: u64,
}

/// One event of the cluster's owner.
#[derive(Debug, Serialize)]
pub struct Event {
    /// When (as the owner wrote it).
    pub time: String,
    /// What happened.
    pub message: String,
}

/// Gathers the report.
pub fn gather(state: &ClusterState, layout: &Layout) -> Report {
    let alive = state.owner_alive();
    let mut captured: BTreeMap<(String, String), String> = BTreeMap::new();
    for n in &state.network.nodes {
        let file = layout.capture().join(format!("{}.json", n.name));
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if let Ok(c) = serde_json::from_str::<ambit_objects::file::CaptureState>(&text) {
            for p in c.pods {
                captured.insert((p.namespace, p.name), p.redirection);
            }
        }
    }
    let nodes: Vec<NodeReport> = state
        .network
        .nodes
        .iter()
        .map(|n| NodeReport {
            name: n.name.clone(),
            netns: n.netns.clone(),
            ip: n.ip.to_string(),
            pod_cidr: n.pods.map(|p| p.cidr()).unwrap_or_default(),
            agent_ready: alive && probe::ready(&n.netns, up::AGENT_HEALTH, "/readyz"),
            proxy_ready: alive && probe::ready(&n.netns, state.proxy(&n.name).ready, "/healthz/ready"),
        })
        .collect();
    let processes: Vec<Process> = state.processes.iter().map(|p| process(state, p, alive)).collect();
    let pods = state.pods.iter().map(|p| pod(p, &captured, &processes)).collect();
    let mut certificates = Vec::new();
    let mut denials = Vec::new();
    let mut denied_totals = Vec::new();
    for n in state.network.nodes.iter().filter(|_| alive) {
        let admin = state.proxy(&n.name).admin;
        if let Ok((200, body)) = probe::http_get(&n.netns, admin, "/config_dump") {
            let dump: Value = serde_json::from_str(&body).unwrap_or_default();
            for c in dump["certificates"].as_array().into_iter().flatten() {
                certificates.push(Certificate {
                    node: n.name.clone(),
                    identity: c["identity"].as_str().unwrap_or_default().to_owned(),
                    state: c["state"].as_str().unwrap_or_default().to_owned(),
                    expires: c["certChain"][0]["expirationTime"].as_str().unwrap_or_default().to_owned(),
                });
            }
        }
        if let Ok((200, body)) = probe::http_get(&n.netns, admin, "/debug/denials") {
            let list: Vec<Value> = serde_json::from_str(&body).unwrap_or_default();
            let text = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_owned();
            denials.extend(list.iter().map(|d| {
                Denial {
                    node: n.name.clone(),
                    time: text(d, "time"),
                    source: text(d, "srcIdentity"),
                    source_address: text(d, "srcAddr"),
                    destination: text(d, "dstWorkload"),
                    reason: text(d, "reason"),
                    policies: d["policies"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p.as_str().map(str::to_owned))
                        .collect(),
                }
            }));
        }
        if let Ok((200, body)) = probe::http_get(&n.netns, state.proxy(&n.name).stats, "/metrics") {
            for l in body.lines().filter(|l| {
                l.starts_with("istio_tcp_connections_failed_total{")
                    && l.contains("reporter=\"destination\"")
                    && l.contains("response_flags=\"DENY\"")
            }) {
                let count = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or_default();
                denied_totals.push(DeniedTotal {
                    node: n.name.clone(),
                    source: probe::label(l, "source_principal"),
                    destination: format!(
                        "{}/{}",
                        probe::label(l, "destination_workload_namespace"),
                        probe::label(l, "destination_workload")
                    ),
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    count: count as u64,
                });
            }
        }
    }
    denials.sort_by(|a, b| a.time.cmp(&b.time));
    let (services, policies) = objects(layout, state);
    let (phase, problems) = phase(state, alive, &nodes, &processes);
    Report {
        phase,
        problems,
        owner: state.owner,
        run_dir: state.run_dir.display().to_string(),
        dashboard: std::fs::read_to_string(state.run_dir.join(crate::up::DASHBOARD_FILE))
            .map(|d| d.trim().to_owned())
            .unwrap_or_default(),
        processes,
        nodes,
        pods,
        services,
        policies,
        certificates,
        waypoints: waypoints::gather(state, layout, alive),
        denials,
        denied_totals,
        errors: state.errors.clone(),
        events: state
            .events
            .iter()
            .rev()
            .take(10)
            .rev()
            .map(|e| match e.split_once(' ') {
                Some((time, message)) => Event { time: time.to_owned(), message: message.to_owned() },
                None => Event { time: String::new(), message: e.clone() },
            })
            .collect(),
    }
}

/// The cluster's phase from its record and its components: a built cluster whose control
/// plane, agents or proxies do not answer is `degraded`, with each reason.
fn phase(
    state: &ClusterState,
    alive: bool,
    nodes: &[NodeReport],
    processes: &[Process],
) -> (String, Vec<String>) {
    if !alive {
        return (format!("owner gone (was: {})", state.phase), Vec::new());
    }
    if state.phase != "ready" {
        return (state.phase.clone(), Vec::new());
    }
    let mut problems = Vec::new();
    let control = state.network.hosts.iter().find(|h| h.name == up::CONTROL_HOST);
    let control_ready = control.is_some_and(|c| probe::ready(&c.netns, up::CONTROL_READY, "/ready"));
    if !control_ready {
        let how = processes.iter().find(|p| p.name == "control").map_or("not running", |p| p.state.as_str());
        problems.push(format!("control plane not ready (control: {how})"));
    }
    for n in nodes {
        for (ready, what) in [(n.agent_ready, "agent"), (n.proxy_ready, "proxy")] {
            if !ready {
                let name = format!("{what}/{}", n.name);
                let how =
                    processes.iter().find(|p| p.name == name).map_or("not running", |p| p.state.as_str());
                problems.push(format!("{name} not ready ({how})"));
            }
        }
    }
    let phase = if problems.is_empty() { "ready" } else { "degraded" };
    (phase.to_owned(), problems)
}

/// A process with its ports, when it is a component.
fn process(state: &ClusterState, p: &ambit_cluster::supervise::ProcessStatus, alive: bool) -> Process {
    let status = if p.running && alive {
        "running".to_owned()
    } else {
        p.last_exit.clone().unwrap_or_else(|| "stopped".into())
    };
    let (netns, ports) = component_ports(state, &p.name);
    Process {
        name: p.name.clone(),
        state: status,
        held: p.held,
        restarts: p.restarts,
        crash_loop: p.crash_loop && alive,
        last_exit: p.last_exit.clone(),
        pid: p.pid,
        netns,
        ports,
    }
}

/// Where component `name` runs and listens now.
fn component_ports(state: &ClusterState, name: &str) -> (String, Vec<Port>) {
    let port = |name, address: String| Port { name, address };
    if name == "control" {
        let Some(c) = state.network.hosts.iter().find(|h| h.name == up::CONTROL_HOST) else {
            return (String::new(), Vec::new());
        };
        return (
            c.netns.clone(),
            vec![
                port("xds+ca", format!("{}:{}", c.ip, up::CONTROL_GRPC)),
                port("monitoring", format!("{}:{}", c.ip, up::CONTROL_MONITORING)),
                port("ready", format!("127.0.0.1:{}", up::CONTROL_READY)),
            ],
        );
    }
    let node = |n: &str| state.network.nodes.iter().find(|m| m.name == n);
    if let Some(n) = name.strip_prefix("agent/").and_then(node) {
        return (
            n.netns.clone(),
            vec![
                port("health", format!("127.0.0.1:{}", up::AGENT_HEALTH)),
                port("metrics", format!("127.0.0.1:{}", up::AGENT_METRICS)),
            ],
        );
    }
    if let Some(n) = name.strip_prefix("proxy/").and_then(node) {
        let p = state.proxy(&n.name);
        return (
            n.netns.clone(),
            vec![
                port("admin", format!("127.0.0.1:{}", p.admin)),
                port("metrics", format!("127.0.0.1:{}", p.stats)),
                port("ready", format!("127.0.0.1:{}", p.ready)),
            ],
        );
    }
    (String::new(), Vec::new())
}

/// A pod, its phase from its containers.
fn pod(
    p: &ambit_cluster::state::PodState,
    captured: &BTreeMap<(String, String), String>,
    processes: &[Process],
) -> PodReport {
    let prefix = format!("pod/{}/{}/", p.namespace, p.name);
    let containers: Vec<&Process> = processes.iter().filter(|c| c.name.starts_with(&prefix)).collect();
    let restarts = containers.iter().map(|c| c.restarts).sum();
    let crashing = containers.iter().find(|c| c.crash_loop);
    let (phase, message) = match crashing {
        Some(c) if p.phase != "Failed" => (
            "CrashLoopBackOff".to_owned(),
            format!(
                "container {} ended ({}), restarted {} times",
                &c.name[prefix.len()..],
                c.last_exit.as_deref().unwrap_or("unknown"),
                c.restarts
            ),
        ),
        _ => (p.phase.clone(), p.message.clone()),
    };
    let key = (p.namespace.clone(), p.name.clone());
    let listening = ambit_cluster::ip::pids_in(&p.netns)
        .first()
        .map(|pid| probe::listening_ports(u32::try_from(*pid).unwrap_or_default()))
        .is_some_and(|ports| INPOD_PORTS.iter().all(|x| ports.contains(x)));
    PodReport {
        pod: format!("{}/{}", p.namespace, p.name),
        node: p.node.clone(),
        ip: p.ip.map(|i| i.to_string()).unwrap_or_default(),
        phase,
        restarts,
        message,
        redirection: captured.get(&key).cloned().unwrap_or_default(),
        proxy_listening: listening,
        identity: if p.service_account.is_empty() || !captured.contains_key(&key) {
            String::new()
        } else {
            format!("spiffe://cluster.local/ns/{}/sa/{}", p.namespace, p.service_account)
        },
        netns: p.netns.clone(),
    }
}

/// The services and policies of the desired folder.
fn objects(layout: &Layout, state: &ClusterState) -> (Vec<ServiceReport>, Vec<PolicyReport>) {
    let nodes: Vec<String> = state.network.nodes.iter().map(|n| n.name.clone()).collect();
    let Ok(d) = Desired::load(&layout.desired(), &nodes) else { return (Vec::new(), Vec::new()) };
    let mut services = Vec::new();
    for p in d.passed.iter().filter(|p| p.kind == Kind::Service) {
        let v = &p.value;
        let ports = v["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|x| {
                let port = x["port"].as_u64().and_then(|n| u16::try_from(n).ok()).unwrap_or_default();
                let target = match &x["targetPort"] {
                    Value::Number(n) => n.to_string(),
                    Value::String(s) => s.clone(),
                    _ => port.to_string(),
                };
                ServicePort {
                    name: x["name"].as_str().unwrap_or_default().to_owned(),
                    port,
                    target_port: target,
                }
            })
            .collect();
        let selector = v["spec"]["selector"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect();
        services.push(ServiceReport {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            cluster_ip: v["spec"]["clusterIP"].as_str().filter(|ip| *ip != "None").map(str::to_owned),
            ports,
            selector,
        });
    }
    let policies = crate::policies::reports(
        d.passed
            .iter()
            .filter(|p| matches!(p.kind, Kind::AuthorizationPolicy | Kind::PeerAuthentication))
            .map(|p| &p.value),
    );
    (services, policies)
}

/// The report as YAML (the same objects as `-o json`).
pub fn yaml(r: &Report) -> String {
    serde_saphyr::to_string(r).unwrap_or_else(|e| format!("# the report does not serialize: {e}\n"))
}

/// The report as a person reads it.
pub fn table(r: &Report) -> String {
    let mut out = format!("cluster: {}  (owner pid {}, run dir {})\n", r.phase, r.owner, r.run_dir);
    for p in &r.problems {
        out += &format!("  {p}\n");
    }
    if !r.dashboard.is_empty() {
        out += &format!("dashboard: {}\n", r.dashboard);
    }
    out += &format!(
        "\n{:<8} {:<16} {:<12} {:<15} {:<6} {:<6}\n",
        "NODE", "NETNS", "ADDRESS", "PODS", "AGENT", "PROXY"
    );
    for n in &r.nodes {
        out += &format!(
            "{:<8} {:<16} {:<12} {:<15} {:<6} {:<6}\n",
            n.name,
            n.netns,
            n.ip,
            n.pod_cidr,
            if n.agent_ready { "ready" } else { "DOWN" },
            if n.proxy_ready { "ready" } else { "DOWN" }
        );
    }
    out += &format!(
        "\n{:<24} {:<6} {:<13} {:<16} {:<8} {:<9} {:<6} {}\n",
        "POD", "NODE", "IP", "PHASE", "RESTARTS", "ENROLLED", "PROXY", "IDENTITY"
    );
    for p in &r.pods {
        let enrolled = if p.redirection.is_empty() { "no" } else { &p.redirection };
        out += &format!(
            "{:<24} {:<6} {:<13} {:<16} {:<8} {:<9} {:<6} {}\n",
            p.pod,
            p.node,
            p.ip,
            p.phase,
            p.restarts,
            enrolled,
            if p.proxy_listening { "yes" } else { "no" },
            p.identity
        );
        if !p.message.is_empty() {
            out += &format!("    {}\n", p.message);
        }
    }
    out += "\nPROCESSES\n";
    for p in &r.processes {
        let ports: Vec<String> = p.ports.iter().map(|x| format!("{} {}", x.name, x.address)).collect();
        let at = if p.netns.is_empty() {
            String::new()
        } else {
            format!("  in {}: {}", p.netns, ports.join(", "))
        };
        let state = if p.held { format!("{} (held)", p.state) } else { p.state.clone() };
        out += &format!("  {:<36} {:<24} restarts {}{at}\n", p.name, state, p.restarts);
    }
    out += "\nSERVICES\n";
    for s in &r.services {
        let ports: Vec<String> = s.ports.iter().map(|p| format!("{}→{}", p.port, p.target_port)).collect();
        let selector: Vec<String> = s.selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out += &format!(
            "  {}/{}  {}  ports {}  selector {}\n",
            s.namespace,
            s.name,
            s.cluster_ip.as_deref().unwrap_or("None (headless)"),
            ports.join(", "),
            selector.join(",")
        );
    }
    if r.services.is_empty() {
        out += "  (none)\n";
    }
    out += "\nPOLICIES\n";
    out += &policies_table(&r.policies);
    out += &waypoints::render(&r.waypoints);
    out += "\nCERTIFICATES\n";
    for c in &r.certificates {
        out += &format!("  {:<6} {:<48} {:<10} expires {}\n", c.node, c.identity, c.state, c.expires);
    }
    out += "\nDENIED CONNECTIONS (the last ones each node proxy recorded)\n";
    for d in &r.denials {
        let source =
            if d.source.is_empty() { format!("{} (plaintext)", d.source_address) } else { d.source.clone() };
        out += &format!("  {} {:<6} {source} → {}: {}", d.time, d.node, d.destination, d.reason);
        if !d.policies.is_empty() {
            let origins: Vec<String> = d.policies.iter().map(|p| explain::origin(p)).collect();
            out += &format!(" [{}]", origins.join(", "));
        }
        out += "\n";
    }
    if r.denials.is_empty() {
        out += "  (none)\n";
    }
    if !r.denied_totals.is_empty() {
        out += "  counted:\n";
        for d in &r.denied_totals {
            let source = if d.source.is_empty() { "(plaintext)" } else { &d.source };
            out += &format!("  {:<6} {source} → {}: {}\n", d.node, d.destination, d.count);
        }
    }
    if !r.errors.is_empty() {
        out += "\nTHE DESIRED FOLDER HAS PROBLEMS (nothing of it applied)\n";
        for e in &r.errors {
            out += &format!("  {e}\n");
        }
    }
    out += "\nRECENT EVENTS\n";
    for e in &r.events {
        out += &format!("  {} {}\n", e.time, e.message);
    }
    out
}

/// Policies as `ambit status` and `ambit inspect policies` show them: a head line per policy,
/// then what node proxies enforce and each warning, indented.
pub fn policies_table(policies: &[PolicyReport]) -> String {
    let mut out = String::new();
    for p in policies {
        let enforced = if p.enforced { "" } else { "  (not enforced by node proxies)" };
        out += &format!("  {}  {}  {}{enforced}\n", p.title(), p.action, p.applies_to);
        for r in &p.rules {
            out += &format!("      {r}\n");
        }
        for w in &p.warnings {
            out += &format!("      warning: {}\n", w.message);
        }
    }
    if policies.is_empty() {
        out += "  (none)\n";
    }
    out
}
