//! Shared (in-pod) mode: the node agent hands each pod's network namespace over ZDS, and the
//! proxy runs one proxy instance per pod with its listeners bound inside that namespace.

pub mod netns;
