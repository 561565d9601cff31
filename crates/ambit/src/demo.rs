//! `ambit up --demo`: the objects of `examples/demo/` (built into the binary, so the demo runs
//! from anywhere), then each flow of [`FLOWS`] run with `ambit app client` inside the source
//! pod's network namespace. What is observed comes from two places: what the client got (the
//! server's line, which names the server and the peer address it saw, or how the connection
//! ended) and what the destination node's proxy counted for it (connections opened with the
//! source's SPIFFE identity and `mutual_tls`, or denied). Then the flows of [`HTTP_FLOWS`],
//! HTTP requests with `ambit app http` to a Service bound to the waypoint: what each request
//! got (the status, the server that answered) and what the waypoint counted for it
//! (`istio_requests_total` with the source's identity). The verdict table shows each flow,
//! expected and observed; the exit code is non-zero when any row differs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use ambit_cluster::desired::{DesiredError, Location};
use ambit_cluster::probe;
use ambit_cluster::state::ClusterState;
use ambit_cluster::up;
use serde_json::Value;

use crate::context::Target;

/// The demo's objects, as in `examples/demo/demo.yaml`.
pub const DEMO_YAML: &str = include_str!("../../../examples/demo/demo.yaml");

/// What a flow should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Connections get the server's reply.
    Allowed,
    /// The destination proxy denies them (counted) and closes them.
    Denied,
}

/// One flow of the demo.
#[derive(Clone, Copy, Debug)]
pub struct Flow {
    /// What it shows.
    pub title: &'static str,
    /// The source pod (`namespace/name`).
    pub from: &'static str,
    /// The destination: a pod (`namespace/name`) or an address (`ip:port`).
    pub to: &'static str,
    /// The destination port (for a pod).
    pub port: u16,
    /// How many connections.
    pub count: u32,
    /// Allowed or denied.
    pub verdict: Verdict,
    /// Whether the destination proxy must see mutual TLS.
    pub mtls: bool,
    /// The source identity the destination proxy must see (empty: none).
    pub identity: &'static str,
    /// For allowed flows: how many distinct servers must answer.
    pub servers: usize,
}

const CLIENT: &str = "spiffe://cluster.local/ns/demo/sa/client";
const OTHER: &str = "spiffe://cluster.local/ns/demo/sa/other";

/// The flows, in order.
pub const FLOWS: &[Flow] = &[
    Flow {
        title: "client → server-0 (same node)",
        from: "demo/client",
        to: "demo/server-0",
        port: 8080,
        count: 1,
        verdict: Verdict::Allowed,
        mtls: true,
        identity: CLIENT,
        servers: 1,
    },
    Flow {
        title: "client → server-1 (across nodes)",
        from: "demo/client",
        to: "demo/server-1",
        port: 8080,
        count: 1,
        verdict: Verdict::Allowed,
        mtls: true,
        identity: CLIENT,
        servers: 1,
    },
    Flow {
        title: "client → Service server (VIP, 10 connections)",
        from: "demo/client",
        to: "10.96.0.10:80",
        port: 0,
        count: 10,
        verdict: Verdict::Allowed,
        mtls: true,
        identity: CLIENT,
        servers: 2,
    },
    Flow {
        title: "other → server-0 (policy allows only client)",
        from: "demo/other",
        to: "demo/server-0",
        port: 8080,
        count: 1,
        verdict: Verdict::Denied,
        mtls: true,
        identity: OTHER,
        servers: 0,
    },
    Flow {
        title: "plain/outsider → server-0 (STRICT mTLS)",
        from: "plain/outsider",
        to: "demo/server-0",
        port: 8080,
        count: 1,
        verdict: Verdict::Denied,
        mtls: false,
        identity: "",
        servers: 0,
    },
    Flow {
        title: "client → plain/web (out of the mesh)",
        from: "demo/client",
        to: "plain/web",
        port: 8080,
        count: 1,
        verdict: Verdict::Allowed,
        mtls: false,
        identity: "",
        servers: 1,
    },
    Flow {
        title: "plain/outsider → plain/web",
        from: "plain/outsider",
        to: "plain/web",
        port: 8080,
        count: 1,
        verdict: Verdict::Allowed,
        mtls: false,
        identity: "",
        servers: 1,
    },
];

/// One HTTP flow through the waypoint: requests on one connection with `ambit app http`.
#[derive(Clone, Copy, Debug)]
pub struct HttpFlow {
    /// What it shows.
    pub title: &'static str,
    /// The source pod.
    pub from: &'static str,
    /// Method.
    pub method: &'static str,
    /// URL (the Service's VIP).
    pub url: &'static str,
    /// Requests, on one connection.
    pub count: u32,
    /// The status every request must get.
    pub status: u16,
    /// For a split: the share (percent) the first server must answer, ± 10 points.
    pub split: Option<(&'static str, u32)>,
}

/// The waypoint's flows, in order.
pub const HTTP_FLOWS: &[HttpFlow] = &[
    HttpFlow {
        title: "client → api: GET /api/items",
        from: "demo/client",
        method: "GET",
        url: "http://10.96.0.20:80/api/items",
        count: 1,
        status: 200,
        split: None,
    },
    HttpFlow {
        title: "client → api: DELETE /api/items (HTTP policy)",
        from: "demo/client",
        method: "DELETE",
        url: "http://10.96.0.20:80/api/items",
        count: 1,
        status: 403,
        split: None,
    },
    HttpFlow {
        title: "client → api: 100 GETs on one connection",
        from: "demo/client",
        method: "GET",
        url: "http://10.96.0.20:80/api/items",
        count: 100,
        status: 200,
        split: Some(("api-v1-0", 90)),
    },
];

/// The waypoint's `istio_requests_total` series now (`{labels}` → value), read in its pod.
fn waypoint_requests(state: &ClusterState) -> BTreeMap<String, f64> {
    let Some(wp) = state.pods.iter().find(|p| p.namespace == "demo" && p.name == "waypoint-0") else {
        return BTreeMap::new();
    };
    let Ok((200, text)) = probe::http_get(&wp.netns, 15020, "/metrics") else { return BTreeMap::new() };
    text.lines()
        .filter_map(|l| l.strip_prefix("istio_requests_total"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// What one HTTP flow did: the answers and what the waypoint counted.
fn observe_http(flow: &HttpFlow, state: &ClusterState, ambit: &PathBuf) -> Observed {
    let mut problems = Vec::new();
    let Some(src) = state.pods.iter().find(|p| format!("{}/{}", p.namespace, p.name) == flow.from) else {
        return Observed::missing(flow.from);
    };
    let before = waypoint_requests(state);
    let count = flow.count.to_string();
    let args = ["app", "http", flow.url, "-X", flow.method, "--count", &count];
    let lines = run_client(&src.netns, ambit, &args, flow.count, "requests", &mut problems);
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let mut servers: BTreeMap<String, usize> = BTreeMap::new();
    for l in &lines {
        let status = l["status"].as_u64().map_or_else(|| "no answer".to_owned(), |s| s.to_string());
        *statuses.entry(status).or_default() += 1;
        if let Some(s) = l["server"].as_str() {
            *servers.entry(s.to_owned()).or_default() += 1;
        }
    }
    // The waypoint counts each request as its answer goes out.
    let deadline = Instant::now() + Duration::from_secs(2);
    let delta = loop {
        let d = probe::growth(&before, &waypoint_requests(state));
        if d.values().sum::<f64>() >= f64::from(flow.count) || Instant::now() > deadline {
            break d;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let counted: f64 = delta.values().sum();
    if counted < f64::from(flow.count) {
        problems.push(format!("the waypoint counted {counted} of {} requests", flow.count));
    }
    let verdict = statuses.iter().map(|(s, n)| format!("{n}×{s}")).collect::<Vec<_>>().join(",");
    let mtls = if !delta.is_empty()
        && delta.keys().all(|k| probe::label(k, "connection_security_policy") == "mutual_tls")
    {
        "mTLS".to_owned()
    } else {
        "-".to_owned()
    };
    let mut identities: Vec<String> = delta.keys().map(|k| probe::label(k, "source_principal")).collect();
    identities.sort();
    identities.dedup();
    let identity = if identities.is_empty() { "-".to_owned() } else { identities.join(",") };
    let server_saw = if servers.is_empty() {
        "the waypoint (RBAC: access denied)".to_owned()
    } else {
        servers.iter().map(|(s, n)| format!("{s} {n}")).collect::<Vec<_>>().join(", ")
    };
    if let Some((first, share)) = flow.split {
        let got = servers.get(first).copied().unwrap_or(0) * 100 / (flow.count as usize).max(1);
        if got.abs_diff(share as usize) > 10 {
            problems.push(format!("{first} answered {got}%, not {share}% ± 10 points"));
        }
    }
    Observed { verdict, mtls, identity, server_saw, problems }
}

/// The demo's documents, checked like any folder.
pub fn documents() -> (Vec<(Value, Location)>, Vec<DesiredError>) {
    let dir = std::env::temp_dir().join(format!("ambit-demo-{}", std::process::id()));
    let path = dir.join("demo.yaml");
    let read = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, DEMO_YAML));
    let out = match read {
        Ok(()) => ambit_cluster::desired::read_files(std::slice::from_ref(&path)),
        Err(e) => {
            (Vec::new(), vec![DesiredError { at: Location::new(path.clone(), 0), problem: e.to_string() }])
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    // Shown as the file of the repository.
    let shown = PathBuf::from("examples/demo/demo.yaml");
    let relocate = |at: Location| Location { path: shown.clone(), origin: None, ..at };
    (
        out.0.into_iter().map(|(v, at)| (v, relocate(at))).collect(),
        out.1.into_iter().map(|e| DesiredError { at: relocate(e.at), problem: e.problem }).collect(),
    )
}

/// `ambit <args>` in network namespace `netns`: its JSON lines; a problem when it could not
/// run or reported fewer than `count` lines (`what`: what a line stands for).
fn run_client(
    netns: &str,
    ambit: &PathBuf,
    args: &[&str],
    count: u32,
    what: &str,
    problems: &mut Vec<String>,
) -> Vec<Value> {
    let out = Command::new("ip").args(["netns", "exec", netns]).arg(ambit).args(args).output();
    let lines: Vec<Value> = match &out {
        Ok(o) => {
            String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
        }
        Err(e) => {
            problems.push(format!("cannot run the client in {netns}: {e}"));
            Vec::new()
        }
    };
    if lines.len() != count as usize {
        let stderr =
            out.as_ref().map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
        problems.push(format!("the client reported {} of {count} {what}: {}", lines.len(), stderr.trim()));
    }
    lines
}

/// What one flow did.
struct Observed {
    verdict: String,
    mtls: String,
    identity: String,
    server_saw: String,
    problems: Vec<String>,
}

impl Observed {
    /// A flow whose source pod does not exist.
    fn missing(pod: &str) -> Observed {
        Observed {
            verdict: "-".into(),
            mtls: "-".into(),
            identity: "-".into(),
            server_saw: "-".into(),
            problems: vec![format!("no pod {pod}")],
        }
    }
}

fn observe(flow: &Flow, state: &ClusterState, ambit: &PathBuf) -> Observed {
    let pod = |name: &str| state.pods.iter().find(|p| format!("{}/{}", p.namespace, p.name) == name);
    let mut problems = Vec::new();
    let Some(src) = pod(flow.from) else {
        return Observed::missing(flow.from);
    };
    let addr = match pod(flow.to) {
        Some(p) => format!("{}:{}", p.ip.map(|i| i.to_string()).unwrap_or_default(), flow.port),
        None => flow.to.to_owned(),
    };
    let before = probe::destination_counters(state);
    let count = flow.count.to_string();
    let args = ["app", "client", &addr, "--count", &count, "--timeout", "3s"];
    let lines = run_client(&src.netns, ambit, &args, flow.count, "connections", &mut problems);
    let replies: Vec<&Value> = lines.iter().filter_map(|l| l.get("reply")).collect();
    // The destination proxy counts at connection time; give it a moment to be scraped.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut delta: BTreeMap<String, f64>;
    loop {
        delta = probe::growth(&before, &probe::destination_counters(state));
        let seen: f64 = delta.values().sum();
        if seen >= f64::from(flow.count)
            || Instant::now() > deadline
            || (flow.verdict == Verdict::Allowed && !flow.mtls)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let denied: f64 = delta
        .iter()
        .filter(|(k, _)| {
            k.contains("istio_tcp_connections_failed_total{") && k.contains("response_flags=\"DENY\"")
        })
        .map(|(_, v)| v)
        .sum();
    let opened: Vec<&String> =
        delta.keys().filter(|k| k.contains("istio_tcp_connections_opened_total{")).collect();
    let counted: Vec<&String> = if denied > 0.0 {
        delta.keys().filter(|k| k.contains("response_flags=\"DENY\"")).collect()
    } else {
        opened
    };
    let verdict = if replies.len() == lines.len() && !lines.is_empty() {
        "allowed".to_owned()
    } else if replies.is_empty() && denied >= f64::from(flow.count) {
        "denied".to_owned()
    } else if replies.is_empty() {
        let how: Vec<String> = lines.iter().filter_map(|l| l["error"].as_str().map(str::to_owned)).collect();
        format!("failed ({}; no denial counted)", how.join(","))
    } else {
        format!("{} of {} allowed", replies.len(), lines.len())
    };
    let mtls = if counted.is_empty() {
        "plaintext".to_owned()
    } else if counted.iter().all(|k| probe::label(k, "connection_security_policy") == "mutual_tls") {
        "mTLS".to_owned()
    } else {
        "plaintext".to_owned()
    };
    let mut identities: Vec<String> = counted
        .iter()
        .map(|k| probe::label(k, "source_principal"))
        .filter(|p| !p.is_empty() && p != "unknown")
        .collect();
    identities.sort();
    identities.dedup();
    let identity = if identities.is_empty() { "-".to_owned() } else { identities.join(",") };
    let mut servers: Vec<&str> = replies.iter().filter_map(|r| r["server"].as_str()).collect();
    servers.sort_unstable();
    servers.dedup();
    let peers: Vec<String> = replies
        .iter()
        .filter_map(|r| r["peer"].as_str())
        .map(|p| p.rsplit_once(':').map_or(p, |(ip, _)| ip).to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let server_saw = if servers.is_empty() {
        "-".to_owned()
    } else {
        format!("{} from {}", servers.join("+"), peers.join(","))
    };
    if flow.verdict == Verdict::Allowed {
        let src_ip = src.ip.map(|i| i.to_string()).unwrap_or_default();
        if !peers.is_empty() && peers != [src_ip.clone()] {
            problems
                .push(format!("the server saw {} instead of the client's address {src_ip}", peers.join(",")));
        }
        if servers.len() < flow.servers {
            problems.push(format!("{} server(s) answered; want {}", servers.len(), flow.servers));
        }
    }
    Observed { verdict, mtls, identity, server_saw, problems }
}

/// Runs the flows on the cluster at `at` and prints the verdict table.
pub fn run(at: &Target) -> ExitCode {
    let state = match ClusterState::load(&at.run_dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ambit up --demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ambit = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ambit up --demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Every enrolled pod has its certificate before the first flow (the proxies fetch them on
    // enrollment; the first connection would otherwise wait for one).
    let deadline = Instant::now() + Duration::from_secs(20);
    let enrolled = state.pods.iter().filter(|p| p.namespace == "demo").count();
    while Instant::now() < deadline {
        let report = crate::status::gather(&state, &up::Layout(at.run_dir.clone()));
        let ready = report.certificates.iter().filter(|c| c.state == "Available").count();
        if ready >= enrolled
            && report.pods.iter().filter(|p| p.pod.starts_with("demo/")).all(|p| p.proxy_listening)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("\nThe demo's flows (each run with `ambit app client` in the source pod's namespace):\n");
    let header =
        ("FLOW", "EXPECTED", "OBSERVED", "MTLS", "IDENTITY THE SERVER'S PROXY SAW", "SERVER ANSWERED");
    let mut rows = Vec::new();
    let mut bad = 0;
    let mut checked =
        |title: &'static str, expected: String, o: Observed, want_mtls: &str, want_identity: &str| {
            let mut problems = o.problems.clone();
            if o.verdict != expected.split(", ").next().unwrap_or_default() {
                problems.push(format!("{} instead of {}", o.verdict, expected));
            }
            if o.mtls != want_mtls {
                problems.push(format!("{} instead of {want_mtls}", o.mtls));
            }
            if o.identity != want_identity {
                problems.push(format!("identity {} instead of {want_identity}", o.identity));
            }
            let ok = problems.is_empty();
            if !ok {
                bad += 1;
            }
            (title, expected, o, ok, problems)
        };
    for flow in FLOWS {
        let o = observe(flow, &state, &ambit);
        let expected = match flow.verdict {
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
        };
        let want_mtls = if flow.mtls { "mTLS" } else { "plaintext" };
        let want_identity = if flow.identity.is_empty() { "-" } else { flow.identity };
        rows.push(checked(flow.title, format!("{expected}, {want_mtls}"), o, want_mtls, want_identity));
    }
    let l4_rows = rows.len();
    for flow in HTTP_FLOWS {
        let o = observe_http(flow, &state, &ambit);
        let expected = format!("{}×{}, mTLS", flow.count, flow.status);
        rows.push(checked(flow.title, expected, o, "mTLS", CLIENT));
    }
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(4).max(4);
    println!(
        "{:<w$}  {:<20}  {:<12}  {:<10}  {:<44}  {}",
        header.0, header.1, header.2, header.3, header.4, header.5
    );
    for (i, (title, expected, o, ok, problems)) in rows.iter().enumerate() {
        if i == l4_rows {
            println!(
                "\nThrough the waypoint (HTTP requests with `ambit app http`; what the waypoint counted, its \
                 identity the source's):\n"
            );
        }
        println!(
            "{:<w$}  {:<20}  {:<12}  {:<10}  {:<44}  {}  {}",
            title,
            expected,
            o.verdict,
            o.mtls,
            o.identity,
            o.server_saw,
            if *ok { "ok" } else { "DIFFERS" }
        );
        for p in problems {
            println!("{:<w$}    ↳ {p}", "");
        }
    }
    println!();
    let dashboard = std::fs::read_to_string(at.run_dir.join(crate::up::DASHBOARD_FILE)).unwrap_or_default();
    if dashboard.starts_with("http://") {
        println!("The mesh in a browser, these flows drawn: {}\n", dashboard.trim());
    }
    if bad == 0 {
        println!(
            "every flow behaved as expected. The cluster is still up: `{}`, then `{}`.",
            at.command("status"),
            at.command("down")
        );
        ExitCode::SUCCESS
    } else {
        println!(
            "{bad} flow(s) differ from what was expected; logs: {}",
            up::Layout(at.run_dir.clone()).logs().display()
        );
        ExitCode::FAILURE
    }
}
