//! The CA server (`control-plane.md` §6): key material and `CreateCertificate`.

pub mod material;
