//! Request telemetry as plain counters: what `istio_requests_total` (reporter="waypoint") and the
//! access log will be built on. Counted at the end of each request, off the hot locks of the
//! configuration.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The label of a denial that no DENY policy made (ALLOW policies exist and none matched).
pub const NO_ALLOW_MATCHED: &str = "(no ALLOW policy matched)";

/// The waypoint's counters.
#[derive(Debug, Default)]
pub struct Counters {
    responses: Mutex<BTreeMap<u16, u64>>,
    denials: Mutex<BTreeMap<String, u64>>,
    connection_denials: Mutex<BTreeMap<String, u64>>,
    retries: AtomicU64,
    timeouts: AtomicU64,
    tcp_connections: AtomicU64,
}

impl Counters {
    pub(crate) fn response(&self, status: http::StatusCode) {
        *self.responses.lock().unwrap_or_else(|p| p.into_inner()).entry(status.as_u16()).or_default() += 1;
    }

    pub(crate) fn denial(&self, policy: Option<&str>) {
        let key = policy.unwrap_or(NO_ALLOW_MATCHED).to_owned();
        *self.denials.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default() += 1;
    }

    pub(crate) fn connection_denial(&self, policy: Option<&str>) {
        let key = policy.unwrap_or(NO_ALLOW_MATCHED).to_owned();
        *self.connection_denials.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default() += 1;
    }

    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn timeout(&self) {
        self.timeouts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn tcp_connection(&self) {
        self.tcp_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Responses sent with `status` (local answers included: 403, 404, 503, 504…).
    pub fn responses(&self, status: u16) -> u64 {
        self.responses.lock().unwrap_or_else(|p| p.into_inner()).get(&status).copied().unwrap_or(0)
    }

    /// Every response status and its count.
    pub fn responses_by_status(&self) -> BTreeMap<u16, u64> {
        self.responses.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// HTTP requests denied by `policy` (`namespace/name`, or [`NO_ALLOW_MATCHED`]).
    pub fn denials(&self, policy: &str) -> u64 {
        self.denials.lock().unwrap_or_else(|p| p.into_inner()).get(policy).copied().unwrap_or(0)
    }

    /// TCP connections denied by `policy` (`namespace/name`, or [`NO_ALLOW_MATCHED`]).
    pub fn connection_denials(&self, policy: &str) -> u64 {
        self.connection_denials.lock().unwrap_or_else(|p| p.into_inner()).get(policy).copied().unwrap_or(0)
    }

    /// Attempts made after a request's first.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Requests answered 504 because a timeout ran out.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }

    /// TCP connections relayed.
    pub fn tcp_connections(&self) -> u64 {
        self.tcp_connections.load(Ordering::Relaxed)
    }
}
