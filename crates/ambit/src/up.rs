//! `ambit up`, `ambit down`, `ambit status`, `ambit apply` and `ambit delete`: the whole mesh on
//! one Linux host, on `ambit-cluster`.
//!
//! `ambit up` checks everything it can before it creates anything (root, the CNI plugins, the
//! `ambit-cni` binary, the desired folder, no cluster up already), then starts the cluster's
//! owner, a detached `ambit up --supervise` whose log is `<run dir>/logs/up.log`, and shows its
//! progress until the cluster is ready. If it fails, what was built is taken down again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ambit_cluster::desired::{self, Desired, DesiredError, DesiredErrors, Location};
use ambit_cluster::state::{ClusterState, StateError};
use ambit_cluster::up::{self, Layout, UpConfig};
use clap::Args;
use serde_json::Value;

use crate::context::{self, Target};
use crate::demo;

mod apply;

pub use crate::context::{RUN_DIR, TAG};
pub use apply::apply;
use apply::{live_state, read_source};
/// How long `ambit up` waits for the cluster to be ready.
pub const UP_TIMEOUT: Duration = Duration::from_secs(300);

/// Where a cluster is. Without either flag, the commands other than `ambit up` act on the last
/// cluster `ambit up` brought up (see [`crate::context`]).
#[derive(Args, Clone, Debug)]
pub struct Where {
    /// The cluster's run directory [default: the last cluster `ambit up` brought up, else
    /// /run/ambit-up].
    #[arg(long, env = "AMBIT_UP_RUN_DIR")]
    pub run_dir: Option<PathBuf>,
    /// The prefix of the cluster's network namespaces [default: the run directory's cluster's,
    /// else ambit].
    #[arg(long, env = "AMBIT_UP_TAG")]
    pub tag: Option<String>,
}

impl Where {
    /// The cluster `ambit up` builds: the flags, else the defaults (never the context).
    fn for_up(&self) -> Target {
        let run_dir =
            self.run_dir.as_deref().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(RUN_DIR));
        Target {
            run_dir: context::absolute(run_dir),
            tag: self.tag.clone().filter(|t| !t.is_empty()).unwrap_or_else(|| TAG.to_owned()),
            remembered: false,
        }
    }

    /// The cluster the other commands act on.
    pub fn resolve(&self) -> Result<Target, String> {
        context::resolve(self.run_dir.as_deref(), self.tag.as_deref())
    }
}

/// `ambit up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// How many nodes (`node1` … `nodeN`), 1 to 200.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=200))]
    pub nodes: u16,
    /// Kubernetes YAML to run (Namespaces, Pods, Deployments, Services, ServiceAccounts, Istio
    /// policies): a file, or a folder (its .yaml and .yml files).
    #[arg(long, conflicts_with = "demo")]
    pub config: Option<PathBuf>,
    /// Run the demo (examples/demo): its objects, then every flow, with a verdict table; exits
    /// non-zero when a flow does not behave as expected. The cluster stays up afterwards.
    #[arg(long)]
    pub demo: bool,
    /// Where the reference CNI plugins (bridge, host-local, loopback) are; repeatable.
    /// Default: the first of /opt/cni/bin, /usr/lib/cni, /usr/libexec/cni that has them all.
    #[arg(long)]
    pub cni_plugins_dir: Vec<PathBuf>,
    #[command(flatten)]
    pub at: Where,
    /// Run this binary as every node's proxy instead of `ambit proxy`, e.g. the reference
    /// ztunnel, for interop and comparison: it is started as `<binary> proxy ztunnel` (as
    /// Istio's chart starts ztunnel) with the environment `ambit proxy` gets.
    #[arg(long, value_name = "BINARY")]
    pub node_proxy: Option<PathBuf>,
    /// Start the control plane and each node's agent and proxy through PROGRAM, as
    /// `PROGRAM <name> <netns> <binary> <args…>` with the component's environment (`name`:
    /// `control`, `agent/<node>`, `proxy/<node>`; `netns`: the `ip netns` it runs in). PROGRAM
    /// runs the component or what stands for it, e.g. a container from Ambit's images.
    #[arg(long, value_name = "PROGRAM")]
    pub launcher: Option<PathBuf>,
    /// Where the cluster's owner serves `ambit dashboard`'s page while the cluster is up (a
    /// loopback address; port 0 picks one). Taken already: the cluster comes up without it,
    /// and says so.
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:15600", conflicts_with = "no_dashboard")]
    pub dashboard: std::net::SocketAddr,
    /// Serve no dashboard.
    #[arg(long)]
    pub no_dashboard: bool,
    /// Run as the cluster's owner (what `ambit up` starts in the background).
    #[arg(long, hide = true)]
    pub supervise: bool,
    /// The `ambit-cni` binary the owner's agents install (given by `ambit up`).
    #[arg(long, hide = true)]
    pub ambit_cni: Option<PathBuf>,
}

/// `ambit down`.
#[derive(Args, Debug)]
pub struct DownArgs {
    #[command(flatten)]
    pub at: Where,
}

/// `ambit status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub at: Where,
    /// Refresh every 2 seconds until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// `table`, `json` or `yaml`.
    #[arg(short = 'o', long = "output", default_value = "table", value_parser = ["table", "json", "yaml"])]
    pub output: String,
}

/// `ambit apply` / `ambit delete`.
#[derive(Args, Debug)]
pub struct ApplyArgs {
    /// The objects: a YAML file, a folder (its .yaml and .yml files, as kubectl reads one), or
    /// `-` for standard input.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    #[command(flatten)]
    pub at: Where,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn fail(what: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("ambit {what}: {e}");
    ExitCode::FAILURE
}

fn require_root(what: &str) -> Result<(), String> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(format!(
            "`ambit {what}` needs root: it creates network namespaces, links and cgroups (run it in a root shell)"
        ))
    }
}

fn node_names(n: u16) -> Vec<String> {
    (1..=n).map(|i| format!("node{i}")).collect()
}

/// `flag`'s program as an absolute path, once it is known to be an executable file.
fn executable(flag: &str, path: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let full = std::fs::canonicalize(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    match std::fs::metadata(&full) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(full),
        Ok(_) => Err(format!("{flag} {}: not an executable file", path.display())),
        Err(e) => Err(format!("{flag} {}: {e}", path.display())),
    }
}

/// The `ambit-cni` binary: next to this one (cargo builds both into one directory), else on PATH.
fn find_ambit_cni() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let beside = me.with_file_name("ambit-cni");
    if beside.is_file() {
        return Ok(beside);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        if dir.join("ambit-cni").is_file() {
            return Ok(dir.join("ambit-cni"));
        }
    }
    Err(format!(
        "the CNI plugin ambit-cni is neither next to {} nor on PATH; build it: cargo build --release -p ambit -p ambit-cni",
        me.display()
    ))
}

/// Whether a cluster (or what is left of one) is at `at`: the message to give, if so.
fn already_up(at: &Target) -> Option<String> {
    match ClusterState::load(&at.run_dir) {
        Ok(s) if s.owner_alive() => {
            return Some(format!(
                "a cluster is already up (run dir {}, owner pid {}, {}): `{}` shows it, `{}` removes it",
                at.run_dir.display(),
                s.owner,
                s.phase,
                at.command("status"),
                at.command("down")
            ));
        }
        Ok(_) | Err(StateError::Invalid { .. } | StateError::Io { .. }) => {
            return Some(format!(
                "{} holds a cluster whose owner is gone (a crash or a killed `ambit up`); remove what is left with `{}`",
                at.run_dir.display(),
                at.command("down")
            ));
        }
        Err(StateError::Missing(_)) => {}
    }
    if let Some(o) = ambit_cluster::down::live_owners(&at.tag).into_iter().next() {
        let theirs =
            Target { run_dir: context::absolute(&o.run_dir), tag: at.tag.clone(), remembered: false };
        return Some(format!(
            "tag {} is taken by the cluster up in run dir {} (owner pid {}): `{}` shows it; choose another --tag",
            at.tag,
            theirs.run_dir.display(),
            o.pid,
            theirs.command("status")
        ));
    }
    let left = ambit_cluster::ip::netns_with_prefix(&format!("{}-", at.tag));
    if !left.is_empty() {
        return Some(format!(
            "network namespaces of tag {:?} exist ({}); remove them with `{}`",
            at.tag,
            left.join(", "),
            at.command("down")
        ));
    }
    if at.run_dir.exists() {
        return Some(format!("{} exists; remove it with `{}`", at.run_dir.display(), at.command("down")));
    }
    None
}

/// Writes every object of `documents` into `dir` as one file each.
fn write_objects(dir: &Path, documents: &[(Value, Location)]) -> Result<(), String> {
    for (value, at) in documents {
        let file = desired::object_file(value)
            .ok_or_else(|| format!("{at}: the object has no usable kind and name"))?;
        let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
        text.push('\n');
        up::write_atomic(&dir.join(file), &text).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn print_errors(what: &str, e: &DesiredErrors) {
    eprintln!("ambit {what}: {} problem(s); nothing was applied:", e.0.len());
    for err in &e.0 {
        eprintln!("  {err}");
    }
}

/// `ambit up`.
pub fn up(args: UpArgs) -> ExitCode {
    if args.supervise {
        return supervise(&args);
    }
    if let Err(e) = require_root("up") {
        return fail("up", e);
    }
    let at = args.at.for_up();
    if let Some(why) = already_up(&at) {
        return fail("up", why);
    }
    let cni = match find_ambit_cni() {
        Ok(p) => p,
        Err(e) => return fail("up", e),
    };
    let plugins = if args.cni_plugins_dir.is_empty() {
        ambit_cluster::cni::PluginPath::with_reference_plugins(&[])
    } else {
        ambit_cluster::cni::PluginPath::with_reference_plugins_in(&args.cni_plugins_dir, &[])
    };
    if let Err(e) = plugins {
        return fail("up", e);
    }
    let node_proxy = match args.node_proxy.as_deref().map(|p| executable("--node-proxy", p)).transpose() {
        Ok(p) => p,
        Err(e) => return fail("up", e),
    };
    let launcher = match args.launcher.as_deref().map(|p| executable("--launcher", p)).transpose() {
        Ok(p) => p,
        Err(e) => return fail("up", e),
    };
    if !args.no_dashboard && !args.dashboard.ip().is_loopback() {
        return fail(
            "up",
            format!(
                "--dashboard {}: the cluster's dashboard is served on loopback addresses only (it has no \
                 login); `ambit dashboard --address … --allow-remote` serves it elsewhere",
                args.dashboard
            ),
        );
    }
    // The objects, checked before anything is created.
    let nodes = node_names(args.nodes);
    let (documents, errors) = if args.demo {
        demo::documents()
    } else if let Some(path) = &args.config {
        read_source(path)
    } else {
        (Vec::new(), Vec::new())
    };
    let mut documents = documents;
    match Desired::check(documents.clone(), errors, &nodes) {
        Ok(d) => desired::fill_cluster_ips(&mut documents, &d),
        Err(e) => {
            print_errors("up", &e);
            return ExitCode::FAILURE;
        }
    }
    crate::policies::print_warnings(documents.iter().map(|(v, _)| v));
    let layout = Layout(at.run_dir.clone());
    let started = Instant::now();
    let prepared = std::fs::create_dir_all(layout.desired())
        .and_then(|()| std::fs::create_dir_all(layout.logs()))
        .map_err(|e| format!("{}: {e}", at.run_dir.display()))
        .and_then(|()| write_objects(&layout.desired(), &documents));
    if let Err(e) = prepared {
        let _ = std::fs::remove_dir_all(&at.run_dir);
        return fail("up", e);
    }
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return fail("up", format!("cannot find this binary: {e}")),
    };
    let log_path = layout.logs().join("up.log");
    let log = match std::fs::OpenOptions::new().create(true).append(true).open(&log_path) {
        Ok(f) => f,
        Err(e) => return fail("up", format!("{}: {e}", log_path.display())),
    };
    let log_err = match log.try_clone() {
        Ok(f) => f,
        Err(e) => return fail("up", e),
    };
    let mut cmd = Command::new(&me);
    cmd.args(["up", "--supervise", "--nodes", &args.nodes.to_string(), "--run-dir"])
        .arg(&at.run_dir)
        .args(["--tag", &at.tag])
        .arg("--ambit-cni")
        .arg(&cni)
        .args(
            args.cni_plugins_dir
                .iter()
                .flat_map(|d| [std::ffi::OsStr::new("--cni-plugins-dir"), d.as_os_str()]),
        )
        .args(node_proxy.iter().flat_map(|p| [std::ffi::OsStr::new("--node-proxy"), p.as_os_str()]))
        .args(launcher.iter().flat_map(|p| [std::ffi::OsStr::new("--launcher"), p.as_os_str()]))
        .args(if args.no_dashboard {
            vec!["--no-dashboard".to_owned()]
        } else {
            vec!["--dashboard".to_owned(), args.dashboard.to_string()]
        })
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    // Its own session: the cluster outlives this terminal.
    unsafe_setsid(&mut cmd);
    // Remembered before the owner starts: an interrupted `ambit up` leaves a cluster that the
    // other commands must find.
    if let Err(e) =
        context::remember(&context::Remembered { run_dir: at.run_dir.clone(), tag: at.tag.clone() })
    {
        let _ = std::fs::remove_dir_all(&at.run_dir);
        return fail("up", e);
    }
    let mut owner = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            context::forget(&at.run_dir);
            let _ = std::fs::remove_dir_all(&at.run_dir);
            return fail("up", format!("cannot start the cluster's owner: {e}"));
        }
    };
    println!("ambit up: {} nodes, run dir {}", args.nodes, at.run_dir.display());
    let mut shown = 0;
    let outcome = loop {
        let text = std::fs::read_to_string(layout.progress()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for l in lines.iter().skip(shown) {
            if *l != "ready" && !l.starts_with("failed: ") {
                println!("  {l}");
            }
        }
        shown = lines.len();
        if let Some(last) = lines.last() {
            if *last == "ready" {
                break Ok(());
            }
            if let Some(why) = last.strip_prefix("failed: ") {
                break Err(why.to_owned());
            }
        }
        if let Ok(Some(status)) = owner.try_wait() {
            break Err(format!("the cluster's owner exited ({status}); its log: {}", log_path.display()));
        }
        if started.elapsed() > UP_TIMEOUT {
            break Err(format!("not ready after {UP_TIMEOUT:?}; the owner's log: {}", log_path.display()));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if let Err(why) = outcome {
        eprintln!("ambit up: {why}");
        let tail = tail_file(&log_path, 15);
        if !tail.is_empty() {
            eprintln!("--- last lines of {} ---\n{tail}", log_path.display());
        }
        eprintln!("ambit up: taking down what was built");
        let removed = ambit_cluster::down::down(&at.run_dir, &at.tag, Duration::from_secs(5));
        for e in removed.errors {
            eprintln!("  {e}");
        }
        context::forget(&at.run_dir);
        let _ = owner.wait();
        return ExitCode::FAILURE;
    }
    // The owner runs on by itself; it is not our child to wait for.
    std::mem::forget(owner);
    println!("ambit up: ready in {:.1} s\n", started.elapsed().as_secs_f64());
    match ClusterState::load(&at.run_dir) {
        Ok(s) => print!("{}", summary(&s, &layout, &at)),
        Err(e) => eprintln!("ambit up: {e}"),
    }
    if args.demo {
        return demo::run(&at);
    }
    ExitCode::SUCCESS
}

#[allow(unsafe_code)]
fn unsafe_setsid(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
}

fn tail_file(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Where everything is, after `ambit up`.
fn summary(s: &ClusterState, layout: &Layout, at: &Target) -> String {
    let mut out = String::new();
    let control = s.network.hosts.iter().find(|h| h.name == up::CONTROL_HOST);
    if let Some(c) = control {
        out += &format!(
            "control plane  ambit control in netns {}: xDS and CA at https://{}:{} (as {}), monitoring :{}\n",
            c.netns,
            c.ip,
            up::CONTROL_GRPC,
            up::CONTROL_HOSTNAME,
            up::CONTROL_MONITORING
        );
    }
    for n in &s.network.nodes {
        out += &format!(
            "node {:<9} netns {}, {} , pods {}: ambit agent (:{} health) and ambit proxy (:{} admin, :{} metrics)\n",
            n.name,
            n.netns,
            n.ip,
            n.pods.map(|p| p.cidr()).unwrap_or_default(),
            up::AGENT_HEALTH,
            s.proxy(&n.name).admin,
            s.proxy(&n.name).stats
        );
    }
    for p in &s.pods {
        out += &format!(
            "pod {:<24} on {:<6} {:<15} netns {}\n",
            format!("{}/{}", p.namespace, p.name),
            p.node,
            p.ip.map(|i| i.to_string()).unwrap_or_default(),
            p.netns
        );
    }
    let dashboard = std::fs::read_to_string(at.run_dir.join(DASHBOARD_FILE)).unwrap_or_default();
    out += &format!(
        "\nlogs        {}\nobjects     {} (edit with `{}` / `{}`)\nstatus      {}\ndashboard   {}\nin a pod    ip netns exec <netns> <command>\nremove all  {}\n",
        layout.logs().display(),
        layout.desired().display(),
        at.command("apply -f FILE"),
        at.command("delete -f FILE"),
        at.command("status"),
        dashboard.trim(),
        at.command("down")
    );
    out
}

/// The run directory's file where the cluster's owner says where its dashboard is.
pub const DASHBOARD_FILE: &str = "dashboard";

fn supervise(args: &UpArgs) -> ExitCode {
    ambit_admin::logging::init("info", false);
    for sig in [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGINT] {
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::Handler(on_signal),
            nix::sys::signal::SaFlags::empty(),
            nix::sys::signal::SigSet::empty(),
        );
        // SAFETY: the handler only stores to an atomic.
        #[allow(unsafe_code)]
        let _ = unsafe { nix::sys::signal::sigaction(sig, &action) };
    }
    let ambit = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return fail("up", e),
    };
    let cni = args.ambit_cni.clone().unwrap_or_else(|| ambit.with_file_name("ambit-cni"));
    let at = args.at.for_up();
    let cfg = UpConfig {
        run_dir: at.run_dir.clone(),
        tag: at.tag.clone(),
        nodes: usize::from(args.nodes),
        ambit,
        ambit_cni: cni,
        segment: (250, 0),
        pods: 244,
        plugin_dirs: args.cni_plugins_dir.clone(),
        node_proxy: args.node_proxy.clone(),
        launcher: args.launcher.clone(),
    };
    let dashboard = if args.no_dashboard {
        "not served (--no-dashboard)".to_owned()
    } else {
        let target = Target { run_dir: at.run_dir.clone(), tag: at.tag.clone(), remembered: false };
        match crate::dashboard::spawn_local(target, args.dashboard) {
            Ok(addr) => format!("http://{addr}/"),
            Err(e) => {
                tracing::warn!("the dashboard is not served: {e}");
                format!("not served: {e} (`ambit dashboard --port N` serves it on another port)")
            }
        }
    };
    let _ = std::fs::write(at.run_dir.join(DASHBOARD_FILE), &dashboard);
    match up::run(cfg, &STOP) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("up", e),
    }
}

/// `ambit down`.
pub fn down(args: DownArgs) -> ExitCode {
    if let Err(e) = require_root("down") {
        return fail("down", e);
    }
    let at = match args.at.resolve() {
        Ok(t) => t,
        Err(e) => return fail("down", e),
    };
    if let Some(why) = owned_elsewhere(&at) {
        return fail("down", why);
    }
    let removed = ambit_cluster::down::down(&at.run_dir, &at.tag, up::STOP_GRACE * 2);
    context::forget(&at.run_dir);
    if removed.nothing() {
        println!(
            "ambit down: nothing was up (no {} and no network namespace {}-*)",
            at.run_dir.display(),
            at.tag
        );
    } else {
        if let Some(pid) = removed.owner {
            println!("stopped the cluster's owner (pid {pid}) and everything it ran");
        }
        if removed.namespaces.is_empty() {
            println!("no network namespace was left (the owner removed its network as it stopped)");
        } else {
            println!("removed {} network namespaces", removed.namespaces.len());
        }
        if removed.cgroups > 0 {
            println!("removed {} cgroups", removed.cgroups);
        }
        if removed.run_dir {
            println!("removed {}", at.run_dir.display());
        }
    }
    if removed.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        for e in &removed.errors {
            eprintln!("ambit down: {e}");
        }
        ExitCode::FAILURE
    }
}

/// Why `ambit down` of `at` must not run: a tag whose namespaces it would remove (the one given,
/// and the one of the run directory's record) belongs to a cluster whose owner runs in another
/// run directory. Removing them would take the network from under that cluster while its owner
/// goes on.
fn owned_elsewhere(at: &Target) -> Option<String> {
    let mut tags = vec![at.tag.clone()];
    if let Ok(s) = ClusterState::load(&at.run_dir)
        && !tags.contains(&s.network.tag)
    {
        tags.push(s.network.tag);
    }
    for tag in tags {
        for o in ambit_cluster::down::live_owners(&tag) {
            let theirs =
                Target { run_dir: context::absolute(&o.run_dir), tag: tag.clone(), remembered: false };
            if theirs.run_dir != at.run_dir {
                return Some(format!(
                    "the network namespaces {tag}-* belong to the cluster up in run dir {} (owner pid {}), not to {}; nothing was removed. To take that cluster down: {}",
                    theirs.run_dir.display(),
                    o.pid,
                    at.run_dir.display(),
                    theirs.command("down")
                ));
            }
        }
    }
    None
}

/// `ambit status`.
pub fn status(args: StatusArgs) -> ExitCode {
    let at = match args.at.resolve() {
        Ok(t) => t,
        Err(e) => return fail("status", e),
    };
    loop {
        let state = match at.load() {
            Ok(s) => s,
            Err(e) => return fail("status", e),
        };
        let report = crate::status::gather(&state, &Layout(at.run_dir.clone()));
        if args.output == "json" {
            println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
        } else if args.output == "yaml" {
            print!("{}", crate::status::yaml(&report));
        } else {
            if args.watch {
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", crate::status::table(&report));
        }
        let _ = std::io::stdout().flush();
        if !args.watch {
            return if state.owner_alive() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// `ambit restart|stop|start NAME`.
#[derive(Args, Debug)]
pub struct ProcessArgs {
    /// The process, as `ambit status` lists it: `control`, `agent/node1`, `proxy/node1`,
    /// `pod/<namespace>/<pod>/<container>`.
    pub name: String,
    /// SIGKILL instead of SIGTERM (a crash rather than a clean stop).
    #[arg(long)]
    pub kill: bool,
    #[command(flatten)]
    pub at: Where,
}

/// How long the owner may take to carry out a request (a proxy replacement drains first).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// `ambit restart|stop|start NAME`: done by the cluster's owner, which answers.
pub fn request(op: &str, args: ProcessArgs) -> ExitCode {
    let at = match args.at.resolve() {
        Ok(t) => t,
        Err(e) => return fail(op, e),
    };
    if let Err(e) = live_state(&at) {
        return fail(op, e);
    }
    let req = up::Request { op: op.to_owned(), name: args.name, kill: args.kill, flags: at.flags() };
    match up::submit(&at.run_dir, &req, REQUEST_TIMEOUT) {
        Ok(r) if r.ok => {
            println!("{}", r.message);
            ExitCode::SUCCESS
        }
        Ok(r) => fail(op, r.message),
        Err(e) => fail(op, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_proxy_or_launcher_must_be_an_executable_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").expect("write");
        assert_eq!(
            executable("--node-proxy", &plain).err(),
            Some(format!("--node-proxy {}: not an executable file", plain.display()))
        );
        assert_eq!(
            executable("--launcher", dir.path()).err(),
            Some(format!("--launcher {}: not an executable file", dir.path().display()))
        );
        let missing = dir.path().join("missing");
        assert_eq!(
            executable("--node-proxy", &missing).err(),
            Some(format!("--node-proxy {}: No such file or directory (os error 2)", missing.display()))
        );
        let exe = dir.path().join("ztunnel");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        assert_eq!(executable("--launcher", &exe).ok(), std::fs::canonicalize(&exe).ok());
    }
}
