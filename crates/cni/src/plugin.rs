//! The commands: environment checks, dispatch, the ADD decision and the agent call.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::panic::{self, UnwindSafe};
use std::time::Duration;

use crate::args::K8sArgs;
use crate::client::{AgentClient, ClientError};
use crate::conf::{ConfError, NetConf};
use crate::error::{CniError, ErrorCode};
use crate::event::{EVENT_PATH, PluginEvent, check_netns_path, is_retry_status};
use crate::result::{PrevResult, ResultError, empty_result};
use crate::system::SystemRole;
use crate::version::{CniVersion, version_info_json};

/// Largest network configuration read from stdin.
pub const MAX_STDIN: u64 = 16 << 20;
/// Upper bound on STATUS's connection check, whatever `agent_timeout_ms` says.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// The `CNI_*` environment of one invocation.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// `CNI_COMMAND`.
    pub command: Option<String>,
    /// `CNI_CONTAINERID`.
    pub container_id: Option<String>,
    /// `CNI_NETNS`.
    pub netns: Option<String>,
    /// `CNI_IFNAME`.
    pub ifname: Option<String>,
    /// `CNI_ARGS` (`Some("")` when set but empty).
    pub args: Option<String>,
    /// `CNI_PATH`.
    pub path: Option<String>,
    /// `CNI_NETNS_OVERRIDE`.
    pub netns_override: Option<String>,
    /// Names of variables that were set but not valid UTF-8.
    pub not_unicode: Vec<&'static str>,
}

/// What a successful invocation prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A JSON document for stdout.
    Stdout(String),
    /// Nothing (DEL, CHECK, GC, STATUS).
    Nothing,
    /// No `CNI_COMMAND`: a line for stderr, exit 0 (libcni's "about" behaviour).
    About(String),
}

/// The CNI commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// ADD: hand the new pod to the agent, print the result.
    Add,
    /// DEL: nothing to undo here (the agent watches pod deletions).
    Del,
    /// CHECK: nothing to verify here.
    Check,
    /// GC: nothing is kept here.
    Gc,
    /// STATUS: can the agent be reached?
    Status,
    /// VERSION: supported versions.
    Version,
}

/// How ADD treats a pod, decided from configuration and `CNI_ARGS` alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No `K8S_POD_NAME`/`K8S_POD_NAMESPACE`: not a Kubernetes pod; succeed at once.
    NotKubernetes,
    /// Namespace in `exclude_namespaces`; succeed at once.
    ExcludedNamespace,
    /// One of the agent's or the node proxy's own pods (`system_pods`); succeed at once: they
    /// must start for anything else to work.
    SystemPod(SystemRole),
    /// Any other pod: the agent decides; fail closed when it cannot be asked.
    AskAgent {
        /// Pod name.
        name: String,
        /// Pod namespace.
        namespace: String,
    },
}

impl Env {
    /// Reads the `CNI_*` variables from a lookup function (the process environment in `main`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Env {
        let mut not_unicode = Vec::new();
        let mut get = |name: &'static str| match lookup(name).map(OsString::into_string) {
            None => None,
            Some(Ok(v)) => Some(v),
            Some(Err(_)) => {
                not_unicode.push(name);
                None
            }
        };
        let command = get("CNI_COMMAND");
        let container_id = get("CNI_CONTAINERID");
        let netns = get("CNI_NETNS");
        let ifname = get("CNI_IFNAME");
        let args = get("CNI_ARGS");
        let path = get("CNI_PATH");
        let netns_override = get("CNI_NETNS_OVERRIDE");
        Env { command, container_id, netns, ifname, args, path, netns_override, not_unicode }
    }

    /// Reads the process environment.
    pub fn from_process() -> Env {
        Env::from_lookup(|name| std::env::var_os(name))
    }

    fn get(&self, name: &str) -> Option<&str> {
        let value = match name {
            "CNI_CONTAINERID" => &self.container_id,
            "CNI_NETNS" => &self.netns,
            "CNI_IFNAME" => &self.ifname,
            "CNI_PATH" => &self.path,
            _ => &None,
        };
        value.as_deref().filter(|v| !v.is_empty())
    }
}

impl Command {
    fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    /// Variables that must be set and non-empty (libcni's table).
    fn required_env(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
            Command::Gc | Command::Status | Command::Version => &[],
        }
    }

    /// The oldest configuration version that defines this command.
    fn min_version(self) -> CniVersion {
        match self {
            Command::Check => CniVersion::V0_4_0,
            Command::Gc | Command::Status => CniVersion::V1_1_0,
            _ => CniVersion::V0_3_0,
        }
    }
}

/// The "about" text printed to stderr when `CNI_COMMAND` is unset.
pub fn about() -> String {
    format!(
        "CNI plugin ambit-cni {}\nCNI protocol versions supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0",
        env!("CARGO_PKG_VERSION")
    )
}

/// Runs one invocation: validates the environment and stdin, then executes the command.
pub fn run(env: &Env, stdin: &mut dyn Read) -> Result<Output, CniError> {
    let Some(command) = env.command.as_deref().filter(|c| !c.is_empty()) else {
        return Ok(Output::About(about()));
    };
    if !env.not_unicode.is_empty() {
        return Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("environment variables {:?} are not valid UTF-8", env.not_unicode),
        ));
    }
    let command = Command::parse(command).ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("unknown CNI_COMMAND {command:?}; expected ADD, DEL, CHECK, GC, STATUS or VERSION"),
        )
    })?;
    if command == Command::Version {
        return Ok(Output::Stdout(version_info_json()));
    }
    let missing: Vec<&str> =
        command.required_env().iter().copied().filter(|name| env.get(name).is_none()).collect();
    if !missing.is_empty() {
        return Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("required env variables [{}] missing", missing.join(",")),
        ));
    }
    let mut bytes = Vec::new();
    stdin.take(MAX_STDIN + 1).read_to_end(&mut bytes).map_err(|e| {
        CniError::new(ErrorCode::Io, "cannot read the network configuration from stdin")
            .details(e.to_string())
    })?;
    if bytes.len() as u64 > MAX_STDIN {
        return Err(CniError::new(
            ErrorCode::Decoding,
            format!("network configuration on stdin is larger than {MAX_STDIN} bytes"),
        ));
    }
    let conf = NetConf::parse(&bytes).map_err(conf_error)?;
    let version = conf.cni_version;
    execute(command, env, &conf).map_err(|e| e.in_version(version))
}

/// Runs `f`, turning a panic into a CNI error (code 999) instead of a crash with no JSON.
pub fn catch_panics<T>(f: impl FnOnce() -> Result<T, CniError> + UnwindSafe) -> Result<T, CniError> {
    panic::catch_unwind(f).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        Err(CniError::new(
            ErrorCode::Internal,
            "ambit-cni failed unexpectedly (a bug; please report it with the details)",
        )
        .details(what))
    })
}

/// Decides how ADD treats a pod; see the crate documentation for the rule.
pub fn decide(conf: &NetConf, args: &K8sArgs) -> Result<Decision, CniError> {
    let (name, namespace) = match (&args.pod_name, &args.pod_namespace) {
        (None, None) => return Ok(Decision::NotKubernetes),
        (Some(name), Some(namespace)) => (name, namespace),
        _ => {
            return Err(CniError::new(
                ErrorCode::InvalidEnvironment,
                "CNI_ARGS has only one of K8S_POD_NAME and K8S_POD_NAMESPACE; the runtime must send both (or neither for a non-Kubernetes container)",
            ));
        }
    };
    if conf.exclude_namespaces.iter().any(|ns| ns == namespace) {
        return Ok(Decision::ExcludedNamespace);
    }
    if let Some(system) = conf.system_pods.iter().find(|s| s.matches(namespace, name)) {
        return Ok(Decision::SystemPod(system.role));
    }
    Ok(Decision::AskAgent { name: name.clone(), namespace: namespace.clone() })
}

fn execute(command: Command, env: &Env, conf: &NetConf) -> Result<Output, CniError> {
    if conf.cni_version < command.min_version() {
        return Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            format!(
                "config version {} does not allow {command:?}; it needs cniVersion {} or later",
                conf.cni_version,
                command.min_version()
            ),
        ));
    }
    if matches!(command, Command::Add | Command::Del | Command::Check) {
        validate_container_id(env.get("CNI_CONTAINERID").unwrap_or_default())?;
        validate_ifname(env.get("CNI_IFNAME").unwrap_or_default())?;
    }
    match command {
        Command::Add => add(env, conf),
        // Nothing is created by this plugin, so there is nothing to delete, check or collect:
        // pod removal reaches the agent through its pod watch.
        Command::Del | Command::Check | Command::Gc | Command::Version => Ok(Output::Nothing),
        Command::Status => status(conf),
    }
}

fn add(env: &Env, conf: &NetConf) -> Result<Output, CniError> {
    let prev = conf.prev_result.as_deref().map(PrevResult::parse).transpose().map_err(result_error)?;
    let ips = match &prev {
        Some(prev) => prev.event_ips().map_err(result_error)?,
        None => Vec::new(),
    };
    let output = match &prev {
        Some(prev) => prev.render(conf.cni_version),
        None => empty_result(conf.cni_version),
    };
    let Some(raw_args) = env.args.as_deref() else {
        return Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            "CNI_ARGS is not set; ambit-cni needs K8S_POD_NAMESPACE and K8S_POD_NAME from the container runtime to know which pod this is (set CNI_ARGS=\"\" for a container that is not a Kubernetes pod)",
        ));
    };
    let args: K8sArgs = raw_args
        .parse()
        .map_err(|e: crate::args::ArgsError| CniError::new(ErrorCode::InvalidEnvironment, e.to_string()))?;
    let (pod_name, pod_namespace) = match decide(conf, &args)? {
        Decision::AskAgent { name, namespace } => (name, namespace),
        Decision::NotKubernetes | Decision::ExcludedNamespace | Decision::SystemPod(_) => {
            return Ok(Output::Stdout(output));
        }
    };
    let netns = env.get("CNI_NETNS").unwrap_or_default();
    if !netns_override(env) {
        check_netns(netns)?;
    }
    let event = PluginEvent { netns: netns.to_owned(), pod_name, pod_namespace, ips };
    let client = AgentClient::new(conf.event_socket(), conf.agent_timeout);
    let pod = format!("{}/{}", event.pod_namespace, event.pod_name);
    match client.post_json(EVENT_PATH, event.to_json().as_bytes()) {
        Ok(response) if response.status == 200 => Ok(Output::Stdout(output)),
        Ok(response) => {
            let body = String::from_utf8_lossy(&response.body);
            let code =
                if is_retry_status(response.status) { ErrorCode::TryAgainLater } else { ErrorCode::Internal };
            Err(CniError::new(
                code,
                format!("node agent could not set up pod {pod} (HTTP {}): {}", response.status, body.trim()),
            ))
        }
        Err(e @ ClientError::Connect { .. }) => {
            // Agent not running: only the enrollment cache can let a pod through.
            match crate::cache::certainly_not_enrolled(
                conf.agent_run_dir(),
                &event.pod_namespace,
                &event.pod_name,
            ) {
                Ok(()) => {
                    eprintln!(
                        "ambit-cni: node agent unreachable ({e}); pod {pod} starts because its namespace is not in the mesh"
                    );
                    Ok(Output::Stdout(output))
                }
                Err(why) => Err(agent_failure(&pod, &client, &e).details(format!("{e}; {why}"))),
            }
        }
        Err(e) => Err(agent_failure(&pod, &client, &e)),
    }
}

fn status(conf: &NetConf) -> Result<Output, CniError> {
    let client = AgentClient::new(conf.event_socket(), conf.agent_timeout.min(STATUS_TIMEOUT));
    client.probe().map(|()| Output::Nothing).map_err(|e| {
        CniError::new(
            ErrorCode::PluginNotAvailable,
            format!(
                "node agent is not accepting connections on {}; new pods cannot be set up until the Ambit node agent (ambit agent) is running on this node",
                client.socket().display()
            ),
        )
        .details(e.to_string())
    })
}

fn agent_failure(pod: &str, client: &AgentClient, e: &ClientError) -> CniError {
    let socket = client.socket().display();
    let (code, msg) = match e {
        ClientError::Malformed { .. } => {
            (ErrorCode::Internal, format!("node agent on {socket} sent a malformed answer for pod {pod}"))
        }
        ClientError::Timeout { timeout, .. } => (
            ErrorCode::TryAgainLater,
            format!(
                "node agent on {socket} did not answer for pod {pod} within {timeout:?}; the pod is held back until the agent confirms its traffic capture (the runtime retries; check the ambit agent logs on this node, or raise agent_timeout_ms)"
            ),
        ),
        ClientError::Connect { .. } | ClientError::Io { .. } => (
            ErrorCode::TryAgainLater,
            format!(
                "cannot reach the node agent on {socket} for pod {pod}; the Ambit node agent (ambit agent) must be running on this node before pods outside exclude_namespaces can start (the runtime retries)"
            ),
        ),
    };
    CniError::new(code, msg).details(e.to_string())
}

fn netns_override(env: &Env) -> bool {
    env.netns_override.as_deref().is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// The plugin's own checks of `CNI_NETNS` before it asks the agent (skipped with
/// `CNI_NETNS_OVERRIDE=1`; the agent checks again in its own process either way): the path's
/// form, that it exists, and that it is not this process's (the host's) namespace, compared by
/// device and inode. Whether it is a network namespace at all is the agent's check (it needs
/// `statfs`, which this plugin's dependencies do not offer).
fn check_netns(netns: &str) -> Result<(), CniError> {
    let path = check_netns_path(netns).map_err(|e| CniError::new(ErrorCode::InvalidNetns, e.to_string()))?;
    let theirs = std::fs::metadata(path)
        .map_err(|e| CniError::new(ErrorCode::InvalidNetns, format!("cannot stat CNI_NETNS {netns}: {e}")))?;
    let own = std::fs::metadata("/proc/self/ns/net");
    if own.is_ok_and(|ours| theirs.dev() == ours.dev() && theirs.ino() == ours.ino()) {
        return Err(CniError::new(
            ErrorCode::InvalidNetns,
            format!(
                "CNI_NETNS {netns} is the plugin's own (host) network namespace; refusing to hand it to the node agent for capture"
            ),
        ));
    }
    Ok(())
}

/// libcni's `ValidateContainerID`.
fn validate_container_id(id: &str) -> Result<(), CniError> {
    let mut bytes = id.bytes();
    let ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("invalid characters in CNI_CONTAINERID {id:?}"),
        ))
    }
}

/// libcni's `ValidateInterfaceName`.
fn validate_ifname(name: &str) -> Result<(), CniError> {
    let problem = if name.len() > 15 {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("is not allowed")
    } else if name.contains(['/', ':']) || name.chars().any(char::is_whitespace) {
        Some("contains '/', ':' or whitespace")
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => {
            Err(CniError::new(ErrorCode::InvalidEnvironment, format!("CNI_IFNAME {name:?} {problem}")))
        }
    }
}

fn conf_error(e: ConfError) -> CniError {
    let code = match e {
        ConfError::Syntax(_) => ErrorCode::Decoding,
        ConfError::MissingVersion | ConfError::UnsupportedVersion(_) => ErrorCode::IncompatibleVersion,
        ConfError::Type(_)
        | ConfError::MissingName
        | ConfError::InvalidName(_)
        | ConfError::Invalid { .. } => ErrorCode::InvalidNetworkConfig,
    };
    CniError::new(code, e.to_string())
}

fn result_error(e: ResultError) -> CniError {
    let code = match e {
        ResultError::Version(_) => ErrorCode::IncompatibleVersion,
        ResultError::NotObject | ResultError::Json(_) | ResultError::Ips(_) => ErrorCode::Decoding,
    };
    CniError::new(code, e.to_string())
}

#[cfg(test)]
mod tests;
