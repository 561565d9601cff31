//! The Ambit node proxy: carries pod traffic over HBONE and enforces L4 authorization.

pub mod admin;
pub mod app;
pub mod authz;
pub mod config;
pub mod connections;
pub mod copy;
pub mod dns;
pub mod drain;
pub mod inbound;
pub mod inpod;
pub mod inputs;
pub mod instance;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod outbound;
pub mod passthrough;
pub mod readiness;
pub mod socket;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod xds;
