//! The `ambit` binary: each subcommand wires Ambit's libraries into one process.

#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod app;
mod config_reference;
mod context;
mod dashboard;
mod demo;
mod inspect;
mod policies;
mod status;
mod up;

/// Ambit: a sidecar-less service-mesh data plane.
#[derive(Parser)]
#[command(name = "ambit", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node proxy (ztunnel-compatible): HBONE mTLS tunnel, L4 authorization, metrics.
    ///
    /// Every setting is an environment variable with ztunnel's name; flags override them.
    Proxy(Box<ambit_proxy::ProxyArgs>),
    /// Run a waypoint (Istio's L7 proxy for ambient mode): HBONE in, HTTP authorization and
    /// routing, HBONE out; configured over xDS, for the Gateway named by its namespace and
    /// service account.
    Waypoint(Box<ambit_waypoint::app::WaypointArgs>),
    /// Run the node agent: enrollment, in-pod traffic capture, the ZDS server for the node
    /// proxy and the CNI plugin's event server.
    Agent(Box<ambit_agent::app::AgentArgs>),
    /// Run the control plane (istiod's ambient half): Kubernetes and Istio objects, from the
    /// API or a folder of YAML, become the proxies' Address and Authorization resources over
    /// delta ADS, and the Istio CA signs workload certificates with node authorization.
    Control(Box<ambit_control::app::ControlArgs>),
    /// The whole mesh on this Linux host (root): nodes and pods as network namespaces, pods
    /// created through the real CNI chain, `ambit control` and per node `ambit agent` and
    /// `ambit proxy`, supervised. Returns once the cluster is ready.
    Up(Box<up::UpArgs>),
    /// Removes the local cluster: every process, network namespace, link, cgroup and file.
    /// Idempotent; works after a crash or a killed `ambit up`.
    Down(up::DownArgs),
    /// The local cluster at a glance: nodes, pods (enrolled, identity, proxy listening),
    /// services, policies, certificates, denials, restarts.
    Status(up::StatusArgs),
    /// What a node proxy knows and does (`istioctl ztunnel-config`), and whether it is in sync
    /// with the control plane: workloads, services, policies (in words), certificates, live
    /// connections, denials, log level, sync. On the local cluster's nodes or any proxy's admin
    /// address.
    Inspect(inspect::InspectArgs),
    /// A picture of the mesh in the browser: workloads and Services with live edges (rate,
    /// bytes, mTLS, denials); a click shows pods, certificates, policies in words, denials and
    /// recent connections. Read-only, on localhost; from the local cluster, or from a cluster's
    /// control plane and Prometheus.
    Dashboard(dashboard::DashboardArgs),
    /// Adds or changes the objects of a YAML file in the local cluster (checked first).
    Apply(up::ApplyArgs),
    /// Removes the objects of a YAML file from the local cluster (checked first).
    Delete(up::ApplyArgs),
    /// Restarts a process of the local cluster (`ambit status` lists them). A node proxy is
    /// replaced without a gap: the new one starts, takes over the node's pods, then the old one
    /// drains.
    Restart(up::ProcessArgs),
    /// Stops a process of the local cluster; it is not restarted until `ambit start`.
    Stop(up::ProcessArgs),
    /// Starts a process stopped with `ambit stop`.
    Start(up::ProcessArgs),
    /// The demo applications `ambit up` runs in pods (`echo`, `client`).
    App(app::AppArgs),
    /// Every flag and environment variable `ambit agent`, `ambit proxy`, `ambit waypoint` and
    /// `ambit control` read, as JSON (what a manifest may set; the `--help` of each says what they mean).
    ConfigReference,
    /// Development certificate authority for FAKE_CA_ROOT.
    DevCa {
        #[command(subcommand)]
        command: DevCaCommand,
    },
}

#[derive(Subcommand)]
enum DevCaCommand {
    /// Create DIR/root-cert.pem and DIR/root-key.pem: a root that several `FAKE_CA=true` proxies
    /// can share (FAKE_CA_ROOT=DIR) so that they trust each other. For development only.
    Init {
        /// Directory to write into (created if missing).
        dir: PathBuf,
        /// Overwrite an existing root.
        #[arg(long)]
        force: bool,
    },
}

/// File descriptors the process table is grown to at start (kernel memory: 8 bytes each).
const FD_TABLE_SLOTS: u64 = 16_384;

/// Raises the soft open-files limit to the hard one and grows the fd table once, up front.
///
/// The kernel grows a process's fd table by doubling as descriptors cross 64, 128, 256, …, and
/// in a multithreaded process every growth waits for an RCU grace period (10–20 ms here). The
/// proxy (sockets and netns fds per pod) and the agent (a netns fd per pod) would otherwise take
/// those stalls in the middle of a pod's ZDS Add or CNI ADD: `bench_inpod` measured Add→ack
/// spikes of 10–22 ms exactly at pods #1, #29, #61 and #125.
fn prepare_fd_table() {
    use nix::fcntl::{FcntlArg, fcntl};
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    use std::os::fd::AsFd;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return };
    let soft =
        if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() { hard } else { soft };
    let target = FD_TABLE_SLOTS.min(soft.saturating_sub(1));
    let Ok(target) = i32::try_from(target) else { return };
    // The lowest free descriptor at or above `target`: the table grows to hold it, and stays
    // grown after the descriptor is closed.
    if let Ok(fd) = fcntl(std::io::stderr().as_fd(), FcntlArg::F_DUPFD_CLOEXEC(target)) {
        let _ = nix::unistd::close(fd);
    }
}

/// The command line, with Istio's entry points mapped onto Ambit's commands: the image links
/// `install-cni` (istio-cni's container command) and `ztunnel` (ztunnel's entry point, given
/// `proxy ztunnel` by its chart) to this binary, so that it drops in under Istio's charts.
fn command_line(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let name = args.first().and_then(|a| std::path::Path::new(a).file_name()).and_then(|n| n.to_str());
    match name {
        Some("install-cni") => {
            args.splice(1..1, ["agent", "--profile", "istio-cni"].map(Into::into));
        }
        Some("ztunnel") => match args.get(1).and_then(|a| a.to_str()) {
            // ztunnel's commands: `proxy` (also with no command), `version`, `help`.
            None => args.push("proxy".into()),
            Some("version") => args[1] = "--version".into(),
            Some("help") => args.splice(1..2, ["proxy", "--help"].map(Into::into)).for_each(drop),
            Some(_) => {}
        },
        _ => {}
    }
    if let Some(first) = args.first_mut() {
        *first = "ambit".into();
    }
    args
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(command_line(std::env::args_os().collect()));
    if matches!(
        cli.command,
        Command::Proxy(_) | Command::Waypoint(_) | Command::Agent(_) | Command::Control(_)
    ) {
        prepare_fd_table();
    }
    let code = run(cli.command);
    // Lines still buffered by the log writer thread (see ambit_admin::logging) go out now.
    ambit_admin::logging::flush();
    code
}

fn run(command: Command) -> ExitCode {
    match command {
        Command::Proxy(args) => {
            ambit_admin::logging::init(&args.rust_log, args.log_format == "json");
            let cfg = match ambit_proxy::Config::from_args(&args) {
                Ok(c) => {
                    c.warn_unsupported();
                    c
                }
                Err(e) => {
                    eprintln!("ambit proxy: {e}");
                    return ExitCode::from(2);
                }
            };
            match ambit_proxy::run(cfg) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("ambit proxy: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Waypoint(args) => {
            ambit_admin::logging::init(&args.rust_log, args.log_format == "json");
            let cfg = match ambit_waypoint::app::Config::from_args(&args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("ambit waypoint: {e}");
                    return ExitCode::from(2);
                }
            };
            match ambit_waypoint::app::run(cfg) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("ambit waypoint: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Agent(args) => {
            match args.log_filter() {
                Ok(filter) => ambit_admin::logging::init(&filter, args.log_as_json),
                Err(e) => {
                    eprintln!("ambit agent: {e}");
                    return ExitCode::from(2);
                }
            }
            match ambit_agent::app::run(*args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ambit agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Control(args) => {
            ambit_admin::logging::init(&args.rust_log, args.log_format == "json");
            match ambit_control::app::run(*args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("ambit control: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Up(args) => up::up(*args),
        Command::Down(args) => up::down(args),
        Command::Status(args) => up::status(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Dashboard(args) => dashboard::dashboard(args),
        Command::Apply(args) => up::apply(args, false),
        Command::Delete(args) => up::apply(args, true),
        Command::Restart(args) => up::request("restart", args),
        Command::Stop(args) => up::request("stop", args),
        Command::Start(args) => up::request("start", args),
        Command::App(args) => match app::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ambit app: {e}");
                ExitCode::FAILURE
            }
        },
        Command::ConfigReference => {
            use clap::CommandFactory;
            println!("{}", config_reference::reference(&Cli::command()));
            ExitCode::SUCCESS
        }
        Command::DevCa { command: DevCaCommand::Init { dir, force } } => {
            match ambit_identity::dev_ca_init(&dir, force) {
                Ok(()) => {
                    println!("wrote {0}/root-cert.pem and {0}/root-key.pem", dir.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("ambit dev-ca init: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::command_line;

    fn line(args: &[&str]) -> Vec<String> {
        command_line(args.iter().map(Into::into).collect())
            .into_iter()
            .map(|a| a.into_string().expect("utf-8"))
            .collect()
    }

    #[test]
    fn istio_entry_points_map_onto_ambit_commands() {
        assert_eq!(
            line(&["/usr/local/bin/install-cni", "--log_output_level=info"]),
            ["ambit", "agent", "--profile", "istio-cni", "--log_output_level=info"]
        );
        assert_eq!(line(&["/usr/local/bin/ztunnel", "proxy", "ztunnel"]), ["ambit", "proxy", "ztunnel"]);
        assert_eq!(line(&["ztunnel"]), ["ambit", "proxy"]);
        assert_eq!(line(&["ztunnel", "version"]), ["ambit", "--version"]);
        assert_eq!(line(&["ztunnel", "help"]), ["ambit", "proxy", "--help"]);
        assert_eq!(line(&["/usr/bin/ambit", "agent"]), ["ambit", "agent"]);
        assert_eq!(line(&["./target/debug/ambit", "proxy", "ztunnel"]), ["ambit", "proxy", "ztunnel"]);
    }
}
