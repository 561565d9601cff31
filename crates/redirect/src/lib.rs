//! In-pod traffic capture for the node agent: the capture rules of node-agent spec §2.8 as data,
//! two backends that install them inside a pod network namespace (nftables, the default, and
//! iptables-restore for compatibility), policy routing, and the host-side kubelet probe SNAT of §2.9.
//!
//! # Shape
//!
//! - [`PodCapture`] says what to capture for one pod (families, DNS, inbound bypass, virtual
//!   interfaces); [`PodCapture::from_annotations`] builds it from pod annotations (§2.8.4).
//! - [`render_iptables`] and [`render_nftables`] are pure functions from a [`PodCapture`] to the
//!   exact rule set; they are golden/snapshot tested under `testdata/`.
//! - [`RuleBackend`] installs, verifies and removes a capture in a pod netns given as a borrowed
//!   fd. Everything that touches a netns runs in a synchronous closure on a dedicated thread that
//!   `setns`es into it ([`in_netns`]). Netlink sockets opened there belong to the pod netns, and so
//!   do the `iptables*` children spawned from it. apply, verify and remove are idempotent.
//! - Both backends also set `net.ipv4.tcp_migrate_req=1` in the pod netns, so that a node proxy
//!   upgrade loses no queued connection (module `handoff`), and verify it with the rules.
//!
//! # Netlink, no `nft` or `ip` binary
//!
//! The nftables backend and the host probe SNAT talk nf_tables netlink, and policy routing talks
//! rtnetlink. Both go through the small client in `netlink` and the encoder in `nfnl`, with no
//! external crate. Each rule is encoded with the expressions `nft` 1.0 emits for the same text,
//! so `nft list ruleset` shows the spec's rule text (the root tests check this). One batch per
//! apply is one atomic kernel transaction. A fresh pod's batch contains only additions, because
//! when a batch deletes anything, closing the socket waits for an RCU grace period (about 10 ms).
//! We had used `nft -f -` before: no crate fitted (`rustables` is GPL-3.0, `nftnl` binds the C
//! library, `netlink-packet-netfilter` lacks the expressions), and spawning `nft` and `ip` per
//! pod cost 8–9 ms of every CNI ADD.

mod capture;
mod exec;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod handoff;
pub mod host;
mod iptables;
mod netlink;
mod nfnl;
mod nftables;
mod routing;

use std::io;
use std::os::fd::BorrowedFd;

pub use capture::{
    ANNOTATION_BYPASS_INBOUND, ANNOTATION_DNS_CAPTURE, ANNOTATION_VIRTUAL_INTERFACES, PodCapture,
    parse_go_bool,
};
pub use handoff::{TCP_MIGRATE_REQ, tcp_migrate_req_supported};
pub use iptables::{IptablesBackend, Xtables, render_iptables};
pub use nftables::{
    BaseChain, ChainKind, Hook, L4Proto, Match, NftAction, NftChain, NftRule, NftRuleset, NftSet, NftTable,
    NftablesBackend, POD_TABLES, SetType, render_nftables,
};

/// Mark ztunnel sets on all its in-pod sockets (`SO_MARK` 1337), matched under [`MARK_MASK`].
pub const ZTUNNEL_MARK: u32 = 0x539;
/// Connmark / fwmark of connections accepted by ztunnel, matched under [`MARK_MASK`].
pub const TPROXY_MARK: u32 = 0x111;
/// Mask applied to both marks.
pub const MARK_MASK: u32 = 0xfff;
/// Policy routing table for marked reply traffic.
pub const ROUTE_TABLE: u32 = 100;
/// Priority of the `fwmark 0x111/0xfff lookup 100` rule.
pub const RULE_PRIORITY: u32 = 32764;
/// ztunnel's outbound capture port.
pub const OUTBOUND_PORT: u16 = 15001;
/// ztunnel's inbound plaintext capture port.
pub const INBOUND_PLAINTEXT_PORT: u16 = 15006;
/// ztunnel's inbound HBONE port (never redirected).
pub const INBOUND_HBONE_PORT: u16 = 15008;
/// ztunnel's DNS proxy port.
pub const DNS_PORT: u16 = 15053;
/// Conntrack zone of captured DNS flows.
pub const DNS_CT_ZONE: u16 = 1;
/// Kubelet probe SNAT address, IPv4.
pub const PROBE_SNAT_V4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 7, 127);
/// Kubelet probe SNAT address, IPv6.
pub const PROBE_SNAT_V6: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xfd16, 0x9254, 0x7127, 0x1337, 0xffff, 0xffff, 0xffff, 0xffff);

/// An IP family: selects `iptables` or `ip6tables`, `ip -4` or `ip -6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Installs, checks and removes a pod's capture inside its network namespace: the rules, the
/// policy routing and `net.ipv4.tcp_migrate_req=1` (see [`TCP_MIGRATE_REQ`]).
pub trait RuleBackend: Send + Sync {
    /// Installs policy routing, the sysctl, then the rules; applying twice leaves the same state.
    fn apply(&self, netns: BorrowedFd<'_>, capture: &PodCapture) -> Result<(), RedirectError>;
    /// Compares the live rules, routing and sysctl with what `capture` needs.
    fn verify(&self, netns: BorrowedFd<'_>, capture: &PodCapture) -> Result<Verification, RedirectError>;
    /// Removes every capture rule, table, ip rule and table-100 route, and puts the sysctl back
    /// to the kernel default; ok when nothing is there.
    fn remove(&self, netns: BorrowedFd<'_>, capture: &PodCapture) -> Result<(), RedirectError>;
}

/// Outcome of [`RuleBackend::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    /// Rules, routing and sysctl are exactly what the capture needs.
    InSync,
    /// No capture rules or policy routing of ours are present at all (a clean netns; the sysctl
    /// alone does not count, since anything may have set it).
    Absent,
    /// Something is present but differs; each entry describes one difference.
    Drift(Vec<String>),
}

impl Verification {
    /// True for [`Verification::InSync`].
    pub fn is_in_sync(&self) -> bool {
        matches!(self, Verification::InSync)
    }
}

/// Errors from rendering inputs, entering a netns and running the rule tools.
#[derive(Debug, thiserror::Error)]
pub enum RedirectError {
    /// The pod network namespace could not be entered (or the thread that enters it failed).
    #[error(transparent)]
    Netns(#[from] ambit_netns::NetnsError),
    /// A tool could not be started.
    #[error("cannot run `{program}`: {source}; is it installed and on the agent's PATH?")]
    Spawn {
        /// The program name.
        program: String,
        /// Why spawning failed.
        source: io::Error,
    },
    /// A tool ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line, for the operator to rerun by hand.
        command: String,
        /// Its exit status.
        status: String,
        /// Its trimmed standard error.
        stderr: String,
    },
    /// Talking netlink to the kernel failed (socket, timeout, malformed reply).
    #[error("{what}: {detail}")]
    Netlink {
        /// Which netlink family (rtnetlink, nf_tables).
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// The kernel refused an operation.
    #[error("the kernel refused `{operation}`: {errno} ({})", errno.desc())]
    Kernel {
        /// The operation, written as the `nft`/`ip` command that does the same.
        operation: String,
        /// The kernel's errno.
        errno: nix::errno::Errno,
    },
    /// A tool's output could not be understood.
    #[error("unexpected output from `{command}`: {detail}")]
    Parse {
        /// The command whose output was parsed.
        command: String,
        /// What was wrong with it.
        detail: String,
    },
    /// A value that would end up in a rule is not safe to embed (e.g. a quote in a comment).
    #[error("refusing to put {what} {value:?} into a rule: {reason}")]
    InvalidValue {
        /// What kind of value (interface name, set comment).
        what: &'static str,
        /// The offending value.
        value: String,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A sysctl of the pod's network namespace could not be set.
    #[error(
        "cannot set {name}={value} in the pod network namespace ({path}): {source}; the agent \
         needs a writable /proc/sys, or CAP_SYS_ADMIN to mount a procfs of its own"
    )]
    Sysctl {
        /// The sysctl, e.g. `net.ipv4.tcp_migrate_req`.
        name: &'static str,
        /// The value written.
        value: &'static str,
        /// Its file.
        path: Box<str>,
        /// Why writing failed.
        source: io::Error,
    },
    /// Reading a file (under /proc) failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// No kubelet process was found while scanning /proc.
    #[error(
        "no kubelet process (comm kubelet, kubelite or k3s) found under {0}; is the agent's /proc \
         the host's (hostPID or a /host/proc mount)?"
    )]
    KubeletNotFound(String),
}

/// Runs `work` on a fresh thread inside `netns` (see [`ambit_netns::run_in_thread`]): netlink
/// sockets opened there belong to the pod netns, and so do the `iptables*` children spawned
/// from it.
pub fn in_netns<T: Send>(
    netns: BorrowedFd<'_>,
    work: impl FnOnce() -> Result<T, RedirectError> + Send,
) -> Result<T, RedirectError> {
    ambit_netns::run_in_thread(netns, work)?
}

#[cfg(test)]
mod tests;
