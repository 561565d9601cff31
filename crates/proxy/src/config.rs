//! The proxy's configuration: ztunnel's environment variables (and flags), parsed once at start
//! into one typed [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

pub use ambit_identity::control::ControlSettings;
use ambit_identity::control::{ControlError, ControlSetting, Service, TokenSource};
use ambit_zds::WorkloadInfo;

use crate::socket::{Keepalive, SocketOptions};

/// Command line and environment of `ambit proxy`. Every setting is an environment variable with
/// ztunnel's name and default; flags override the environment.
#[derive(Clone, Debug, clap::Args)]
pub struct ProxyArgs {
    /// `shared` (one proxy for every pod of the node, pods handed over ZDS) or `dedicated` (one proxy
    /// for the workload of the network namespace it runs in).
    #[arg(long, env = "PROXY_MODE", default_value = "shared")]
    pub proxy_mode: String,
    /// Dedicated mode: the served workload as `namespace/name/service-account`.
    #[arg(long, env = "PROXY_WORKLOAD_INFO")]
    pub proxy_workload_info: Option<String>,
    /// Shared mode: the node agent's ZDS socket (SOCK_SEQPACKET).
    #[arg(long, env = "INPOD_UDS", default_value = "/var/run/ztunnel/ztunnel.sock")]
    pub inpod_uds: PathBuf,
    /// DNS proxy on 15053 in every pod (`ISTIO_META_DNS_CAPTURE`; anything but `true` disables it).
    #[arg(long, env = "ISTIO_META_DNS_CAPTURE", default_value = "true")]
    pub dns_capture: String,
    /// DNS proxy: namespace preferred when several services share a hostname.
    #[arg(long, env = "PREFERED_SERVICE_NAMESPACE")]
    pub prefered_service_namespace: Option<String>,
    /// Local config file (ztunnel's local-config YAML), reloaded when it changes; may be combined
    /// with xDS.
    #[arg(long, env = "LOCAL_XDS_PATH")]
    pub local_xds_path: Option<PathBuf>,
    /// Where xDS and certificates come from (XDS_*, CA_*, AUTH_TOKEN, FAKE_CA*, SECRET_TTL).
    #[command(flatten)]
    pub control: ambit_admin::ControlArgs,
    /// Fetch addresses on demand (by IP, when a destination is unknown) instead of all of them;
    /// not with the DNS proxy.
    #[arg(long, env = "XDS_ON_DEMAND", default_value_t = false, action = clap::ArgAction::Set)]
    pub xds_on_demand: bool,
    /// This pod's name (xDS node id and metadata).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// This pod's namespace (xDS node id and metadata).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// This pod's IP (xDS node id and metadata; default 1.1.1.1).
    #[arg(long, env = "INSTANCE_IP")]
    pub instance_ip: Option<String>,
    /// This pod's service account (accepted for the chart; the proxy has no identity of its own).
    #[arg(long, env = "SERVICE_ACCOUNT")]
    pub service_account: Option<String>,
    /// SO_MARK on proxy sockets (decimal or 0x hex). Default: 1337 in shared mode, none in dedicated.
    #[arg(long, env = "PACKET_MARK", value_parser = parse_u32)]
    pub packet_mark: Option<u32>,
    /// Node name: workloads on other nodes are not candidates for the local workload.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Cluster id (`ISTIO_META_CLUSTER_ID` wins when set).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// Cluster DNS domain.
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Trust domain used when a workload does not name one.
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,
    /// This node's network.
    #[arg(long, env = "NETWORK", default_value = "")]
    pub network: String,
    /// Bind listeners dual-stack (`[::]`) and answer IPv6.
    #[arg(long, env = "IPV6_ENABLED", default_value_t = true, action = clap::ArgAction::Set)]
    pub ipv6_enabled: bool,
    /// Data-plane worker threads: `N`, `N%` of the cores, or `0` for all cores.
    /// Default: max(ceil(25% of cores), 2).
    #[arg(long, env = "ZTUNNEL_WORKER_THREADS")]
    pub worker_threads: Option<String>,
    /// Core count override for the worker-thread computation.
    #[arg(long, env = "ZTUNNEL_CPU_LIMIT")]
    pub cpu_limit: Option<usize>,
    /// Most streams per pooled HBONE connection.
    #[arg(long, env = "POOL_MAX_STREAMS_PER_CONNECTION", default_value_t = 100)]
    pub pool_max_streams: u32,
    /// Pooled HBONE connections unused this long are released.
    #[arg(long, env = "POOL_UNUSED_RELEASE_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub pool_unused_release_timeout: Duration,
    /// HTTP/2 initial stream window.
    #[arg(long, env = "HTTP2_STREAM_WINDOW_SIZE", default_value_t = 4_194_304)]
    pub window_size: u32,
    /// HTTP/2 initial connection window.
    #[arg(long, env = "HTTP2_CONNECTION_WINDOW_SIZE", default_value_t = 16_777_216)]
    pub connection_window_size: u32,
    /// HTTP/2 max frame size.
    #[arg(long, env = "HTTP2_FRAME_SIZE", default_value_t = 1_048_576)]
    pub frame_size: u32,
    /// TCP keepalive idle time.
    #[arg(long, env = "KEEPALIVE_TIME", default_value = "180s", value_parser = parse_duration)]
    pub keepalive_time: Duration,
    /// TCP keepalive probe interval.
    #[arg(long, env = "KEEPALIVE_INTERVAL", default_value = "180s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,
    /// TCP keepalive probes before dropping.
    #[arg(long, env = "KEEPALIVE_RETRIES", default_value_t = 9)]
    pub keepalive_retries: u32,
    /// Enable TCP keepalive.
    #[arg(long, env = "KEEPALIVE_ENABLED", default_value_t = true, action = clap::ArgAction::Set)]
    pub keepalive_enabled: bool,
    /// Set TCP_USER_TIMEOUT from the keepalive settings.
    #[arg(long, env = "USER_TIMEOUT_ENABLED", default_value_t = false, action = clap::ArgAction::Set)]
    pub user_timeout_enabled: bool,
    /// How long open connections may finish after a drain starts (SIGTERM, /quitquitquit).
    #[arg(long, env = "CONNECTION_TERMINATION_DEADLINE", value_parser = parse_duration)]
    pub connection_termination_deadline: Option<Duration>,
    /// Derives the drain deadline when CONNECTION_TERMINATION_DEADLINE is unset: T-5s if T>10, else T-1s (min 1s).
    #[arg(long, env = "TERMINATION_GRACE_PERIOD_SECONDS")]
    pub termination_grace_period_seconds: Option<u64>,
    /// Force (`true`) or disable (`false`) spoofing the client's source IP towards the app;
    /// default: on when the process may (CAP_NET_ADMIN).
    #[arg(long, env = "ENABLE_ORIG_SRC", action = clap::ArgAction::Set)]
    pub enable_orig_src: Option<bool>,
    /// Log format: `plain` or `json`.
    #[arg(long, env = "LOG_FORMAT", default_value = "plain")]
    pub log_format: String,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub rust_log: String,
    /// Ambit extension: inbound HBONE, how long a new connection may take to finish its TLS
    /// handshake (from the TCP accept, including fetching the workload's certificate).
    #[arg(long, env = "AMBIT_HBONE_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub hbone_handshake_timeout: Duration,
    /// Ambit extension: inbound HBONE, how long a client may take to send the HTTP/2 preface
    /// after the TLS handshake.
    #[arg(long, env = "AMBIT_HBONE_PREFACE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub hbone_preface_timeout: Duration,
    /// Ambit extension: inbound HBONE, how long a client may take to send its first CONNECT after
    /// the HTTP/2 preface (a client pool dials because it has a stream to open).
    #[arg(long, env = "AMBIT_HBONE_FIRST_STREAM_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub hbone_first_stream_timeout: Duration,
    /// Ambit extension: inbound HBONE, a connection with no open stream for this long is closed
    /// (GOAWAY); longer than the clients' pool release (POOL_UNUSED_RELEASE_TIMEOUT, 5m), so a
    /// client normally closes first.
    #[arg(long, env = "AMBIT_HBONE_IDLE_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub hbone_idle_timeout: Duration,
    /// Ambit extension: inbound HBONE connections one source address may hold, over every pod of
    /// the process (TLS handshakes in progress count); more are closed at accept.
    #[arg(long, env = "AMBIT_HBONE_MAX_CONNECTIONS_PER_PEER", default_value_t = 256)]
    pub hbone_max_connections_per_peer: u32,
    /// Ambit extension: CONNECT streams one source address may hold open, over all its
    /// connections; more are refused with REFUSED_STREAM.
    #[arg(long, env = "AMBIT_HBONE_MAX_STREAMS_PER_PEER", default_value_t = 1024)]
    pub hbone_max_streams_per_peer: u32,
    /// Ambit extension: bytes one source address can make the proxy buffer (received over HBONE,
    /// not yet written to the app), over all its connections and streams: the sum of the HTTP/2
    /// windows it is offered, which shrink as it nears this budget.
    #[arg(long, env = "AMBIT_HBONE_PEER_BUFFER_BYTES", default_value_t = DEFAULT_PEER_BUFFER_BYTES)]
    pub hbone_peer_buffer_bytes: u64,
    /// Ambit extension: descriptors kept for the control path (admin, metrics, readiness, ZDS,
    /// CA); the data plane may hold RLIMIT_NOFILE minus this. Default: an eighth of the limit,
    /// at most 1024.
    #[arg(long, env = "AMBIT_FD_RESERVE")]
    pub fd_reserve: Option<u64>,
    /// Ambit extension: descriptors each admitted pod is counted for its connections, on top of
    /// its listeners; pods are admitted while they fit the descriptor budget.
    #[arg(long, env = "AMBIT_POD_FD_HEADROOM", default_value_t = 64)]
    pub pod_fd_headroom: u32,
    /// Ambit extension: admin server address (config dump, quitquitquit; keep it on localhost).
    #[arg(long, env = "AMBIT_ADMIN_ADDR", default_value = "127.0.0.1:15000")]
    pub admin_addr: SocketAddr,
    /// Ambit extension: metrics server address.
    #[arg(long, env = "AMBIT_STATS_ADDR", default_value = "[::]:15020")]
    pub stats_addr: SocketAddr,
    /// Ambit extension: readiness server address.
    #[arg(long, env = "AMBIT_READINESS_ADDR", default_value = "[::]:15021")]
    pub readiness_addr: SocketAddr,
    /// Arguments after `proxy` are ignored, as ztunnel ignores them (its chart passes `ztunnel`;
    /// anything else is logged as ignored).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub extra_args: Vec<String>,
}

/// Default control-plane address inside Kubernetes (KUBERNETES_SERVICE_HOST set).
pub const DEFAULT_ISTIOD_IN_CLUSTER: &str = "https://istiod.istio-system.svc:15012";
/// Default control-plane address outside Kubernetes.
pub const DEFAULT_ISTIOD_LOCAL: &str = "https://localhost:15012";

/// Settings ztunnel (or its chart) reads that Ambit does not implement yet: each one set is logged
/// once at start as unsupported (and listed in ARCHITECTURE.md). `INPOD_ENABLED` is not here:
/// the chart sets it but ztunnel itself does not read it either.
pub const UNSUPPORTED_SETTINGS: &[&str] = &[
    "LOCAL_XDS",
    "ENABLE_PROXY",
    "INPOD_PORT_REUSE",
    "ISTIO_META_DNS_PROXY_ADDR",
    "ZTUNNEL_RESOURCE_CPU_LIMIT",
    "ZTUNNEL_RESOURCE_CPU_REQUEST",
    "UNSTABLE_ENABLE_SOCKS5",
    "LOCALHOST_APP_TUNNEL",
    "ENABLE_RESPONSE_BAGGAGE",
    "CRL_PATH",
    "TLS12_ENABLED",
    "COMPLIANCE_POLICY",
    "AUTHZ_POLICY_INFO_LOGGING",
];

/// Set by ztunnel's chart and read by neither ztunnel nor Ambit: accepted silently.
pub const ACCEPTED_WITHOUT_EFFECT: &[&str] = &["INPOD_ENABLED"];

/// Environment the proxy reads outside its flags: `ISTIO_META_CLUSTER_ID` (wins over
/// CLUSTER_ID), `KUBERNETES_SERVICE_HOST` (inside Kubernetes, the default control plane is
/// istiod's service), `PROXY_CONFIG` (reported as not read yet).
pub const ENV_OUTSIDE_FLAGS: &[&str] = &["ISTIO_META_CLUSTER_ID", "KUBERNETES_SERVICE_HOST", "PROXY_CONFIG"];

/// Prefixes of environment variables the proxy reads: `ISTIO_META_*` and `ISTIO_METAJSON_*`
/// (xDS node metadata; `ISTIO_META_ISTIO_VERSION` also tags metrics), `XDS_HEADER_*` and
/// `CA_HEADER_*` (gRPC metadata for the control plane).
pub const ENV_PREFIXES: &[&str] = &["ISTIO_META_", "ISTIO_METAJSON_", "XDS_HEADER_", "CA_HEADER_"];

/// The mesh config file ztunnel reads (`defaultConfig`); not read by Ambit yet.
pub const MESH_CONFIG_FILE: &str = "./etc/istio/config/mesh";

/// The process environment, as one snapshot (tests pass their own).
pub type Env = std::collections::BTreeMap<String, String>;

/// Default of `AMBIT_HBONE_PEER_BUFFER_BYTES`: 32 MiB.
pub const DEFAULT_PEER_BUFFER_BYTES: u64 = 32 << 20;

/// Proxy mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ProxyMode {
    /// One proxy for every pod of the node.
    Shared,
    /// One proxy for one workload.
    Dedicated,
}

/// Where workload certificates come from.
#[derive(Clone, Debug, Serialize)]
pub enum CaSource {
    /// In-process signer (development).
    Fake {
        /// Root directory, or a fresh in-memory root.
        root: Option<PathBuf>,
    },
    /// Istio CA API over gRPC.
    Remote(ControlSettings),
}

/// The proxy's xDS client settings (`XDS_*`, node id and metadata).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct XdsSettings {
    /// Address, roots, token and headers.
    pub control: ControlSettings,
    /// `XDS_ON_DEMAND`: addresses are fetched on demand.
    pub on_demand: bool,
    /// The `Node` sent in the initial requests.
    pub node: NodeInfo,
}

pub use ambit_xds::node::NodeInfo;

/// The resolved configuration: built once from [`ProxyArgs`] by [`Config::from_args`], handed to
/// [`crate::run`], shown by `/config_dump`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// Proxy mode.
    pub(crate) proxy_mode: ProxyMode,
    /// Dedicated mode: the served workload.
    pub(crate) proxy_workload_information: Option<WorkloadInfo>,
    /// Local config file.
    pub(crate) local_xds_path: Option<PathBuf>,
    /// xDS client settings; `None` when `XDS_ADDRESS` is empty.
    pub(crate) xds: Option<XdsSettings>,
    /// Shared mode: ZDS socket.
    pub(crate) inpod_uds: PathBuf,
    /// DNS proxy on 15053 per pod (shared mode).
    pub(crate) dns_proxy: bool,
    /// DNS proxy: preferred namespace.
    pub(crate) prefered_service_namespace: Option<String>,
    /// CA source.
    pub(crate) ca: CaSource,
    /// Requested certificate lifetime.
    pub(crate) secret_ttl: Duration,
    /// SO_MARK for proxy sockets.
    pub(crate) packet_mark: Option<u32>,
    /// Node name.
    pub(crate) local_node: Option<String>,
    /// Cluster id.
    pub(crate) cluster_id: String,
    /// Cluster domain.
    pub(crate) cluster_domain: String,
    /// Default trust domain.
    pub(crate) trust_domain: String,
    /// Network.
    pub(crate) network: String,
    /// Dual-stack.
    pub(crate) ipv6_enabled: bool,
    /// Worker threads.
    pub(crate) num_worker_threads: usize,
    /// Pool stream cap.
    pub(crate) pool_max_streams_per_conn: u32,
    /// Pool idle release.
    pub(crate) pool_unused_release_timeout: Duration,
    /// HTTP/2 stream window.
    pub(crate) window_size: u32,
    /// HTTP/2 connection window.
    pub(crate) connection_window_size: u32,
    /// HTTP/2 frame size.
    pub(crate) frame_size: u32,
    /// TCP keepalive (None = off).
    pub(crate) keepalive: Option<KeepaliveDump>,
    /// TCP_USER_TIMEOUT.
    pub(crate) user_timeout_enabled: bool,
    /// Drain deadline.
    pub(crate) self_termination_deadline: Duration,
    /// Spoof client source IPs towards apps (None = when possible).
    pub(crate) require_original_source: Option<bool>,
    /// Inbound HBONE: accept → TLS handshake done.
    pub(crate) hbone_handshake_timeout: Duration,
    /// Inbound HBONE: TLS done → HTTP/2 preface.
    pub(crate) hbone_preface_timeout: Duration,
    /// Inbound HBONE: preface → first CONNECT.
    pub(crate) hbone_first_stream_timeout: Duration,
    /// Inbound HBONE: no open stream for this long closes the connection.
    pub(crate) hbone_idle_timeout: Duration,
    /// Inbound HBONE connections per source address.
    pub(crate) hbone_max_connections_per_peer: u32,
    /// Open CONNECT streams per source address.
    pub(crate) hbone_max_streams_per_peer: u32,
    /// Receive window (buffered bytes) per source address.
    pub(crate) hbone_peer_buffer_bytes: u64,
    /// Descriptors kept for the control path (`None`: an eighth of the limit, at most 1024).
    pub(crate) fd_reserve: Option<u64>,
    /// Connection descriptors counted per admitted pod.
    pub(crate) pod_fd_headroom: u32,
    /// Outbound capture listener.
    pub(crate) outbound_addr: SocketAddr,
    /// Inbound HBONE listener.
    pub(crate) inbound_addr: SocketAddr,
    /// Inbound plaintext listener.
    pub(crate) inbound_plaintext_addr: SocketAddr,
    /// Admin.
    pub(crate) admin_addr: SocketAddr,
    /// Metrics.
    pub(crate) stats_addr: SocketAddr,
    /// Readiness.
    pub(crate) readiness_addr: SocketAddr,
    /// Log format is JSON.
    pub(crate) log_json: bool,
    /// Settings that are set but not supported (logged once at start), and notes on ignored input.
    pub(crate) unsupported: Vec<String>,
}

/// Keepalive settings as shown in the config dump.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeepaliveDump {
    /// Idle time.
    pub keepalive_time: Duration,
    /// Interval.
    pub keepalive_interval: Duration,
    /// Retries.
    pub keepalive_retries: u32,
}

/// A setting that cannot be used, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unknown PROXY_MODE.
    #[error("PROXY_MODE={0:?} is not valid: use `shared` or `dedicated`")]
    Mode(String),
    /// Dedicated mode without the workload.
    #[error("PROXY_MODE=dedicated needs PROXY_WORKLOAD_INFO=<namespace>/<name>/<service account>")]
    MissingWorkloadInfo,
    /// Malformed PROXY_WORKLOAD_INFO.
    #[error("PROXY_WORKLOAD_INFO={0:?} is not <namespace>/<name>/<service account>")]
    WorkloadInfo(String),
    /// On-demand xDS with the DNS proxy.
    #[error(
        "XDS_ON_DEMAND=true cannot be used with the DNS proxy (ISTIO_META_DNS_CAPTURE=true): the DNS proxy needs every address; turn one of them off"
    )]
    OnDemandWithDns,
    /// No CA address and no in-process CA.
    #[error("CA_ADDRESS is empty: set it to the Istio CA (istiod), or FAKE_CA=true for development")]
    NoCa,
    /// A control-plane setting cannot be used.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// Bad worker thread setting.
    #[error("ZTUNNEL_WORKER_THREADS={0:?} is not N, N% or 0")]
    WorkerThreads(String),
    /// Bad log format.
    #[error("LOG_FORMAT={0:?} is not `plain` or `json`")]
    LogFormat(String),
}

impl Config {
    /// Resolves the arguments (and the process environment's prefixed variables) into a
    /// configuration, or says what is wrong.
    pub fn from_args(a: &ProxyArgs) -> Result<Config, ConfigError> {
        Config::from_args_env(a, &ambit_admin::environment())
    }

    /// As [`Config::from_args`], with the environment given (`ISTIO_META_*`, `ISTIO_METAJSON_*`,
    /// `CA_HEADER_*`, `XDS_HEADER_*`, `KUBERNETES_SERVICE_HOST` and the unsupported settings are
    /// read from it).
    pub(crate) fn from_args_env(a: &ProxyArgs, env: &Env) -> Result<Config, ConfigError> {
        let proxy_mode = match a.proxy_mode.to_ascii_lowercase().as_str() {
            "shared" => ProxyMode::Shared,
            "dedicated" => ProxyMode::Dedicated,
            _ => return Err(ConfigError::Mode(a.proxy_mode.clone())),
        };
        let info = match &a.proxy_workload_info {
            Some(s) => Some(parse_workload_info(s)?),
            None => None,
        };
        if proxy_mode == ProxyMode::Dedicated && info.is_none() {
            return Err(ConfigError::MissingWorkloadInfo);
        }
        let cluster_id = env.get("ISTIO_META_CLUSTER_ID").cloned().unwrap_or_else(|| a.cluster_id.clone());
        let dns_proxy = a.dns_capture.eq_ignore_ascii_case("true");
        let default_address = if env.contains_key("KUBERNETES_SERVICE_HOST") {
            DEFAULT_ISTIOD_IN_CLUSTER
        } else {
            DEFAULT_ISTIOD_LOCAL
        };
        let token = TokenSource::from_setting(a.control.auth_token.as_deref());
        let control = |service: Service, address: &str, roots: &str, alt: &Option<String>| {
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
        let xds_address = a.control.xds_address.as_deref().unwrap_or(default_address);
        let xds = if xds_address.is_empty() {
            None
        } else {
            if a.xds_on_demand && dns_proxy {
                return Err(ConfigError::OnDemandWithDns);
            }
            Some(XdsSettings {
                control: control(
                    Service::Xds,
                    xds_address,
                    &a.control.xds_root_ca,
                    &a.control.alt_xds_hostname,
                )?,
                on_demand: a.xds_on_demand,
                node: node_info(a, env),
            })
        };
        let ca = if a.control.fake_ca {
            CaSource::Fake { root: a.control.fake_ca_root.clone() }
        } else {
            match a.control.ca_address.as_deref().unwrap_or(default_address) {
                "" => return Err(ConfigError::NoCa),
                address => CaSource::Remote(control(
                    Service::Ca,
                    address,
                    &a.control.ca_root_ca,
                    &a.control.alt_ca_hostname,
                )?),
            }
        };
        let mut unsupported: Vec<String> = UNSUPPORTED_SETTINGS
            .iter()
            .filter(|name| env.contains_key(**name))
            .map(|name| format!("{name} is set but not supported by Ambit yet; it has no effect"))
            .collect();
        if env.contains_key("PROXY_CONFIG") || std::path::Path::new(MESH_CONFIG_FILE).exists() {
            unsupported.push(format!(
                "the mesh config ({MESH_CONFIG_FILE}, PROXY_CONFIG) is not read by Ambit yet: discoveryAddress, proxyMetadata and concurrency there have no effect; use XDS_ADDRESS, ISTIO_META_* and ZTUNNEL_WORKER_THREADS"
            ));
        }
        // ztunnel's chart passes `proxy ztunnel`; ztunnel ignores what follows `proxy`.
        if !a.extra_args.is_empty() && a.extra_args != ["ztunnel"] {
            unsupported.push(format!(
                "arguments after `proxy` are ignored, as ztunnel ignores them: {:?}",
                a.extra_args
            ));
        }
        let log_json = match a.log_format.as_str() {
            "json" => true,
            "plain" | "" => false,
            other => return Err(ConfigError::LogFormat(other.to_owned())),
        };
        let cores =
            a.cpu_limit.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        let num_worker_threads = worker_threads(a.worker_threads.as_deref(), cores)?;
        let any = crate::socket::unspecified(a.ipv6_enabled);
        let packet_mark = match (a.packet_mark, proxy_mode) {
            (Some(m), _) => Some(m),
            (None, ProxyMode::Shared) => Some(1337),
            (None, ProxyMode::Dedicated) => None,
        };
        Ok(Config {
            proxy_mode,
            proxy_workload_information: info,
            local_xds_path: a.local_xds_path.clone(),
            xds,
            inpod_uds: a.inpod_uds.clone(),
            dns_proxy,
            prefered_service_namespace: a.prefered_service_namespace.clone().filter(|n| !n.is_empty()),
            ca,
            secret_ttl: a.control.secret_ttl,
            packet_mark,
            local_node: a.node_name.clone().filter(|n| !n.is_empty()),
            cluster_id,
            cluster_domain: a.cluster_domain.clone(),
            trust_domain: a.trust_domain.clone(),
            network: a.network.clone(),
            ipv6_enabled: a.ipv6_enabled,
            num_worker_threads,
            pool_max_streams_per_conn: a.pool_max_streams.max(1),
            pool_unused_release_timeout: a.pool_unused_release_timeout,
            window_size: a.window_size,
            connection_window_size: a.connection_window_size,
            frame_size: a.frame_size.clamp(16_384, 16_777_215),
            keepalive: a.keepalive_enabled.then_some(KeepaliveDump {
                keepalive_time: a.keepalive_time,
                keepalive_interval: a.keepalive_interval,
                keepalive_retries: a.keepalive_retries,
            }),
            user_timeout_enabled: a.user_timeout_enabled,
            self_termination_deadline: drain_deadline(
                a.connection_termination_deadline,
                a.termination_grace_period_seconds,
            ),
            require_original_source: a.enable_orig_src,
            hbone_handshake_timeout: a.hbone_handshake_timeout,
            hbone_preface_timeout: a.hbone_preface_timeout,
            hbone_first_stream_timeout: a.hbone_first_stream_timeout,
            hbone_idle_timeout: a.hbone_idle_timeout,
            hbone_max_connections_per_peer: a.hbone_max_connections_per_peer,
            hbone_max_streams_per_peer: a.hbone_max_streams_per_peer,
            hbone_peer_buffer_bytes: a.hbone_peer_buffer_bytes,
            fd_reserve: a.fd_reserve,
            pod_fd_headroom: a.pod_fd_headroom,
            outbound_addr: SocketAddr::new(any, 15001),
            inbound_addr: SocketAddr::new(any, 15008),
            inbound_plaintext_addr: SocketAddr::new(any, 15006),
            admin_addr: a.admin_addr,
            stats_addr: a.stats_addr,
            readiness_addr: a.readiness_addr,
            log_json,
            unsupported,
        })
    }

    /// Logs, once, every setting that is set but not supported, and ignored arguments.
    pub fn warn_unsupported(&self) {
        for line in &self.unsupported {
            tracing::warn!("unsupported setting: {line}");
        }
    }

    /// Socket options for every proxy socket.
    pub(crate) fn socket_options(&self) -> SocketOptions {
        SocketOptions {
            netns: None,
            mark: self.packet_mark,
            keepalive: self.keepalive.map(|k| Keepalive {
                time: k.keepalive_time,
                interval: k.keepalive_interval,
                retries: k.keepalive_retries,
            }),
            user_timeout: self.user_timeout_enabled,
        }
    }
}

/// The xDS node as ztunnel builds it (node-proxy.md §1.4).
fn node_info(a: &ProxyArgs, env: &Env) -> NodeInfo {
    use serde_json::Value;
    let get = |v: &Option<String>| v.clone().unwrap_or_default();
    let (pod, ns) = (get(&a.pod_name), get(&a.pod_namespace));
    let ip = a.instance_ip.clone().filter(|ip| !ip.is_empty()).unwrap_or_else(|| "1.1.1.1".to_owned());
    let mut metadata = ambit_xds::node::istio_metadata(env);
    metadata.insert("NAME".to_owned(), Value::String(pod.clone()));
    metadata.insert("NAMESPACE".to_owned(), Value::String(ns.clone()));
    metadata.insert("INSTANCE_IPS".to_owned(), Value::String(ip.clone()));
    metadata.insert("NODE_NAME".to_owned(), Value::String(get(&a.node_name)));
    NodeInfo { id: format!("ztunnel~{ip}~{pod}.{ns}~{ns}.svc.cluster.local"), metadata }
}

fn parse_workload_info(s: &str) -> Result<WorkloadInfo, ConfigError> {
    match s.split('/').collect::<Vec<_>>().as_slice() {
        [ns, name, sa] if !ns.is_empty() && !name.is_empty() && !sa.is_empty() => Ok(WorkloadInfo {
            namespace: (*ns).to_owned(),
            name: (*name).to_owned(),
            service_account: (*sa).to_owned(),
        }),
        _ => Err(ConfigError::WorkloadInfo(s.to_owned())),
    }
}

fn worker_threads(setting: Option<&str>, cores: usize) -> Result<usize, ConfigError> {
    let cores = cores.max(1);
    let n = match setting.map(str::trim) {
        None | Some("") => cores.div_ceil(4).max(2),
        Some(s) => {
            let bad = || ConfigError::WorkerThreads(s.to_owned());
            if let Some(p) = s.strip_suffix('%') {
                let p: usize = p.parse().map_err(|_| bad())?;
                if p == 0 || p > 100 {
                    return Err(bad());
                }
                (cores * p).div_ceil(100)
            } else {
                match s.parse::<usize>().map_err(|_| bad())? {
                    0 => cores,
                    n => n,
                }
            }
        }
    };
    Ok(n.max(1))
}

fn drain_deadline(explicit: Option<Duration>, grace: Option<u64>) -> Duration {
    if let Some(d) = explicit {
        return d;
    }
    match grace {
        Some(t) if t > 10 => Duration::from_secs(t - 5),
        Some(t) => Duration::from_secs(t.saturating_sub(1).max(1)),
        None => Duration::from_secs(5),
    }
}

pub use ambit_admin::parse_duration;

fn parse_u32(s: &str) -> Result<u32, String> {
    let s = s.trim();
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a number (decimal or 0x hex)"))
}

#[cfg(test)]
mod tests;
