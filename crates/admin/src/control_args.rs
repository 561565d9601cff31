//! The control-plane flags of every process that reaches istiod or `ambit control` (the node
//! proxy and the waypoint): one definition, flattened into each process's own arguments, with
//! Istio's environment names. Each process resolves them with its own rules (the node proxy may
//! run without xDS, the waypoint may not).

use std::path::PathBuf;
use std::time::Duration;

use crate::parse_duration;

/// Default of `CA_ROOT_CA` and `XDS_ROOT_CA` (relative to the working directory, `/` in a pod).
pub const DEFAULT_ROOT_CA: &str = "./var/run/secrets/istio/root-cert.pem";

/// Where xDS and certificates come from. Every setting is an environment variable; flags
/// override the environment.
#[derive(Clone, Debug, clap::Args)]
pub struct ControlArgs {
    /// xDS server address; `https://` is assumed when no scheme is given. Default:
    /// `https://istiod.istio-system.svc:15012` when KUBERNETES_SERVICE_HOST is set, else
    /// `https://localhost:15012`. Empty: no xDS (the node proxy then needs LOCAL_XDS_PATH; the
    /// waypoint refuses to start).
    #[arg(long, env = "XDS_ADDRESS")]
    pub xds_address: Option<String>,
    /// Roots that verify the xDS server: a PEM file, `SYSTEM` (the OS trust store) or the PEM itself.
    #[arg(long, env = "XDS_ROOT_CA", default_value = DEFAULT_ROOT_CA)]
    pub xds_root_ca: String,
    /// A name the xDS server's certificate may carry instead of the address's host.
    #[arg(long, env = "ALT_XDS_HOSTNAME")]
    pub alt_xds_hostname: Option<String>,
    /// Istio CA API address (gRPC); `https://` is assumed when no scheme is given. Default as
    /// XDS_ADDRESS's.
    #[arg(long, env = "CA_ADDRESS")]
    pub ca_address: Option<String>,
    /// Roots that verify the CA: a PEM file, `SYSTEM` (the OS trust store) or the PEM itself.
    #[arg(long, env = "CA_ROOT_CA", default_value = DEFAULT_ROOT_CA)]
    pub ca_root_ca: String,
    /// A name the CA's certificate may carry instead of the address's host.
    #[arg(long, env = "ALT_CA_HOSTNAME")]
    pub alt_ca_hostname: Option<String>,
    /// Bearer token for the CA and xDS: a file (re-read per request) or, when no such file
    /// exists, the token itself. Default: ./var/run/secrets/tokens/istio-token if it exists.
    #[arg(long, env = "AUTH_TOKEN")]
    pub auth_token: Option<String>,
    /// Development: sign certificates in-process instead of calling a CA.
    #[arg(long, env = "FAKE_CA", default_value_t = false, action = clap::ArgAction::Set)]
    pub fake_ca: bool,
    /// Development: directory with root-cert.pem and root-key.pem for FAKE_CA (see `ambit dev-ca
    /// init`); without it, a fresh in-memory root that only this process trusts.
    #[arg(long, env = "FAKE_CA_ROOT")]
    pub fake_ca_root: Option<PathBuf>,
    /// Requested certificate lifetime.
    #[arg(long, env = "SECRET_TTL", default_value = "24h", value_parser = parse_duration)]
    pub secret_ttl: Duration,
}
