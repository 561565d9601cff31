//! The Ambit node proxy: carries pod traffic over HBONE and enforces L4 authorization.

pub mod authz;
pub mod state;
