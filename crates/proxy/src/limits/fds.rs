//! The descriptor budget: RLIMIT_NOFILE minus a reserve for the control path is what the data
//! plane may hold. Every accepted connection and every upstream dial takes a permit, and an
//! accept beyond the budget is shed (accepted and closed at once) rather than left to EMFILE,
//! which would also starve admin, metrics, readiness and the ZDS socket. Pod admission draws
//! on the same budget: a pod costs its fixed descriptors plus a headroom for its connections,
//! and an Add that does not fit is refused with [`CapacityError`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::LimitMetrics;

/// Descriptors the control path keeps when `AMBIT_FD_RESERVE` is not set: an eighth of the
/// limit, at most this many.
pub const DEFAULT_RESERVE_MAX: u64 = 1024;

/// The process's descriptor budget (cheap to clone).
#[derive(Clone)]
pub struct FdBudget(Arc<Inner>);

struct Inner {
    limit: u64,
    reserve: u64,
    budget: u64,
    pod_fixed: u64,
    pod_headroom: u64,
    capacity: u64,
    pods: AtomicU64,
    metrics: LimitMetrics,
}

/// Descriptors held by one connection (released on drop).
#[must_use = "the descriptors are released when the permit is dropped"]
pub struct FdPermit {
    budget: FdBudget,
    n: u64,
}

/// One admitted pod's share of the budget (released on drop, when its instance is gone).
#[must_use = "the pod's share is released when the permit is dropped"]
pub struct PodPermit {
    budget: FdBudget,
}

/// Why a pod was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapacityError {
    /// The pod count reached what the budget holds.
    #[error(
        "the node proxy is at its capacity of {capacity} pods: its open-files limit (RLIMIT_NOFILE) \
         of {limit} minus a reserve of {reserve} for the control path leaves {budget} descriptors, \
         and each pod takes {per_pod} ({fixed} for its network namespace and listeners, {headroom} \
         for its connections: AMBIT_POD_FD_HEADROOM); raise the proxy's open-files limit \
         (LimitNOFILE / ulimit -n) or schedule the pod on another node"
    )]
    Pods {
        /// Pods admitted (= capacity).
        capacity: u64,
        /// RLIMIT_NOFILE.
        limit: u64,
        /// AMBIT_FD_RESERVE.
        reserve: u64,
        /// limit − reserve.
        budget: u64,
        /// fixed + headroom.
        per_pod: u64,
        /// Listeners and netns.
        fixed: u64,
        /// AMBIT_POD_FD_HEADROOM.
        headroom: u64,
    },
    /// Connections hold so much of the budget that the pod's listeners do not fit now.
    #[error(
        "the node proxy's connections hold {in_use} of its {budget} data-plane descriptors, so the \
         pod's {fixed} listener descriptors do not fit now; the pod can be added again when \
         connections close (or raise the proxy's open-files limit)"
    )]
    Exhausted {
        /// Descriptors in use.
        in_use: u64,
        /// limit − reserve.
        budget: u64,
        /// The pod's fixed descriptors.
        fixed: u64,
    },
}

/// The budget's figures, for `/config_dump`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FdDump {
    /// RLIMIT_NOFILE.
    pub limit: u64,
    /// Kept for the control path.
    pub reserve: u64,
    /// limit − reserve: what the data plane may hold.
    pub budget: u64,
    /// Held by the data plane now.
    pub in_use: u64,
    /// Fixed descriptors of one pod.
    pub pod_fixed: u64,
    /// Connection headroom of one pod.
    pub pod_headroom: u64,
    /// Pods admitted.
    pub pods: u64,
    /// Pods the budget admits.
    pub pod_capacity: u64,
}

impl FdBudget {
    /// A budget of `limit − reserve` descriptors (`reserve`: `None` = an eighth of the limit,
    /// at most [`DEFAULT_RESERVE_MAX`]); pods cost `pod_fixed + pod_headroom`.
    pub fn new(
        limit: u64,
        reserve: Option<u64>,
        pod_fixed: u64,
        pod_headroom: u64,
        metrics: &LimitMetrics,
    ) -> FdBudget {
        let reserve = reserve.unwrap_or_else(|| (limit / 8).min(DEFAULT_RESERVE_MAX)).min(limit);
        let budget = limit - reserve;
        let capacity = budget / (pod_fixed + pod_headroom).max(1);
        metrics.fd_limit.set(gauge(limit));
        metrics.fd_reserve.set(gauge(reserve));
        metrics.fd_budget.set(gauge(budget));
        metrics.pod_capacity.set(gauge(capacity));
        FdBudget(Arc::new(Inner {
            limit,
            reserve,
            budget,
            pod_fixed,
            pod_headroom,
            capacity,
            pods: AtomicU64::new(0),
            metrics: metrics.clone(),
        }))
    }

    /// Takes `n` descriptors for a connection, or `None` when the budget cannot hold them.
    pub fn try_acquire(&self, n: u64) -> Option<FdPermit> {
        self.take(n, self.0.budget).then(|| FdPermit { budget: self.clone(), n })
    }

    /// Admits one pod: its share must fit the pod capacity, and its fixed descriptors the
    /// budget as it is used now.
    pub fn admit_pod(&self) -> Result<PodPermit, CapacityError> {
        let i = &self.0;
        let admitted =
            i.pods.fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| (p < i.capacity).then_some(p + 1));
        if admitted.is_err() {
            return Err(CapacityError::Pods {
                capacity: i.capacity,
                limit: i.limit,
                reserve: i.reserve,
                budget: i.budget,
                per_pod: i.pod_fixed + i.pod_headroom,
                fixed: i.pod_fixed,
                headroom: i.pod_headroom,
            });
        }
        if !self.take(i.pod_fixed, i.budget) {
            i.pods.fetch_sub(1, Ordering::AcqRel);
            return Err(CapacityError::Exhausted {
                in_use: self.in_use(),
                budget: i.budget,
                fixed: i.pod_fixed,
            });
        }
        Ok(PodPermit { budget: self.clone() })
    }

    /// Descriptors the data plane holds now.
    pub fn in_use(&self) -> u64 {
        u64::try_from(self.0.metrics.fd_in_use.get()).unwrap_or(0)
    }

    /// The budget's figures.
    pub fn dump(&self) -> FdDump {
        let i = &self.0;
        FdDump {
            limit: i.limit,
            reserve: i.reserve,
            budget: i.budget,
            in_use: self.in_use(),
            pod_fixed: i.pod_fixed,
            pod_headroom: i.pod_headroom,
            pods: i.pods.load(Ordering::Relaxed),
            pod_capacity: i.capacity,
        }
    }

    /// The metrics the budget reports into (shared with the other limits).
    pub fn metrics(&self) -> &LimitMetrics {
        &self.0.metrics
    }

    fn take(&self, n: u64, budget: u64) -> bool {
        let n = gauge(n);
        let budget = gauge(budget);
        self.0
            .metrics
            .fd_in_use
            .inner()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + n <= budget).then_some(used + n)
            })
            .is_ok()
    }

    fn give_back(&self, n: u64) {
        if n > 0 {
            self.0.metrics.fd_in_use.dec_by(gauge(n));
        }
    }
}

impl Drop for FdPermit {
    fn drop(&mut self) {
        self.budget.give_back(self.n);
    }
}

impl Drop for PodPermit {
    fn drop(&mut self) {
        let i = &self.budget.0;
        self.budget.give_back(i.pod_fixed);
        i.pods.fetch_sub(1, Ordering::AcqRel);
    }
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
