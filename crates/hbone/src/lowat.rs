//! SO_RCVLOWAT, which neither socket2 nor nix has a type for: declared with nix's own
//! `sockopt_impl!`, whose expansion holds the one `unsafe` call (setsockopt with a plain int).
//! The only `unsafe` of the crate, and only here.
#![allow(unsafe_code)]

use std::os::fd::AsFd;

use nix::{setsockopt_impl, sockopt_impl};

sockopt_impl!(
    /// The bytes a socket must hold before it reads as ready (socket(7)).
    RcvLowat,
    SetOnly,
    libc::SOL_SOCKET,
    libc::SO_RCVLOWAT,
    usize
);

/// Sets SO_RCVLOWAT on `sock`: it reads as ready once it holds `bytes` (or at its end).
pub fn set(sock: &impl AsFd, bytes: usize) -> std::io::Result<()> {
    nix::sys::socket::setsockopt(sock, RcvLowat, &bytes).map_err(std::io::Error::from)
}
