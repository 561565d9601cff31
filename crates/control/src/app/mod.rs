//! `ambit control`: the process — sources, translation, the gRPC servers (xDS and CA), the
//! monitoring and readiness endpoints.

mod args;
mod debug;
mod publish;
mod run;
mod status;
mod waypoints;
mod writer;

pub use args::{ControlArgs, Listen, parse_addr};
pub use run::{ControlError, run, settings};
