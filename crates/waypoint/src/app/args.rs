//! The waypoint's settings: Istio's environment names where one exists (`CA_ADDRESS`,
//! `XDS_ADDRESS`, `POD_NAMESPACE`, `SERVICE_ACCOUNT`, `INSTANCE_IP`, `ISTIO_META_*`, …), Ambit's
//! `AMBIT_*` for the rest, parsed once at start into one typed [`Config`].

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ambit_identity::Identity;
use ambit_identity::control::{ControlError, ControlSetting, ControlSettings, Service, TokenSource};
use ambit_xds::node::NodeInfo;
use serde::Serialize;
use serde_json::Value;

/// Command line and environment of `ambit waypoint`. Every setting is an environment variable;
/// flags override the environment.
#[derive(Clone, Debug, clap::Args)]
pub struct WaypointArgs {
    /// Where xDS and certificates come from (XDS_*, CA_*, AUTH_TOKEN, FAKE_CA*, SECRET_TTL).
    #[command(flatten)]
    pub control: ambit_admin::ControlArgs,
    /// Local clusters (`ambit up`): AUTH_TOKEN is the node's token, so the certificate is asked
    /// for on the node's behalf (as a node proxy asks for its pods', through the CA's node
    /// authorization), and the xDS stream presents that certificate, so that the control plane
    /// knows the waypoint by its own identity and sends it only its own configuration.
    #[arg(long, env = "AMBIT_NODE_TOKEN", default_value_t = false, action = clap::ArgAction::Set)]
    pub node_token: bool,
    /// This pod's name (xDS node id and metadata).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// This pod's namespace: the Gateway's namespace and the identity's.
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// This pod's service account: named after the Gateway it serves (istiod's gateway
    /// controller runs a waypoint so), and the identity's.
    #[arg(long, env = "SERVICE_ACCOUNT")]
    pub service_account: Option<String>,
    /// This pod's IP: the xDS node id, `INSTANCE_IPS` metadata and the source of its HBONE
    /// connections.
    #[arg(long, env = "INSTANCE_IP")]
    pub instance_ip: Option<String>,
    /// The node the pod runs on (xDS metadata).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Cluster id (`ISTIO_META_CLUSTER_ID` wins when set).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// Trust domain of the waypoint's identity.
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,
    /// How long open requests may finish after SIGTERM (istio-agent's name and default).
    #[arg(long, env = "TERMINATION_DRAIN_DURATION", default_value = "5s", value_parser = ambit_admin::parse_duration)]
    pub termination_drain_duration: Duration,
    /// Data-plane worker threads (0: one per core).
    #[arg(long, env = "AMBIT_WAYPOINT_WORKER_THREADS", default_value_t = 2)]
    pub worker_threads: usize,
    /// Log format: `plain` or `json`.
    #[arg(long, env = "LOG_FORMAT", default_value = "plain")]
    pub log_format: String,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub rust_log: String,
    /// Ambit extension: the HBONE listener. A waypoint pod has its own network namespace, so
    /// the default takes every address of it; tests on a shared host set an address of their own.
    #[arg(long, env = "AMBIT_HBONE_ADDR", default_value = "[::]:15008")]
    pub hbone_addr: SocketAddr,
    /// Ambit extension: admin server address (config dump, logging; keep it on localhost).
    #[arg(long, env = "AMBIT_ADMIN_ADDR", default_value = "127.0.0.1:15000")]
    pub admin_addr: SocketAddr,
    /// Ambit extension: metrics server address (Istio's waypoints serve `/stats/prometheus` here).
    #[arg(long, env = "AMBIT_STATS_ADDR", default_value = "[::]:15020")]
    pub stats_addr: SocketAddr,
    /// Ambit extension: readiness server address (`/healthz/ready`, as Istio's waypoints).
    #[arg(long, env = "AMBIT_READINESS_ADDR", default_value = "[::]:15021")]
    pub readiness_addr: SocketAddr,
}

/// Environment the waypoint reads outside its flags: `ISTIO_META_CLUSTER_ID` (wins over
/// CLUSTER_ID), `ISTIO_META_WORKLOAD_NAME` (its baggage's workload), `KUBERNETES_SERVICE_HOST`
/// (inside Kubernetes, the default control plane is istiod's service).
pub const ENV_OUTSIDE_FLAGS: &[&str] =
    &["ISTIO_META_CLUSTER_ID", "ISTIO_META_WORKLOAD_NAME", "KUBERNETES_SERVICE_HOST"];

/// Prefixes of environment variables the waypoint reads: `ISTIO_META_*` and
/// `ISTIO_METAJSON_*` (xDS node metadata), `XDS_HEADER_*` and `CA_HEADER_*` (gRPC metadata).
pub const ENV_PREFIXES: &[&str] = &["ISTIO_META_", "ISTIO_METAJSON_", "XDS_HEADER_", "CA_HEADER_"];

/// The process environment, as one snapshot (tests pass their own).
pub type Env = BTreeMap<String, String>;

/// Where the waypoint's certificate comes from.
#[derive(Clone, Debug, Serialize)]
pub enum CaSource {
    /// In-process signer (development).
    Fake {
        /// Root directory, or a fresh in-memory root.
        root: Option<PathBuf>,
    },
    /// Istio CA API over gRPC.
    Remote {
        /// Where and how.
        control: ControlSettings,
        /// The token is the node's: ask on its behalf (AMBIT_NODE_TOKEN).
        impersonate: bool,
    },
}

/// The resolved configuration, shown by `/config_dump`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// The waypoint's identity: `spiffe://<TRUST_DOMAIN>/ns/<POD_NAMESPACE>/sa/<SERVICE_ACCOUNT>`.
    #[serde(serialize_with = "display")]
    pub(crate) identity: Identity,
    /// The Gateway it serves: `<POD_NAMESPACE>/<SERVICE_ACCOUNT>`.
    pub(crate) gateway: String,
    /// Its IP.
    pub(crate) instance_ip: IpAddr,
    /// Cluster id.
    pub(crate) cluster_id: String,
    /// `baggage` on its upstream CONNECTs.
    pub(crate) baggage: String,
    /// xDS server.
    pub(crate) xds: ControlSettings,
    /// Whether the xDS stream presents the waypoint's certificate (AMBIT_NODE_TOKEN).
    pub(crate) xds_presents_cert: bool,
    /// The xDS node.
    pub(crate) node: NodeInfo,
    /// Certificate source.
    pub(crate) ca: CaSource,
    /// Requested certificate lifetime.
    pub(crate) secret_ttl: Duration,
    /// Drain deadline.
    pub(crate) drain_deadline: Duration,
    /// Data-plane threads.
    pub(crate) worker_threads: usize,
    /// HBONE listener.
    pub(crate) hbone_addr: SocketAddr,
    /// Admin.
    pub(crate) admin_addr: SocketAddr,
    /// Metrics.
    pub(crate) stats_addr: SocketAddr,
    /// Readiness.
    pub(crate) readiness_addr: SocketAddr,
}

/// A setting that cannot be used, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is unset or empty.
    #[error("{0} is not set: {1}")]
    Missing(&'static str, &'static str),
    /// INSTANCE_IP is not an IP address.
    #[error("INSTANCE_IP={0:?} is not an IP address")]
    InstanceIp(String),
    /// The identity parts do not make a SPIFFE id.
    #[error(
        "TRUST_DOMAIN={td:?}, POD_NAMESPACE={ns:?}, SERVICE_ACCOUNT={sa:?} do not make a SPIFFE identity: {reason}"
    )]
    Identity {
        /// Trust domain.
        td: String,
        /// Namespace.
        ns: String,
        /// Service account.
        sa: String,
        /// Why.
        reason: String,
    },
    /// An empty XDS_ADDRESS: a waypoint has no configuration without xDS.
    #[error(
        "XDS_ADDRESS is empty: the waypoint's configuration comes only from xDS; set it to istiod (or `ambit control`)"
    )]
    NoXds,
    /// No CA address and no in-process CA.
    #[error("CA_ADDRESS is empty: set it to the Istio CA (istiod), or FAKE_CA=true for development")]
    NoCa,
    /// A node's token only works with the CA's node authorization.
    #[error(
        "AMBIT_NODE_TOKEN=true asks the CA for the certificate on the node's behalf, but FAKE_CA=true signs it in-process; set one of them"
    )]
    NodeTokenWithFakeCa,
    /// A control-plane setting cannot be used.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// Bad log format.
    #[error("LOG_FORMAT={0:?} is not `plain` or `json`")]
    LogFormat(String),
}

const DEFAULT_ISTIOD_IN_CLUSTER: &str = "https://istiod.istio-system.svc:15012";
const DEFAULT_ISTIOD_LOCAL: &str = "https://localhost:15012";

impl Config {
    /// Resolves the arguments (and the process environment's prefixed variables).
    pub fn from_args(a: &WaypointArgs) -> Result<Config, ConfigError> {
        Config::from_args_env(a, &ambit_admin::environment())
    }

    /// As [`Config::from_args`], with the environment given.
    pub fn from_args_env(a: &WaypointArgs, env: &Env) -> Result<Config, ConfigError> {
        let required = |v: &Option<String>, name: &'static str, why: &'static str| {
            v.clone().filter(|s| !s.is_empty()).ok_or(ConfigError::Missing(name, why))
        };
        let ns =
            required(&a.pod_namespace, "POD_NAMESPACE", "the waypoint serves the Gateway of its namespace")?;
        let sa = required(
            &a.service_account,
            "SERVICE_ACCOUNT",
            "the waypoint serves the Gateway its service account is named after",
        )?;
        let ip_text =
            required(&a.instance_ip, "INSTANCE_IP", "the waypoint's own pod IP is its xDS node id")?;
        let instance_ip: IpAddr = ip_text.parse().map_err(|_| ConfigError::InstanceIp(ip_text.clone()))?;
        let identity =
            format!("spiffe://{}/ns/{ns}/sa/{sa}", a.trust_domain).parse::<Identity>().map_err(|e| {
                ConfigError::Identity {
                    td: a.trust_domain.clone(),
                    ns: ns.clone(),
                    sa: sa.clone(),
                    reason: e.to_string(),
                }
            })?;
        if !matches!(a.log_format.as_str(), "plain" | "json" | "") {
            return Err(ConfigError::LogFormat(a.log_format.clone()));
        }
        let cluster_id = env.get("ISTIO_META_CLUSTER_ID").cloned().unwrap_or_else(|| a.cluster_id.clone());
        let default_address = if env.contains_key("KUBERNETES_SERVICE_HOST") {
            DEFAULT_ISTIOD_IN_CLUSTER
        } else {
            DEFAULT_ISTIOD_LOCAL
        };
        let token = TokenSource::from_setting(a.control.auth_token.as_deref());
        let control = |service, address, roots, alt: &Option<String>| {
            let setting = ControlSetting {
                service,
                address,
                roots,
                alt_hostname: alt.as_deref(),
                token: token.as_ref(),
                cluster_id: &cluster_id,
            };
            ControlSettings::resolve(setting, env)
        };
        let xds = match a.control.xds_address.as_deref().unwrap_or(default_address) {
            "" => return Err(ConfigError::NoXds),
            address => control(Service::Xds, address, &a.control.xds_root_ca, &a.control.alt_xds_hostname)?,
        };
        let ca = if a.control.fake_ca {
            CaSource::Fake { root: a.control.fake_ca_root.clone() }
        } else {
            match a.control.ca_address.as_deref().unwrap_or(default_address) {
                "" => return Err(ConfigError::NoCa),
                address => CaSource::Remote {
                    control: control(
                        Service::Ca,
                        address,
                        &a.control.ca_root_ca,
                        &a.control.alt_ca_hostname,
                    )?,
                    impersonate: a.node_token,
                },
            }
        };
        if a.node_token && a.control.fake_ca {
            return Err(ConfigError::NodeTokenWithFakeCa);
        }
        let pod = a.pod_name.clone().unwrap_or_default();
        let workload = env
            .get("ISTIO_META_WORKLOAD_NAME")
            .filter(|w| !w.is_empty())
            .cloned()
            .unwrap_or_else(|| sa.clone());
        Ok(Config {
            gateway: format!("{ns}/{sa}"),
            baggage: baggage(&cluster_id, &ns, &workload, &sa),
            node: node(&pod, &ns, &sa, instance_ip, &cluster_id, a.node_name.as_deref(), env),
            identity,
            instance_ip,
            cluster_id,
            xds,
            xds_presents_cert: a.node_token,
            ca,
            secret_ttl: a.control.secret_ttl,
            drain_deadline: a.termination_drain_duration,
            worker_threads: if a.worker_threads == 0 {
                std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
            } else {
                a.worker_threads
            },
            hbone_addr: a.hbone_addr,
            admin_addr: a.admin_addr,
            stats_addr: a.stats_addr,
            readiness_addr: a.readiness_addr,
        })
    }
}

/// The waypoint's own baggage (node-proxy.md §3): a waypoint is a Deployment named after its
/// Gateway, whose canonical service is the Gateway and revision `latest`.
fn baggage(cluster_id: &str, ns: &str, workload: &str, gateway: &str) -> String {
    format!(
        "k8s.cluster.name={cluster_id},k8s.namespace.name={ns},k8s.deployment.name={workload},service.name={gateway},service.version=latest"
    )
}

/// The xDS node as Istio's agent builds it for a router (a gateway or waypoint Envoy):
/// `router~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`; istiod reads `NAMESPACE`, `CLUSTER_ID`,
/// `INSTANCE_IPS`, `SERVICE_ACCOUNT`, `NODE_NAME` (control-plane.md §5.1).
fn node(
    pod: &str,
    ns: &str,
    sa: &str,
    ip: IpAddr,
    cluster_id: &str,
    node_name: Option<&str>,
    env: &Env,
) -> NodeInfo {
    let mut metadata = ambit_xds::node::istio_metadata(env);
    let mut set = |k: &str, v: &str| {
        metadata.insert(k.to_owned(), Value::String(v.to_owned()));
    };
    set("NAME", pod);
    set("NAMESPACE", ns);
    set("SERVICE_ACCOUNT", sa);
    set("INSTANCE_IPS", &ip.to_string());
    set("CLUSTER_ID", cluster_id);
    if let Some(n) = node_name.filter(|n| !n.is_empty()) {
        set("NODE_NAME", n);
    }
    NodeInfo { id: format!("router~{ip}~{pod}.{ns}~{ns}.svc.cluster.local"), metadata }
}

fn display<S: serde::Serializer>(v: &impl std::fmt::Display, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

#[cfg(test)]
mod tests;
