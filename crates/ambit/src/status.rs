//! `ambit status`: the cluster's record read with what its components say now: each pod's
//! capture (the agents' capture state) and whether the node proxy listens inside it, each node
//! proxy's certificates and the connections it denied, the services and policies of the
//! desired folder, recent events and what is wrong with the folder.

use std::collections::BTreeMap;

use ambit_cluster::desired::Desired;
use ambit_cluster::probe;
use ambit_cluster::state::ClusterState;
use ambit_cluster::up::{self, Layout};
use ambit_objects::Kind;
use serde::Serialize;
use serde_json::Value;

/// The node proxy's in-pod listeners (outbound, inbound plaintext, inbound HBONE).
const INPOD_PORTS: [u16; 3] = [15001, 15006, 15008];

/// Everything `ambit status` shows.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The cluster's phase (`ready`, `stopping`, …; `owner gone` when its owner died).
    pub phase: String,
    /// The owner's pid.
    pub owner: u32,
    /// The run directory.
    pub run_dir: String,
    /// The supervised processes.
    pub processes: Vec<Process>,
    /// The nodes.
    pub nodes: Vec<NodeReport>,
    /// The pods.
    pub pods: Vec<PodReport>,
    /// Services (`namespace/name` → addresses and ports).
    pub services: Vec<String>,
    /// Policies (`kind namespace/name` and what they do).
    pub policies: Vec<String>,
    /// Each node proxy's certificates.
    pub certificates: Vec<Certificate>,
    /// Connections denied, as each destination proxy counted them.
    pub denials: Vec<Denial>,
    /// What is wrong with the desired folder (nothing of it applied).
    pub errors: Vec<String>,
    /// Recent events.
    pub events: Vec<String>,
}

/// One supervised process.
#[derive(Debug, Serialize)]
pub struct Process {
    /// Its name (`control`, `agent/node1`, `pod/demo/client/app`).
    pub name: String,
    /// `running`, or how it last ended.
    pub state: String,
    /// Restarts.
    pub restarts: u32,
}

/// One node.
#[derive(Debug, Serialize)]
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
pub struct PodReport {
    /// `namespace/name`.
    pub pod: String,
    /// Node.
    pub node: String,
    /// IPv4 address.
    pub ip: String,
    /// `Ready`, `Running` or `Failed`.
    pub phase: String,
    /// Why it failed.
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

/// Denied connections of one source and destination.
#[derive(Debug, Serialize)]
pub struct Denial {
    /// The destination's node.
    pub node: String,
    /// The source's identity (`unknown` for plaintext).
    pub source: String,
    /// The destination workload (`namespace/name`).
    pub destination: String,
    /// How many.
    pub count: u64,
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
    let pods = state
        .pods
        .iter()
        .map(|p| {
            let listening = ambit_cluster::ip::pids_in(&p.netns)
                .first()
                .map(|pid| probe::listening_ports(u32::try_from(*pid).unwrap_or_default()))
                .is_some_and(|ports| INPOD_PORTS.iter().all(|x| ports.contains(x)));
            PodReport {
                pod: format!("{}/{}", p.namespace, p.name),
                node: p.node.clone(),
                ip: p.ip.map(|i| i.to_string()).unwrap_or_default(),
                phase: p.phase.clone(),
                message: p.message.clone(),
                redirection: captured
                    .get(&(p.namespace.clone(), p.name.clone()))
                    .cloned()
                    .unwrap_or_default(),
                proxy_listening: listening,
                identity: if p.service_account.is_empty()
                    || !captured.contains_key(&(p.namespace.clone(), p.name.clone()))
                {
                    String::new()
                } else {
                    format!("spiffe://cluster.local/ns/{}/sa/{}", p.namespace, p.service_account)
                },
                netns: p.netns.clone(),
            }
        })
        .collect();
    let mut certificates = Vec::new();
    let mut denials = Vec::new();
    for n in state.network.nodes.iter().filter(|_| alive) {
        if let Ok((200, body)) = probe::http_get(&n.netns, state.proxy(&n.name).admin, "/config_dump") {
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
        if let Ok((200, body)) = probe::http_get(&n.netns, state.proxy(&n.name).stats, "/metrics") {
            for l in body.lines().filter(|l| {
                l.starts_with("istio_tcp_connections_failed_total{")
                    && l.contains("reporter=\"destination\"")
                    && l.contains("response_flags=\"DENY\"")
            }) {
                let count = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or_default();
                denials.push(Denial {
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
    let (services, policies) = objects(layout, state);
    Report {
        phase: if alive { state.phase.clone() } else { format!("owner gone (was: {})", state.phase) },
        owner: state.owner,
        run_dir: state.run_dir.display().to_string(),
        processes: state
            .processes
            .iter()
            .map(|p| Process {
                name: p.name.clone(),
                state: if p.running && alive {
                    "running".into()
                } else {
                    p.last_exit.clone().unwrap_or_else(|| "stopped".into())
                },
                restarts: p.restarts,
            })
            .collect(),
        nodes,
        pods,
        services,
        policies,
        certificates,
        denials,
        errors: state.errors.clone(),
        events: state.events.iter().rev().take(10).rev().cloned().collect(),
    }
}

/// The services and policies of the desired folder.
fn objects(layout: &Layout, state: &ClusterState) -> (Vec<String>, Vec<String>) {
    let nodes: Vec<String> = state.network.nodes.iter().map(|n| n.name.clone()).collect();
    let Ok(d) = Desired::load(&layout.desired(), &nodes) else { return (Vec::new(), Vec::new()) };
    let mut services = Vec::new();
    let mut policies = Vec::new();
    for p in &d.passed {
        let v = &p.value;
        match p.kind {
            Kind::Service => {
                let ports: Vec<String> = v["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| format!("{}→{}", x["port"], x.get("targetPort").unwrap_or(&x["port"])))
                    .collect();
                services.push(format!(
                    "{}/{}  {}  ports {}  selector {}",
                    p.namespace,
                    p.name,
                    v["spec"]["clusterIP"].as_str().unwrap_or("(no VIP)"),
                    ports.join(", ").replace('"', ""),
                    v["spec"]["selector"]
                ));
            }
            Kind::AuthorizationPolicy => policies.push(format!(
                "AuthorizationPolicy {}/{}  {}  selector {}",
                p.namespace,
                p.name,
                v["spec"]["action"].as_str().unwrap_or("ALLOW"),
                v["spec"]["selector"]["matchLabels"]
            )),
            Kind::PeerAuthentication => policies.push(format!(
                "PeerAuthentication {}/{}  mTLS {}",
                p.namespace,
                p.name,
                v["spec"]["mtls"]["mode"].as_str().unwrap_or("UNSET")
            )),
            _ => {}
        }
    }
    (services, policies)
}

/// The report as a person reads it.
pub fn table(r: &Report) -> String {
    let mut out = format!("cluster: {}  (owner pid {}, run dir {})\n\n", r.phase, r.owner, r.run_dir);
    out += &format!(
        "{:<8} {:<16} {:<12} {:<15} {:<6} {:<6}\n",
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
        "\n{:<24} {:<6} {:<13} {:<6} {:<9} {:<6} {}\n",
        "POD", "NODE", "IP", "PHASE", "ENROLLED", "PROXY", "IDENTITY"
    );
    for p in &r.pods {
        let enrolled = if p.redirection.is_empty() { "no" } else { &p.redirection };
        out += &format!(
            "{:<24} {:<6} {:<13} {:<6} {:<9} {:<6} {}\n",
            p.pod,
            p.node,
            p.ip,
            p.phase,
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
        out += &format!("  {:<36} {:<24} restarts {}\n", p.name, p.state, p.restarts);
    }
    for (title, rows) in [("SERVICES", &r.services), ("POLICIES", &r.policies)] {
        out += &format!("\n{title}\n");
        for s in rows.iter() {
            out += &format!("  {s}\n");
        }
        if rows.is_empty() {
            out += "  (none)\n";
        }
    }
    out += "\nCERTIFICATES\n";
    for c in &r.certificates {
        out += &format!("  {:<6} {:<48} {:<10} expires {}\n", c.node, c.identity, c.state, c.expires);
    }
    out += "\nDENIED CONNECTIONS\n";
    for d in &r.denials {
        out += &format!("  {:<6} {} → {}: {}\n", d.node, d.source, d.destination, d.count);
    }
    if r.denials.is_empty() {
        out += "  (none)\n";
    }
    if !r.errors.is_empty() {
        out += "\nTHE DESIRED FOLDER HAS PROBLEMS (nothing of it applied)\n";
        for e in &r.errors {
            out += &format!("  {e}\n");
        }
    }
    out += "\nRECENT EVENTS\n";
    for e in &r.events {
        out += &format!("  {e}\n");
    }
    out
}
