//! The Ambit node proxy: carries pod traffic over HBONE and enforces L4 authorization.
//!
//! The face is small: the `ambit` binary parses [`ProxyArgs`] into a [`Config`] and hands it to
//! [`run`]; `ambit config-reference` lists, besides the flags, what the proxy reads from the
//! environment ([`ENV_OUTSIDE_FLAGS`], [`ENV_PREFIXES`]) and the settings it accepts without
//! effect ([`UNSUPPORTED_SETTINGS`], [`ACCEPTED_WITHOUT_EFFECT`]). Everything else is internal;
//! tests and benches reach more through `testing` (feature `testing`), the fuzz targets through
//! `fuzzing` (feature `fuzzing`).

mod admin;
mod app;
mod authz;
mod config;
mod connections;
mod copy;
mod denials;
mod dns;
mod drain;
mod inbound;
mod inpod;
mod inputs;
mod instance;
mod limits;
mod listener;
mod metrics;
mod name;
mod outbound;
mod passthrough;
mod readiness;
mod socket;
mod state;
mod xds;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use app::{StartError, run};
pub use config::{
    ACCEPTED_WITHOUT_EFFECT, Config, ConfigError, ENV_OUTSIDE_FLAGS, ENV_PREFIXES, ProxyArgs,
    UNSUPPORTED_SETTINGS,
};

/// One policy of `/config_dump` (ztunnel's local-config shape, as the proxy writes it) as the
/// xDS resource it stands for, so tools can describe what a proxy holds (`ambit inspect`).
pub fn dumped_policy(
    value: serde_json::Value,
) -> Result<ambit_api::security::Authorization, serde_json::Error> {
    let policy: authz::Authorization = serde_json::from_value(value)?;
    Ok((&policy).into())
}

/// Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, never on in a normal build):
/// the parsers of untrusted input and what it takes to drive them.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::authz::Authorization;
    pub use crate::dns::fuzzing::upstream_reply as dns_upstream_reply;
    pub use crate::dns::{DnsClient, DnsConfig, DnsProxy, Protocol as DnsProtocol, UpstreamSockets};
    pub use crate::metrics::DnsMetrics;
    pub use crate::state::{Address, Authority, Delta, LocalConfig, State, StateStore};
}
