//! Shared (in-pod) mode: the node agent hands each pod's network namespace over ZDS, and the
//! proxy runs one proxy instance per pod with its listeners bound inside that namespace.

mod manager;
pub mod netns;

pub use manager::Manager;
