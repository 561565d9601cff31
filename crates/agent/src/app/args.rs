//! `ambit agent`'s command line and environment (istio-cni's names where they exist), and the
//! typed settings derived from it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::enroll::{EnablementSelector, Enrollment, LabelSelector, SystemSelector, parse_selectors};

/// Command line and environment of `ambit agent` (istio-cni's names where they exist).
#[derive(Clone, Debug, clap::Args)]
pub struct AgentArgs {
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
    /// Directory of the plugin event socket (`pluginevent.sock`) and the enrollment cache.
    #[arg(long, env = "CNI_AGENT_RUN_DIR", default_value = "/var/run/ambit")]
    pub run_dir: PathBuf,
    /// ZDS socket the node proxy connects to.
    #[arg(long, env = "ZTUNNEL_UDS_ADDRESS", default_value = "/var/run/ztunnel/ztunnel.sock")]
    pub zds_socket: PathBuf,
    /// Namespaces never enrolled (comma separated).
    #[arg(long, env = "EXCLUDE_NAMESPACES", default_value = "kube-system")]
    pub exclude_namespaces: String,
    /// Enablement selectors (JSON list of {podSelector, namespaceSelector}); default: Istio's
    /// (pod or namespace label istio.io/dataplane-mode=ambient, pod opt-out =none).
    #[arg(long, env = "AMBIENT_ENABLEMENT_SELECTOR")]
    pub enablement_selectors: Option<String>,
    /// Redirect pods' DNS (port 53) to the proxy's DNS proxy (per-pod annotation
    /// ambient.istio.io/dns-capture overrides).
    #[arg(long, env = "AMBIENT_DNS_CAPTURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub dns_capture: bool,
    /// Capture IPv6 too.
    #[arg(long, env = "AMBIENT_IPV6", default_value_t = true, action = clap::ArgAction::Set)]
    pub ipv6: bool,
    /// Capture backend: `nftables` (programmed over netlink, no `nft` binary needed) or `iptables` (runs `iptables-restore`).
    #[arg(long, env = "AMBIT_CAPTURE_BACKEND", default_value = "nftables")]
    pub capture_backend: String,
    /// Prefix for netns paths given by the CNI runtime (`/host` when the agent runs in a container).
    #[arg(long, env = "AMBIT_HOST_PREFIX", default_value = "/")]
    pub host_prefix: PathBuf,
    /// The host's /proc (to find running pods' network namespaces).
    #[arg(long, env = "AMBIT_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// The host network namespace: kubelet probe SNAT rules go there, and no CNI ADD may name it
    /// (nor the agent's own namespace, nor pid 1's under --proc-root).
    #[arg(long, env = "AMBIT_HOST_NETNS", default_value = "/proc/self/ns/net")]
    pub host_netns: PathBuf,
    /// Prometheus metrics address.
    #[arg(long, env = "AMBIT_AGENT_METRICS_ADDR", default_value = "[::]:15014")]
    pub metrics_addr: SocketAddr,
    /// Health address (`/healthz`, `/readyz`; not ready answers 503 with the reason). Bound
    /// first, before the pod source is read.
    #[arg(long, env = "AMBIT_AGENT_HEALTH_ADDR", default_value = "[::]:8000")]
    pub health_addr: SocketAddr,
    /// CNI conf dir to install the plugin into (kubelet's `/etc/cni/net.d`). Default: that path
    /// with the Kubernetes source, no installation in local mode.
    #[arg(long, env = "MOUNTED_CNI_NET_DIR")]
    pub cni_conf_dir: Option<PathBuf>,
    /// CNI bin dir the plugin binary is copied into.
    #[arg(long, env = "AMBIT_CNI_BIN_DIR", default_value = "/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,
    /// Primary CNI config file to chain into (default: the first one, kubelet's order).
    #[arg(long, env = "CNI_CONF_NAME")]
    pub cni_conf_name: Option<String>,
    /// Chain after the primary plugin (`false`: write a standalone config).
    #[arg(long, env = "CHAINED_CNI_PLUGIN", default_value_t = true, action = clap::ArgAction::Set)]
    pub chained: bool,
    /// The `ambit-cni` binary to install (default: next to this executable).
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
    /// Namespace of the node proxy's pods (default: POD_NAMESPACE).
    #[arg(long, env = "AMBIT_PROXY_NAMESPACE")]
    pub proxy_namespace: Option<String>,
    /// Labels of the node proxy's pods (`key=value,…`). They are never enrolled, and their
    /// generateName goes into the plugin config so that they always start, even with no agent.
    #[arg(long, env = "AMBIT_PROXY_POD_LABELS", default_value = "app=ztunnel")]
    pub proxy_pod_labels: String,
    /// Remove the plugin from the CNI config on exit. Only for a real uninstall: on a restart
    /// or upgrade the plugin must stay, so new pods wait for the agent instead of starting
    /// unmeshed.
    #[arg(long, env = "AMBIT_UNINSTALL_ON_EXIT", default_value_t = false, action = clap::ArgAction::Set)]
    pub uninstall_on_exit: bool,
    /// Log filter.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub rust_log: String,
}

impl AgentArgs {
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
        let proxy = nonempty(&self.proxy_namespace)
            .or_else(|| nonempty(&self.pod_namespace))
            .filter(|_| !labels.is_empty())
            .map(|ns| (ns, labels));
        Ok(Enrollment {
            selectors,
            excluded_namespaces: self.excluded_namespaces(),
            system: SystemSelector { agent, proxy },
        })
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

/// `250ms`, `2s` or `1m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let ms = s
        .strip_suffix("ms")
        .map(|v| v.parse::<u64>())
        .or_else(|| s.strip_suffix('s').map(|v| v.parse::<u64>().map(|v| v.saturating_mul(1000))))
        .or_else(|| s.strip_suffix('m').map(|v| v.parse::<u64>().map(|v| v.saturating_mul(60_000))));
    match ms {
        Some(Ok(ms)) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(format!("{s:?} is not a duration like 250ms, 2s or 1m")),
    }
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
        for bad in ["", "0s", "5", "1h", "-1s"] {
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
}
