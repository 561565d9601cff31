//! Graceful drain: stop accepting at once, let open connections finish until a deadline,
//! then force them closed. The [`Shutdown`](crate::Shutdown) of the node proxy and the waypoint.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Drain signals shared by listeners and connections.
#[derive(Clone, Debug, Default)]
pub struct Drain {
    start: CancellationToken,
    force: CancellationToken,
    tracker: TaskTracker,
    /// Why connections were closed, when this scope was closed on purpose (not a deadline).
    reason: Arc<OnceLock<&'static str>>,
}

/// What connections report when a drain deadline closes them.
pub const DEADLINE_REASON: &str = "connection failed to drain within the timeout";

impl Drain {
    /// A fresh, not-draining signal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Resolves when a drain starts (listeners stop accepting, HTTP/2 servers send GOAWAY).
    pub async fn started(&self) {
        self.start.cancelled().await
    }

    /// A token cancelled when the drain starts (for loops that take one).
    pub fn start_token(&self) -> CancellationToken {
        self.start.clone()
    }

    /// Whether a drain has started.
    pub fn is_draining(&self) -> bool {
        self.start.is_cancelled()
    }

    /// Resolves when connections must close now.
    pub async fn forced(&self) {
        self.force.cancelled().await
    }

    /// Tracks a connection task, so the drain can wait for it.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn(fut)
    }

    /// Number of tracked tasks still running.
    pub fn active(&self) -> usize {
        self.tracker.len()
    }

    /// A drain scope inside this one: it drains when this one does, or on its own (one pod's
    /// proxy), and its tasks count towards this one's.
    pub fn child(&self) -> Drain {
        Drain {
            start: self.start.child_token(),
            force: self.force.child_token(),
            tracker: self.tracker.clone(),
            reason: Arc::default(),
        }
    }

    /// Closes everything in this scope now, with no grace (e.g. the pod is gone); connections
    /// report `reason`.
    pub fn close_now(&self, reason: &'static str) {
        let _ = self.reason.set(reason);
        self.start.cancel();
        self.force.cancel();
    }

    /// Why a forced close happened: the reason given to [`Drain::close_now`], or the deadline.
    pub fn close_reason(&self) -> &'static str {
        self.reason.get().copied().unwrap_or(DEADLINE_REASON)
    }

    /// Starts the drain without waiting (listeners stop, servers send GOAWAY).
    pub fn begin(&self) {
        self.start.cancel();
    }

    /// Starts the drain and waits until every tracked task has finished or `deadline` passed;
    /// then forces the rest closed. Returns how many tasks were still open at the deadline.
    pub async fn run(&self, deadline: Duration) -> usize {
        self.start.cancel();
        self.tracker.close();
        let left = match tokio::time::timeout(deadline, self.tracker.wait()).await {
            Ok(()) => 0,
            Err(_) => self.tracker.len(),
        };
        self.force.cancel();
        // Give forced tasks a moment to unwind (close sockets, write logs).
        let _ = tokio::time::timeout(Duration::from_millis(500), self.tracker.wait()).await;
        left
    }
}

/// What the HBONE server needs of a drain: its signals, and tracked tasks for its streams.
impl crate::Shutdown for Drain {
    async fn started(&self) {
        Drain::started(self).await
    }

    async fn forced(&self) {
        Drain::forced(self).await
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        Drain::spawn(self, task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waits_for_tasks_then_forces() {
        let d = Drain::new();
        let d2 = d.clone();
        d.spawn(async move {
            d2.forced().await;
        });
        let quick = d.clone();
        d.spawn(async move {
            quick.started().await;
        });
        let left = d.run(Duration::from_secs(3)).await;
        assert_eq!(left, 1);
        assert_eq!(d.active(), 0);
    }

    #[tokio::test]
    async fn child_scopes() {
        let parent = Drain::new();
        let a = parent.child();
        let b = parent.child();
        a.close_now("test");
        assert!(a.is_draining() && !b.is_draining() && !parent.is_draining());
        parent.begin();
        assert!(b.is_draining());
        let b2 = b.clone();
        let t = b.spawn(async move { b2.forced().await });
        assert_eq!(parent.active(), 1, "child tasks count in the parent");
        parent.run(Duration::from_millis(10)).await;
        t.await.expect("forced task ends");
    }
}
