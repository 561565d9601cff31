//! Tests of the state module.
