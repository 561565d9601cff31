//! `ambit agent`'s command line and environment (istio-cni's names where they exist), and the
//! typed settings derived from it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::enroll::{EnablementSelector, Enrollment, LabelSelector, SystemSelector, parse_selectors};

/// Which defaults the agent starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// Ambit's own: host paths as they are (`/proc`, `/etc/cni/net.d`, `/var/run/ambit`), as
    /// on a host or under Ambit's chart, which sets the container paths explicitly.
    Ambit,
    /// istio-cni's, for a drop-in under Istio's `cni` chart (the `install-cni` entry point):
    /// host mounts under `/host` (`/host/proc`, `/host/etc/cni/net.d`, `/host/opt/cni/bin`),
    /// run dir `/var/run/istio-cni`, plugin binary `/opt/cni/bin/ambit-cni` in the image.
    IstioCni,
}

/// The capture backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// nftables over netlink.
    Nftables,
    /// iptables, through `iptables-restore`.
    Iptables,
}

/// The paths the agent uses, resolved from the flags, the environment and the profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// Plugin event socket and enrollment cache.
    pub run_dir: PathBuf,
    /// CNI conf dir to install into; `None`: no installation (local mode).
    pub cni_conf_dir: Option<PathBuf>,
    /// CNI bin dir the plugin is copied into.
    pub cni_bin_dir: PathBuf,
    /// Prefix of netns paths given by the CNI runtime.
    pub host_prefix: PathBuf,
    /// The host's /proc.
    pub proc_root: PathBuf,
    /// The host network namespace.
    pub host_netns: PathBuf,
    /// The plugin binary to install; `None`: next to this executable.
    pub cni_binary: Option<PathBuf>,
}

/// istio-cni settings (its chart sets most of them) that Ambit's agent reads only to say, once
/// at start, that they have no effect here, and why. The agent starts with any of them set.
pub const ISTIO_CNI_WITHOUT_EFFECT: &[(&str, &str)] = &[
    ("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", "the agent always re-checks running pods' capture at start"),
    ("ENABLE_AMBIENT_DETECTION_RETRY", "the plugin never fails open: it retries, then fails the ADD"),
    ("AMBIENT_DISABLE_SAFE_UPGRADE", "the agent never removes capture on exit"),
    (
        "ISTIO_OWNED_CNI_CONFIG",
        "the plugin is chained into the first config file (an Istio-owned one, if it is first)",
    ),
    ("ISTIO_OWNED_CNI_CONF_FILENAME", "see ISTIO_OWNED_CNI_CONFIG"),
    ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "see ISTIO_OWNED_CNI_CONFIG"),
    ("FORCE_IPTABLES_BINARY", "the iptables backend finds its binary itself"),
    ("HOST_PROBE_SNAT_IP", "kubelet probes are recognised by the agent's own SNAT address"),
    ("HOST_PROBE_SNAT_IPV6", "kubelet probes are recognised by the agent's own SNAT address"),
    ("KUBECONFIG_MODE", "the plugin needs no kubeconfig: it asks the agent"),
    ("KUBE_CA_FILE", "the plugin needs no kubeconfig"),
    ("SKIP_TLS_VERIFY", "the plugin needs no kubeconfig"),
    ("MONITORING_PORT", "set AMBIT_AGENT_METRICS_ADDR"),
    ("REPAIR_ENABLED", "sidecar repair is not part of ambient"),
    ("REPAIR_LABEL_PODS", "sidecar repair is not part of ambient"),
    ("REPAIR_DELETE_PODS", "sidecar repair is not part of ambient"),
    ("REPAIR_REPAIR_PODS", "sidecar repair is not part of ambient"),
    ("REPAIR_INIT_CONTAINER_NAME", "sidecar repair is not part of ambient"),
    ("REPAIR_BROKEN_POD_LABEL_KEY", "sidecar repair is not part of ambient"),
    ("REPAIR_BROKEN_POD_LABEL_VALUE", "sidecar repair is not part of ambient"),
    ("REPAIR_NODE_NAME", "sidecar repair is not part of ambient"),
    ("REPAIR_RUN_AS_DAEMON", "sidecar repair is not part of ambient"),
    ("REPAIR_SIDECAR_ANNOTATION", "sidecar repair is not part of ambient"),
    ("CURRENT_AGENT_VERSION", "informational in istio-cni too"),
    ("GOMEMLIMIT", "a Go runtime setting"),
    ("KUBERNETES_NODE_NAME", "NODE_NAME names the node"),
    ("REVISION", "unused by istio-cni too"),
];

/// Command line and environment of `ambit agent` (istio-cni's names where they exist).
#[derive(Clone, Debug, clap::Args)]
pub struct AgentArgs {
    /// Which defaults to start from: `ambit`, or `istio-cni` (istio-cni's container paths;
    /// the `install-cni` entry point selects it).
    #[arg(long, env = "AMBIT_AGENT_PROFILE", value_enum, default_value = "ambit")]
    pub profile: Profile,
    /// Local mode: read pods and namespaces from a folder of YAML Pod/Namespace objects (as
    /// `ambit up` writes them). Without it, the Kubernetes API (in-cluster config or
    /// KUBECONFIG) is watched, and NODE_NAME is required.
    #[arg(long, env = "AMBIT_SOURCE_DIR")]
    pub source_dir: Option<PathBuf>,
    /// Local mode: write each pod's `ambient.istio.io/redirection` value (what the agent patches
    /// onto the pod in Kubernetes) to `<dir>/<NODE_NAME>.json`, atomically, for the control
    /// plane's file source to lay over the pods it reads. The pods' YAML files are never
    /// rewritten. Requires --source-dir and NODE_NAME.
    #[arg(long, env = "AMBIT_CAPTURE_STATE_DIR")]
    pub capture_state_dir: Option<PathBuf>,
    /// How often the source folder is checked for changes.
    #[arg(long, env = "AMBIT_SOURCE_POLL", default_value = "250ms", value_parser = parse_duration)]
    pub source_poll: Duration,
    /// How often every enrolled pod's capture (rules, routing, net.ipv4.tcp_migrate_req) is
    /// verified; what drifted is re-applied and logged.
    #[arg(long, env = "AMBIT_CAPTURE_VERIFY_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub capture_verify_interval: Duration,
    /// This node's name: only its pods are watched and handled. Required with the Kubernetes
    /// source (set it from the pod's spec.nodeName); optional in local mode.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// How long the Kubernetes source may take for its initial list of pods and namespaces
    /// before the agent gives up and exits (it reports not-ready, with the reason, meanwhile).
    #[arg(long, env = "AMBIT_KUBE_SYNC_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub kube_sync_timeout: Duration,
    /// Directory of the plugin event socket (`pluginevent.sock`) and the enrollment cache; the
    /// plugin on the host reaches it at the same path. Default `/var/run/ambit`
    /// (`/var/run/istio-cni` in the istio-cni profile).
    #[arg(long, env = "CNI_AGENT_RUN_DIR")]
    pub run_dir: Option<PathBuf>,
    /// ZDS socket the node proxy connects to.
    #[arg(long, env = "ZTUNNEL_UDS_ADDRESS", default_value = "/var/run/ztunnel/ztunnel.sock")]
    pub zds_socket: PathBuf,
    /// Namespaces never enrolled (comma separated).
    #[arg(long, env = "EXCLUDE_NAMESPACES", default_value = "kube-system")]
    pub exclude_namespaces: String,
    /// Enablement selectors: a YAML (or JSON) list of {podSelector, namespaceSelector}, as
    /// istio-cni's chart renders them; default: Istio's (pod or namespace label
    /// istio.io/dataplane-mode=ambient, pod opt-out =none).
    #[arg(long, env = "AMBIENT_ENABLEMENT_SELECTOR")]
    pub enablement_selectors: Option<String>,
    /// Redirect pods' DNS (port 53) to the proxy's DNS proxy (per-pod annotation
    /// ambient.istio.io/dns-capture overrides).
    #[arg(long, env = "AMBIENT_DNS_CAPTURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub dns_capture: bool,
    /// Capture IPv6 too.
    #[arg(long, env = "AMBIENT_IPV6", default_value_t = true, action = clap::ArgAction::Set)]
    pub ipv6: bool,
    /// Capture backend: `nftables` (programmed over netlink, no `nft` binary needed) or
    /// `iptables` (runs `iptables-restore`). Default: as NATIVE_NFTABLES says, else nftables.
    #[arg(long, env = "AMBIT_CAPTURE_BACKEND")]
    pub capture_backend: Option<String>,
    /// istio-cni's backend switch: `true` nftables, `false` iptables (what istio-cni does);
    /// AMBIT_CAPTURE_BACKEND wins when both are set.
    #[arg(long, env = "NATIVE_NFTABLES", value_parser = clap::builder::BoolishValueParser::new())]
    pub native_nftables: Option<bool>,
    /// istio-cni's switch for the ambient data plane. Ambit's agent is that data plane, so
    /// `false` is refused at start rather than ignored.
    #[arg(long, env = "AMBIENT_ENABLED", value_parser = clap::builder::BoolishValueParser::new())]
    pub ambient_enabled: Option<bool>,
    /// Prefix for netns paths given by the CNI runtime. Default `/` (`/host` in the istio-cni
    /// profile, where the host's paths are mounted).
    #[arg(long, env = "AMBIT_HOST_PREFIX")]
    pub host_prefix: Option<PathBuf>,
    /// The host's /proc (to find running pods' network namespaces). Default `/proc`
    /// (`/host/proc` in the istio-cni profile).
    #[arg(long, env = "AMBIT_PROC_ROOT")]
    pub proc_root: Option<PathBuf>,
    /// The host network namespace: kubelet probe SNAT rules go there, and no CNI ADD may name it
    /// (nor the agent's own namespace, nor pid 1's under the proc root). Default: pid 1's under
    /// the proc root when ALLOW_SWITCH_TO_HOST_NS is true, else the agent's own.
    #[arg(long, env = "AMBIT_HOST_NETNS")]
    pub host_netns: Option<PathBuf>,
    /// istio-cni's: the agent's pod is not in the host network, so host work enters
    /// `<proc root>/1/ns/net` (the default of AMBIT_HOST_NETNS when true).
    #[arg(long, env = "ALLOW_SWITCH_TO_HOST_NS", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_switch_to_host_ns: Option<bool>,
    /// Prometheus metrics address.
    #[arg(long, env = "AMBIT_AGENT_METRICS_ADDR", default_value = "[::]:15014")]
    pub metrics_addr: SocketAddr,
    /// Health address (`/healthz`, `/readyz`; not ready answers 503 with the reason). Bound
    /// first, before the pod source is read.
    #[arg(long, env = "AMBIT_AGENT_HEALTH_ADDR", default_value = "[::]:8000")]
    pub health_addr: SocketAddr,
    /// CNI conf dir to install the plugin into (kubelet's `/etc/cni/net.d`). Default: that path
    /// with the Kubernetes source, no installation in local mode; always `/host/etc/cni/net.d`
    /// in the istio-cni profile.
    #[arg(long, env = "MOUNTED_CNI_NET_DIR")]
    pub cni_conf_dir: Option<PathBuf>,
    /// CNI bin dir the plugin binary is copied into. Default `/opt/cni/bin`
    /// (`/host/opt/cni/bin` in the istio-cni profile).
    #[arg(long, env = "AMBIT_CNI_BIN_DIR")]
    pub cni_bin_dir: Option<PathBuf>,
    /// New CNI config files get mode 0640 instead of 0600.
    #[arg(long, env = "CNI_CONF_GROUP_READ", value_parser = clap::builder::BoolishValueParser::new(), default_value = "false")]
    pub cni_conf_group_read: bool,
    /// Primary CNI config file to chain into (default: the first one, kubelet's order).
    #[arg(long, env = "CNI_CONF_NAME")]
    pub cni_conf_name: Option<String>,
    /// Chain after the primary plugin (`false`: write a standalone config).
    #[arg(long, env = "CHAINED_CNI_PLUGIN", default_value_t = true, action = clap::ArgAction::Set)]
    pub chained: bool,
    /// The `ambit-cni` binary to install (default: next to this executable;
    /// `/opt/cni/bin/ambit-cni` in the istio-cni profile, where the image keeps it).
    #[arg(long, env = "AMBIT_CNI_BINARY")]
    pub cni_binary: Option<PathBuf>,
    /// The agent's own namespace (set from the pod's metadata.namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// The agent's own pod name (set from the pod's metadata.name). With POD_NAMESPACE it
    /// identifies the agent's pod, whose generateName (its DaemonSet's) goes into the plugin
    /// config so that a replacement agent pod always starts, even with no agent running.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Namespace of the node proxy's pods (default: SYSTEM_NAMESPACE, else POD_NAMESPACE).
    #[arg(long, env = "AMBIT_PROXY_NAMESPACE")]
    pub proxy_namespace: Option<String>,
    /// istio-cni's name for the namespace of the node proxy's (ztunnel's) pods.
    #[arg(long, env = "SYSTEM_NAMESPACE")]
    pub system_namespace: Option<String>,
    /// Labels of the node proxy's pods (`key=value,…`). They are never enrolled, and their
    /// generateName goes into the plugin config so that they always start, even with no agent.
    #[arg(long, env = "AMBIT_PROXY_POD_LABELS", default_value = "app=ztunnel")]
    pub proxy_pod_labels: String,
    /// Remove the plugin from the CNI config on every exit, without asking whether this is an
    /// uninstall. Not needed to uninstall under a DaemonSet (see AMBIT_AGENT_DAEMONSET); with it,
    /// every restart or upgrade lets new pods start unmeshed until the next agent is up.
    #[arg(long, env = "AMBIT_UNINSTALL_ON_EXIT", default_value_t = false, action = clap::ArgAction::Set)]
    pub uninstall_on_exit: bool,
    /// The agent's own DaemonSet, in POD_NAMESPACE (Kubernetes source only). Watched while the
    /// agent runs and asked for when it stops: being deleted or gone means an uninstall, and the
    /// plugin leaves the CNI chain; present, or no clear answer, and it stays. Default
    /// `istio-cni-node` in the istio-cni profile (Istio's chart's name), none otherwise (the
    /// plugin then stays).
    #[arg(long, env = "AMBIT_AGENT_DAEMONSET")]
    pub agent_daemonset: Option<String>,
    /// Log filter.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub rust_log: String,
    /// istio-cni's log levels, `<level>` or `<scope>:<level>,…` (levels debug, info, warn,
    /// error, fatal, none; scope `default`/`all` for everything, `cni-agent` for the agent,
    /// others are accepted and have no effect). Overrides RUST_LOG.
    #[arg(long = "log_output_level")]
    pub log_output_level: Option<String>,
    /// Logs as JSON lines (istio-cni's flag).
    #[arg(long = "log_as_json", num_args = 0..=1, default_missing_value = "true", default_value = "false",
        value_parser = clap::builder::BoolishValueParser::new())]
    pub log_as_json: bool,
}

impl AgentArgs {
    /// The agent's own DaemonSet and its namespace, when both are known: AMBIT_AGENT_DAEMONSET
    /// (else the istio-cni profile's `istio-cni-node`) in POD_NAMESPACE.
    pub fn own_daemonset(&self) -> Option<(String, String)> {
        let name = match (&self.agent_daemonset, self.profile) {
            (Some(n), _) => Some(n.clone()),
            (None, Profile::IstioCni) => Some("istio-cni-node".to_owned()),
            (None, Profile::Ambit) => None,
        };
        let namespace = self.pod_namespace.clone();
        name.filter(|n| !n.is_empty()).zip(namespace.filter(|n| !n.is_empty()))
    }

    /// The paths, from the flags and environment, else the profile's defaults.
    pub fn paths(&self) -> Paths {
        let istio = self.profile == Profile::IstioCni;
        let or = |v: &Option<PathBuf>, ambit: &str, istio_cni: &str| {
            v.clone().unwrap_or_else(|| PathBuf::from(if istio { istio_cni } else { ambit }))
        };
        let proc_root = or(&self.proc_root, "/proc", "/host/proc");
        let host_netns = match (&self.host_netns, self.allow_switch_to_host_ns) {
            (Some(p), _) => p.clone(),
            (None, Some(true)) => proc_root.join("1/ns/net"),
            (None, _) => PathBuf::from("/proc/self/ns/net"),
        };
        let default_conf_dir = if istio { "/host/etc/cni/net.d" } else { "/etc/cni/net.d" };
        Paths {
            run_dir: or(&self.run_dir, "/var/run/ambit", "/var/run/istio-cni"),
            // istio-cni always installs (its conf dir is a mount of the host's); Ambit's own
            // profile installs nowhere in local mode unless told where.
            cni_conf_dir: self
                .cni_conf_dir
                .clone()
                .or_else(|| (istio || self.source_dir.is_none()).then(|| default_conf_dir.into())),
            cni_bin_dir: or(&self.cni_bin_dir, "/opt/cni/bin", "/host/opt/cni/bin"),
            host_prefix: or(&self.host_prefix, "/", "/host"),
            proc_root,
            host_netns,
            cni_binary: self.cni_binary.clone().or_else(|| istio.then(|| "/opt/cni/bin/ambit-cni".into())),
        }
    }

    /// The capture backend: AMBIT_CAPTURE_BACKEND, else NATIVE_NFTABLES, else nftables.
    pub fn backend(&self) -> Result<Backend, String> {
        match (self.capture_backend.as_deref(), self.native_nftables) {
            (Some("nftables"), _) => Ok(Backend::Nftables),
            (Some("iptables"), _) => Ok(Backend::Iptables),
            (Some(other), _) => Err(format!("AMBIT_CAPTURE_BACKEND={other:?}: use nftables or iptables")),
            (None, Some(false)) => Ok(Backend::Iptables),
            (None, _) => Ok(Backend::Nftables),
        }
    }

    /// Refuses `AMBIENT_ENABLED=false`: the agent is the ambient data plane and nothing else.
    pub fn check_ambient(&self) -> Result<(), String> {
        match self.ambient_enabled {
            Some(false) => {
                Err("AMBIENT_ENABLED=false: Ambit's agent only runs the ambient data plane (capture \
                 and the node proxy's ZDS server); enable ambient in the chart (ambient.enabled=true), or \
                 keep istio-cni on this cluster"
                    .to_owned())
            }
            _ => Ok(()),
        }
    }

    /// The tracing filter: `--log_output_level` converted, else RUST_LOG.
    pub fn log_filter(&self) -> Result<String, String> {
        match &self.log_output_level {
            Some(levels) => istio_log_filter(levels, "ambit_agent", "cni-agent"),
            None => Ok(self.rust_log.clone()),
        }
    }

    /// One line per istio-cni setting in `env` that has no effect here, saying why.
    pub fn without_effect(env: &std::collections::BTreeMap<String, String>) -> Vec<String> {
        ISTIO_CNI_WITHOUT_EFFECT
            .iter()
            .filter(|(name, _)| env.contains_key(*name))
            .map(|(name, why)| format!("{name} is istio-cni's and has no effect in Ambit: {why}"))
            .collect()
    }

    /// `EXCLUDE_NAMESPACES` as a set.
    pub fn excluded_namespaces(&self) -> BTreeSet<String> {
        self.exclude_namespaces
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }

    /// The enrollment rules: selectors, excluded namespaces, the node's own pods.
    pub fn enrollment(&self) -> Result<Enrollment, String> {
        let selectors: Vec<EnablementSelector> = match &self.enablement_selectors {
            Some(s) if !s.trim().is_empty() => parse_selectors(s).map_err(|e| e.to_string())?,
            _ => crate::enroll::default_selectors(),
        };
        let nonempty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        let agent = nonempty(&self.pod_namespace).zip(nonempty(&self.pod_name));
        let labels = LabelSelector::parse_equalities(&self.proxy_pod_labels)
            .map_err(|e| format!("AMBIT_PROXY_POD_LABELS={:?}: {e}", self.proxy_pod_labels))?;
        let proxy = self.proxy_namespace().filter(|_| !labels.is_empty()).map(|ns| (ns, labels));
        Ok(Enrollment {
            selectors,
            excluded_namespaces: self.excluded_namespaces(),
            system: SystemSelector { agent, proxy },
        })
    }

    /// Namespace of the node proxy's pods: AMBIT_PROXY_NAMESPACE, SYSTEM_NAMESPACE, POD_NAMESPACE.
    pub fn proxy_namespace(&self) -> Option<String> {
        let nonempty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        nonempty(&self.proxy_namespace)
            .or_else(|| nonempty(&self.system_namespace))
            .or_else(|| nonempty(&self.pod_namespace))
    }

    /// The node name, required with the Kubernetes source.
    pub fn required_node_name(&self) -> Result<&str, String> {
        match self.node_name.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => Ok(n),
            _ => Err("NODE_NAME (--node-name) is required with the Kubernetes source: without it the agent \
                 would watch, and enroll, every pod of the cluster; set it from the pod's spec.nodeName \
                 (downward API), or use --source-dir for local mode"
                .to_owned()),
        }
    }
}

impl AgentArgs {
    /// The capture-state folder and node name, when local mode writes capture state.
    pub fn capture_state(&self) -> Result<Option<(&std::path::Path, &str)>, String> {
        let Some(dir) = &self.capture_state_dir else { return Ok(None) };
        if self.source_dir.is_none() {
            return Err(
                "AMBIT_CAPTURE_STATE_DIR (--capture-state-dir) is for local mode (--source-dir); with the \
                 Kubernetes source the agent writes the annotation onto the pod"
                    .to_owned(),
            );
        }
        match self.node_name.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => Ok(Some((dir.as_path(), n))),
            _ => Err(
                "AMBIT_CAPTURE_STATE_DIR (--capture-state-dir) needs NODE_NAME (--node-name): the state is \
                 written to <dir>/<NODE_NAME>.json"
                    .to_owned(),
            ),
        }
    }
}

pub use ambit_admin::parse_positive_duration as parse_duration;

/// Converts Istio's `--log_output_level` (`<level>` or `<scope>:<level>,…`) into a tracing
/// filter: `default`/`all` (or no scope) set the global level, `own_scope` sets `own_target`'s;
/// other scopes are accepted and have no effect. `fatal` is `error`, `none` is `off`.
pub fn istio_log_filter(levels: &str, own_target: &str, own_scope: &str) -> Result<String, String> {
    let mut global = "info";
    let mut own = None;
    for term in levels.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (scope, level) = term.rsplit_once(':').unwrap_or(("default", term));
        let level = match level.trim() {
            "debug" => "debug",
            "info" => "info",
            "warn" => "warn",
            "error" | "fatal" => "error",
            "none" => "off",
            other => {
                return Err(format!(
                    "--log_output_level={levels:?}: {other:?} is no level (debug, info, warn, error, fatal, none)"
                ));
            }
        };
        match scope.trim() {
            "default" | "all" => global = level,
            s if s == own_scope => own = Some(level),
            _ => {}
        }
    }
    Ok(match own {
        Some(level) => format!("{global},{own_target}={level}"),
        None => global.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        agent: AgentArgs,
    }

    fn args(extra: &[&str]) -> AgentArgs {
        let mut v = vec!["agent"];
        v.extend_from_slice(extra);
        Cli::try_parse_from(v).expect("args").agent
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        // The shared Go-style parser: a bare number is seconds, hours are fine, zero is not.
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0s"), Err("\"0s\" must be longer than zero".into()));
        for bad in ["", "-1s", "fast"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn node_name_is_required_for_the_kubernetes_source() {
        for a in [args(&[]), args(&["--node-name", ""]), args(&["--node-name", "  "])] {
            let err = a.required_node_name().expect_err("no node name");
            assert!(
                err.starts_with("NODE_NAME (--node-name) is required with the Kubernetes source"),
                "{err}"
            );
        }
        assert_eq!(args(&["--node-name", "n1"]).required_node_name(), Ok("n1"));
    }

    #[test]
    fn capture_state_needs_local_mode_and_a_node_name() {
        assert_eq!(args(&[]).capture_state(), Ok(None));
        let e = args(&["--capture-state-dir", "/s"]).capture_state().expect_err("no source dir");
        assert!(e.starts_with("AMBIT_CAPTURE_STATE_DIR (--capture-state-dir) is for local mode"), "{e}");
        let e =
            args(&["--capture-state-dir", "/s", "--source-dir", "/o"]).capture_state().expect_err("no node");
        assert!(e.ends_with("the state is written to <dir>/<NODE_NAME>.json"), "{e}");
        let a = args(&["--capture-state-dir", "/s", "--source-dir", "/o", "--node-name", "n1"]);
        assert_eq!(a.capture_state(), Ok(Some((std::path::Path::new("/s"), "n1"))));
    }

    #[test]
    fn system_pods_from_the_settings() {
        let a = args(&["--pod-namespace", "ambit-system", "--pod-name", "ambit-agent-x7k2p"]);
        let e = a.enrollment().expect("enrollment");
        assert_eq!(e.system.agent, Some(("ambit-system".into(), "ambit-agent-x7k2p".into())));
        let (ns, sel) = e.system.proxy.expect("proxy selector");
        assert_eq!(ns, "ambit-system");
        assert_eq!(sel.match_labels.get("app").map(String::as_str), Some("ztunnel"));
        let a = args(&["--proxy-namespace", "istio-system", "--proxy-pod-labels", "app=ambit-proxy"]);
        let e = a.enrollment().expect("enrollment");
        assert_eq!(e.system.agent, None, "no POD_NAME: the agent's pod is not known");
        assert_eq!(e.system.proxy.map(|p| p.0), Some("istio-system".to_owned()));
        assert!(args(&["--proxy-pod-labels", "app"]).enrollment().is_err());
    }

    #[test]
    fn profiles_give_the_paths_and_explicit_settings_win() {
        let p = args(&[]).paths();
        assert_eq!(p.run_dir, PathBuf::from("/var/run/ambit"));
        assert_eq!(p.cni_conf_dir, Some(PathBuf::from("/etc/cni/net.d")));
        assert_eq!(p.cni_bin_dir, PathBuf::from("/opt/cni/bin"));
        assert_eq!((p.host_prefix, p.proc_root), (PathBuf::from("/"), PathBuf::from("/proc")));
        assert_eq!(p.host_netns, PathBuf::from("/proc/self/ns/net"));
        assert_eq!(p.cni_binary, None, "next to this executable");
        assert_eq!(args(&["--source-dir", "/o"]).paths().cni_conf_dir, None, "local mode installs nothing");

        let istio = args(&["--profile", "istio-cni", "--allow-switch-to-host-ns", "true"]).paths();
        assert_eq!(
            istio,
            Paths {
                run_dir: "/var/run/istio-cni".into(),
                cni_conf_dir: Some("/host/etc/cni/net.d".into()),
                cni_bin_dir: "/host/opt/cni/bin".into(),
                host_prefix: "/host".into(),
                proc_root: "/host/proc".into(),
                host_netns: "/host/proc/1/ns/net".into(),
                cni_binary: Some("/opt/cni/bin/ambit-cni".into()),
            }
        );
        let p = args(&["--profile", "istio-cni", "--source-dir", "/o"]).paths();
        assert_eq!(p.host_netns, PathBuf::from("/proc/self/ns/net"), "no switch: the agent's own netns");
        assert_eq!(p.cni_conf_dir, Some(PathBuf::from("/host/etc/cni/net.d")), "istio-cni always installs");
        let p =
            args(&["--profile", "istio-cni", "--allow-switch-to-host-ns", "1", "--proc-root", "/p"]).paths();
        assert_eq!(p.host_netns, PathBuf::from("/p/1/ns/net"));
        let p = args(&["--allow-switch-to-host-ns", "true", "--host-netns", "/run/netns/n1"]).paths();
        assert_eq!(p.host_netns, PathBuf::from("/run/netns/n1"));
        let p = args(&["--profile", "istio-cni", "--run-dir", "/r", "--cni-bin-dir", "/b"]).paths();
        assert_eq!((p.run_dir, p.cni_bin_dir), (PathBuf::from("/r"), PathBuf::from("/b")));
    }

    #[test]
    fn the_backend_follows_native_nftables_unless_set() {
        assert_eq!(args(&[]).backend(), Ok(Backend::Nftables));
        assert_eq!(args(&["--native-nftables", "false"]).backend(), Ok(Backend::Iptables));
        assert_eq!(args(&["--native-nftables", "true"]).backend(), Ok(Backend::Nftables));
        let a = args(&["--native-nftables", "false", "--capture-backend", "nftables"]);
        assert_eq!(a.backend(), Ok(Backend::Nftables), "AMBIT_CAPTURE_BACKEND wins");
        assert_eq!(
            args(&["--capture-backend", "ebpf"]).backend(),
            Err("AMBIT_CAPTURE_BACKEND=\"ebpf\": use nftables or iptables".to_owned())
        );
    }

    #[test]
    fn own_daemonset_needs_a_name_and_the_namespace() {
        let own = |a: &[&str]| args(a).own_daemonset();
        let pair = |n: &str, ns: &str| Some((n.to_owned(), ns.to_owned()));
        assert_eq!(
            own(&["--pod-namespace", "mesh", "--agent-daemonset", "ambit-agent"]),
            pair("ambit-agent", "mesh")
        );
        assert_eq!(own(&["--pod-namespace", "mesh"]), None, "no default in Ambit's profile");
        assert_eq!(
            own(&["--profile", "istio-cni", "--pod-namespace", "mesh"]),
            pair("istio-cni-node", "mesh")
        );
        assert_eq!(own(&["--agent-daemonset", "ambit-agent"]), None, "no namespace");
        assert_eq!(own(&["--pod-namespace", "mesh", "--agent-daemonset", ""]), None);
    }

    #[test]
    fn ambient_disabled_is_refused() {
        assert_eq!(args(&[]).check_ambient(), Ok(()));
        assert_eq!(args(&["--ambient-enabled", "true"]).check_ambient(), Ok(()));
        let e = args(&["--ambient-enabled", "false"]).check_ambient().expect_err("refused");
        assert!(
            e.starts_with("AMBIENT_ENABLED=false: Ambit's agent only runs the ambient data plane"),
            "{e}"
        );
    }

    #[test]
    fn istio_log_levels_become_a_filter() {
        let f = |flag: &str| args(&[flag]).log_filter();
        assert_eq!(args(&[]).log_filter(), Ok("info".to_owned()), "RUST_LOG's default");
        assert_eq!(f("--log_output_level=debug"), Ok("debug".to_owned()));
        assert_eq!(f("--log_output_level=default:warn"), Ok("warn".to_owned()));
        assert_eq!(
            f("--log_output_level=default:info,cni-agent:debug,cni-plugin:error"),
            Ok("info,ambit_agent=debug".to_owned())
        );
        assert_eq!(f("--log_output_level=all:none"), Ok("off".to_owned()));
        assert_eq!(f("--log_output_level=fatal"), Ok("error".to_owned()));
        assert_eq!(
            f("--log_output_level=cni-agent:loud"),
            Err("--log_output_level=\"cni-agent:loud\": \"loud\" is no level (debug, info, warn, error, fatal, none)"
                .to_owned())
        );
        assert!(!args(&[]).log_as_json);
        assert!(args(&["--log_as_json"]).log_as_json);
        assert!(!args(&["--log_as_json=false"]).log_as_json);
    }

    #[test]
    fn istio_settings_without_effect_are_named_with_the_reason() {
        let env: std::collections::BTreeMap<String, String> =
            [("REPAIR_ENABLED", "true"), ("NODE_NAME", "n1"), ("GOMEMLIMIT", "1Gi")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into();
        assert_eq!(
            AgentArgs::without_effect(&env),
            [
                "REPAIR_ENABLED is istio-cni's and has no effect in Ambit: sidecar repair is not part of ambient",
                "GOMEMLIMIT is istio-cni's and has no effect in Ambit: a Go runtime setting",
            ]
        );
    }

    #[test]
    fn the_proxy_namespace_falls_back_to_system_namespace_then_pod_namespace() {
        assert_eq!(args(&["--pod-namespace", "a"]).proxy_namespace(), Some("a".into()));
        assert_eq!(
            args(&["--pod-namespace", "a", "--system-namespace", "istio-system"]).proxy_namespace(),
            Some("istio-system".into())
        );
        let a = args(&["--pod-namespace", "a", "--system-namespace", "b", "--proxy-namespace", "c"]);
        assert_eq!(a.proxy_namespace(), Some("c".into()));
        assert_eq!(args(&[]).proxy_namespace(), None);
    }
}
