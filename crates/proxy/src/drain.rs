//! Graceful drain: `ambit_hbone`'s [`Drain`], shared with the waypoint.

pub use ambit_hbone::drain::Drain;
