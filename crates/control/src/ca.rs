//! The CA server (`control-plane.md` §6).
