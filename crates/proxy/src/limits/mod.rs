//! Resource limits of the data plane: the process's descriptor budget (shared by connections
//! and pod admission) and what one HBONE peer may hold (connections, streams, buffered bytes).
//!
//! Both are plain atomics on the connection and stream paths; nothing here runs per chunk.

pub mod fds;
pub mod peers;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

pub use fds::{CapacityError, FdBudget, FdPermit, PodPermit};
pub use peers::{PeerLimits, Peers, Refusal};

use crate::config::{Config, ProxyMode};

/// The process-wide limits every proxy instance shares.
#[derive(Clone)]
pub struct Limits {
    /// Descriptors of the data plane (connections and pods).
    pub fds: FdBudget,
    /// Per-peer caps of the HBONE listeners.
    pub peers: Peers,
    /// Counters of what the limits refused.
    pub metrics: LimitMetrics,
}

impl Limits {
    /// Limits from the configuration and the process's open-files limit (`fd_limit`, read after
    /// it was raised to the hard limit); registers the `ambit_*` limit metrics.
    pub fn new(cfg: &Config, fd_limit: u64, registry: &mut Registry) -> Limits {
        let metrics = LimitMetrics::default();
        metrics.register(registry.sub_registry_with_prefix("ambit"));
        let fds =
            FdBudget::new(fd_limit, cfg.fd_reserve, pod_fixed_fds(cfg), cfg.pod_fd_headroom as u64, &metrics);
        let peers = Peers::new(PeerLimits::from_config(cfg), metrics.clone());
        Limits { fds, peers, metrics }
    }

    /// `limits` in `/config_dump`.
    pub fn dump(&self) -> LimitsDump {
        LimitsDump { descriptors: self.fds.dump(), hbone_peers: self.peers.dump() }
    }
}

/// The runtime figures of the limits, for `/config_dump`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitsDump {
    /// The descriptor budget.
    pub descriptors: fds::FdDump,
    /// Peers of the HBONE listeners.
    pub hbone_peers: peers::PeersDump,
}

/// Descriptors one pod's instance holds for its whole life: its network namespace (shared mode),
/// the 15001/15006/15008 listeners, and the DNS proxy's UDP and TCP sockets (IPv4, and IPv6 when
/// enabled).
pub fn pod_fixed_fds(cfg: &Config) -> u64 {
    let netns = u64::from(cfg.proxy_mode == ProxyMode::Shared);
    let dns = if cfg.dns_proxy { 2 * (1 + u64::from(cfg.ipv6_enabled)) } else { 0 };
    netns + 3 + dns
}

/// Which listener shed a connection.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Listener {
    /// 15001.
    outbound,
    /// 15008.
    inbound,
    /// 15006.
    inbound_plaintext,
}

/// Why an HBONE connection or stream was refused.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RefusalReason {
    /// The peer holds `AMBIT_HBONE_MAX_CONNECTIONS_PER_PEER` connections.
    peer_connections,
    /// The peer holds `AMBIT_HBONE_MAX_STREAMS_PER_PEER` streams.
    peer_streams,
}

/// A phase of an inbound HBONE connection that has a deadline.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Phase {
    /// Accept → TLS handshake done.
    tls_handshake,
    /// TLS done → HTTP/2 preface received.
    preface,
    /// HTTP/2 handshake → first CONNECT.
    first_stream,
    /// No open stream for the idle timeout.
    idle,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: Listener,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: RefusalReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: Phase,
}

/// The limits' metrics and their rate-limited log lines.
#[derive(Clone, Default)]
pub struct LimitMetrics {
    shed: Family<ListenerLabel, Counter>,
    refused: Family<ReasonLabel, Counter>,
    timeouts: Family<PhaseLabel, Counter>,
    resets_before_dial: Counter,
    pods_refused: Counter,
    pub(crate) fd_limit: Gauge,
    pub(crate) fd_reserve: Gauge,
    pub(crate) fd_budget: Gauge,
    pub(crate) fd_in_use: Gauge,
    pub(crate) pod_capacity: Gauge,
    pub(crate) peers: Gauge,
    pub(crate) peer_windows: Gauge,
    logs: Arc<LogLimiters>,
}

#[derive(Default)]
struct LogLimiters {
    shed: LogLimiter,
    refused: LogLimiter,
}

impl LimitMetrics {
    fn register(&self, r: &mut Registry) {
        r.register("fd_limit", "The proxy's open-files limit (RLIMIT_NOFILE)", self.fd_limit.clone());
        r.register(
            "fd_reserve",
            "Descriptors kept for the control path (admin, metrics, readiness, ZDS, CA)",
            self.fd_reserve.clone(),
        );
        r.register(
            "data_plane_fd_budget",
            "Descriptors the data plane may hold (limit minus reserve)",
            self.fd_budget.clone(),
        );
        r.register(
            "data_plane_fds",
            "Descriptors the data plane holds (pods' listeners and connections)",
            self.fd_in_use.clone(),
        );
        r.register(
            "pod_capacity",
            "Pods this proxy admits with its descriptor budget",
            self.pod_capacity.clone(),
        );
        r.register(
            "pods_refused",
            "ZDS Adds refused because the proxy is at its pod capacity",
            self.pods_refused.clone(),
        );
        r.register(
            "connections_shed",
            "Accepted connections closed at once because the descriptor budget was exhausted",
            self.shed.clone(),
        );
        r.register(
            "hbone_refused",
            "HBONE connections and streams refused by a per-peer cap",
            self.refused.clone(),
        );
        r.register(
            "hbone_phase_timeouts",
            "Inbound HBONE connections closed by a phase deadline",
            self.timeouts.clone(),
        );
        r.register(
            "hbone_resets_before_dial",
            "CONNECT streams the peer reset before the app connection was established (not dialed, or dial aborted)",
            self.resets_before_dial.clone(),
        );
        r.register("hbone_peers", "Source addresses with open inbound HBONE connections", self.peers.clone());
        r.register(
            "hbone_peer_window_bytes",
            "HTTP/2 receive window granted to inbound HBONE peers: the most they can make the proxy buffer",
            self.peer_windows.clone(),
        );
    }

    /// Counts a connection shed by `listener` and logs it (at most once a second).
    pub fn shed(&self, listener: Listener, budget: &FdBudget, peer: std::net::SocketAddr) {
        self.shed.get_or_create(&ListenerLabel { listener }).inc();
        if self.logs.shed.allow() {
            let d = budget.dump();
            tracing::warn!(?listener, src.addr = %peer, in_use = d.in_use, budget = d.budget,
                limit = d.limit, reserve = d.reserve,
                "connection shed: the data plane holds its whole descriptor budget (RLIMIT_NOFILE minus AMBIT_FD_RESERVE); raise the proxy's open-files limit (further sheds this second are only counted in ambit_connections_shed_total)");
        }
    }

    /// Counts a refusal by a per-peer cap and logs it (at most once a second).
    pub fn refused(&self, refusal: &Refusal, identity: Option<&ambit_identity::Identity>) {
        self.refused.get_or_create(&ReasonLabel { reason: refusal.reason() }).inc();
        if self.logs.refused.allow() {
            let id = identity.map(ToString::to_string).unwrap_or_default();
            tracing::warn!(target: "access", { src.identity = %id, error = %refusal },
                "HBONE peer refused (further refusals this second are only counted in ambit_hbone_refused_total)");
        }
    }

    /// Counts an inbound HBONE connection closed by the deadline of `phase`.
    pub fn timed_out(&self, phase: Phase) {
        self.timeouts.get_or_create(&PhaseLabel { phase }).inc();
    }

    /// Counts a stream reset by the peer before its app connection was established.
    pub fn reset_before_dial(&self) {
        self.resets_before_dial.inc();
    }

    /// Counts a pod refused for lack of capacity.
    pub fn pod_refused(&self) {
        self.pods_refused.inc();
    }
}

/// Lets a log line through at most once a second (the counters carry the totals).
#[derive(Default)]
pub struct LogLimiter {
    last: AtomicU64,
}

impl LogLimiter {
    /// Whether a line may be logged now.
    pub fn allow(&self) -> bool {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        // Second 0 is "never logged", so count from 1.
        let now = START.get_or_init(Instant::now).elapsed().as_secs() + 1;
        let last = self.last.load(Ordering::Relaxed);
        last != now && self.last.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

#[cfg(test)]
mod tests;
