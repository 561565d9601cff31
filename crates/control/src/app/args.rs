//! `ambit control`'s command line and environment (istiod's names where istiod has them), and
//! the typed settings derived from it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ambit_admin::parse_duration;

/// Command line and environment of `ambit control`.
#[derive(Clone, Debug, clap::Args)]
pub struct ControlArgs {
    /// Local mode: read the objects (Namespace, Node, Pod, Service, EndpointSlice, ServiceEntry,
    /// WorkloadEntry, AuthorizationPolicy, PeerAuthentication, Gateway, GatewayClass) from this
    /// folder of YAML files, watched for changes. Without it, the Kubernetes API is watched
    /// (in-cluster config or KUBECONFIG).
    #[arg(long, env = "AMBIT_CONFIG_DIR")]
    pub config: Option<PathBuf>,
    /// How often the YAML folder is checked for changes (local mode).
    #[arg(long, env = "AMBIT_CONFIG_POLL", default_value = "100ms", value_parser = parse_duration)]
    pub config_poll: Duration,
    /// Local mode: the folder where the node agents publish which pods they captured
    /// (`ambient.istio.io/redirection`, which in a cluster they patch onto the Pod). Without
    /// it, only the annotation in the Pod YAML counts.
    #[arg(long, env = "AMBIT_CAPTURE_STATE_DIR")]
    pub capture_state_dir: Option<PathBuf>,
    /// Where the control plane keeps what must survive a restart: the self-signed root CA
    /// (`ca/`, unless ROOT_CA_DIR holds a plugged-in CA), and in local mode the node tokens
    /// (`tokens/<node>.token`) and the mesh root bundle for proxies (`root-cert.pem`).
    #[arg(long, env = "AMBIT_CONTROL_STATE_DIR", default_value = "/var/lib/ambit/control")]
    pub state_dir: PathBuf,
    /// The cluster's ID (workload uids, `cluster_id`, the `clusterid` header).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// The DNS domain suffix of Services (`<name>.<ns>.svc.<domain>`).
    #[arg(long, env = "AMBIT_DOMAIN_SUFFIX", default_value = "cluster.local")]
    pub domain: String,
    /// The control plane's own namespace (its serving names `istiod.<ns>.svc`, the default
    /// trusted node account `<ns>/ztunnel`; its label `topology.istio.io/network` is the local
    /// network).
    #[arg(long, env = "POD_NAMESPACE", default_value = "istio-system")]
    pub namespace: String,
    /// The mesh root namespace (MeshConfig `rootNamespace`): policies there apply mesh-wide.
    #[arg(long, env = "AMBIT_ROOT_NAMESPACE", default_value = "istio-system")]
    pub root_namespace: String,
    /// The mesh trust domain (MeshConfig `trustDomain`).
    #[arg(long, env = "AMBIT_TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,
    /// The control plane's revision: Istio objects labelled `istio.io/rev` with another value
    /// are ignored (objects without the label always count).
    #[arg(long, env = "REVISION", default_value = "default")]
    pub revision: String,
    /// gRPC over TLS (xDS and the CA); istiod's 15012.
    #[arg(long, env = "AMBIT_SECURE_GRPC_ADDR", default_value = "[::]:15012", value_parser = parse_addr)]
    pub secure_grpc_addr: Listen,
    /// Plaintext gRPC (xDS only, unauthenticated); local mode only, empty disables it.
    #[arg(long, env = "AMBIT_GRPC_ADDR", default_value = "[::]:15010", value_parser = parse_addr)]
    pub grpc_addr: Listen,
    /// HTTP: `/metrics`, `/debug/...`, `/logging`, `/debug/pprof/profile`; istiod's 15014.
    #[arg(long, env = "AMBIT_MONITORING_ADDR", default_value = "[::]:15014", value_parser = parse_addr)]
    pub monitoring_addr: Listen,
    /// HTTP: `/ready` (200 once the sources are synced and the servers listen; 503 with the
    /// reason before); istiod's 8080.
    #[arg(long, env = "AMBIT_HTTP_ADDR", default_value = "[::]:8080", value_parser = parse_addr)]
    pub http_addr: Listen,
    /// A plugged-in CA in Istio's `cacerts` layout (ca-cert.pem, ca-key.pem, root-cert.pem,
    /// cert-chain.pem; or tls.crt, tls.key, ca.crt). Absent or empty: a self-signed root in
    /// the state dir. Some but not all files: refuse to start.
    #[arg(long, env = "ROOT_CA_DIR", default_value = "./etc/cacerts")]
    pub root_ca_dir: PathBuf,
    /// More DNS names for the serving certificate (comma separated), besides
    /// `istiod.<ns>.svc`, `istiod-remote.<ns>.svc` and `istio-pilot.<ns>.svc`.
    #[arg(long, env = "ISTIOD_CUSTOM_HOST")]
    pub custom_host: Option<String>,
    /// Lifetime of a workload certificate when the request asks for none.
    #[arg(long, env = "DEFAULT_WORKLOAD_CERT_TTL", default_value = "24h", value_parser = parse_duration)]
    pub default_cert_ttl: Duration,
    /// Longest workload certificate lifetime a request may ask for.
    #[arg(long, env = "MAX_WORKLOAD_CERT_TTL", default_value = "2160h", value_parser = parse_duration)]
    pub max_cert_ttl: Duration,
    /// Service accounts (`<ns>/<sa>`, comma separated) whose proxies may request certificates
    /// for the pods on their node (ImpersonatedIdentity). Default: `<namespace>/ztunnel`.
    #[arg(long, env = "CA_TRUSTED_NODE_ACCOUNTS")]
    pub trusted_node_accounts: Option<String>,
    /// How long an impersonation request for a pod the control plane does not know on the
    /// caller's node yet waits for the pod to arrive before it is refused (0: refuse at once).
    #[arg(long, env = "CA_POD_WAIT", default_value = "2s", value_parser = parse_duration)]
    pub ca_pod_wait: Duration,
    /// Audiences a Kubernetes token must carry (comma separated).
    #[arg(long, env = "TOKEN_AUDIENCES", default_value = "istio-ca")]
    pub token_audiences: String,
    /// Push once no change arrived for this long (`PILOT_DEBOUNCE_AFTER`).
    #[arg(long, env = "PILOT_DEBOUNCE_AFTER", default_value = "100ms", value_parser = parse_duration)]
    pub debounce_after: Duration,
    /// ... or at the latest this long after the first change of a burst.
    #[arg(long, env = "PILOT_DEBOUNCE_MAX", default_value = "10s", value_parser = parse_duration)]
    pub debounce_max: Duration,
    /// New xDS streams accepted per second (more are refused with ResourceExhausted).
    #[arg(long, env = "PILOT_MAX_REQUESTS_PER_SECOND", default_value_t = 100)]
    pub max_requests_per_second: u32,
    /// Largest gRPC message accepted (a reconnecting proxy lists every resource it holds:
    /// 100 000 workloads take about 8 MiB).
    #[arg(long, env = "ISTIO_GPRC_MAXRECVMSGSIZE", default_value_t = 32 * 1024 * 1024)]
    pub max_recv_message_size: usize,
    /// How long the Kubernetes source may take for its initial lists before the control plane
    /// gives up and exits (not ready, with the reason, meanwhile).
    #[arg(long, env = "AMBIT_KUBE_SYNC_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub kube_sync_timeout: Duration,
    /// With the Kubernetes source: write istiod's `ZtunnelAccepted` condition on every
    /// AuthorizationPolicy (whether node proxies enforce it, and what they cannot enforce).
    #[arg(long, env = "AMBIENT_ENABLE_STATUS", default_value_t = true, action = clap::ArgAction::Set)]
    pub ambient_enable_status: bool,
    /// With the Kubernetes source: the image of the waypoints deployed for `istio-waypoint`
    /// Gateways (one with `ambit` in it; the chart passes its own). Without it no waypoint is
    /// deployed, and each such Gateway says so in its `Programmed` condition.
    #[arg(long, env = "AMBIT_WAYPOINT_IMAGE")]
    pub waypoint_image: Option<String>,
    /// The xDS and CA address the deployed waypoints dial. Default:
    /// `ambit-control.<POD_NAMESPACE>.svc:15012` (the chart's Service).
    #[arg(long, env = "AMBIT_WAYPOINT_CONTROL_ADDRESS")]
    pub waypoint_control_address: Option<String>,
    /// Log filter (`RUST_LOG` syntax; changeable at run time through `/logging`).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub rust_log: String,
    /// Log format: `plain` or `json`.
    #[arg(long, env = "AMBIT_LOG_FORMAT", default_value = "plain")]
    pub log_format: String,
}

/// A listen address, or none (an empty value disables the listener).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listen(pub Option<SocketAddr>);

/// Parses a [`Listen`].
pub fn parse_addr(s: &str) -> Result<Listen, String> {
    if s.trim().is_empty() {
        return Ok(Listen(None));
    }
    s.trim()
        .parse()
        .map(|a| Listen(Some(a)))
        .map_err(|e| format!("`{s}` is not an address like [::]:15012: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        control: ControlArgs,
    }

    /// `ambit control --help` names, for every setting, its environment variable and default.
    #[test]
    fn help_lists_every_setting_with_its_variable_and_default() {
        let mut cmd = Cli::command();
        let help = cmd.render_long_help().to_string();
        let mut settings = 0;
        for arg in cmd.get_arguments().filter(|a| a.get_id() != "help") {
            settings += 1;
            let env =
                arg.get_env().unwrap_or_else(|| panic!("--{} has no environment variable", arg.get_id()));
            let env = env.to_string_lossy();
            assert!(help.contains(&format!("[env: {env}")), "help does not name {env}:\n{help}");
            for d in arg.get_default_values() {
                let d = d.to_string_lossy();
                assert!(
                    help.contains(&format!("[default: {d}]")),
                    "help does not show the default {d:?} of {env}"
                );
            }
        }
        assert!(settings >= 25, "{settings} settings");
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_addr(""), Ok(Listen(None)));
        assert_eq!(parse_addr("[::]:15012").map(|l| l.0.map(|a| a.port())), Ok(Some(15012)));
        assert!(parse_addr("nowhere").is_err());
    }
}
