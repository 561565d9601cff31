//! The generated mesh of the state benchmarks (shared with the end-to-end xDS benchmark).

pub use ambit_proxy::testing::generated::*;
