//! A control-plane service's settings as a process reads them at start (`CA_ADDRESS`,
//! `CA_ROOT_CA`, `ALT_CA_HOSTNAME`, `CA_HEADER_*`, and the `XDS_*` equivalents), checked once
//! and kept in a form a config dump can show. The node proxy and the waypoint read them alike.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{ControlError, ControlPlane, ControlPlaneConfig, RootSource, Service, TokenSource};

/// How to reach one control-plane service (CA or xDS), as configured.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlSettings {
    /// Address with its scheme (`https://` added when missing).
    pub address: String,
    /// Roots for TLS.
    pub roots: RootSource,
    /// Alternate TLS name.
    pub alt_hostname: Option<String>,
    /// Bearer token (`AUTH_TOKEN`).
    pub token: Option<TokenSource>,
    /// Sent as `clusterid` with the token.
    pub cluster_id: String,
    /// Extra headers (name without the prefix, lower-case; value). Values are not dumped.
    #[serde(serialize_with = "header_names")]
    pub headers: Vec<(String, String)>,
}

/// The raw settings of one service, as the environment or flags gave them.
#[derive(Clone, Copy, Debug)]
pub struct ControlSetting<'a> {
    /// Which service.
    pub service: Service,
    /// `CA_ADDRESS` / `XDS_ADDRESS`.
    pub address: &'a str,
    /// `CA_ROOT_CA` / `XDS_ROOT_CA`.
    pub roots: &'a str,
    /// `ALT_CA_HOSTNAME` / `ALT_XDS_HOSTNAME` (empty is unset).
    pub alt_hostname: Option<&'a str>,
    /// `AUTH_TOKEN`, resolved.
    pub token: Option<&'a TokenSource>,
    /// The cluster id sent with the token.
    pub cluster_id: &'a str,
}

impl ControlSettings {
    /// Resolves `setting` (with the `CA_HEADER_*` or `XDS_HEADER_*` variables of `env`) and
    /// checks it as a connection would (address, roots, alternate name, headers), so that a bad
    /// setting stops the start with its variable and value named.
    pub fn resolve(
        setting: ControlSetting<'_>,
        env: &BTreeMap<String, String>,
    ) -> Result<ControlSettings, ControlError> {
        let service = setting.service;
        let cfg = ControlPlaneConfig {
            service,
            address: setting.address.to_owned(),
            roots: roots_setting(service, setting.address, setting.roots)?,
            alt_hostname: setting.alt_hostname.filter(|a| !a.is_empty()).map(str::to_owned),
            token: setting.token.cloned(),
            cluster_id: setting.cluster_id.to_owned(),
            headers: prefixed(env, service.header_prefix()),
            mark: None,
        };
        let checked = ControlPlane::new(cfg.clone())?;
        Ok(ControlSettings {
            address: checked.address().to_owned(),
            roots: cfg.roots,
            alt_hostname: cfg.alt_hostname,
            token: cfg.token,
            cluster_id: cfg.cluster_id,
            headers: cfg.headers,
        })
    }

    /// The settings as [`ControlPlane::new`] takes them (for the CA client and the xDS client).
    pub fn control_plane_config(&self, service: Service) -> ControlPlaneConfig {
        ControlPlaneConfig {
            service,
            address: self.address.clone(),
            roots: self.roots.clone(),
            alt_hostname: self.alt_hostname.clone(),
            token: self.token.clone(),
            cluster_id: self.cluster_id.clone(),
            headers: self.headers.clone(),
            mark: None,
        }
    }
}

/// The roots setting: an unusable value is an error only when TLS is used (https://, or no
/// scheme); plaintext has no use for roots, and a bad scheme is reported by the address check.
fn roots_setting(service: Service, address: &str, value: &str) -> Result<RootSource, ControlError> {
    let tls = address.starts_with("https://") || !address.contains("://");
    match RootSource::parse(service, value) {
        Ok(roots) => Ok(roots),
        Err(_) if !tls => Ok(RootSource::System),
        Err(e) => Err(e),
    }
}

/// `PREFIX<K>=<V>` variables as (lower-case K, V), sorted by K.
fn prefixed(env: &BTreeMap<String, String>, prefix: &str) -> Vec<(String, String)> {
    env.iter()
        .filter_map(|(k, v)| k.strip_prefix(prefix).map(|h| (h.to_ascii_lowercase(), v.clone())))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

fn header_names<S: serde::Serializer>(headers: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(headers.iter().map(|(k, _)| k))
}
