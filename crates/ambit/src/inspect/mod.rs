//! `ambit inspect`: what a node proxy knows and does, as `istioctl ztunnel-config` shows it for
//! ztunnel, and whether it is in sync with the control plane (`proxy-status`).
//!
//! Targets: the nodes of the local cluster (`--node`, or every node), or any proxy admin
//! address (`--admin http://HOST:15000`, e.g. through `kubectl port-forward`), with the control
//! plane's monitoring address for `sync` and for the policies' warnings (`--control`; the local
//! cluster's is found by itself). Everything comes from the proxies' admin endpoints
//! (`/config_dump`, `/debug/connections`, `/debug/denials`, `/logging`) and the control plane's
//! (`/debug/connections`, `/debug/policies`).

mod policy;
mod render;
mod waypoints;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

use ambit_cluster::probe;
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::Value;

use crate::up::Where;

/// `ambit inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(subcommand)]
    pub what: What,
    /// A node of the local cluster (default: every node).
    #[arg(long, global = true, conflicts_with = "admin")]
    pub node: Option<String>,
    /// A node proxy's admin address (`http://HOST:PORT`), instead of the local cluster.
    #[arg(long, global = true)]
    pub admin: Option<String>,
    /// The control plane's monitoring address (`http://HOST:15014`), for `sync` and the
    /// policies' warnings with `--admin` (the local cluster's is found by itself).
    #[arg(long, global = true)]
    pub control: Option<String>,
    /// Only this namespace.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// `table`, `json` or `yaml`.
    #[arg(short = 'o', long = "output", global = true, default_value = "table",
        value_parser = ["table", "json", "yaml"])]
    pub output: String,
    #[command(flatten)]
    pub at: Where,
}

/// What to show.
#[derive(Subcommand, Debug)]
pub enum What {
    /// The workloads the proxy knows: address, node, protocol, identity, status, waypoint.
    Workloads,
    /// The services the proxy knows: virtual IPs, ports, endpoints, waypoint.
    Services,
    /// The policies the proxy enforces, each rule in words (with the control plane's warnings).
    Policies,
    /// The workload certificates the proxy holds: identity, state, serial, validity.
    Certificates,
    /// Live inbound connections: peer, identity, workload, bytes each way, since when.
    Connections,
    /// The last connections the proxy denied, when, and the deciding policies.
    Denials,
    /// The proxy's log level; `--level` sets it (`info`, `debug`, `ambit_proxy=trace,info`).
    Log {
        /// The new level (`RUST_LOG` syntax); `reset` returns to the start-up one.
        #[arg(long)]
        level: Option<String>,
    },
    /// Each proxy's xDS state against the control plane's (`proxy-status`).
    Sync,
    /// What each waypoint serves: the Services and workloads bound to it, their listeners,
    /// policies, endpoints and routes (the local cluster's waypoint pods, or `--admin` of one).
    Waypoints,
}

/// One proxy to ask: its name for the output and where its admin endpoints are.
struct Target {
    node: String,
    netns: Option<String>,
    admin: SocketAddr,
}

/// Runs `ambit inspect`.
pub fn inspect(args: InspectArgs) -> ExitCode {
    match run(&args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ambit inspect: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &InspectArgs) -> Result<String, String> {
    let (targets, control) = targets(args)?;
    let ns = args.namespace.as_deref();
    let out = match &args.what {
        What::Workloads => output(args, render::workloads(&dumps(&targets)?, ns)),
        What::Services => output(args, render::services(&dumps(&targets)?, ns)),
        What::Certificates => output(args, render::certificates(&dumps(&targets)?, ns)),
        What::Policies => {
            let reports = match &control {
                Some(c) => Some(json_of(&get(c.netns.as_deref(), c.admin, "/debug/policies")?)?),
                None => None,
            };
            output(args, policy::policies(&dumps(&targets)?, reports.as_ref(), ns)?)
        }
        What::Connections => {
            let lists = each(&targets, "/debug/connections")?;
            output(args, render::connections(&lists, ns))
        }
        What::Denials => output(args, render::denials(&each(&targets, "/debug/denials")?, ns)),
        What::Log { level } => {
            let path = match level.as_deref() {
                None => "/logging".to_owned(),
                Some("reset") => "/logging?reset".to_owned(),
                Some(l) => format!("/logging?level={}", form_encode(l)),
            };
            let mut rows = Vec::new();
            for t in &targets {
                let (code, body) = probe::request(t.netns.as_deref(), t.admin, "POST", &path)
                    .map_err(|e| format!("{} ({}): {e}", t.node, t.admin))?;
                if code != 200 {
                    return Err(format!("{}: {}", t.node, body.trim()));
                }
                let level = body.trim().trim_start_matches("current log level is ").to_owned();
                rows.push(render::LogLevel { node: t.node.clone(), level });
            }
            output(args, rows)
        }
        What::Sync => {
            let Some(c) = &control else {
                return Err("sync needs the control plane: --control http://HOST:15014".into());
            };
            let streams = json_of(&get(c.netns.as_deref(), c.admin, "/debug/connections")?)?;
            output(args, render::sync(&dumps(&targets)?, &streams))
        }
        What::Waypoints => {
            let waypoints = waypoints::targets(args)?;
            output(args, waypoints::served(&each(&waypoints, "/debug/serving")?, ns)?)
        }
    };
    Ok(out)
}

/// The proxies to ask, and the control plane when it is known.
fn targets(args: &InspectArgs) -> Result<(Vec<Target>, Option<Target>), String> {
    let control = args.control.as_deref().map(address).transpose()?;
    let control = control.map(|admin| Target { node: "control".into(), netns: None, admin });
    if let Some(url) = &args.admin {
        return Ok((vec![Target { node: url.clone(), netns: None, admin: address(url)? }], control));
    }
    let (_, state) = live_cluster(args, "a proxy")?;
    let nodes: Vec<Target> = state
        .network
        .nodes
        .iter()
        .filter(|n| args.node.as_ref().is_none_or(|want| *want == n.name))
        .map(|n| Target {
            node: n.name.clone(),
            netns: Some(n.netns.clone()),
            admin: SocketAddr::from(([127, 0, 0, 1], state.proxy(&n.name).admin)),
        })
        .collect();
    if nodes.is_empty() {
        let names: Vec<&str> = state.network.nodes.iter().map(|n| n.name.as_str()).collect();
        return Err(format!(
            "no node {} in the local cluster (its nodes: {})",
            args.node.as_deref().unwrap_or_default(),
            names.join(", ")
        ));
    }
    let local_control =
        state.network.hosts.iter().find(|h| h.name == ambit_cluster::up::CONTROL_HOST).map(|h| Target {
            node: "control".into(),
            netns: Some(h.netns.clone()),
            admin: SocketAddr::from(([127, 0, 0, 1], ambit_cluster::up::CONTROL_MONITORING)),
        });
    Ok((nodes, control.or(local_control)))
}

/// The cluster named by --run-dir/--tag, else the last one `ambit up` brought up, when its owner
/// runs; `what` names what `--admin` would point at instead.
fn live_cluster(
    args: &InspectArgs,
    what: &str,
) -> Result<(crate::context::Target, ambit_cluster::state::ClusterState), String> {
    let at = args.at.resolve()?;
    let state = at.load().map_err(|e| {
        format!("{e}; point at {what} with --admin http://HOST:15000 (kubectl port-forward works)")
    })?;
    if !state.owner_alive() {
        return Err(format!(
            "the local cluster in {} is not running (its owner is gone)",
            at.run_dir.display()
        ));
    }
    Ok((at, state))
}

/// `http://HOST:PORT` (or `HOST:PORT`) as a socket address.
pub(crate) fn address(url: &str) -> Result<SocketAddr, String> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    if rest.starts_with("https://") || url.starts_with("https://") {
        return Err(format!("{url}: the admin endpoints are plain HTTP; use http://"));
    }
    let hostport = rest.split('/').next().unwrap_or_default();
    hostport
        .to_socket_addrs()
        .map_err(|e| format!("{url} is not an address like http://127.0.0.1:15000: {e}"))?
        .next()
        .ok_or_else(|| format!("{url} resolves to no address"))
}

/// `GET path` on `addr` (from inside `netns` when given): the body of a 200, else what went wrong.
pub(crate) fn get(netns: Option<&str>, addr: SocketAddr, path: &str) -> Result<String, String> {
    match probe::request(netns, addr, "GET", path) {
        Ok((200, body)) => Ok(body),
        Ok((code, body)) => Err(format!("GET {path} on {addr}: {code} {}", body.trim())),
        Err(e) => Err(format!("GET {path} on {addr}: {e}")),
    }
}

pub(crate) fn json_of(body: &str) -> Result<Value, String> {
    serde_json::from_str(body).map_err(|e| format!("the answer is not JSON: {e}"))
}

/// Each target's `/config_dump`.
fn dumps(targets: &[Target]) -> Result<Vec<(String, Value)>, String> {
    each(targets, "/config_dump")
}

/// Each target's JSON answer to `path`.
fn each(targets: &[Target], path: &str) -> Result<Vec<(String, Value)>, String> {
    targets
        .iter()
        .map(|t| {
            let body = get(t.netns.as_deref(), t.admin, path).map_err(|e| format!("{}: {e}", t.node))?;
            Ok((t.node.clone(), json_of(&body)?))
        })
        .collect()
}

/// Rows as a table, JSON or YAML.
fn output<R: Serialize + render::Row>(args: &InspectArgs, rows: Vec<R>) -> String {
    match args.output.as_str() {
        "json" => format!("{}\n", serde_json::to_string_pretty(&rows).unwrap_or_default()),
        "yaml" => serde_saphyr::to_string(&rows).unwrap_or_else(|e| format!("# does not serialize: {e}\n")),
        _ => render::table(&rows),
    }
}

/// `application/x-www-form-urlencoded` of a query value.
fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
