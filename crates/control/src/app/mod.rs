//! `ambit control`: the process — sources, translation, the gRPC servers (xDS and CA), the
//! monitoring and readiness endpoints.

mod args;

pub use args::{ControlArgs, Listen, parse_addr};
